"""The weighted k-NN classifier on frozen features, as a scikit-learn estimator.

Probe stage: :class:`~imagenet_cog.KNNProbe` joins the wing's neighbour search
(:mod:`.search`) and votes (:mod:`.votes`).
"""

from __future__ import annotations

import numbers
import warnings
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .._device import DeviceTagsMixin, placement
from .._validation import DTYPE, INT, REAL, SGD_PARAMS, Param, check_params
from .search import cosine_topk
from .votes import DINO_KS, DINO_TEMPERATURE, class_votes, ranked_classes

__all__ = ["KNNProbe"]

_PRECISIONS = (None, "tf32")


class KNNProbe(DeviceTagsMixin, ClassifierMixin, BaseEstimator):
    """Weighted k-nearest-neighbour classification on frozen features (DINO's k-NN).

    The protocol of DINO's k-NN evaluation (Caron et al., *Emerging Properties in
    Self-Supervised Vision Transformers*, ICCV 2021): the features are l2-normalised, each
    test row finds its ``n_neighbors`` most similar training rows by cosine similarity ``s``,
    and each votes for its class with weight ``exp(s / temperature)``. :meth:`predict_proba`
    is the votes normalised to sum 1, the same as scikit-learn's
    ``KNeighborsClassifier(metric="cosine", algorithm="brute",
    weights=lambda d: np.exp((1 - d) / temperature))``. This is another evaluation than the
    paper's linear probe: its accuracies are not comparable with linear-probe numbers.

    Fitting stores the training set (no copy of a float array). The search runs in torch on
    the GPU or the CPU, in blocks of test rows against blocks of training rows with a running
    top-k, so that no test × training matrix is ever held whole; its memory is planned from
    ``memory_budget``. :meth:`top_classes` ranks the classes at several ``k`` from one search
    at the largest.

    **Ties.** Neighbours are ordered by similarity, and equal similarities by training row
    (the lower row first, e.g. the first of two duplicated images); a class tie in the votes
    goes to the class that comes first in ``classes_``, as scikit-learn decides it.

    Parameters
    ----------
    n_neighbors : int, default=20
        Neighbours that vote (DINO reports 20; it also computes 10, 100 and 200).
    temperature : float, default=0.07
        ``T`` of the weights ``exp(s / T)``.
    device : str or torch.device, optional
        Where the search runs. ``None``: CUDA when available, else the CPU.
    dtype : {None, "float32", "float64"}, default=None
        Of the features on the device and of their products. ``None``: the training
        features' (float32 for a feature store's, float64 for float64 arrays).
    mixed_precision : {None, "tf32"}, default=None
        ``"tf32"``: float32 products may use TF32 tensor cores on CUDA (similarities to about
        1e-3; no effect on the CPU).
    memory_budget : int, optional
        Most bytes the search may hold on the device. ``None``: 60% of the free CUDA memory
        on CUDA; a few hundred MB of products on the CPU.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` has string column names.
    n_samples_fit_ : int
        Training rows.

    See Also
    --------
    LinearProbe : the paper's protocol, a linear classifier trained on the features.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from imagenet_cog import KNNProbe
    >>> X, y = make_blobs(n_samples=300, centers=3, n_features=8, random_state=0)
    >>> knn = KNNProbe(n_neighbors=10, device="cpu").fit(X, y)
    >>> knn.score(X, y) > 0.9
    True
    >>> ranked = knn.top_classes(X[:4], n_neighbors=(10, 20), top=2)
    >>> sorted(ranked), ranked[20].shape
    ([10, 20], (4, 2))
    """

    _parameter_checks: ClassVar[dict[str, Param]] = {
        "n_neighbors": Param(INT, lambda v: v >= 1, "an int >= 1"),
        "temperature": Param(REAL, lambda v: 0 < v < np.inf, "a finite float > 0"),
        "dtype": Param(None, lambda v: v is None or DTYPE.test(v), "None, 'float32' or 'float64'"),
        "mixed_precision": Param(None, lambda v: v in _PRECISIONS, f"one of {_PRECISIONS}"),
        "memory_budget": SGD_PARAMS["memory_budget"],
    }

    def __init__(
        self,
        n_neighbors=20,
        temperature=DINO_TEMPERATURE,
        device=None,
        dtype=None,
        mixed_precision=None,
        memory_budget=None,
    ):
        self.n_neighbors = n_neighbors
        self.temperature = temperature
        self.device = device
        self.dtype = dtype
        self.mixed_precision = mixed_precision
        self.memory_budget = memory_budget

    def fit(self, X, y):
        """Store the training set.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Features, without NaN or infinity; normalised by the search.
        y : array-like of shape (n_samples,)
            Class labels (any sortable labels: ints, strings, wnids).

        Returns
        -------
        self : KNNProbe

        Examples
        --------
        >>> from imagenet_cog import KNNProbe
        >>> knn = KNNProbe(n_neighbors=1, device="cpu").fit([[0.0, 1.0], [1.0, 0.0]], ["a", "b"])
        >>> knn.classes_.tolist(), knn.n_samples_fit_
        (['a', 'b'], 2)
        """
        X, y = validate_data(self, X, y, dtype=(np.float32, np.float64))
        with warnings.catch_warnings():
            # One image per class is the few-shot protocol's N = 1, not a regression target.
            warnings.filterwarnings("ignore", "The number of unique classes is greater than 50%")
            check_classification_targets(y)
        check_params(self)
        placement(self.device, self._dtype(X))  # a device this machine lacks fails here
        self.classes_, codes = np.unique(y, return_inverse=True)
        self._fit_X = X
        self._y_codes = codes.astype(np.int64).ravel()
        self.n_samples_fit_ = int(X.shape[0])
        return self

    def _dtype(self, X):
        return self.dtype or ("float64" if X.dtype == np.float64 else "float32")

    def _neighbors(self, X, k):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=(np.float32, np.float64))
        if k > self.n_samples_fit_:
            raise ValueError(
                f"n_neighbors={k} is more than the {self.n_samples_fit_} training rows: "
                "lower n_neighbors"
            )
        place = placement(self.device, self._dtype(self._fit_X), self.mixed_precision)
        return cosine_topk(
            X,
            self._fit_X,
            k,
            device=place.device,
            dtype=place.weights,
            tf32=place.tf32,
            memory_budget=self.memory_budget,
        )

    def kneighbors(self, X, n_neighbors=None, return_distance=True):
        """The nearest training rows of each row, as ``KNeighborsClassifier.kneighbors`` with
        ``metric="cosine"`` gives them.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
        n_neighbors : int, optional
            Defaults to the estimator's.
        return_distance : bool, default=True

        Returns
        -------
        distances : ndarray of shape (n_queries, n_neighbors)
            Cosine distances ``1 - similarity``, nearest first. Only with ``return_distance``.
        indices : ndarray of int64, shape (n_queries, n_neighbors)
            Rows of the training set; equal distances in row order.

        Examples
        --------
        >>> from imagenet_cog import KNNProbe
        >>> knn = KNNProbe(n_neighbors=2, device="cpu").fit([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [0, 1, 1])
        >>> knn.kneighbors([[1.0, 0.1]], return_distance=False).tolist()
        [[0, 2]]
        """
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        Param(INT, lambda v: v >= 1, "an int >= 1").check("n_neighbors", k)
        values, rows = self._neighbors(X, int(k))
        if not return_distance:
            return rows
        return 1.0 - values.astype(np.float64), rows

    def predict_proba(self, X):
        """The neighbours' weighted votes, normalised to sum 1 over the classes.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Columns in the order of ``classes_``.

        Examples
        --------
        >>> from imagenet_cog import KNNProbe
        >>> knn = KNNProbe(n_neighbors=2, temperature=1.0, device="cpu")
        >>> knn.fit([[1.0, 0.0], [0.0, 1.0]], ["a", "b"]).predict_proba([[1.0, 0.0]]).round(3)
        array([[0.731, 0.269]])
        """
        values, rows = self._neighbors(X, self.n_neighbors)
        return class_votes(
            values, rows, self._y_codes, len(self.classes_), self.n_neighbors, self.temperature
        )

    def predict(self, X):
        """The most voted class of each row (a tie goes to the first of ``classes_``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)

        Examples
        --------
        >>> from imagenet_cog import KNNProbe
        >>> knn = KNNProbe(n_neighbors=1, device="cpu").fit([[1.0, 0.0], [0.0, 1.0]], ["a", "b"])
        >>> knn.predict([[0.2, 0.9]]).tolist()
        ['b']
        """
        proba = self.predict_proba(X)  # checks the fit before classes_ is read
        return self.classes_[proba.argmax(axis=1)]

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of :meth:`predict` on ``(X, y)``: the k-NN's top-1, not a linear
        probe's.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), optional

        Returns
        -------
        float

        Examples
        --------
        >>> from imagenet_cog import KNNProbe
        >>> knn = KNNProbe(n_neighbors=1, device="cpu").fit([[1.0, 0.0], [0.0, 1.0]], ["a", "b"])
        >>> knn.score([[0.9, 0.1], [0.2, 0.9]], ["a", "a"])
        0.5
        """
        # Its own docstring: scikit-learn's cites a label of its docs that ours lack.
        return super().score(X, y, sample_weight=sample_weight)

    def top_classes(self, X, n_neighbors=DINO_KS, top=5):
        """The ``top`` most voted classes of each row at each ``k``, from one search.

        The neighbours are searched once, at the largest ``k``; the votes of each smaller
        ``k`` are those of its first neighbours. Top-1 is column 0, and a row is right at
        top-5 when its class is in the first 5 columns.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        n_neighbors : int or sequence of int, default=(10, 20, 100, 200)
            DINO's values by default.
        top : int, default=5
            Classes ranked per row (at most ``n_classes``).

        Returns
        -------
        dict
            ``{k: ndarray of shape (n_samples, top)}``: labels of ``classes_``, most voted
            first; equal votes in the order of ``classes_``.

        Examples
        --------
        >>> from imagenet_cog import KNNProbe
        >>> X = [[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]
        >>> knn = KNNProbe(device="cpu").fit(X, ["a", "a", "b"])
        >>> ranked = knn.top_classes([[1.0, 0.05]], n_neighbors=(1, 3), top=2)
        >>> ranked[1].tolist(), ranked[3].tolist()
        ([['a', 'b']], [['a', 'b']])
        """
        ks = [n_neighbors] if isinstance(n_neighbors, numbers.Integral) else list(n_neighbors)
        if not ks:
            raise ValueError("n_neighbors must name at least one k")
        for k in ks:
            Param(INT, lambda v: v >= 1, "an int >= 1 (or a sequence of them)").check(
                "n_neighbors", k
            )
        Param(INT, lambda v: v >= 1, "an int >= 1").check("top", top)
        values, rows = self._neighbors(X, int(max(ks)))
        ranked = ranked_classes(
            values, rows, self._y_codes, len(self.classes_), ks, self.temperature, top
        )
        return {k: self.classes_[codes] for k, codes in ranked.items()}
