"""Copies of ImageNet as they are published: webdataset shards and Parquet files.

The data root of a domain is read by its content, not its name (:func:`detect_layout`):

- a folder or an uncompressed tar per wnid (read by :mod:`imagenet_cog.datasets`); a folder
  copy made by ImageNet-21K-P's processing is recognised by its 224 x 224 images
  (:func:`folder_copy`), and ImageNet-21K-P's ``imagenet21k_train/`` and ``imagenet21k_val/``
  are refused with the line that merges them;
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
group, the unit Parquet compresses: a reader that knows its images (a DataLoader worker) keeps
each row group from its first image to its last; other reads keep the last few.

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

import functools
import hashlib
import json
import os
import re
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from ._base import WNID_RE, data_path
from ._fileio import atomic_write_bytes
from .taxonomy import imagenet1k_wnids

__all__ = [
    "FOLDERS",
    "PARQUET",
    "WEBDATASET",
    "ParquetImage",
    "copy_layout",
    "detect_layout",
    "folder_copy",
    "list_copy",
    "location",
    "planned_parquet_reads",
    "published_name",
    "read_parquet_image",
    "reencoded",
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
_IN21K_P = (
    "ImageNet-21K-P's processing (Alibaba-MIIL/ImageNet21K): classes of 500 images or fewer "
    "removed, 50 images per class set aside for validation, images whose longer side is 224 px "
    "or more squeezed to 224 x 224 (OpenCV, bilinear) and re-encoded as JPEG (quality 95)"
)
#: What each published copy's conversion did to its images (the copy's name is the shard
#: prefix, as its conversion code writes it).
PUBLISHED_PROCESSING = {
    "imagenet22k": "shorter side above 600 px resized (bicubic), re-encoded as JPEG q90; "
    "images under 56 px dropped",
    "imagenet12k": "shorter side above 600 px resized (bicubic), re-encoded as JPEG q90; "
    "images under 48 px dropped",
    "imagenet-w21": "shorter side above 600 px resized (bicubic), re-encoded as JPEG; "
    "images under 56 px dropped",
    "imagenet-w21-webp": "shorter side above 768 px resized, re-encoded as WebP; "
    "images under 32 px dropped",
    "imagenet1k": "none (the ILSVRC-2012 JPEG files)",
    "imagenet21k-p": _IN21K_P,
    "imagenet-w21-p": _IN21K_P + "; timm's Parquet copy stores them as WebP, with settings it "
    "does not publish",
}
#: Images sampled from a folder copy to recognise ImageNet-21K-P's 224 x 224 images.
FOLDER_SAMPLE = 32


def published_name(name, layout=None):
    """The published copy (a key of :data:`PUBLISHED_PROCESSING`) a copy's name points to.

    A Parquet copy is named by its folder, so any ``*w21-p*`` or ``*21k-p*`` name is timm's
    ``imagenet-w21-p``; a folder copy's name is the one :func:`folder_copy` gave it.
    """
    low = name.lower()
    if layout != "folder per wnid" and ("w21-p" in low or "21k-p" in low):
        return "imagenet-w21-p"
    return low


def reencoded(formats):
    """The encodings among ``formats`` other than the original files' JPEG."""
    return [f for f in formats if f not in ("jpg", "jpeg")]


def _sniff(data):
    """The encoding of image bytes, from their first bytes."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"\xff\xd8":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return "other"


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
    parquet = _parquet_files(root)
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


def _cached(path, make, rules=""):
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


# ---------------------------------------------------------------- webdataset shards
_ZERO_BLOCK = bytes(_BLOCK)
_REGULAR = (b"0", b"\0", b"7")


def _octal(field):
    if field[0] & 0x80:  # GNU base-256 for large sizes
        return int.from_bytes(field[1:], "big")
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def _tar_members(fd, file_size, path):
    """``(name, data offset, size)`` of each regular member, from the headers alone.

    One ``pread`` per header, none of the members' data: Python's tarfile parses every
    field of every header and is about four times slower on shards. The ustar prefix, GNU
    long names and pax ``path``/``size`` records are read; a header whose checksum fails, a
    member past the end of the file or a missing end-of-archive block is refused.
    """
    pos, long_name, pax = 0, None, {}
    while True:
        header = os.pread(fd, _BLOCK, pos)
        if header == _ZERO_BLOCK:
            return
        if len(header) < _BLOCK:
            raise ValueError(
                f"{path}: no end-of-archive block at byte {pos} of {file_size}: the shard is "
                "cut short or damaged; download it again"
            )
        try:
            checksum = _octal(header[148:156])
            size = _octal(header[124:136])
        except ValueError:
            checksum = size = -1
        if checksum != sum(header[:148]) + 256 + sum(header[156:]):
            raise ValueError(f"{path}: damaged tar header at byte {pos}; download it again")
        kind = header[156:157]
        name = header[:100].split(b"\0", 1)[0]
        if header[257:262] == b"ustar" and header[345] != 0:
            name = header[345:500].split(b"\0", 1)[0] + b"/" + name
        data = pos + _BLOCK
        if kind in (b"x", b"L"):
            extra = os.pread(fd, size, data)
            if kind == b"L":
                long_name = extra.split(b"\0", 1)[0]
            else:
                for record in extra.split(b"\n"):
                    field = record.partition(b" ")[2]
                    k, _, v = field.partition(b"=")
                    pax[k] = v
        else:
            name = pax.get(b"path", long_name or name)
            size = int(pax[b"size"]) if b"size" in pax else size
            long_name, pax = None, {}
        if data + size > file_size:
            raise ValueError(
                f"{path}: member {name.decode(errors='replace')!r} runs past the end of the "
                f"file ({data + size} > {file_size} bytes); the shard is cut short, download "
                "it again"
            )
        pos = data + (size + _BLOCK - 1) // _BLOCK * _BLOCK
        if kind in _REGULAR:
            yield name.decode("utf-8", "surrogateescape"), data, size


def _list_shard(path):
    """``[[key, ext, offset, size, cls, meta]]`` of one shard, from its headers.

    The small ``.cls`` and ``.json`` members are read; images are not. A shard cut short (a
    member past the end, no end-of-archive block), a sample without an image or with two
    images is refused, naming the shard and the key.
    """
    samples = {}
    with open(path, "rb") as f:
        fd = f.fileno()
        for member, offset, size in _tar_members(fd, os.fstat(fd).st_size, path):
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
                sample["image"] = (ext, offset, size)
            elif ext in ("cls", "json") and size <= 1 << 16:
                sample[ext] = os.pread(fd, size, offset)
    out = []
    for key, sample in samples.items():
        if "image" not in sample:
            has = ", ".join(f".{k}" for k in sample) or "nothing"
            raise ValueError(f"{path}: sample {key!r} has no image (only {has})")
        ext, offset, size = sample["image"]
        try:
            cls = int(sample["cls"].decode().strip()) if "cls" in sample else None
            meta = json.loads(sample["json"]) if "json" in sample else None
        except ValueError:
            raise ValueError(f"{path}: sample {key!r} has an unreadable .cls or .json") from None
        out.append([key, ext, offset, size, cls, meta])
    return out


def _shard_entries(path, name):
    """The labelled listing of one shard: ``{"entries": [[image id, wnid, offset, size]],
    "counts": {...}}`` (what is cached)."""
    classes = _copy_class_list(name, 0)
    entries, counts = [], _new_counts()
    for key, ext, offset, size, cls, meta in _list_shard(path):
        meta = meta or {}
        stem = key.rpartition("/")[2]
        label = cls if cls is not None else meta.get("label")
        fname, wnid = _label(stem, meta.get("filename"), label, classes, path)
        entries.append([f"{wnid}/{fname}", wnid, offset, size])
        _note(counts, ext, meta)
    return {"entries": entries, "counts": counts}


# ---------------------------------------------------------------- parquet
def _pq():
    from ._optional_dependencies import require

    return require("pyarrow.parquet", "reading a Parquet copy")


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
# Row groups a planned reader will still read images of: ``{(path, row group): images left}``
# (:func:`planned_parquet_reads`), and those of them read so far.
_PLANNED = {}
_PINNED = {}


def _row_group_images(path, row_group):
    """The encoded images of one row group, read and decompressed."""
    table = _pq().ParquetFile(path).read_row_group(row_group, columns=["image.bytes"])
    return table.column("image").combine_chunks().field("bytes").to_pylist()


@contextmanager
def planned_parquet_reads(sources):
    """Keep each Parquet row group of ``sources`` from its first image read to its last.

    A reader that knows every image it will read (a DataLoader worker with its batches)
    reads each row group once, whatever the order; other reads keep the last few.
    """
    _PLANNED.clear()
    _PINNED.clear()
    for s in sources:
        if isinstance(s, ParquetImage):
            key = (s.path, s.row_group)
            _PLANNED[key] = _PLANNED.get(key, 0) + 1
    try:
        yield
    finally:
        _PLANNED.clear()
        _PINNED.clear()


def read_parquet_image(source, keep=4):
    """The encoded bytes of a :class:`ParquetImage`; the last ``keep`` row groups are kept."""
    if _ROW_GROUPS_PID[0] != os.getpid():  # a forked worker keeps nothing of its parent's
        _ROW_GROUPS.clear()
        _ROW_GROUPS_PID[0] = os.getpid()
    key = (source.path, source.row_group)
    if _PLANNED.get(key, 0) > 0:
        images = _PINNED.get(key)
        if images is None:
            images = _PINNED[key] = _row_group_images(*key)
        _PLANNED[key] -= 1
        if _PLANNED[key] == 0:  # its last planned image: dropped
            del _PINNED[key]
    else:
        images = _ROW_GROUPS.pop(key, None)
        if images is None:
            images = _row_group_images(*key)
            while len(_ROW_GROUPS) >= keep:
                _ROW_GROUPS.popitem(last=False)
        _ROW_GROUPS[key] = images
    data = images[source.row]
    if data is None:
        raise ValueError(
            f"{source.path}: row {source.row} of row group {source.row_group} has no image bytes"
        )
    return data


# ---------------------------------------------------------------- labels
@functools.lru_cache(maxsize=1)
def _val_labels():
    """``{file name: wnid}`` of the 50,000 ILSVRC-2012 validation images (bundled)."""
    from gzip import decompress

    raw = decompress(data_path("imagenet1k_val_labels.tsv.gz").read_bytes()).decode()
    out = {}
    for line in raw.splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) == 2 and WNID_RE.match(parts[1]):
            out[os.path.basename(parts[0])] = parts[1]
    return out


def _name_and_wnid(stem, file_name):
    """``(file name, wnid or None)`` of one sample, from its key or file name alone."""
    base, _, tail = stem.rpartition("_")  # the datasets library's "<stem>_<wnid>.JPEG"
    if base and WNID_RE.match(tail):
        return f"{base}.JPEG", tail
    name = file_name or f"{stem}.JPEG"
    head = stem.split("_", 1)[0]
    if WNID_RE.match(head):
        return name, head
    return name, _val_labels().get(name)


def _copy_class_list(name, n_labels):
    """The class list of a known copy: the sorted 1,000 wnids of the ImageNet-1K copies."""
    if name.startswith("imagenet1k") or n_labels == 1000:
        return list(imagenet1k_wnids())
    return None


def _new_counts():
    return {"samples": 0, "resized": 0, "formats": {}, "min_side": None}


def _note(counts, fmt, meta):
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


def _add_counts(total, counts):
    total["samples"] += counts["samples"]
    total["resized"] += counts["resized"]
    for fmt, n in counts["formats"].items():
        total["formats"][fmt] = total["formats"].get(fmt, 0) + n
    if counts["min_side"] is not None:
        low = total["min_side"]
        total["min_side"] = counts["min_side"] if low is None else min(low, counts["min_side"])


def _label(stem, file_name, cls, classes, where):
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


def _parquet_entries(path):
    """The labelled listing of one Parquet file (what is cached)."""
    listed = _list_parquet(path)
    names = listed["names"]
    if names and all(WNID_RE.match(n) for n in names):
        classes = names
    else:  # ImageNet-1K's class names in the sorted wnid order, checked by file name
        classes = _copy_class_list("", len(names or ()))
    entries, counts = [], _new_counts()
    # The file names keep the originals' suffix whatever the encoding: the first image of
    # the file (one row group read) tells it, and the file is taken to hold one encoding.
    fmt = _sniff(read_parquet_image(ParquetImage(str(path), 0, 0))) if listed["rows"] else "?"
    for g, r, file_path, label in listed["rows"]:
        stem, _ = os.path.splitext(os.path.basename(file_path or ""))
        fname, wnid = _label(stem, None, label, classes, path)
        entries.append([f"{wnid}/{fname}", wnid, g, r])
        _note(counts, fmt, None)
    return {"entries": entries, "counts": counts}


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
        (``datasets.TarMember`` when it lists a split).
    progress : bool

    Returns
    -------
    listing : dict
    copy : dict
        ``{"layout", "name", "processing", "samples", "resized", "formats",
        "min_side", "processed"}``: what the copy is and what its processing changed.
    """
    from tqdm.auto import tqdm

    root = Path(root)
    layout = detect_layout(root)
    if layout == WEBDATASET:
        files, name = _shard_files(root)
        source = tar_member or _TarImage
    elif layout == PARQUET:
        files, name = _parquet_files(root), root.name
        source = ParquetImage
    else:
        raise ValueError(f"{root} is a {layout} root, not a webdataset or Parquet copy")
    paths = [p for k in _parts(part) for p in files.get(k, [])]
    if not paths:
        raise FileNotFoundError(f"{root}: no {'/'.join(_parts(part))} {layout}")
    wanted = None if wnids is None else set(wnids)
    found, where, counts = {}, {}, _new_counts()
    for path in tqdm(paths, desc=f"listing {layout}", unit="file", disable=not progress):
        if layout == WEBDATASET:
            listed = _cached(path, functools.partial(_shard_entries, name=name), rules=name)
        else:
            listed = _cached(path, _parquet_entries)
        _add_counts(counts, listed["counts"])
        for image_id, wnid, a, b in listed["entries"]:
            if image_id in where:
                raise ValueError(
                    f"{root}: duplicate key: {image_id!r} is in both {where[image_id]} and "
                    f"{path}; a copy holds each image once"
                )
            where[image_id] = path
            if wanted is None or wnid in wanted:
                found.setdefault(wnid, {})[image_id] = source(path, a, b)
    processing = PUBLISHED_PROCESSING.get(published_name(name, layout))
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
        "processed": bool(counts["resized"] or reencoded(counts["formats"])),
    }
    listing = {w: dict(sorted(found[w].items())) for w in sorted(found)}
    return listing, record


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
    files = [f for f in files if isinstance(f, (str, os.PathLike))]
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
        "processing": PUBLISHED_PROCESSING["imagenet21k-p"],
        "samples": sum(len(v) for v in listing.values()),
        "resized": 0,
        "formats": {},
        "min_side": None,
        "processed": True,
        "seen": f"{squeezed} of {len(sizes)} sampled images are 224 x 224",
    }


# ---------------------------------------------------------------- read order
def location(source):
    """``(data file, offset or row group, row)`` of an image in a tar or a Parquet file, or
    ``None`` for a file of its own or an in-memory image."""
    if isinstance(source, ParquetImage):
        return (source.path, source.row_group, source.row)
    if isinstance(source, tuple) and len(source) == 3 and isinstance(source[1], int):
        return (str(source[0]), source[1], 0)  # a tar member: (tar, offset, size)
    return None


def read_order(sources, start, stop):
    """The indices ``start..stop-1`` in the order their images lie on disk.

    Images in a tar or a Parquet file (a shard copy, a tar per wnid) come sorted by file and
    offset, so that a store shard reads each data file forward, once, instead of jumping
    between the shards of a copy shuffled across classes; files and in-memory images keep
    their order, first. Features are put back in the split's order by :func:`in_split_order`.
    """
    indices = range(start, stop)
    if sources is None:
        return list(indices)

    def where(i):
        at = location(sources[i])
        return (0, "", i, 0) if at is None else (1, *at)

    return sorted(indices, key=where)


def in_split_order(indices, features):
    """``(features in the order of their indices)``: undoes :func:`read_order` in a shard."""
    import numpy as np

    if not features:
        return features
    index = np.concatenate(indices)
    if np.all(index[1:] > index[:-1]):
        return features
    return [np.concatenate(features)[np.argsort(index, kind="stable")]]
