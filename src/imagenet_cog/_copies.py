"""Copies of ImageNet as they are published: webdataset shards and Parquet files.

The data root of a domain is read by its content, not its name (:func:`detect_layout`):

- a folder or an uncompressed tar per wnid (read by :mod:`imagenet_cog.datasets`);
- **webdataset shards** as timm publishes them (``imagenet22k-train-0000.tar``,
  ``imagenet1k-validation-00.tar``...): uncompressed tars whose samples are members
  ``<key>.jpg`` (or ``.webp``), ``<key>.cls`` (the label in the copy's own class order) and
  ``<key>.json`` (label, class name, width, height; ``orig_width``/``orig_height`` when the
  image was resized; ``filename`` in the ImageNet-1K copy). The key is the original file's
  stem (``n01440764_10026``, ``ILSVRC2012_val_00000001``);
- **Parquet files** as the Hugging Face ``datasets`` library stores an image dataset
  (``data/train-00000-of-00294.parquet``...): a column ``image`` of
  ``struct<bytes: binary, path: string>`` and a column ``label`` (int64), the class names in
  the schema's ``huggingface`` metadata. Read with pyarrow (the ``[parquet]`` extra).

A shard's image stays where it is: its source is a tar member (offset and size), read by the
same random-access tar reader as a tar per wnid, so a split, a resumed run or a worker reads
only the images it needs and no shard has to be unpacked. (The ``webdataset`` and ``wids``
libraries stream samples in shard order; they give no member offsets to resume from, and
the split's order, by concept, is not the shards' order.) A Parquet image is read by row
group, the unit Parquet compresses, with the last few row groups kept per process.

Image ids are ``"<wnid>/<file name>"`` whatever the copy, so the official test lists match by
id. Labels come from the key or file name (``n01440764_10026`` is of ``n01440764``; an
ImageNet-1K validation image's label is the bundled ILSVRC-2012 label); a copy's integer
label is used only when its class list is known, and is checked against the key otherwise
(for ImageNet-1K copies: the sorted 1,000 wnids).

Listing reads tar headers and the small ``.cls``/``.json`` members, or Parquet's metadata and
its ``image.path`` and ``label`` columns, never image bytes. Each shard's listing is cached
outside the data (``$IMAGENET_COG_CACHE/listings``, by default
``~/.cache/imagenet_cog/listings``), keyed by the shard's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from ._fileio import atomic_write_bytes
from ._validation import WNID_RE, data_path
from .taxonomy import imagenet1k_wnids

__all__ = [
    "FOLDERS",
    "PARQUET",
    "WEBDATASET",
    "ParquetImage",
    "copy_layout",
    "detect_layout",
    "list_copy",
    "read_parquet_image",
]

FOLDERS = "folder or tar per wnid"
WEBDATASET = "webdataset shards"
PARQUET = "parquet"

#: The image members a webdataset sample may hold, by extension.
SHARD_IMAGE_EXTS = ("jpg", "jpeg", "webp", "png")
_SHARD_RE = re.compile(r"^(?P<name>.+?)-(?P<part>train|validation|val|test)-(?P<num>\d+)\.tar$")
_PARQUET_RE = re.compile(r"^(?P<part>train|validation|val|test)-\d+(-of-\d+)?\.parquet$")
_LISTING_VERSION = 1
_BLOCK = 512
_VAL_PARTS = ("validation", "val")
#: What each published copy's conversion did to its images (the copy's name is the shard
#: prefix, as its conversion code writes it).
PUBLISHED_PROCESSING = {
    "imagenet22k": "shorter side above 600 px resized (bicubic), re-encoded as JPEG q90; "
    "images under 56 px dropped",
    "imagenet12k": "shorter side above 600 px resized (bicubic), re-encoded as JPEG q90; "
    "images under 56 px dropped",
    "imagenet-w21": "shorter side above 600 px resized (bicubic), re-encoded as JPEG; "
    "images under 56 px dropped",
    "imagenet-w21-webp": "shorter side above 768 px resized, re-encoded as WebP; "
    "images under 32 px dropped",
    "imagenet1k": "none (the ILSVRC-2012 JPEG files)",
}


class ParquetImage(NamedTuple):
    """Where one image lies in a Parquet file: its row group and row.

    Attributes
    ----------
    path : str
    row_group : int
    row : int
        The row within the row group.
    """

    path: str
    row_group: int
    row: int


class _TarImage(NamedTuple):
    tar: str
    offset: int
    size: int


# ---------------------------------------------------------------- detection
def _files(root):
    with os.scandir(root) as it:
        return sorted(it, key=lambda e: e.name)


def _parquet_files(root):
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


def _shard_files(root):
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
        shards (the full release packed as one tar of per-wnid tars); the message names them.
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
    parquet = _parquet_files(root)
    if parquet:
        kinds[PARQUET] = Path(next(iter(parquet.values()))[0]).name
    if len(kinds) > 1:
        shown = " and ".join(f"{k} (e.g. {v})" for k, v in kinds.items())
        raise ValueError(
            f"{root} mixes {shown}: keep one layout per data root and give the others as "
            "their own roots"
        )
    if not kinds and others:
        raise ValueError(
            f"{root} holds {others[0]}, neither a tar per wnid nor a webdataset shard: a tar "
            f"of per-wnid tars must be unpacked first (tar -xf {others[0]} -C {root}), its "
            "per-wnid tars are then read as they are"
        )
    return next(iter(kinds), FOLDERS)


def copy_layout(root):
    """:data:`WEBDATASET` or :data:`PARQUET` when ``root`` is such a copy, else ``None``."""
    if not Path(root).is_dir():
        return None  # the folder readers say what is missing
    layout = detect_layout(root)
    return None if layout == FOLDERS else layout


# ---------------------------------------------------------------- listing cache
def cache_folder():
    """Where shard listings are cached: ``$IMAGENET_COG_CACHE/listings``."""
    base = os.environ.get("IMAGENET_COG_CACHE") or Path.home() / ".cache" / "imagenet_cog"
    return Path(base) / "listings"


def _cached(path, make):
    """``make(path)``, cached by the file's resolved path, size and modification time."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = {"v": _LISTING_VERSION, "path": str(path), "size": st.st_size,
             "mtime_ns": st.st_mtime_ns}  # fmt: skip
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


# ---------------------------------------------------------------- webdataset shards
def _list_shard(path):
    """``[[key, ext, offset, size, cls, meta]]`` of one shard, from its headers.

    The small ``.cls`` and ``.json`` members are read; images are not. A shard cut short (a
    member past the end, no end-of-archive block), a sample without an image or with two
    images is refused, naming the shard and the key.
    """
    samples = {}
    try:
        with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
            size = os.fstat(f.fileno()).st_size
            last = None
            for member in tar:
                last = member.name
                if member.isreg() and member.offset_data + member.size > size:
                    raise ValueError(
                        f"{path}: member {member.name!r} runs past the end of the file "
                        f"({member.offset_data + member.size} > {size} bytes); the shard is "
                        "cut short, download it again"
                    )
                if not member.isfile():
                    continue
                folder, _, base = member.name.rpartition("/")
                stem, dot, ext = base.partition(".")
                if not dot:
                    continue
                key = f"{folder}/{stem}" if folder else stem
                sample = samples.setdefault(key, {})
                ext = ext.lower()
                if ext in SHARD_IMAGE_EXTS:
                    if "image" in sample:
                        raise ValueError(f"{path}: sample {key!r} has two images")
                    sample["image"] = (ext, member.offset_data, member.size)
                elif ext in ("cls", "json") and member.size <= 1 << 16:
                    sample[ext] = os.pread(f.fileno(), member.size, member.offset_data)
            end = tar.offset
            if os.pread(f.fileno(), _BLOCK, end) != bytes(_BLOCK):
                raise ValueError(
                    f"{path}: no end-of-archive block at byte {end} of {size} (after member "
                    f"{last!r}): the shard is cut short or damaged; download it again"
                )
    except tarfile.TarError as exc:
        raise ValueError(f"{path}: unreadable shard ({exc}); shards must be uncompressed tars") from None
    out = []
    for key, sample in samples.items():
        if "image" not in sample:
            has = ", ".join(f".{k}" for k in sample) or "nothing"
            raise ValueError(f"{path}: sample {key!r} has no image (only {has})")
        ext, offset, size = sample["image"]
        cls = int(sample["cls"].decode().strip()) if "cls" in sample else None
        meta = json.loads(sample["json"]) if "json" in sample else None
        out.append([key, ext, offset, size, cls, meta])
    return out


# ---------------------------------------------------------------- parquet
def _pq():
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - the extra is missing
        raise ImportError(
            "reading a Parquet copy needs pyarrow: pip install 'imagenet_cog[parquet]'"
        ) from None
    return pq


def _list_parquet(path):
    """``{"names": class names or None, "rows": [[row group, row, file name, label]]}``.

    Reads the metadata and the ``image.path`` and ``label`` columns, not the image bytes.
    """
    pq = _pq()
    pf = pq.ParquetFile(path)
    names = None
    meta = pf.schema_arrow.metadata or {}
    if b"huggingface" in meta:
        features = json.loads(meta[b"huggingface"]).get("info", {}).get("features", {})
        names = (features.get("label") or {}).get("names")
    fields = {pf.schema_arrow.field(i).name for i in range(len(pf.schema_arrow))}
    if "image" not in fields:
        raise ValueError(f"{path}: no 'image' column (columns: {sorted(fields)})")
    md = pf.metadata
    columns = [md.row_group(0).column(i).path_in_schema for i in range(md.num_columns)]
    where = columns.index("image.bytes") if "image.bytes" in columns else None
    rows = []
    for g in range(md.num_row_groups):
        if where is not None:
            stats = md.row_group(g).column(where).statistics
            if stats is not None and stats.null_count:
                raise ValueError(
                    f"{path}: row group {g} has {stats.null_count} sample(s) without an image"
                )
        table = pf.read_row_group(g, columns=["image.path", *(["label"] * ("label" in fields))])
        paths = table.column("image").combine_chunks().field("path").to_pylist()
        labels = table.column("label").to_pylist() if "label" in fields else [None] * len(paths)
        rows += [[g, r, p, lab] for r, (p, lab) in enumerate(zip(paths, labels))]
    return {"names": names, "rows": rows}


_ROW_GROUPS = OrderedDict()
_ROW_GROUPS_PID = [None]


def read_parquet_image(source, keep=4):
    """The encoded bytes of a :class:`ParquetImage`; the last ``keep`` row groups are kept."""
    if _ROW_GROUPS_PID[0] != os.getpid():  # a forked worker keeps nothing of its parent's
        _ROW_GROUPS.clear()
        _ROW_GROUPS_PID[0] = os.getpid()
    key = (source.path, source.row_group)
    images = _ROW_GROUPS.pop(key, None)
    if images is None:
        table = (
            _pq().ParquetFile(source.path).read_row_group(source.row_group, columns=["image.bytes"])
        )
        images = table.column("image").combine_chunks().field("bytes").to_pylist()
        while len(_ROW_GROUPS) >= keep:
            _ROW_GROUPS.popitem(last=False)
    _ROW_GROUPS[key] = images
    data = images[source.row]
    if data is None:
        raise ValueError(f"{source.path}: row {source.row} of row group {source.row_group} "
                         "has no image bytes")  # fmt: skip
    return data


# ---------------------------------------------------------------- labels
def _val_labels():
    from gzip import decompress

    raw = decompress(data_path("imagenet1k_val_labels.tsv.gz").read_bytes()).decode()
    out = {}
    for line in raw.splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) == 2 and WNID_RE.match(parts[1]):
            out[os.path.basename(parts[0])] = parts[1]
    return out


def _name_and_wnid(stem, file_name, val):
    """``(file name, wnid or None)`` of one sample, from its key or file name alone."""
    base, _, tail = stem.rpartition("_")  # the datasets library's "<stem>_<wnid>.JPEG"
    if base and WNID_RE.match(tail):
        return f"{base}.JPEG", tail
    name = file_name or f"{stem}.JPEG"
    head = stem.split("_", 1)[0]
    if WNID_RE.match(head):
        return name, head
    return name, val.get(name)


def _copy_class_list(name, n_labels):
    """The class list of a known copy: the sorted 1,000 wnids of the ImageNet-1K copies."""
    if name.startswith("imagenet1k") or n_labels == 1000:
        return list(imagenet1k_wnids())
    return None


class _Collect:
    """Gathers ``{wnid: {image id: source}}`` and the copy's processing counts."""

    def __init__(self, root, wnids):
        self.root, self.wanted = root, set(wnids) if wnids is not None else None
        self.listing, self.where = {}, {}
        self.counts = {"samples": 0, "resized": 0, "formats": {}, "min_side": None}

    def add(self, image_id, wnid, source, where):
        if image_id in self.where:
            raise ValueError(
                f"{self.root}: duplicate key: {image_id!r} is in both {self.where[image_id]} "
                f"and {where}; a copy holds each image once"
            )
        self.where[image_id] = where
        if self.wanted is None or wnid in self.wanted:
            self.listing.setdefault(wnid, {})[image_id] = source

    def note(self, fmt, meta):
        c = self.counts
        c["samples"] += 1
        c["formats"][fmt] = c["formats"].get(fmt, 0) + 1
        if meta:
            if "orig_width" in meta or "orig_height" in meta:
                c["resized"] += 1
            sides = [meta.get("width"), meta.get("height")]
            if all(isinstance(s, int) for s in sides):
                side = min(sides)
                c["min_side"] = side if c["min_side"] is None else min(c["min_side"], side)


def _label(stem, file_name, cls, classes, val, where):
    name, wnid = _name_and_wnid(stem, file_name, val)
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


def _parts(part):
    return {"train": ("train",), "test": _VAL_PARTS, "all": ("train", *_VAL_PARTS)}[part]


def list_copy(root, wnids=None, *, part="all", tar_member=None, progress=False):
    """List a webdataset or Parquet copy: ``({wnid: {image id: source}}, copy record)``.

    Parameters
    ----------
    root : path
    wnids : sequence of str, optional
        Keep these concepts only (every sample is still checked).
    part : {"train", "test", "all"}
        The shards or files read: ``train``, ``validation``, or both.
    tar_member : callable, optional
        Makes a shard image's source from ``(shard path, offset, size)``
        (:class:`imagenet_cog.datasets.TarMember` when it lists a split).
    progress : bool

    Returns
    -------
    listing : dict
    copy : dict
        ``{"layout", "name", "processing", "samples", "resized", "formats",
        "min_side"}``: what the copy is and what its processing changed.
    """
    from tqdm.auto import tqdm

    root = Path(root)
    layout = detect_layout(root)
    val = _val_labels()
    found = _Collect(root, wnids)
    if layout == WEBDATASET:
        files, name = _shard_files(root)
        paths = [p for k in _parts(part) for p in files.get(k, [])]
        if not paths:
            raise FileNotFoundError(f"{root}: no {'/'.join(_parts(part))} shards")
        for path in tqdm(paths, desc="listing shards", unit="shard", disable=not progress):
            samples = _cached(path, _list_shard)
            for key, ext, offset, size, cls, meta in samples:
                meta = meta or {}
                stem = key.rpartition("/")[2]
                classes = _copy_class_list(name, 0)
                file_name = meta.get("filename")
                label = cls if cls is not None else meta.get("label")
                fname, wnid = _label(stem, file_name, label, classes, val, f"{path}")
                found.add(
                    f"{wnid}/{fname}", wnid, (tar_member or _TarImage)(path, offset, size), path
                )
                found.note(ext, meta)
    elif layout == PARQUET:
        files = _parquet_files(root)
        paths = [p for k in _parts(part) for p in files.get(k, [])]
        if not paths:
            raise FileNotFoundError(f"{root}: no {'/'.join(_parts(part))} Parquet files")
        name = root.name
        for path in tqdm(paths, desc="listing parquet", unit="file", disable=not progress):
            listed = _cached(path, _list_parquet)
            names = listed["names"]
            if names and all(WNID_RE.match(n) for n in names):
                classes = names
            else:  # ImageNet-1K's class names in the sorted wnid order, checked by file name
                classes = _copy_class_list("", len(names or ()))
            for g, r, file_path, label in listed["rows"]:
                base = os.path.basename(file_path or "")
                stem, ext = os.path.splitext(base)
                fname, wnid = _label(stem, None, label, classes, val, f"{path}")
                found.add(f"{wnid}/{fname}", wnid, ParquetImage(path, g, r), path)
                found.note(ext.lstrip(".").lower() or "?", None)
    else:
        raise ValueError(f"{root} is a {layout} root, not a webdataset or Parquet copy")
    processing = PUBLISHED_PROCESSING.get(name)
    counts = found.counts
    record = {
        "layout": layout,
        "name": name,
        "processing": processing or "unknown (not a copy whose conversion is published)",
        "samples": counts["samples"],
        "resized": counts["resized"],
        "formats": dict(sorted(counts["formats"].items())),
        "min_side": counts["min_side"],
        # What the listing shows: images resized (their original size recorded) or stored
        # in another format than the originals' JPEG.
        "processed": bool(counts["resized"]) or any(
            f not in ("jpg", "jpeg") for f in counts["formats"]
        ),
    }  # fmt: skip
    listing = {w: dict(sorted(found.listing[w].items())) for w in sorted(found.listing)}
    return listing, record
