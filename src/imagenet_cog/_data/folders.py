"""The reader of folder and tar per wnid copies, and of ImageNet-1K's flat ``val/``.

Each concept is read from ``root/<wnid>/`` when that folder exists, else from
``root/<wnid>.tar`` (its headers are read once by the one tar reader; nothing is
extracted). Files ending in ``.JPEG``, ``.jpg`` or ``.png`` (any case) count as images.
A flat ``val/`` folder is labelled by a label file.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .._base import IMAGE_SUFFIXES, WNID_RE
from .labels import read_val_labels
from .sources import TarMember
from .tar import NotATarError, read_members

__all__ = ["list_flat_val", "list_images", "not_utf8"]


def _is_image(name):
    return name.lower().endswith(IMAGE_SUFFIXES)


def _index_tar(path, wnid):
    """``{image id: TarMember}`` from the headers of one tar per wnid; nothing is extracted.

    A member ``<wnid>/x.JPEG`` is the image ``<wnid>/x.JPEG`` as ``x.JPEG`` is: two members
    that give the same image id are refused.
    """
    images, names = {}, {}
    with open(path, "rb") as f:
        try:
            for member in read_members(f, path):
                if not _is_image(member.name):
                    continue
                parts = [p for p in member.name.replace("\\", "/").split("/") if p not in ("", ".")]
                if len(parts) > 1 and parts[0] == wnid:
                    parts = parts[1:]
                image_id = f"{wnid}/{'/'.join(parts)}"
                if image_id in names:
                    raise ValueError(
                        f"{path}: tar members {names[image_id]!r} and {member.name!r} both give "
                        f"the image id {image_id!r}; keep one of them"
                    )
                names[image_id] = member.name
                images[image_id] = TarMember(str(path), member.offset, member.size, member.header)
        except NotATarError as exc:
            raise ValueError(f"{wnid}: {exc}") from None
    return images


def not_utf8(path):
    """The error of an image whose file name is not UTF-8 (its image id could be written
    nowhere), naming it by its bytes."""
    return ValueError(
        f"{os.fsencode(path)!r}: an image whose file name is not UTF-8, so its image id cannot "
        "be written; rename it (convmv -f <its encoding> -t utf8)"
    )


def image_entries(folder, skipped):
    """The entries of ``folder`` named like images that are regular files (links followed).

    The others named like images, a dangling link, a link loop, a FIFO, a folder, are all
    passed over alike and added to ``skipped`` (a list of paths), for one warning. A name that
    is not UTF-8 is refused (:func:`not_utf8`).
    """
    with os.scandir(folder) as entries:
        for e in entries:
            if not _is_image(e.name):
                continue
            if not e.name.isascii():
                try:
                    e.name.encode("utf-8")
                except UnicodeEncodeError:  # bytes Python decoded as surrogates
                    raise not_utf8(e.path) from None
            try:
                regular = e.is_file()
            except OSError:  # a link loop (ELOOP), a link into a folder that cannot be read
                regular = False
            if regular:
                yield e
            else:
                skipped.append(e.path)


def _warn_skipped(skipped):
    if skipped:
        shown = ", ".join(sorted(skipped)[:3]) + (", ..." if len(skipped) > 3 else "")
        warnings.warn(
            f"skipped {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} named like an "
            f"image but not {'a readable file' if len(skipped) == 1 else 'readable files'} (a "
            f"dangling or looping link, a FIFO, a folder): {shown}",
            UserWarning,
            stacklevel=3,
        )


def _list_folder(path, wnid, skipped):
    return {f"{wnid}/{e.name}": e.path for e in image_entries(path, skipped)}


def _check_not_another_concept(wnid, path, seen):
    """Refuse a concept folder (or tar) that is, through links, another concept's: its images
    would be given two labels."""
    real = os.path.realpath(path)
    name = os.path.basename(real)
    name = name.removesuffix(".tar")
    other = seen.get(real) or (name if WNID_RE.match(name) and name != wnid else None)
    if other is not None and other != wnid:
        raise ValueError(
            f"{wnid}: {path} is a link to {real}, the images of concept {other}; the same "
            "images would be given two labels: give each concept its own folder or tar"
        )
    seen[real] = wnid


def list_images(root, wnids, *, progress=False):
    """List the images of some concepts in a folder-per-wnid or tar-per-wnid copy.

    Each concept is read from ``root/<wnid>/`` when that folder exists, else
    from ``root/<wnid>.tar`` (only the tar headers are read, once; nothing is
    extracted). Files ending in ``.JPEG``, ``.jpg`` or ``.png`` (any case)
    count as images; other entries so named (a dangling or looping link, a
    FIFO, a folder) are skipped, with one warning that counts them.

    Parameters
    ----------
    root : path
        The data root.
    wnids : sequence of str
        The concepts to list.
    progress : bool
        Show a progress bar.

    Returns
    -------
    dict
        ``{wnid: {image id: source}}`` where the image id is
        ``"<wnid>/<file name>"`` and the source is a file path (str) or a
        ``TarMember``.

    Raises
    ------
    FileNotFoundError
        When concepts have neither a folder nor a tar file; the message names
        them.
    ValueError
        When a concept has no image, or a tar file is unreadable, cut short
        (no end-of-archive block, or a member's data past the end of the
        file), or holds a member whose name is absolute or contains ``..``,
        two members that give the same image id (``x.JPEG`` and
        ``<wnid>/x.JPEG``), a GNU sparse image member, or an image member
        over the image size limit. The message names the tar file and the
        member. Also when a concept's folder or tar is a link to another
        concept's (its images would be given two labels).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "n02123159").mkdir()
    >>> _ = (root / "n02123159" / "n02123159_1.JPEG").write_bytes(b"")
    >>> images = list_images(root, ["n02123159"])
    >>> list(images["n02123159"])
    ['n02123159/n02123159_1.JPEG']
    """
    from tqdm.auto import tqdm

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no data folder at {root}")
    entries = {e.name: e for e in os.scandir(root)}
    missing = [
        w for w in wnids if not (w in entries and entries[w].is_dir()) and f"{w}.tar" not in entries
    ]
    if missing:
        shown = ", ".join(missing[:10]) + (
            f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        )
        raise FileNotFoundError(
            f"{len(missing)} concept(s) missing from {root} (no <wnid>/ folder and no "
            f"<wnid>.tar): {shown}; to extract only the concepts you have, name them with "
            "--wnids FILE (wnids= in Python), which makes a run not comparable with the paper"
        )
    out, skipped, seen = {}, [], {}
    for wnid in tqdm(wnids, desc="listing images", unit="concept", disable=not progress):
        entry = entries.get(wnid)
        if entry is not None and entry.is_dir():
            where = entry.path
            _check_not_another_concept(wnid, where, seen)
            images = _list_folder(where, wnid, skipped)
        else:
            where = entries[f"{wnid}.tar"].path
            _check_not_another_concept(wnid, where, seen)
            if os.path.getsize(where) == 0:
                raise ValueError(f"{wnid}: {where} is an empty file (no images in it)")
            images = _index_tar(where, wnid)
        if not images:
            _warn_skipped(skipped)
            raise ValueError(f"{wnid}: no images in {where} (empty concept)")
        out[wnid] = dict(sorted(images.items()))
    _warn_skipped(skipped)
    return out


def list_flat_val(val, wnids, val_labels, *, partial=False):
    """``{wnid: {image id: path}}`` of a flat ImageNet-1K ``val/`` labelled by ``val_labels``
    (a label file; the bundled labels when ``None``).

    With ``partial``, files the labels do not name and concepts without an image are left
    out; otherwise they are refused.
    """
    labels = read_val_labels(val_labels)
    where = val_labels or "the bundled ILSVRC-2012 validation labels"
    wanted = set(wnids)
    out = {w: {} for w in wnids}
    skipped = []
    for e in sorted(image_entries(val, skipped), key=lambda e: e.name):
        wnid = labels.get(e.name)
        if wnid is None:
            if partial:
                continue
            raise ValueError(f"{e.path}: no label for this file in {where}")
        if wnid in wanted:
            out[wnid][f"{wnid}/{e.name}"] = e.path
    _warn_skipped(skipped)
    empty = [w for w in wnids if not out[w]]
    if partial:
        return {w: images for w, images in out.items() if images}
    if empty:
        raise ValueError(
            f"{len(empty)} concept(s) have no validation image in {val}: "
            + ", ".join(empty[:10])
            + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
        )
    return out
