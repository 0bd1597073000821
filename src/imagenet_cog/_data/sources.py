"""Image sources: where one image lies, and how its encoded bytes are read.

An image of a split comes from one of five kinds of source:

- a **file** of its own, given by its path (``str`` or path-like): a folder per wnid,
  ImageNet-1K's ``val/``;
- a :class:`TarMember`: the data of one member of an uncompressed tar (a tar per wnid or a
  webdataset shard), read at its offset, never extracted;
- a :class:`ParquetImage`: one row of a Parquet file, read by row group, the unit Parquet
  compresses;
- an :class:`ItemOf`: an item of a foreign map-style dataset;
- a PIL image in memory.

:func:`kind` is the one place that tells them apart: reading (:func:`read_bytes`), naming
(:func:`source_id`) and placing an image in its data file (:func:`location`,
:func:`data_file`) go through it, and so does the rest of the package. A store shard reads its
images in the order they lie on disk (:func:`read_order`) and puts their features back in the
split's order (:func:`in_split_order`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import zlib
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "DATASET_ITEM",
    "FILE",
    "MAX_IMAGE_BYTES",
    "PARQUET_IMAGE",
    "PIL_IMAGE",
    "STALE_LISTING",
    "TAR_MEMBER",
    "ItemOf",
    "OpenTars",
    "ParquetImage",
    "StaleListingError",
    "TarMember",
    "check_size",
    "data_file",
    "header_check",
    "in_split_order",
    "kind",
    "listing_cache_file",
    "location",
    "planned_parquet_reads",
    "pyarrow_parquet",
    "read_bytes",
    "read_order",
    "read_parquet_image",
    "source_id",
]

#: Largest image, in bytes, that is read (256 MiB): a tar member over it is refused when the
#: tar is listed, a larger file is skipped and listed.
MAX_IMAGE_BYTES = 256 * 2**20

_READ_CHUNK = 1 << 24  # one pread reads at most this much (Linux stops at 2 GiB anyway)

FILE = "file"
TAR_MEMBER = "tar member"
PARQUET_IMAGE = "Parquet image"
DATASET_ITEM = "dataset item"
PIL_IMAGE = "PIL image"


#: How the reason of an image read against a stale listing starts, so that the extraction
#: stops on it rather than skipping the image.
STALE_LISTING = "stale listing: "


class StaleListingError(ValueError):
    """A data file no longer holds, where its listing says, the image listed there: it was
    rewritten after it was listed (its size and modification time kept)."""


class TarMember(NamedTuple):
    """Where one image lies inside an uncompressed tar file.

    Attributes
    ----------
    tar : str
        Path of the tar file.
    offset : int
        Byte offset of the member's data in the tar file.
    size : int
        Size of the member's data in bytes.
    header : int or None
        :func:`header_check` of the member's own header block, as listed: read again with the
        data, it tells a member moved since the listing (``None``: not checked).
    labels : tuple of (int, int, int)
        ``(offset, size, crc32)`` of the data of each member the image's label (or name) was
        read from when it was listed (a shard's ``.cls`` or ``.json``): read again with the
        image, they tell a label changed in place since the listing.
    """

    tar: str
    offset: int
    size: int
    header: int | None = None
    labels: tuple = ()


class ParquetImage(NamedTuple):
    """Where one image lies in a Parquet file: its row group and row.

    Attributes
    ----------
    path : str
    row_group : int
    row : int
        The row within the row group.
    column : str
        The image column (``struct<bytes, path>``).
    name : str or None
        The row's ``path`` as listed, read again with the image: it tells a row moved since
        the listing (``None``: not checked).
    """

    path: str
    row_group: int
    row: int
    column: str = "image"
    name: str | None = None


class ItemOf(NamedTuple):
    """Item ``index`` of a foreign map-style dataset (a PIL image or a tuple starting with one).

    An image source as a path or a :class:`TarMember` is: it lets a torchvision-style
    dataset be extracted like an image folder. :meth:`get` returns the image.

    Examples
    --------
    >>> ItemOf([("image", 0), ("other", 1)], 1).get()
    'other'
    """

    dataset: object
    index: int

    def get(self):
        """The image: the item itself, or the first element of a tuple item."""
        item = self.dataset[self.index]
        return item[0] if isinstance(item, (tuple, list)) else item


def is_pil(obj):
    """True for a PIL image (PIL is not imported to tell)."""
    return type(obj).__module__.startswith("PIL.") and hasattr(obj, "convert")


def kind(source):
    """The kind of an image source: :data:`TAR_MEMBER`, :data:`PARQUET_IMAGE`,
    :data:`DATASET_ITEM`, :data:`PIL_IMAGE` or :data:`FILE` (a path, anything else)."""
    if isinstance(source, TarMember):
        return TAR_MEMBER
    if isinstance(source, ParquetImage):
        return PARQUET_IMAGE
    if isinstance(source, ItemOf):
        return DATASET_ITEM
    if is_pil(source):
        return PIL_IMAGE
    return FILE


def source_id(source, i):
    """The string that names a source when no image id is given (``i``: its position)."""
    what = kind(source)
    if what == DATASET_ITEM:
        return str(source.index)
    if what == TAR_MEMBER:
        return f"{source.tar}@{source.offset}"
    if what == PARQUET_IMAGE:
        return f"{source.path}@{source.row_group}:{source.row}"
    if what == PIL_IMAGE:
        return f"<image {i}>"
    return str(source)


# ---------------------------------------------------------------- reading bytes
def header_check(block):
    """A short fingerprint of a tar header block: its name, size and name-prefix fields."""
    return zlib.crc32(bytes(block[:100]) + bytes(block[124:136]) + bytes(block[345:500]))


def listing_cache_file(path):
    """The file that caches the listing of the data file ``path``:
    ``$IMAGENET_COG_CACHE/listings/<hash of its resolved path>.json`` (by default under
    ``~/.cache/imagenet_cog``)."""
    base = os.environ.get("IMAGENET_COG_CACHE") or Path.home() / ".cache" / "imagenet_cog"
    resolved = str(Path(path).resolve())
    return Path(base) / "listings" / (hashlib.sha256(resolved.encode()).hexdigest()[:32] + ".json")


def _stale(path, where, found, listed="the image"):
    """The error of a data file changed since it was listed; its cached listing is dropped,
    so that the next run lists it anew."""
    with contextlib.suppress(OSError):  # a read-only cache: the listing is checked anyway
        listing_cache_file(path).unlink(missing_ok=True)
    return StaleListingError(
        f"{path} changed since it was listed: {where} now holds {found}, not {listed} listed "
        "there (the file was rewritten and its size and modification time kept); its cached "
        "listing is removed: run the same command again to list it anew"
    )


#: Label members this close to their image (a sample's ``.cls`` and ``.json`` lie beside
#: it) are read in the same ``pread`` as the image.
_NEAR = 1 << 16


def _read_member(f, source):
    """The data of a :class:`TarMember`, its header block and the members its label came
    from read with it and checked."""
    start = source.offset if source.header is None or source.offset < 512 else source.offset - 512
    stop = source.offset + source.size
    spans = [(o, o + n) for o, n, _ in source.labels]
    lo, hi = min([start, *(a for a, _ in spans)]), max([stop, *(b for _, b in spans)])
    near = hi - lo <= stop - start + _NEAR
    if not near:
        lo, hi = start, stop
    raw = _read_at(f, lo, hi - lo)
    if start < source.offset and header_check(raw[start - lo : start - lo + 512]) != source.header:
        name = raw[start - lo : start - lo + 100].split(b"\0", 1)[0].decode("utf-8", "replace")
        raise _stale(source.tar, f"byte {source.offset}", f"member {name!r}")
    for (a, b), (_, _, check) in zip(spans, source.labels):
        data = raw[a - lo : b - lo] if near else _read_at(f, a, b - a)
        if zlib.crc32(data) != check:
            raise _stale(source.tar, f"byte {a}", "other data", "the label")
    return raw[source.offset - lo : stop - lo]


def check_size(size):
    """Refuse an image of more than :data:`MAX_IMAGE_BYTES` bytes."""
    if size > MAX_IMAGE_BYTES:
        raise ValueError(f"{size} bytes, over the limit of {MAX_IMAGE_BYTES} bytes per image")


def _read_at(f, offset, size):
    """``size`` bytes at ``offset``, read in bounded chunks (one pread stops short of 2 GiB)."""
    parts, done = [], 0
    while done < size:
        n = min(_READ_CHUNK, size - done)
        if hasattr(os, "pread"):
            chunk = os.pread(f.fileno(), n, offset + done)
        else:  # pragma: no cover - Windows
            f.seek(offset + done)
            chunk = f.read(n)
        if not chunk:
            raise OSError(f"data cut short: {done} of {size} bytes")
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


class OpenTars:
    """The tar files one process keeps open for random reads, at most ``limit`` of them.

    A forked DataLoader worker never shares its parent's handles: it opens its own, and a
    pickled copy starts with none.
    """

    def __init__(self, limit=64):
        self.limit = limit
        self._files = OrderedDict()
        self._pid = None

    def __getstate__(self):
        return {"limit": self.limit, "_files": OrderedDict(), "_pid": None}

    def get(self, path):
        """The open file of ``path``, opened (and the oldest closed) when needed."""
        if self._pid != os.getpid():  # a forked worker: never share parent handles
            self._files = OrderedDict()
            self._pid = os.getpid()
        f = self._files.pop(path, None)
        if f is None:
            f = open(path, "rb")  # noqa: SIM115 - kept open across reads, closed on eviction
            while len(self._files) >= self.limit:
                self._files.popitem(last=False)[1].close()
        self._files[path] = f
        return f

    def close(self):
        """Close the files this process opened."""
        if os.getpid() == self._pid:
            for f in self._files.values():
                f.close()
            self._files = OrderedDict()


def read_bytes(source, tars=None):
    """The encoded bytes of a file, a :class:`TarMember` or a :class:`ParquetImage`.

    Parameters
    ----------
    source
    tars : OpenTars, optional
        Keeps tar files open between reads; without it a tar is opened for this read.

    Raises
    ------
    OSError
        When the data cannot be read.
    ValueError
        When the image is over :data:`MAX_IMAGE_BYTES`.
    TypeError
        For a source that holds a decoded image, not encoded bytes.
    """
    what = kind(source)
    if what == PARQUET_IMAGE:
        return read_parquet_image(source)
    if what == TAR_MEMBER:
        check_size(source.size)
        if tars is not None:
            return _read_member(tars.get(source.tar), source)
        with open(source.tar, "rb") as f:
            return _read_member(f, source)
    if what == FILE:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            check_size(size)
            return _read_at(f, 0, size)
    raise TypeError(f"a {what} holds a decoded image, not encoded bytes")


# ---------------------------------------------------------------- Parquet row groups
def pyarrow_parquet():
    """``pyarrow.parquet``, or an ImportError that says how to install it."""
    from .._optional_dependencies import require

    return require("pyarrow.parquet", "reading a Parquet copy")


_ROW_GROUPS = OrderedDict()
_ROW_GROUPS_PID = [None]
# Row groups a planned reader will still read images of: ``{(path, row group): images left}``
# (:func:`planned_parquet_reads`), and those of them read so far.
_PLANNED = {}
_PINNED = {}


def _row_group_images(path, row_group, column="image"):
    """``(encoded images, their paths)`` of one row group, read and decompressed."""
    try:
        table = (
            pyarrow_parquet()
            .ParquetFile(path)
            .read_row_group(row_group, columns=[f"{column}.bytes", f"{column}.path"])
        )
    except (OSError, ValueError) as exc:  # pyarrow's errors name no file
        raise OSError(f"{path}: row group {row_group} cannot be read ({exc})") from None
    images = table.column(column).combine_chunks()
    return images.field("bytes").to_pylist(), images.field("path").to_pylist()


@contextmanager
def planned_parquet_reads(sources):
    """Keep each Parquet row group of ``sources`` from its first image read to its last.

    A reader that knows every image it will read (a DataLoader worker with its batches)
    reads each row group once, whatever the order; other reads keep the last few.
    """
    _PLANNED.clear()
    _PINNED.clear()
    for s in sources:
        if kind(s) == PARQUET_IMAGE:
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
            images = _PINNED[key] = _row_group_images(*key, source.column)
        _PLANNED[key] -= 1
        if _PLANNED[key] == 0:  # its last planned image: dropped
            del _PINNED[key]
    else:
        images = _ROW_GROUPS.pop(key, None)
        if images is None:
            images = _row_group_images(*key, source.column)
            while len(_ROW_GROUPS) >= keep:
                _ROW_GROUPS.popitem(last=False)
        _ROW_GROUPS[key] = images
    images, names = images
    if source.name is not None and names[source.row] != source.name:
        where = f"row {source.row} of row group {source.row_group}"
        raise _stale(source.path, where, f"{names[source.row]!r}")
    data = images[source.row]
    if data is None:
        raise ValueError(
            f"{source.path}: row {source.row} of row group {source.row_group} has no image bytes"
        )
    return data


# ---------------------------------------------------------------- read order
def location(source):
    """``(data file, offset or row group, row)`` of an image in a tar or a Parquet file, or
    ``None`` for a file of its own or an image in memory."""
    what = kind(source)
    if what == PARQUET_IMAGE:
        return (source.path, source.row_group, source.row)
    if what == TAR_MEMBER:
        return (str(source.tar), source.offset, 0)
    return None


def data_file(source):
    """The tar or Parquet file that holds an image, or ``None`` for a file or PIL image."""
    at = location(source)
    return None if at is None else at[0]


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
