"""How an extraction runs on a device: its decoder, resize, workers and arithmetic.

:class:`imagenet_cog.FeatureExtractor` takes ``decoder``, ``resize``, ``num_workers`` and
``tf32``; ``"auto"`` and ``None`` resolve here, per device. A store records the decoder and
the resize in its key when they are not the Pillow path's, and goes on with the ones it was
started with when ``"auto"`` would pick others on this device.
"""

from __future__ import annotations

import contextlib
import os
import warnings

__all__ = [
    "AUTO_SETTINGS",
    "DECODERS",
    "RESIZES",
    "decoder_name",
    "default_workers",
    "going_on_with",
    "network_precision",
    "resize_name",
    "stored_auto_settings",
]

DECODERS = ("auto", "pil", "torchvision")
RESIZES = ("auto", "pil", "torch")
#: The settings ``"auto"`` may resolve differently on another device, with the value that a
#: key without the field means (the Pillow path's).
AUTO_SETTINGS = {"decoder": "pil", "resize": "pil"}


def decoder_name(decoder):
    """The decoder that runs: ``"pil"`` (the worker path) or ``"torchvision"`` (the tensor
    path). ``"auto"`` is the worker path: measured the faster on the CPU (see the features
    guide), and on one H100 than the tensor path was before its batched resize."""
    return "pil" if decoder == "auto" else decoder


def resize_name(decoder, resize, device):
    """The resize that runs: ``"pil"`` or ``"torch"``. The tensor path always resizes as
    Pillow; ``"auto"`` is torch's on CUDA, where the workers are the bottleneck, and
    Pillow's on the CPU, where the network is."""
    if decoder_name(decoder) == "torchvision":
        return "pil"
    if resize == "auto":
        return "torch" if device.type == "cuda" else "pil"
    return resize


def default_workers(device):
    """DataLoader workers when none are given: none on the CPU (the network takes the
    cores); with CUDA, the cores this process may use less one, shared among the processes
    of a machine under ``torchrun`` (``LOCAL_WORLD_SIZE``)."""
    if device.type != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_process = (cores or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, per_process - 1)


@contextlib.contextmanager
def network_precision(device, tf32):
    """cuDNN's convolutions and cuBLAS's products in float32, or TF32 with ``tf32``, on CUDA
    inside the block (cuDNN's own default is TF32), then the settings as they were."""
    if device.type != "cuda":
        yield
        return
    import torch

    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    if hasattr(conv, "fp32_precision"):
        backends, value, attr = (conv, matmul), "tf32" if tf32 else "ieee", "fp32_precision"
    else:  # torch < 2.9
        backends, value, attr = (torch.backends.cudnn, matmul), bool(tf32), "allow_tf32"
    saved = [getattr(b, attr) for b in backends]
    for b in backends:
        setattr(b, attr, value)
    try:
        yield
    finally:
        for b, old in zip(backends, saved):
            setattr(b, attr, old)


def stored_auto_settings(key):
    """``{setting: value}`` of :data:`AUTO_SETTINGS` in a store's ``key`` (a key without the
    field was made by the Pillow path)."""
    return {name: key.get(name, default) for name, default in AUTO_SETTINGS.items()}


@contextlib.contextmanager
def going_on_with(stored, path, extractor):
    """Under ``decoder="auto"`` (``resize="auto"``), the decoder (the resize) the store at
    ``path`` was started with (``stored``, or ``None``), with a warning, inside the block.

    ``"auto"`` may resolve differently on the CPU and on CUDA, so a store started on one and
    resumed (or reused) on the other would otherwise be refused as made with other settings.
    One store never mixes them: an explicit setting that differs is still refused.
    """
    device = extractor._load()["device"]
    auto = {"decoder": extractor._decoder_name(device), "resize": extractor._resize_name(device)}
    changed = {}
    for name in AUTO_SETTINGS:
        if stored is None or getattr(extractor, name) != "auto" or stored[name] == auto[name]:
            continue
        warnings.warn(
            f"{path} was started with the {stored[name]!r} {name}: going on with it "
            f"({name}='auto' would pick {auto[name]!r} here)",
            UserWarning,
            stacklevel=5,
        )
        changed[name] = stored[name]
    for name, value in changed.items():
        setattr(extractor, name, value)
    try:
        yield
    finally:
        for name in changed:
            setattr(extractor, name, "auto")
