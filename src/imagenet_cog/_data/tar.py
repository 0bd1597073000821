"""The one tar reader: the members of an uncompressed tar, from their headers alone.

It serves both layouts kept in tars, a tar per wnid and a webdataset shard, with the same
checks, so that a damaged or unsafe tar is refused alike whatever its layout:

- a header whose checksum fails, or a missing end-of-archive block (the tar is cut short
  or damaged: without the check, images would silently be lost);
- a member whose data runs past the end of the file;
- a member whose name is absolute or contains ``..``;
- two members of the same name;
- a GNU sparse member named like an image (its data is a map of holes, not an image's
  bytes; other sparse members are passed over);
- an image member over the image size limit, or whose name is not UTF-8;
- a GNU long-name or pax header whose data is over :data:`MAX_HEADER_BYTES` (read whole, it
  would take as much memory as it declares).

One ``pread`` per header, none of the members' data. The formats are read as Python's
``tarfile`` reads them (its reading is the reference of the tests): ustar with its name
prefix, GNU long names and sparse members (with their extension blocks), pax ``path`` and
``size`` records, global pax headers, and base-256 sizes. ``benchmarks/bench_copies.py``
measures this reader against ``tarfile`` in the same run.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from .._base import IMAGE_SUFFIXES
from . import sources

__all__ = [
    "BLOCK",
    "MAX_HEADER_BYTES",
    "NotATarError",
    "TarEntry",
    "is_image_name",
    "read_members",
]

#: The tar block size.
BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
#: Member types whose data follows the header: regular files ("0", "\0", contiguous "7").
_REGULAR = (b"0", b"\0", b"7")
_SPARSE = b"S"
_LONG_NAME, _LONG_LINK = b"L", b"K"
_PAX, _PAX_SOLARIS, _PAX_GLOBAL = b"x", b"X", b"g"
_HEADER_KINDS = {
    _LONG_NAME: "long name",
    _LONG_LINK: "long link",
    _PAX: "pax",
    _PAX_SOLARIS: "pax",
    _PAX_GLOBAL: "global pax",
}
#: Largest data of a GNU long-name or pax header that is read (1 MiB): a name or a few
#: records take a few kB; what declares more is refused, as an image over the image size
#: limit is.
MAX_HEADER_BYTES = 2**20
#: The pax keywords the reader uses; the others are dropped as they are read, so that global
#: headers cannot pile up records in memory. Any ``GNU.sparse.*`` keyword marks a sparse member.
_PAX_KEPT = ("path", "size", "GNU.sparse.name")
_PAX_SPARSE = "GNU.sparse."
#: Types tarfile knows that carry no data (links, devices, folders, FIFOs).
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_DRIVE = re.compile(r"^[A-Za-z]:")
#: Names of image members in either layout (a tar per wnid or a webdataset shard).
_IMAGE_NAMES = (*IMAGE_SUFFIXES, ".webp")


class TarEntry(NamedTuple):
    """A regular member of a tar: its name, and where its data lies.

    Attributes
    ----------
    name : str
    offset : int
        Byte offset of the member's data in the tar file.
    size : int
        Size of its data in bytes.
    header : int
        :func:`~imagenet_cog._data.sources.header_check` of its header block, which lies just
        before its data.
    """

    name: str
    offset: int
    size: int
    header: int = 0


class NotATarError(ValueError):
    """The file does not start with a tar header (a compressed tar, or another file)."""


def is_image_name(name):
    """True when a member is named like an image of a tar per wnid or of a shard."""
    return name.lower().endswith(_IMAGE_NAMES)


def _number(field):
    """A header's numeric field: octal, or GNU base-256 for large values."""
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def _text(field):
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _valid(header):
    """The size field of a whole header whose checksum holds (unsigned, or signed as some old
    tars write it), else ``None``."""
    if len(header) < BLOCK:
        return None
    try:
        checksum, size = _number(header[148:156]), _number(header[124:136])
    except ValueError:
        return None
    unsigned = sum(header) - sum(header[148:156]) + 256  # the checksum field read as spaces
    if checksum != unsigned:
        blank = header[:148] + b"        " + header[156:]
        if checksum != sum(b - 256 if b > 127 else b for b in blank):
            return None
    return size


def _pax_records(data, path, pos):
    """``{keyword: value}`` of a pax header's records (``"%d %s=%s\\n"``, length first)."""
    records, at = {}, 0
    while True:
        match = _PAX_RECORD.match(data, at)
        if not match:
            return records
        try:
            length = int(match.group(1))
        except ValueError:  # Python refuses integers of more than 4,300 digits
            length = 0
        if length == 0:
            raise ValueError(f"{path}: damaged pax header at byte {pos}; download it again")
        keyword = match.group(2).decode("utf-8", "surrogateescape")
        if keyword in _PAX_KEPT:
            records[keyword] = data[match.end(2) + 1 : match.start(1) + length - 1]
        elif keyword.startswith(_PAX_SPARSE):
            records[_PAX_SPARSE] = b""
        at += length


def _unsafe(name):
    """True for an absolute name (``/x``, ``\\x``, ``C:x``) or one with a ``..`` part."""
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return True
    return ".." in name and ".." in name.replace("\\", "/").split("/")


def _cut_short(path, pos, file_size, last):
    after = f"after member {last!r}" if last is not None else "at its start"
    return ValueError(
        f"{path}: no end-of-archive block at byte {pos} of {file_size} ({after}): the tar is "
        "cut short or damaged and images would be lost; download it again"
    )


def read_members(f, path):
    """The regular members of an open uncompressed tar, every check applied.

    Parameters
    ----------
    f : binary file
        The tar, open for reading (read with ``os.pread``; its position is not used).
    path : path
        Its path, named in the errors.

    Yields
    ------
    TarEntry
        Each regular member in the tar's order (sparse members named like an image are
        refused, other sparse members, folders and links passed over).

    Raises
    ------
    NotATarError
        When the file does not start with a tar header.
    ValueError
        For a tar cut short or damaged, or holding an unsafe, duplicate, sparse image or
        oversized image member (see the module's docstring); the message names the tar and
        the member.
    """
    fd = f.fileno()
    file_size = os.fstat(fd).st_size
    pos, last, seen = 0, None, set()
    long_name, pax, global_pax = None, {}, {}
    while True:
        header = os.pread(fd, BLOCK, pos)
        if header == _ZERO_BLOCK:
            return
        size = _valid(header)
        if size is None:
            if pos == 0:
                raise NotATarError(
                    f"unreadable tar file {path} (no tar header at its start); only "
                    "uncompressed tar files can be read without extracting them"
                )
            raise _cut_short(path, pos, file_size, last)
        kind = header[156:157]
        data = pos + BLOCK
        if kind in _HEADER_KINDS:
            if data + size > file_size:
                raise _cut_short(path, pos, file_size, last)
            if size > MAX_HEADER_BYTES:
                raise ValueError(
                    f"{path}: a tar header at byte {pos} declares {size} bytes of "
                    f"{_HEADER_KINDS[kind]} data, over the limit of {MAX_HEADER_BYTES} bytes: "
                    "the tar is damaged or not a copy of ImageNet"
                )
            extra = os.pread(fd, size, data)
            if kind == _LONG_NAME:
                long_name = extra.split(b"\0", 1)[0]
            elif kind == _PAX_GLOBAL:  # applies to every later member
                global_pax.update(_pax_records(extra, path, pos))
            elif kind != _LONG_LINK:
                pax = _pax_records(extra, path, pos)
            pos = data + (size + BLOCK - 1) // BLOCK * BLOCK
            continue
        name = _text(header[:100])
        if header[345] and kind != _SPARSE:  # ustar's prefix; tarfile reads it whatever the magic
            name = f"{_text(header[345:500])}/{name}"
        if long_name is not None:
            name = _text(long_name)
        long_name, sparse = None, kind == _SPARSE
        if global_pax:
            pax = {**global_pax, **pax}
        if pax:
            sparse = sparse or any(k.startswith(_PAX_SPARSE) for k in pax)
            if "path" in pax:
                name = pax["path"].decode("utf-8", "surrogateescape")
            if "GNU.sparse.name" in pax:
                name = pax["GNU.sparse.name"].decode("utf-8", "surrogateescape")
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    size = -1
                if size < 0:
                    raise ValueError(
                        f"{path}: damaged pax header at byte {pos} (size "
                        f"{pax['size'][:20].decode('ascii', 'replace')!r} for member {name!r}); "
                        "download it again"
                    )
            pax = {}
        if kind == _SPARSE and header[482]:  # old GNU sparse: extension blocks, then data
            while True:
                block = os.pread(fd, BLOCK, data)
                if len(block) < BLOCK:
                    raise _cut_short(path, data, file_size, last)
                data += BLOCK
                if not block[504]:
                    break
        if _unsafe(name):
            raise ValueError(f"{path}: refusing tar member {name!r} (absolute path or '..')")
        last = name
        folder = kind == b"5" or (kind == b"\0" and name.endswith("/"))
        regular = (kind in _REGULAR or kind == _SPARSE) and not folder
        if regular or kind not in (*_NO_DATA, b"\0", b"5"):  # tarfile skips their data
            if data + size > file_size:
                raise ValueError(
                    f"{path}: tar member {name!r} runs past the end of the file "
                    f"({data + size} > {file_size} bytes); the tar is cut short, download it "
                    "again"
                )
            pos = data + (size + BLOCK - 1) // BLOCK * BLOCK
        else:
            pos = data
        if sparse:
            if is_image_name(name):
                raise ValueError(f"{path}: refusing GNU sparse tar member {name!r}")
            continue
        if not regular:
            continue
        if not name.isascii() and is_image_name(name):
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"{path}: tar member {os.fsencode(name)!r} is an image whose name is not "
                    "UTF-8, so its image id cannot be written; rename it in the tar"
                ) from None
        if is_image_name(name) and size > sources.MAX_IMAGE_BYTES:
            raise ValueError(
                f"{path}: tar member {name!r} is {size} bytes, over the limit of "
                f"{sources.MAX_IMAGE_BYTES} bytes per image"
            )
        if name in seen:
            raise ValueError(f"{path}: two tar members are named {name!r}; keep one of them")
        seen.add(name)
        yield TarEntry(name, data, size, sources.header_check(header))
