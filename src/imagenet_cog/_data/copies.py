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
the file's path, size and modification time. A file rewritten with its size and time kept is
caught when its images are read: each image's tar header (or Parquet ``path``) is read with
it and checked against the listing's.

A copy is what its content says, never its folder's name (:func:`identify_copy`): a copy of
ImageNet-1K's original JPEG files by its concepts, encoding and file names; the processing
its images show by their sizes, read from records or from the images' headers
(:func:`shown_processing`: every image squeezed to one square size, or resized to one shorter
side; ImageNet-21K-P's two processings are 224 x 224 and a shorter side of 256 px), and by
their encoding. Its effect on the features is the measured effect of what it shows, or of its
published processing, whichever changes more (:func:`copy_effect`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import NamedTuple

from .._base import WNID_RE
from .._fileio import atomic_write_bytes
from ..taxonomy import imagenet1k_wnids
from .labels import bundled_val_labels
from .sources import FILE, kind, listing_cache_file
from .tar import NotATarError, read_members

__all__ = [
    "COPY_EFFECTS",
    "DEVIATION_TOP1",
    "FOLDERS",
    "ORIGINAL_NAME",
    "PARQUET",
    "PUBLISHED_COPIES",
    "WEBDATASET",
    "PublishedCopy",
    "add_counts",
    "cached_listing",
    "copy_class_list",
    "copy_effect",
    "copy_facts",
    "count_sample",
    "detect_layout",
    "effect_deviates",
    "folder_copy",
    "header_size",
    "identify_copy",
    "image_sizes",
    "in1k_class_names",
    "label_sample",
    "new_counts",
    "parquet_files",
    "processing_record",
    "published_copy",
    "reencoded",
    "shard_files",
    "shown_processing",
    "sniff",
    "sniff_tar",
    "split_folders",
]

FOLDERS = "folder or tar per wnid"
WEBDATASET = "webdataset shards"
PARQUET = "parquet"

_SHARD_RE = re.compile(r"^(?P<name>.+?)-(?P<part>train|validation|val|test)-(?P<num>\d+)\.tar$")
_PARQUET_RE = re.compile(r"^(?P<part>train|validation|val|test)-\d+(-of-\d+)?\.parquet$")
# A split named anywhere in a data file's name (``shard-train-0.tar``, ``val_003.tar``).
_PART_WORD = re.compile(r"(?:^|[-_.])(?P<part>train|validation|val|test)(?=[-_.]|$)")
#: The part of a copy whose data files name no split: read for every domain of ImageNet-21K.
UNSPLIT = "unsplit"
#: Folders of a root that hold its splits, as the Hugging Face Hub's image folders do.
SPLIT_FOLDERS = ("train", "val", "validation", "test")
_LISTING_VERSION = 4  # 3: image sizes read from the headers where no record gives them;
# 4: a shard sample's label members checked by their crc32
#: Images sampled from a folder copy (and a Parquet file's first row group) for their sizes.
FOLDER_SAMPLE = 32


# ---------------------------------------------------------------- published copies
#: The processings measured by benchmarks/bench_copy_processing.py (torchvision's ImageNet
#: MobileNetV2 weights, 170 crops of 17 real photos of 17 scenes, 10 of each, at ImageNet's
#: sizes: a longer side of 500 px and a shorter side of 333 to 500 px; 2-core x86-64 CPU;
#: benchmarks/results/copy_processing_cpu.json, whose row each entry names): ``key: (row,
#: side, mean feature cosine with the originals, share (%) of images whose top-1 ImageNet
#: class is unchanged, and its spread: the 5th and 95th percentiles of that share when the 17
#: scenes are drawn again with replacement)``.
_MEASURED = {
    "600": (
        "imagenet22k / imagenet-w21-wds (600 px, JPEG q90)",
        600,
        0.9983,
        92.9,
        89.4,
        96.5,
    ),
    "768": (
        "imagenet-w21-webp-wds (768 px, WebP)",
        768,
        0.9768,
        77.6,
        69.4,
        85.3,
    ),
    "224": (
        "ImageNet-21K-P folders (224x224, JPEG q95)",
        224,
        0.9362,
        61.2,
        51.8,
        70.6,
    ),
    "224-webp": (
        "ImageNet-21K-P Parquet (224x224, then WebP)",
        224,
        0.9107,
        57.1,
        45.9,
        68.2,
    ),
    "256": (
        "ImageNet-21K-P short edge (256 px, JPEG q95)",
        256,
        0.9944,
        89.4,
        84.7,
        93.5,
    ),
    "squeeze-224": (
        "ImageNet-21K-P folders (224x224, JPEG q95)",
        224,
        0.9362,
        61.2,
        51.8,
        70.6,
    ),
    "short-256": (
        "ImageNet-21K-P short edge (256 px, JPEG q95)",
        256,
        0.9944,
        89.4,
        84.7,
        93.5,
    ),
    "squeeze-256": (
        "squeezed to 256x256 (JPEG q95)",
        256,
        0.9412,
        62.9,
        52.9,
        72.4,
    ),
    "short-224": (
        "shorter side to 224 px (JPEG q95)",
        224,
        0.9881,
        84.1,
        76.5,
        90.6,
    ),
}
#: What each processing does, in the words of the caveat ("... gives a mean cosine of").
_WHAT = {
    "600": "resizing the shorter side to 600 px and re-encoding as JPEG q90 (at ImageNet's "
    "sizes, the re-encoding alone)",
    "768": "re-encoding as WebP (and resizing the shorter side to 768 px, which no image of "
    "ImageNet's sizes reaches)",
    "224": "squeezing each image to 224 x 224 px and re-encoding it as JPEG q95, as "
    "ImageNet-21K-P's script does,",
    "224-webp": "squeezing each image to 224 x 224 px as ImageNet-21K-P's script does, then "
    "re-encoding it as WebP (the Parquet copy's settings are not published; Pillow's "
    "default assumed),",
    "256": "resizing each image to a shorter side of 256 px and re-encoding it as JPEG "
    "q95, as ImageNet-21K-P's short-edge script does,",
    "squeeze": "squeezing each image to {side} x {side} px (OpenCV, bilinear) and re-encoding "
    "it as JPEG q95,",
    "short": "resizing each image to a shorter side of {side} px (OpenCV, bilinear) and "
    "re-encoding it as JPEG q95,",
}


def _effects():
    out = {}
    for key, (row, side, cosine, top1, low, high) in _MEASURED.items():
        kind = key.partition("-")[0] if key.startswith(("squeeze-", "short-")) else key
        out[key] = {
            "what": _WHAT[kind].format(side=side),
            "row": row,
            "side": side,
            "cosine": cosine,
            "top1": top1,
            "top1_scenes": [low, high],
            "scenes": 17,
        }
    return out


#: What each processing does to the features (see ``_MEASURED``): the published copies' by
#: their names (``"600"``, ``"768"``, ``"224"``, ``"224-webp"``, ``"256"``), and what a copy's
#: sizes may show: ``"squeeze-S"`` (every image squeezed to S x S) and ``"short-S"`` (every
#: image resized to a shorter side of S px) at a range of sizes.
COPY_EFFECTS = _effects()


#: A processing that may keep the top-1 class of fewer images than this (%) is a deviation,
#: not a caveat: it changes a quarter of the network's predictions or more. Decided on the
#: spread of the measured share (its 5th percentile over the scenes drawn again), not its
#: mean: a processing whose spread crosses the line is not known to keep three quarters.
DEVIATION_TOP1 = 75.0


def effect_deviates(effect):
    """True when a processing's measured effect (an entry of :data:`COPY_EFFECTS`) may change
    the top-1 class of a quarter of the images or more: the low end of its spread over the
    scenes (``top1_scenes``; the mean where no spread was measured) under
    :data:`DEVIATION_TOP1`. A run on such a copy is not comparable with the paper's."""
    if effect is None:
        return False
    low = (effect.get("top1_scenes") or [effect["top1"]])[0]
    return low < DEVIATION_TOP1


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


_IN21K_P_STEPS = (
    "ImageNet-21K-P's processing (Alibaba-MIIL/ImageNet21K): classes of 500 images or fewer "
    "removed, 50 images per class set aside for validation, "
)
_IN21K_P = (
    _IN21K_P_STEPS + "images whose longer side is 224 px or more squeezed to 224 x 224 "
    "(OpenCV, bilinear) and re-encoded as JPEG (quality 95)"
)
#: Each published copy, by the name its shards carry (timm's conversions name them) or, for
#: a copy recognised by its content, the name :func:`identify_copy` gives it.
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
    "imagenet21k-p-256": PublishedCopy(
        _IN21K_P_STEPS + "images whose longer side is 256 px or more resized to a shorter side "
        "of 256 px (OpenCV, bilinear; its resize_short_edge.py) and re-encoded as JPEG "
        "(quality 95)",
        COPY_EFFECTS["256"],
    ),
    "imagenet-w21-p": PublishedCopy(
        _IN21K_P + "; timm's Parquet copy stores them as WebP, with settings it does not publish",
        COPY_EFFECTS["224-webp"],
    ),
}


def published_copy(name, layout=None):
    """The :class:`PublishedCopy` of a copy record's name (:func:`identify_copy`'s, or the
    name a timm shard copy's files carry), or ``None`` for another copy.

    Names are compared in lower case; ``layout`` is kept for the callers of earlier records.
    """
    return PUBLISHED_COPIES.get(name.lower())


def copy_facts(record):
    """The :class:`PublishedCopy` a copy record names (its ``published`` key, or for a
    record written before it, its name), or ``None``."""
    if "published" in record:
        return PUBLISHED_COPIES.get(record["published"] or "")
    return published_copy(str(record.get("name", "")), record.get("layout"))


def shown_effect(shown):
    """The measured effect of a processing a copy's sizes show (:func:`shown_processing`):
    the entry of :data:`COPY_EFFECTS` of that kind measured at that size, or, between two
    sizes measured, the one of the two that changes more; beyond them, the nearest."""
    if not shown:
        return None
    kind, side = shown["kind"], int(shown["side"])
    measured = sorted(
        int(key.rpartition("-")[2]) for key in COPY_EFFECTS if key.startswith(f"{kind}-")
    )
    if not measured:
        return None
    below = [s for s in measured if s <= side][-1:] or measured[:1]
    above = [s for s in measured if s >= side][:1] or measured[-1:]
    candidates = [COPY_EFFECTS[f"{kind}-{s}"] for s in {*below, *above}]
    effect = min(candidates, key=lambda e: ((e.get("top1_scenes") or [e["top1"]])[0], e["top1"]))
    if effect["side"] != side:
        what = effect["what"].rstrip(",")
        effect = {**effect, "what": f"{what} (the nearest size measured to {side} px),"}
    return effect


def copy_effect(record):
    """The measured effect that a copy record's processing has on the features: of what its
    images show (their sizes, :func:`shown_effect`; their encoding, WebP), and of its
    published processing; where several apply, the one that changes the most. ``None`` when
    none was measured."""
    effects = []
    facts = copy_facts(record)
    if facts is not None and facts.effect is not None:
        effects.append(facts.effect)
    if record.get("shown"):
        effects.append(shown_effect(record["shown"]))
    if "webp" in (record.get("formats") or {}):
        effects.append(COPY_EFFECTS["768"])  # at ImageNet's sizes, the WebP re-encoding
    effects = [e for e in effects if e is not None]
    if not effects:
        return None
    return min(effects, key=lambda e: ((e.get("top1_scenes") or [e["top1"]])[0], e["top1"]))


#: Of the images whose size is known, the share that must show a processing's sizes (one
#: square size, or one shorter side) for a copy to be taken as made by it.
SIZE_SHARE = 0.9
#: Images of a data file (shard, Parquet file) whose size is read from their header when no
#: record gives it; a folder copy: images sampled over its concepts.
HEADER_SAMPLE = 32
#: The file names of ImageNet's original files.
ORIGINAL_NAME = re.compile(r"^(n\d{8}_\d+|ILSVRC2012_val_\d{8})\.JPEG$")


def shown_processing(counts):
    """The processing the sizes of a copy's images show, or ``None``: ``{"kind": "squeeze",
    "side": S}`` when at least :data:`SIZE_SHARE` of the images whose size is known are
    S x S (every aspect ratio made 1), ``{"kind": "short", "side": S}`` when that share has
    a shorter side of S px (every image resized to it); with ``"seen"``, the count that
    shows it. ImageNet's own images have many sizes and aspect ratios: a few are square and
    no shorter side is shared by most."""
    sized = counts.get("sized", 0)
    if not sized:
        return None
    for processing, key, what in (
        ("squeeze", "squares", "{side} x {side}"),
        ("short", "short_sides", "{side} px on the shorter side"),
    ):
        by_side = counts.get(key) or {}
        if not by_side:
            continue
        side, n = max(by_side.items(), key=lambda item: (item[1], -int(item[0])))
        if n >= SIZE_SHARE * sized:
            seen = f"{n:,} of {sized:,} images whose size was read are {what.format(side=side)}"
            return {"kind": processing, "side": int(side), "seen": seen}
    return None


def identify_copy(layout, name, concepts, counts, original_names):
    """What a shard or Parquet copy is, from its content: a key of :data:`PUBLISHED_COPIES`,
    or ``None``.

    - ImageNet-21K-P's squeeze: at least :data:`SIZE_SHARE` of the images whose size is
      known (a shard's ``.json`` records or its images' headers, the headers of a Parquet
      file's first row group) are 224 x 224 (``imagenet-w21-p`` when stored as WebP,
      ``imagenet21k-p`` as JPEG); its short-edge variant: a shorter side of 256 px, the
      images not squeezed (``imagenet21k-p-256``); see :func:`shown_processing`;
    - timm's shard copies: by the name their shards carry (``imagenet22k-train-0000.tar``);
    - ImageNet-1K's original JPEG files: ImageNet-1K ``concepts`` only (the copy's every
      concept), JPEG, nothing resized, and ``original_names``: every file name an original's
      (``n01440764_10026.JPEG``, ``ILSVRC2012_val_00000001.JPEG``).

    A folder's name never counts.
    """
    formats = counts.get("formats", {})
    shown = shown_processing(counts)
    if shown is not None:
        if (shown["kind"], shown["side"]) == ("squeeze", 224):
            return "imagenet-w21-p" if "webp" in formats else "imagenet21k-p"
        if (shown["kind"], shown["side"]) == ("short", 256):
            return "imagenet21k-p-256"
    if layout == WEBDATASET and name.lower() in PUBLISHED_COPIES:
        return name.lower()
    if (
        concepts
        and original_names
        and set(concepts) <= set(imagenet1k_wnids())
        and not counts.get("resized")
        and not shown
        and not reencoded(formats)
    ):
        return "imagenet1k"
    return None


def processing_record(published, counts):
    """The fields of a copy record that say what its processing did: ``processing`` (the
    published processing, or what the images show), ``shown`` (:func:`shown_processing`),
    ``seen`` (the count that shows it) and ``processed`` (images resized, by their records
    or their sizes, or stored in another encoding than the originals')."""
    facts = PUBLISHED_COPIES.get(published or "")
    shown = shown_processing(counts)
    if facts is not None:
        processing = facts.processing
    elif shown is not None:
        processing = "unknown, but the sizes of its images show it: " + _shown_text(shown)
    else:
        processing = "unknown (not a copy whose conversion is published)"
    record = {
        "processing": processing,
        "processed": bool(counts["resized"] or reencoded(counts["formats"]) or shown),
        "shown": None if shown is None else {"kind": shown["kind"], "side": shown["side"]},
    }
    if shown is not None:
        record["seen"] = shown["seen"]
    return record


def _shown_text(shown):
    side = shown["side"]
    if shown["kind"] == "squeeze":
        return f"every image squeezed to {side} x {side} px, whatever its aspect ratio"
    return f"every image resized to a shorter side of {side} px"


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


def _part(name):
    """The split a data file's name gives (``validation`` for ``val``), else :data:`UNSPLIT`."""
    m = _PART_WORD.search(name.rsplit(".", 1)[0])
    if m is None:
        return UNSPLIT
    return "validation" if m["part"] == "val" else m["part"]


def parquet_files(root):
    """``{part: [paths]}`` of the Parquet files in ``root`` or ``root/data``."""
    out = {}
    for folder in (root, root / "data"):
        if not folder.is_dir():
            continue
        for e in _files(folder):
            if e.name.endswith(".parquet") and e.is_file():
                m = _PARQUET_RE.match(e.name)
                part = _part(e.name) if m is None else m["part"]
                out.setdefault("validation" if part == "val" else part, []).append(e.path)
    return out


def _is_wnid_tar(name):
    return name.endswith(".tar") and bool(WNID_RE.match(name[:-4]))


def shard_files(root):
    """``({part: [paths]}, copy name)`` of the webdataset shards in ``root``: every tar that
    is not a tar per wnid. Shards named as timm names them (``<name>-train-NNNN.tar``) give
    the copy's name; others are named by their stem, less its number (``shard-000000.tar``:
    ``shard``), their split read from their name (:data:`UNSPLIT` when it names none)."""
    out, names = {}, set()
    for e in _files(root):
        if not e.name.endswith(".tar") or _is_wnid_tar(e.name) or not e.is_file():
            continue
        m = _SHARD_RE.match(e.name)
        if m:
            part = "validation" if m["part"] == "val" else m["part"]
            names.add(m["name"])
        else:
            part = _part(e.name)
            names.add(re.sub(r"[-_.]?\d+$", "", e.name[:-4]) or e.name[:-4])
        out.setdefault(part, []).append(e.path)
    return out, "+".join(sorted(names))


def sniff_tar(path, members=16):
    """What a tar holds, from its first ``members`` headers: ``"shard"`` (webdataset samples:
    images named ``<key>.<ext>``), ``"tars"`` (tars, as the full release packs its per-wnid
    tars), or ``"other"`` (anything else, or not a readable tar)."""
    names = []
    try:
        with open(path, "rb") as f:
            for entry in read_members(f, path):
                names.append(entry.name.lower())
                if len(names) >= members:
                    break
    except (OSError, ValueError, NotATarError):
        pass
    if any(n.endswith(".tar") for n in names):
        return "tars"
    from .tar import is_image_name

    return "shard" if any(is_image_name(n) for n in names) else "other"


def split_folders(root):
    """``{part: folder}`` of a root whose splits are folders of wnid folders or tars
    (``train/<wnid>/``, ``validation/<wnid>/``, as the Hugging Face Hub's image folders), or
    ``{}``. ``val`` is ``validation``."""
    out = {}
    for name in SPLIT_FOLDERS:
        folder = Path(root) / name
        if not folder.is_dir():
            continue
        with os.scandir(folder) as it:
            if any(
                WNID_RE.match(e.name.removesuffix(".tar"))
                and (e.is_dir() or e.name.endswith(".tar"))
                for e in it
            ):
                out.setdefault("validation" if name == "val" else name, folder)
    return out


def _saved_to_disk(root):
    """The line for a folder the ``datasets`` library's ``save_to_disk`` wrote (Arrow files,
    the images' bytes in them), which is read once written as Parquet, or ``None``."""
    whole = (root / "dataset_dict.json").is_file()
    if not whole and not (root / "state.json").is_file():
        return None
    out = root.parent / f"{root.name}-parquet"
    # pyarrow alone writes each Arrow file as a Parquet file, the schema's metadata (the
    # class names) kept; a split is named by its folder.
    pattern = "*/*.arrow" if whole else "*.arrow"
    part = "f.parent.name" if whole else "'train'"
    write = (
        "import pathlib, pyarrow as pa, pyarrow.parquet as pq; "
        f"o = pathlib.Path('{out}/data'); o.mkdir(parents=True, exist_ok=True); "
        "[pq.write_table(pa.ipc.open_stream(pa.memory_map(str(f))).read_all(), "
        f"o / f'{{{part}}}-{{i:05d}}.parquet') "
        f"for i, f in enumerate(sorted(pathlib.Path('{root}').glob('{pattern}')))]"
    )
    return (
        f"{root} is a folder the datasets library's save_to_disk wrote (Arrow files), which is "
        f'not read here: write it as Parquet files, which are (python -c "{write}"), and give '
        f"{out}"
    )


def detect_layout(root):
    """The layout of a data root: :data:`FOLDERS`, :data:`WEBDATASET` or :data:`PARQUET`.

    A tar that is not a tar per wnid is taken for a webdataset shard when its first headers
    show samples (``<key>.jpg``...), whatever its name. Folders of splits holding wnid
    folders (``train/<wnid>/``, ``validation/<wnid>/``) are :data:`FOLDERS`.

    Raises
    ------
    ValueError
        When the root mixes layouts, or holds only tars that are neither per-wnid tars nor
        shards (the full release packed as one tar of per-wnid tars), or ImageNet-21K-P's
        ``imagenet21k_train/`` and ``imagenet21k_val/``, or a folder ``save_to_disk`` wrote;
        the message names them and says how to make a root of them.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no data folder at {root}")
    saved = _saved_to_disk(root)  # its split folders hold Arrow files, not wnid folders
    if saved is not None:
        raise ValueError(saved)
    kinds, others = {}, []
    for e in _files(root):
        stem = e.name.removesuffix(".tar")
        if WNID_RE.match(stem) and (e.is_dir() or e.name.endswith(".tar")):
            kinds.setdefault(FOLDERS, e.name)
        elif e.name in SPLIT_FOLDERS and e.is_dir():
            kinds.setdefault(FOLDERS, e.name + "/")
        elif _SHARD_RE.match(e.name):
            kinds.setdefault(WEBDATASET, e.name)
        elif e.name.endswith(".tar") and e.is_file():
            others.append(e.name)
    if others and WEBDATASET not in kinds:
        # One look at the first tar's headers: the copy's shards share one writer.
        what = sniff_tar(root / others[0])
        if what == "shard":
            kinds[WEBDATASET] = others[0]
            others = []
        elif what == "tars" and not kinds:
            raise ValueError(
                f"{root} holds {others[0]}, a tar of tars (the full release packed as one "
                f"file): unpack it first (tar -xf {root / others[0]} -C {root}), its per-wnid "
                "tars are then read as they are"
            )
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
            f"{root} holds {others[0]}, neither a tar per wnid (<wnid>.tar holding its "
            "images) nor a webdataset shard (samples <key>.jpg with <key>.cls or <key>.json): "
            "its first members are not images"
        )
    return next(iter(kinds), FOLDERS)


# ---------------------------------------------------------------- listing cache
def cached_listing(path, make, rules=""):
    """``make(path)``, cached by the file's resolved path, size and modification time (and
    ``rules``, what else shapes the listing) in :func:`~.sources.listing_cache_file`.

    A file rewritten with its size and time kept is not seen here: its images are checked
    against the listing when they are read (:class:`~.sources.StaleListingError`).
    """
    path = Path(path).resolve()
    st = path.stat()
    stamp = {
        "v": _LISTING_VERSION,
        "path": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "rules": rules,
    }
    file = listing_cache_file(path)
    try:
        stored = json.loads(file.read_text(encoding="utf-8"))
        if stored.get("stamp") == stamp and "sha256" in stored["listing"]:
            return stored["listing"]
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    listing = make(path)
    # The digest of what was listed, recorded with the copy (cheaper than hashing it again).
    listing["sha256"] = hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(file, json.dumps({"stamp": stamp, "listing": listing}).encode())
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
    """The counts of a listing before its first sample: samples, resized (by their record),
    encodings, the smallest side, and of the images whose size is known (``sized``, from
    their records or, for the first :data:`HEADER_SAMPLE` of a data file without one, their
    headers: ``headers``) those 224 x 224 (``square224``), those whose shorter side is 256 px
    (``short256``), and the square ones and the shorter sides by size (``squares``,
    ``short_sides``: ``{side: count}``)."""
    return {
        "samples": 0,
        "resized": 0,
        "formats": {},
        "min_side": None,
        "sized": 0,
        "square224": 0,
        "short256": 0,
        "squares": {},
        "short_sides": {},
        "headers": 0,
    }


def count_size(counts, size):
    """Count the size ``(width, height)`` of one image (from a record or a header)."""
    width, height = size
    counts["sized"] += 1
    counts["square224"] += (width, height) == (224, 224)
    counts["short256"] += min(size) == 256
    if width == height:
        squares = counts.setdefault("squares", {})
        squares[str(width)] = squares.get(str(width), 0) + 1
    sides = counts.setdefault("short_sides", {})
    sides[str(min(size))] = sides.get(str(min(size)), 0) + 1
    low = counts["min_side"]
    counts["min_side"] = min(size) if low is None else min(low, min(size))


def _record_size(meta):
    sides = [meta.get("width"), meta.get("height")] if meta else []
    if sides and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in sides):
        return sides
    return None


def count_sample(counts, fmt, meta, header=None):
    """Count one sample of encoding ``fmt`` (and its ``.json`` record ``meta``); where the
    record gives no size, ``header()`` reads it from the image's header, for the first
    :data:`HEADER_SAMPLE` such samples of the data file."""
    counts["samples"] += 1
    counts["formats"][fmt] = counts["formats"].get(fmt, 0) + 1
    if meta and ("orig_width" in meta or "orig_height" in meta):
        counts["resized"] += 1
    size = _record_size(meta)
    if size is None and header is not None and counts.get("headers", 0) < HEADER_SAMPLE:
        counts["headers"] = counts.get("headers", 0) + 1
        size = header()
    if size is not None:
        count_size(counts, size)


def add_counts(total, counts):
    """Add the counts of one data file to ``total``."""
    for key in ("samples", "resized", "sized", "square224", "short256", "headers"):
        total[key] = total.get(key, 0) + counts.get(key, 0)
    for key in ("formats", "squares", "short_sides"):
        into = total.setdefault(key, {})
        for value, n in counts.get(key, {}).items():
            into[value] = into.get(value, 0) + n
    if counts["min_side"] is not None:
        low = total["min_side"]
        total["min_side"] = counts["min_side"] if low is None else min(low, counts["min_side"])


def label_sample(stem, file_name, cls, classes, where):
    """``(file name, wnid)`` of one sample, its label ``cls`` checked against the copy's
    ``classes`` when they are known; ``where`` names the data file in the errors."""
    if cls is not None and (isinstance(cls, bool) or not isinstance(cls, int)):
        raise ValueError(
            f"{where}: sample {stem!r} has the label {cls!r}, a {type(cls).__name__}, not an "
            "integer class index"
        )
    if file_name is not None and not isinstance(file_name, str):
        raise ValueError(
            f"{where}: sample {stem!r} has the file name {file_name!r}, a "
            f"{type(file_name).__name__}, not a string"
        )
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
def image_sizes(blobs):
    """The ``(width, height)`` of encoded images, from their headers (``None`` when unread)."""
    import io

    from PIL import Image

    out = []
    for data in blobs:
        try:
            with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as image:
                out.append(image.size)  # the header, not the pixels
        except (OSError, ValueError, TypeError, SyntaxError, Image.DecompressionBombError):
            out.append(None)  # a bomb is not sized here: extraction skips and lists it
    return out


class _Window(io.RawIOBase):
    """The ``size`` bytes at ``offset`` of an open file, as a file of their own."""

    def __init__(self, f, offset, size):
        super().__init__()
        self._f, self._start, self._size, self._pos = f, offset, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, pos, whence=0):
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer):
        n = max(0, min(len(buffer), self._size - self._pos))
        data = os.pread(self._f.fileno(), n, self._start + self._pos) if n else b""
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def header_size(f, offset, size):
    """The ``(width, height)`` of the image stored at ``offset`` (``size`` bytes) of the open
    file ``f``, from its header alone (the pixels are not decoded), or ``None``."""
    return image_sizes([io.BufferedReader(_Window(f, offset, size), 4096)])[0]


def folder_copy(listing, n=FOLDER_SAMPLE):
    """The copy record of a folder copy whose image sizes show a processing, or ``None``.

    ImageNet-21K-P's default processing squeezes every image (but the few under 224 px) to
    224 x 224, its short-edge variant resizes the shorter side to 256 px; any other squeeze
    to one square size, or resize to one shorter side, is recognised alike
    (:func:`shown_processing`): from the sizes, read from the headers alone, of ``n`` images
    spread over the concepts. ImageNet's own images have many sizes, and hardly any shares
    one square size or one shorter side with most others.
    """
    files = [
        next(iter(listing[w].values())) for w in sorted(listing) if listing[w]
    ]  # one image per concept, then spread
    files = [f for f in files if kind(f) == FILE]
    if not files:
        return None
    step = max(1, len(files) // n)
    counts = new_counts()
    for size in image_sizes(files[::step][:n]):
        if size is not None:
            count_size(counts, size)
    shown = shown_processing(counts)
    if shown is None:
        return None
    name = identify_copy("folder per wnid", "", (), counts, False)
    record = {
        "layout": "folder per wnid",
        "name": name or ("squeezed" if shown["kind"] == "squeeze" else "resized"),
        "published": name,
        "samples": sum(len(v) for v in listing.values()),
        "resized": 0,
        "formats": {},
        "min_side": counts["min_side"],
        **processing_record(name, counts),
    }
    record["seen"] = record["seen"].replace("images whose size was read", "sampled images")
    return record


# ---------------------------------------------------------------- ImageNet-1K class names
def in1k_class_names(names, share=0.95):
    """True when 1,000 readable class names are ImageNet-1K's in the sorted wnid order (the
    order every ImageNet-1K copy uses): at least ``share`` of them name, in one of their
    comma-separated parts, a WordNet lemma of the wnid at their position.

    Examples
    --------
    >>> from imagenet_cog import imagenet1k_wnids, load_taxonomy
    >>> tax = load_taxonomy()
    >>> names = [tax.lemma_names(w)[0].replace("_", " ") for w in imagenet1k_wnids()]
    >>> in1k_class_names(names), in1k_class_names(names[::-1])
    (True, False)
    """
    from ..taxonomy import load_taxonomy

    wnids = imagenet1k_wnids()
    if len(names) != len(wnids) or not all(isinstance(n, str) for n in names):
        return False
    tax = load_taxonomy()
    hits = 0
    for name, wnid in zip(names, wnids):
        lemmas = {lemma.lower() for lemma in tax.lemma_names(wnid)}
        parts = {p.strip().lower().replace(" ", "_") for p in name.split(",")}
        hits += bool(parts & lemmas)
    return hits >= share * len(wnids)
