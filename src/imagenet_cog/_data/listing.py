"""The one listing of a data root: its layout picked by content, then its reader run.

:func:`list_root` serves every caller alike (the splits, the coverage check, and through the
splits' records, the choice of one pass over a copy): it picks the layout of a root
(``detect_layout``) and lists it with that layout's reader, one reader per layout:

- a folder or a tar per wnid, and ImageNet-1K's ``train/`` and ``val/`` (``folders``, tars
  read by the one tar reader);
- webdataset shards (``shards``, the same tar reader);
- Parquet files (``parquet``).

A copy's listing is ``{wnid: {image id: source}}`` whatever its layout, with the same image
ids (``"<wnid>/<file name>"``), so a split is the same function of it for every layout.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import NamedTuple

from .._base import WNID_RE
from .copies import (
    FOLDERS,
    ORIGINAL_NAME,
    PARQUET,
    UNSPLIT,
    WEBDATASET,
    add_counts,
    cached_listing,
    detect_layout,
    folder_copy,
    identify_copy,
    new_counts,
    parquet_files,
    processing_record,
    shard_files,
    split_folders,
)
from .folders import list_flat_val, list_images
from .labels import read_val_labels
from .parquet import parquet_entries
from .shards import shard_entries
from .sources import TAR_MEMBER, ParquetImage, TarMember, kind

__all__ = ["SHARD_COPIES", "Listing", "list_copy", "list_root", "read_in_one_pass"]

#: The layouts whose images lie in large data files, read in one pass for several stores.
SHARD_COPIES = (WEBDATASET, PARQUET)
_VAL_PARTS = ("validation", "val")


class Listing(NamedTuple):
    """What a data root holds, as :func:`list_root` lists it.

    Attributes
    ----------
    images : dict
        ``{wnid: {image id: source}}``, each concept's images sorted by id.
    layout : str
        The layout as a split records it (``"tar per wnid"``, ``"webdataset shards"``,
        ``"val/ flat with labels"``...).
    copy : dict or None
        The record of a published copy (a shard or Parquet copy, or a folder copy made by
        ImageNet-21K-P's processing): what it is and what its processing changed.
    val_labels : str or None
        What labelled a flat ImageNet-1K ``val/``.
    """

    images: dict
    layout: str
    copy: dict | None = None
    val_labels: str | None = None


def _parts(part):
    every = ("train", *_VAL_PARTS, "test", UNSPLIT)
    return {"train": ("train",), "test": _VAL_PARTS, "all": every}[part]


def list_copy(root, wnids=None, *, part="all", progress=False):
    """List a webdataset or Parquet copy: ``({wnid: {image id: source}}, copy record)``.

    Parameters
    ----------
    root : path
    wnids : sequence of str, optional
        Keep these concepts only (every sample is still checked).
    part : {"train", "test", "all"}
        The shards or files read: ``train``, ``validation``, or both.
    progress : bool

    Returns
    -------
    listing : dict
        The sources are ``TarMember`` (shards) or ``ParquetImage``.
    copy : dict
        ``{"layout", "name", "published", "processing", "samples", "resized", "formats",
        "min_side", "processed", "listing_sha256"}`` (and ``"seen"`` for ImageNet-21K-P's
        sizes): what the copy is (``published``: :func:`~.copies.identify_copy`'s name,
        ``name`` the one its files or folder carry, shown only), what its processing changed,
        and the digest of what was listed.
    """
    from tqdm.auto import tqdm

    root = Path(root)
    layout = detect_layout(root)
    if layout == WEBDATASET:
        files, name = shard_files(root)
        source = TarMember
    elif layout == PARQUET:
        files, name = parquet_files(root), root.name  # a folder's name: shown, never trusted
        source = ParquetImage
    else:
        raise ValueError(f"{root} is a {layout} root, not a webdataset or Parquet copy")
    paths = [p for k in _parts(part) for p in files.get(k, [])]
    if not paths:
        unsplit = files.get(UNSPLIT)
        if unsplit and part != "all":
            raise FileNotFoundError(
                f"{root}: its {layout} name no split ({Path(unsplit[0]).name}...), so "
                f"ImageNet-1K's {part} images cannot be told apart: name them "
                "<name>-train-NNNN and <name>-validation-NNNN"
            )
        raise FileNotFoundError(f"{root}: no {'/'.join(_parts(part)[:3])} {layout}")
    wanted = None if wnids is None else set(wnids)
    found, where, counts = {}, {}, new_counts()
    concepts, original = set(), True  # every concept, whether every file name is an original's
    # What the listing read of each data file: the digest of its entries (the headers' checks
    # of a shard, the rows' paths of a Parquet file), recorded with the copy.
    digest = hashlib.sha256()
    for path in tqdm(paths, desc=f"listing {layout}", unit="file", disable=not progress):
        if layout == WEBDATASET:
            make = functools.partial(shard_entries, name=name)
            listed = cached_listing(path, make, rules=name)
        else:
            listed = cached_listing(path, parquet_entries)
        add_counts(counts, listed["counts"])
        digest.update(f"{Path(path).name}\t{listed['sha256']}\n".encode())
        column = listed.get("column", "image")
        for image_id, wnid, a, b, check, *more in listed["entries"]:
            if image_id in where:
                raise ValueError(
                    f"{root}: duplicate key: {image_id!r} is in both {where[image_id]} and "
                    f"{path}; a copy holds each image once"
                )
            where[image_id] = path
            concepts.add(wnid)
            original = original and bool(ORIGINAL_NAME.match(image_id.partition("/")[2]))
            if wanted is None or wnid in wanted:
                if source is TarMember:  # checked with the members its label came from
                    labels = tuple(tuple(x) for x in (more[0] if more else ()))
                    image = TarMember(path, a, b, check, labels)
                else:
                    image = ParquetImage(path, a, b, column, check)
                found.setdefault(wnid, {})[image_id] = image
    published = identify_copy(layout, name, concepts, counts, original)
    record = {
        "layout": layout,
        "name": name,
        "published": published,
        "samples": counts["samples"],
        "resized": counts["resized"],
        "formats": dict(sorted(counts["formats"].items())),
        "min_side": counts["min_side"],
        # What the listing shows: images resized (their original size recorded, or their
        # sizes showing a processing) or stored in another format than the originals'.
        **processing_record(published, counts),
        "listing_sha256": digest.hexdigest(),
    }
    listing = {w: dict(sorted(found[w].items())) for w in sorted(found)}
    return listing, record


def _present(root, wnids):
    """The concepts of ``wnids`` (every concept when ``None``) that have a folder or a tar."""
    with os.scandir(root) as it:
        present = {
            e.name.removesuffix(".tar")
            for e in it
            if e.is_dir() or (e.name.endswith(".tar") and WNID_RE.match(e.name[:-4]))
        }
    if wnids is None:
        return sorted(w for w in present if WNID_RE.match(w))
    return [w for w in wnids if w in present]


def _tar_or_folder(images):
    """The layout of a folder-or-tar-per-wnid listing, as a split records it."""
    n_tars = sum(kind(next(iter(per.values()))) == TAR_MEMBER for per in images.values())
    if n_tars == len(images):
        return "tar per wnid"
    return "folder per wnid" if not n_tars else "folders and tars"


def _list_split_folders(root, splits, wnids, *, partial, progress):
    """The images of a root whose splits are folders of wnid folders or tars
    (``train/<wnid>/``, ``validation/<wnid>/``): each concept's images from every split
    folder, as one folder per wnid would hold them."""
    images = {}
    for folder in splits.values():
        present = _present(folder, wnids)
        for wnid, per in (
            list_images(folder, present, progress=progress) if present else {}
        ).items():
            mine = images.setdefault(wnid, {})
            for image_id, source in per.items():
                if image_id in mine:
                    raise ValueError(
                        f"{root}: {image_id} is in two of its split folders "
                        f"({', '.join(f'{p}/' for p in splits)}); a copy holds each image once"
                    )
                mine[image_id] = source
    missing = [] if partial or wnids is None else [w for w in wnids if w not in images]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} concept(s) missing from {root} (no <wnid>/ folder and no "
            f"<wnid>.tar in {', '.join(f'{p}/' for p in splits)}): "
            + ", ".join(missing[:10])
            + (f" and {len(missing) - 10} more" * (len(missing) > 10))
            + "; to extract only the concepts you have, name them with --wnids FILE (wnids= "
            "in Python), which makes a run not comparable with the paper"
        )
    return {w: dict(sorted(images[w].items())) for w in sorted(images)}


def list_root(root, wnids, *, part="all", val_labels=None, partial=False, progress=False):
    """List the images of some concepts in a data root of any layout.

    Parameters
    ----------
    root : path
        A data root: a folder or a tar per wnid, webdataset shards or Parquet files, or, for
        ``part="train"`` and ``"test"``, ImageNet-1K's root (``train/`` and ``val/``, or a
        copy's train and validation shards or files).
    wnids : sequence of str or None
        The concepts to list; ``None`` for every concept the root holds.
    part : {"all", "train", "test"}
        Every image of the root, or ImageNet-1K's train or validation images.
    val_labels : path, optional
        Label file of a flat ImageNet-1K ``val/`` (the bundled labels by default).
    partial : bool
        List the concepts present and leave out the others (the coverage check's view);
        otherwise a missing concept is refused, naming it.
    progress : bool

    Returns
    -------
    Listing

    Raises
    ------
    FileNotFoundError, ValueError
        For a missing root or concept, or a damaged or unsafe file; the message names it.
    """
    root = Path(root)
    layout = detect_layout(root) if root.is_dir() else FOLDERS  # the readers say what is missing
    if layout != FOLDERS:
        images, copy = list_copy(root, wnids, part=part, progress=progress)
        missing = [] if partial or wnids is None else [w for w in wnids if w not in images]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} concept(s) missing from the {layout} copy at {root}: "
                + ", ".join(missing[:10])
                + (f" and {len(missing) - 10} more" * (len(missing) > 10))
            )
        return Listing(images, layout if part == "all" else f"{layout} ({part})", copy)
    splits = split_folders(root) if root.is_dir() and part == "all" else {}
    if splits and not _present(root, None):
        images = _list_split_folders(root, splits, wnids, partial=partial, progress=progress)
        layout = f"{_tar_or_folder(images)} ({', '.join(f'{p}/' for p in splits)})"
        return Listing(images, layout, folder_copy(images))
    if part == "all":
        wnids = _present(root, wnids) if partial or wnids is None else wnids
        images = list_images(root, wnids, progress=progress) if wnids or not partial else {}
        return Listing(images, _tar_or_folder(images), folder_copy(images))
    if part == "train":
        train = root / "train"
        wnids = _present(train, wnids) if partial or wnids is None else wnids
        images = list_images(train, wnids, progress=progress) if wnids or not partial else {}
        return Listing(images, "train/ folder or tar per wnid")
    val = root / "val" if (root / "val").is_dir() else root / "validation"
    if not val.is_dir():
        raise FileNotFoundError(f"no val/ (or validation/) folder in {root}")
    with os.scandir(val) as entries:
        foldered = any(WNID_RE.match(e.name) and e.is_dir() for e in entries)
    if foldered:
        wnids = _present(val, wnids) if partial or wnids is None else wnids
        images = list_images(val, wnids, progress=progress) if wnids or not partial else {}
        return Listing(images, "val/ folder per wnid")
    if wnids is None:
        wnids = sorted(set(read_val_labels(val_labels).values()))
    images = list_flat_val(val, wnids, val_labels, partial=partial)
    labels = str(val_labels) if val_labels else "bundled ILSVRC-2012"
    return Listing(images, "val/ flat with labels", val_labels=labels)


def read_in_one_pass(info):
    """True when a split's images (``info``: its record) lie in a shard or Parquet copy's
    data files, which one pass reads once for several stores."""
    return (info.get("copy") or {}).get("layout") in SHARD_COPIES
