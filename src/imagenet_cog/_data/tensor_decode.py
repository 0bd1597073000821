"""The tensor path: baseline JPEGs decoded in batches on the device (nvJPEG on a GPU).

What :class:`imagenet_cog.FeatureExtractor` runs with ``decoder="torchvision"``:

* **in the DataLoader workers**, each image's bytes are read and walked (``jpeg_markers``):
  a baseline JPEG travels as its bytes, with its size from the frame header; the batch's
  bytes travel as one uint8 tensor with offsets. Progressive JPEGs (which nvJPEG decodes
  one at a time, in software) are decoded in the workers by ``decode_jpeg`` on the CPU, and
  everything the walk refuses (PNG named ``.JPEG``, CMYK, truncated files...) by Pillow, as
  the Pillow path does; both are resized there with Pillow's own resize and come as uint8
  pixels (``worker_images``);
* **on the device**, the batch's baseline JPEGs are decoded by one ``decode_jpeg`` call,
  resized and cropped together with Pillow's arithmetic (``batched_resize``, tap tables
  built on the host from the sizes the workers read), joined with the workers' pixels,
  scaled and normalized with the Pillow path's float32 operations.

A decoded JPEG whose bottom-right pixel is libjpeg's mid-grey (the grey a decoder fills in
where a file's data ran out) is decoded by Pillow too, which tells a file cut short from a
grey photo. So both paths keep the same images and note the same cut files, and on the CPU,
where ``decode_jpeg`` is libjpeg-turbo like Pillow, they give the same pixels. The first
images of a run are also run through the Pillow path and compared (:class:`TensorDecoder`).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import torch
import torch.utils.data

from .batched_resize import ResizePlan, resize_crop_batch, resized_size
from .jpeg_markers import jpeg_frame, jpeg_refusal
from .sources import FILE, PARQUET_IMAGE, TAR_MEMBER, kind
from .worker_images import decode_jpeg_cpu, grey_corner, scale_and_normalize

__all__ = [
    "CHECKED_IMAGES",
    "CHECK_WARN_MEAN",
    "EncodedImages",
    "TensorDecoder",
    "collate_encoded",
    "jpeg_refusal",
    "resized_size",
]

_ENCODED = (FILE, TAR_MEMBER, PARQUET_IMAGE)


class EncodedImages(torch.utils.data.Dataset):
    """Items for the tensor path's DataLoader workers.

    ``(index, "jpeg", bytes, (height, width))`` for a baseline JPEG the device decodes;
    ``(index, "pixels", uint8 pixels, note, fallback)`` for an image decoded here (a
    progressive JPEG by ``decode_jpeg``, anything else by Pillow: then ``fallback`` says
    why); ``(index, "failed", None, reason, None)`` for one that cannot be read.

    Parameters
    ----------
    images : WorkerImages
        The worker path with ``resize="pil"``: Pillow's resize, for the images decoded here.
    """

    def __init__(self, images):
        self.images = images

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        pil = self.images.pil
        why = None
        if kind(pil.sources[index]) in _ENCODED:
            try:
                data = pil.read_bytes(index)
            except Exception:  # noqa: BLE001 - the Pillow path below reports it
                data = None
            if data is not None:
                frame = jpeg_frame(data)
                why = frame.refusal
                if why is None and not frame.progressive:
                    return index, "jpeg", data, (frame.height, frame.width)
                if why is None and self.images.steps.decode_jpegs:
                    try:
                        pixels = decode_jpeg_cpu(data)
                    except RuntimeError as exc:
                        why = f"tensor decoder: {str(exc).rsplit(', ', 1)[-1].strip()}"
                    else:
                        if not grey_corner(pixels):  # else Pillow tells a cut file
                            return (
                                index,
                                "pixels",
                                self.images.steps.from_tensor(pixels),
                                None,
                                None,
                            )
        _, pixels, reason = pil[index]
        if pixels is None:
            return index, "failed", None, reason, None
        return index, "pixels", pixels, reason, why


def collate_encoded(items):
    """One batch of :class:`EncodedImages` items: the JPEGs' bytes as one uint8 tensor.

    Returns
    -------
    dict
        ``jpeg`` (indices), ``data`` (uint8, every JPEG's bytes end to end), ``offsets``
        (int64, ``len(jpeg) + 1``), ``sizes`` (``(height, width)`` of each); ``decoded``
        (indices) and ``pixels`` (uint8 ``(n, 3, crop, crop)`` or None); ``fallbacks``,
        ``notes`` and ``failed``: lists of ``(index, reason)``.
    """
    batch = {"jpeg": [], "sizes": [], "decoded": [], "fallbacks": [], "notes": [], "failed": []}
    datas, pixels = [], []
    for index, what, payload, extra, *rest in items:
        index = int(index)
        if what == "jpeg":
            batch["jpeg"].append(index)
            datas.append(payload)
            batch["sizes"].append(extra)
        elif what == "pixels":
            batch["decoded"].append(index)
            pixels.append(payload)
            if extra is not None:
                batch["notes"].append((index, extra))
            if rest[0] is not None:
                batch["fallbacks"].append((index, rest[0]))
        else:
            batch["failed"].append((index, extra))
    lengths = np.fromiter((len(d) for d in datas), np.int64, len(datas))
    batch["offsets"] = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]))
    batch["data"] = torch.frombuffer(bytearray(b"".join(datas)) or bytearray(1), dtype=torch.uint8)
    batch["pixels"] = torch.stack(pixels) if pixels else None
    return batch


def _decode(datas, device):
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        # torchvision 0.29 announces the move of its decoders to TorchCodec.
        warnings.filterwarnings("ignore", message=".*decoding and encoding capabilities.*")
        out = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
    return out if isinstance(out, list) else [out]


#: Images of the first batch that :class:`TensorDecoder` also runs through the Pillow path.
CHECKED_IMAGES = 4
#: Mean absolute difference from the Pillow path's input pixels (8-bit units) above
#: which :class:`TensorDecoder` warns. A sanity bound, not a measured tolerance: on
#: the CPU the difference is 0; a decoding error such as swapped channels gives tens.
CHECK_WARN_MEAN = 1.0


def _to_host(tensor):
    """``tensor`` on the host: a copy through pinned memory from CUDA, waited for on the
    current stream only (the caller's own, not the network's)."""
    if tensor.device.type != "cuda":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    return host


def _to_device(tensor, device):
    """A host ``tensor`` on ``device``, copied from pinned memory on CUDA."""
    if device.type == "cuda" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


class TensorDecoder:
    """Decode and preprocess collated batches on ``device``.

    The first decoded images of a run (:data:`CHECKED_IMAGES`) are also run through the
    Pillow path, on the CPU, and compared: :attr:`check` holds the largest and mean absolute
    difference of the network's input, in 8-bit units, and :attr:`warning` says so when the
    mean is over :data:`CHECK_WARN_MEAN` (for the caller to warn: this may run in a thread).

    Parameters
    ----------
    images : WorkerImages
        The worker path with Pillow's resize, for what the device does not decode.
    reference : ImageDataset
        The dataset with the Pillow path's float transform, for the check.
    preprocessing : dict
        The extractor's resolved preprocessing.
    device : torch.device
    """

    def __init__(self, images, reference, preprocessing, device):
        self.images = images
        self.reference = reference
        self.p = preprocessing
        self.device = torch.device(device)
        self.check = self.warning = None
        self._diffs = []
        self.mean = self.std = None
        if preprocessing["mean"] is not None:
            self.mean = torch.tensor(preprocessing["mean"]).view(1, 3, 1, 1).to(self.device)
            self.std = torch.tensor(preprocessing["std"]).view(1, 3, 1, 1).to(self.device)

    def _pillow(self, index, pixels, fallbacks, notes, failed, why):
        """Image ``index`` by the worker path (Pillow) into ``pixels``, or into ``failed``."""
        _, tensor, reason = self.images.pil[index]
        if tensor is None:
            failed.append((index, reason))
            return
        pixels[index] = tensor
        fallbacks.append((index, why))
        if reason is not None:
            notes.append((index, reason))

    def _decoded(self, batch, pixels, fallbacks, notes, failed):
        """``[(index, image, size)]`` of the batch's JPEGs that the device decoded."""
        offsets = batch["offsets"].tolist()  # a host tensor: no device involved
        datas = [batch["data"][a:b] for a, b in itertools.pairwise(offsets)]
        jobs = list(zip(batch["jpeg"], datas, batch["sizes"]))
        if not jobs:
            return []
        try:
            decoded = _decode(datas, self.device)
        except RuntimeError:  # one bad file fails the batch: retry one by one
            decoded = []
            for index, data, _ in jobs:
                try:
                    decoded.append(_decode([data], self.device)[0])
                except RuntimeError as exc:
                    reason = str(exc).rsplit(", ", 1)[-1].strip()
                    decoded.append(None)
                    self._pillow(
                        index, pixels, fallbacks, notes, failed, f"tensor decoder: {reason}"
                    )
        good = []
        for (index, _, size), image in zip(jobs, decoded):
            if image is None:
                continue
            if tuple(image.shape[-2:]) != tuple(int(s) for s in size):
                why = "tensor decoder: another size than the frame header's"
                self._pillow(index, pixels, fallbacks, notes, failed, why)
                continue
            good.append((index, image, size))
        return self._cut_short(good, pixels, fallbacks, notes)

    def _cut_short(self, good, pixels, fallbacks, notes):
        """Leave to Pillow the decoded images whose bottom-right pixel is libjpeg's grey."""
        if not good:
            return good
        corners = torch.stack([image[:, -1, -1] for _, image, _ in good])
        grey = _to_host((corners == 128).all(dim=1)).tolist()  # a few bytes, this stream
        kept = []
        for item, suspect in zip(good, grey):
            index = item[0]
            if not suspect:
                kept.append(item)
                continue
            _, tensor, note = self.images.pil[index]  # Pillow tells a cut file from a grey photo
            if tensor is None or note is None:
                kept.append(item)
                continue
            pixels[index] = tensor
            fallbacks.append((index, note))
            notes.append((index, note))
        return kept

    def _resize(self, images, plans):
        """The device's decoded images resized and cropped: uint8 ``(n, 3, crop, crop)``."""
        return resize_crop_batch(images, plans, self.device)

    def _check(self, indices, x, decoded):
        """Compare the first images the device decoded with the Pillow path's tensors, over
        as many batches as it takes (see the class docs)."""
        scale = torch.full((3, 1, 1), 255.0)
        if self.p["mean"] is not None:
            scale = scale * torch.tensor(self.p["std"]).view(3, 1, 1)
        checked = sorted(decoded)[: CHECKED_IMAGES - len(self._diffs)]
        rows = torch.tensor([indices.index(i) for i in checked], dtype=torch.int64)
        first = _to_host(x.index_select(0, _to_device(rows, self.device)))
        for k, index in enumerate(checked):
            _, reference, _ = self.reference[index]
            if reference is not None:
                self._diffs.append(((first[k] - reference) * scale).abs())
        if not self._diffs:
            return
        diff = torch.stack(self._diffs)
        self.check = {
            "images": len(self._diffs),
            "max_abs_diff": round(float(diff.max()), 3),
            "mean_abs_diff": round(float(diff.mean()), 4),
        }
        if self.check["mean_abs_diff"] > CHECK_WARN_MEAN:
            self.warning = (
                f"the tensor decoder's input pixels differ from the Pillow path's by "
                f"{self.check['mean_abs_diff']:.2f} on average (at most "
                f"{self.check['max_abs_diff']:.0f}, 8-bit units) on the first "
                f"{len(self._diffs)} image(s): its features will not match Pillow's; pass "
                "decoder='pil' and resize='pil' (--decoder pil --resize pil) for the official "
                "code's decoding and resize"
            )

    def __call__(self, batch):
        """``(indices, x or None, failed, fallbacks, notes)`` of one collated batch."""
        fallbacks, notes, failed = list(batch["fallbacks"]), list(batch["notes"]), []
        failed += batch["failed"]
        pixels = {}  # decoded on the host here: index -> uint8 pixels
        decoded = self._decoded(batch, pixels, fallbacks, notes, failed)
        order, parts = [], []
        if decoded:
            plans = [
                ResizePlan(size, self.p["resize"], self.p["crop"], self.p["interpolation"])
                for _, _, size in decoded
            ]
            parts.append(self._resize([image for _, image, _ in decoded], plans))
            order += [index for index, _, _ in decoded]
        if batch["pixels"] is not None:
            parts.append(_to_device(batch["pixels"], self.device))
            order += list(batch["decoded"])
        if pixels:
            parts.append(_to_device(torch.stack(list(pixels.values())), self.device))
            order += list(pixels)
        if not order:
            return torch.zeros(0, dtype=torch.int64), None, sorted(failed), sorted(fallbacks), []
        rows = torch.cat(parts) if len(parts) > 1 else parts[0]
        sort = np.argsort(order, kind="stable")
        if (sort != np.arange(len(sort))).any():
            rows = rows.index_select(0, _to_device(torch.from_numpy(sort), self.device))
        x = scale_and_normalize(rows, self.mean, self.std)
        indices = sorted(order)
        if len(self._diffs) < CHECKED_IMAGES and decoded:
            self._check(indices, x, [index for index, _, _ in decoded])
        return (
            torch.tensor(indices, dtype=torch.int64),
            x,
            sorted(failed),
            sorted(fallbacks),
            sorted(notes),
        )
