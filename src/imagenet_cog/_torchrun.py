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

    from ._validation import device_type

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
