"""Cosine k nearest neighbours in blocks, on the GPU or the CPU, in memory bounded by a plan.

The similarity of a query row q and a training row x is their cosine: both are l2-normalised
(a row of zeros stays zero, so its similarity to every row is 0, as scikit-learn's
``normalize`` leaves it) and multiplied. No query × training matrix is ever held whole
(:func:`plan_neighbors` sizes everything):

* the queries are taken in *groups* that stay on the device with their running top-k;
* the training rows pass in *blocks*, each moved and normalised once per group;
* each product of a query block and a training block is reduced to its top-k at once and
  merged into the running top-k of those queries.

**Order and ties.** The neighbours of a row are ordered by similarity, highest first, and
equal similarities by training row, lowest first. The selection is exact under that order: a
block whose k-th and (k+1)-th similarities are equal is sorted whole (stably), and each merge
sorts the running and the new candidates by (similarity, row). So which rows are neighbours
depends only on the similarities computed, not on the blocks.

**Self-check.** After each search a few query rows are checked on the host in float64: the
similarities returned for their neighbours, their order, and that no row of a strided sample
of the training set is more similar than the k-th neighbour. A search that fails the check
(on a GPU: a library or driver fault) warns and runs again on the CPU; one that fails there
too raises.

Imports nothing from the package but the training wing's device helpers.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import torch

from .._device import default_budget, matmul_precision

__all__ = [
    "CHECK_ROWS",
    "NeighborPlan",
    "cosine_topk",
    "plan_neighbors",
]

#: Query rows the self-check recomputes in float64 on the host.
CHECK_ROWS = 8
#: Training rows of the self-check's strided sample (beside each row's neighbours).
_CHECK_SAMPLE = 4096
#: Similarity tolerance of the self-check: float32 products, and TF32 ones (10-bit mantissa).
_CHECK_TOL = {"float64": 1e-9, "float32": 1e-4, "tf32": 1e-2}
#: Rows of one product on each kind of device: large enough to keep a GPU busy, small enough
#: on a CPU to stay in its caches.
_QUERY_BLOCK = {"cuda": 8192, "cpu": 1024}
_KEY_BLOCK = {"cuda": 65536, "cpu": 32768}
#: The most bytes of products (and their top-k buffers) held at once when no budget is given
#: off CUDA; CUDA takes :func:`default_budget`.
_HOST_WORKSPACE = 1 << 29


@dataclasses.dataclass(frozen=True)
class NeighborPlan:
    """How one neighbour search is cut, and what it costs.

    Attributes
    ----------
    n_queries, n_keys, n_features, k : int
        The search: ``n_queries`` rows against ``n_keys`` training rows of ``n_features``,
        ``k`` neighbours each.
    query_group : int
        Queries held on the device with their running top-k; the training rows are read
        once per group.
    query_block, key_block : int
        Rows of one product: ``query_block × key_block`` similarities at a time.
    element_bytes : int
        Bytes of one feature on the device.
    device : str
    """

    n_queries: int
    n_keys: int
    n_features: int
    k: int
    query_group: int
    query_block: int
    key_block: int
    element_bytes: int
    device: str

    @property
    def n_groups(self):
        """Query groups, hence passes over the training rows."""
        return max(1, math.ceil(self.n_queries / self.query_group))

    @property
    def flop(self):
        """Floating-point operations of the products (the rest is small beside them)."""
        return 2 * self.n_queries * self.n_keys * self.n_features

    @property
    def peak_bytes(self):
        """Bytes on the device at once: a group's queries and running top-k, a training
        block, and one product with its top-k and merge buffers."""
        e, k = self.element_bytes, self.k
        group = self.query_group * (self.n_features * e + k * (e + 8))
        block = self.key_block * self.n_features * e
        product = 2 * self.query_block * self.key_block * e  # the product and topk's copy
        merge = 4 * self.query_block * (2 * k + 1) * (e + 8)
        return group + block + product + merge


def plan_neighbors(
    n_queries, n_keys, n_features, k, *, device, dtype=torch.float32, memory_budget=None
):
    """The :class:`NeighborPlan` of a search on ``device`` (a resolved ``torch.device``).

    ``memory_budget`` bounds :attr:`NeighborPlan.peak_bytes`; ``None``: 60% of the free
    CUDA memory on CUDA, a few hundred MB of products elsewhere (the rows are read from
    where they are).

    Examples
    --------
    >>> import torch
    >>> plan = plan_neighbors(50_000, 1_281_167, 2048, 200, device=torch.device("cpu"))
    >>> plan.n_groups, plan.query_block, plan.key_block
    (1, 1024, 32768)
    >>> f"{plan.flop:.2e}"
    '2.62e+14'
    """
    for name, value in (("n_queries", n_queries), ("n_keys", n_keys), ("n_features", n_features)):
        if value < 1:
            raise ValueError(f"a neighbour search needs {name} >= 1, got {value}")
    if not 1 <= k <= n_keys:
        raise ValueError(f"k must be in [1, {n_keys}] (the training rows), got {k}")
    kind = "cuda" if device.type == "cuda" else "cpu"
    e = torch.empty((), dtype=dtype).element_size()
    if memory_budget is None:
        budget = default_budget(device) if kind == "cuda" else None
    else:
        budget = int(memory_budget)
    query_block = min(n_queries, _QUERY_BLOCK[kind])
    key_block = min(n_keys, _KEY_BLOCK[kind])
    group = n_queries
    if budget is None:  # host memory: bound the products only
        while 2 * query_block * key_block * e > _HOST_WORKSPACE and key_block > k + 1:
            key_block = max(k + 1, key_block // 2)
        return NeighborPlan(
            n_queries, n_keys, n_features, k, group, query_block, key_block, e, str(device)
        )

    def plan(group, qb, kb):
        return NeighborPlan(n_queries, n_keys, n_features, k, group, qb, kb, e, str(device))

    # Shrink what costs the most first: the products, then the group, down to one row each.
    while plan(group, query_block, key_block).peak_bytes > budget:
        p = plan(group, query_block, key_block)
        product = 2 * query_block * key_block * e
        held = p.peak_bytes - product
        if product >= held and key_block > max(k + 1, 256):
            key_block = max(k + 1, 256, key_block // 2)
        elif product >= held and query_block > 1:
            query_block = max(1, query_block // 2)
        elif group > query_block:
            group = max(query_block, group // 2)
        elif key_block > k + 1:
            key_block = max(k + 1, key_block // 2)
        elif query_block > 1:
            query_block = group = max(1, query_block // 2)
        else:
            raise ValueError(
                f"memory_budget={budget} bytes cannot hold one query row's search "
                f"({p.peak_bytes} bytes for k={k} and {n_features} features): raise "
                "memory_budget"
            )
    return plan(group, query_block, key_block)


def _rows(array, start, stop, rows):
    """Rows ``start:stop`` of ``array`` (or of ``array[rows]``) as a tensor."""
    if rows is not None:
        picked = rows[start:stop]
        if isinstance(array, torch.Tensor):
            block = array[torch.as_tensor(picked, device=array.device)]
        else:
            block = array[picked]
    else:
        block = array[start:stop]
    return (
        block if isinstance(block, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(block))
    )


def _on_device(block, device, dtype):
    """A block moved to ``device`` in ``dtype`` and l2-normalised (zero rows stay zero)."""
    block = block.to(device=device, dtype=dtype, non_blocking=True)
    return torch.nn.functional.normalize(block, dim=1)


def _block_topk(sims, k):
    """``(values, columns)`` of each row's ``k`` largest similarities, exact under the order
    (similarity descending, column ascending)."""
    n_cols = sims.shape[1]
    if n_cols <= k:
        cols = torch.arange(n_cols, device=sims.device).expand(sims.shape[0], n_cols)
        return sims, cols
    values, cols = torch.topk(sims, k + 1, dim=1)
    tied = values[:, k - 1] == values[:, k]
    values, cols = values[:, :k], cols[:, :k]
    if bool(tied.any()):  # which of the tied columns topk kept is unspecified: sort those rows
        rows = tied.nonzero().squeeze(1)
        whole = torch.sort(sims[rows], dim=1, descending=True, stable=True)
        values[rows], cols[rows] = whole.values[:, :k], whole.indices[:, :k]
    return values, cols


def _merge(best, best_rows, values, rows, k):
    """The ``k`` first of both candidate lists by (similarity descending, row ascending)."""
    values = torch.cat([best, values], dim=1)
    rows = torch.cat([best_rows, rows], dim=1)
    by_row = torch.argsort(rows, dim=1)
    values, rows = values.gather(1, by_row), rows.gather(1, by_row)
    order = torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]
    return values.gather(1, order), rows.gather(1, order)


def _search(queries, keys, k, plan, device, dtype, key_rows, tf32, progress):
    n_q, n_k = plan.n_queries, plan.n_keys
    out_values = np.empty((n_q, k), dtype=np.float64 if dtype == torch.float64 else np.float32)
    out_rows = np.empty((n_q, k), dtype=np.int64)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=plan.n_groups * math.ceil(n_k / plan.key_block),
            desc=progress if isinstance(progress, str) else "k-NN",
            unit="block",
            leave=False,
        )
    try:
        with torch.inference_mode(), matmul_precision(device, tf32):
            for g0 in range(0, n_q, plan.query_group):
                g1 = min(n_q, g0 + plan.query_group)
                Q = _on_device(_rows(queries, g0, g1, None), device, dtype)
                best = torch.full((g1 - g0, k), -math.inf, device=device, dtype=dtype)
                best_rows = torch.full((g1 - g0, k), -1, device=device, dtype=torch.int64)
                for k0 in range(0, n_k, plan.key_block):
                    k1 = min(n_k, k0 + plan.key_block)
                    K = _on_device(_rows(keys, k0, k1, key_rows), device, dtype)
                    for q0 in range(0, g1 - g0, plan.query_block):
                        q1 = min(g1 - g0, q0 + plan.query_block)
                        values, cols = _block_topk(Q[q0:q1] @ K.T, k)
                        best[q0:q1], best_rows[q0:q1] = _merge(
                            best[q0:q1], best_rows[q0:q1], values, cols + k0, k
                        )
                    if bar is not None:
                        bar.update(1)
                out_values[g0:g1] = best.cpu().numpy()
                out_rows[g0:g1] = best_rows.cpu().numpy()
    finally:
        if bar is not None:
            bar.close()
    return out_values, out_rows


def _host_rows(array, index, key_rows=None):
    """Rows ``index`` of ``array`` (or of ``array[key_rows]``) in float64 on the host."""
    index = np.asarray(index)
    if key_rows is not None:
        index = np.asarray(key_rows)[index]
    if isinstance(array, torch.Tensor):
        return array[torch.as_tensor(index, device=array.device)].double().cpu().numpy()
    return np.asarray(array[index], dtype=np.float64)


def _unit(rows):
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)


def check_neighbors(queries, keys, values, rows, *, key_rows=None, tol=1e-4):
    """Why the neighbours of a few query rows are wrong, or None: their similarities against
    float64 on the host, their order, and a strided sample of the training rows, none of which
    may be more similar than the k-th neighbour."""
    n_q, k = rows.shape
    n_k = len(key_rows) if key_rows is not None else len(keys)
    picked = np.unique(np.linspace(0, n_q - 1, min(CHECK_ROWS, n_q)).round().astype(np.int64))
    sample = np.unique(np.linspace(0, n_k - 1, min(_CHECK_SAMPLE, n_k)).round().astype(np.int64))
    Q = _unit(_host_rows(queries, picked))
    S = _unit(_host_rows(keys, sample, key_rows))
    for i, q in zip(picked, Q):
        if rows[i].min() < 0 or rows[i].max() >= n_k or len(set(rows[i].tolist())) != k:
            return f"query row {i}: neighbour rows outside the training set or repeated"
        exact = _unit(_host_rows(keys, rows[i], key_rows)) @ q
        err = float(np.abs(exact - values[i]).max())
        if err > tol:
            return f"query row {i}: similarities off by {err:.3g} from float64"
        if np.any(np.diff(values[i]) > tol):
            return f"query row {i}: neighbours not in decreasing similarity"
        others = np.setdiff1d(sample, rows[i])
        if others.size:
            sims = S[np.searchsorted(sample, others)] @ q
            if float(sims.max()) > float(exact.min()) + tol:
                j = int(others[sims.argmax()])
                return (
                    f"query row {i}: training row {j} (similarity {sims.max():.6f}) is more "
                    f"similar than its k-th neighbour ({exact.min():.6f})"
                )
    return None


def cosine_topk(
    queries,
    keys,
    k,
    *,
    device,
    dtype=torch.float32,
    tf32=False,
    memory_budget=None,
    key_rows=None,
    plan=None,
    progress=False,
):
    """The ``k`` training rows most similar (cosine) to each query row, in blocks.

    Parameters
    ----------
    queries : array-like of shape (n_queries, n_features)
        NumPy arrays (memory maps too) or tensors; read one group at a time.
    keys : array-like of shape (n_training_rows, n_features)
        The training rows; read one block at a time.
    k : int
    device : torch.device
        Resolved (see :func:`~imagenet_cog._device.resolve_device`).
    dtype : torch.dtype
        Of the products: ``torch.float32`` or ``torch.float64``.
    tf32 : bool
        Let float32 products use TF32 on CUDA.
    memory_budget : int, optional
        See :func:`plan_neighbors`.
    key_rows : array of int, optional
        Search ``keys[key_rows]`` (a few-shot draw) without copying it; the rows returned
        index ``key_rows``.
    plan : NeighborPlan, optional
        Made by :func:`plan_neighbors` for these sizes; made here otherwise.
    progress : bool or str
        A progress bar over the training blocks (a str names it).

    Returns
    -------
    values : ndarray of shape (n_queries, k)
        Cosine similarities, highest first (float32, or float64 for ``dtype=torch.float64``).
    rows : ndarray of int64, shape (n_queries, k)
        The neighbours' rows in the training set (in ``key_rows`` when given); equal
        similarities in ascending row order.

    Examples
    --------
    >>> import numpy as np, torch
    >>> keys = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> values, rows = cosine_topk(np.array([[2.0, 0.1]]), keys, 2, device=torch.device("cpu"))
    >>> rows.tolist(), [round(float(v), 3) for v in values[0]]
    ([[0, 2]], [0.999, 0.742])
    """
    n_q, d = queries.shape
    n_k = len(key_rows) if key_rows is not None else keys.shape[0]
    if keys.shape[1] != d:
        raise ValueError(f"the queries have {d} features but the training rows {keys.shape[1]}")
    if plan is None:
        plan = plan_neighbors(
            n_q, n_k, d, k, device=device, dtype=dtype, memory_budget=memory_budget
        )
    elif (plan.n_queries, plan.n_keys, plan.n_features, plan.k) != (n_q, n_k, d, k):
        raise ValueError("the plan was made for another search")
    if key_rows is not None:
        key_rows = np.asarray(key_rows, dtype=np.int64)
    found = _search(queries, keys, k, plan, device, dtype, key_rows, tf32, progress)
    precision = "float64" if dtype == torch.float64 else "tf32" if tf32 else "float32"
    tol = _CHECK_TOL[precision]
    problem = check_neighbors(queries, keys, *found, key_rows=key_rows, tol=tol)
    if problem is None:
        return found
    cpu = torch.device("cpu")
    if device.type != "cpu":
        warnings.warn(
            f"the k-NN search on {device} failed its check against float64 on the host "
            f"({problem}); searching again on the CPU",
            RuntimeWarning,
            stacklevel=2,
        )
        plan = plan_neighbors(n_q, n_k, d, k, device=cpu, dtype=dtype)
        found = _search(queries, keys, k, plan, cpu, dtype, key_rows, False, progress)
        tol = _CHECK_TOL["float64" if dtype == torch.float64 else "float32"]
        problem = check_neighbors(queries, keys, *found, key_rows=key_rows, tol=tol)
        if problem is None:
            return found
    raise RuntimeError(f"the k-NN search on the CPU failed its own check: {problem}")
