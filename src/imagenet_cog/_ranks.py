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

    def barrier(self):
        if self.dist is not None:
            self.dist.barrier()

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
