"""The worker path: DataLoader workers decode, resize and crop; 8-bit pixels travel.

What :class:`imagenet_cog.FeatureExtractor` runs with ``decoder="pil"`` (and ``"auto"``).
Each DataLoader worker turns an image into the uint8 pixels of the network's input:

* **decoding**: a JPEG that the marker walk accepts (``jpeg_markers``) is decoded by
  ``torchvision.io.decode_jpeg`` on the CPU (libjpeg-turbo, as in Pillow; before a run the
  package's reference JPEGs, real photos baseline and progressive, are decoded both ways and
  compared, see :func:`jpeg_decoder_agrees`: the builds are checked, and no image of the copy
  is read out of its turn); anything
  else (PNG, CMYK, truncated files, PIL images, dataset items) by Pillow, as the Pillow path
  always did. A decoded JPEG whose bottom-right pixel is libjpeg's mid-grey goes to Pillow
  too, which tells a file cut short from a grey photo;
* **the resize**: ``"pil"``, Pillow's own ``resize`` (through torchvision's ``Resize``, as
  in the official code), or ``"torch"``, torch's antialiased resize of the uint8 pixels
  (``interpolate(..., antialias=True)``: a few times faster, within a level or two of
  Pillow's pixels; nearest-neighbour resizing is ``"nearest-exact"``);
* **the crop**: torchvision's ``CenterCrop``;
* **transport**: uint8 pixels, stacked into one uint8 batch tensor (timm's ``fast_collate``)
  — a quarter of the bytes of float32 crops.

On the device, :func:`scale_and_normalize` turns the batch into the network's input with the
float32 operations of torchvision's ``ToTensor`` and ``Normalize``, so that with
``resize="pil"`` the input is bit for bit the one the Pillow transforms give.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch
import torch.utils.data

from .jpeg_markers import jpeg_frame
from .sources import FILE, PARQUET_IMAGE, TAR_MEMBER, kind

__all__ = [
    "WorkerImages",
    "WorkerSteps",
    "decode_jpeg_cpu",
    "jpeg_decoder_agrees",
    "scale_and_normalize",
]

#: Kinds of source whose encoded bytes the workers read themselves.
_ENCODED = (FILE, TAR_MEMBER, PARQUET_IMAGE)


def decode_jpeg_cpu(data):
    """``data`` (bytes) decoded to an RGB uint8 ``(3, H, W)`` tensor by ``decode_jpeg``.

    The tensor is a view of the decoder's height × width × 3 buffer (channels last), the
    layout torch's uint8 resize is fastest on.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        # torchvision 0.29 announces the move of its decoders to TorchCodec.
        warnings.filterwarnings("ignore", message=".*decoding and encoding capabilities.*")
        return decode_jpeg(
            torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB
        )


def grey_corner(image):
    """Whether the bottom-right pixel of ``image`` (``(3, H, W)``) is libjpeg's mid-grey, the
    colour it gives blocks past the end of a file's data."""
    return bool((image[:, -1, -1] == 128).all())


class WorkerSteps:
    """What a worker does to one image, from a preprocessing: resize, crop, uint8.

    Parameters
    ----------
    preprocessing : dict
        The extractor's resolved preprocessing (``resize``, ``crop``, ``interpolation``).
    resize : {"pil", "torch"}
    decode_jpegs : bool
        Decode the JPEGs the marker walk accepts with ``decode_jpeg`` (else Pillow).

    Examples
    --------
    >>> from PIL import Image
    >>> p = {"resize": 8, "crop": 8, "interpolation": "bicubic"}
    >>> WorkerSteps(p, "pil", True).from_pil(Image.new("RGB", (12, 10), "red")).shape
    torch.Size([3, 8, 8])
    """

    def __init__(self, preprocessing, resize, decode_jpegs):
        if resize not in ("pil", "torch"):
            raise ValueError(f"resize must be 'pil' or 'torch', got {resize!r}")
        self.size = preprocessing["resize"]
        self.crop = [int(preprocessing["crop"])]
        self.interpolation = preprocessing["interpolation"]
        self.resize = resize
        self.decode_jpegs = bool(decode_jpegs)

    def _resized(self, size):
        from .batched_resize import resized_size

        return resized_size(size, self.size)

    def from_pil(self, image):
        """An RGB PIL image's uint8 ``(3, crop, crop)`` pixels."""
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        if self.resize == "torch":
            pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)
            return self.from_tensor(pixels)
        size = self.size if isinstance(self.size, list) else [self.size]
        image = F.resize(image, size, interpolation=InterpolationMode(self.interpolation))
        image = F.center_crop(image, self.crop)
        # As torchvision's ToTensor lays the pixels out, before it scales them.
        return torch.from_numpy(np.array(image, np.uint8, copy=True)).permute(2, 0, 1).contiguous()

    def from_tensor(self, pixels):
        """A decoded ``(3, H, W)`` uint8 tensor's uint8 ``(3, crop, crop)`` pixels."""
        from torchvision.transforms import functional as F

        if self.resize == "pil":
            from PIL import Image

            return self.from_pil(Image.fromarray(pixels.permute(1, 2, 0).numpy()))
        size = self._resized(pixels.shape[-2:])
        if tuple(size) != tuple(pixels.shape[-2:]):
            mode = "nearest-exact" if self.interpolation == "nearest" else self.interpolation
            aa = {} if mode == "nearest-exact" else {"antialias": True}
            pixels = torch.nn.functional.interpolate(pixels[None], size=size, mode=mode, **aa)[0]
        return F.center_crop(pixels, self.crop).contiguous()


class WorkerImages(torch.utils.data.Dataset):
    """Items ``(index, uint8 pixels or None, reason)``, as :class:`ImageDataset`'s.

    ``reason`` is ``None``, the note of an image kept although its file stops early, or why
    the image could not be read (then there are no pixels).

    Parameters
    ----------
    pil : ImageDataset
        The dataset with ``steps.from_pil`` as its transform: Pillow's decoding, and its
        reasons, for everything ``decode_jpeg`` does not take.
    steps : WorkerSteps
    """

    def __init__(self, pil, steps):
        self.pil = pil
        self.steps = steps

    def __len__(self):
        return len(self.pil)

    def decoded_jpeg(self, index):
        """The ``decode_jpeg`` pixels of image ``index`` with its frame, or ``(None, frame)``
        when they are for Pillow to make."""
        if kind(self.pil.sources[index]) not in _ENCODED:
            return None, None
        try:
            data = self.pil.read_bytes(index)
        except Exception:  # noqa: BLE001 - the Pillow path reports it
            return None, None
        frame = jpeg_frame(data)
        if frame.refusal is not None:
            return None, frame
        try:
            pixels = decode_jpeg_cpu(data)
        except RuntimeError:
            return None, frame
        return (None if grey_corner(pixels) else pixels), frame

    def __getitem__(self, index):
        if self.steps.decode_jpegs:
            pixels, _ = self.decoded_jpeg(index)
            try:
                out = None if pixels is None else self.steps.from_tensor(pixels)
            except Exception:  # noqa: BLE001 - the Pillow path below reports it
                out = None
            if out is not None:
                return index, out, None
        return self.pil[index]


@functools.lru_cache(maxsize=1)
def reference_jpegs():
    """The JPEGs :func:`jpeg_decoder_agrees` decodes both ways: the real photos the package
    ships (baseline, one of them grey) as they are, and each again as Pillow writes it
    progressive, the two kinds of JPEG an ImageNet copy holds.

    Returns
    -------
    tuple of bytes
    """
    import importlib.resources
    import io

    from PIL import Image

    folder = importlib.resources.files("imagenet_cog").joinpath("data", "photos")
    shipped = sorted((p for p in folder.iterdir() if p.name.endswith(".jpg")), key=str)
    out = [p.read_bytes() for p in shipped]
    for data in list(out):
        with Image.open(io.BytesIO(data)) as image:
            buffer = io.BytesIO()
            image.save(buffer, "JPEG", quality=90, progressive=True)
        out.append(buffer.getvalue())
    return tuple(out)


def jpeg_decoder_agrees():
    """Whether ``decode_jpeg`` gives Pillow's pixels on :func:`reference_jpegs`.

    Both are libjpeg-turbo, so they agree when their builds do: a property of the two
    builds, checked before each run on the package's own JPEGs, so that no image of the copy
    is read out of its turn (a shard or row group read once stays read once).

    Returns
    -------
    dict
        ``images`` compared and ``max_abs_diff`` of their pixels (8-bit levels).

    Examples
    --------
    >>> found = jpeg_decoder_agrees()
    >>> found["images"]
    8
    """
    from .pillow_decode import decode_checked

    compared, worst = 0, 0
    for data in reference_jpegs():
        pixels = decode_jpeg_cpu(data)
        image, _ = decode_checked(data, "skip")
        theirs = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
        if theirs.shape != pixels.shape:
            worst = 255
        else:
            worst = max(worst, int((theirs.int() - pixels.int()).abs().max()))
        compared += 1
    return {"images": compared, "max_abs_diff": worst}


def scale_and_normalize(x, mean, std):
    """The network input from uint8 pixels ``x`` (``(n, 3, H, W)``, on the device): scaled to
    [0, 1] and normalized with the float32 operations of torchvision's ``ToTensor`` and
    ``Normalize`` (the same result, bit for bit), in place on one new tensor.

    Parameters
    ----------
    x : torch.Tensor
        uint8.
    mean, std : torch.Tensor or None
        float32 ``(1, 3, 1, 1)`` on ``x``'s device; ``None``: no normalization.

    Returns
    -------
    torch.Tensor
        float32.

    Examples
    --------
    >>> from torchvision import transforms
    >>> from PIL import Image
    >>> image = Image.new("RGB", (2, 2), (10, 200, 255))
    >>> mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    >>> theirs = transforms.Normalize(mean, std)(transforms.ToTensor()(image))
    >>> x = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None]
    >>> ours = scale_and_normalize(x, torch.tensor(mean).view(1, 3, 1, 1),
    ...                            torch.tensor(std).view(1, 3, 1, 1))
    >>> bool(torch.equal(ours[0], theirs))
    True
    """
    out = x.to(torch.float32).div_(255)
    if mean is not None:
        out = out.sub_(mean).div_(std)
    return out
