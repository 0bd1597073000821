"""What the first stage defines for every later one: what a wnid looks like, which files are
images, the files shipped in the package's ``data/`` folder, the checksum of a list of names, and
a vectorised range helper for the taxonomy's sparse tables.

Taxonomy stage (the first); imports nothing from the package.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources

import numpy as np

__all__ = ["IMAGE_SUFFIXES", "WNID_RE", "concat_ranges", "data_path", "names_checksum"]

#: A WordNet noun synset id: ``n`` and the 8-digit synset offset.
WNID_RE = re.compile(r"^n\d{8}$")
#: File endings read as images (compared in lower case).
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


def data_path(name):
    """A file shipped in the package's ``data/`` folder (see ``data/PROVENANCE.rst``)."""
    return resources.files("imagenet_cog").joinpath("data", name)


def names_checksum(names):
    """sha256 of the sorted, distinct names joined by newlines: a list's contents, not its order.

    The checksum of a domain's concepts (its labels) and of a split's image ids.

    Examples
    --------
    >>> names_checksum(["n2", "n1", "n2"]) == names_checksum(["n1", "n2"])
    True
    """
    # A list of a million ids is hashed as it is: no fixed-width numpy copy of it.
    values = names if isinstance(names, (list, tuple)) else np.asarray(names).ravel().tolist()
    unique = sorted({str(x) for x in values})
    return hashlib.sha256("\n".join(unique).encode("utf-8")).hexdigest()


def concat_ranges(starts, ends):
    """Concatenation of ``arange(s, e)`` for each pair, without a Python loop.

    Examples
    --------
    >>> concat_ranges(np.array([0, 5]), np.array([2, 8])).tolist()
    [0, 1, 5, 6, 7]
    """
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(total) + offsets
