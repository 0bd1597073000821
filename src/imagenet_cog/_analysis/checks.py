"""Input checks and tensor helpers shared by the analyses of :mod:`imagenet_cog.analysis`.

Features must be 2-D, finite and float, labels must match them (the device is resolved by
:func:`imagenet_cog._device.resolve_analysis_device`), and large host arrays are copied to torch in blocks so
that no full-size temporary is made.
"""

from __future__ import annotations

import math

import numpy as np

# Elements of one distance block (rows × centroids or rows × rows): 64M values,
# 256 MB in float32. Large enough to keep a GPU busy, small enough that
# 1M × 2048 features with k = 1000 never need more than one block at a time.
# Host-to-device copies and the PCA projection use blocks of the same bound.
# (The engine's evaluation blocks and similarity's ancestor tables have their own bounds,
# _train.engine._EVAL_BLOCK_ELEMENTS and measures._ANCESTOR_BLOCK_ELEMENTS: other memory.)
_DISTANCE_BLOCK_ELEMENTS = 1 << 26


# ---------------------------------------------------------------- validation
def _torch():
    import torch

    return torch


def _finite_float_features(X, name):
    """A 2-D float array or tensor with finite values, or a clear error."""
    torch = _torch()
    if isinstance(X, torch.Tensor):
        X = X.detach()
        if not X.is_floating_point():
            X = X.double()
        elif X.dtype in (torch.float16, torch.bfloat16):
            X = X.float()
    else:
        X = np.asarray(X)
        if X.dtype.kind not in "fiub":
            raise ValueError(f"{name} must hold numbers, got dtype {X.dtype}")
        if X.dtype.kind != "f":
            X = X.astype(np.float64)
        elif X.dtype.itemsize < 4:
            X = X.astype(np.float32)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (samples × features), got shape {tuple(X.shape)}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(X.shape)})")
    # One float64 sum is cheap and is finite exactly when every value is
    # (short of overflow); the row-by-row check only runs to name the culprits.
    total = X.sum(dtype=torch.float64) if isinstance(X, torch.Tensor) else X.sum(dtype=np.float64)
    if not math.isfinite(float(total)):
        bad = ~(
            torch.isfinite(X).all(1).cpu().numpy()
            if isinstance(X, torch.Tensor)
            else np.isfinite(X).all(1)
        )
        rows = np.flatnonzero(bad)
        raise ValueError(
            f"{name} contains NaN or infinite values in {len(rows)} of {X.shape[0]} rows "
            f"(first at row {rows[0] if len(rows) else '?'}); drop or fix them first"
        )
    return X


def _check_labels(y, n, name, xname):
    y = y.detach().cpu().numpy() if hasattr(y, "detach") else np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {y.shape}")
    if len(y) != n:
        raise ValueError(f"{name} has {len(y)} labels but {xname} has {n} rows")
    return y


def _float_dtype(X, dtype):
    torch = _torch()
    if dtype is not None:
        return dtype
    if isinstance(X, torch.Tensor):
        return X.dtype
    return torch.float64 if X.dtype == np.float64 else torch.float32


def _as_tensor(X, device, dtype):
    """``X`` as a tensor on ``device``; numpy input is copied in row blocks."""
    torch = _torch()
    if isinstance(X, torch.Tensor):
        return X.to(device=device, dtype=dtype)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    if device.type == "cpu":
        return torch.from_numpy(np.ascontiguousarray(X, dtype=np_dtype))
    # Block copies keep a float64 array from being duplicated in host memory.
    out = torch.empty(X.shape, dtype=dtype, device=device)
    rows = max(1, _DISTANCE_BLOCK_ELEMENTS // X.shape[1])
    for s in range(0, X.shape[0], rows):
        out[s : s + rows].copy_(torch.from_numpy(np.ascontiguousarray(X[s : s + rows], np_dtype)))
    return out


def _json_float(x):
    x = float(x)
    return x if math.isfinite(x) else None
