"""Where the work runs: the device, the dtypes and the matmul precision, resolved once.

A base module: the extraction, the probes, the protocol and the analyses resolve their device
here, so none of them enters the training wing to learn where it runs. Each entry point (``evaluate``, ``run_searches``, the estimators' ``fit``, the analyses, the
self-test, the extraction) resolves its device once, with :func:`placement` (device, dtypes,
precision) or :func:`resolve_device` (the device alone), and passes what it got down: the
engine, the feed, the memory plan and the searches take a resolved ``torch.device`` (or a
:class:`Placement`) as given and never resolve again. An entry point that calls others
(``analyze`` calls each analysis) passes its :class:`Placement` as their ``device``: they
take it as resolved (:func:`resolve_analysis_device` and :func:`placement` return it as it is).

Also here, the questions asked of a device: its memory (:func:`usable_bytes`,
:func:`default_budget`, :func:`bytes_on`), its type without resolving it (:func:`device_type`)
and the scikit-learn tags that follow from it (:class:`DeviceTagsMixin`).

Imports nothing from the package but the parameter vocabulary (:mod:`imagenet_cog._validation`,
which lists the mixed-precision modes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os

import numpy as np
import torch

from ._validation import MIXED_PRECISIONS

__all__ = [
    "HOST_SHARE",
    "DeviceTagsMixin",
    "Placement",
    "bytes_in_host_memory",
    "bytes_on",
    "default_budget",
    "device_type",
    "host_available_bytes",
    "matmul_precision",
    "place_on",
    "placement",
    "precisions",
    "resolve_analysis_device",
    "resolve_device",
    "resolve_dtype",
    "usable_bytes",
]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where and in what a fit trains, resolved once by its entry point.

    Attributes
    ----------
    device : torch.device
        Resolved: a CUDA device carries its index.
    weights : torch.dtype
        Weights, softmax and optimizer state.
    features : torch.dtype
        The features on the device: ``weights``, or bfloat16 under ``mixed_precision="bf16"``.
    tf32 : bool
        Whether float32 matmuls may use TF32 on CUDA.
    """

    device: torch.device
    weights: torch.dtype = torch.float32
    features: torch.dtype = torch.float32
    tf32: bool = False


def resolve_device(device):
    """``torch.device`` for ``device``; ``None`` means CUDA when available, else the CPU.

    A CUDA device gets its index (``cuda`` becomes ``cuda:0``), so that a tensor already there
    is recognised as such.

    Raises
    ------
    ValueError
        In one line, for a name torch does not know (``tpu``, ``cuda:-1``), a device this
        machine lacks (CUDA, ``cuda:N`` past the last GPU, MPS) or a kind of device the
        library does not run on.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    given = device
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):  # torch's words for a name it does not know
        raise ValueError(
            f"device {str(given)!r} is not a device name: use 'cpu', 'cuda' or 'cuda:N'"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r}, but CUDA is not available here")
        count = torch.cuda.device_count()
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= count:
            raise ValueError(
                f"device={str(device)!r}, but this machine has {count} CUDA device(s): "
                f"cuda:0 to cuda:{count - 1}"
            )
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(
                f"device={str(device)!r}, but torch sees no Apple GPU (MPS) here: use 'cpu'"
            )
    elif device.type != "cpu":
        raise ValueError(
            f"device={str(device)!r}: imagenet_cog runs on 'cpu', 'cuda' ('cuda:N') or 'mps', "
            f"not on {device.type!r}"
        )
    return device


def resolve_analysis_device(device):
    """:func:`resolve_device`, with the analyses' wording of its error; the device of a
    :class:`Placement` as it is (resolved by the entry point that passed it down)."""
    if isinstance(device, Placement):
        return device.device
    try:
        return resolve_device(device)
    except ValueError:
        if torch.cuda.is_available() or not str(device).startswith("cuda"):
            raise
        raise ValueError(
            f"device {str(device)!r} was asked for, but torch sees no CUDA device "
            "(torch.cuda.is_available() is False); pass device='cpu'"
        ) from None


def resolve_dtype(dtype):
    """``torch.dtype`` for a name such as ``"float32"`` (a ``torch.dtype`` passes through)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype)]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}") from None


def precisions(dtype, mixed_precision):
    """(weight dtype, feature dtype, tf32) for the ``dtype``/``mixed_precision`` parameters."""
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    if mixed_precision not in MIXED_PRECISIONS:
        raise ValueError(
            f"mixed_precision must be one of {MIXED_PRECISIONS}, got {mixed_precision!r}"
        )
    wdt = resolve_dtype(dtype)
    if mixed_precision == "tf32" and wdt != torch.float32:
        raise ValueError("mixed_precision='tf32' needs dtype='float32'")
    fdt = torch.bfloat16 if mixed_precision == "bf16" else wdt
    return wdt, fdt, mixed_precision == "tf32"


def placement(device=None, dtype="float32", mixed_precision=None):
    """The :class:`Placement` of a fit: its dtypes checked first, then its device resolved
    (a :class:`Placement` given as ``device`` lends its device, resolved already)."""
    wdt, fdt, tf32 = precisions(dtype, mixed_precision)
    if isinstance(device, Placement):
        return Placement(device.device, wdt, fdt, tf32)
    return Placement(resolve_device(device), wdt, fdt, tf32)


def place_on(device, dtype="float32", mixed_precision=None):
    """The :class:`Placement` on ``device``, a ``torch.device`` already resolved."""
    wdt, fdt, tf32 = precisions(dtype, mixed_precision)
    return Placement(device, wdt, fdt, tf32)


def device_type(device):
    """``"cpu"``, ``"cuda"``...: the type of the device ``device`` resolves to, without
    resolving it (``str(device)`` when it does not resolve)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError, ValueError):
        return str(device)
    if kind == "cuda" and not torch.cuda.is_available():
        return str(device)
    return kind


class DeviceTagsMixin:
    """scikit-learn tags of a torch-backed estimator with a ``device`` parameter.

    Fits on the CPU are bit-identical for a given ``random_state``; on a GPU only to
    rounding, so ``non_deterministic`` is set there and only there.
    """

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = device_type(self.device) != "cpu"
        return tags


@contextlib.contextmanager
def matmul_precision(device, tf32):
    """Let float32 matmuls use TF32 tensor cores on CUDA inside the block, then restore."""
    if not (tf32 and device.type == "cuda"):
        yield
        return
    backend = torch.backends.cuda.matmul
    if hasattr(backend, "fp32_precision"):
        old = backend.fp32_precision
        backend.fp32_precision = "tf32"
        try:
            yield
        finally:
            backend.fp32_precision = old
    else:  # torch < 2.9
        old = backend.allow_tf32
        backend.allow_tf32 = True
        try:
            yield
        finally:
            backend.allow_tf32 = old


def usable_bytes(device):
    """Bytes of ``device`` memory we may still take, or None off CUDA (no device budget).

    ``torch.cuda.mem_get_info`` counts the blocks torch's caching allocator holds as used,
    although torch hands them out again: they are added back, so the figure does not depend
    on what ran before in this process.
    """
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free) + max(0, int(cached))


#: The share of the host's available memory that the plan of a CPU run may fill with copies
#: of features it reads from memory maps (what does not fit streams from the maps).
HOST_SHARE = 0.5


def host_available_bytes():
    """Host memory available to new allocations without swapping (Linux's ``MemAvailable``;
    elsewhere the free pages), or None where the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def bytes_in_host_memory(*arrays):
    """Bytes of ``arrays`` held in host memory as they are: NumPy arrays that are not memory
    maps and CPU tensors. A CPU run uses them without a copy; a memory map (a store's shards)
    is copied when its unit is resident."""
    total = 0
    for X in arrays:
        if isinstance(X, torch.Tensor) and X.device.type == "cpu":
            total += X.numel() * X.element_size()
        elif isinstance(X, np.ndarray) and not _mapped(X):
            total += X.nbytes
    return total


def _mapped(X):
    while X is not None:
        if isinstance(X, (np.memmap, mmap.mmap)):
            return True
        X = getattr(X, "base", None)
    return False


def default_budget(device):
    """Most bytes the features may take on ``device`` when no ``memory_budget`` is given."""
    usable = usable_bytes(device)
    if usable is None:
        return 1 << 62  # host features are already in host memory
    # Leave room for weights, optimizer state, logits and the allocator's slack.
    return int(0.6 * usable)


def bytes_on(device, *arrays):
    """Bytes of ``arrays`` that are tensors on ``device`` already (features given there)."""
    return sum(
        X.numel() * X.element_size()
        for X in arrays
        if isinstance(X, torch.Tensor) and X.device == device
    )
