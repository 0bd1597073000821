"""The labels of the ImageNet-1K validation images, whose file names carry no wnid.

A flat ``val/`` folder is labelled by a label file (the bundled ILSVRC-2012 labels by
default), and so is a sample of a copy whose key is an ImageNet-1K validation file's stem.
"""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

from .._base import WNID_RE, data_path

__all__ = ["bundled_val_labels", "read_val_labels"]


def read_val_labels(path=None):
    """Read an ImageNet-1K validation label file.

    Parameters
    ----------
    path : path, optional
        Lines of ``file<TAB>wnid`` (tab, comma or spaces; ``#`` comments and a
        header line are allowed; ``.gz`` is read compressed). Defaults to the
        bundled labels of the 50,000 ILSVRC-2012 validation images.

    Returns
    -------
    dict
        ``{file name: wnid}``.

    Examples
    --------
    >>> labels = read_val_labels()
    >>> len(labels), labels["ILSVRC2012_val_00000001.JPEG"]
    (50000, 'n01751748')
    """
    if path is None:
        raw = data_path("imagenet1k_val_labels.tsv.gz").read_bytes()
        name = "the bundled imagenet1k_val_labels.tsv.gz"
    else:
        raw = Path(path).read_bytes()
        name = str(path)
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    labels = {}
    for n, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2 or not WNID_RE.match(parts[1]):
            if not labels:
                continue  # a header line
            raise ValueError(f"{name}:{n}: expected 'file wnid', got {line!r}")
        labels[os.path.basename(parts[0])] = parts[1]
    if not labels:
        raise ValueError(f"{name}: no 'file wnid' lines")
    return labels


@functools.lru_cache(maxsize=1)
def bundled_val_labels():
    """``{file name: wnid}`` of the 50,000 ILSVRC-2012 validation images, read once
    (shared: not to be changed)."""
    return read_val_labels()
