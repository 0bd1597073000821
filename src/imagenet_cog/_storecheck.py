"""Checks of a feature store against its manifest, and a cache of the files already hashed.

Used by :mod:`imagenet_cog.store`; imports nothing else from the package but
:mod:`imagenet_cog._fileio`.

* :func:`read_manifest` parses ``manifest.json`` and checks its structure, so a
  damaged manifest gives one :class:`StoreCorruptError` naming the file and the
  field, never a bare ``KeyError`` or ``JSONDecodeError``. Shard record ``k``
  must name ``shard-<k>.npy``: reordered records, absolute paths and ``..``
  are refused, so every file read lies inside the store.
* :func:`check_files` checks each file at one of the :data:`VERIFY_LEVELS`.
  The ``"cached"`` level hashes a file once and records its sha256 with the
  file's size, ``mtime_ns``, ``ctime_ns`` and inode in ``.verified.json``
  (written atomically, skipped when the folder is read-only); a later open
  whose file has the same four values and whose manifest expects the same
  sha256 costs one ``stat``.
* :func:`finished_shards` tells a resumed build which shards it can keep.
* :func:`lock_for_reading` holds a shared lock on the stores a run reads, so that no
  extraction rewrites them under it.
* :func:`reuse_record` checks that a store reused for the same split read from another data
  root holds that root's images (no processing changed them), and records that root.
"""

from __future__ import annotations

import contextlib
import json
import os
import re

from ._fileio import FolderLock, atomic_write_bytes, file_sha256, loads_json

__all__ = [
    "CACHE_NAME",
    "VERIFY_LEVELS",
    "StoreCorruptError",
    "check_files",
    "check_pair",
    "finished_shards",
    "lock_for_reading",
    "read_manifest",
    "read_run_state",
    "reuse_record",
]

#: ``None``: nothing; ``"size"``: sizes, shapes and dtypes; ``"cached"``: also
#: the sha256 of every file, computed once per file version; ``"sha256"``:
#: the sha256 of every file, every time.
VERIFY_LEVELS = (None, "size", "cached", "sha256")
CACHE_NAME = ".verified.json"
_CACHE_FORMAT = "imagenet_cog.verified"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class StoreCorruptError(ValueError):
    """A store's manifest or files are damaged; the message names the file and what is wrong.

    Examples
    --------
    >>> issubclass(StoreCorruptError, ValueError)
    True
    """


# ------------------------------------------------------------------ manifest
def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _require(ok, where, what):
    if not ok:
        raise StoreCorruptError(f"{where}: {what}")


def read_run_state(path):
    """The ``run.json`` of an unfinished build at ``path``: its ``key`` and ``layout``.

    Raises
    ------
    StoreCorruptError
        Naming ``path`` when it is not a JSON object with a ``key`` object (a damaged file:
        rebuild with ``overwrite=True``).
    """
    try:
        state = loads_json(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreCorruptError(
            f"{path}: the record of an unfinished run is damaged ({exc}); pass overwrite=True "
            "(--overwrite) to start over"
        ) from None
    _require(
        isinstance(state, dict) and isinstance(state.get("key"), dict),
        path,
        "the record of an unfinished run has no key object; pass overwrite=True "
        "(--overwrite) to start over",
    )
    return state


def read_manifest(path, fmt, version):
    """The parsed manifest at ``path``, its structure checked.

    Raises
    ------
    StoreCorruptError
        Naming ``path`` and what is wrong.
    """
    try:
        manifest = loads_json(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StoreCorruptError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise StoreCorruptError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    _require(isinstance(manifest, dict), path, "not a JSON object")
    found = (manifest.get("format"), manifest.get("format_version"))
    if found[0] == fmt and found[1] != version:
        raise StoreCorruptError(
            f"{path}: not a {fmt} v{version} manifest (a store of format version {found[1]!r}, "
            "which this version of imagenet_cog does not read); extract these features again, "
            "into a new folder or with overwrite=True (--overwrite)"
        )
    if found[0] != fmt:
        raise StoreCorruptError(f"{path}: not a {fmt} v{version} manifest ({found[0]!r})")
    for field, kind, test in (
        ("key", "an object", lambda x: isinstance(x, dict)),
        ("n_rows", "a count", _is_int),
        ("dim", "a count", _is_int),
        ("rows", "an object", lambda x: isinstance(x, dict)),
        ("split", "an object", lambda x: isinstance(x, dict)),
        ("shards", "a list", lambda x: isinstance(x, list)),
        ("skipped", "a list", lambda x: isinstance(x, list)),
    ):
        _require(field in manifest, path, f"no {field!r} field")
        _require(test(manifest[field]), path, f"{field!r} is not {kind}")
    for field, name in (("rows", "rows.tsv"), ("split", "split.tsv")):
        entry = manifest[field]
        # Fixed names: a manifest cannot point outside the store.
        _require(entry.get("file") == name, path, f"{field}.file must be {name!r}")
        sha = entry.get("sha256")
        _require(
            isinstance(sha, str) and _HEX64.match(sha), path, f"{field}.sha256 is not a sha256"
        )
    for k, record in enumerate(manifest["shards"]):
        where = f"{path}: shard record {k}"
        _require(isinstance(record, dict), where, "not an object")
        name = f"shard-{k:05d}.npy"
        if record.get("file") != name:
            raise StoreCorruptError(
                f"{where} names {record.get('file')!r}, not {name!r} (records out of order, or "
                "a file outside the store)"
            )
        for field in ("rows", "bytes"):
            _require(_is_int(record.get(field)), where, f"{field!r} is not a count")
        sha = record.get("sha256")
        _require(isinstance(sha, str) and _HEX64.match(sha), where, "'sha256' is not a sha256")
    total = sum(r["rows"] for r in manifest["shards"])
    _require(
        total == manifest["n_rows"],
        path,
        f"the shards hold {total} rows, 'n_rows' says {manifest['n_rows']}",
    )
    for s in manifest["skipped"]:
        _require(isinstance(s, dict) and isinstance(s.get("id"), str), path, "bad 'skipped' entry")
    return manifest


def check_pair(train_key, test_key, what):
    """Raise ``ValueError`` when the train and test stores of one domain (``what``: "L1 in
    ROOT") were made differently: their keys differ in more than the split."""
    shared = [k for k in train_key if k not in ("split", "split_sha256")]
    differ = {
        k: (train_key.get(k), test_key.get(k))
        for k in shared
        if train_key.get(k) != test_key.get(k)
    }
    if differ:
        raise ValueError(
            f"the train and test features of {what} were made differently: "
            + "; ".join(f"{k}: train {a!r}, test {b!r}" for k, (a, b) in differ.items())
        )


# --------------------------------------------------------------------- files
def _signature(st):
    # ctime cannot be set back by a user (unlike mtime with touch -d).
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_cache(folder):
    try:
        cache = loads_json((folder / CACHE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(cache, dict) or cache.get("format") != _CACHE_FORMAT:
        return {}
    files = cache.get("files")
    return files if isinstance(files, dict) else {}


def check_files(folder, files, level):
    """Check ``[(name, expected bytes or None, expected sha256)]`` of ``folder`` at ``level``.

    Raises
    ------
    StoreCorruptError
        When a file is missing, or its size or sha256 is not the expected one.
    """
    if level is None:
        return
    cache = _read_cache(folder) if level == "cached" else {}
    fresh = {}
    for name, size, sha in files:
        file = folder / name
        try:
            st = os.stat(file)
        except FileNotFoundError:
            raise StoreCorruptError(f"{folder}: {name} is missing") from None
        if size is not None and st.st_size != size:
            raise StoreCorruptError(f"{file}: {st.st_size} bytes, the manifest says {size}")
        if level == "size":
            continue
        signature = _signature(st)
        if cache.get(name) == [*signature, sha]:
            fresh[name] = cache[name]
            continue
        if file_sha256(file) != sha:
            raise StoreCorruptError(
                f"{file}: its sha256 does not match the manifest (the file changed after the "
                "store was written)"
            )
        fresh[name] = [*signature, sha]
    if level != "size" and fresh != cache:
        data = json.dumps({"format": _CACHE_FORMAT, "files": fresh}, sort_keys=True)
        with contextlib.suppress(OSError):  # a read-only store is checked each time
            atomic_write_bytes(folder / CACHE_NAME, (data + "\n").encode("utf-8"))


# ------------------------------------------------------- an unfinished build
def finished_shards(path, key_sha, n_shards, verify=()):
    """``{k: record}`` of the shards whose record matches the key and whose array has the
    recorded size.

    The shards in ``verify`` must also have the recorded sha256: a resumed build hashes the
    shards it would keep, and removes the record of one whose bytes changed (damaged between
    the kill and the resume), so that it is computed again.
    """
    done = {}
    for k in range(n_shards):
        record = path / f"shard-{k:05d}.json"
        if not record.is_file():
            continue
        try:
            info = loads_json(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # removed or being replaced by the process that owns it
            continue
        npy = path / f"shard-{k:05d}.npy"
        if (
            isinstance(info, dict)
            and info.get("file") == npy.name
            and info.get("key_sha256") == key_sha
            and npy.is_file()
            and npy.stat().st_size == info.get("bytes")
            and (k not in verify or file_sha256(npy) == info.get("sha256"))
        ):
            done[k] = info
        elif k in verify:
            record.unlink(missing_ok=True)
    return done


def lock_for_reading(root, domains, reader):
    """Shared locks on the train and test stores of ``domains`` under ``root``, until closed.

    An extraction into one of them (``overwrite=True`` included) is refused while they are
    held, with a message that quotes ``reader`` (what holds them, e.g. ``"evaluate (PID 12,
    run folder results)"``). ``root`` ``None`` (features given as arrays) locks nothing.

    Returns
    -------
    contextlib.ExitStack
        ``close()`` releases every lock.

    Raises
    ------
    imagenet_cog._fileio.FolderLockedError
        When an extraction is writing one of the stores; nothing stays locked.
    """
    stack = contextlib.ExitStack()
    if root is None:
        return stack
    try:
        for domain in domains:
            for split in ("train", "test"):
                folder = os.path.join(root, domain, split)
                lock = FolderLock(folder, "feature store", shared=True, reader=reader)
                stack.enter_context(lock)
    except BaseException:
        stack.close()
        raise
    return stack


def _images_made_by(info):
    """What made a split's images, as far as its listing tells: ``None`` for the original
    files, else the copy's processing and what its listing saw."""
    copy = info.get("copy") or {}
    if not copy.get("processed"):
        return None
    return (copy.get("published") or copy.get("name"), copy.get("resized"), copy.get("formats"))


def reuse_record(manifest, info):
    """``(problem, manifest)`` of a complete store reused for a split (``info``: its record)
    with the same images' names, read from another data root.

    ``problem`` says why the store cannot serve that root (a copy whose processing changed the
    images), else ``None``; ``manifest`` is the manifest with that root added to
    ``reused_for`` (beside the root its images were read from), or ``None`` when nothing is
    to record (the same root, or one recorded already).
    """
    first = manifest.get("split") or {}
    root = info.get("data_root")
    if root is None or root == first.get("data_root"):
        return None, None
    if _images_made_by(info) != _images_made_by(first):
        processing = (info.get("copy") or {}).get("processing")
        return (
            f"holds the features of the images of {first.get('data_root')} "
            f"({first.get('layout')}); those of {root} have the same names but were read from "
            f"a copy whose processing changed them ({processing})"
        ), None
    seen = manifest.get("reused_for") or []
    if any(entry.get("data_root") == root for entry in seen):
        return None, None
    entry = {"data_root": root, "layout": info.get("layout")}
    if info.get("copy"):
        keep = ("layout", "name", "published", "processing", "listing_sha256")
        entry["copy"] = {k: info["copy"][k] for k in keep if k in info["copy"]}
    return None, {**manifest, "reused_for": [*seen, entry]}
