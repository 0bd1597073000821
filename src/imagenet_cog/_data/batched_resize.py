"""Pillow's resize and torchvision's center crop of a whole batch of 8-bit images at once.

The tensor path decodes a batch of JPEGs of many sizes on the device. Resizing each image on
its own takes a few dozen small kernels per image; here the batch is resized in a handful of
kernels per pass, with Pillow's own arithmetic (see ``pillow_resize``), so the pixels are
Pillow's on any device:

* **tap tables on the host.** For every image and each axis, the fixed-point weights of
  Pillow's filter (``fixed_point_weights``, cached per input size, output size and filter)
  for the output pixels that the center crop keeps, and the first input pixel each one
  reads. Output pixels that the crop adds as padding get no weights (their value is 0, as
  torchvision pads). The tables of a whole batch go to the device in one copy, from pinned
  memory on CUDA;
* **only what the crop needs.** An output pixel depends only on its own window, so each
  pass computes the cropped pixels alone, from the input rows and columns their windows
  cover;
* **bucketed by size.** Images whose needed input regions are about as large, and whose
  two passes run in the same order (Pillow 13 runs the vertical pass first for images whose
  height shrinks much more than their width), are padded into one tensor;
* **exact integer arithmetic.** Each pass gathers the taps of every output pixel and sums
  ``pixel * weight`` in int32 from ``2**21``, then shifts by 22 bits and clips to 0-255, as
  Pillow's C code does (its sums fit in 32 bits there too). The result does not depend on
  the order of the additions, nor on TF32 or any matrix-product setting.
"""

from __future__ import annotations

import numpy as np
import torch

from .pillow_resize import (
    PRECISION_BITS,
    fixed_point_weights,
    nearest_positions,
    vertical_first,
)

__all__ = ["ResizePlan", "resize_crop_batch", "resized_size"]

#: Largest int32 accumulator of one bucket, in elements (256 MiB): a bucket is cut there.
_MAX_BUCKET_ELEMENTS = 64 * 2**20
#: How much larger than its images' own regions a bucket's padded tensor may grow.
_MAX_PADDING = 1.3


def resized_size(size, resize):
    """``(height, width)`` after torchvision's ``Resize(resize)`` of an image of ``size``.

    An int resizes the shorter side to ``resize`` and the longer to ``int(resize * long /
    short)``, as torchvision computes it for PIL images and tensors alike; ``[height,
    width]`` is that size.

    Examples
    --------
    >>> resized_size((375, 500), 224), resized_size((500, 375), 224)
    ((224, 298), (298, 224))
    >>> resized_size((375, 500), [240, 320])
    (240, 320)
    """
    if isinstance(resize, (list, tuple)):
        return int(resize[0]), int(resize[1])
    height, width = (int(v) for v in size)
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(resize * long / short)
    return (new_long, resize) if width <= height else (resize, new_long)


def _crop_offset(size, crop):
    """Where output position 0 of torchvision's center crop lies in an axis of ``size``
    (negative: the crop pads ``-offset`` zeros before the image)."""
    if crop > size:
        return -((crop - size) // 2)
    return round((size - crop) / 2.0)


def _axis_taps(in_size, out_size, crop, interpolation):
    """``(first, weights, lo, hi)`` of one axis: the first input pixel each cropped output
    pixel reads (relative to ``lo``) and its fixed-point weights (``(crop, taps)``, all 0
    for padding), and the input range ``lo:hi`` that the crop needs."""
    if in_size == out_size:  # Pillow skips the pass: the identity, one tap
        xmin, fixed = np.arange(in_size), np.full((in_size, 1), 1 << PRECISION_BITS)
    elif interpolation == "nearest":
        xmin = nearest_positions(in_size, out_size)
        fixed = np.full((out_size, 1), 1 << PRECISION_BITS)
    else:
        xmin, fixed = fixed_point_weights(in_size, out_size, interpolation)
    position = np.arange(crop) + _crop_offset(out_size, crop)
    inside = (position >= 0) & (position < out_size)
    position = np.clip(position, 0, out_size - 1)
    first = np.where(inside, xmin[position], 0)
    weights = np.where(inside[:, None], fixed[position], 0)
    used = weights != 0
    taps = used.shape[1] - np.argmax(used[:, ::-1], axis=1)  # one past the last weight
    taps = np.where(used.any(axis=1), taps, 0)
    lo = int(first[used.any(axis=1)].min())
    hi = int((first + taps).max())
    keep = max(1, int(taps.max()))
    return np.where(inside, first - lo, 0), weights[:, :keep], lo, hi


class ResizePlan:
    """The tap tables of one image: what :func:`resize_crop_batch` computes for it.

    Parameters
    ----------
    size : (int, int)
        The decoded image's ``(height, width)``.
    resize : int or [int, int]
        The preprocessing's resize (the shorter side, or both sides).
    crop : int
        The center crop's side.
    interpolation : {"bicubic", "bilinear", "nearest"}

    Attributes
    ----------
    rows, cols : slice
        The input region the crop needs.
    vertical_first : bool
        Whether Pillow runs the vertical pass first for this image.
    y, x : (ndarray, ndarray)
        Each axis's first tap (relative to the region) and weights.
    """

    def __init__(self, size, resize, crop, interpolation):
        height, width = (int(v) for v in size)
        out_h, out_w = resized_size((height, width), resize)
        self.size = (height, width)
        self.vertical_first = interpolation != "nearest" and vertical_first(
            height, width, out_h, out_w
        )
        first_y, weights_y, y0, y1 = _axis_taps(height, out_h, crop, interpolation)
        first_x, weights_x, x0, x1 = _axis_taps(width, out_w, crop, interpolation)
        self.rows, self.cols = slice(y0, y1), slice(x0, x1)
        self.y, self.x = (first_y, weights_y), (first_x, weights_x)

    @property
    def region(self):
        """``(rows, cols)`` of the input region."""
        return self.rows.stop - self.rows.start, self.cols.stop - self.cols.start


def _buckets(plans, crop):
    """Positions of ``plans`` grouped into buckets: one pass order each, padded regions at
    most :data:`_MAX_PADDING` times their images' own, accumulators under
    :data:`_MAX_BUCKET_ELEMENTS`."""
    out = []
    for order in (False, True):
        members = [k for k, p in enumerate(plans) if p.vertical_first == order]
        members.sort(key=lambda k: (plans[k].region[0] * plans[k].region[1], k))
        bucket, area, rows, cols = [], 0, 0, 0
        for k in members:
            r, c = plans[k].region
            new_rows, new_cols = max(rows, r), max(cols, c)
            n = len(bucket) + 1
            padded = new_rows * new_cols * n
            # The largest int32 accumulator of the two passes, per channel.
            total = max(new_rows, crop) * max(new_cols, crop) * n * 3
            if bucket and (padded > _MAX_PADDING * (area + r * c) or total > _MAX_BUCKET_ELEMENTS):
                out.append(bucket)
                bucket, area, new_rows, new_cols = [], 0, r, c
            bucket.append(k)
            area += r * c
            rows, cols = new_rows, new_cols
        if bucket:
            out.append(bucket)
    return out


def _table(plans, bucket, axis):
    """``(first, weights)`` of one axis of a bucket: int32 arrays ``(n, crop)`` and
    ``(n, crop, taps)``, padded with taps of weight 0."""
    taps = max(getattr(plans[k], axis)[1].shape[1] for k in bucket)
    crop = getattr(plans[bucket[0]], axis)[0].shape[0]
    first = np.zeros((len(bucket), crop), np.int32)
    weights = np.zeros((len(bucket), crop, taps), np.int32)
    for row, k in enumerate(bucket):
        f, w = getattr(plans[k], axis)
        first[row], weights[row, :, : w.shape[1]] = f, w
    return first, weights


def _upload(arrays, device):
    """The int32 ``arrays`` on ``device``, in one copy (from pinned memory on CUDA)."""
    flat = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, np.int32)
    host = torch.from_numpy(flat)
    if device.type == "cuda":
        host = host.pin_memory()
    on_device = host.to(device, non_blocking=True)
    out, at = [], 0
    for a in arrays:
        out.append(on_device[at : at + a.size].view(a.shape))
        at += a.size
    return out


def _pass(x, first, weights):
    """One of Pillow's passes, along dimension 1 of ``x`` (uint8, ``(n, length, ...)``):
    ``out[i, j]`` sums ``x[i, first[i, j] + k] * weights[i, j, k]`` over the taps ``k``.

    Each tap reads whole rows ``x[i, first[i, j] + k]`` (one indexing kernel), so the
    work per tap is a copy and a multiply-add over the batch, whatever its images' sizes.
    ``x`` is widened to int32 once, so that every multiply-add is of one type.
    """
    x = x.to(torch.int32)
    n, length = x.shape[:2]
    rest = x.shape[2:]
    out_len = first.shape[1]
    batch = torch.arange(n, device=x.device)[:, None]
    first = first.to(torch.int64)
    scale = (n, out_len) + (1,) * len(rest)
    total = torch.full(
        (n, out_len, *rest), 1 << (PRECISION_BITS - 1), dtype=torch.int32, device=x.device
    )
    for k in range(weights.shape[2]):
        index = (first + k).clamp_(max=length - 1)
        total.addcmul_(x[batch, index], weights[:, :, k].reshape(scale))
    return (total >> PRECISION_BITS).clamp_(0, 255).to(torch.uint8)


def resize_crop_batch(images, plans, device):
    """Resize and center-crop ``images`` as torchvision's ``Resize`` and ``CenterCrop`` do
    to PIL images, with Pillow's arithmetic.

    Parameters
    ----------
    images : list of torch.Tensor
        uint8 ``(C, H, W)`` images on ``device`` (the same C for all).
    plans : list of ResizePlan
        One per image, made for its size (:class:`ResizePlan`).
    device : torch.device

    Returns
    -------
    torch.Tensor
        uint8 ``(n, C, crop, crop)`` on ``device``, in the order of ``images``.

    Examples
    --------
    >>> import numpy as np
    >>> from PIL import Image
    >>> rng = np.random.default_rng(0)
    >>> arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(37, 53), (60, 20)]]
    >>> images = [torch.from_numpy(a).permute(2, 0, 1) for a in arrays]
    >>> plans = [ResizePlan(i.shape[1:], 24, 16, "bicubic") for i in images]
    >>> out = resize_crop_batch(images, plans, torch.device("cpu"))
    >>> theirs = Image.fromarray(arrays[0]).resize((34, 24), Image.Resampling.BICUBIC)
    >>> bool((out[0].permute(1, 2, 0).numpy() == np.asarray(theirs)[4:20, 9:25]).all())
    True
    """
    if not images:
        raise ValueError("no images to resize")
    channels = images[0].shape[0]
    crop = plans[0].x[0].shape[0]
    buckets = _buckets(plans, crop)
    tables = []
    for bucket in buckets:
        tables += [*_table(plans, bucket, "y"), *_table(plans, bucket, "x")]
    order = np.array([k for bucket in buckets for k in bucket], np.int64)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    uploaded = _upload([*tables, inverse.astype(np.int32)], device)
    parts = []
    for b, bucket in enumerate(buckets):
        first_y, weights_y, first_x, weights_x = uploaded[4 * b : 4 * b + 4]
        rows = max(plans[k].region[0] for k in bucket)
        cols = max(plans[k].region[1] for k in bucket)
        vertical = plans[bucket[0]].vertical_first
        # Laid out (image, axis of the first pass, channel, other axis); past each region
        # the values are never read with a weight other than 0.
        shape = (
            (len(bucket), rows, channels, cols) if vertical else (len(bucket), cols, channels, rows)
        )
        padded = torch.empty(shape, dtype=torch.uint8, device=device)
        for row, k in enumerate(bucket):
            r, c = plans[k].region
            region = images[k][:, plans[k].rows, plans[k].cols]
            if vertical:
                padded[row, :r, :, :c] = region.permute(1, 0, 2)
            else:
                padded[row, :c, :, :r] = region.permute(2, 0, 1)
        if vertical:  # rows, then columns: (n, crop_h, C, cols) -> (n, cols, C, crop_h)
            middle = _pass(padded, first_y, weights_y).permute(0, 3, 2, 1).contiguous()
            parts.append(_pass(middle, first_x, weights_x).permute(0, 2, 3, 1))
        else:  # columns, then rows: (n, crop_w, C, rows) -> (n, rows, C, crop_w)
            middle = _pass(padded, first_x, weights_x).permute(0, 3, 2, 1).contiguous()
            parts.append(_pass(middle, first_y, weights_y).permute(0, 2, 1, 3))
    out = torch.cat(parts) if len(parts) > 1 else parts[0]
    return out.index_select(0, uploaded[-1].to(torch.int64))
