"""The matrix products of one SGD step, timed alone: the floor a step is compared with.

``train_many``'s step for ``groups`` groups of ``K`` configurations and ``C`` classes does two
batched products per step: the logits ``(groups, batch, d) @ (groups, d, K*C)`` and the weight
gradient ``(groups, d, batch) @ (groups, batch, K*C)``, 4 x batch x d x C FLOP per trial. The
floor is those two products alone, on the same device and in the same precision, timed in the
benchmark's own run, so that its ratio does not depend on another process or another day.
"""

from __future__ import annotations

import contextlib
import time

import torch

PRECISIONS = {
    "fp32": (torch.float32, False),
    "tf32": (torch.float32, True),
    "bf16": (torch.bfloat16, False),
}


@contextlib.contextmanager
def _tf32(device, on):
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_products_ms(
    device, groups, trials, d, classes, precision="fp32", batch=1024, seconds=None
):
    """Milliseconds of one step's two products for ``groups`` x ``trials`` configurations.

    Timed over repeats that last about ``seconds`` (0.5 on CUDA, 0.3 on the CPU), after a
    warm-up; returns ``(ms per step, ms per trial-step, TFLOP/s)``.
    """
    device = torch.device(device)
    dtype, tf32 = PRECISIONS[precision]
    gen = torch.Generator(device=device).manual_seed(0)
    cols = trials * classes
    X = torch.randn(groups, batch, d, generator=gen, device=device).to(dtype)
    W = torch.randn(groups, d, cols, generator=gen, device=device).to(dtype)
    E = torch.randn(groups, batch, cols, generator=gen, device=device).to(dtype)
    Z = torch.empty(groups, batch, cols, device=device, dtype=dtype)
    G = torch.empty(groups, d, cols, device=device, dtype=dtype)

    def once():
        torch.bmm(X, W, out=Z)
        torch.bmm(X.transpose(1, 2), E, out=G)

    seconds = seconds or (0.5 if device.type == "cuda" else 0.3)
    with _tf32(device, tf32):
        once()
        _sync(device)
        repeats, elapsed = 1, 0.0
        while True:
            start = time.perf_counter()
            for _ in range(repeats):
                once()
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds or repeats >= 1 << 16:
                break
            repeats *= 2
    ms = 1e3 * elapsed / repeats
    flop = 4 * batch * d * classes * groups * trials
    return ms, ms / (groups * trials), flop / (ms / 1e3) / 1e12
