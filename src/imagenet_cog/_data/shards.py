"""The reader of webdataset shards, as timm publishes its ImageNet copies.

A shard (``imagenet22k-train-0000.tar``...) is an uncompressed tar of samples, each the
members ``<key>.jpg`` (or ``.webp``...), ``<key>.cls`` (the label in the copy's own class
order) and ``<key>.json`` (label, class name, width, height; ``orig_width``/``orig_height``
when the image was resized; ``filename`` in the ImageNet-1K copy). Its headers are read by
the one tar reader, with the checks a tar per wnid gets; the small ``.cls`` and ``.json``
members are read, the images are not: each stays where it is, a tar member read at its
offset.
"""

from __future__ import annotations

import json
import os
import zlib

from .copies import copy_class_list, count_sample, header_size, label_sample, new_counts
from .tar import read_members

__all__ = ["SHARD_IMAGE_EXTS", "shard_entries"]

#: The image members a webdataset sample may hold, by extension.
SHARD_IMAGE_EXTS = ("jpg", "jpeg", "webp", "png")
_SMALL_MEMBER = 1 << 16  # a .cls or .json member larger than this is not read


def _list_shard(path):
    """``[[key, ext, offset, size, cls, meta, header, {ext: (offset, size, crc32)}]]`` of
    one shard, from its headers.

    The small ``.cls`` and ``.json`` members are read (where each lies and the crc32 of its
    data kept, to check it again when the image is read); images are not. A shard cut short (a
    member past the end, no end-of-archive block), a sample without an image or with two
    images is refused, naming the shard and the key.
    """
    samples = {}
    with open(path, "rb") as f:
        fd = f.fileno()
        for member, offset, size, header in read_members(f, path):
            folder, _, base = member.rpartition("/")
            stem, dot, ext = base.partition(".")
            if not dot:
                continue
            key = f"{folder}/{stem}" if folder else stem
            sample = samples.setdefault(key, {})
            ext = ext.lower()
            if ext in SHARD_IMAGE_EXTS:
                if "image" in sample:
                    raise ValueError(f"{path}: sample {key!r} has two images")
                sample["image"] = (ext, offset, size, header)
            elif ext in ("cls", "json") and size <= _SMALL_MEMBER:
                data = os.pread(fd, size, offset)
                sample[ext] = data
                sample.setdefault("at", {})[ext] = (offset, size, zlib.crc32(data))
    out = []
    for key, sample in samples.items():
        if "image" not in sample:
            has = ", ".join(f".{k}" for k in sample if k != "at") or "nothing"
            raise ValueError(f"{path}: sample {key!r} has no image (only {has})")
        ext, offset, size, header = sample["image"]
        try:
            cls = int(sample["cls"].decode().strip()) if "cls" in sample else None
            meta = json.loads(sample["json"]) if "json" in sample else None
        except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
            raise ValueError(f"{path}: sample {key!r} has an unreadable .cls or .json") from None
        if meta is not None and not isinstance(meta, dict):
            raise ValueError(
                f"{path}: sample {key!r} has a .json that holds a {type(meta).__name__}, not "
                'an object ({"label": ..., ...})'
            )
        out.append([key, ext, offset, size, cls, meta, header, sample.get("at", {})])
    return out


def _label_members(at, cls, meta):
    """``[[offset, size, crc32]]`` of the members a sample's label or name is read from:
    its ``.cls`` when it has one, its ``.json`` when that gives the label or the file name."""
    used = ["cls"] if cls is not None else []
    if meta and ("filename" in meta or (cls is None and "label" in meta)):
        used.append("json")
    return [list(at[ext]) for ext in used if ext in at]


def shard_entries(path, name):
    """The labelled listing of one shard of the copy ``name``: ``{"entries": [[image id,
    wnid, offset, size, header check, [[offset, size, crc32] of each member the label comes
    from]]], "counts": {...}}`` (what the listing cache keeps)."""
    classes = copy_class_list(name, 0)
    entries, counts = [], new_counts()
    with open(path, "rb") as f:  # for the sizes no .json gives: the images' headers
        for key, ext, offset, size, cls, meta, header, at in _list_shard(path):
            meta = meta or {}
            stem = key.rpartition("/")[2]
            label = cls if cls is not None else meta.get("label")
            fname, wnid = label_sample(stem, meta.get("filename"), label, classes, path)
            labels = _label_members(at, cls, meta)
            entries.append([f"{wnid}/{fname}", wnid, offset, size, header, labels])
            count_sample(counts, ext, meta, lambda o=offset, n=size: header_size(f, o, n))
    return {"entries": entries, "counts": counts}
