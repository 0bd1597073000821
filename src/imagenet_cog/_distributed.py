"""The processes of a ``torchrun`` job, for the extraction and for ``evaluate``; or one process.

- :func:`torchrun_env` and :func:`join_group`: whether torchrun started several processes, and
  joining its group (NCCL on CUDA, each process on the GPU ``LOCAL_RANK`` names; else Gloo);
- :func:`process_group`: an extraction's estimator set up for this process;
- :class:`Ranks`: the processes as one run sees them, with the collectives every rank calls
  at the same moment (:meth:`~Ranks.all_ok`, :meth:`~Ranks.least`, :meth:`~Ranks.broadcast`,
  :meth:`~Ranks.check_all`) and, for ``evaluate``, a wait for the others' remaining work that
  no timeout cuts short (:meth:`~Ranks.wait_for_all`). The feature stores take the group
  already initialised (:meth:`Ranks.current`); ``evaluate`` joins torchrun's
  (:meth:`Ranks.start`).

Imports nothing from the package but the training wing's device helpers.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

__all__ = ["BEAT_S", "SILENCE_S", "Ranks", "join_group", "process_group", "torchrun_env"]


def torchrun_env():
    """``(rank, world size, local rank)`` when torchrun started several processes."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        return None
    return (rank, world, local) if world > 1 else None


def join_group(device, timeout):
    """Join torchrun's process group: ``(rank, world, device, created)``.

    On CUDA (``device``, or the default device when ``None``) each process takes the GPU that
    ``LOCAL_RANK`` names and the group uses NCCL, else Gloo. ``created`` says whether the
    group was initialised here (and so is to be destroyed by the caller). Outside torchrun:
    ``(0, 1, device, False)``.
    """
    env = torchrun_env()
    if env is None:
        return 0, 1, device, False
    import torch
    import torch.distributed as dist

    from ._device import device_type

    rank, world, local = env
    cuda = device_type(device).startswith("cuda")
    if cuda:  # one GPU per process: the one torchrun's LOCAL_RANK names
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=timeout)
    return rank, world, device, created


@contextmanager
def process_group(extractor, progress):
    """Yield ``(extractor, progress)`` set up for this process.

    Outside torchrun: unchanged. Under torchrun with several processes: the
    group is initialized (NCCL on CUDA, Gloo on the CPU) unless it already
    is, and closed at the end if it was opened here; on CUDA the extractor
    runs on the GPU that ``LOCAL_RANK`` names; only rank 0 shows progress.
    """
    rank, _world, device, created = join_group(extractor.device, timedelta(hours=2))
    if device != extractor.device:
        from sklearn.base import clone

        extractor = clone(extractor).set_params(device=device)
    progress = progress if rank == 0 else False
    try:
        yield extractor, progress
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()


#: Seconds between two signs of life of a rank of ``evaluate`` (a counter in the group's store).
BEAT_S = 5.0
#: Seconds without a sign of life after which a waiting rank gives up on another: a rank killed
#: by something other than torchrun's agent (``srun``, a script) never says it failed.
SILENCE_S = 300.0


class Ranks:
    """The processes of one run (one process when not under torchrun).

    Two ways in: :meth:`current` takes the torch.distributed group already initialised in
    this process, if any (a feature store built inside an extraction's group); ``Ranks(device)``
    then :meth:`start` joins torchrun's group (NCCL on CUDA, Gloo on the CPU), which the context
    manager leaves when it started it (``evaluate``). Until then, or outside torchrun, every
    collective answers for this process alone.

    The collectives (:meth:`barrier`, :meth:`all_ok`, :meth:`least`, :meth:`broadcast`,
    :meth:`check_all`) are for moments when every rank gets there at about the same time;
    :meth:`wait_for_all` waits for the others' remaining work, however long it takes, as long
    as they are alive: each rank adds to its own counter in the group's store every
    :data:`BEAT_S` seconds from a thread, and a rank silent for :data:`SILENCE_S` seconds is
    taken for dead.
    """

    _calls = itertools.count(1)  # evaluate calls in this process (the same on every rank)

    def __init__(self, device=None):
        self.rank, self.world, self.device = 0, 1, device
        self._dist = None  # torch.distributed, once this process is in a group
        self._created, self._call, self._beating = False, 0, None

    @classmethod
    def current(cls):
        """The group already initialised in this process, if one is; else one process."""
        ranks = cls()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            ranks._dist = dist
            ranks.rank, ranks.world = dist.get_rank(), dist.get_world_size()
        return ranks

    def start(self):
        """Join torchrun's group when torchrun started several processes; returns ``self``."""
        if torchrun_env() is None:
            return self
        import torch.distributed as dist

        self.rank, self.world, self.device, self._created = join_group(
            self.device, timedelta(hours=6)
        )
        self._dist = dist
        self._call = next(Ranks._calls)
        self._start_beating()
        return self

    def _start_beating(self):
        """Add to this rank's counter every :data:`BEAT_S` seconds until stopped."""
        stop = threading.Event()
        store, key, beat = self._store(), self._key(f"alive/{self.rank}"), BEAT_S

        def beating():
            # The store may be gone (rank 0, which holds it, ended): nothing left to tell.
            with contextlib.suppress(Exception):
                while True:
                    store.add(key, 1)
                    if stop.wait(beat):
                        return

        threading.Thread(target=beating, name="imagenet_cog-heartbeat", daemon=True).start()
        self._beating = stop

    def _stop_beating(self):
        if self._beating is not None:
            self._beating.set()
            self._beating = None

    def barrier(self):
        if self._dist is not None:
            self._dist.barrier()

    def _tensor(self, values):
        """``values`` as int64 on the device the group's backend reduces on."""
        import torch

        device = "cpu"
        if self._dist.get_backend() == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        return torch.tensor(values, dtype=torch.int64, device=device)

    def _reduce_min(self, value):
        flag = self._tensor([int(value)])
        self._dist.all_reduce(flag, op=self._dist.ReduceOp.MIN)
        return int(flag.item())

    def all_ok(self, ok):
        """Whether ``ok`` holds on every rank (a collective: every rank must call it)."""
        if self._dist is None:
            return bool(ok)
        return bool(self._reduce_min(bool(ok)))

    def least(self, value):
        """The smallest ``value`` (an int, or None on every rank) over the ranks."""
        if self._dist is None or value is None:
            return value
        return self._reduce_min(value)

    def broadcast(self, values):
        """Rank 0's list of ints, on every process."""
        if self._dist is None:
            return list(values)
        t = self._tensor(list(values))
        self._dist.broadcast(t, src=0)
        return t.tolist()

    def check_all(self, error, what):
        """Raise ``error`` on this process, and an error on every other one, if any failed.

        Called by every process where it would wait at a barrier: a process whose work raised
        tells the others, which stop at once instead of waiting for it until the group's
        timeout.
        """
        if self.all_ok(error is None):
            return
        if error is not None:
            raise error
        raise RuntimeError(
            f"another process failed while {what} (its error is in its output); run the "
            "same command again to resume"
        )

    def run(self, work, what):
        """``work()`` on every process, then :meth:`check_all` of what it raised."""
        error = result = None
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 - raised by check_all, after telling the others
            error = exc
        self.check_all(error, what)
        return result

    def wait_for_all(self, progress=False, poll=2.0):
        """Return once every rank has called this, without a collective.

        A rank that is done early (after a resume it may have no cells left) waits here for
        the others' whole remaining work, which can take longer than the group's timeout: a
        barrier would then abort the job, and under NCCL hold the GPU meanwhile. So each
        rank adds itself to a counter in torchrun's rendezvous store and polls it, with
        its device memory handed back first; rank 0 shows how many are done.
        """
        if self._dist is None:
            return
        import torch
        from tqdm.auto import tqdm

        from ._device import device_type

        if device_type(self.device).startswith("cuda"):
            torch.cuda.empty_cache()
        store = self._store()
        store.add(self._key(f"finished/{self.rank}"), 1)
        self._stop_beating()  # the others look for the signs of life of unfinished ranks only
        done = int(store.add(self._key("finished"), 1))
        delay = 0.05
        heard = {}  # rank: (its counter, when it last moved)
        with tqdm(
            total=self.world,
            initial=done,
            desc="processes finished",
            unit="process",
            disable=not progress,
            leave=False,
        ) as bar:
            while done < self.world:
                try:
                    failed = int(store.add(self._key("failed"), 0))
                    silent = self._silent(store, heard)
                    done = int(store.add(self._key("finished"), 0))
                except Exception as exc:  # noqa: BLE001 - the store went with the rank holding it
                    raise RuntimeError(
                        f"rank {self.rank} lost the group's store, held by rank 0 ({exc}): rank 0 "
                        "stopped or was killed; the cells it had not finished are missing from "
                        "runs.jsonl: run again to resume"
                    ) from None
                if failed:
                    raise RuntimeError(
                        "another process of this run failed (its error says why); the cells "
                        "it had not finished are missing from runs.jsonl: run again to resume"
                    )
                if silent is not None:
                    raise RuntimeError(
                        f"rank {silent} did not report for {SILENCE_S:g} s (killed, or its "
                        "machine lost?); the cells it had not finished are missing from "
                        "runs.jsonl: run again to resume"
                    )
                time.sleep(delay)
                delay = min(poll, 2 * delay)
                bar.update(done - bar.n)

    def _silent(self, store, heard):
        """The first unfinished rank whose counter has not moved for :data:`SILENCE_S` s."""
        now = time.monotonic()
        for rank in range(self.world):
            if rank == self.rank or int(store.add(self._key(f"finished/{rank}"), 0)):
                continue
            beats = int(store.add(self._key(f"alive/{rank}"), 0))
            last = heard.get(rank)
            if last is None or last[0] != beats:
                heard[rank] = (beats, now)
            elif now - last[1] > SILENCE_S:
                return rank
        return None

    def failed(self):
        """Tell the ranks in :meth:`wait_for_all` that this one will not get there."""
        if self._dist is None:
            return
        self._stop_beating()
        # The store may be gone too; the error that matters is this rank's own.
        with contextlib.suppress(Exception):
            self._store().add(self._key("failed"), 1)

    def _store(self):
        import torch.distributed as dist

        return dist.distributed_c10d._get_default_store()

    def _key(self, what):
        return f"imagenet_cog/evaluate/{self._call}/{what}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stop_beating()
        if self._created:
            import torch.distributed as dist

            dist.destroy_process_group()
