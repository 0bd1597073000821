"""The JPEG marker walk: which files ``torchvision.io.decode_jpeg`` may take, and their size.

Both faster paths of the extraction decode JPEGs with ``torchvision.io.decode_jpeg`` (the
DataLoader workers on the CPU, or nvJPEG on the device) and leave everything else to Pillow.
The walk reads the marker structure of the bytes without decoding them: the frame header
gives the coding, the precision, the components and the size, and the segments must all lie
inside the data with an end-of-image marker after the last scan. It runs in the DataLoader
workers, so the host knows each image's size before any device decodes it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["JpegFrame", "jpeg_frame", "jpeg_refusal"]

#: Start-of-frame markers the tensor decoders read: baseline, extended, progressive.
_SOF_OK = {0xC0, 0xC1, 0xC2}
_PROGRESSIVE = 0xC2
#: Markers that carry no length field.
_STANDALONE = {0x01, 0xD8} | set(range(0xD0, 0xD8))
#: Why a JPEG whose bytes stop before its end-of-image marker goes to Pillow.
_ENDS_EARLY = "JPEG data ends before its end-of-image marker (truncated file)"
_MALFORMED = "malformed JPEG marker structure"


class JpegFrame(NamedTuple):
    """What the marker walk found: ``refusal`` (``None`` when ``decode_jpeg`` may take the
    file, else why not), and from the frame header ``height``, ``width``, ``components`` and
    whether the coding is ``progressive`` (0 where not read)."""

    refusal: str | None
    height: int = 0
    width: int = 0
    components: int = 0
    progressive: bool = False


def _frame(data, i):
    """The frame header (SOF segment) at ``data[i]``: a :class:`JpegFrame`."""
    from PIL import Image

    marker = data[i + 1]
    if marker not in _SOF_OK:
        return JpegFrame(f"JPEG coding SOF{marker - 0xC0} (lossless, hierarchical or arithmetic)")
    if i + 10 > len(data):
        return JpegFrame(_ENDS_EARLY)
    precision, components = data[i + 4], data[i + 9]
    height = int.from_bytes(data[i + 5 : i + 7], "big")
    width = int.from_bytes(data[i + 7 : i + 9], "big")
    facts = (height, width, components, marker == _PROGRESSIVE)
    if precision != 8:
        return JpegFrame(f"{precision}-bit JPEG", *facts)
    if components not in (1, 3):
        return JpegFrame(f"JPEG with {components} components (CMYK or YCCK)", *facts)
    if not height or not width:
        return JpegFrame("JPEG without its size in the frame header", *facts)
    # Pillow refuses images over twice its decompression-bomb limit: so must we.
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and height * width > 2 * limit:
        return JpegFrame("JPEG over Pillow's decompression-bomb limit", *facts)
    return JpegFrame(None, *facts)


def _skip_scan(data, i):
    """The position of the marker after the entropy-coded data from ``i``, or ``None``."""
    n = len(data)
    while True:
        i = data.find(b"\xff", i)
        if i < 0 or i + 1 >= n:
            return None
        following = data[i + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7:  # stuffed byte, restart
            i += 2
        elif following == 0xFF:  # fill byte before a marker
            i += 1
        else:
            return i


def jpeg_frame(data):
    """The marker walk of ``data``: a :class:`JpegFrame`.

    ``decode_jpeg`` may take 8-bit Huffman-coded JPEGs (baseline or progressive) with 1 or
    3 components whose marker structure is whole: every segment inside the data and an
    end-of-image marker after the last scan. Anything else goes to Pillow, which decodes or
    refuses it exactly as the Pillow path does. The check matters on the GPU: nvJPEG reads
    only the header and decodes a truncated file that Pillow refuses ("image file is
    truncated"), so without it the paths would keep different images. The entropy-coded
    data is skipped with ``bytes.find``, not decoded.

    Parameters
    ----------
    data : bytes or memoryview

    Returns
    -------
    JpegFrame

    Examples
    --------
    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO()
    >>> Image.new("RGB", (5, 4)).save(buf, "JPEG", progressive=True)
    >>> jpeg_frame(buf.getvalue())
    JpegFrame(refusal=None, height=4, width=5, components=3, progressive=True)
    """
    data = bytes(data) if isinstance(data, memoryview) else data
    if data[:3] != b"\xff\xd8\xff":
        return JpegFrame("not a JPEG file")
    i, n, frame, scan = 2, len(data), None, False
    while True:
        if i + 2 > n:
            return JpegFrame(_ENDS_EARLY)
        if data[i] != 0xFF:
            return JpegFrame(_MALFORMED)
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0xD9:  # end of image
            return frame if scan else JpegFrame(_MALFORMED)
        if marker in _STANDALONE:
            i += 2
            continue
        if i + 4 > n:
            return JpegFrame(_ENDS_EARLY)
        end = i + 2 + int.from_bytes(data[i + 2 : i + 4], "big")
        if end > n:
            return JpegFrame(_ENDS_EARLY)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if frame is not None:
                return JpegFrame("JPEG with more than one frame header")
            frame = _frame(data, i)
            if frame.refusal is not None:
                return frame
        elif marker == 0xDA:  # a scan: skip its entropy-coded data to the next marker
            if frame is None:
                return JpegFrame(_MALFORMED)
            scan, i = True, _skip_scan(data, end)
            if i is None:
                return JpegFrame(_ENDS_EARLY)
            continue
        i = end


def jpeg_refusal(data):
    """``None`` when ``decode_jpeg`` may take these bytes, else why not (see
    :func:`jpeg_frame`).

    Parameters
    ----------
    data : bytes or memoryview

    Returns
    -------
    str or None

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
    return jpeg_frame(data).refusal
