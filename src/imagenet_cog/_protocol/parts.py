"""The locks one :func:`~imagenet_cog.evaluate` process holds on its run folder, alone or as
one part of a run split into independent jobs (``--part i/n``).

A run of one job holds the folder's lock (``.lock``) exclusively for its whole life. The parts
of a split run fill one folder together, without waiting for one another, so each holds:

- ``.lock`` shared, describing itself (``evaluate --part 2/3 (PID 12 on node07)``): any
  number of parts hold it together, and a run of one job is refused while a part runs (and
  a part while a run of one job does);
- ``.lock-part-2-of-3`` exclusively: the same part twice at once is refused;
- ``.lock-setup`` exclusively, only while it opens the folder (``config.json``) and reads or
  records the plan (``plan.json``): the first part plans the cells of every part, the others
  follow that plan, so the parts never train the same cell.

Parts of different splits (``1/3`` and ``1/2``) at once are refused: their shares overlap. The
locks are ``flock`` locks (see :mod:`imagenet_cog._fileio`): the parts may run on several
machines only where the filesystem shares them, which a part checks first
(:func:`~imagenet_cog._distributed.lock_problem`).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from .._distributed import Part, lock_problem
from .._fileio import FolderLock, live_readers

__all__ = ["RunFolderLocks", "as_part"]

#: Seconds a part waits for another part to finish opening the folder and reading its plan.
SETUP_WAIT_S = 600.0


def as_part(part):
    """``part`` as a :class:`~imagenet_cog._distributed.Part` (from ``"i/n"``), or ``None``."""
    if part is None or isinstance(part, Part):
        return part
    return Part.parse(part)


class RunFolderLocks:
    """The locks of one run (or one part of a run) on its folder ``out``; rank 0 holds them.

    :meth:`acquire` takes them (a part: after checking the filesystem's locks),
    :meth:`setup_done` lets the next part open the folder, :meth:`release` lets go of all.

    Raises
    ------
    imagenet_cog._fileio.FolderLockedError
        On :meth:`acquire`, when another run holds the folder, or the same part runs already.
    ValueError
        On :meth:`acquire`, when parts of another split run in the folder, or when the
        filesystem of ``out`` does not share its locks across machines.
    """

    def __init__(self, out, part=None):
        self.out = Path(out)
        self.part = part
        self._held = []
        self._setup = None

    def _take(self, lock):
        lock.acquire()
        self._held.append(lock)
        return lock

    def acquire(self):
        if self.part is None:
            self._take(FolderLock(self.out, what="run folder"))
            return self
        part = self.part
        problem = lock_problem(self.out)
        if problem:
            raise ValueError(f"--part {part}: {problem}")
        self.out.mkdir(parents=True, exist_ok=True)
        me = f"evaluate --part {part} (PID {os.getpid()} on {socket.gethostname()})"
        try:
            self._take(FolderLock(self.out, "run folder", shared=True, reader=me))
            name = f".lock-part-{part.number}-of-{part.count}"
            self._take(FolderLock(self.out, f"part {part} of the run folder", name=name))
            self._setup = self._take(
                FolderLock(self.out, "run folder", wait=SETUP_WAIT_S, name=".lock-setup")
            )
            others = [
                text
                for text in live_readers(self.out)
                if (m := re.search(r"--part \d+/(\d+)", text)) and int(m.group(1)) != part.count
            ]
            if others:
                raise ValueError(
                    f"{self.out} is being filled by the parts of another split ("
                    + ", ".join(others)
                    + f"); run the parts of one split at a time (--part i/{part.count} here)"
                )
        except BaseException:
            self.release()
            raise
        return self

    def setup_done(self):
        """Let the next part open the folder: this one has read (or recorded) the plan."""
        if self._setup is not None:
            self._setup.release()
            self._held.remove(self._setup)
            self._setup = None

    def release(self):
        while self._held:
            self._held.pop().release()
        self._setup = None
