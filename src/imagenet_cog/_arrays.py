"""Small vectorised numpy helpers shared by the taxonomy, the measures and the analyses.

Imports nothing from the package.
"""

from __future__ import annotations

import numpy as np

__all__ = ["concat_ranges"]


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
