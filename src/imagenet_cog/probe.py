"""Linear probes on frozen features: ImageNet-CoG's protocol as scikit-learn estimators.

* :class:`LinearProbe` trains one softmax-regression probe with the official protocol
  (SGD, momentum 0.9, cosine decay, 100 epochs, batch 1024), or with full-batch L-BFGS.
* :class:`LinearProbeCV` adds the official hyper-parameter search: 30 Optuna TPE trials over
  the learning rate and the weight decay, scored on a per-class 20% holdout, then a retrain on
  the whole training set. A few-shot option follows the paper's rule.
* :func:`run_searches` runs many such searches in lockstep (e.g. the five seeds of a domain),
  so that the trials of every search train in the same pass over the features.

All three train on the GPU when there is one. Fitted state is NumPy on the CPU, so a probe
fitted on a GPU pickles and predicts on a machine without one.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings

import numpy as np
from scipy.special import expit, log_softmax, softmax
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import assert_all_finite, check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._grid import SEEDS  # noqa: F401 (re-exported: the official seeds)

# Their old names here, which analysis.py and the tests use.
from ._schedule import make_study as _make_study  # noqa: F401
from ._schedule import quiet_optuna as _quiet_optuna  # noqa: F401
from ._schedule import round_sizes as _round_sizes  # noqa: F401

__all__ = [
    "LinearProbe",
    "LinearProbeCV",
    "SearchResult",
    "SearchSpec",
    "make_search_spec",
    "run_searches",
]

#: Search space of the official protocol (the paper, Sec. 3.4.2 and supplement B.2).
LR_RANGE = (0.1, 100.0)
WD_RANGE = (1e-12, 1e-4)

_MIXED = (None, "tf32", "bf16")


def _precisions(dtype, mixed_precision):
    """(weight dtype, feature dtype, tf32) for the ``dtype``/``mixed_precision`` parameters."""
    import torch

    from ._engine import resolve_dtype

    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    if mixed_precision not in _MIXED:
        raise ValueError(f"mixed_precision must be one of {_MIXED}, got {mixed_precision!r}")
    wdt = resolve_dtype(dtype)
    if mixed_precision == "tf32" and wdt != torch.float32:
        raise ValueError("mixed_precision='tf32' needs dtype='float32'")
    fdt = torch.bfloat16 if mixed_precision == "bf16" else wdt
    return wdt, fdt, mixed_precision == "tf32"


def _seed(random_state):
    """An int seed: an int ``random_state`` is used as is (seed 22 means 22 everywhere)."""
    if isinstance(random_state, numbers.Integral):
        return int(random_state)
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _check_params(est, spec):
    """Check simple parameters: ``spec`` maps a name to (kind, test, wording)."""
    for name, (kinds, ok, wording) in spec.items():
        value = getattr(est, name)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise TypeError(f"{name} must be {wording}, got {value!r}")
        if not ok(value):
            raise ValueError(f"{name} must be {wording}, got {value!r}")


_REAL, _INT = (numbers.Real,), (numbers.Integral,)
_SGD_PARAMS = {
    "epochs": (_INT, lambda v: v >= 1, "an int >= 1"),
    "batch_size": (_INT, lambda v: v >= 1, "an int >= 1"),
    "momentum": (_REAL, lambda v: 0 <= v < 1, "a float in [0, 1)"),
    "schedule": ((str,), lambda v: v in ("cosine", "constant"), "'cosine' or 'constant'"),
    "memory_budget": ((numbers.Integral, type(None)), lambda v: v is None or v > 0,
                      "None or a number of bytes > 0"),
    "verbose": ((numbers.Integral, bool), lambda v: True, "an int"),
}  # fmt: skip


class DeviceTagsMixin:
    """scikit-learn tags of a torch-backed estimator with a ``device`` parameter.

    Fits on the CPU are bit-identical for a given ``random_state``; on a GPU only to
    rounding, so ``non_deterministic`` is set there and only there.
    """

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = _device_type(self.device) != "cpu"
        return tags


class LinearProbe(DeviceTagsMixin, ClassifierMixin, BaseEstimator):
    """Softmax regression on frozen features, trained with ImageNet-CoG's protocol.

    The default ``solver="sgd"`` is the official protocol: logits ``W x + b``, cross-entropy
    averaged over the batch, SGD with momentum 0.9 (no Nesterov) and weight decay on the weight
    *and* the bias (as ``torch.optim.SGD`` over an ``nn.Linear`` does), batches of
    ``min(batch_size, n_samples)`` rows reshuffled every epoch (the last one partial), a cosine
    learning rate applied after each epoch as the official code does (epoch ``e >= 1`` runs at
    ``lr * 0.5 * (1 + cos(pi * (e - 1) / epochs))``, epoch 0 at ``lr``), and the last
    epoch's weights as the result. The initial weights are ``nn.Linear``'s, drawn from
    ``random_state``.

    ``solver="lbfgs"`` minimises ``mean cross-entropy + weight_decay / 2 * ||W||^2`` (bias not
    penalised) with full-batch L-BFGS: the same problem as
    ``LogisticRegression(C=1 / (weight_decay * n_samples))``, solved on the GPU when there is
    one. ``lr``, ``batch_size``, ``momentum`` and ``schedule`` do not apply to it; ``epochs``
    caps its iterations and ``tol`` stops it, as ``max_iter`` and ``tol`` do for scikit-learn.

    Normalise the features outside (``Normalizer()`` in a pipeline, as the protocol's l2
    normalisation): the defaults are the official ones, tuned for l2-normalised features by
    :class:`LinearProbeCV`'s search.

    Parameters
    ----------
    lr : float, default=1.0
        Initial learning rate of SGD.
    weight_decay : float, default=0.0
        L2 coefficient. SGD: ``torch.optim.SGD``'s ``weight_decay``, on weight and bias.
        L-BFGS: on the weight only.
    epochs : int, default=100
        SGD epochs, or the most L-BFGS iterations.
    batch_size : int, default=1024
        Rows per SGD step; the training-set size when that is smaller.
    momentum : float, default=0.9
    schedule : {"cosine", "constant"}, default="cosine"
        Learning-rate decay, applied after each epoch.
    solver : {"sgd", "lbfgs"}, default="sgd"
    tol : float, default=1e-4
        L-BFGS stops when no gradient entry exceeds ``tol``. Not used by SGD.
    device : str or torch.device, optional
        Where to train. ``None``: CUDA when available, else the CPU.
    dtype : {"float32", "float64"}, default="float32"
        Weights and arithmetic.
    mixed_precision : {None, "tf32", "bf16"}, default=None
        ``"tf32"``: float32 matmuls may use TF32 tensor cores on CUDA (no effect on the CPU).
        ``"bf16"``: the features are stored on the device in bfloat16 (half the memory) and the
        two matmuls of each step (each loss evaluation, with ``solver="lbfgs"``) run in
        bfloat16 with float32 accumulation; weights, softmax and updates stay in ``dtype``. On
        CPUs with AVX512-BF16 or AMX, and on GPUs, the products run 2-3 times faster.
    memory_budget : int, optional
        Most bytes the features may take on the device; larger features stay on the host and
        stream in chunks, with the same result. ``None``: 60% of the free CUDA memory, and no
        limit on the CPU.
    random_state : int, RandomState instance or None, default=None
        Seeds the initial weights and the shuffling (a local ``torch.Generator``): two fits with
        the same int give the same model, bit for bit on the CPU.
    warm_start : bool, default=False
        Start from the previous fit's weights (same classes needed).
    verbose : int, default=0
        Print the loss after each epoch.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        As in ``LogisticRegression``: for two classes, the one row ``W[1] - W[0]``, which gives
        the same probabilities.
    intercept_ : ndarray of shape (1,) or (n_classes,)
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` has string column names.
    n_iter_ : int
        Epochs (SGD) or L-BFGS iterations run.
    loss_curve_ : ndarray
        SGD: the mean batch loss of each epoch. L-BFGS: the objective at each evaluation.

    Raises
    ------
    ValueError
        From :meth:`fit`, when the training loss becomes non-finite (a learning rate far too
        large, or features far too large). No model is kept from such a fit, as in
        scikit-learn's ``MLPClassifier``.

    See Also
    --------
    LinearProbeCV : the official search over ``lr`` and ``weight_decay``.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from imagenet_cog import LinearProbe
    >>> X, y = make_blobs(n_samples=200, centers=3, random_state=0)
    >>> probe = LinearProbe(epochs=20, device="cpu", random_state=0).fit(X, y)
    >>> probe.score(X, y) > 0.9
    True
    >>> probe.predict_proba(X[:2]).shape
    (2, 3)
    >>> probe.to_sklearn().predict(X[:5]).tolist() == probe.predict(X[:5]).tolist()
    True
    """

    def __init__(
        self,
        lr=1.0,
        weight_decay=0.0,
        epochs=100,
        batch_size=1024,
        momentum=0.9,
        schedule="cosine",
        solver="sgd",
        tol=1e-4,
        device=None,
        dtype="float32",
        mixed_precision=None,
        memory_budget=None,
        random_state=None,
        warm_start=False,
        verbose=0,
    ):
        self.lr = lr
        self.weight_decay = weight_decay
        self.epochs = epochs
        self.batch_size = batch_size
        self.momentum = momentum
        self.schedule = schedule
        self.solver = solver
        self.tol = tol
        self.device = device
        self.dtype = dtype
        self.mixed_precision = mixed_precision
        self.memory_budget = memory_budget
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose

    def _check_params(self):
        _check_params(
            self,
            {
                "lr": (_REAL, lambda v: 0 < v < math.inf, "a finite float > 0"),
                "weight_decay": (_REAL, lambda v: 0 <= v < math.inf, "a finite float >= 0"),
                "solver": ((str,), lambda v: v in ("sgd", "lbfgs"), "'sgd' or 'lbfgs'"),
                "tol": (_REAL, lambda v: v > 0, "a float > 0"),
                **_SGD_PARAMS,
            },
        )
        return _precisions(self.dtype, self.mixed_precision)

    def fit(self, X, y):
        """Train the probe.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Features, without NaN or infinity.
        y : array-like of shape (n_samples,)
            Class labels (any sortable labels: ints, strings, wnids).

        Returns
        -------
        self : LinearProbe

        Examples
        --------
        >>> from imagenet_cog import LinearProbe
        >>> probe = LinearProbe(epochs=5, device="cpu", random_state=0)
        >>> probe.fit([[0.0, 1.0], [1.0, 0.0]], ["cat", "dog"]).classes_.tolist()
        ['cat', 'dog']
        """
        from ._engine import DeviceData, TrainConfig, resolve_device, train_lbfgs, train_many

        X, y = validate_data(self, X, y, dtype=(np.float64, np.float32))
        check_classification_targets(y)
        wdt, fdt, tf32 = self._check_params()
        classes, y_enc = _encode(y)
        init = self._warm_weights(classes)
        device = resolve_device(self.device)
        data = DeviceData(X, y_enc, device=device, dtype=fdt, memory_budget=self.memory_budget)
        if self.solver == "sgd":
            cfg = TrainConfig(self.lr, self.weight_decay, _seed(self.random_state), init=init)
            (res,) = train_many(
                data,
                [cfg],
                n_classes=len(classes),
                epochs=self.epochs,
                batch_size=self.batch_size,
                momentum=self.momentum,
                schedule=self.schedule,
                dtype=wdt,
                tf32=tf32,
                verbose=self.verbose,
            )
            if res.diverged:
                raise ValueError(_diverged_message(self.lr, self.weight_decay, res.n_epochs))
            coef, intercept, curve, n_iter = res.coef, res.intercept, res.loss_curve, self.epochs
        else:
            coef, intercept, curve, n_iter, converged = train_lbfgs(
                data,
                n_classes=len(classes),
                weight_decay=self.weight_decay,
                max_iter=self.epochs,
                tol=self.tol,
                dtype=wdt,
                tf32=tf32,
                init=init,
            )
            if not (np.isfinite(coef).all() and np.isfinite(intercept).all()):
                raise ValueError(
                    "LinearProbe(solver='lbfgs'): the loss became non-finite; scale the "
                    "features (e.g. Normalizer()) or raise weight_decay"
                )
            if not converged and n_iter >= self.epochs:
                warnings.warn(
                    f"L-BFGS did not converge in {self.epochs} iterations (epochs); raise "
                    "epochs, or scale the features",
                    ConvergenceWarning,
                    stacklevel=2,
                )
        self._set_weights(coef, intercept, classes, X.shape[0])
        self.loss_curve_ = np.asarray(curve)
        self.n_iter_ = int(n_iter)
        return self

    def _warm_weights(self, classes):
        if not (self.warm_start and hasattr(self, "coef_")):
            return None
        if not np.array_equal(classes, self.classes_):
            raise ValueError(
                "warm_start needs the same classes as the previous fit: "
                f"{self.classes_.tolist()} before, {classes.tolist()} now"
            )
        if len(classes) == 2:  # the one binary row w becomes -w/2, +w/2: same probabilities
            half_w, half_b = self.coef_[0] / 2, self.intercept_[0] / 2
            return np.stack([-half_w, half_w]), np.array([-half_b, half_b])
        return self.coef_, self.intercept_

    def _set_weights(self, coef, intercept, classes, n_samples):
        """Fitted attributes from multinomial weights ``(n_classes, n_features)``."""
        coef = np.asarray(coef, dtype=np.float64)
        intercept = np.asarray(intercept, dtype=np.float64)
        if len(classes) == 2:  # LogisticRegression's binary form
            coef, intercept = coef[1:] - coef[:1], intercept[1:] - intercept[:1]
        self.coef_, self.intercept_, self.classes_ = coef, intercept, classes
        self._n_samples_fit = int(n_samples)
        return self

    def decision_function(self, X):
        """Logits ``X @ coef_.T + intercept_``; for two classes, the logit of ``classes_[1]``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)

        Examples
        --------
        >>> from sklearn.datasets import make_blobs
        >>> from imagenet_cog import LinearProbe
        >>> X, y = make_blobs(n_samples=60, centers=[[-3, -3], [3, 3]], random_state=0)
        >>> LinearProbe(epochs=5, device="cpu").fit(X, y).decision_function(X).shape
        (60,)
        """
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
        scores = X @ self.coef_.T + self.intercept_
        return scores.ravel() if scores.shape[1] == 1 else scores

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of :meth:`predict` on ``(X, y)``.

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
        >>> from sklearn.datasets import make_blobs
        >>> from imagenet_cog import LinearProbe
        >>> X, y = make_blobs(n_samples=60, centers=[[-3, -3], [3, 3]], random_state=0)
        >>> LinearProbe(epochs=5, device="cpu", random_state=0).fit(X, y).score(X, y)
        1.0
        """
        return super().score(X, y, sample_weight=sample_weight)

    def predict(self, X):
        """Most probable class of each row.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)

        Examples
        --------
        >>> from imagenet_cog import LinearProbe
        >>> probe = LinearProbe(epochs=20, device="cpu", random_state=0)
        >>> probe.fit([[-1.0], [1.0]], ["neg", "pos"]).predict([[-3.0], [3.0]]).tolist()
        ['neg', 'pos']
        """
        scores = self.decision_function(X)
        best = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        return self.classes_[best]

    def predict_proba(self, X):
        """Softmax probabilities, columns in the order of ``classes_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)

        Examples
        --------
        >>> from imagenet_cog import LinearProbe
        >>> probe = LinearProbe(epochs=5, device="cpu").fit([[-1.0], [1.0]], [0, 1])
        >>> float(probe.predict_proba([[0.0]]).sum())
        1.0
        """
        scores = self.decision_function(X)
        if scores.ndim == 1:
            p = expit(scores)
            return np.column_stack([1.0 - p, p])
        return softmax(scores, axis=1)

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`, computed stably.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)

        Examples
        --------
        >>> from imagenet_cog import LinearProbe
        >>> probe = LinearProbe(epochs=5, device="cpu").fit([[-1.0], [1.0]], [0, 1])
        >>> probe.predict_log_proba([[0.0]]).shape
        (1, 2)
        """
        scores = self.decision_function(X)
        if scores.ndim == 1:
            scores = np.column_stack([np.zeros_like(scores), scores])
        return log_softmax(scores, axis=1)

    def to_sklearn(self):
        """This fitted probe as a fitted ``sklearn.linear_model.LogisticRegression``.

        The copy has the same ``coef_``, ``intercept_`` and ``classes_``, hence the same
        predictions and probabilities, and needs neither torch nor this package to deploy. Its
        ``C`` is ``1 / (weight_decay * n_samples)`` (``inf`` without weight decay): the problem
        the L-BFGS solver solves exactly, and only an approximate match for SGD.

        Returns
        -------
        LogisticRegression

        Examples
        --------
        >>> from sklearn.datasets import make_blobs
        >>> from imagenet_cog import LinearProbe
        >>> X, y = make_blobs(n_samples=60, centers=3, random_state=0)
        >>> lr = LinearProbe(epochs=5, device="cpu").fit(X, y).to_sklearn()
        >>> type(lr).__name__, lr.coef_.shape
        ('LogisticRegression', (3, 2))
        """
        from sklearn.linear_model import LogisticRegression

        check_is_fitted(self)
        wd = float(self.weight_decay)
        C = math.inf if wd == 0 else 1.0 / (wd * self._n_samples_fit)
        lr = LogisticRegression(C=C, tol=self.tol, max_iter=self.epochs)
        lr.coef_ = self.coef_.copy()
        lr.intercept_ = self.intercept_.copy()
        lr.classes_ = self.classes_.copy()
        lr.n_features_in_ = self.n_features_in_
        lr.n_iter_ = np.array([self.n_iter_], dtype=np.int32)
        if hasattr(self, "feature_names_in_"):
            lr.feature_names_in_ = self.feature_names_in_.copy()
        return lr


def _device_type(device):
    from ._engine import resolve_device

    try:
        return resolve_device(device).type
    except (RuntimeError, TypeError, ValueError):
        return str(device)


def _encode(y):
    classes, y_enc = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(
            f"a linear probe needs samples of at least 2 classes; the data holds 1 class "
            f"({classes[0].item()!r})"
        )
    return classes, y_enc.astype(np.int64).ravel()


def _diverged_message(lr, weight_decay, epoch):
    return (
        f"the training loss became non-finite at epoch {epoch + 1} (lr={lr:g}, "
        f"weight_decay={weight_decay:g}); lower lr, or scale the features (e.g. Normalizer())"
    )


# ---------------------------------------------------------------------------------- searches
@dataclasses.dataclass
class SearchSpec:
    """The rows one hyper-parameter search uses, all indices into the training set.

    Attributes
    ----------
    seed : int
        Seeds the TPE sampler and every training run (initial weights, shuffling).
    train_idx : ndarray of int
        Rows each trial trains on.
    val_idx : ndarray of int
        Rows each trial is scored on (last-epoch top-1).
    final_idx : ndarray of int
        Rows the final model is retrained on with the best parameters.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog import SearchSpec
    >>> spec = SearchSpec(22, train_idx=np.arange(8), val_idx=np.arange(8, 10),
    ...                   final_idx=np.arange(10))
    >>> spec.seed, len(spec.train_idx), len(spec.final_idx)
    (22, 8, 10)
    """

    seed: int
    train_idx: np.ndarray
    val_idx: np.ndarray
    final_idx: np.ndarray


def make_search_spec(y, seed, *, n_shots=None, val_fraction=0.2):
    """Split a training set for one search, as the official protocol does (the paper, supplement B.2).

    Per class, a random ``floor(val_fraction * n_c)`` of the samples is held out for
    validation and the rest is the search's training part. With ``n_shots=N`` (few-shot),
    the trials train on ``N`` samples per class drawn from that training part and are still
    scored on the *whole* holdout, and the final model trains on ``N`` samples per class
    redrawn from the full training set. Without it, the final model trains on everything.

    Parameters
    ----------
    y : array-like of shape (n_samples,)
        Class labels of the training set.
    seed : int
        All draws come from ``numpy.random.default_rng(seed)``.
    n_shots : int, optional
        Samples per class of the few-shot setting.
    val_fraction : float, default=0.2

    Returns
    -------
    SearchSpec
        Indices sorted ascending.

    Raises
    ------
    ValueError
        When a class has fewer than ``n_shots`` samples available (the class is named), or the
        holdout is empty (every class has fewer than ``1 / val_fraction`` samples).

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog import make_search_spec
    >>> y = np.repeat(["a", "b"], [10, 5])
    >>> spec = make_search_spec(y, seed=22)
    >>> len(spec.train_idx), len(spec.val_idx), len(spec.final_idx)
    (12, 3, 15)
    >>> spec = make_search_spec(y, seed=22, n_shots=2)
    >>> len(spec.train_idx), len(spec.val_idx), len(spec.final_idx)
    (4, 3, 4)
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-d, got shape {y.shape}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    classes, y_enc, counts = np.unique(y, return_inverse=True, return_counts=True)
    rng = np.random.default_rng(seed)
    # floor(val_fraction * n_c) in integer arithmetic: 0.2 * n must not round below n / 5.
    scale = 10**6
    n_val = counts * round(val_fraction * scale) // scale
    val_mask = _per_class_draw(y_enc, np.arange(y.size), n_val, rng)
    val_idx = np.flatnonzero(val_mask)
    if val_idx.size == 0:
        raise ValueError(
            f"the validation holdout is empty: floor({val_fraction:g} * n_c) is 0 for every "
            "class; each class needs more samples"
        )
    train_idx = np.flatnonzero(~val_mask)
    final_idx = np.arange(y.size)
    if n_shots is not None:
        if not isinstance(n_shots, numbers.Integral) or n_shots < 1:
            raise ValueError(f"n_shots must be None or an int >= 1, got {n_shots!r}")
        train_idx = _shots(y_enc, train_idx, classes, n_shots, rng, "the search's training part")
        final_idx = _shots(y_enc, final_idx, classes, n_shots, rng, "the training set")
    return SearchSpec(int(seed), train_idx, val_idx, final_idx)


def _per_class_draw(y_enc, rows, n_take, rng):
    """Boolean mask over ``rows``: a uniform draw of ``n_take[c]`` rows of each class ``c``."""
    keys = rng.random(rows.size)
    order = np.lexsort((keys, y_enc[rows]))  # by class, random within a class
    cls = y_enc[rows][order]
    first = np.searchsorted(cls, cls, side="left")
    rank = np.arange(rows.size) - first
    mask = np.zeros(rows.size, dtype=bool)
    mask[order[rank < n_take[cls]]] = True
    return mask


def _shots(y_enc, rows, classes, n_shots, rng, where):
    avail = np.bincount(y_enc[rows], minlength=len(classes))
    short = np.flatnonzero(avail < n_shots)
    if short.size:
        c = short[0]
        raise ValueError(
            f"n_shots={n_shots}: class {classes[c].item()!r} has only {avail[c]} samples in "
            f"{where}"
            + (f" ({short.size - 1} more classes are short too)" if short.size > 1 else "")
        )
    take = np.full(len(classes), n_shots)
    return rows[_per_class_draw(y_enc, rows, take, rng)]


@dataclasses.dataclass
class SearchResult:
    """What :func:`run_searches` returns for one search.

    Attributes
    ----------
    spec : SearchSpec
    best_params : dict
        ``{"lr": float, "wd": float}`` of the best trial.
    best_score : float
        Its last-epoch validation top-1, a fraction.
    study : optuna.Study
    trials : list of dict
        One row per trial, in trial order: ``number``, ``round`` (the engine pass it trained
        in), ``lr``, ``wd``, ``state`` (``"COMPLETE"`` or ``"FAIL"`` for a non-finite loss),
        ``val_top1``, ``val_top5``, ``train_loss`` (last epoch), ``epochs`` (with finite loss).
    classes : ndarray
        Labels of the rows of ``coef``.
    coef : ndarray of shape (n_classes, n_features)
        Final model's weights (multinomial form, one row per class).
    intercept : ndarray of shape (n_classes,)
    loss_curve : ndarray of shape (epochs,)
        Final fit's mean batch loss per epoch.
    test_top1, test_top5 : float
        Final model on the test data, NaN without test data.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from imagenet_cog import make_search_spec, run_searches
    >>> X, y = make_blobs(n_samples=120, centers=[[-3, -3], [3, 3]], random_state=0)
    >>> (result,) = run_searches(X, y, [make_search_spec(y, 22)], n_trials=2,
    ...                          n_startup_trials=2, epochs=3, device="cpu", X_test=X, y_test=y)
    >>> result.coef.shape, sorted(result.best_params), result.test_top1
    ((2, 2), ['lr', 'wd'], 1.0)
    """

    spec: SearchSpec
    best_params: dict
    best_score: float
    study: object
    trials: list
    classes: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    loss_curve: np.ndarray
    test_top1: float = math.nan
    test_top5: float = math.nan


def run_searches(
    X,
    y,
    searches,
    *,
    n_trials=30,
    n_startup_trials=10,
    trials_per_batch=5,
    lr_range=LR_RANGE,
    wd_range=WD_RANGE,
    epochs=100,
    batch_size=1024,
    momentum=0.9,
    schedule="cosine",
    X_test=None,
    y_test=None,
    device=None,
    dtype="float32",
    mixed_precision=None,
    memory_budget=None,
    verbose=0,
    progress=False,
    compile="auto",
):
    """Run independent hyper-parameter searches in lockstep, then retrain each search's best.

    Each search is the official one (the paper, Sec. 3.4.2 and supplement B.2): an Optuna TPE study (``multivariate=True``, seeded with the
    search's seed) suggests ``"lr"`` then ``"wd"``, log-uniform in ``lr_range`` and
    ``wd_range``; a trial trains a probe on the search's ``train_idx`` (the
    :class:`LinearProbe` SGD protocol, seeded with the search's seed) and scores its last-epoch
    top-1 on ``val_idx``; a non-finite loss fails the trial (Optuna's ``FAIL`` state). The best
    ``(lr, wd)`` is then retrained on ``final_idx`` and, with test data, scored there.

    Lockstep: trials are asked in rounds through Optuna's ask/tell interface, and round ``r``
    of *every* search trains in one engine pass (one batched matmul per step over all of
    them), so five seeds' searches cost about what one costs. The final fits share one pass
    too. The features move to the device once for everything.

    Batching and TPE: round 1 asks the ``n_startup_trials`` startup trials, which TPE draws at
    random without looking at results, so asking them together changes nothing. Later rounds
    ask ``trials_per_batch`` trials each; the trials of a round see the same finished trials.
    With ``trials_per_batch=1`` each search sees the trials a sequential ``study.optimize``
    loop with the same Optuna would (the official code pinned Optuna 2.3.0, whose TPE
    suggests other trials after the startup ones). With more, the sampler's ``constant_liar`` (on)
    counts the round's pending trials as bad results, so a round spreads out instead of
    suggesting one point several times. The default 5 makes 30 trials 5 passes instead of 21.

    Parameters
    ----------
    X : array-like or torch.Tensor of shape (n_samples, n_features)
        Training features (l2-normalised for CoG). A tensor already on ``device`` is not
        copied.
    y : array-like of shape (n_samples,)
        Training labels.
    searches : sequence of SearchSpec
        See :func:`make_search_spec`.
    n_trials : int, default=30
    n_startup_trials : int, default=10
        TPE's random startup trials (its default, which the official code used).
    trials_per_batch : int, default=5
        Trials per round after the startup round.
    lr_range, wd_range : (float, float)
        Log-uniform ranges, by default the official [0.1, 100] and [1e-12, 1e-4].
    epochs, batch_size, momentum, schedule
        The SGD protocol (see :class:`LinearProbe`).
    X_test, y_test : array-like, optional
        Test data for the final models' top-1 and top-5.
    device, dtype, mixed_precision, memory_budget
        As for :class:`LinearProbe`.
    verbose : int, default=0
        1: Optuna's per-trial lines and a line per round; 2: also per-epoch losses.
    progress : bool or str, default=False
        A progress bar over the trials of the searches and the final fits (a string is its
        label).
    compile : "auto" or bool, default="auto"
        The fused SGD step: compiled with ``torch.compile`` and replayed from CUDA graphs on
        CUDA (``"auto"``), also compiled on the CPU (``True``), or never (``False``). Same
        arithmetic; a failed compile warns and trains eagerly.

    Returns
    -------
    list of SearchResult
        In the order of ``searches``.

    Raises
    ------
    ValueError
        Bad input, or a search whose trials all diverged, or whose final fit diverged.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from sklearn.preprocessing import normalize
    >>> from imagenet_cog import make_search_spec, run_searches
    >>> from imagenet_cog.probe import SEEDS
    >>> X, y = make_blobs(n_samples=300, centers=3, n_features=8, random_state=0)
    >>> X = normalize(X)
    >>> specs = [make_search_spec(y, seed) for seed in SEEDS[:2]]  # the official 22 and 37
    >>> res = run_searches(X, y, specs, n_trials=4, n_startup_trials=2, epochs=3,
    ...                    device="cpu")
    >>> [len(r.trials) for r in res], sorted(res[0].best_params)
    ([4, 4], ['lr', 'wd'])
    """
    from ._engine import DeviceData, resolve_device
    from ._schedule import Job, lockstep

    wdt, fdt, tf32 = _precisions(dtype, mixed_precision)
    for name, v in (("n_trials", n_trials), ("trials_per_batch", trials_per_batch)):
        if not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if not isinstance(n_startup_trials, numbers.Integral) or n_startup_trials < 0:
        raise ValueError(f"n_startup_trials must be an int >= 0, got {n_startup_trials!r}")
    for name, (lo, hi) in (("lr_range", lr_range), ("wd_range", wd_range)):
        if not 0 < lo < hi < math.inf:
            raise ValueError(f"{name} must be (low, high) with 0 < low < high, got {(lo, hi)}")
    searches = list(searches)
    device = resolve_device(device)
    classes, y_enc = _encode(np.asarray(y))
    _check_features(X, y_enc.size, "X")
    data = DeviceData(X, y_enc, device=device, dtype=fdt, memory_budget=memory_budget)
    test = None
    if (X_test is None) != (y_test is None):
        raise ValueError("pass X_test and y_test together")
    if X_test is not None:
        _check_features(X_test, len(y_test), "X_test", n_features=data.d)
        y_test = np.asarray(y_test)
        pos = np.searchsorted(classes, y_test).clip(0, len(classes) - 1)
        unknown = classes[pos] != y_test
        if unknown.any():
            raise ValueError(f"y_test holds labels absent from y: {np.unique(y_test[unknown])}")
        test = DeviceData(X_test, pos, device=device, dtype=fdt, memory_budget=memory_budget)
    train_kw = {
        "n_classes": len(classes),
        "epochs": epochs,
        "batch_size": batch_size,
        "momentum": momentum,
        "schedule": schedule,
        "dtype": wdt,
        "tf32": tf32,
        "verbose": max(0, verbose - 1),
    }

    train_kw["compile"] = compile
    jobs = [
        Job(
            s.seed, s.train_idx, s.val_idx, s.final_idx, None if test is None else np.arange(test.n)
        )
        for s in searches
    ]
    from tqdm.auto import tqdm

    bar = tqdm(
        total=n_trials + 1,
        desc=progress if isinstance(progress, str) else "search",
        unit="trial",
        leave=False,
        disable=not progress,
    )
    with bar:
        outcomes = lockstep(
            data,
            jobs,
            train_kw=train_kw,
            n_trials=n_trials,
            n_startup_trials=n_startup_trials,
            trials_per_batch=trials_per_batch,
            lr_range=lr_range,
            wd_range=wd_range,
            test=test,
            verbose=verbose,
            bar=bar,
        )
    results = []
    for spec, out in zip(searches, outcomes):
        study, table, res = out.study, out.trials, out.final
        if res.diverged:
            raise ValueError(f"search seed={spec.seed}: final fit: " + _diverged_message(
                study.best_params["lr"], study.best_params["wd"], res.n_epochs))  # fmt: skip
        results.append(
            SearchResult(
                spec=spec,
                best_params=dict(study.best_params),
                best_score=float(study.best_value),
                study=study,
                trials=table,
                classes=classes,
                coef=res.coef,
                intercept=res.intercept,
                loss_curve=res.loss_curve,
                test_top1=res.top1,
                test_top5=res.top5,
            )
        )
    return results


def _check_features(X, n, name, n_features=None):
    """Shape and finiteness checks that do not copy ``X`` (a memmap or a device tensor)."""
    import torch

    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-d (n_samples, n_features), got shape {X.shape}")
    if X.shape[0] != n:
        raise ValueError(f"{name} has {X.shape[0]} rows but its labels have {n}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{name} has {X.shape[1]} features, but X has {n_features}")
    if isinstance(X, torch.Tensor):
        if not bool(torch.isfinite(X).all()):
            raise ValueError(f"{name} contains NaN or infinity")
    else:
        assert_all_finite(X, input_name=name)


class LinearProbeCV(DeviceTagsMixin, ClassifierMixin, BaseEstimator):
    """The official ImageNet-CoG probe: a TPE search over ``lr`` and ``weight_decay``.

    The official protocol (the paper, supplement B.2): a per-class random 20% of the training set (``floor(0.2 n_c)``) is held out;
    30 Optuna TPE trials (``multivariate=True``, seeded with ``random_state``) draw ``lr``
    log-uniform in [0.1, 100] and ``wd`` log-uniform in [1e-12, 1e-4] and train a
    :class:`LinearProbe` on the rest; the objective is last-epoch validation top-1 and a
    non-finite loss fails the trial. The best pair is retrained on the whole training set as
    :attr:`best_estimator_`, which predicts. This is one search of :func:`run_searches`,
    whose documentation explains how the trials are batched.

    Parameters
    ----------
    n_trials : int, default=30
    lr_range : (float, float), default=(0.1, 100.0)
    wd_range : (float, float), default=(1e-12, 1e-4)
    val_fraction : float, default=0.2
    n_shots : int, optional
        Few-shot: the trials train on ``n_shots`` per class drawn from the 80% part and are
        scored on the whole 20% holdout; the final model trains on ``n_shots`` per class
        redrawn from the full training set. A class with too few samples raises a
        ``ValueError`` that names it.
    n_startup_trials : int, default=10
    trials_per_batch : int, default=5
        Trials trained together after the startup round; 1 reproduces the sequential TPE.
    epochs, batch_size, momentum, schedule, device, dtype, mixed_precision, memory_budget
        As for :class:`LinearProbe`.
    random_state : int, RandomState instance or None, default=None
        The search's seed: TPE, the split, and every fit.
    verbose : int, default=0

    Attributes
    ----------
    best_params_ : dict
        ``{"lr": ..., "wd": ...}``.
    best_score_ : float
        Validation top-1 of the best trial, a fraction.
    best_estimator_ : LinearProbe
        Retrained on the whole training set (or its few-shot draw).
    study_ : optuna.Study
    trials_ : list of dict
        One row per trial; see :class:`SearchResult`. ``pandas.DataFrame(trials_)`` makes a
        table.
    split_ : SearchSpec
        The rows used.
    classes_, n_features_in_, feature_names_in_
        As for :class:`LinearProbe`.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from sklearn.preprocessing import normalize
    >>> from imagenet_cog import LinearProbeCV
    >>> X, y = make_blobs(n_samples=300, centers=3, n_features=8, random_state=0)
    >>> search = LinearProbeCV(n_trials=4, n_startup_trials=2, epochs=5, device="cpu",
    ...                        random_state=22).fit(normalize(X), y)
    >>> len(search.trials_), sorted(search.best_params_)
    (4, ['lr', 'wd'])
    >>> search.score(normalize(X), y) > 0.9
    True
    """

    def __init__(
        self,
        n_trials=30,
        lr_range=LR_RANGE,
        wd_range=WD_RANGE,
        val_fraction=0.2,
        n_shots=None,
        n_startup_trials=10,
        trials_per_batch=5,
        epochs=100,
        batch_size=1024,
        momentum=0.9,
        schedule="cosine",
        device=None,
        dtype="float32",
        mixed_precision=None,
        memory_budget=None,
        random_state=None,
        verbose=0,
    ):
        self.n_trials = n_trials
        self.lr_range = lr_range
        self.wd_range = wd_range
        self.val_fraction = val_fraction
        self.n_shots = n_shots
        self.n_startup_trials = n_startup_trials
        self.trials_per_batch = trials_per_batch
        self.epochs = epochs
        self.batch_size = batch_size
        self.momentum = momentum
        self.schedule = schedule
        self.device = device
        self.dtype = dtype
        self.mixed_precision = mixed_precision
        self.memory_budget = memory_budget
        self.random_state = random_state
        self.verbose = verbose

    def fit(self, X, y):
        """Search, then retrain the best configuration.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)

        Returns
        -------
        self : LinearProbeCV

        Examples
        --------
        >>> import numpy as np
        >>> from imagenet_cog import LinearProbeCV
        >>> rng = np.random.default_rng(0)
        >>> y = np.repeat([0, 1], 20)
        >>> X = rng.normal(size=(40, 4)) + y[:, None]
        >>> cv = LinearProbeCV(n_trials=2, epochs=2, device="cpu", random_state=0).fit(X, y)
        >>> cv.best_estimator_.coef_.shape
        (1, 4)
        """
        X, y = validate_data(self, X, y, dtype=(np.float64, np.float32))
        check_classification_targets(y)
        _check_params(self, _SGD_PARAMS)
        seed = _seed(self.random_state)
        spec = make_search_spec(y, seed, n_shots=self.n_shots, val_fraction=self.val_fraction)
        (res,) = run_searches(
            X,
            y,
            [spec],
            n_trials=self.n_trials,
            n_startup_trials=self.n_startup_trials,
            trials_per_batch=self.trials_per_batch,
            lr_range=tuple(self.lr_range),
            wd_range=tuple(self.wd_range),
            epochs=self.epochs,
            batch_size=self.batch_size,
            momentum=self.momentum,
            schedule=self.schedule,
            device=self.device,
            dtype=self.dtype,
            mixed_precision=self.mixed_precision,
            memory_budget=self.memory_budget,
            verbose=self.verbose,
        )
        best = LinearProbe(
            lr=res.best_params["lr"],
            weight_decay=res.best_params["wd"],
            epochs=self.epochs,
            batch_size=self.batch_size,
            momentum=self.momentum,
            schedule=self.schedule,
            device=self.device,
            dtype=self.dtype,
            mixed_precision=self.mixed_precision,
            memory_budget=self.memory_budget,
            random_state=seed,
        )
        best._set_weights(res.coef, res.intercept, res.classes, len(spec.final_idx))
        best.n_features_in_ = self.n_features_in_
        if hasattr(self, "feature_names_in_"):
            best.feature_names_in_ = self.feature_names_in_
        best.loss_curve_, best.n_iter_ = res.loss_curve, self.epochs
        self.best_estimator_ = best
        self.best_params_ = res.best_params
        self.best_score_ = res.best_score
        self.study_ = res.study
        self.trials_ = res.trials
        self.split_ = spec
        self.classes_ = res.classes
        return self

    def _best(self):
        check_is_fitted(self)
        return self.best_estimator_

    def decision_function(self, X):
        """:meth:`LinearProbe.decision_function` of :attr:`best_estimator_`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
        """
        return self._best().decision_function(X)

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of the refitted best probe on ``(X, y)``.

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
        >>> from sklearn.datasets import make_blobs
        >>> from imagenet_cog import LinearProbeCV
        >>> X, y = make_blobs(n_samples=100, centers=[[-3, -3], [3, 3]], random_state=0)
        >>> cv = LinearProbeCV(n_trials=2, epochs=5, device="cpu", random_state=22).fit(X, y)
        >>> cv.score(X, y)
        1.0
        """
        return super().score(X, y, sample_weight=sample_weight)

    def predict(self, X):
        """:meth:`LinearProbe.predict` of :attr:`best_estimator_`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        return self._best().predict(X)

    def predict_proba(self, X):
        """:meth:`LinearProbe.predict_proba` of :attr:`best_estimator_`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        return self._best().predict_proba(X)

    def predict_log_proba(self, X):
        """:meth:`LinearProbe.predict_log_proba` of :attr:`best_estimator_`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        return self._best().predict_log_proba(X)

    def to_sklearn(self):
        """:meth:`LinearProbe.to_sklearn` of :attr:`best_estimator_`.

        Returns
        -------
        LogisticRegression
        """
        return self._best().to_sklearn()
