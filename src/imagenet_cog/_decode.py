"""JPEG decoding with ``torchvision.io`` in batches, on the GPU (nvJPEG) or the CPU.

The tensor path of :class:`imagenet_cog.FeatureExtractor` (``decoder=
"torchvision"``): DataLoader workers only read the file bytes; the main
process decodes a whole batch with ``torchvision.io.decode_jpeg(list,
device=...)``, then resizes (shorter side to S, antialiased), center-crops,
scales and normalizes on that device. Files the tensor decoder cannot take
(PNG named ``.JPEG``, CMYK/YCCK JPEGs, 12-bit or arithmetic-coded JPEGs, or
any file it raises on) are decoded with Pillow instead, exactly as the Pillow
path does, and listed.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.utils.data

from .datasets import TarMember

#: Start-of-frame markers the tensor decoders read: baseline, extended, progressive.
_SOF_OK = {0xC0, 0xC1, 0xC2}
#: Markers that carry no length field.
_STANDALONE = {0x01, 0xD8} | set(range(0xD0, 0xD8))


def jpeg_refusal(data):
    """``None`` when the tensor decoders read these bytes, else why not.

    Only the JPEG header is parsed (up to the start-of-frame segment): 8-bit
    Huffman-coded JPEGs (baseline or progressive) with 1 or 3 components go
    to the tensor decoder; anything else to Pillow.

    Examples
    --------
    >>> import io
    >>> from PIL import Image
    >>> def encoded(mode, fmt):
    ...     buf = io.BytesIO()
    ...     Image.new(mode, (4, 4)).save(buf, fmt)
    ...     return buf.getvalue()
    >>> jpeg_refusal(encoded("RGB", "JPEG")) is None, jpeg_refusal(encoded("L", "JPEG")) is None
    (True, True)
    >>> jpeg_refusal(encoded("CMYK", "JPEG"))
    'JPEG with 4 components (CMYK or YCCK)'
    >>> jpeg_refusal(encoded("RGB", "PNG"))
    'not a JPEG file'
    """
    if data[:3] != b"\xff\xd8\xff":
        return "not a JPEG file"
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return "malformed JPEG header"
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _STANDALONE:
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if marker not in _SOF_OK:
                return f"JPEG coding SOF{marker - 0xC0} (lossless, hierarchical or arithmetic)"
            if i + 10 > n:
                return "malformed JPEG header"
            precision, components = data[i + 4], data[i + 9]
            if precision != 8:
                return f"{precision}-bit JPEG"
            if components not in (1, 3):
                return f"JPEG with {components} components (CMYK or YCCK)"
            return None
        if marker == 0xDA:  # scan data before any frame header
            return "malformed JPEG header"
        i += 2 + length
    return "malformed JPEG header"


class EncodedImages(torch.utils.data.Dataset):
    """Items ``(index, jpeg bytes, tensor, fallback reason, error)`` for the DataLoader.

    A JPEG the tensor decoder reads comes as its bytes (a uint8 tensor) and is
    decoded later, in a batch. Any other image is decoded and transformed here
    by ``pil`` (an ``ImageDataset`` with the Pillow transform): ``tensor`` is
    the result, ``fallback reason`` says why when the source was a file, and
    ``error`` why it could not be read at all.
    """

    def __init__(self, pil):
        self.pil = pil

    def __len__(self):
        return len(self.pil)

    def __getitem__(self, index):
        source = self.pil.sources[index]
        why = None
        if isinstance(source, (str, os.PathLike, TarMember)):
            try:
                data = self.pil.read_bytes(index)
            except Exception:  # noqa: BLE001 - the Pillow path below reports it
                data = None
            if data is not None:
                why = jpeg_refusal(data)
                if why is None:
                    return (
                        index,
                        torch.frombuffer(bytearray(data), dtype=torch.uint8),
                        None,
                        None,
                        None,
                    )
        _, tensor, error = self.pil[index]
        return index, None, tensor, why if tensor is not None else None, error


def collate_encoded(items):
    """Lists of the batch's encoded JPEGs, Pillow tensors, fallbacks and failures."""
    batch = {"jpeg": [], "pil": [], "fallbacks": [], "failed": []}
    for index, data, tensor, why, error in items:
        if data is not None:
            batch["jpeg"].append((int(index), data))
        elif tensor is not None:
            batch["pil"].append((int(index), tensor))
            if why is not None:
                batch["fallbacks"].append((int(index), why))
        else:
            batch["failed"].append((int(index), error))
    return batch


def _decode(datas, device):
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        # torchvision 0.29 announces the move of its decoders to TorchCodec.
        warnings.filterwarnings("ignore", message=".*decoding and encoding capabilities.*")
        out = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
    return out if isinstance(out, list) else [out]


class TensorDecoder:
    """Decode and preprocess collated batches on ``device``.

    Parameters
    ----------
    pil : ImageDataset
        The dataset with the Pillow transform, for the fallbacks.
    preprocessing : dict
        The extractor's resolved preprocessing.
    device : torch.device
    """

    def __init__(self, pil, preprocessing, device):
        self.pil = pil
        self.p = preprocessing
        self.device = torch.device(device)
        if preprocessing["mean"] is not None:
            self.mean = torch.tensor(preprocessing["mean"], device=self.device).view(1, 3, 1, 1)
            self.std = torch.tensor(preprocessing["std"], device=self.device).view(1, 3, 1, 1)

    def _preprocess(self, images):
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        mode = InterpolationMode(self.p["interpolation"])
        out = []
        for image in images:
            x = F.resize(
                image.float(),
                [self.p["resize"]],
                interpolation=mode,
                antialias=mode != InterpolationMode.NEAREST,
            )
            out.append(F.center_crop(x, [self.p["crop"]]))
        # Round like Pillow's 8-bit output, then scale to [0, 1].
        x = torch.stack(out).clamp_(0, 255).round_().div_(255)
        if self.p["mean"] is not None:
            x = (x - self.mean) / self.std
        return x

    def __call__(self, batch):
        """``(indices, x or None, failed, fallbacks)`` of one collated batch."""
        rows = {}
        fallbacks = list(batch["fallbacks"])
        failed = list(batch["failed"])
        jpegs = batch["jpeg"]
        if jpegs:
            try:
                decoded = _decode([d for _, d in jpegs], self.device)
                good = list(zip([i for i, _ in jpegs], decoded))
            except RuntimeError:  # one bad file fails the batch: retry one by one
                good = []
                for index, data in jpegs:
                    try:
                        good.append((index, _decode([data], self.device)[0]))
                    except RuntimeError as exc:
                        _, tensor, error = self.pil[index]
                        if tensor is None:
                            failed.append((index, error))
                        else:
                            rows[index] = tensor.to(self.device)
                            reason = str(exc).rsplit(", ", 1)[-1].strip()
                            fallbacks.append((index, f"tensor decoder: {reason}"))
            if good:
                x = self._preprocess([image for _, image in good])
                rows.update({index: x[k] for k, (index, _) in enumerate(good)})
        for index, tensor in batch["pil"]:
            rows[index] = tensor.to(self.device, non_blocking=True)
        indices = sorted(rows)
        x = torch.stack([rows[i] for i in indices]) if indices else None
        return torch.tensor(indices, dtype=torch.int64), x, sorted(failed), sorted(fallbacks)
