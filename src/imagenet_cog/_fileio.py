"""Files that are never seen half-written, and folders that one process owns at a time.

Shared by every stage that writes: the feature store, the run folder of ``evaluate``, the
levels, the analysis. Imports nothing from the package.

* :func:`atomic_write_bytes` / :func:`atomic_write_text` write to a temporary name in the same
  folder (``.NAME.tmp-PID``), flush it to disk and rename it over the target, so a reader (or
  a resumed run) sees the old file or the new one, never a mix. The writer holds a lock on its
  temporary file until the rename; a writer killed in between leaves the file, unlocked, and
  the next writer in that folder removes it (:func:`remove_dead_temporaries`; so does the
  exclusive holder of a :class:`FolderLock`), never the file of a writer still alive.
* :class:`FolderLock` holds an OS lock (``fcntl.flock``) on ``<folder>/.lock`` for the life
  of a run: exclusive for the run that writes the folder, shared for the runs that read it
  (``evaluate`` reading a feature store), so that nobody rewrites a folder under its readers.
  The kernel releases it when the process dies, even by SIGKILL, so a killed run never leaves
  a stale lock behind; the PID written in the file (and each reader's ``.reader-*`` file) is
  only for the message. :func:`lock_holder` tells whether a live writer holds a folder.
* :func:`locked_append` appends one line under an exclusive lock: it writes until every byte
  is down, and on a failure (a full disk) cuts the file back to where it was, so a log never
  holds half a line between two whole ones.
* A write that fails raises an ``OSError`` naming the file it was writing (``[Errno 28] No
  space left on device: '<path>'``), not only the system's message.
* :func:`loads_json` is the one JSON reader of the files a run folder, a store or a levels
  folder holds: a text nested deeper than any file the library writes is refused as not
  JSON, naming where it stops, instead of ending in a ``RecursionError``;
  :func:`check_json_shape` refuses, naming the field, a file whose fields are not of the
  types the library writes there (a count that is a string), before any reader trips on it.
* :func:`changed_settings` names what differs between the settings a folder was made with
  (a store's key, a run's ``config.json``) and the settings asked for, for the errors that
  refuse to mix them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
from pathlib import Path

try:  # POSIX; on Windows the locks are advisory no-ops
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = [
    "FolderLock",
    "FolderLockedError",
    "NullableShape",
    "atomic_write_bytes",
    "atomic_write_text",
    "changed_settings",
    "check_json_shape",
    "file_sha256",
    "loads_json",
    "lock_holder",
    "locked_append",
    "remove_dead_temporaries",
]

LOCK_NAME = ".lock"


def file_sha256(path):
    """sha256 (hex) of a file, hashed over a memory map (no copy, the GIL released)."""
    import hashlib
    import mmap

    h = hashlib.sha256()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                h.update(m)
    return h.hexdigest()


def _temporary_name(path):
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


#: The names :func:`_temporary_name` gives.
TEMPORARY_RE = re.compile(r"^\..+\.tmp-\d+$")
#: A folder is swept of dead writers' temporary files by the first write of a process there,
#: then at most once per this many seconds (a sweep lists the folder).
SWEEP_EVERY_S = 60.0
_SWEPT = {}


def _same_file(fd, path):
    """True while ``path`` still names the file open as ``fd``."""
    try:
        now, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _open_temporary(path):
    """``(name, fd)`` of ``path``'s temporary file, created and locked (exclusive) for the
    life of the write: a sweep tells a live writer's file by that lock. A sweep that removed
    the file between its creation and the lock makes it be created again."""
    tmp = _temporary_name(path)
    while True:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if fcntl is None:  # pragma: no cover - nothing is swept without locks
            return tmp, fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: its sweeps remove nothing
            return tmp, fd
        if _same_file(fd, tmp):
            return tmp, fd
        os.close(fd)


def remove_dead_temporaries(folder):
    """Remove the temporary files (``.NAME.tmp-PID``) that writers killed between writing and
    renaming them left in ``folder``; a live writer's file, which it holds locked, is kept.

    Returns
    -------
    list of str
        The names removed.
    """
    if fcntl is None:  # pragma: no cover - without locks a live writer cannot be told
        return []
    removed = []
    try:
        with os.scandir(folder) as it:
            names = [e.name for e in it if TEMPORARY_RE.match(e.name)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, path):  # not renamed, nor replaced, since it was opened
                os.unlink(path)
                removed.append(name)
        except OSError:  # its writer is alive (or the lock cannot be told): kept
            pass
        finally:
            os.close(fd)
    return removed


def _sweep(folder):
    """:func:`remove_dead_temporaries` of ``folder``, at most once per :data:`SWEEP_EVERY_S`
    per process."""
    key = (os.getpid(), str(folder))
    now = time.monotonic()
    if now - _SWEPT.get(key, -SWEEP_EVERY_S) < SWEEP_EVERY_S:
        return
    _SWEPT[key] = now
    remove_dead_temporaries(folder)


#: The deepest nesting of JSON that is read: the library's own files nest a few levels.
MAX_JSON_DEPTH = 64


class _TooDeep(json.JSONDecodeError):
    """JSON nested deeper than :data:`MAX_JSON_DEPTH`: refused as not JSON."""

    def __init__(self, doc, pos):
        super().__init__(f"nested deeper than {MAX_JSON_DEPTH} levels", doc, pos)


def _too_deep_at(text):
    """Where ``text`` first opens more than :data:`MAX_JSON_DEPTH` arrays or objects (outside
    strings), or ``None``."""
    depth, string, escaped = 0, False, False
    for pos, char in enumerate(text):
        if string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                string = False
        elif char == '"':
            string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return pos
        elif char in "]}":
            depth -= 1
    return None


def _depth_over(obj):
    """True when ``obj`` (parsed JSON) nests deeper than :data:`MAX_JSON_DEPTH`."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > MAX_JSON_DEPTH:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def loads_json(text):
    """``json.loads(text)`` for the files of a run folder or a store, bounded in depth.

    Raises
    ------
    json.JSONDecodeError
        When ``text`` is not JSON, or nests arrays and objects deeper than
        :data:`MAX_JSON_DEPTH` (a hostile file: Python's parser would end in a
        ``RecursionError``, and a file parsed a little below its limit in one later); the
        message says where.

    Examples
    --------
    >>> loads_json('{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> try:
    ...     loads_json("[" * 100 + "]" * 100)
    ... except json.JSONDecodeError as exc:
    ...     print(exc)
    nested deeper than 64 levels: line 1 column 65 (char 64)
    """
    try:
        obj = json.loads(text)
    except RecursionError:
        obj = None
    else:
        if not isinstance(obj, (dict, list)) or not _depth_over(obj):
            return obj
    raise _TooDeep(text, _too_deep_at(text) or 0)


def _type_names(types):
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    names |= {dict: "an object", list: "a list", type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


class NullableShape(dict):
    """A nested shape of :func:`check_json_shape` whose field may also be null."""


def check_json_shape(obj, shape, where, redo):
    """Refuse, in one line, JSON whose fields are not of the types ``shape`` gives.

    Parameters
    ----------
    obj : object
        Parsed JSON.
    shape : dict
        ``{key: types}``, the types a tuple of types, or a nested shape (the field is then an
        object checked by it; a :class:`NullableShape` accepts null too); the key ``"*"``
        gives the shape of every key not named. A field that is missing is not checked; ``int`` never accepts ``true``/``false``, and
        ``float`` accepts integers.
    where : str
        The file, named in the error.
    redo : str
        What to do about it, said at the end of the error.

    Raises
    ------
    ValueError
        ``"<where>: <field> is <value>, not <types>; <redo>"``.

    Examples
    --------
    >>> check_json_shape({"data": {"L1": {"n_test": "6"}}}, {"data": {"*": {"n_test": (int,)}}},
    ...                  "config.json", "write it again")
    Traceback (most recent call last):
    ...
    ValueError: config.json: data.L1.n_test is '6', not an integer; write it again
    """

    def walk(value, spec, path):
        if isinstance(spec, dict):
            if value is None and isinstance(spec, NullableShape):
                return
            if not isinstance(value, dict):
                yield path, value, (dict,)
                return
            for key, item in value.items():
                sub = spec.get(key, spec.get("*"))
                if sub is not None:
                    yield from walk(item, sub, (*path, str(key)))
            return
        ok = isinstance(value, spec) and not (isinstance(value, bool) and bool not in spec)
        if not ok and not (float in spec and type(value) is int):
            yield path, value, spec

    for path, value, types in walk(obj, shape, ()):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(
            f"{where}: {'.'.join(path) or 'the file'} is {shown}, not {_type_names(types)}; {redo}"
        )


# ``os.write`` through one name, so that a test can make it write short or fail (a full disk).
_write = os.write


def _write_all(fd, data):
    """Write every byte of ``data`` to ``fd``; a write that makes no progress is a full disk."""
    view = memoryview(data)
    while view:
        written = _write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _naming(exc, path):
    """``exc`` as an ``OSError`` of the same kind that names ``path``, the file being written."""
    if exc.filename == str(path) or exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), str(path))


def atomic_write_bytes(path, data):
    """Write ``data`` to ``path`` through a temporary file, ``fsync`` and a rename.

    The temporary files that killed writers left in the folder are removed first
    (:func:`remove_dead_temporaries`, at most once a minute per folder and process).

    Raises
    ------
    OSError
        Naming ``path`` when the file cannot be written (a full disk, no permission); the
        temporary file is removed and an existing ``path`` is left as it was.
    """
    path = Path(path)
    _sweep(path.parent)
    tmp, fd = _temporary_name(path), None
    try:
        tmp, fd = _open_temporary(path)
        _write_all(fd, data)
        os.fsync(fd)
        os.replace(tmp, path)  # still locked: no sweep takes it for a dead writer's
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise _naming(exc, path) from None
        raise
    finally:
        if fd is not None:
            os.close(fd)


def atomic_write_text(path, text):
    """:func:`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def changed_settings(before, after, ignore=()):
    """``["key: old → new", ...]``, one entry per setting that differs, in key order.

    Nested mappings are compared key by key and named with dots (``protocol.n_trials``), so
    that a message names only what differs. ``ignore`` lists top-level keys to skip.

    Examples
    --------
    >>> changed_settings({"protocol": {"n_trials": 2, "epochs": 100}, "model": "a"},
    ...                  {"protocol": {"n_trials": 3, "epochs": 100}, "model": "a"})
    ['protocol.n_trials: 2 → 3']
    >>> changed_settings({"layer": None}, {"layer": "fc", "amp": "bf16"})
    ["amp: (not set) → 'bf16'", "layer: None → 'fc'"]
    """
    missing = object()

    def shown(value):
        return "(not set)" if value is missing else repr(value)

    def walk(a, b, prefix):
        for key in sorted(set(a) | set(b), key=str):
            if not prefix and key in ignore:
                continue
            old, new = a.get(key, missing), b.get(key, missing)
            if isinstance(old, dict) and isinstance(new, dict):
                yield from walk(old, new, f"{prefix}{key}.")
            elif old != new:
                yield f"{prefix}{key}: {shown(old)} → {shown(new)}"

    return list(walk(before or {}, after or {}, ""))


@contextlib.contextmanager
def _flocked(fd):
    if fcntl is None:  # pragma: no cover
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def locked_append(path, line):
    """Append ``line`` (str or bytes) to ``path`` under an exclusive lock, whole or not at all.

    Raises
    ------
    OSError
        Naming ``path`` when the line cannot be written whole (a full disk): the file is cut
        back to its size before the append, so it still ends with its last complete line.
    """
    data = line.encode("utf-8") if isinstance(line, str) else bytes(line)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        with _flocked(fd):
            size = os.fstat(fd).st_size
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise _naming(exc, path) from None
    finally:
        os.close(fd)


class FolderLockedError(RuntimeError):
    """Another live process holds the folder's lock."""


READER_PREFIX = ".reader-"


def _alive(path):
    """True while the process that wrote the reader file ``path`` still holds its lock on it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _readers(folder):
    """What the live readers of ``folder`` said they are; the files of dead ones are removed."""
    found = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if not entry.name.startswith(READER_PREFIX):
                continue
            if _alive(entry.path):
                with contextlib.suppress(OSError):
                    found.append(Path(entry.path).read_text(encoding="utf-8").strip())
            else:  # its reader died (even by SIGKILL): the kernel dropped its lock
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    return [text for text in found if text]


def lock_holder(folder):
    """The PID (as text, ``""`` if unknown) of a live process holding ``folder``'s exclusive
    lock; ``None`` when no process holds it (or there is no lock file)."""
    if fcntl is None:  # pragma: no cover
        return None
    try:
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return None


class FolderLock:
    """Ownership of a folder for the life of a run: exclusive for a writer, shared for readers.

    Parameters
    ----------
    folder : path
        Created if missing; the lock file is ``folder/.lock``.
    what : str
        What the folder is, for the error message ("run folder", "feature store").
    wait : float
        Seconds to wait for another process to let go before giving up; ``0`` refuses at
        once, ``None`` waits for ever.
    shared : bool
        Take the lock shared: any number of readers hold it together, and a writer (an
        exclusive holder) waits for them or is refused. A reader describes itself in a file
        ``folder/.reader-<pid>-<n>``, which the refused writer's message quotes. A folder that
        cannot be written (a read-only copy) is read without a lock.
    reader : str
        How a shared holder is named in a writer's message, e.g. ``"evaluate (run folder
        results/, PID 12)"``; by default ``"a process (PID <pid>)"``.

    Raises
    ------
    FolderLockedError
        On entry, when another process still holds the lock after ``wait`` seconds. The
        message names the folder and the holder: the writer's PID, or what each reader said
        it is.
    """

    _count = 0

    def __init__(self, folder, what="folder", wait=0.0, *, shared=False, reader=None):
        self.folder = Path(folder)
        self.what = what
        self.wait = wait
        self.shared = shared
        self.reader = reader
        self._fd = None
        self._reader_fd = None
        self._reader_path = None

    @property
    def path(self):
        return self.folder / LOCK_NAME

    def _refusal(self, fd):
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        if self.shared:
            return (
                f"{self.what} {self.folder} is being written by another process"
                f"{f' (PID {holder})' if holder else ''}; wait for it to finish"
            )
        # Readers first: a writer killed earlier may have left its PID in the file.
        readers = _readers(self.folder)
        if readers:
            return (
                f"{self.what} {self.folder} is being read by {', '.join(readers)}; wait for "
                "it to finish, or use another folder"
            )
        return (
            f"{self.what} {self.folder} is in use by another process"
            f"{f' (PID {holder})' if holder else ''}; wait for it to finish, "
            "or use another folder"
        )

    def _open(self):
        if not self.shared:
            self.folder.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            try:
                return os.open(self.path, os.O_RDONLY)
            except OSError:
                return None  # a read-only folder without a lock file: nobody writes there

    def acquire(self):
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object")
        fd = self._open()
        if fd is None:
            return self
        if fcntl is not None:
            mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
            deadline = None if self.wait is None else time.monotonic() + float(self.wait)
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() >= deadline:
                        message = self._refusal(fd)
                        os.close(fd)
                        raise FolderLockedError(message) from None
                    time.sleep(0.05)
        self._fd = fd
        if self.shared:
            self._describe()
        else:
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
            except OSError as exc:  # a full disk: said with the file, the lock let go
                self.release()
                raise _naming(exc, self.path) from None
            _readers(self.folder)  # no reader is left alive: clear the files of killed ones
            remove_dead_temporaries(self.folder)  # nor any writer: their temporary files go
        return self

    def _describe(self):
        """Write this reader's file, locked for as long as it reads (skipped if not writable)."""
        FolderLock._count += 1
        path = self.folder / f"{READER_PREFIX}{os.getpid()}-{FolderLock._count}"
        text = self.reader or f"a process (PID {os.getpid()})"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError:
            return
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(OSError):
            _write_all(fd, f"{text}\n".encode())
        self._reader_fd, self._reader_path = fd, path

    def release(self):
        if self._reader_fd is not None:
            fd, self._reader_fd = self._reader_fd, None
            with contextlib.suppress(OSError):
                os.unlink(self._reader_path)
            os.close(fd)
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        if not self.shared:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
