"""Copies of ImageNet as they are published: their layouts, their processing, their labels.

The data root of a domain is read by its content, not its name (:func:`detect_layout`):

- a folder or an uncompressed tar per wnid (:data:`FOLDERS`); a folder copy made by
  ImageNet-21K-P's processing is recognised by its 224 x 224 images (:func:`folder_copy`),
  and ImageNet-21K-P's ``imagenet21k_train/`` and ``imagenet21k_val/`` are refused with the
  line that merges them;
- **webdataset shards** as timm publishes them (:data:`WEBDATASET`:
  ``imagenet22k-train-0000.tar``, ``imagenet1k-validation-00.tar``...), whose sample keys
  are the original files' stems (``n01440764_10026``, ``ILSVRC2012_val_00000001``);
- **Parquet files** as the Hugging Face ``datasets`` library stores an image dataset
  (:data:`PARQUET`: ``data/train-00000-of-00294.parquet``...).

Each published copy's facts are kept in one table, :data:`PUBLISHED_COPIES`: what its
conversion did to the images, and the measured effect of that processing on the features.

Image ids are ``"<wnid>/<file name>"`` whatever the copy, so the official test lists match by
id. Labels come from the key or file name (``n01440764_10026`` is of ``n01440764``; an
ImageNet-1K validation image's label is the bundled ILSVRC-2012 label); a copy's integer
label is used only when its class list is known, and is checked against the key otherwise
(for ImageNet-1K copies: the sorted 1,000 wnids) (:func:`label_sample`).

Each shard's or Parquet file's listing is cached outside the data (:func:`cached_listing`:
``$IMAGENET_COG_CACHE/listings``, by default ``~/.cache/imagenet_cog/listings``), keyed by
the file's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import NamedTuple

from .._base import WNID_RE
from .._fileio import atomic_write_bytes
from ..taxonomy import imagenet1k_wnids
from .labels import bundled_val_labels
from .sources import FILE, kind

__all__ = [
    "COPY_EFFECTS",
    "FOLDERS",
    "PARQUET",
    "PUBLISHED_COPIES",
    "WEBDATASET",
    "PublishedCopy",
    "add_counts",
    "cached_listing",
    "copy_class_list",
    "count_sample",
    "detect_layout",
    "folder_copy",
    "label_sample",
    "new_counts",
    "parquet_files",
    "published_copy",
    "reencoded",
    "shard_files",
    "sniff",
]

FOLDERS = "folder or tar per wnid"
WEBDATASET = "webdataset shards"
PARQUET = "parquet"

_SHARD_RE = re.compile(r"^(?P<name>.+?)-(?P<part>train|validation|val|test)-(?P<num>\d+)\.tar$")
_PARQUET_RE = re.compile(r"^(?P<part>train|validation|val|test)-\d+(-of-\d+)?\.parquet$")
_LISTING_VERSION = 1
#: Images sampled from a folder copy to recognise ImageNet-21K-P's 224 x 224 images.
FOLDER_SAMPLE = 32


# ---------------------------------------------------------------- published copies
#: What each published copy's processing does to the features, measured by
#: benchmarks/bench_copy_processing.py (torchvision's ImageNet MobileNetV2 weights, 120 crops of
#: real photos with shorter sides of 650 to 1,400 px, 2-core x86-64 CPU, 25 November 2026;
#: benchmarks/results/copy_processing_cpu.json, whose row each entry names): the processing,
#: the mean feature cosine with the originals, and the share (%) of images whose top-1 ImageNet
#: class is unchanged.
COPY_EFFECTS = {
    "600": {
        "what": "resizing the shorter side to 600 px and re-encoding as JPEG q90",
        "row": "imagenet22k / imagenet-w21-wds (600 px, JPEG q90)",
        "cosine": 0.9994,
        "top1": 95.8,
    },
    "768": {
        "what": "resizing the shorter side to 768 px and re-encoding as WebP",
        "row": "imagenet-w21-webp-wds (768 px, WebP)",
        "cosine": 0.9963,
        "top1": 84.2,
    },
    "224": {
        "what": "squeezing each image to 224 x 224 px and re-encoding it as JPEG q95, as "
        "ImageNet-21K-P's script does,",
        "row": "ImageNet-21K-P folders (224x224, JPEG q95)",
        "cosine": 0.9247,
        "top1": 45.8,
    },
    "224-webp": {
        "what": "squeezing each image to 224 x 224 px as ImageNet-21K-P's script does, then "
        "re-encoding it as WebP (the Parquet copy's settings are not published; Pillow's "
        "default assumed),",
        "row": "ImageNet-21K-P Parquet (224x224, then WebP)",
        "cosine": 0.9135,
        "top1": 45.8,
    },
}


class PublishedCopy(NamedTuple):
    """The facts of a copy whose conversion is published.

    Attributes
    ----------
    processing : str
        What its conversion did to the images.
    effect : dict or None
        The measured effect of that processing on the features (an entry of
        :data:`COPY_EFFECTS`), ``None`` when it changed nothing.
    """

    processing: str
    effect: dict | None


_IN21K_P = (
    "ImageNet-21K-P's processing (Alibaba-MIIL/ImageNet21K): classes of 500 images or fewer "
    "removed, 50 images per class set aside for validation, images whose longer side is 224 px "
    "or more squeezed to 224 x 224 (OpenCV, bilinear) and re-encoded as JPEG (quality 95)"
)
#: Each published copy, by the name its shards (or folder) carry, as its conversion code
#: writes it.
PUBLISHED_COPIES = {
    "imagenet22k": PublishedCopy(
        "shorter side above 600 px resized (bicubic), re-encoded as JPEG q90; "
        "images under 56 px dropped",
        COPY_EFFECTS["600"],
    ),
    "imagenet12k": PublishedCopy(
        "shorter side above 600 px resized (bicubic), re-encoded as JPEG q90; "
        "images under 48 px dropped",
        COPY_EFFECTS["600"],
    ),
    "imagenet-w21": PublishedCopy(
        "shorter side above 600 px resized (bicubic), re-encoded as JPEG; "
        "images under 56 px dropped",
        COPY_EFFECTS["600"],
    ),
    "imagenet-w21-webp": PublishedCopy(
        "shorter side above 768 px resized, re-encoded as WebP; images under 32 px dropped",
        COPY_EFFECTS["768"],
    ),
    "imagenet1k": PublishedCopy("none (the ILSVRC-2012 JPEG files)", None),
    "imagenet21k-p": PublishedCopy(_IN21K_P, COPY_EFFECTS["224"]),
    "imagenet-w21-p": PublishedCopy(
        _IN21K_P + "; timm's Parquet copy stores them as WebP, with settings it does not publish",
        COPY_EFFECTS["224-webp"],
    ),
}


def published_copy(name, layout=None):
    """The :class:`PublishedCopy` a copy's name points to, or ``None`` for another copy.

    Names are compared in lower case. A Parquet copy is named by its folder, so any
    ``*w21-p*`` or ``*21k-p*`` name is timm's ``imagenet-w21-p``; a folder copy's name is the
    one :func:`folder_copy` gave it.
    """
    low = name.lower()
    if layout != "folder per wnid" and ("w21-p" in low or "21k-p" in low):
        low = "imagenet-w21-p"
    return PUBLISHED_COPIES.get(low)


def reencoded(formats):
    """The encodings among ``formats`` other than the original files' JPEG."""
    return [f for f in formats if f not in ("jpg", "jpeg")]


def sniff(data):
    """The encoding of image bytes, from their first bytes."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"\xff\xd8":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return "other"


# ---------------------------------------------------------------- detection
def _files(root):
    with os.scandir(root) as it:
        return sorted(it, key=lambda e: e.name)


def parquet_files(root):
    """``{part: [paths]}`` of the Parquet files in ``root`` or ``root/data``."""
    out = {}
    for folder in (root, root / "data"):
        if not folder.is_dir():
            continue
        for e in _files(folder):
            m = _PARQUET_RE.match(e.name)
            if m and e.is_file():
                part = "validation" if m["part"] == "val" else m["part"]
                out.setdefault(part, []).append(e.path)
    return out


def shard_files(root):
    """``({part: [paths]}, copy name)`` of the webdataset shards in ``root``."""
    out, names = {}, set()
    for e in _files(root):
        m = _SHARD_RE.match(e.name)
        if m and e.is_file():
            part = "validation" if m["part"] == "val" else m["part"]
            out.setdefault(part, []).append(e.path)
            names.add(m["name"])
    return out, "+".join(sorted(names))


def detect_layout(root):
    """The layout of a data root: :data:`FOLDERS`, :data:`WEBDATASET` or :data:`PARQUET`.

    Raises
    ------
    ValueError
        When the root mixes layouts, or holds only tars that are neither per-wnid tars nor
        shards (the full release packed as one tar of per-wnid tars), or ImageNet-21K-P's
        ``imagenet21k_train/`` and ``imagenet21k_val/``; the message names them and says
        how to make a root of them.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no data folder at {root}")
    kinds, others = {}, []
    for e in _files(root):
        stem = e.name.removesuffix(".tar")
        if WNID_RE.match(stem) and (e.is_dir() or e.name.endswith(".tar")):
            kinds.setdefault(FOLDERS, e.name)
        elif e.name in ("train", "val") and e.is_dir():
            kinds.setdefault(FOLDERS, e.name + "/")
        elif _SHARD_RE.match(e.name):
            kinds.setdefault(WEBDATASET, e.name)
        elif e.name.endswith(".tar"):
            others.append(e.name)
    parquet = parquet_files(root)
    if parquet:
        kinds[PARQUET] = Path(next(iter(parquet.values()))[0]).name
    if len(kinds) > 1:
        shown = " and ".join(f"{k} (e.g. {v})" for k, v in kinds.items())
        raise ValueError(
            f"{root} mixes {shown}: keep one layout per data root and give the others as "
            "their own roots"
        )
    if not kinds and (root / "imagenet21k_train").is_dir():
        train, val, merged = root / "imagenet21k_train", root / "imagenet21k_val", root / "merged"
        raise ValueError(
            f"{root} holds ImageNet-21K-P as its authors publish it (imagenet21k_train/ and "
            "imagenet21k_val/, 50 images of each class moved to the second), so a concept's "
            "official test images lie in both: merge them into one folder per wnid with hard "
            f"links, which take no disk space (mkdir -p {merged} && cp -rl {train}/. {merged}/ "
            f"&& cp -rl {val}/. {merged}/), and give {merged}"
        )
    if not kinds and others:
        raise ValueError(
            f"{root} holds {others[0]}, neither a tar per wnid nor a webdataset shard: a tar "
            f"of per-wnid tars must be unpacked first (tar -xf {others[0]} -C {root}), its "
            "per-wnid tars are then read as they are"
        )
    return next(iter(kinds), FOLDERS)


# ---------------------------------------------------------------- listing cache
def cache_folder():
    """Where shard listings are cached: ``$IMAGENET_COG_CACHE/listings``."""
    base = os.environ.get("IMAGENET_COG_CACHE") or Path.home() / ".cache" / "imagenet_cog"
    return Path(base) / "listings"


def cached_listing(path, make, rules=""):
    """``make(path)``, cached by the file's resolved path, size and modification time (and
    ``rules``, what else shapes the listing)."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = {
        "v": _LISTING_VERSION,
        "path": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "rules": rules,
    }
    folder = cache_folder()
    name = hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json"
    try:
        stored = json.loads((folder / name).read_text(encoding="utf-8"))
        if stored.get("stamp") == stamp:
            return stored["listing"]
    except (OSError, ValueError, AttributeError):
        pass
    listing = make(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / name, json.dumps({"stamp": stamp, "listing": listing}).encode())
    except OSError:  # a read-only home: listing still works, uncached
        pass
    return listing


# ---------------------------------------------------------------- labels
def _name_and_wnid(stem, file_name):
    """``(file name, wnid or None)`` of one sample, from its key or file name alone."""
    base, _, tail = stem.rpartition("_")  # the datasets library's "<stem>_<wnid>.JPEG"
    if base and WNID_RE.match(tail):
        return f"{base}.JPEG", tail
    name = file_name or f"{stem}.JPEG"
    head = stem.split("_", 1)[0]
    if WNID_RE.match(head):
        return name, head
    return name, bundled_val_labels().get(name)


def copy_class_list(name, n_labels):
    """The class list of a known copy: the sorted 1,000 wnids of the ImageNet-1K copies."""
    if name.startswith("imagenet1k") or n_labels == 1000:
        return list(imagenet1k_wnids())
    return None


def new_counts():
    """The counts of a listing before its first sample."""
    return {"samples": 0, "resized": 0, "formats": {}, "min_side": None}


def count_sample(counts, fmt, meta):
    """Count one sample of encoding ``fmt`` (and its ``.json`` record ``meta``)."""
    counts["samples"] += 1
    counts["formats"][fmt] = counts["formats"].get(fmt, 0) + 1
    if meta:
        if "orig_width" in meta or "orig_height" in meta:
            counts["resized"] += 1
        sides = [meta.get("width"), meta.get("height")]
        if all(isinstance(x, int) for x in sides):
            side = min(sides)
            low = counts["min_side"]
            counts["min_side"] = side if low is None else min(low, side)


def add_counts(total, counts):
    """Add the counts of one data file to ``total``."""
    total["samples"] += counts["samples"]
    total["resized"] += counts["resized"]
    for fmt, n in counts["formats"].items():
        total["formats"][fmt] = total["formats"].get(fmt, 0) + n
    if counts["min_side"] is not None:
        low = total["min_side"]
        total["min_side"] = counts["min_side"] if low is None else min(low, counts["min_side"])


def label_sample(stem, file_name, cls, classes, where):
    """``(file name, wnid)`` of one sample, its label ``cls`` checked against the copy's
    ``classes`` when they are known; ``where`` names the data file in the errors."""
    name, wnid = _name_and_wnid(stem, file_name)
    if classes is not None and cls is not None:
        if not 0 <= cls < len(classes):
            raise ValueError(f"{where}: label {cls} outside the copy's {len(classes)} classes")
        if wnid is None:
            wnid = classes[cls]
        elif classes[cls] != wnid:
            raise ValueError(
                f"{where}: sample {stem!r} of {wnid} has label {cls}, which is "
                f"{classes[cls]} in the class order assumed for this copy: an unknown class "
                "order, so its labels cannot be used"
            )
    if wnid is None:
        raise ValueError(
            f"{where}: sample {stem!r} names no wnid and the copy's class order is unknown; "
            "its labels cannot be used"
        )
    return name, wnid


# ---------------------------------------------------------------- folder copies
def folder_copy(listing, n=FOLDER_SAMPLE):
    """The copy record of a folder copy made by ImageNet-21K-P's processing, or ``None``.

    That processing squeezes every image (but the few under 224 px) to 224 x 224, so the
    copy is recognised by its content: the sizes, read from the headers alone, of ``n``
    images spread over the concepts, of which at least 90% are 224 x 224. ImageNet's own
    images have many sizes, and hardly any is 224 x 224.
    """
    from PIL import Image

    files = [
        next(iter(listing[w].values())) for w in sorted(listing) if listing[w]
    ]  # one image per concept, then spread
    files = [f for f in files if kind(f) == FILE]
    if not files:
        return None
    step = max(1, len(files) // n)
    sizes = []
    for path in files[::step][:n]:
        try:
            with Image.open(path) as image:  # reads the header, not the pixels
                sizes.append(image.size)
        except (OSError, ValueError):
            continue
    squeezed = sum(size == (224, 224) for size in sizes)
    if not sizes or squeezed < 0.9 * len(sizes):
        return None
    return {
        "layout": "folder per wnid",
        "name": "imagenet21k-p",
        "processing": PUBLISHED_COPIES["imagenet21k-p"].processing,
        "samples": sum(len(v) for v in listing.values()),
        "resized": 0,
        "formats": {},
        "min_side": None,
        "processed": True,
        "seen": f"{squeezed} of {len(sizes)} sampled images are 224 x 224",
    }
