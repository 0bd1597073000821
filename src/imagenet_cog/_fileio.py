"""Files that are never seen half-written, and folders that one process owns at a time.

Shared by every stage that writes: the feature store, the run folder of ``evaluate``, the
levels, the analysis. Imports nothing from the package.

* :func:`atomic_write_bytes` / :func:`atomic_write_text` write to a temporary name in the same
  folder, flush it to disk and rename it over the target, so a reader (or a resumed run)
  sees the old file or the new one, never a mix.
* :class:`FolderLock` holds an OS lock (``fcntl.flock``) on ``<folder>/.lock`` for the life
  of a run. The kernel releases it when the process dies, even by SIGKILL, so a killed run
  never leaves a stale lock behind; the PID written in the file is only for the message.
* :func:`locked_append` appends one line under an exclusive lock: it writes until every byte
  is down, and on a failure (a full disk) cuts the file back to where it was, so a log never
  holds half a line between two whole ones.
* A write that fails raises an ``OSError`` naming the file it was writing (``[Errno 28] No
  space left on device: '<path>'``), not only the system's message.
* :func:`changed_settings` names what differs between the settings a folder was made with
  (a store's key, a run's ``config.json``) and the settings asked for, for the errors that
  refuse to mix them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

try:  # POSIX; on Windows the locks are advisory no-ops
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = [
    "FolderLock",
    "FolderLockedError",
    "atomic_write_bytes",
    "atomic_write_text",
    "changed_settings",
    "locked_append",
]

LOCK_NAME = ".lock"


def _temporary_name(path):
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


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

    Raises
    ------
    OSError
        Naming ``path`` when the file cannot be written (a full disk, no permission); the
        temporary file is removed and an existing ``path`` is left as it was.
    """
    path = Path(path)
    tmp = _temporary_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise _naming(exc, path) from None
        raise


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


class FolderLock:
    """Exclusive ownership of a folder for the life of a run.

    Parameters
    ----------
    folder : path
        Created if missing; the lock file is ``folder/.lock``.
    what : str
        What the folder is, for the error message ("run folder", "feature store").
    wait : float
        Seconds to wait for another process to let go before giving up; ``0`` refuses at
        once, ``None`` waits for ever.

    Raises
    ------
    FolderLockedError
        On entry, when another process still holds the lock after ``wait`` seconds. The
        message names the folder and the holder's PID.
    """

    def __init__(self, folder, what="folder", wait=0.0):
        self.folder = Path(folder)
        self.what = what
        self.wait = wait
        self._fd = None

    @property
    def path(self):
        return self.folder / LOCK_NAME

    def acquire(self):
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object")
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            deadline = None if self.wait is None else time.monotonic() + float(self.wait)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() >= deadline:
                        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
                        os.close(fd)
                        raise FolderLockedError(
                            f"{self.what} {self.folder} is in use by another process"
                            f"{f' (PID {holder})' if holder else ''}; wait for it to finish, "
                            "or use another folder"
                        ) from None
                    time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def release(self):
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
