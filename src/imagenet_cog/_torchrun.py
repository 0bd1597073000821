"""The torch.distributed group of an extraction started under ``torchrun``."""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta


def torchrun_env():
    """``(rank, world size, local rank)`` when torchrun started several processes."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        return None
    return (rank, world, local) if world > 1 else None


@contextmanager
def process_group(extractor, progress):
    """Yield ``(extractor, progress)`` set up for this process.

    Outside torchrun: unchanged. Under torchrun with several processes: the
    group is initialized (NCCL on CUDA, Gloo on the CPU) unless it already
    is, and closed at the end if it was opened here; on CUDA the extractor
    runs on the GPU that ``LOCAL_RANK`` names; only rank 0 shows progress.
    """
    env = torchrun_env()
    created = False
    if env is not None:
        import torch
        import torch.distributed as dist
        from sklearn.base import clone

        rank, _world, local = env
        device = extractor.device
        cuda = torch.cuda.is_available() if device is None else str(device).startswith("cuda")
        if cuda:  # one GPU per process: the one torchrun's LOCAL_RANK names
            if extractor.device != f"cuda:{local}":
                extractor = clone(extractor).set_params(device=f"cuda:{local}")
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=timedelta(hours=2))
            created = True
        progress = progress if rank == 0 else False
    try:
        yield extractor, progress
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()
