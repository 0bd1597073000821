"""A feature store's shards seen as one read-only array, memory-mapped shard by shard.

Imports nothing from the package, so every stage can use it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ShardedArray"]


class ShardedArray:
    """The shards of a store seen as one read-only ``(n, d)`` float32 array.

    Shards stay memory-mapped; indexing reads only the rows asked for.
    ``np.asarray(a)`` reads everything into memory.

    Parameters
    ----------
    shards : sequence of ndarray
        2-D arrays of the same width.
    dim : int
        The width, needed when there are no rows.

    Examples
    --------
    >>> import numpy as np
    >>> a = ShardedArray([np.arange(6.0).reshape(3, 2), np.arange(4.0).reshape(2, 2)], 2)
    >>> a.shape, a[3].tolist(), a[[4, 0]].tolist()
    ((5, 2), [0.0, 1.0], [[2.0, 3.0], [0.0, 1.0]])
    >>> np.asarray(a)[2:4, 0].tolist()
    [4.0, 0.0]
    """

    def __init__(self, shards, dim):
        self.shards = [s for s in shards if len(s)]
        self._offsets = np.cumsum([0] + [len(s) for s in self.shards])
        self.dim = int(dim)

    @property
    def shape(self):
        return (int(self._offsets[-1]), self.dim)

    @property
    def dtype(self):
        return np.dtype(np.float32)

    @property
    def ndim(self):
        return 2

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"ShardedArray(shape={self.shape}, shards={len(self.shards)})"

    def __array__(self, dtype=None, copy=None):
        if not self.shards:
            out = np.zeros((0, self.dim), dtype=np.float32)
        elif len(self.shards) == 1:
            out = np.array(self.shards[0])
        else:
            out = np.concatenate(self.shards)
        return out if dtype is None else out.astype(dtype, copy=False)

    def _rows(self, index):
        n = len(self)
        if isinstance(index, (int, np.integer)):
            i = int(index) + (n if index < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"row {index} out of range for {n} rows")
            k = int(np.searchsorted(self._offsets, i, side="right")) - 1
            return np.asarray(self.shards[k][i - self._offsets[k]])
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:  # a run of rows: copied shard by shard, no index arrays
                return self._run(start, max(start, stop))
            index = np.arange(n)[index]
        index = np.asarray(index)
        if index.dtype == bool:
            if index.shape != (n,):
                raise IndexError(f"boolean index of shape {index.shape} for {n} rows")
            index = np.flatnonzero(index)
        index = index.astype(np.int64, copy=False).ravel()
        index = np.where(index < 0, index + n, index)
        if index.size and (index.min() < 0 or index.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        out = np.empty((index.size, self.dim), dtype=np.float32)
        shard_of = np.searchsorted(self._offsets, index, side="right") - 1
        for k in np.unique(shard_of):
            sel = shard_of == k
            out[sel] = self.shards[k][index[sel] - self._offsets[k]]
        return out

    def _run(self, start, stop):
        """Rows ``start:stop`` as one new array, each shard's part sliced, not indexed."""
        out = np.empty((stop - start, self.dim), dtype=np.float32)
        k = max(0, int(np.searchsorted(self._offsets, start, side="right")) - 1)
        pos = start
        while pos < stop:
            first = pos - self._offsets[k]
            last = min(stop, self._offsets[k] + len(self.shards[k])) - self._offsets[k]
            out[pos - start : pos - start + last - first] = self.shards[k][first:last]
            pos += last - first
            k += 1
        return out

    def __getitem__(self, key):
        if isinstance(key, tuple):
            rows = self._rows(key[0])
            return rows[(Ellipsis, *key[1:])] if rows.ndim == 1 else rows[(slice(None), *key[1:])]
        return self._rows(key)
