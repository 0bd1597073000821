"""Pillow's resize of 8-bit images, reproduced in torch on any device.

The Pillow path resizes a decoded RGB image with ``PIL.Image.resize`` (through
torchvision's ``Resize``). For 8-bit images Pillow's ``Resample.c`` works in
two separable passes, horizontal then vertical, each skipped when that side
keeps its size:

* weights: for output pixel ``i`` the filter (bicubic with ``a = -0.5`` and
  support 2, bilinear with support 1) is centred at ``(i + 0.5) * scale``,
  where ``scale = in / out``; when downscaling it is stretched by ``scale``
  (antialiasing), so the support becomes ``support * scale``. The input pixels
  ``xmin .. xmax - 1`` with ``xmin = int(center - support + 0.5)`` and
  ``xmax = int(center + support + 0.5)``, clipped to the image, are weighted
  by ``filter((x - center + 0.5) / filterscale)``, and the weights divided by
  their sum;
* fixed point: each weight becomes the integer ``int(w * 2**22 ± 0.5)``
  (``PRECISION_BITS = 22``, rounded away from zero);
* each pass sums ``pixel * weight`` in integers, starting from ``2**21`` (so
  that the shift rounds to nearest), and stores ``clip(sum >> 22, 0, 255)``
  as uint8;
* the order: Pillow before 13 always runs the horizontal pass first; Pillow
  13 runs the vertical pass first when the height shrinks by more than twice
  as many pixels as the width (``H - h > 2 * (W - w)`` and ``H > h``). The
  order changes the result, since each pass rounds and clips, so it follows
  the Pillow that is installed, the one the Pillow path uses.

Nearest-neighbour resizing takes input pixel ``int((i + 0.5) * scale)``,
with the positions accumulated in floating point as Pillow does. The
weights and positions are computed once per (input size, output size,
filter) on the CPU in float64, in the same order of operations as Pillow's
C code; each pass runs on the image's device as a product with a banded
float64 matrix of those integer weights, which is exact (products below
``2**31``, sums below ``2**53``), so on any device the result equals
Pillow's pixel for pixel.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

__all__ = ["fixed_point_weights", "nearest_positions", "pillow_resize", "vertical_first"]

PRECISION_BITS = 22


def _pillow_major():
    from PIL import __version__

    return int(__version__.split(".")[0])


def vertical_first(in_height, in_width, height, width):
    """Whether Pillow runs the vertical pass before the horizontal one."""
    if _pillow_major() < 13:
        return False
    return in_height - height > 0 and in_height - height > (in_width - width) * 2


def _bicubic(x):
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _bilinear(x):
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


_FILTERS = {"bicubic": (_bicubic, 2.0), "bilinear": (_bilinear, 1.0)}


@functools.lru_cache(maxsize=512)
def fixed_point_weights(in_size, out_size, interpolation):
    """``(first input index, fixed-point weights)`` of Pillow's ``precompute_coeffs``.

    Returns int64 arrays of shape ``(out_size,)`` and ``(out_size, ksize)``;
    weights past an output pixel's window are 0.
    """
    kernel, support = _FILTERS[interpolation]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = support * filterscale
    ksize = math.ceil(support) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    ss = 1.0 / filterscale
    # C's (int) truncates toward zero.
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    inside = taps[None, :] < xmax[:, None]
    w = np.where(inside, kernel(((taps[None, :] + xmin[:, None]) - center[:, None] + 0.5) * ss), 0)
    total = np.zeros(out_size)
    for k in range(ksize):  # summed in Pillow's order, not numpy's pairwise one
        total = total + w[:, k]
    w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
    scaled = w * (1 << PRECISION_BITS)
    fixed = np.where(w < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled)).astype(np.int64)
    xmin.flags.writeable = fixed.flags.writeable = False  # cached: shared by every caller
    return xmin, fixed


@functools.lru_cache(maxsize=512)
def nearest_positions(in_size, out_size):
    """Input index of each output pixel, as Pillow's ``ImagingScaleAffine`` tabulates it
    (an int64 array of ``out_size``)."""
    step = in_size / out_size
    # xo = a[2] + a[0] * 0.5, then xo += a[0] per pixel: accumulated, not multiplied.
    positions = np.add.accumulate(np.r_[0.0 + step * 0.5, np.full(out_size - 1, step)])
    index = np.minimum(np.trunc(positions).astype(np.int64), in_size - 1)
    index.flags.writeable = False  # cached: shared by every caller
    return index


@functools.lru_cache(maxsize=512)
def _nearest_index(in_size, out_size, device):
    return torch.from_numpy(nearest_positions(in_size, out_size).copy()).to(device)


def _matrix(in_size, out_size, interpolation, device):
    """The fixed-point weights as a dense float64 ``(in_size, out_size)`` matrix on ``device``.

    Matrices up to 8 MB are kept on the device: a few dozen sizes cover most of
    a dataset.
    """
    if in_size * out_size <= 2**20:
        return _kept_matrix(in_size, out_size, interpolation, device)
    return _dense(in_size, out_size, interpolation, device)


@functools.lru_cache(maxsize=64)
def _kept_matrix(in_size, out_size, interpolation, device):
    return _dense(in_size, out_size, interpolation, device)


def _dense(in_size, out_size, interpolation, device):
    xmin, fixed = fixed_point_weights(in_size, out_size, interpolation)
    matrix = np.zeros((in_size, out_size))
    columns = np.broadcast_to(np.arange(out_size)[:, None], fixed.shape)
    inside = fixed != 0
    rows = (xmin[:, None] + np.arange(fixed.shape[1])[None, :])[inside]
    matrix[rows, columns[inside]] = fixed[inside]
    return torch.from_numpy(matrix).to(device)


#: Bytes of float64 rows converted at once; larger images are done in slices of rows.
_SLICE_BYTES = 64 * 2**20


def _pass(image, dim, out_size, interpolation):
    """Resize ``image`` (uint8, ``(C, H, W)``) along ``dim`` (-1 or -2) as Pillow's pass does."""
    if dim == -2:
        return _pass(image.transpose(-1, -2), -1, out_size, interpolation).transpose(-1, -2)
    if interpolation == "nearest":
        index = _nearest_index(image.shape[-1], out_size, image.device)
        return image.index_select(-1, index)
    matrix = _matrix(image.shape[-1], out_size, interpolation, image.device)
    rows = image.reshape(-1, image.shape[-1])
    step = max(1, _SLICE_BYTES // (8 * max(image.shape[-1], out_size)))
    out = []
    for start in range(0, rows.shape[0], step):
        # A matrix product of integers in float64 is exact: every product is below
        # 2**31 and every sum below 2**53, whatever the order of the additions.
        total = (rows[start : start + step].to(torch.float64) @ matrix).to(torch.int64)
        total = (total + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS
        out.append(total.clamp_(0, 255).to(torch.uint8))
    return torch.cat(out).view(*image.shape[:-1], out_size)


def pillow_resize(image, size, interpolation="bicubic"):
    """Resize a uint8 image tensor exactly as ``PIL.Image.resize`` resizes an 8-bit image.

    Parameters
    ----------
    image : torch.Tensor
        uint8, shape ``(C, H, W)`` (or any leading dimensions), on any device.
    size : (int, int)
        The output ``(height, width)``.
    interpolation : {"bicubic", "bilinear", "nearest"}

    Returns
    -------
    torch.Tensor
        uint8, shape ``(C, height, width)``, on the image's device.

    Examples
    --------
    >>> import numpy as np
    >>> from PIL import Image
    >>> pixels = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    >>> ours = pillow_resize(torch.from_numpy(pixels).permute(2, 0, 1), (24, 17))
    >>> pillows = Image.fromarray(pixels).resize((17, 24), Image.Resampling.BICUBIC)
    >>> bool((ours.permute(1, 2, 0).numpy() == np.asarray(pillows)).all())
    True
    """
    if image.dtype != torch.uint8:
        raise TypeError(f"pillow_resize takes a uint8 image, got {image.dtype}")
    if interpolation not in (*_FILTERS, "nearest"):
        raise ValueError(
            f"interpolation must be bicubic, bilinear or nearest, got {interpolation!r}"
        )
    height, width = (int(s) for s in size)
    if height < 1 or width < 1:
        raise ValueError(f"size must be positive, got {tuple(size)}")
    out = image
    if interpolation == "nearest":
        # Pillow's nearest resize is one affine pass, the same as two index passes.
        if width != out.shape[-1] or height != out.shape[-2]:
            out = _pass(_pass(out, -1, width, "nearest"), -2, height, "nearest")
        return out
    passes = [(-1, width), (-2, height)]
    if vertical_first(out.shape[-2], out.shape[-1], height, width):
        passes.reverse()
    for dim, length in passes:
        if length != out.shape[dim]:
            out = _pass(out, dim, length, interpolation)
    return out
