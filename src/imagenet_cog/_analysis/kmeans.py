"""k-means on the GPU or CPU, purity, and the cluster scores of a domain.

:func:`kmeans` runs batched Lloyd iterations in torch, scikit-learn's ``KMeans``, or
scikit-learn's k-means++ seeding followed by Lloyd iterations whose assignments faiss computes
(the ``faiss`` extra), and :func:`cluster_scores` clusters a domain's train features with k =
the number of concepts, assigns the test samples to the nearest centroid and scores the
assignment against the concept labels (:func:`purity_score`, NMI, AMI, ARI).
Public names are re-exported by :mod:`imagenet_cog.analysis`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .._device import Placement, resolve_analysis_device
from .._optional_dependencies import INSTALLED, require
from .checks import (
    _DISTANCE_BLOCK_ELEMENTS,
    _as_tensor,
    _check_labels,
    _finite_float_features,
    _float_dtype,
    _json_float,
    _torch,
)

#: The k-means backends; the CPU's default is "faiss" when faiss is installed, else "sklearn".
BACKENDS = ("torch", "sklearn", "faiss")


# ------------------------------------------------------------------- k-means
@dataclass(frozen=True, eq=False)  # array fields: no element-wise ==
class KMeansResult:
    """What :func:`kmeans` returns.

    Attributes
    ----------
    centroids : ndarray, shape (k, n_features)
    labels : ndarray of int64, shape (n_samples,)
        The nearest centroid of each sample, for the final centroids.
    inertia : float
        Sum of squared distances of the samples to their centroid.
    n_iter : int
        Lloyd iterations of the kept run.
    backend : str
        ``"torch"``, ``"sklearn"`` or ``"faiss"``.
    device : str
        Where it ran (``"cpu"``, ``"cuda:0"``, ...).

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import kmeans
    >>> km = kmeans(np.array([[0.0], [1.0], [10.0], [11.0]]), 2, device="cpu")
    >>> km.inertia, km.backend, sorted(np.bincount(km.labels).tolist())
    (1.0, 'torch', [2, 2])
    """

    centroids: np.ndarray = field(repr=False)
    labels: np.ndarray = field(repr=False)
    inertia: float
    n_iter: int
    backend: str
    device: str


def _rows_per_block(width, chunk_size):
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        return int(chunk_size)
    return max(256, _DISTANCE_BLOCK_ELEMENTS // max(1, width))


def _sq_norms(X, rows):
    torch = _torch()
    out = torch.empty(X.shape[0], dtype=X.dtype, device=X.device)
    for s in range(0, X.shape[0], rows):
        xc = X[s : s + rows]
        out[s : s + rows] = torch.einsum("ij,ij->i", xc, xc)
    return out


def _sq_distances(X, sqX, C, rows):
    """``||x - c||²`` for all rows of X and C, as an (n, len(C)) tensor."""
    torch = _torch()
    sqC = torch.einsum("ij,ij->i", C, C).unsqueeze(0)
    out = torch.empty((X.shape[0], C.shape[0]), dtype=X.dtype, device=X.device)
    for s in range(0, X.shape[0], rows):
        block = torch.addmm(sqC, X[s : s + rows], C.T, alpha=-2)
        out[s : s + rows] = block.add_(sqX[s : s + rows, None]).clamp_min_(0)
    return out


def _assign(X, sqX, C, rows):
    """Nearest centroid and squared distance to it, block by block."""
    torch = _torch()
    sqC = torch.einsum("ij,ij->i", C, C).unsqueeze(0)
    labels = torch.empty(X.shape[0], dtype=torch.int64, device=X.device)
    mind = torch.empty(X.shape[0], dtype=X.dtype, device=X.device)
    for s in range(0, X.shape[0], rows):
        # ||x||² is the same for every centroid, so the argmin needs only ||c||² - 2 x·c.
        block = torch.addmm(sqC, X[s : s + rows], C.T, alpha=-2)
        m, lab = block.min(dim=1)
        mind[s : s + rows] = m.add_(sqX[s : s + rows]).clamp_min_(0)
        labels[s : s + rows] = lab
    return labels, mind


def _kmeans_plusplus(X, sqX, k, gen, rows):
    """Greedy k-means++ (as scikit-learn's): 2 + log(k) candidates per new centre."""
    torch = _torch()
    n = X.shape[0]
    trials = 2 + int(math.log(k))
    first = int(torch.randint(n, (1,), generator=gen))
    chosen = [first]
    closest = _sq_distances(X, sqX, X[first : first + 1], rows)[:, 0]
    for _ in range(1, k):
        cum = torch.cumsum(closest, 0, dtype=torch.float64)
        draw = torch.rand(trials, generator=gen, dtype=torch.float64).to(X.device) * cum[-1]
        cand = torch.searchsorted(cum, draw).clamp_(max=n - 1)
        dist = torch.minimum(closest[:, None], _sq_distances(X, sqX, X[cand], rows))
        best = int(dist.sum(0, dtype=torch.float64).argmin())
        closest = dist[:, best].contiguous()
        chosen.append(int(cand[best]))
    return X[chosen].clone()


def _lloyd(X, sqX, C, max_iter, tol_abs, rows, assign=_assign):
    torch = _torch()
    k = C.shape[0]
    labels_old = None
    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        labels, mind = assign(X, sqX, C, rows)
        sums = torch.zeros_like(C)
        for s in range(0, X.shape[0], rows):
            sums.index_add_(0, labels[s : s + rows], X[s : s + rows])
        counts = torch.bincount(labels, minlength=k)
        new = sums / counts.clamp_min(1).to(C.dtype)[:, None]
        empty = torch.nonzero(counts == 0).flatten()
        if len(empty):
            # Like scikit-learn, move empty clusters onto the points that are
            # farthest from their centroid, rather than leaving them dead.
            far = torch.topk(mind, len(empty)).indices
            new[empty] = X[far]
        shift = float(((new - C) ** 2).sum())
        C = new
        if labels_old is not None and torch.equal(labels, labels_old):
            break
        labels_old = labels
        if shift <= tol_abs:
            break
    return C, n_iter


def _torch_kmeans(X, k, n_init, max_iter, tol, seeds, device, rows, init_size, dtype):
    torch = _torch()
    with torch.no_grad():
        X = _as_tensor(X, device, _float_dtype(X, dtype))
        n, d = X.shape
        rows_k = _rows_per_block(max(k, d), rows)
        sqX = _sq_norms(X, rows_k)
        # scikit-learn's tolerance: tol times the mean per-feature variance.
        mean = torch.zeros(d, dtype=torch.float64, device=X.device)
        for s in range(0, n, rows_k):
            mean += X[s : s + rows_k].sum(0, dtype=torch.float64)
        mean /= n
        variance = float(sqX.sum(dtype=torch.float64) / n - (mean**2).sum()) / d
        tol_abs = tol * max(variance, 0.0)
        best = None
        for seed in seeds:
            gen = torch.Generator().manual_seed(int(seed))
            if init_size is not None and n > init_size:
                sub = torch.randperm(n, generator=gen)[:init_size].to(X.device)
                C = _kmeans_plusplus(X[sub], sqX[sub], k, gen, rows_k)
            else:
                C = _kmeans_plusplus(X, sqX, k, gen, rows_k)
            C, n_iter = _lloyd(X, sqX, C, max_iter, tol_abs, rows_k)
            labels, inertia = _final_assignment(X, sqX, C, rows_k, _assign)
            if best is None or inertia < best[0]:
                best = (inertia, C, labels, n_iter)
        inertia, C, labels, n_iter = best
        return KMeansResult(
            centroids=C.cpu().numpy(),
            labels=labels.cpu().numpy(),
            inertia=inertia,
            n_iter=n_iter,
            backend="torch",
            device=str(device),
        )


def _final_assignment(X, sqX, C, rows, assign):
    """A last assignment, which matches the labels to the final centroids, and the inertia,
    which sums exact differences, not the expanded distances."""
    torch = _torch()
    labels, _ = assign(X, sqX, C, rows)
    inertia = 0.0
    for s in range(0, X.shape[0], rows):
        diff = X[s : s + rows] - C[labels[s : s + rows]]
        inertia += float((diff * diff).sum(dtype=torch.float64))
    return labels, inertia


def _faiss_assign(faiss):
    """The nearest centroid of every row and its squared distance, computed by faiss (an
    exact search: one matrix product and a fused minimum per block of rows, on every core)."""
    torch = _torch()

    def assign(X, sqX, C, rows):
        index = faiss.IndexFlatL2(C.shape[1])
        index.add(np.ascontiguousarray(C.numpy()))
        dist, nearest = index.search(X.numpy(), 1)
        return torch.from_numpy(nearest[:, 0]), torch.from_numpy(dist[:, 0]).clamp_min_(0)

    return assign


def _run_states(random_state, n_runs, n, k, trials):
    """The ``RandomState`` each of scikit-learn's ``n_runs`` k-means++ seedings starts from.

    ``KMeans`` seeds its runs one after another from one ``RandomState``; a seeding draws one
    number for its first centre and ``trials`` for each other one. So run ``r`` starts where
    ``r`` seedings' draws leave the state, and the runs can be seeded together.
    """
    from sklearn.utils import check_random_state

    state = check_random_state(random_state)
    states = []
    for _ in range(n_runs):
        mine = np.random.RandomState()
        mine.set_state(state.get_state())
        states.append(mine)
        state.random_sample(1 + trials * (k - 1))  # what one seeding draws
    return states


def _kmeans_plusplus_together(X, sqX, k, states, rows):
    """scikit-learn's greedy k-means++ (``_kmeans_plusplus``, ``2 + log(k)`` candidates a
    centre) for several runs at once, run ``r`` drawing from ``states[r]`` exactly as
    ``KMeans``'s ``r``-th run does.

    A centre of every run costs one pass over ``X``: the distances of all the runs' candidates
    come from one float32 matrix product (scikit-learn computes each run's in float64, a pass
    over ``X`` per run and centre), the potentials are summed in float64. The seeding is
    bound by reading ``X``, so ``n_init`` runs take about the time of one.
    """
    torch = _torch()
    n = X.shape[0]
    R, trials = len(states), 2 + int(np.log(k))
    chosen = np.empty((R, k), dtype=np.int64)
    closest = torch.empty(R, n, dtype=X.dtype)
    for r, state in enumerate(states):
        chosen[r, 0] = state.choice(n, p=np.full(n, 1.0 / n))
        closest[r] = _sq_distances(X, sqX, X[int(chosen[r, 0]) : int(chosen[r, 0]) + 1], rows)[:, 0]
    pot = closest.sum(1, dtype=torch.float64).numpy()
    for c in range(1, k):
        cand = np.empty((R, trials), dtype=np.int64)
        for r, state in enumerate(states):
            draws = state.uniform(size=trials) * pot[r]
            cum = torch.cumsum(closest[r], 0, dtype=torch.float64).numpy()
            cand[r] = np.minimum(np.searchsorted(cum, draws), n - 1)
        ids = torch.from_numpy(cand.ravel())
        # ||c||² + ||x||² - 2 c·x, a row per candidate: one product over the rows of X.
        dist = torch.addmm(sqX.unsqueeze(0), X[ids], X.T, alpha=-2)
        dist = dist.add_(sqX[ids].unsqueeze(1)).clamp_(min=0).view(R, trials, n)
        torch.minimum(dist, closest[:, None, :], out=dist)
        pots = dist.sum(2, dtype=torch.float64)
        best = pots.argmin(1)
        for r in range(R):
            b = int(best[r])
            pot[r] = float(pots[r, b])
            closest[r] = dist[r, b]
            chosen[r, c] = cand[r, b]
    return chosen


def _faiss_kmeans(X, k, n_init, max_iter, tol, random_state, rows):
    """scikit-learn's ``KMeans`` with faiss computing the assignments of its Lloyd iterations.

    As ``KMeans`` does: the features centred on their mean (a copy, in float32), the tolerance
    ``tol`` times the mean variance of the features, every run seeded by scikit-learn's
    greedy k-means++ with the random numbers ``KMeans``'s runs draw from
    ``RandomState(random_state)`` (the runs seeded together, :func:`_kmeans_plusplus_together`);
    then Lloyd iterations until the labels stop changing or the centres move less than the
    tolerance, empty clusters moved onto far points, and the run of lowest inertia kept. The
    nearest-centroid search of each iteration is faiss's.
    """
    faiss = require("faiss", "k-means with backend='faiss'", "backend='sklearn'")
    torch = _torch()
    if hasattr(X, "detach"):
        X = X.detach().cpu().numpy()
    X = np.array(X, dtype=np.float32, order="C", copy=True)
    n, d = X.shape
    mean = np.zeros(d)
    for s in range(0, n, rows):
        mean += X[s : s + rows].sum(0, dtype=np.float64)
    mean /= n
    X -= mean.astype(np.float32)
    with torch.no_grad():
        Xt = torch.from_numpy(X)
        sqX = _sq_norms(Xt, rows)
        variance = float(sqX.sum(dtype=torch.float64)) / n / d  # centred: the mean is 0
        tol_abs = tol * max(variance, 0.0)
        assign = _faiss_assign(faiss)
        states = _run_states(random_state, n_init, n, k, 2 + int(np.log(k)))
        seeds = _kmeans_plusplus_together(Xt, sqX, k, states, rows)
        best = None
        for r in range(n_init):
            C = Xt[torch.from_numpy(seeds[r])].clone()
            C, n_iter = _lloyd(Xt, sqX, C, max_iter, tol_abs, rows, assign)
            labels, inertia = _final_assignment(Xt, sqX, C, rows, assign)
            if best is None or inertia < best[0]:
                best = (inertia, C, labels, n_iter)
    inertia, C, labels, n_iter = best
    return KMeansResult(
        centroids=(C.numpy() + mean).astype(np.float32),
        labels=labels.numpy().astype(np.int64),
        inertia=inertia,
        n_iter=n_iter,
        backend="faiss",
        device="cpu",
    )


def default_backend(device_type):
    """The k-means backend on a device of this type: torch on a GPU; on the CPU faiss's
    Lloyd iterations when faiss is installed (the ``faiss`` extra), else scikit-learn's."""
    if device_type != "cpu":
        return "torch"
    return "faiss" if INSTALLED["faiss"] else "sklearn"


def kmeans(
    X,
    k,
    *,
    n_init=3,
    max_iter=300,
    tol=1e-4,
    random_state=0,
    device=None,
    backend="torch",
    chunk_size=None,
    init_size=None,
    dtype=None,
):
    """k-means with k-means++ initialisation, keeping the best of ``n_init`` runs.

    The torch backend runs batched Lloyd iterations on ``device``: distances
    to the centroids are computed for a block of rows at a time (about 64M
    distances per block), so 1M × 2048 features with k = 1000 fit on one GPU
    next to the features themselves. It follows scikit-learn's ``KMeans``
    (greedy k-means++ with ``2 + log(k)`` candidates, tolerance relative to
    the mean feature variance, empty clusters moved to far points, a final
    assignment) and reaches the same inertia up to the randomness of the
    initialisation. The ``"sklearn"`` backend calls ``sklearn.cluster.KMeans``
    on the CPU. The ``"faiss"`` backend (CPU, the ``faiss`` extra: ``pip install
    'imagenet_cog[faiss]'``) is ``KMeans``'s algorithm, seeds and stopping rule,
    with faiss computing the nearest centroids of each Lloyd iteration (several
    times faster on a CPU; its inertia and clustering measured against
    ``KMeans``'s in ``benchmarks/bench_analysis.py``).

    Parameters
    ----------
    X : array-like or torch.Tensor, shape (n_samples, n_features)
    k : int
        Number of clusters.
    n_init : int
        Runs with different seeds; the one with the lowest inertia is kept.
    max_iter : int
        Lloyd iterations per run (scikit-learn's and cuML's default, 300).
    tol : float
        Stop when the squared shift of all centroids is at most ``tol`` times
        the mean variance of the features.
    random_state : int
        Seeds the ``n_init`` runs.
    device : str or torch.device, optional
        For the torch backend. Defaults to CUDA when available, else the CPU.
    backend : {"torch", "sklearn", "faiss"}
    chunk_size : int, optional
        Rows per distance block (torch backend); by default about 64M
        distances per block.
    init_size : int, optional
        Run k-means++ on a random subset of this many rows (torch backend),
        which speeds the initialisation up on very large sets. By default all
        rows are used.
    dtype : torch.dtype, optional
        Computation dtype (torch backend). Defaults to that of ``X``:
        float64 stays float64, everything else becomes float32.

    Returns
    -------
    KMeansResult

    Raises
    ------
    ValueError
        If ``X`` holds NaN or infinite values, if ``k`` is below 1 or above
        the number of samples, or if the backend or device is unknown.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import kmeans
    >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
    >>> km = kmeans(X, 2, device="cpu")
    >>> sorted(km.centroids.ravel().tolist()), km.inertia  # 4 × 0.5²
    ([0.5, 10.5], 1.0)
    """
    X = _finite_float_features(X, "X")
    n = X.shape[0]
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if k > n:
        raise ValueError(f"k={k} clusters asked for, but X has only {n} samples")
    if n_init < 1:
        raise ValueError(f"n_init must be at least 1, got {n_init}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be at least 1, got {max_iter}")
    if init_size is not None and init_size < k:
        raise ValueError(f"init_size={init_size} is smaller than k={k}")
    if backend == "sklearn":
        from sklearn.cluster import KMeans

        if isinstance(device, Placement):
            device = device.device
        dev = "cpu" if device is None else str(device)
        if _torch().device(dev).type != "cpu":
            raise ValueError(f"the sklearn backend runs on the CPU only, not on {dev!r}")
        if hasattr(X, "detach"):
            X = X.cpu().numpy()
        km = KMeans(
            n_clusters=int(k), n_init=n_init, max_iter=max_iter, tol=tol, random_state=random_state
        ).fit(X)
        return KMeansResult(
            centroids=km.cluster_centers_,
            labels=km.labels_.astype(np.int64),
            inertia=float(km.inertia_),
            n_iter=int(km.n_iter_),
            backend="sklearn",
            device="cpu",
        )
    if backend == "faiss":
        if isinstance(device, Placement):
            device = device.device
        dev = "cpu" if device is None else str(device)
        if _torch().device(dev).type != "cpu":
            raise ValueError(f"the faiss backend runs on the CPU only, not on {dev!r}")
        return _faiss_kmeans(
            X,
            int(k),
            n_init,
            max_iter,
            tol,
            random_state,
            _rows_per_block(max(k, X.shape[1]), chunk_size),
        )
    if backend != "torch":
        raise ValueError(f"unknown backend {backend!r}; use 'torch', 'sklearn' or 'faiss'")
    seeds = np.random.default_rng(random_state).integers(0, 2**62, size=n_init)
    return _torch_kmeans(
        X,
        int(k),
        n_init,
        max_iter,
        tol,
        seeds,
        resolve_analysis_device(device),
        chunk_size,
        init_size,
        dtype,
    )


# ----------------------------------------------------------------- clusters
def purity_score(labels_true, labels_pred, *, per="cluster"):
    """Purity of a clustering against class labels.

    With ``per="cluster"`` (the usual definition, Manning et al. 2008), each
    cluster counts its most frequent class: ``(1/N) Σ_clusters max_classes
    M[class, cluster]``. With ``per="concept"``, each concept counts the
    share of its samples that fall in its most common cluster, averaged over
    concepts: ``mean_classes max_clusters M[class, cluster] / n_class``. This
    is Eq. 3 of the CoG paper's first version, normalised into [0, 1] (the
    paper writes ``(1/1000) Σ_i max_j M_ij``, which with 50 test images per
    concept is 50 times this value).

    Parameters
    ----------
    labels_true, labels_pred : array-like, shape (n_samples,)
    per : {"cluster", "concept"}

    Returns
    -------
    float

    Examples
    --------
    >>> from imagenet_cog.analysis import purity_score
    >>> y = [0, 0, 0, 1, 1, 2]
    >>> c = [0, 0, 1, 1, 1, 1]
    >>> round(purity_score(y, c), 4)  # cluster 0: 2 of class 0; cluster 1: 2 of class 1
    0.6667
    >>> round(purity_score(y, c, per="concept"), 4)  # (2/3 + 2/2 + 1/1) / 3
    0.8889
    """
    from sklearn.metrics.cluster import contingency_matrix

    y = np.asarray(labels_true)
    c = np.asarray(labels_pred)
    if y.ndim != 1 or c.ndim != 1 or len(y) != len(c):
        raise ValueError(
            f"labels_true and labels_pred must be 1-D of the same length, got {y.shape} "
            f"and {c.shape}"
        )
    if len(y) == 0:
        raise ValueError("no samples to score")
    m = contingency_matrix(y, c, sparse=True).tocsr()  # classes × clusters
    if per == "cluster":
        return float(m.max(axis=0).toarray().sum() / len(y))
    if per == "concept":
        best = m.max(axis=1).toarray().ravel()
        return float(np.mean(best / np.asarray(m.sum(axis=1)).ravel()))
    raise ValueError(f"per must be 'cluster' or 'concept', got {per!r}")


@dataclass(frozen=True, eq=False)  # array fields: no element-wise ==
class ClusterScores:
    """What :func:`cluster_scores` returns.

    Attributes
    ----------
    purity : float
        The CoG paper's purity (Eq. 3 of its first version, normalised into
        [0, 1]): :func:`purity_score` with ``per="concept"``, each concept
        counting the share of its test samples in its most common cluster.
    purity_per_cluster : float
        The textbook purity, :func:`purity_score` with ``per="cluster"``:
        each cluster counting its majority concept.
    nmi, ami, ari : float
        ``sklearn.metrics`` normalized and adjusted mutual information and
        adjusted Rand index between test concepts and test clusters.
    inertia : float
        k-means inertia on the train features, of the kept seed.
    k : int
    n_test : int
    backend : str
        ``"torch"``, ``"sklearn"`` or ``"faiss"``.
    device : str
    centroids : ndarray, shape (k, n_features)
    test_clusters : ndarray of int64, shape (n_test,)
        Nearest centroid of each test sample.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import cluster_scores
    >>> X = np.array([[0.0, 0], [0, 1], [9, 9], [9, 10]])
    >>> s = cluster_scores(X, X, ["cat", "cat", "dog", "dog"], device="cpu")
    >>> s.purity, s.purity_per_cluster, s.ari, s.k
    (1.0, 1.0, 1.0, 2)
    """

    purity: float
    purity_per_cluster: float
    nmi: float
    ami: float
    ari: float
    inertia: float
    k: int
    n_test: int
    backend: str
    device: str
    centroids: np.ndarray = field(repr=False)
    test_clusters: np.ndarray = field(repr=False)

    def to_dict(self):
        """The scalar fields, JSON-safe."""
        return {
            "purity": self.purity,
            "purity_per_cluster": self.purity_per_cluster,
            "nmi": self.nmi,
            "ami": self.ami,
            "ari": self.ari,
            "inertia": _json_float(self.inertia),
            "k": self.k,
            "n_test": self.n_test,
            "backend": self.backend,
            "device": self.device,
        }


def cluster_scores(
    X_train,
    X_test,
    y_test,
    k=None,
    seeds=3,
    device=None,
    *,
    backend=None,
    max_iter=300,
    tol=1e-4,
    random_state=0,
    chunk_size=None,
    init_size=None,
):
    """Cluster the train features and score the test assignment (the paper's first version, Sec. 4.3).

    k-means with k = the number of concepts runs on ``X_train`` ``seeds``
    times and keeps the centroids of lowest inertia. Each test sample goes to
    its nearest centroid, and that assignment is compared with ``y_test``.

    Parameters
    ----------
    X_train : array-like or torch.Tensor, shape (n_train, n_features)
    X_test : array-like or torch.Tensor, shape (n_test, n_features)
    y_test : array-like, shape (n_test,)
        Concept labels of the test samples (any hashable values).
    k : int, optional
        Number of clusters. Defaults to the number of distinct ``y_test``.
    seeds : int
        k-means runs; the lowest inertia is kept (the paper: 3).
    device : str or torch.device, optional
        Defaults to CUDA when available. On a GPU k-means runs in torch; on
        the CPU it is scikit-learn's ``KMeans``, or, when faiss is installed
        (the ``faiss`` extra), the same algorithm and seeds with faiss's
        nearest-centroid search (``backend="faiss"``). The result's
        ``backend`` says which ran.
    backend : {"torch", "sklearn", "faiss"}, optional
        Overrides the choice made from ``device``.
    max_iter, tol, random_state, chunk_size, init_size
        Passed to :func:`kmeans`.

    Returns
    -------
    ClusterScores

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import cluster_scores
    >>> X_train = np.array([[0.0, 0], [0, 1], [9, 9], [9, 10]])
    >>> X_test = np.array([[0.0, 0.5], [9, 9.5], [8, 8]])
    >>> s = cluster_scores(X_train, X_test, ["cat", "dog", "dog"], device="cpu")
    >>> s.purity, s.nmi, s.ari, s.inertia  # 4 × 0.5²
    (1.0, 1.0, 1.0, 1.0)
    """
    from sklearn import metrics

    X_train = _finite_float_features(X_train, "X_train")
    X_test = _finite_float_features(X_test, "X_test")
    if X_train.shape[1] != X_test.shape[1]:
        raise ValueError(
            f"X_train has {X_train.shape[1]} features but X_test has {X_test.shape[1]}"
        )
    y_test = _check_labels(y_test, X_test.shape[0], "y_test", "X_test")
    if k is None:
        k = len(np.unique(y_test))
    dev = resolve_analysis_device(device)
    if backend is None:
        backend = default_backend(dev.type)
    km = kmeans(
        X_train,
        k,
        n_init=seeds,
        max_iter=max_iter,
        tol=tol,
        random_state=random_state,
        device=Placement(dev),  # resolved: k-means takes it as it is
        backend=backend,
        chunk_size=chunk_size,
        init_size=init_size,
    )
    torch = _torch()
    with torch.no_grad():
        dtype = _float_dtype(X_test, None)
        test_dev = dev if km.backend == "torch" else torch.device("cpu")
        Xt = _as_tensor(X_test, test_dev, dtype)
        C = torch.as_tensor(km.centroids, dtype=dtype, device=test_dev)
        rows = _rows_per_block(max(k, Xt.shape[1]), chunk_size)
        clusters, _ = _assign(Xt, _sq_norms(Xt, rows), C, rows)
        clusters = clusters.cpu().numpy()
    return ClusterScores(
        purity=purity_score(y_test, clusters, per="concept"),
        purity_per_cluster=purity_score(y_test, clusters),
        nmi=float(metrics.normalized_mutual_info_score(y_test, clusters)),
        ami=float(metrics.adjusted_mutual_info_score(y_test, clusters)),
        ari=float(metrics.adjusted_rand_score(y_test, clusters)),
        inertia=km.inertia,
        k=int(k),
        n_test=len(y_test),
        backend=km.backend,
        device=km.device,
        centroids=km.centroids,
        test_clusters=clusters,
    )
