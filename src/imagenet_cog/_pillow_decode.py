"""Decoding image bytes with Pillow: to RGB, from more than 8 bits, and truncated files.

Stage "datasets": what ``datasets.decode_image`` and the image datasets
run. A truncated file is decoded as the official code's loader decodes it (Pillow with
``LOAD_TRUNCATED_IMAGES``, set for that decode only), and a JPEG cut short but closed by an
end-of-image marker, which libjpeg decodes partly grey without an error, is told apart.
Imports nothing of the package.
"""

from __future__ import annotations

import io
import re
import threading
import warnings
from contextlib import contextmanager, nullcontext

__all__ = ["CUT_SHORT", "TRUNCATED_POLICIES", "decode_checked", "short_reason"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def short_reason(exc):
    """A short, reproducible reason: no memory addresses, no absolute paths."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{type(exc).__name__}: {exc.strerror}"
    return f"{type(exc).__name__}: {_ADDRESS.sub('', str(exc))}"


def _to_8bit(image):
    """An ``"L"`` image from a 16-bit, 32-bit integer or float one, scaled, not clipped.

    PIL's own conversion clips (a 16-bit image turns white, a float one black).
    """
    import numpy as np
    from PIL import Image

    a = np.asarray(image)
    if image.mode.startswith("I;16"):
        low, high = 0.0, 65535.0
    elif image.mode.startswith("I"):
        low, high = (0.0, 65535.0) if a.min() >= 0 and a.max() <= 65535 else (a.min(), a.max())
    else:
        if not np.isfinite(a).all():
            raise ValueError(f"a {image.mode} image with non-finite pixel values")
        low, high = (0.0, 1.0) if a.min() >= 0 and a.max() <= 1 else (a.min(), a.max())
    scale = 255.0 / (float(high) - float(low)) if high > low else 0.0
    out = np.rint((a.astype(np.float64) - float(low)) * scale)
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8), mode="L")


#: What is done with an image file whose data stops early ("image file is truncated"):
#: ``"keep"`` decodes it as the official code's loader does (Pillow with
#: ``LOAD_TRUNCATED_IMAGES``: the missing part grey), ``"skip"`` sets it aside.
TRUNCATED_POLICIES = ("keep", "skip")
#: Bytes put before a JPEG's end-of-image marker to tell whether its data stopped early
#: (they change the pixels only where the decoder had run out of data). No 0xFF in them.
_PROBE_FILL = bytes(range(1, 255)) * 4

_TRUNCATED_LOCK = threading.Lock()


@contextmanager
def _load_truncated():
    """Pillow's ``LOAD_TRUNCATED_IMAGES`` while one decode runs, then its former value.

    Never left set for the process: only this decode of a file that failed without it
    sees it (the lock keeps two of our threads from restoring it under each other).
    """
    from PIL import ImageFile

    with _TRUNCATED_LOCK:
        before = ImageFile.LOAD_TRUNCATED_IMAGES
        ImageFile.LOAD_TRUNCATED_IMAGES = True
        try:
            yield
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = before


def _open(data, lenient=False):
    """Decode ``data`` fully with Pillow (its warnings silenced), in its own mode."""
    from PIL import Image

    with warnings.catch_warnings(), _load_truncated() if lenient else nullcontext():
        warnings.simplefilter("ignore")
        image = Image.open(io.BytesIO(data))
        image.load()
    return image


def _to_rgb(image):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if image.mode.startswith(("I", "F")):
            image = _to_8bit(image)
        if image.mode == "P" and "transparency" in image.info:
            image = image.convert("RGBA")
        if image.mode != "RGB":
            image = image.convert("RGB")
    return image


#: The note of a JPEG whose last blocks libjpeg decoded grey, its data having run out.
CUT_SHORT = "JPEG data ends before the image's last blocks (decoded grey, as libjpeg does)"


def _jpeg_cut_short(data, image):
    """Whether libjpeg ran out of ``data`` before the last blocks of ``image`` (its decode).

    Such a file (cut, then closed by an end-of-image marker, or with zeroed data) decodes
    with no error: the blocks after the cut are mid-grey. A grey bottom-right corner is
    only a hint (a photo may end in grey); the proof is that bytes put before the marker
    change the pixels, which they never do once every block has been decoded.
    """
    if data[:3] != b"\xff\xd8\xff" or image.mode not in ("L", "RGB"):
        return False
    width, height = image.size
    corner = image.crop((max(0, width - 2), max(0, height - 2), width, height))
    if set(corner.tobytes()) != {128}:
        return False
    end = data.rfind(b"\xff\xd9")
    if end < 0:
        return False
    try:
        probe = _open(data[:end] + _PROBE_FILL + data[end:])
    except Exception:  # noqa: BLE001 - a whole file would have decoded the same
        return True
    return probe.tobytes() != image.tobytes()


def decode_checked(data, truncated="skip"):
    """``(image, note)``: ``data`` decoded to RGB, and ``None`` or why the image holds a
    part that was not in the file. ``truncated``: ``"keep"`` decodes a truncated file as the
    official code's loader does, ``"skip"`` or ``"raise"`` raises (see
    ``datasets.decode_image``)."""
    if truncated not in (*TRUNCATED_POLICIES, "raise"):
        raise ValueError(f"truncated must be one of {TRUNCATED_POLICIES}, got {truncated!r}")
    try:
        image = _open(data)
    except OSError as exc:
        if truncated != "keep":
            raise
        try:  # the official loader's decode: what the file holds, the rest grey
            image = _open(data, lenient=True)
        except Exception:  # noqa: BLE001 - not a truncation: the first error says why
            raise exc from None
        return _to_rgb(image), short_reason(exc)
    note = CUT_SHORT if _jpeg_cut_short(data, image) else None
    return _to_rgb(image), note
