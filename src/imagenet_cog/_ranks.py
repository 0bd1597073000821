"""The processes of a ``torchrun`` job as the feature stores see them, or one process."""

from __future__ import annotations

__all__ = ["RankGroup"]


class RankGroup:
    """The torch.distributed group, if one is initialized; else a single process."""

    def __init__(self):
        self.rank, self.world = 0, 1
        self.dist = None
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.dist = dist
            self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _tensor(self, values):
        import torch

        device = "cpu"
        if self.dist.get_backend() == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        return torch.tensor(values, dtype=torch.int64, device=device)

    def all_ok(self, ok):
        """True when ``ok`` is true on every process."""
        if self.dist is None:
            return bool(ok)
        t = self._tensor([int(bool(ok))])
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return bool(t.item())

    def broadcast(self, values):
        """Rank 0's list of ints, on every process."""
        if self.dist is None:
            return list(values)
        t = self._tensor(list(values))
        self.dist.broadcast(t, src=0)
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
