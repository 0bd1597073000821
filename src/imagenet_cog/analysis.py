"""Analyses of a model's feature space and of its errors (SPEC §6 and §7).

The last stage of the pipeline (taxonomy → measures → levels → datasets →
features → probe → protocol → results → **analysis**). It reads features,
labels and predictions, and uses the taxonomy and the similarity measures;
no earlier stage imports it.

- Clustering: :func:`cluster_scores` runs k-means with k = the number of
  concepts on the train features, assigns each test sample to its nearest
  centroid and scores the assignment against the concept labels
  (:func:`purity_score`, NMI, AMI, ARI). :func:`kmeans` is the k-means behind
  it: batched Lloyd iterations in torch (GPU or CPU), or scikit-learn.
- Alignment and uniformity of Wang & Isola (2020):
  :func:`alignment_uniformity`, :func:`alignment_uniformity_per_domain`, and
  :func:`relative_to` for scores relative to IN-1K.
- Knowledge-driven error analysis: :func:`semantic_errors` measures how far in
  WordNet the predicted concepts are from the true ones, and explains the top
  confusions of each class with the WordNet path that joins them.
- Probes beyond the linear one (supplement C of the first version):
  :func:`pca_probe` runs the LogReg protocol on the first 32...1024 principal
  components, :func:`mlp_probe` searches :class:`MLPProbe` (two hidden layers
  of 2048 units, with ReLU or without activation).
- :func:`plot_analysis` draws any of these measures per domain (matplotlib).
- :func:`analyze` runs the analyses of a model's domains from its feature
  store and the test predictions that :func:`~imagenet_cog.evaluate` saves,
  and writes ``analysis.json``, which :class:`~imagenet_cog.Results` reads.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._mlp import MLP_WD_RANGE, MLPProbe
from .probe import SEEDS
from .similarity import (
    _Ancestry,
    get_measure,
    lch_similarity,
    measure_name,
    path_similarity,
    similarity,
)
from .taxonomy import _ranges, load_taxonomy

__all__ = [
    "PCA_COMPONENTS",
    "AlignmentUniformity",
    "AnalysisReport",
    "ClusterScores",
    "Confusion",
    "KMeansResult",
    "MLPProbe",
    "ProbeScores",
    "SemanticErrors",
    "alignment_uniformity",
    "alignment_uniformity_per_domain",
    "analyze",
    "cluster_scores",
    "kmeans",
    "load_predictions",
    "mlp_probe",
    "pca_probe",
    "plot_analysis",
    "purity_score",
    "relative_to",
    "semantic_errors",
]

# Elements of one distance block (rows × centroids or rows × rows): 64M values,
# 256 MB in float32. Large enough to keep a GPU busy, small enough that
# 1M × 2048 features with k = 1000 never need more than one block at a time.
_BLOCK_ELEMENTS = 1 << 26
# Similarity matrix entries computed at once by semantic_errors.
_PAIR_BLOCK = 1 << 22


# ---------------------------------------------------------------- validation
def _torch():
    import torch

    return torch


def _resolve_device(device):
    torch = _torch()
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {str(device)!r} was asked for, but torch sees no CUDA device "
            "(torch.cuda.is_available() is False); pass device='cpu'"
        )
    return dev


def _check_features(X, name):
    """A 2-D float array or tensor with finite values, or a clear error."""
    torch = _torch()
    if isinstance(X, torch.Tensor):
        X = X.detach()
        if not X.is_floating_point():
            X = X.double()
        elif X.dtype in (torch.float16, torch.bfloat16):
            X = X.float()
    else:
        X = np.asarray(X)
        if X.dtype.kind not in "fiub":
            raise ValueError(f"{name} must hold numbers, got dtype {X.dtype}")
        if X.dtype.kind != "f":
            X = X.astype(np.float64)
        elif X.dtype.itemsize < 4:
            X = X.astype(np.float32)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (samples × features), got shape {tuple(X.shape)}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(X.shape)})")
    # One float64 sum is cheap and is finite exactly when every value is
    # (short of overflow); the row-by-row check only runs to name the culprits.
    total = X.sum(dtype=torch.float64) if isinstance(X, torch.Tensor) else X.sum(dtype=np.float64)
    if not math.isfinite(float(total)):
        bad = ~(
            torch.isfinite(X).all(1).cpu().numpy()
            if isinstance(X, torch.Tensor)
            else np.isfinite(X).all(1)
        )
        rows = np.flatnonzero(bad)
        raise ValueError(
            f"{name} contains NaN or infinite values in {len(rows)} of {X.shape[0]} rows "
            f"(first at row {rows[0] if len(rows) else '?'}); drop or fix them first"
        )
    return X


def _check_labels(y, n, name, xname):
    y = y.detach().cpu().numpy() if hasattr(y, "detach") else np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {y.shape}")
    if len(y) != n:
        raise ValueError(f"{name} has {len(y)} labels but {xname} has {n} rows")
    return y


def _float_dtype(X, dtype):
    torch = _torch()
    if dtype is not None:
        return dtype
    if isinstance(X, torch.Tensor):
        return X.dtype
    return torch.float64 if X.dtype == np.float64 else torch.float32


def _as_tensor(X, device, dtype):
    """``X`` as a tensor on ``device``; numpy input is copied in row blocks."""
    torch = _torch()
    if isinstance(X, torch.Tensor):
        return X.to(device=device, dtype=dtype)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    if device.type == "cpu":
        return torch.from_numpy(np.ascontiguousarray(X, dtype=np_dtype))
    # Block copies keep a float64 array from being duplicated in host memory.
    out = torch.empty(X.shape, dtype=dtype, device=device)
    rows = max(1, _BLOCK_ELEMENTS // X.shape[1])
    for s in range(0, X.shape[0], rows):
        out[s : s + rows].copy_(torch.from_numpy(np.ascontiguousarray(X[s : s + rows], np_dtype)))
    return out


def _json_float(x):
    x = float(x)
    return x if math.isfinite(x) else None


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
        ``"torch"`` or ``"sklearn"``.
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
    return max(256, _BLOCK_ELEMENTS // max(1, width))


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


def _lloyd(X, sqX, C, max_iter, tol_abs, rows):
    torch = _torch()
    k = C.shape[0]
    labels_old = None
    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        labels, mind = _assign(X, sqX, C, rows)
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
            # A last assignment matches the labels to the final centroids; the
            # inertia sums exact differences, not the expanded distances.
            labels, _ = _assign(X, sqX, C, rows_k)
            inertia = 0.0
            for s in range(0, n, rows_k):
                diff = X[s : s + rows_k] - C[labels[s : s + rows_k]]
                inertia += float((diff * diff).sum(dtype=torch.float64))
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
    on the CPU.

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
    backend : {"torch", "sklearn"}
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
    X = _check_features(X, "X")
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
    if backend != "torch":
        raise ValueError(f"unknown backend {backend!r}; use 'torch' or 'sklearn'")
    seeds = np.random.default_rng(random_state).integers(0, 2**62, size=n_init)
    return _torch_kmeans(
        X,
        int(k),
        n_init,
        max_iter,
        tol,
        seeds,
        _resolve_device(device),
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
        ``"torch"`` or ``"sklearn"``.
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
    """Cluster the train features and score the test assignment (SPEC §6).

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
        the CPU it is scikit-learn's ``KMeans`` unless ``backend="torch"``.
    backend : {"torch", "sklearn"}, optional
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

    X_train = _check_features(X_train, "X_train")
    X_test = _check_features(X_test, "X_test")
    if X_train.shape[1] != X_test.shape[1]:
        raise ValueError(
            f"X_train has {X_train.shape[1]} features but X_test has {X_test.shape[1]}"
        )
    y_test = _check_labels(y_test, X_test.shape[0], "y_test", "X_test")
    if k is None:
        k = len(np.unique(y_test))
    dev = _resolve_device(device)
    if backend is None:
        backend = "sklearn" if dev.type == "cpu" else "torch"
    km = kmeans(
        X_train,
        k,
        n_init=seeds,
        max_iter=max_iter,
        tol=tol,
        random_state=random_state,
        device=dev,
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


# ------------------------------------------------- alignment and uniformity
@dataclass(frozen=True)
class AlignmentUniformity:
    """What :func:`alignment_uniformity` returns.

    Attributes
    ----------
    alignment : float
        Mean squared distance between distinct samples of the same concept
        (lower: tighter concepts).
    uniformity : float
        ``log`` of the mean of ``exp(-t·d²)`` over pairs of distinct samples
        (lower, i.e. more negative: more uniformly spread).
    n_samples : int
    n_positive_pairs : int
        Unordered same-concept pairs behind the alignment.
    t : float
    normalized : bool
        Whether the features were l2-normalised first.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import alignment_uniformity
    >>> au = alignment_uniformity(np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]]), [0, 0, 1, 1])
    >>> au.alignment, au.n_samples, au.n_positive_pairs
    (2.0, 4, 2)
    """

    alignment: float
    uniformity: float
    n_samples: int
    n_positive_pairs: int
    t: float
    normalized: bool

    def to_dict(self):
        """The fields, JSON-safe."""
        return {
            "alignment": _json_float(self.alignment),
            "uniformity": _json_float(self.uniformity),
            "n_samples": self.n_samples,
            "n_positive_pairs": self.n_positive_pairs,
            "t": self.t,
            "normalized": self.normalized,
        }


def alignment_uniformity(X, y, *, t=2.0, normalize=True, device=None, chunk_size=None):
    """Alignment and uniformity of features (Wang & Isola, 2020; SPEC §6).

    - alignment: the mean of ``||f(x) - f(y)||²`` over pairs of distinct
      samples x ≠ y of the same concept. Every pair weighs the same, so a
      concept with more samples weighs more (with the benchmark's 50 test
      images per concept, this is also the mean of per-concept alignments).
      It is computed exactly without forming pairs:
      ``Σ_{i,j∈c} ||x_i - x_j||² = 2 n_c Σ_{i∈c} ||x_i - μ_c||²``.
    - uniformity: ``log mean exp(-t ||f(x) - f(y)||²)`` over the
      ``n(n-1)/2`` pairs of distinct samples ``i < j``, exactly what Wang &
      Isola's reference code computes,
      ``torch.pdist(x).pow(2).mul(-t).exp().mean().log()`` (``pdist`` yields
      the distinct pairs only); the mean over ordered pairs ``i ≠ j`` is the
      same. The diagonal ``i = j`` is left out: each of its ``n`` terms is
      ``exp(0) = 1`` whatever the features, which would pull small sets
      towards 0 (less uniform). Two different samples with equal features do
      count. The sum runs over blocks of pairs with a log-sum-exp, so 50,000
      samples fit in memory and far-apart features do not underflow to
      ``log(0)``.

    The CoG paper's Fig. 10 appears to plot ``-uniformity`` (positive values
    from 1.8 to 3.1); this function returns the quantity as defined above.

    Parameters
    ----------
    X : array-like or torch.Tensor, shape (n_samples, n_features)
    y : array-like, shape (n_samples,)
        Concept labels.
    t : float
        Temperature of the uniformity kernel (2 in SPEC §6 and the paper).
    normalize : bool
        l2-normalise the features first, as the benchmark does before any
        classifier and as Wang & Isola assume (features on the hypersphere).
    device : str or torch.device, optional
        Defaults to CUDA when available, else the CPU. The ``n²/2`` dot
        products dominate: 50,000 × 2048 features take one to a few minutes
        on 2 CPU cores, seconds on a GPU.
    chunk_size : int, optional
        Rows per block of pairs (default 8192 on a GPU, 4096 on the CPU:
        a few 64 MB blocks at a time in float32).

    Returns
    -------
    AlignmentUniformity

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import alignment_uniformity
    >>> X = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]])
    >>> au = alignment_uniformity(X, [0, 0, 1, 1], device="cpu")
    >>> au.alignment  # both same-concept pairs are at distance² 2
    2.0
    >>> # 4 pairs at distance² 2 and 2 at distance² 4
    >>> bool(np.isclose(au.uniformity, np.log((4 * np.exp(-4) + 2 * np.exp(-8)) / 6)))
    True
    """
    torch = _torch()
    X = _check_features(X, "X")
    n = X.shape[0]
    y = _check_labels(y, n, "y", "X")
    if n < 2:
        raise ValueError("alignment and uniformity need at least 2 samples")
    if not t > 0:
        raise ValueError(f"t must be positive, got {t}")
    _, codes, sizes = np.unique(y, return_inverse=True, return_counts=True)
    n_pos = int((sizes * (sizes - 1) // 2).sum())
    if n_pos == 0:
        raise ValueError("no concept has 2 samples: alignment needs same-concept pairs")
    dev = _resolve_device(device)
    with torch.no_grad():
        Xt = _as_tensor(X, dev, _float_dtype(X, None))
        if normalize:
            norms = torch.linalg.vector_norm(Xt, dim=1, keepdim=True)
            if bool((norms == 0).any()):
                raise ValueError("X has all-zero rows, which cannot be l2-normalised")
            Xt = Xt / norms
        rows = int(chunk_size) if chunk_size else (8192 if dev.type == "cuda" else 4096)
        if rows < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        # Alignment from per-concept scatter around the concept mean, in float64
        # and by blocks of rows (two passes: the means, then the scatter).
        codes_t = torch.as_tensor(codes, device=dev)
        sizes_t = torch.as_tensor(sizes, dtype=torch.float64, device=dev)
        means = torch.zeros((len(sizes), Xt.shape[1]), dtype=torch.float64, device=dev)
        for s in range(0, n, rows):
            means.index_add_(0, codes_t[s : s + rows], Xt[s : s + rows].double())
        means /= sizes_t[:, None]
        sse = torch.zeros(len(sizes), dtype=torch.float64, device=dev)
        for s in range(0, n, rows):
            c = codes_t[s : s + rows]
            sse.index_add_(0, c, ((Xt[s : s + rows].double() - means[c]) ** 2).sum(1))
        alignment = float((2 * sizes_t * sse).sum() / (sizes_t * (sizes_t - 1)).sum())
        # Uniformity over the blocks of the upper triangle; an off-diagonal
        # block stands for both (i, j) and (j, i), hence its + log 2.
        sq = _sq_norms(Xt, rows)
        parts = []
        for i in range(0, n, rows):
            xi, si = Xt[i : i + rows], sq[i : i + rows]
            for j in range(i, n, rows):
                d2 = torch.addmm(
                    si[:, None] + sq[None, j : j + rows], xi, Xt[j : j + rows].T, alpha=-2
                ).clamp_min_(0)
                v = d2.mul_(-t)
                if i == j:
                    v.fill_diagonal_(-math.inf)
                lse = torch.logsumexp(v.flatten(), 0).double()
                parts.append(lse if i == j else lse + math.log(2))
        uniformity = float(torch.logsumexp(torch.stack(parts), 0)) - math.log(n * (n - 1))
    return AlignmentUniformity(
        alignment=alignment,
        uniformity=uniformity,
        n_samples=n,
        n_positive_pairs=n_pos,
        t=float(t),
        normalized=bool(normalize),
    )


def alignment_uniformity_per_domain(domains, **kwargs):
    """:func:`alignment_uniformity` of each domain, as plain dictionaries.

    Parameters
    ----------
    domains : mapping of str to (X, y)
        E.g. ``{"in1k": (X, y), "l1": (X1, y1), ...}`` with test features.
    **kwargs
        Passed to :func:`alignment_uniformity`.

    Returns
    -------
    dict of str to dict
        ``{domain: {"alignment": ..., "uniformity": ..., ...}}`` in the
        order given, ready for :func:`relative_to` and :func:`plot_analysis`.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import alignment_uniformity_per_domain, relative_to
    >>> square = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]])
    >>> scores = alignment_uniformity_per_domain(
    ...     {"in1k": (square, [0, 1, 0, 1]), "l1": (square, [0, 0, 1, 1])}, device="cpu")
    >>> scores["in1k"]["alignment"], scores["l1"]["alignment"]  # opposite vs adjacent pairs
    (4.0, 2.0)
    >>> relative_to(scores, metrics=["alignment"])["l1"]
    {'alignment': -2.0}
    """
    if not isinstance(domains, Mapping) or not domains:
        raise ValueError("domains must be a non-empty mapping {domain: (X, y)}")
    out = {}
    for name, pair in domains.items():
        try:
            X, y = pair
        except (TypeError, ValueError):
            raise ValueError(f"domain {name!r}: expected a pair (X, y)") from None
        out[name] = alignment_uniformity(X, y, **kwargs).to_dict()
    return out


# Numeric fields of the result objects that are settings or counts, not measures.
_SETTINGS = {"k", "t"}


def _domain_key(name):
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def _as_metrics(value):
    if isinstance(getattr(value, "overall", None), Mapping):  # SemanticErrors
        return value.overall
    if hasattr(value, "to_dict") and not isinstance(value, Mapping):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return value
    raise TypeError(f"expected a mapping of metrics, got {type(value).__name__}")


def _is_number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def relative_to(scores, baseline="in1k", *, how="difference", metrics=None):
    """Per-domain scores relative to a baseline domain (IN-1K by default).

    Parameters
    ----------
    scores : mapping of str to mapping or result object
        ``{domain: {metric: value}}``, e.g. from
        :func:`alignment_uniformity_per_domain`; the results of
        :func:`cluster_scores`, :func:`alignment_uniformity` and
        :func:`semantic_errors` work as values too.
    baseline : str
        The reference domain. Matched ignoring case and punctuation, so
        ``"in1k"`` finds ``"IN-1K"``.
    how : {"difference", "ratio"}
        ``value - baseline`` or ``value / baseline``.
    metrics : sequence of str, optional
        Which metrics; by default every numeric one of the baseline, except
        counts and settings (``n_*``, ``k``, ``t``).

    Returns
    -------
    dict of str to dict
        Same domains in the same order (the baseline gives 0 or 1).

    Examples
    --------
    >>> from imagenet_cog.analysis import relative_to
    >>> scores = {"IN-1K": {"alignment": 0.8, "uniformity": -3.0},
    ...           "L5": {"alignment": 1.0, "uniformity": -2.4}}
    >>> out = relative_to(scores)
    >>> {k: round(v, 6) for k, v in out["L5"].items()}
    {'alignment': 0.2, 'uniformity': 0.6}
    >>> round(relative_to(scores, how="ratio")["L5"]["alignment"], 6)
    1.25
    """
    if how not in ("difference", "ratio"):
        raise ValueError(f"how must be 'difference' or 'ratio', got {how!r}")
    table = {name: _as_metrics(v) for name, v in scores.items()}
    keys = {_domain_key(name): name for name in table}
    if _domain_key(baseline) not in keys:
        raise ValueError(f"baseline domain {baseline!r} is not among the domains {list(table)}")
    base = table[keys[_domain_key(baseline)]]
    if metrics is None:
        metrics = [
            m for m, v in base.items() if _is_number(v) and m not in _SETTINGS and m[:2] != "n_"
        ]
    else:
        missing = [m for m in metrics if m not in base]
        if missing:
            raise ValueError(f"baseline {baseline!r} has no metric {missing[0]!r}")
    out = {}
    for name, values in table.items():
        row = {}
        for m in metrics:
            v, b = values.get(m), base[m]
            if v is None or b is None:
                row[m] = None
            elif how == "difference":
                row[m] = float(v) - float(b)
            else:
                row[m] = float(v) / float(b) if b != 0 else None
        out[name] = row
    return out


# ------------------------------------------------------ semantic error analysis
_GRAPH_KEYS = weakref.WeakKeyDictionary()


def _graph_keys(tax):
    """Sorted flat keys ``child·n + ancestor`` and ``child·n + parent`` of a taxonomy."""
    keys = _GRAPH_KEYS.get(tax)
    if keys is None:
        n = len(tax)
        anc = tax.ancestor_matrix
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(anc.indptr))
        anc_keys = rows * n + anc.indices  # sorted: CSR rows in order, indices sorted
        child = np.repeat(np.arange(n, dtype=np.int64), np.diff(tax.parent_ptr))
        parent_keys = np.sort(child * n + tax.parent_idx)
        keys = _GRAPH_KEYS[tax] = (anc_keys, parent_keys)
    return keys


def _lookup(sorted_keys, queries):
    """Positions of ``queries`` in ``sorted_keys`` and whether they were found."""
    pos = np.minimum(np.searchsorted(sorted_keys, queries), max(len(sorted_keys) - 1, 0))
    found = sorted_keys[pos] == queries if len(sorted_keys) else np.zeros(len(queries), bool)
    return pos, found


def _ancestor_distance(tax, x, k):
    """Hop distance from each node ``x`` up to ``k``; -1 when k is not an ancestor."""
    anc_keys, _ = _graph_keys(tax)
    pos, found = _lookup(anc_keys, x.astype(np.int64) * len(tax) + k)
    return np.where(found, tax.ancestor_matrix.data[pos].astype(np.int64) - 1, -1)


def _pair_relations(tax, a, b):
    """For pairs (a, b): b is a parent of a, b is a child of a, a and b share a parent.

    Parents are hypernyms and instance hypernyms, as everywhere in the taxonomy.
    """
    n = len(tax)
    _, parent_keys = _graph_keys(tax)
    hypernym = _lookup(parent_keys, a * n + b)[1]
    hyponym = _lookup(parent_keys, b * n + a)[1]
    ptr, idx = tax.parent_ptr, tax.parent_idx
    pa = _ranges(ptr[a], ptr[a + 1])
    owner_a = np.repeat(np.arange(len(a), dtype=np.int64), ptr[a + 1] - ptr[a])
    pb = _ranges(ptr[b], ptr[b + 1])
    owner_b = np.repeat(np.arange(len(b), dtype=np.int64), ptr[b + 1] - ptr[b])
    shared = np.isin(owner_a * n + idx[pa], owner_b * n + idx[pb])
    sibling = np.bincount(owner_a[shared], minlength=len(a)) > 0
    return sibling, hypernym, hyponym


def _common_subsumer(tax, a, b):
    """The node k joining a and b by the shortest path, and that path's length.

    k minimises ``d(a, k) + d(b, k)`` over common ancestors (the distance of
    the path and Leacock-Chodorow measures); ties go to the larger
    ``max_depth`` (the more specific concept), then to the lower node index
    (wnid order in the bundled taxonomy). -1 where there is no common ancestor.
    """
    n = len(tax)
    fa, fb = _Ancestry(tax, a), _Ancestry(tax, b)
    ka = fa.owner.astype(np.int64) * n + fa.ancestor
    kb = fb.owner.astype(np.int64) * n + fb.ancestor
    common, ia, ib = np.intersect1d(ka, kb, assume_unique=True, return_indices=True)
    owner, node = common // n, common % n
    total = fa.dist[ia].astype(np.int64) + fb.dist[ib]
    order = np.lexsort((node, -tax.max_depth[node], total, owner))
    owner_sorted = owner[order]
    first = order[np.r_[True, owner_sorted[1:] != owner_sorted[:-1]]] if len(order) else order
    lcs = np.full(len(a), -1, dtype=np.int64)
    dist = np.full(len(a), -1, dtype=np.int64)
    lcs[owner[first]] = node[first]
    dist[owner[first]] = total[first]
    return lcs, dist


def _up_paths(tax, start, target):
    """Shortest upward paths from ``start`` to its ancestor ``target``, all at once.

    Returns an (n_pairs, longest + 1) array of nodes, padded with -1. Each step
    takes the first parent (hypernyms before instance hypernyms, in stored
    order) that is one hop closer to the target.
    """
    dist = _ancestor_distance(tax, start, target)
    if (dist < 0).any():
        raise ValueError("internal error: a path target is not an ancestor")
    width = int(dist.max()) + 1 if len(dist) else 1
    out = np.full((len(start), width), -1, dtype=np.int64)
    out[:, 0] = start
    cur = start.astype(np.int64).copy()
    ptr, idx = tax.parent_ptr, tax.parent_idx
    for step in range(1, width):
        active = np.flatnonzero(dist >= step)
        c = cur[active]
        cand = _ranges(ptr[c], ptr[c + 1])
        owner = np.repeat(np.arange(len(active)), ptr[c + 1] - ptr[c])
        par = idx[cand]
        ok = _ancestor_distance(tax, par, target[active][owner]) == dist[active][owner] - step
        hits = np.flatnonzero(ok)
        # Candidates come grouped by owner in parent order: keep the first hit.
        owners_hit, first = np.unique(owner[hits], return_index=True)
        if len(owners_hit) != len(active):  # pragma: no cover - BFS distances guarantee it
            raise ValueError("internal error: no parent one hop closer to the target")
        cur[active] = par[hits[first]]
        out[active, step] = cur[active]
    return out


def _readable(tax, node):
    return tax.lemmas[int(node)][0].replace("_", " ")


def _pair_measure(measure, tax, labels, pt, pp):
    """A measure on the pairs (labels[pt], labels[pp]); pt is sorted.

    The measure is evaluated as small matrices over the true labels of a block
    of pairs × their predicted labels, never pair by pair.
    """
    out = np.empty(len(pt), dtype=np.float64)
    rows_t = np.unique(pt)
    per = max(1, _PAIR_BLOCK // max(1, len(labels)))
    for s in range(0, len(rows_t), per):
        rows = rows_t[s : s + per]
        lo = np.searchsorted(pt, rows[0])
        hi = np.searchsorted(pt, rows[-1], side="right")
        cols = np.unique(pp[lo:hi])
        m = similarity(measure, labels[rows].tolist(), labels[cols].tolist(), taxonomy=tax)
        out[lo:hi] = m[np.searchsorted(rows, pt[lo:hi]), np.searchsorted(cols, pp[lo:hi])]
    return out


# Measures that are a function of the shortest path length d alone, as in
# path_similarity and lch_similarity.
_FROM_DISTANCE = {
    path_similarity: lambda d, tax: 1.0 / (d + 1),
    lch_similarity: lambda d, tax: -np.log((d + 1) / (2.0 * tax.lch_depth)),
}


@dataclass(frozen=True, eq=False)
class Confusion:
    """One of a class's top confusions, explained by a WordNet path.

    Attributes
    ----------
    true, pred : str
        wnids of the true and the predicted concept.
    count : int
        Test samples of ``true`` predicted as ``pred``.
    mf : float
        Misclassification frequency: ``count`` / all errors of ``true``.
    lcs : str or None
        The common subsumer the path goes through (None when the taxonomy has
        no common ancestor).
    path : tuple of str
        wnids from ``true`` up to ``lcs`` and down to ``pred``.
    path_names : tuple of str
        The first lemma of each node of ``path``, readable.
    sibling, hypernym, hyponym : bool
        ``pred`` shares a parent with ``true``, is a parent of it, is a child
        of it.
    similarity : dict of str to float
        The measures of :func:`semantic_errors` for this pair.

    Examples
    --------
    >>> from imagenet_cog.analysis import semantic_errors
    >>> res = semantic_errors(["n02123159"] * 2, ["n02123045", "n02123045"])
    >>> c = res.confusions["n02123159"][0]
    >>> c.pred, c.count, c.mf, c.sibling, c.explain()
    ('n02123045', 2, 1.0, True, 'tiger cat → [domestic cat] → tabby')
    """

    true: str
    pred: str
    count: int
    mf: float
    lcs: str | None
    path: tuple
    path_names: tuple
    sibling: bool
    hypernym: bool
    hyponym: bool
    similarity: dict

    @property
    def relation(self):
        """``"hypernym"``, ``"hyponym"``, ``"sibling"`` or ``""``."""
        for name in ("hypernym", "hyponym", "sibling"):
            if getattr(self, name):
                return name
        return ""

    def explain(self):
        """The path as text, the common subsumer in brackets.

        Examples
        --------
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159"], ["n02123045"])  # tiger cat as tabby
        >>> res.confusions["n02123159"][0].explain()
        'tiger cat → [domestic cat] → tabby'
        """
        if self.lcs is None:
            return f"{self.path_names[0]} ↛ {self.path_names[-1]} (no common ancestor)"
        up = self.path.index(self.lcs)
        return " → ".join(f"[{x}]" if i == up else x for i, x in enumerate(self.path_names))

    def to_dict(self):
        """JSON-safe dictionary."""
        return {
            "true": self.true,
            "pred": self.pred,
            "count": self.count,
            "mf": self.mf,
            "relation": self.relation,
            "lcs": self.lcs,
            "path": list(self.path),
            "path_names": list(self.path_names),
            "explanation": self.explain(),
            "similarity": {k: _json_float(v) for k, v in self.similarity.items()},
        }


class SemanticErrors:
    """Knowledge-driven error analysis, returned by :func:`semantic_errors`.

    Attributes
    ----------
    classes : ndarray of str
        The true classes (sorted wnids); per-class arrays follow this order.
    names : list of str
        Readable name (first lemma) of each class.
    per_class : dict of str to ndarray
        ``support``, ``n_errors``, ``accuracy``, one entry per measure (mean
        similarity of true and predicted concept over the class's errors),
        ``sibling_rate``, ``hypernym_rate``, ``hyponym_rate`` (shares of the
        class's errors). NaN for a class without errors.
    overall : dict
        ``n_samples``, ``n_errors``, ``accuracy`` and the same measures and
        rates over all errors (each error counts once).
    pairs : dict of str to ndarray
        One entry per distinct error (true ≠ predicted): ``true``, ``pred``
        (wnids), ``count``, ``mf`` (MF(t→p) = count / errors of t), each
        measure, the ``sibling``, ``hypernym`` and ``hyponym`` flags, and the
        ``lcs`` and ``distance`` of the joining path.
    confusions : dict of str to list of Confusion
        The ``top_k`` most frequent errors of each class, most frequent first
        (ties: lower predicted wnid first).
    measures : tuple of str
    top_k : int

    Examples
    --------
    >>> from imagenet_cog.analysis import semantic_errors
    >>> tiger_cat, tabby, lynx = "n02123159", "n02123045", "n02127052"
    >>> res = semantic_errors([tiger_cat] * 3, [tiger_cat, tabby, lynx])
    >>> res.overall["n_errors"], res.overall["sibling_rate"], res.mf(tiger_cat, lynx)
    (2, 0.5, 0.5)
    """

    def __init__(
        self, *, taxonomy, classes, per_class, overall, pairs, confusions, measures, top_k
    ):
        self.taxonomy = taxonomy
        self.classes = classes
        self.names = [_readable(taxonomy, i) for i in taxonomy.indices(classes)]
        self.per_class = per_class
        self.overall = overall
        self.pairs = pairs
        self.confusions = confusions
        self.measures = measures
        self.top_k = top_k
        self._pair_index = None

    def mf(self, true, pred):
        """Misclassification frequency MF(true → pred); 0 when never confused.

        Examples
        --------
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159"] * 3, ["n02123045", "n02123045", "n02124075"])
        >>> round(res.mf("n02123159", "n02123045"), 4)  # 2 of the 3 errors
        0.6667
        """
        if self._pair_index is None:
            self._pair_index = {
                (t, p): i
                for i, (t, p) in enumerate(
                    zip(self.pairs["true"].tolist(), self.pairs["pred"].tolist())
                )
            }
        i = self._pair_index.get((true, pred))
        return 0.0 if i is None else float(self.pairs["mf"][i])

    def __repr__(self):
        o = self.overall
        sims = ", ".join(f"{m}={_fmt(o[m])}" for m in self.measures)
        return (
            f"SemanticErrors(n_samples={o['n_samples']}, n_errors={o['n_errors']}, "
            f"classes={len(self.classes)}, {sims}, sibling_rate={_fmt(o['sibling_rate'])})"
        )

    def __str__(self):
        return self.to_text()

    def to_text(self, max_rows=20, sort_by="n_errors", paths=True):
        """A readable report: the overall means, then a table of classes.

        Parameters
        ----------
        max_rows : int or None
            Classes shown (None: all).
        sort_by : str
            A ``per_class`` key, largest first (``"n_errors"``), or
            ``"class"`` for wnid order.
        paths : bool
            List each shown class's top confusions with their WordNet path.

        Returns
        -------
        str

        Examples
        --------
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159", "n02123159"], ["n02123159", "n02123045"])
        >>> print(res.to_text())  # doctest: +NORMALIZE_WHITESPACE
        1 errors in 2 predictions (accuracy 50.0%), 1 true classes
        over all errors: path 0.333  lch 2.539  wup 0.875  sibling 100.0%  hypernym 0.0%  hyponym 0.0%
        class                        n    err    acc   path    lch    wup    sib  top confusions (MF)
        n02123159 tiger cat          2      1  50.0%  0.333  2.539  0.875 100.0%  tabby 100%
            tiger cat → [domestic cat] → tabby  (1, MF 100%, sibling)
        """
        o, pc = self.overall, self.per_class
        lines = [
            (
                f"{o['n_errors']} errors in {o['n_samples']} predictions "
                f"(accuracy {_pct(o['accuracy'])}), {len(self.classes)} true classes"
            ),
            "over all errors: "
            + "  ".join(f"{m} {_fmt(o[m])}" for m in self.measures)
            + f"  sibling {_pct(o['sibling_rate'])}  hypernym {_pct(o['hypernym_rate'])}"
            + f"  hyponym {_pct(o['hyponym_rate'])}",
        ]
        if sort_by == "class":
            order = np.arange(len(self.classes))
        elif sort_by in pc:
            key = np.nan_to_num(pc[sort_by].astype(float), nan=-np.inf)
            order = np.lexsort((np.arange(len(key)), -key))
        else:
            raise ValueError(f"sort_by must be 'class' or one of {list(pc)}, got {sort_by!r}")
        shown = order if max_rows is None else order[:max_rows]
        head = f"{'class':<30} {'n':>4} {'err':>6} {'acc':>6}"
        head += "".join(f" {m[:6]:>6}" for m in self.measures)
        lines.append(head + f" {'sib':>6}  top confusions (MF)")
        for i in shown.tolist():
            w = self.classes[i]
            conf = self.confusions.get(w, [])
            tops = ", ".join(
                f"{_readable(self.taxonomy, self.taxonomy.index[c.pred])} {c.mf:.0%}" for c in conf
            )
            row = f"{w} {self.names[i][:20]:<20} {pc['support'][i]:>4} {pc['n_errors'][i]:>6}"
            row += f" {_pct(pc['accuracy'][i]):>6}"
            row += "".join(f" {_fmt(pc[m][i]):>6}" for m in self.measures)
            lines.append(row + f" {_pct(pc['sibling_rate'][i]):>6}  {tops}")
            if paths:
                for c in conf:
                    rel = f", {c.relation}" if c.relation else ""
                    lines.append(f"    {c.explain()}  ({c.count}, MF {c.mf:.0%}{rel})")
        if len(shown) < len(order):
            lines.append(
                f"({len(shown)} of {len(order)} classes shown, sorted by {sort_by}; "
                "to_text(max_rows=None) shows all)"
            )
        return "\n".join(lines)

    def to_dict(self):
        """Everything as JSON-safe built-in types (NaN becomes None).

        Returns
        -------
        dict
            ``overall``, ``measures``, ``top_k``, and ``classes``: one dict per
            class with its per-class values and ``confusions``.

        Examples
        --------
        >>> import json
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159"], ["n02123045"])
        >>> d = res.to_dict()
        >>> d["classes"][0]["confusions"][0]["path_names"]
        ['tiger cat', 'domestic cat', 'tabby']
        >>> _ = json.dumps(d, allow_nan=False)
        """
        classes = []
        for i, w in enumerate(self.classes.tolist()):
            row = {"wnid": w, "name": self.names[i]}
            for key, values in self.per_class.items():
                v = values[i]
                row[key] = int(v) if values.dtype.kind in "iu" else _json_float(v)
            row["confusions"] = [c.to_dict() for c in self.confusions.get(w, [])]
            classes.append(row)
        overall = {
            k: (v if isinstance(v, int) else _json_float(v)) for k, v in self.overall.items()
        }
        return {
            "overall": overall,
            "measures": list(self.measures),
            "top_k": self.top_k,
            "classes": classes,
        }

    def to_frame(self, kind="classes"):
        """A pandas DataFrame (pandas is optional).

        Parameters
        ----------
        kind : {"classes", "pairs", "confusions"}
            One row per true class, per distinct error pair, or per top
            confusion (with its path).

        Returns
        -------
        pandas.DataFrame

        Examples
        --------
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159", "n02123159"], ["n02123045", "n02123159"])
        >>> res.to_frame()[["name", "n_errors", "sibling_rate"]]  # doctest: +NORMALIZE_WHITESPACE
                        name  n_errors  sibling_rate
        wnid
        n02123159  tiger cat         1           1.0
        """
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - depends on the environment
            raise ImportError(
                "to_frame() needs pandas: pip install 'imagenet_cog[pandas]' (or use to_dict())"
            ) from None
        if kind == "classes":
            df = pd.DataFrame({"wnid": self.classes, "name": self.names, **self.per_class})
            return df.set_index("wnid")
        if kind == "pairs":
            return pd.DataFrame(self.pairs)
        if kind == "confusions":
            rows = [
                {k: v for k, v in c.to_dict().items() if k != "similarity"} | c.similarity
                for w in self.classes.tolist()
                for c in self.confusions.get(w, [])
            ]
            return pd.DataFrame(rows)
        raise ValueError(f"kind must be 'classes', 'pairs' or 'confusions', got {kind!r}")


def _fmt(x):
    return "nan" if x is None or not math.isfinite(float(x)) else f"{float(x):.3f}"


def _pct(x):
    return "-" if x is None or not math.isfinite(float(x)) else f"{float(x):.1%}"


def _wnid_labels(y, classes, name):
    y = y.detach().cpu().numpy() if hasattr(y, "detach") else np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {y.shape}")
    if len(y) == 0:
        return y.astype(str)
    if classes is not None:
        if y.dtype.kind not in "iu":
            raise ValueError(f"with classes=, {name} must hold class indices, got {y.dtype}")
        classes = np.asarray(classes)
        if y.min() < 0 or y.max() >= len(classes):
            raise ValueError(
                f"{name} has class indices outside [0, {len(classes)}) of the {len(classes)} "
                "classes given"
            )
        return classes[y].astype(str)
    if y.dtype.kind not in "UO":
        raise ValueError(
            f"{name} must hold wnids such as 'n02123159', got {y.dtype} values; for class "
            "indices pass classes= (the wnid of each index)"
        )
    return y.astype(str)


def semantic_errors(
    y_true, y_pred, taxonomy=None, top_k=5, *, classes=None, measures=("path", "lch", "wup")
):
    """Where in WordNet a classifier's errors land (SPEC §7).

    For every error (true concept t, predicted p, t ≠ p) this measures the
    WordNet similarity of t and p, whether p is a sibling of t (they share an
    immediate parent), a 1-hop hypernym (p is a parent of t) or a 1-hop
    hyponym (p is a child of t), and the misclassification frequency
    ``MF(t→p) = #(t predicted as p) / #(errors of t)``. Each class's ``top_k``
    confusions are explained by the WordNet path joining t and p.

    Work is done once per distinct (t, p) pair (``np.unique`` over pair
    codes), never per sample: the measures are small matrices from
    :func:`~imagenet_cog.similarity.similarity` over true × predicted
    classes, and the counts are ``bincount`` sums. 50,000 predictions over
    the 1000 IN-1K classes take well under a second once the taxonomy is
    loaded.

    Definitions:

    - Parents are hypernyms and instance hypernyms. With several parents, t
      and p are siblings when they share at least one.
    - The path joining t and p goes up from t to a common subsumer k, then
      down to p. k minimises ``d(t, k) + d(p, k)``, so the path has the
      length behind the path and Leacock-Chodorow similarities (NLTK's
      ``shortest_path_distance``); ties go to the deeper k (larger
      ``max_depth``), then to the lower wnid. This k can differ from NLTK's
      ``lowest_common_hypernyms``, which takes the deepest common ancestor
      whatever the path length: tiger cat and Mexican hairless join through
      *domestic animal* (4 hops), not *carnivore* (7 hops).
    - Means are over errors, each error counting once; per class over the
      errors of that class.

    Parameters
    ----------
    y_true, y_pred : array-like of str, shape (n_samples,)
        wnids (``"n"`` + 8-digit WordNet 3.0 offset), or class indices with
        ``classes``.
    taxonomy : Taxonomy, optional
        Defaults to the bundled WordNet 3.0 taxonomy.
    top_k : int
        Confusions kept per class.
    classes : sequence of str, optional
        The wnid of each class index, when the labels are indices.
    measures : sequence of str or callable
        Similarity measures (any name of
        :func:`~imagenet_cog.similarity.available_measures`); path,
        Leacock-Chodorow and Wu-Palmer by default.

    Returns
    -------
    SemanticErrors

    Examples
    --------
    >>> from imagenet_cog.analysis import semantic_errors
    >>> tiger_cat, tabby, lynx = "n02123159", "n02123045", "n02127052"
    >>> res = semantic_errors([tiger_cat] * 4, [tiger_cat, tabby, tabby, lynx])
    >>> res.overall["n_errors"], round(res.overall["sibling_rate"], 4)  # tabby is a sibling
    (3, 0.6667)
    >>> round(res.mf(tiger_cat, tabby), 4), round(res.overall["path"], 4)  # (1/3 + 1/3 + 1/5) / 3
    (0.6667, 0.2889)
    >>> res.confusions[tiger_cat][1].explain()
    'tiger cat → domestic cat → [cat] → wildcat → lynx'
    """
    tax = taxonomy or load_taxonomy()
    if not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    measures = tuple(measures)
    names = tuple(measure_name(m) for m in measures)
    # Measure names become keys next to these in per_class, overall and pairs.
    reserved = {"true", "pred", "count", "mf", "lcs", "distance", "support", "accuracy"}
    reserved |= {"n_errors", "n_samples", "sibling", "hypernym", "hyponym"}
    reserved |= {f"{x}_rate" for x in ("sibling", "hypernym", "hyponym")}
    if len(set(names)) != len(names) or reserved & set(names):
        raise ValueError(f"measure names must be distinct and not one of {sorted(reserved)}")
    y_true = _wnid_labels(y_true, classes, "y_true")
    y_pred = _wnid_labels(y_pred, classes, "y_pred")
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} labels but y_pred has {len(y_pred)}")
    n = len(y_true)
    if n == 0:
        raise ValueError("no predictions to analyse")

    labels, inv = np.unique(np.concatenate([y_true, y_pred]), return_inverse=True)
    nodes = tax.indices(labels.tolist())  # a clear error names unknown wnids
    n_labels = len(labels)
    t, p = inv[:n].astype(np.int64), inv[n:].astype(np.int64)
    wrong = t != p
    support = np.bincount(t, minlength=n_labels)
    n_err = np.bincount(t[wrong], minlength=n_labels)
    codes, count = np.unique(t[wrong] * n_labels + p[wrong], return_counts=True)
    pt, pp = codes // n_labels, codes % n_labels  # sorted by pt, then pp

    sibling, hypernym, hyponym = _pair_relations(tax, nodes[pt], nodes[pp])
    lcs, distance = _common_subsumer(tax, nodes[pt], nodes[pp])
    sims = {}
    for name, m in zip(names, measures):
        from_distance = _FROM_DISTANCE.get(get_measure(m))
        if from_distance is not None and (distance >= 0).all():
            # The joining path's length is NLTK's shortest_path_distance: no
            # need for a similarity matrix.
            sims[name] = from_distance(distance.astype(np.float64), tax)
        else:
            sims[name] = _pair_measure(m, tax, labels, pt, pp)
    mf = count / n_err[pt]

    # Per class (indexed by label code, then restricted to the true classes).
    true_codes = np.unique(t)
    total_err = int(wrong.sum())
    class_err = n_err[true_codes]

    def per_label(values):
        # Sums over the distinct pairs of each class, weighted by their counts.
        sums = np.bincount(pt, weights=count * values, minlength=n_labels)[true_codes]
        return np.divide(sums, class_err, out=np.full(len(sums), np.nan), where=class_err > 0)

    def overall_mean(values):
        return float((count * values).sum() / total_err) if total_err else math.nan

    per_class = {
        "support": support[true_codes],
        "n_errors": n_err[true_codes],
        "accuracy": 1 - n_err[true_codes] / support[true_codes],
    }
    per_class |= {name: per_label(v) for name, v in sims.items()}
    flags = {"sibling": sibling, "hypernym": hypernym, "hyponym": hyponym}
    per_class |= {f"{k}_rate": per_label(v.astype(float)) for k, v in flags.items()}
    overall = {"n_samples": n, "n_errors": total_err, "accuracy": 1 - total_err / n}
    overall |= {name: overall_mean(v) for name, v in sims.items()}
    overall |= {f"{k}_rate": overall_mean(v.astype(float)) for k, v in flags.items()}

    lcs_w = np.where(lcs >= 0, tax.wnids[np.maximum(lcs, 0)], "")
    pairs = {"true": labels[pt], "pred": labels[pp], "count": count, "mf": mf}
    pairs |= sims | flags | {"lcs": lcs_w, "distance": distance}

    # Top-k per class: by count (descending), then predicted wnid.
    order = np.lexsort((pp, -count, pt))
    group = pt[order]
    rank = np.arange(len(order)) - np.searchsorted(group, group)
    top = order[rank < top_k]
    confusions = {w: [] for w in labels[true_codes].tolist()}
    if len(top):
        a, b, k = nodes[pt[top]], nodes[pp[top]], lcs[top]
        has = k >= 0
        # Both halves of every path at once: t up to the subsumer, p up to it.
        ua, ub = _up_paths(tax, a[has], k[has]), _up_paths(tax, b[has], k[has])
        up_a = np.full((len(top), ua.shape[1]), -1, dtype=np.int64)
        up_b = np.full((len(top), ub.shape[1]), -1, dtype=np.int64)
        up_a[has], up_b[has] = ua, ub
        name_of = {}
        for row, j in enumerate(top.tolist()):
            if has[row]:
                up = up_a[row][up_a[row] >= 0].tolist()
                down = up_b[row][up_b[row] >= 0].tolist()[::-1][1:]
                path_nodes = up + down
            else:
                path_nodes = [int(a[row]), int(b[row])]
            for x in path_nodes:
                if x not in name_of:
                    name_of[x] = _readable(tax, x)
            confusions[labels[pt[j]]].append(
                Confusion(
                    true=str(labels[pt[j]]),
                    pred=str(labels[pp[j]]),
                    count=int(count[j]),
                    mf=float(mf[j]),
                    lcs=str(tax.wnids[k[row]]) if has[row] else None,
                    path=tuple(tax.wnids[path_nodes].tolist()),
                    path_names=tuple(name_of[x] for x in path_nodes),
                    sibling=bool(sibling[j]),
                    hypernym=bool(hypernym[j]),
                    hyponym=bool(hyponym[j]),
                    similarity={name: float(v[j]) for name, v in sims.items()},
                )
            )
    return SemanticErrors(
        taxonomy=tax,
        classes=labels[true_codes],
        per_class=per_class,
        overall=overall,
        pairs=pairs,
        confusions=confusions,
        measures=names,
        top_k=int(top_k),
    )


# ----------------------------------------------------------------- plotting
_TITLES = {
    "alignment": "Alignment (lower: tighter concepts)",
    "uniformity": "Uniformity (lower: more uniform)",
    "purity": "Cluster purity (per concept, paper Eq. 3)",
    "purity_per_cluster": "Cluster purity (per cluster)",
    "nmi": "NMI",
    "ami": "AMI",
    "ari": "ARI",
    "path": "Path similarity of errors",
    "lch": "Leacock-Chodorow similarity of errors",
    "wup": "Wu-Palmer similarity of errors",
    "sibling_rate": "Share of errors on a sibling",
    "hypernym_rate": "Share of errors on a parent",
    "hyponym_rate": "Share of errors on a child",
    "accuracy": "Accuracy",
}
_NOT_PLOTTED = {"k", "t", "inertia", "normalized", "backend", "device"}


def plot_analysis(scores, path=None, *, metrics=None, title=None, dpi=120):
    """Line charts of analysis measures across domains, one panel per measure.

    Parameters
    ----------
    scores : mapping
        ``{domain: {metric: value}}`` for one model, or
        ``{model: {domain: {metric: value}}}`` for several (one line each).
        The results of :func:`cluster_scores`, :func:`alignment_uniformity`
        and :func:`semantic_errors` (its ``overall`` values) work as the
        innermost mappings.
        Domains appear on the x axis in the order given (IN-1K, L1, ..., L5).
    path : str or path-like, optional
        Where to save the figure (PNG, or any format matplotlib knows from
        the suffix).
    metrics : sequence of str, optional
        Which measures, in this order; by default every numeric one except
        counts and bookkeeping (``n_*``, ``k``, ``t``, ``inertia``).
    title : str, optional
    dpi : int

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ImportError
        When matplotlib is missing (it is an optional dependency).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from imagenet_cog.analysis import plot_analysis
    >>> scores = {"IN-1K": {"alignment": 0.8, "nmi": 0.81},
    ...           "L1": {"alignment": 0.9, "nmi": 0.73}}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     fig = plot_analysis(scores, pathlib.Path(tmp) / "analysis.png")
    ...     (pathlib.Path(tmp) / "analysis.png").stat().st_size > 0
    True
    >>> len(fig.axes)
    2
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "plot_analysis needs matplotlib: pip install 'imagenet_cog[plot]'"
        ) from None
    if not isinstance(scores, Mapping) or not scores:
        raise ValueError("scores must be a non-empty mapping")
    first = next(iter(scores.values()))
    first = first if isinstance(first, Mapping) else _as_metrics(first)
    nested = all(isinstance(v, Mapping) or hasattr(v, "to_dict") for v in first.values())
    models = (
        {m: {d: _as_metrics(v) for d, v in doms.items()} for m, doms in scores.items()}
        if nested
        else {None: {d: _as_metrics(v) for d, v in scores.items()}}
    )
    domains = list(dict.fromkeys(d for doms in models.values() for d in doms))
    if metrics is None:
        metrics = list(
            dict.fromkeys(
                m
                for doms in models.values()
                for values in doms.values()
                for m, v in values.items()
                if _is_number(v) and m not in _NOT_PLOTTED and not m.startswith("n_")
            )
        )
    if not metrics:
        raise ValueError("no numeric metric to plot")
    ncols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.2 * nrows + (0.5 if title else 0)), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    x = np.arange(len(domains))
    for ax, metric in zip(axes, metrics):
        for model, doms in models.items():
            ys = [doms.get(d, {}).get(metric) for d in domains]
            ys = np.array([np.nan if v is None else float(v) for v in ys])
            ax.plot(x, ys, marker="o", label=model)
            if model is None:
                for xi, yi in zip(x, ys):
                    if np.isfinite(yi):
                        ax.annotate(
                            f"{yi:.3g}",
                            (xi, yi),
                            textcoords="offset points",
                            xytext=(0, 7),
                            ha="center",
                            fontsize=8,
                            # A light box keeps the label readable over the line.
                            bbox={
                                "boxstyle": "round,pad=0.15",
                                "fc": "white",
                                "ec": "none",
                                "alpha": 0.8,
                            },
                        )
        ax.set_title(_TITLES.get(metric, metric), fontsize=10)
        ax.set_xticks(x, domains)
        ax.grid(alpha=0.3)
        ax.margins(y=0.2)
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    if nested:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(
            handles, labels, loc="outside lower center", ncols=min(len(labels), 6), frameon=False
        )
    if title:
        fig.suptitle(title)
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


# ------------------------------------------------------- PCA and MLP probes
#: Principal components of the PCA probes (supplement C.2 of the first version).
PCA_COMPONENTS = (32, 64, 128, 256, 512, 1024)
_PROBE_METRICS = ("top1", "top5", "val_top1")


@dataclass(frozen=True, eq=False, repr=False)
class ProbeScores:
    """Test accuracy of a probe over seeds, per setting; what :func:`pca_probe` and
    :func:`mlp_probe` return.

    Accuracies are percentages, as in :class:`~imagenet_cog.Results` and the paper's tables.
    Standard deviations are over seeds, population (``ddof=0``) as in ``Results``.

    Attributes
    ----------
    probe : str
        ``"pca"``, ``"mlp"`` or ``"mlp_noact"``.
    records : list of dict
        One per (setting, seed): ``setting`` (the number of components, or the activation),
        ``seed``, ``top1``, ``top5`` (test, %), ``val_top1`` (best trial, %), ``lr``, ``wd``,
        ``n_trials``, ``n_failed_trials``, ``n_features``; PCA adds
        ``explained_variance`` (fraction of the training variance the components keep).

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from imagenet_cog.analysis import pca_probe
    >>> X, y = make_blobs(n_samples=120, centers=[[-3, -3, 0], [3, 3, 0]], random_state=0)
    >>> scores = pca_probe(X[:80], y[:80], X[80:], y[80:], n_components=(1, 2), seeds=(22,),
    ...                    n_trials=2, n_startup_trials=2, epochs=3, device="cpu")
    >>> scores.settings, scores.mean(2)
    ([1, 2], 100.0)
    """

    probe: str
    records: list

    @property
    def settings(self):
        """The settings, in the order they were run."""
        return list(dict.fromkeys(r["setting"] for r in self.records))

    def _values(self, setting, metric):
        vals = [r[metric] for r in self.records if r["setting"] == setting]
        if not vals:
            raise KeyError(f"no {self.probe} results for setting {setting!r}; have {self.settings}")
        return np.asarray(vals, dtype=float)

    def mean(self, setting=None, metric="top1"):
        """Mean over seeds of ``metric`` (``"top1"``, ``"top5"``, ``"val_top1"``).

        ``setting`` defaults to the only one (MLP probes have one).

        Examples
        --------
        >>> from imagenet_cog.analysis import ProbeScores
        >>> s = ProbeScores("pca", [{"setting": 32, "seed": 22, "top1": 70.0},
        ...                         {"setting": 32, "seed": 37, "top1": 72.0}])
        >>> s.mean(32), s.std(32)
        (71.0, 1.0)
        """
        if setting is None:
            setting = self._only()
        return float(self._values(setting, metric).mean())

    def std(self, setting=None, metric="top1"):
        """Standard deviation over seeds (``ddof=0``) of ``metric``."""
        if setting is None:
            setting = self._only()
        return float(self._values(setting, metric).std())

    def _only(self):
        if len(self.settings) != 1:
            raise ValueError(f"several settings {self.settings}: name one")
        return self.settings[0]

    def summary(self):
        """``{setting: {"top1": mean, "top1_std": ..., "top5": ..., ..., "n_seeds": n}}``."""
        out = {}
        for s in self.settings:
            row = {}
            for m in _PROBE_METRICS:
                if all(m in r for r in self.records if r["setting"] == s):
                    v = self._values(s, m)
                    row[m], row[f"{m}_std"] = float(v.mean()), float(v.std())
            recs = [r for r in self.records if r["setting"] == s]
            if "explained_variance" in recs[0]:
                row["explained_variance"] = recs[0]["explained_variance"]
            row["n_seeds"] = len(recs)
            out[s] = row
        return out

    def table(self, digits=1):
        """A text table: one row per setting, test top-1 and top-5 (mean ± std over seeds).

        Examples
        --------
        >>> from imagenet_cog.analysis import ProbeScores
        >>> s = ProbeScores("mlp", [{"setting": "relu", "seed": 22, "top1": 70.0, "top5": 90.0}])
        >>> print(s.table())
        mlp probe, test accuracy (%), mean ± std over 1 seed(s)
        setting       top-1       top-5
        relu     70.0 ± 0.0  90.0 ± 0.0
        """
        rows = [["setting", "top-1", "top-5"]]
        extra = any("explained_variance" in r for r in self.records)
        if extra:
            rows[0].append("variance kept")
        n = 0
        for s, row in self.summary().items():
            cells = [str(s)]
            for m in ("top1", "top5"):
                cells.append(
                    f"{row[m]:.{digits}f} ± {row[m + '_std']:.{digits}f}" if m in row else "-"
                )
            if extra:
                ev = row.get("explained_variance")
                cells.append("-" if ev is None else f"{100 * ev:.1f}%")
            rows.append(cells)
            n = max(n, row["n_seeds"])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])])
            for r in rows
        ]
        title = f"{self.probe} probe, test accuracy (%), mean ± std over {n} seed(s)"
        return "\n".join([title, *lines])

    def __str__(self):
        return self.table()

    def __repr__(self):
        seeds = list(dict.fromkeys(r["seed"] for r in self.records))
        return f"ProbeScores(probe={self.probe!r}, settings={self.settings}, seeds={seeds})"

    def to_dict(self):
        """JSON-safe: ``probe``, ``summary`` (keyed by the setting as text) and ``records``."""

        def safe(v):
            if isinstance(v, (float, np.floating)):
                return _json_float(v)
            if isinstance(v, np.integer):
                return int(v)
            if isinstance(v, list):
                return [safe(x) for x in v]
            if isinstance(v, dict):
                return {str(k): safe(x) for k, x in v.items()}
            return v

        return {
            "probe": self.probe,
            "summary": safe({str(k): v for k, v in self.summary().items()}),
            "records": safe(self.records),
        }


def _host_array(X, name):
    """A NumPy view of features given as an array, a memory map or a torch tensor."""
    if hasattr(X, "detach"):
        X = X.detach().cpu().numpy()
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (samples × features), got shape {X.shape}")
    if X.dtype.kind != "f":
        X = X.astype(np.float64)
    return X


def _l2_rows(Z):
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    return Z / np.maximum(norms, 1e-12)


def pca_probe(
    X_train,
    y_train,
    X_test,
    y_test,
    n_components=PCA_COMPONENTS,
    seeds=SEEDS,
    *,
    normalize=True,
    svd_solver=None,
    trials_per_batch=1,
    **search_kw,
):
    """Linear probes on PCA-reduced features (supplement C.2 of the CoG paper's first version).

    ``sklearn.decomposition.PCA`` is fitted on the training features of the domain; the train
    and test features are projected on the first ``k`` principal components for each ``k`` of
    ``n_components``, and the LogReg protocol (:func:`~imagenet_cog.run_searches`: the TPE
    search over ``lr`` and ``wd`` on a per-class 20% holdout, the retrain, test top-1/top-5 at
    the last epoch) runs on the projections, all ``seeds`` in lockstep for each ``k``.

    Normalisation: the LogReg protocol l2-normalises its inputs, and its learning-rate range
    [0.1, 100] is tuned for unit-norm features. The paper applies PCA and then "follows the
    LogReg protocol", so with ``normalize=True`` (the default) the projected features are
    l2-normalised again before the probe. The projections are centred and shorter than the
    features (a 32-component projection of a unit vector keeps a fraction of its norm), so
    without it the same learning rates would act on much smaller inputs.

    PCA is fitted once with ``max(n_components)`` components and the first ``k`` are taken for
    smaller ``k``: with an exact solver this is the same as a fit per ``k``. The default
    solver is scikit-learn's exact ``"covariance_eigh"`` when there are more samples than
    features (a ``d × d`` covariance, cheap for 1.3M × 2048 features), else ``"full"``.
    The projection is computed in row blocks, so memory maps work.

    Parameters
    ----------
    X_train, X_test : array-like of shape (n_samples, n_features)
        Features as given to the LogReg protocol (l2-normalised for CoG).
    y_train, y_test : array-like of shape (n_samples,)
    n_components : sequence of int
        Each at most ``min(n_train, n_features)``.
    seeds : sequence of int
        One search per seed (the official 22, 37, 45, 77, 93 by default).
    normalize : bool, default=True
        l2-normalise the projected features (see above).
    svd_solver : str, optional
        Passed to ``PCA``.
    trials_per_batch : int, default=1
        As in :func:`~imagenet_cog.evaluate`: 1 keeps the official sequential TPE sequence.
    **search_kw
        Passed to :func:`~imagenet_cog.run_searches` (``n_trials``, ``epochs``,
        ``batch_size``, ``device``, ``lr_range``, ``wd_range``, ...).

    Returns
    -------
    ProbeScores
        ``probe="pca"``, one setting per number of components.

    Raises
    ------
    ValueError
        When a number of components exceeds ``min(n_train, n_features)``, or bad input.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from imagenet_cog.analysis import pca_probe
    >>> X, y = make_blobs(n_samples=240, centers=3, n_features=8, random_state=0)
    >>> scores = pca_probe(X[:180], y[:180], X[180:], y[180:], n_components=(2, 8),
    ...                    seeds=(22,), n_trials=2, n_startup_trials=2, epochs=5, device="cpu")
    >>> scores.settings, scores.mean(8) > 90
    ([2, 8], True)
    """
    from sklearn.decomposition import PCA

    from .probe import make_search_spec, run_searches

    X_train = _host_array(X_train, "X_train")
    X_test = _host_array(X_test, "X_test")
    n, d = X_train.shape
    if X_test.shape[1] != d:
        raise ValueError(f"X_train has {d} features but X_test has {X_test.shape[1]}")
    ks = list(n_components) if not isinstance(n_components, (int, np.integer)) else [n_components]
    if not ks:
        raise ValueError("n_components is empty")
    for k in ks:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"n_components must hold positive ints, got {k!r}")
    ks = sorted({int(k) for k in ks})
    limit = min(n, d)
    if ks[-1] > limit:
        raise ValueError(
            f"n_components={ks[-1]} exceeds min(n_samples, n_features) = {limit} "
            f"({n} training samples, {d} features); PCA has at most {limit} components"
        )
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty")
    y_train = np.asarray(y_train)
    if svd_solver is None:
        svd_solver = "covariance_eigh" if n >= d else "full"
    _check_features(X_train, "X_train")  # NaN would make PCA fail obscurely
    _check_features(X_test, "X_test")
    pca = PCA(n_components=ks[-1], svd_solver=svd_solver).fit(X_train)
    comps = pca.components_.astype(np.float32)
    mean = pca.mean_.astype(np.float32)

    def project(X):
        Z = np.empty((X.shape[0], ks[-1]), dtype=np.float32)
        rows = max(1, _BLOCK_ELEMENTS // (4 * max(d, 1)))
        for s in range(0, X.shape[0], rows):
            Z[s : s + rows] = (np.asarray(X[s : s + rows], dtype=np.float32) - mean) @ comps.T
        return Z

    Z_train, Z_test = project(X_train), project(X_test)
    specs = [make_search_spec(y_train, seed) for seed in seeds]
    ratio = np.cumsum(pca.explained_variance_ratio_)
    records = []
    for k in ks:
        tr, te = Z_train[:, :k], Z_test[:, :k]
        if normalize:
            tr, te = _l2_rows(tr), _l2_rows(te)
        else:
            tr, te = np.ascontiguousarray(tr), np.ascontiguousarray(te)
        results = run_searches(
            tr,
            y_train,
            specs,
            X_test=te,
            y_test=y_test,
            trials_per_batch=trials_per_batch,
            **search_kw,
        )
        for seed, res in zip(seeds, results):
            records.append(
                _probe_record(
                    k,
                    seed,
                    res.test_top1,
                    res.test_top5,
                    res.best_score,
                    res.best_params,
                    res.trials,
                    k,
                )
                | {"explained_variance": float(ratio[k - 1])}
            )
    return ProbeScores("pca", records)


def _probe_record(setting, seed, top1, top5, val_top1, params, trials, n_features):
    failed = sum(t["state"] != "COMPLETE" for t in trials)
    return {
        "setting": setting,
        "seed": int(seed),
        "top1": 100.0 * float(top1),
        "top5": 100.0 * float(top5),
        "val_top1": 100.0 * float(val_top1),
        "lr": float(params["lr"]),
        "wd": float(params["wd"]),
        "n_trials": len(trials),
        "n_failed_trials": int(failed),
        "n_features": int(n_features),
    }


def mlp_probe(
    X_train,
    y_train,
    X_test,
    y_test,
    activation="relu",
    seeds=SEEDS,
    n_trials=30,
    *,
    hidden_layer_sizes=(2048, 2048),
    lr_range=None,
    wd_range=MLP_WD_RANGE,
    n_startup_trials=10,
    epochs=100,
    batch_size=1024,
    momentum=0.9,
    device=None,
    dtype="float32",
    memory_budget=None,
    verbose=0,
):
    """The MLP probe's search and test accuracy (supplement C.3 of the first version).

    For each seed, SPEC §5's search with the ranges of supplement B.2: a per-class random 20%
    of the training set is held out (:func:`~imagenet_cog.make_search_spec`); ``n_trials``
    Optuna TPE trials (``multivariate=True``, seeded with the seed) draw ``lr`` log-uniform
    in [0.1, 100] for the MLP (``activation="relu"``) or [0.01, 10] for MLP_NoAct
    (``"identity"``), and ``wd`` log-uniform in [1e-8, 1e-4]; each trial trains an
    :class:`MLPProbe` (same seed) on the rest and scores its last-epoch validation top-1, a
    non-finite loss failing the trial; the best pair is retrained on the whole training set
    and scored on the test set (top-1, top-5, last epoch).

    The trials run one after the other, in the official sequential order: an MLP's hidden
    layers do not batch into the linear engine's shared passes, so there is no lockstep
    here. Each trial is a full MLP fit, so at the paper's scale (2048-2048 hidden units,
    1.3M samples, 30 trials, 5 seeds) this is GPU work. The features are used as given,
    without l2 normalisation (the paper's choice for MLPs).

    Parameters
    ----------
    X_train, X_test : array-like or torch.Tensor of shape (n_samples, n_features)
    y_train, y_test : array-like of shape (n_samples,)
    activation : {"relu", "identity"}
    seeds : sequence of int
    n_trials : int, default=30
    hidden_layer_sizes : tuple of int, default=(2048, 2048)
    lr_range : (float, float), optional
        Defaults to the paper's range for ``activation``.
    wd_range : (float, float), default=(1e-8, 1e-4)
    n_startup_trials : int, default=10
    epochs, batch_size, momentum, device, dtype, memory_budget, verbose
        As for :class:`MLPProbe`.

    Returns
    -------
    ProbeScores
        ``probe="mlp"`` or ``"mlp_noact"``, one setting (the activation). Each record also
        holds its ``trials`` table.

    Examples
    --------
    >>> from sklearn.datasets import make_circles
    >>> from imagenet_cog.analysis import mlp_probe
    >>> X, y = make_circles(n_samples=300, factor=0.5, noise=0.05, random_state=0)
    >>> s = mlp_probe(X[:200], y[:200], X[200:], y[200:], seeds=(22,), n_trials=2,
    ...               n_startup_trials=2, hidden_layer_sizes=(32,), epochs=30, batch_size=32,
    ...               device="cpu")
    >>> s.probe, len(s.records[0]["trials"])
    ('mlp', 2)
    """
    import optuna

    from ._engine import DeviceData, resolve_device, resolve_dtype
    from ._mlp import MLP_LR_RANGES, _check_hidden, train_mlp
    from .probe import _check_features as _check_probe_features
    from .probe import _encode, _make_study, _quiet_optuna, make_search_spec

    if activation not in MLP_LR_RANGES:
        raise ValueError(f"activation must be 'relu' or 'identity', got {activation!r}")
    lr_range = tuple(MLP_LR_RANGES[activation] if lr_range is None else lr_range)
    wd_range = tuple(wd_range)
    for name, (lo, hi) in (("lr_range", lr_range), ("wd_range", wd_range)):
        if not 0 < lo < hi < math.inf:
            raise ValueError(f"{name} must be (low, high) with 0 < low < high, got {(lo, hi)}")
    if not isinstance(n_trials, (int, np.integer)) or n_trials < 1:
        raise ValueError(f"n_trials must be an int >= 1, got {n_trials!r}")
    hidden = _check_hidden(hidden_layer_sizes)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty")
    X_train = X_train if hasattr(X_train, "ndim") else np.asarray(X_train)
    X_test = X_test if hasattr(X_test, "ndim") else np.asarray(X_test)
    y_train = np.asarray(y_train)
    classes, y_enc = _encode(y_train)
    _check_probe_features(X_train, y_enc.size, "X_train")
    y_test = np.asarray(y_test)
    _check_probe_features(X_test, len(y_test), "X_test", n_features=X_train.shape[1])
    pos = np.searchsorted(classes, y_test).clip(0, len(classes) - 1)
    unknown = classes[pos] != y_test
    if unknown.any():
        raise ValueError(f"y_test holds labels absent from y_train: {np.unique(y_test[unknown])}")
    dev = resolve_device(device)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    tdt = resolve_dtype(dtype)
    data = DeviceData(X_train, y_enc, device=dev, dtype=tdt, memory_budget=memory_budget)
    test = DeviceData(X_test, pos, device=dev, dtype=tdt, memory_budget=memory_budget)
    fit_kw = {
        "n_classes": len(classes),
        "hidden_layer_sizes": hidden,
        "activation": activation,
        "epochs": epochs,
        "batch_size": batch_size,
        "momentum": momentum,
        "verbose": max(0, verbose - 1),
    }
    probe = "mlp" if activation == "relu" else "mlp_noact"
    records = []
    with _quiet_optuna(verbose):
        for seed in seeds:
            spec = make_search_spec(y_train, seed)
            study = _make_study(seed, n_startup_trials)
            table = []
            for _ in range(n_trials):
                trial = study.ask()
                lr = trial.suggest_float("lr", *lr_range, log=True)
                wd = trial.suggest_float("wd", *wd_range, log=True)
                res = train_mlp(
                    data,
                    lr=lr,
                    weight_decay=wd,
                    seed=seed,
                    train_idx=spec.train_idx,
                    eval_idx=spec.val_idx,
                    **fit_kw,
                )
                if res.diverged:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                else:
                    study.tell(trial, res.top1)
                table.append(
                    {
                        "number": trial.number,
                        "lr": lr,
                        "wd": wd,
                        "state": "FAIL" if res.diverged else "COMPLETE",
                        "val_top1": _json_float(res.top1),
                        "val_top5": _json_float(res.top5),
                        "epochs": res.n_epochs,
                    }
                )
            if not study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
                raise ValueError(
                    f"{probe} search seed={seed}: all {n_trials} trials diverged (non-finite "
                    "loss); lower lr_range"
                )
            best = study.best_trial.params
            final = train_mlp(
                data,
                lr=best["lr"],
                weight_decay=best["wd"],
                seed=seed,
                train_idx=spec.final_idx,
                eval_data=test,
                eval_idx=np.arange(test.n),
                **fit_kw,
            )
            if final.diverged:
                from ._mlp import diverged_message

                raise ValueError(
                    f"{probe} search seed={seed}: final fit: "
                    + diverged_message(best["lr"], best["wd"], final.n_epochs)
                )
            rec = _probe_record(
                activation,
                seed,
                final.top1,
                final.top5,
                study.best_value,
                best,
                table,
                X_train.shape[1],
            )
            records.append(rec | {"trials": table})
            if verbose:
                print(f"{probe} seed {seed}: test top-1 {rec['top1']:.2f}%")
    return ProbeScores(probe, records)


# ------------------------------------------------------------------ analyze
#: What :func:`analyze` can compute, in order.
ANALYSES = ("clusters", "alignment", "semantic", "pca", "mlp", "mlp_noact")
_FEATURE_ANALYSES = ("clusters", "alignment", "pca", "mlp", "mlp_noact")
#: Measures of each analysis that go into the per-domain table, in display order.
_DOMAIN_METRICS = {
    "clusters": ("purity", "purity_per_cluster", "nmi", "ami", "ari", "inertia"),
    "alignment": ("alignment", "uniformity"),
    "semantic": ("path", "lch", "wup", "sibling_rate", "hypernym_rate", "hyponym_rate"),
}
_PLOTTED = (
    "purity",
    "nmi",
    "ami",
    "ari",
    "alignment",
    "uniformity",
    "path",
    "lch",
    "wup",
    "sibling_rate",
    "hypernym_rate",
    "hyponym_rate",
)
_ANALYSIS_FILE = "analysis.json"
#: Top confusions of a domain kept in ``analysis.json``.
_JSON_CONFUSIONS = 20


def _predictions_folder(path):
    """The ``predictions/`` folder of an evaluate output folder, or the folder itself."""
    from .protocol import PREDICTIONS_DIR

    path = Path(path)
    if (path / PREDICTIONS_DIR).is_dir():
        return path / PREDICTIONS_DIR
    if path.is_dir() and any(path.glob("*__*__*.npz")):
        return path
    raise FileNotFoundError(
        f"no saved predictions in {path}: expected {path / PREDICTIONS_DIR}/ with "
        "<domain>__<shots>__<seed>.npz files (run evaluate with save_predictions=True, or "
        "imagenet-cog evaluate --save-predictions)"
    )


def _prediction_cells(folder):
    """``{(domain, shots, seed): path}`` of the prediction files in ``folder``."""
    from .results import normalize_shots

    cells = {}
    for f in sorted(folder.glob("*__*__*.npz")):
        parts = f.stem.rsplit("__", 2)
        try:
            cells[(parts[0], normalize_shots(parts[1]), int(parts[2]))] = f
        except ValueError:  # not a file of ours
            continue
    return cells


def load_predictions(path, domain, shots="all", seed=None):
    """Saved test predictions of :func:`~imagenet_cog.evaluate` (``save_predictions=True``).

    Parameters
    ----------
    path : path
        An ``evaluate`` output folder (holding ``predictions/``), or that folder itself.
    domain : str
    shots : int or "all"
    seed : int, optional
        Defaults to the lowest seed saved for the cell.

    Returns
    -------
    dict
        ``y_true``, ``y_pred``, ``classes`` (str arrays), ``top5`` (int indices into
        ``classes``), ``seed`` and ``path``. Loaded without pickle.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import numpy as np
    >>> from imagenet_cog.analysis import load_predictions
    >>> folder = pathlib.Path(tempfile.mkdtemp()) / "predictions"
    >>> folder.mkdir()
    >>> np.savez(folder / "L1__all__22.npz", y_true=np.array(["a", "b"]),
    ...          y_pred=np.array(["a", "a"]), top5=np.array([[0, 1], [0, 1]]),
    ...          classes=np.array(["a", "b"]))
    >>> p = load_predictions(folder.parent, "L1")
    >>> p["seed"], p["y_pred"].tolist()
    (22, ['a', 'a'])
    """
    from .results import normalize_shots

    folder = _predictions_folder(path)
    shots = normalize_shots(shots)
    cells = _prediction_cells(folder)
    found = sorted(s for (d, n, s) in cells if d == domain and n == shots)
    if not found:
        have = sorted({f"{d} N={n}" for (d, n, _) in cells})
        raise FileNotFoundError(f"no predictions for {domain} N={shots} in {folder}; have {have}")
    seed = found[0] if seed is None else int(seed)
    if seed not in found:
        raise FileNotFoundError(f"no predictions for {domain} N={shots} seed {seed}; have {found}")
    file = cells[(domain, shots, seed)]
    with np.load(file, allow_pickle=False) as z:
        out = {k: z[k] for k in ("y_true", "y_pred", "top5", "classes")}
    return out | {"seed": seed, "path": str(file)}


def _semantic_summary(errs, seeds, shots, first):
    """The JSON summary of a domain's semantic errors (``errs``: one per seed)."""
    overall = {}
    for key in errs[0].overall:
        vals = [e.overall[key] for e in errs]
        vals = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
        overall[key] = _json_float(np.mean(vals)) if vals else None
    for key in ("n_samples", "n_errors"):
        if len(errs) == 1:
            overall[key] = int(errs[0].overall[key])
    pairs = first.pairs
    order = np.lexsort((pairs["pred"], pairs["true"], -pairs["count"]))[:_JSON_CONFUSIONS]
    tops = []
    for i in order.tolist():
        t, p = str(pairs["true"][i]), str(pairs["pred"][i])
        conf = next((c for c in first.confusions.get(t, []) if c.pred == p), None)
        row = {"true": t, "pred": p, "count": int(pairs["count"][i]), "mf": float(pairs["mf"][i])}
        if conf is not None:
            row |= {"relation": conf.relation, "explanation": conf.explain()}
        tops.append(row)
    return {
        "shots": shots,
        "seeds": [int(s) for s in seeds],
        "overall": overall,
        "n_classes": len(first.classes),
        "top_confusions": tops,
        "confusions_seed": int(seeds[0]),
    }


class AnalysisReport:
    """What :func:`analyze` returns: the analyses of one model's domains.

    Attributes
    ----------
    model : str
    domains : dict of str to dict
        ``{domain: {measure: value}}``: cluster scores (``purity`` is the paper's Eq. 3, per
        concept; ``purity_per_cluster`` the textbook one; ``nmi``, ``ami``, ``ari``,
        ``inertia``), ``alignment`` and ``uniformity``, the semantic measures of the errors
        (``path``, ``lch``, ``wup``, ``sibling_rate``, ``hypernym_rate``, ``hyponym_rate``)
        and probe accuracies (``pca<k>_top1``, ``mlp_top1``, ``mlp_noact_top1``, in %).
    semantic : dict of str to dict
        JSON summary of each domain's error analysis: ``overall``, ``seeds``, ``shots`` and
        its ``top_confusions`` with their WordNet explanation.
    probes : dict of str to dict
        ``{domain: {"pca": ProbeScores.to_dict(), ...}}`` when probes ran.
    settings : dict
    errors : dict of str to SemanticErrors
        The full error analysis of each domain (first seed), not saved to JSON.
    probe_scores : dict of str to dict of ProbeScores
        Not saved to JSON.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import analyze
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(np.arange(3), 10)
    >>> X = rng.normal(size=(3, 4))[y] * 5 + rng.normal(size=(30, 4))
    >>> report = analyze({"L1": (X, y, X, y)}, analyses=("alignment",), device="cpu")
    >>> sorted(report.domains["L1"])[:2], report.to_dict()["model"]
    (['alignment', 'uniformity'], 'model')
    """

    def __init__(
        self,
        model,
        domains,
        semantic=None,
        probes=None,
        settings=None,
        errors=None,
        probe_scores=None,
    ):
        self.model = model
        self.domains = domains
        self.semantic = semantic or {}
        self.probes = probes or {}
        self.settings = settings or {}
        self.errors = errors or {}
        self.probe_scores = probe_scores or {}

    def to_dict(self):
        """Everything but the in-memory objects, JSON-safe (what ``analysis.json`` holds)."""
        out = {"model": self.model, "domains": self.domains, "semantic": self.semantic}
        if self.probes:
            out["probes"] = self.probes
        return out | {"settings": self.settings}

    def save(self, path):
        """Write :meth:`to_dict` as JSON, atomically (a temporary file, then a rename).

        Returns
        -------
        pathlib.Path
        """
        import json
        import os

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return path

    def table(self, digits=3):
        """A text table: one row per domain, a column per measure, and alignment and
        uniformity relative to IN-1K (``Δalign``, ``Δunif``). Rates are in percent.

        Returns
        -------
        str
        """
        from .results import format_analysis_table

        return format_analysis_table(self.to_dict(), self.model, digits)

    def __str__(self):
        return self.table()

    def __repr__(self):
        return (
            f"AnalysisReport(model={self.model!r}, domains={list(self.domains)}, "
            f"analyses={self.settings.get('analyses')})"
        )

    def plot(self, path=None, metrics=None, dpi=120):
        """The measures per domain, one panel each (:func:`plot_analysis`).

        Parameters
        ----------
        path : path, optional
            Where to save (PNG).
        metrics : sequence of str, optional
            By default the paper's measures present: purity, NMI, AMI, ARI, alignment,
            uniformity, the semantic measures, and the probe accuracies.

        Returns
        -------
        matplotlib.figure.Figure
        """
        from .results import display_domain

        present = {m for values in self.domains.values() for m in values}
        if metrics is None:
            metrics = [m for m in _PLOTTED if m in present]
            metrics += sorted(m for m in present if m.endswith("_top1"))
        scores = {display_domain(d): v for d, v in self.domains.items()}
        return plot_analysis(scores, path, metrics=metrics, title=self.model, dpi=dpi)


def analyze(
    features=None,
    out=None,
    domains=None,
    analyses=("clusters", "alignment", "semantic"),
    predictions=None,
    seeds=3,
    device=None,
    *,
    model=None,
    top_k=5,
    shots="all",
    semantic_seed="first",
    taxonomy=None,
    probe_seeds=SEEDS,
    pca_components=PCA_COMPONENTS,
    probe_kw=None,
    verbose=0,
):
    """Run the analyses beyond accuracy on a model's features and predictions.

    Per domain (IN-1K and L1..L5, or whatever the features hold):

    - ``"clusters"``: :func:`cluster_scores`: k-means (k = the number of concepts, the lowest
      inertia of ``seeds`` runs) on the train features, test samples assigned to the nearest
      centroid, scored with purity (per concept, the paper's Eq. 3), NMI, AMI and ARI;
    - ``"alignment"``: :func:`alignment_uniformity` on the l2-normalised test features;
    - ``"semantic"``: :func:`semantic_errors` of the linear probe's test predictions saved by
      :func:`~imagenet_cog.evaluate` (``save_predictions=True``): by default the all-data
      cell of the lowest seed (``semantic_seed="first"``); ``"mean"`` averages the overall
      measures over every saved seed (the confusions stay the first seed's); an int picks
      that seed;
    - optional and costly: ``"pca"`` (:func:`pca_probe` over the ``pca_components`` that
      do not exceed ``min(n_train, n_features)``), ``"mlp"`` and ``"mlp_noact"``
      (:func:`mlp_probe`), over ``probe_seeds``.

    Without ``features`` only the semantic analysis runs; without ``predictions`` it is
    skipped. ``settings["skipped"]`` says what was skipped and why.

    Parameters
    ----------
    features : path or mapping, optional
        A feature-store root, or ``{domain: (X_train, y_train, X_test, y_test)}`` as for
        :func:`~imagenet_cog.evaluate`.
    out : path, optional
        Folder to write ``analysis.json`` into (atomically). Put it beside the ``runs.jsonl``
        of the evaluation and :meth:`Results.load <imagenet_cog.Results.load>` shows it.
    domains : sequence of str, optional
        Default: every domain of the features (or of the predictions).
    analyses : sequence of str
        Among ``"clusters"``, ``"alignment"``, ``"semantic"``, ``"pca"``, ``"mlp"``,
        ``"mlp_noact"``.
    predictions : path, optional
        An evaluate output folder holding ``predictions/`` (or that folder).
    seeds : int
        k-means runs per domain (the paper: 3).
    device : str, optional
        For k-means, alignment/uniformity and the probes; default CUDA when available.
    model : str, optional
        Name in the output (default: the store's model spec, or the evaluation's model).
    top_k : int
        Confusions explained per class.
    shots : int or "all"
        The cell whose predictions the semantic analysis reads.
    semantic_seed : "first", "mean" or int
    taxonomy : Taxonomy, optional
        For the semantic analysis; the bundled WordNet by default.
    probe_seeds, pca_components : sequences
        For the PCA and MLP probes.
    probe_kw : dict, optional
        Passed to :func:`pca_probe` and :func:`mlp_probe` (``n_trials``, ``epochs``, ...).
    verbose : int
        1: a line per domain and analysis.

    Returns
    -------
    AnalysisReport

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import analyze
    >>> rng = np.random.default_rng(0)
    >>> def domain(sep):
    ...     means = rng.normal(size=(3, 8)) * sep
    ...     y_tr, y_te = np.repeat(np.arange(3), 20), np.repeat(np.arange(3), 10)
    ...     return (means[y_tr] + rng.normal(size=(60, 8)), y_tr,
    ...             means[y_te] + rng.normal(size=(30, 8)), y_te)
    >>> report = analyze({"in1k": domain(4.0), "L5": domain(0.5)}, device="cpu")
    >>> report.domains["in1k"]["nmi"] > report.domains["L5"]["nmi"]
    True
    >>> print(report.table())  # doctest: +ELLIPSIS
    analysis of model
    domain  purity    NMI    AMI    ARI  align  Δalign    unif   Δunif
    IN-1K    1.000  1.000  1.000  1.000 ...
    L5 ...
    """
    from . import __version__
    from .results import DOMAINS, normalize_shots

    analyses = tuple(dict.fromkeys(analyses))
    unknown = [a for a in analyses if a not in ANALYSES]
    if unknown:
        raise ValueError(f"unknown analyses {unknown}; choose among {list(ANALYSES)}")
    if semantic_seed not in ("first", "mean") and not isinstance(semantic_seed, (int, np.integer)):
        raise ValueError(f"semantic_seed must be 'first', 'mean' or a seed, got {semantic_seed!r}")
    shots = normalize_shots(shots)
    skipped = {}
    source = None
    if features is not None:
        from .protocol import _DomainData

        if not isinstance(features, Mapping) and not Path(features).is_dir():
            raise FileNotFoundError(f"features: no feature-store folder at {features}")
        source = _DomainData(features)
    else:
        for a in analyses:
            if a in _FEATURE_ANALYSES:
                skipped[a] = "no features given"
    cells = {}
    pred_folder = None
    if predictions is not None:
        pred_folder = _predictions_folder(predictions)
        cells = _prediction_cells(pred_folder)
    elif "semantic" in analyses:
        skipped["semantic"] = "no predictions given"
    todo = [a for a in analyses if a not in skipped]
    if not todo:
        raise ValueError(
            f"nothing to compute: {'; '.join(f'{a}: {why}' for a, why in skipped.items())}"
        )

    if source is not None:
        available = source.available()
    else:
        available = list(dict.fromkeys(d for (d, n, _) in cells if n == shots))

    def order(names):
        return sorted(names, key=lambda d: (DOMAINS.index(d), "") if d in DOMAINS else (9, d))

    if domains is None:
        domains = order(available)
    else:
        domains = list(domains)
        missing = [d for d in domains if d not in available]
        if missing:
            what = "features" if source is not None else f"predictions (N={shots})"
            raise ValueError(f"no {what} for domain(s) {missing}; available: {order(available)}")
    if not domains:
        raise ValueError("no domains to analyse")

    if model is None:
        model = _model_name(source, predictions)
    probe_kw = dict(probe_kw or {})
    per_domain, semantic, probes, errors, probe_scores = {}, {}, {}, {}, {}
    dev = str(_resolve_device(device))
    for domain in domains:
        row = {}
        if source is not None and any(a in todo for a in _FEATURE_ANALYSES):
            X_train, y_train, X_test, y_test = source.load(domain)
            if "clusters" in todo:
                if verbose:
                    print(f"{domain}: k-means on {X_train.shape[0]} train features")
                cs = cluster_scores(X_train, X_test, y_test, seeds=seeds, device=device)
                row |= {m: _json_float(getattr(cs, m)) for m in _DOMAIN_METRICS["clusters"]}
            if "alignment" in todo:
                if verbose:
                    print(f"{domain}: alignment and uniformity of {X_test.shape[0]} test features")
                au = alignment_uniformity(X_test, y_test, device=device)
                row |= {
                    "alignment": _json_float(au.alignment),
                    "uniformity": _json_float(au.uniformity),
                }
            for probe in ("pca", "mlp", "mlp_noact"):
                if probe not in todo:
                    continue
                if verbose:
                    print(f"{domain}: {probe} probe")
                kw = {"device": device} | probe_kw
                if probe == "pca":
                    ks = [k for k in pca_components if k <= min(X_train.shape)]
                    if not ks:
                        raise ValueError(f"{domain}: every pca_components exceeds min(n, d)")
                    ps = pca_probe(X_train, y_train, X_test, y_test, ks, probe_seeds, **kw)
                    row |= {f"pca{k}_top1": _json_float(ps.mean(k)) for k in ps.settings}
                else:
                    act = "relu" if probe == "mlp" else "identity"
                    ps = mlp_probe(X_train, y_train, X_test, y_test, act, probe_seeds, **kw)
                    row[f"{probe}_top1"] = _json_float(ps.mean())
                probe_scores.setdefault(domain, {})[probe] = ps
                probes.setdefault(domain, {})[probe] = ps.to_dict()
            source.release(domain)
        if "semantic" in todo:
            found = sorted(s for (d, n, s) in cells if d == domain and n == shots)
            if semantic_seed not in ("first", "mean"):
                found = [s for s in found if s == int(semantic_seed)]
            if not found:
                skipped.setdefault("semantic_domains", {})[domain] = (
                    f"no predictions for N={shots}"
                    + ("" if semantic_seed in ("first", "mean") else f" seed {semantic_seed}")
                )
            else:
                use = found if semantic_seed == "mean" else found[:1]
                if verbose:
                    print(f"{domain}: semantic errors of seed(s) {use}")
                errs = []
                for s in use:
                    p = load_predictions(pred_folder, domain, shots, s)
                    errs.append(semantic_errors(p["y_true"], p["y_pred"], taxonomy, top_k))
                errors[domain] = errs[0]
                semantic[domain] = _semantic_summary(errs, use, shots, errs[0])
                row |= {m: semantic[domain]["overall"].get(m) for m in _DOMAIN_METRICS["semantic"]}
        per_domain[domain] = row
    settings = {
        "analyses": [a for a in analyses if a not in skipped],
        "skipped": skipped,
        "features": None
        if features is None
        else ("arrays" if isinstance(features, Mapping) else str(features)),
        "predictions": None if pred_folder is None else str(pred_folder),
        "kmeans_seeds": int(seeds),
        "device": dev,
        "top_k": int(top_k),
        "shots": shots,
        "semantic_seed": semantic_seed if isinstance(semantic_seed, str) else int(semantic_seed),
        "definitions": {
            "purity": "per concept: mean over concepts of the share of its test samples in its "
            "most common cluster (the paper's Eq. 3, normalised to [0, 1])",
            "alignment": "mean squared distance of l2-normalised same-concept test pairs",
            "uniformity": "log mean exp(-2 d^2) over distinct pairs of l2-normalised test features",
            "semantic": "WordNet measures of (true, predicted) over the errors; the joining "
            "path goes through the common subsumer minimising the path length",
        },
        "library_version": __version__,
    }
    if any(a in settings["analyses"] for a in ("pca", "mlp", "mlp_noact")):
        settings["probes"] = {
            "seeds": [int(s) for s in probe_seeds],
            "pca_components": [int(k) for k in pca_components],
            **{k: v for k, v in probe_kw.items() if isinstance(v, (int, float, str, bool))},
        }
    report = AnalysisReport(model, per_domain, semantic, probes, settings, errors, probe_scores)
    if out is not None:
        report.save(Path(out) / _ANALYSIS_FILE)
    return report


def _model_name(source, predictions):
    """The store's model spec, else the evaluation's model, else ``"model"``."""
    import json

    if source is not None and source.kind == "store":
        try:
            return source.model_name()
        except (OSError, KeyError, ValueError, IndexError):
            pass
    if predictions is not None:
        base = Path(predictions)
        for folder in (base, base.parent):
            config = folder / "config.json"
            if config.is_file():
                name = json.loads(config.read_text(encoding="utf-8")).get("model")
                if name:
                    return str(name)
    return "model"
