"""JPEG decoding with ``torchvision.io`` in batches, on the GPU (nvJPEG) or the CPU.

The tensor path of :class:`imagenet_cog.FeatureExtractor` (``decoder=
"torchvision"``): DataLoader workers only read the file bytes; the main
process decodes a whole batch with ``torchvision.io.decode_jpeg(list,
device=...)``, then, on that device, resizes the 8-bit pixels exactly as
Pillow does (``pillow_resize``), center-crops, scales to [0, 1]
and normalizes with the Pillow path's own float32 operations. Files the
tensor decoder should not take (PNG named ``.JPEG``, CMYK/YCCK JPEGs, 12-bit
or arithmetic-coded JPEGs, JPEGs whose data ends before the end-of-image
marker, or any file it raises on) are decoded with Pillow instead, exactly as
the Pillow path does: decoded and listed, or skipped when Pillow cannot
decode them either. A decoded JPEG whose bottom-right corner is mid-grey (the
grey libjpeg fills in where a file's data ran out) is decoded by Pillow too,
which tells a cut file from a grey photo. So both paths keep the same images,
note the same cut files, and on the CPU, where ``decode_jpeg`` is
libjpeg-turbo like Pillow, they give the same pixels.
"""

from __future__ import annotations

import warnings

import torch
import torch.utils.data

from .pillow_resize import pillow_resize
from .sources import FILE, TAR_MEMBER, kind

#: Start-of-frame markers the tensor decoders read: baseline, extended, progressive.
_SOF_OK = {0xC0, 0xC1, 0xC2}
#: Markers that carry no length field.
_STANDALONE = {0x01, 0xD8} | set(range(0xD0, 0xD8))


def _frame_refusal(data, i):
    """Why the frame header (SOF segment) at ``data[i]`` is not for the tensor path, or ``None``."""
    from PIL import Image

    marker = data[i + 1]
    if marker not in _SOF_OK:
        return f"JPEG coding SOF{marker - 0xC0} (lossless, hierarchical or arithmetic)"
    if i + 10 > len(data):
        return _ENDS_EARLY
    precision, components = data[i + 4], data[i + 9]
    if precision != 8:
        return f"{precision}-bit JPEG"
    if components not in (1, 3):
        return f"JPEG with {components} components (CMYK or YCCK)"
    height, width = (
        int.from_bytes(data[i + 5 : i + 7], "big"),
        int.from_bytes(data[i + 7 : i + 9], "big"),
    )
    if not height or not width:
        return "JPEG without its size in the frame header"
    # Pillow refuses images over twice its decompression-bomb limit: so must we.
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and height * width > 2 * limit:
        return "JPEG over Pillow's decompression-bomb limit"
    return None


#: Why a JPEG whose bytes stop before its end-of-image marker goes to Pillow.
_ENDS_EARLY = "JPEG data ends before its end-of-image marker (truncated file)"


def jpeg_refusal(data):
    """``None`` when the tensor decoders read these bytes, else why not.

    The tensor path takes 8-bit Huffman-coded JPEGs (baseline or
    progressive) with 1 or 3 components whose marker structure is whole:
    every segment inside the data and an end-of-image marker after the last
    scan. Anything else goes to Pillow, which decodes or refuses it exactly
    as the Pillow path does. The check matters on the GPU: nvJPEG reads only
    the header and decodes a truncated file that Pillow refuses ("image file
    is truncated"), so without it the two paths would keep different images.
    The entropy-coded data is skipped with ``bytes.find``, not decoded.

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
    >>> jpeg_refusal(encoded("RGB", "JPEG")[:-1])
    'JPEG data ends before its end-of-image marker (truncated file)'
    """
    data = bytes(data) if isinstance(data, memoryview) else data
    if data[:3] != b"\xff\xd8\xff":
        return "not a JPEG file"
    i, n, frame, scan = 2, len(data), False, False
    while True:
        if i + 2 > n:
            return _ENDS_EARLY
        if data[i] != 0xFF:
            return "malformed JPEG marker structure"
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0xD9:  # end of image
            return None if scan else "malformed JPEG marker structure"
        if marker in _STANDALONE:
            i += 2
            continue
        if i + 4 > n:
            return _ENDS_EARLY
        end = i + 2 + int.from_bytes(data[i + 2 : i + 4], "big")
        if end > n:
            return _ENDS_EARLY
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if frame:
                return "JPEG with more than one frame header"
            why = _frame_refusal(data, i)
            if why is not None:
                return why
            frame = True
        elif marker == 0xDA:  # a scan: skip its entropy-coded data to the next marker
            if not frame:
                return "malformed JPEG marker structure"
            scan, i = True, end
            while True:
                i = data.find(b"\xff", i)
                if i < 0 or i + 1 >= n:
                    return _ENDS_EARLY
                following = data[i + 1]
                if following == 0x00 or 0xD0 <= following <= 0xD7:  # stuffed byte, restart
                    i += 2
                elif following == 0xFF:  # fill byte before a marker
                    i += 1
                else:
                    break
            continue
        i = end


class EncodedImages(torch.utils.data.Dataset):
    """Items ``(index, jpeg bytes, tensor, fallback reason, error)`` for the DataLoader.

    A JPEG the tensor decoder reads comes as its bytes (a uint8 tensor) and is
    decoded later, in a batch. Any other image is decoded and transformed here
    by ``pil`` (an ``ImageDataset`` with the Pillow transform): ``tensor`` is
    the result, ``fallback reason`` says why when the source was a file, and
    ``error`` why it could not be read at all (beside a tensor: the note of a
    file kept although its data stops early).
    """

    def __init__(self, pil):
        self.pil = pil

    def __len__(self):
        return len(self.pil)

    def __getitem__(self, index):
        source = self.pil.sources[index]
        why = None
        if kind(source) in (FILE, TAR_MEMBER):  # encoded bytes of its own
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
    """Lists of the batch's encoded JPEGs, Pillow tensors, fallbacks, notes and failures."""
    batch = {"jpeg": [], "pil": [], "fallbacks": [], "notes": [], "failed": []}
    for index, data, tensor, why, error in items:
        if data is not None:
            batch["jpeg"].append((int(index), data))
        elif tensor is not None:
            batch["pil"].append((int(index), tensor))
            if why is not None:
                batch["fallbacks"].append((int(index), why))
            if error is not None:
                batch["notes"].append((int(index), error))
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


def resized_size(size, resize):
    """``(height, width)`` after torchvision's ``Resize(resize)`` of an image of ``size``.

    The shorter side becomes ``resize``, the longer ``int(resize * long / short)``,
    as torchvision computes it for PIL images and tensors alike.

    Examples
    --------
    >>> resized_size((375, 500), 224), resized_size((500, 375), 224)
    ((224, 298), (298, 224))
    """
    height, width = (int(v) for v in size)
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(resize * long / short)
    return (new_long, resize) if width <= height else (resize, new_long)


#: Images of the first batch that :class:`TensorDecoder` also runs through the Pillow path.
CHECKED_IMAGES = 4
#: Mean absolute difference from the Pillow path's input pixels (8-bit units) above
#: which :class:`TensorDecoder` warns. A sanity bound, not a measured tolerance: on
#: the CPU the difference is 0; a decoding error such as swapped channels gives tens.
CHECK_WARN_MEAN = 1.0


class TensorDecoder:
    """Decode and preprocess collated batches on ``device``.

    The first decoded images of a run (:data:`CHECKED_IMAGES`) are also run
    through the Pillow path, on the CPU, and compared: :attr:`check` holds the
    largest and mean absolute difference of the network's input, in 8-bit
    units, and a mean over :data:`CHECK_WARN_MEAN` warns.

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
        self.check = None
        if preprocessing["mean"] is not None:
            self.mean = torch.tensor(preprocessing["mean"], device=self.device).view(1, 3, 1, 1)
            self.std = torch.tensor(preprocessing["std"], device=self.device).view(1, 3, 1, 1)

    def _preprocess(self, images):
        from torchvision.transforms import functional as F

        resize, crop = self.p["resize"], [self.p["crop"]]
        out = []
        for image in images:
            # On uint8 pixels, exactly as the Pillow path's Resize, then its crop.
            x = pillow_resize(
                image, resized_size(image.shape[-2:], resize), self.p["interpolation"]
            )
            out.append(F.center_crop(x, crop))
        # ToTensor's scaling, then Normalize's arithmetic: the same float32 operations.
        x = torch.stack(out).to(torch.float32).div_(255)
        if self.p["mean"] is not None:
            x = x.sub_(self.mean).div_(self.std)
        return x

    def _check(self, indices, x):
        """Compare the first images with the Pillow path's tensors (see the class docs)."""
        scale = torch.full((3, 1, 1), 255.0)
        if self.p["mean"] is not None:
            scale = scale * torch.tensor(self.p["std"]).view(3, 1, 1)
        diffs = []
        for k, index in enumerate(indices[:CHECKED_IMAGES]):
            _, reference, _ = self.pil[index]
            if reference is not None:
                diffs.append(((x[k].cpu() - reference) * scale).abs())
        if not diffs:
            return
        diff = torch.stack(diffs)
        self.check = {
            "images": len(diffs),
            "max_abs_diff": round(float(diff.max()), 3),
            "mean_abs_diff": round(float(diff.mean()), 4),
        }
        if self.check["mean_abs_diff"] > CHECK_WARN_MEAN:
            warnings.warn(
                f"the tensor decoder's input pixels differ from the Pillow path's by "
                f"{self.check['mean_abs_diff']:.2f} on average (at most "
                f"{self.check['max_abs_diff']:.0f}, 8-bit units) on the first "
                f"{len(diffs)} image(s): its features will not match Pillow's; pass "
                "decoder='pil' (--decoder pil) for features comparable with the paper's",
                UserWarning,
                stacklevel=4,
            )

    def _cut_short(self, good, rows, fallbacks, notes):
        """Leave to Pillow the decoded images whose bottom-right corner is libjpeg's grey."""
        if not good:
            return good
        corners = torch.stack([image[:, -1, -1] for _, image in good])  # bottom-right pixel
        grey = (corners == 128).all(dim=1).tolist()  # one transfer for the batch
        kept = []
        for (index, image), suspect in zip(good, grey):
            if not suspect:
                kept.append((index, image))
                continue
            _, tensor, note = self.pil[index]  # Pillow tells a cut file from a grey photo
            if tensor is None or note is None:
                kept.append((index, image))
                continue
            rows[index] = tensor.to(self.device)
            fallbacks.append((index, note))
            notes.append((index, note))
        return kept

    def __call__(self, batch):
        """``(indices, x or None, failed, fallbacks, notes)`` of one collated batch."""
        rows = {}
        fallbacks = list(batch["fallbacks"])
        notes = list(batch["notes"])
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
                            if error is not None:
                                notes.append((index, error))
            good = self._cut_short(good, rows, fallbacks, notes)
            if good:
                x = self._preprocess([image for _, image in good])
                rows.update({index: x[k] for k, (index, _) in enumerate(good)})
                if self.check is None:
                    self._check([index for index, _ in good], x)
        for index, tensor in batch["pil"]:
            rows[index] = tensor.to(self.device, non_blocking=True)
        indices = sorted(rows)
        x = torch.stack([rows[i] for i in indices]) if indices else None
        indices = torch.tensor(indices, dtype=torch.int64)
        return indices, x, sorted(failed), sorted(fallbacks), sorted(notes)
