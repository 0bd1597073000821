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

import math
import warnings
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._classifier import ProbeClassifierMixin
from ._device import DeviceTagsMixin, placement
from ._grid import PAPER_PROTOCOL, Protocol
from ._train.search import diverged_message, make_search_spec, run_searches
from ._validation import (
    COMPILE,
    DTYPE,
    LR,
    MIXED_PRECISION,
    REAL,
    SGD_PARAMS,
    WEIGHT_DECAY,
    Param,
    check_params,
    encode_labels,
    int_seed,
)

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []


#: Feature vectors are checked for their norm from this width on: low-dimensional inputs
#: (toy data, scikit-learn's own estimator checks) are no network's features.
_NORM_CHECK_MIN_FEATURES = 16
#: The median row norm, within this factor of 1, is "unit norm".
_NORM_FACTOR = 2.0
#: Rows whose norms are measured: a strided sample, so the check costs nothing next to a fit.
_NORM_SAMPLE = 4096


def _warn_unless_unit_norm(X, who):
    """Warn once when ``X``'s rows are far from unit l2 norm: the official probe l2-normalises
    its input, and its lr range [0.1, 100] assumes it."""
    if X.ndim != 2 or X.shape[1] < _NORM_CHECK_MIN_FEATURES or not X.shape[0]:
        return
    rows = np.asarray(X[:: max(1, X.shape[0] // _NORM_SAMPLE)], dtype=np.float64)
    scale = np.abs(rows).max(axis=1, keepdims=True)
    scale[scale == 0] = 1.0
    median = float(np.median(scale[:, 0] * np.linalg.norm(rows / scale, axis=1)))
    if 1 / _NORM_FACTOR <= median <= _NORM_FACTOR:
        return
    warnings.warn(
        f"{who}: the feature vectors' median l2 norm is {median:.3g}, far from 1; the official "
        "probe l2-normalises its input and its lr range [0.1, 100] assumes unit-norm "
        "features, so these numbers will differ from its: normalise them first "
        "(sklearn.preprocessing.Normalizer() before the probe in a pipeline)",
        UserWarning,
        stacklevel=3,
    )


class LinearProbe(DeviceTagsMixin, ProbeClassifierMixin, BaseEstimator):
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
    :class:`LinearProbeCV`'s search. A fit with ``solver="sgd"`` on feature vectors (16
    features or more) whose median l2 norm is more than twice or less than half of 1 warns
    once (``UserWarning``), naming ``Normalizer``.

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
    compile : {"auto", True, False}, default="auto"
        The fused SGD step: ``"auto"`` compiles its elementwise work with ``torch.compile``
        and replays each step from a CUDA graph on CUDA (features that fit the device), and
        trains with the eager step on the CPU; ``True`` also compiles on the CPU; ``False``
        always trains eagerly. The arithmetic is the same either way. The fused step checks
        itself as it trains (its first steps against the eager step, a step counter every
        epoch); a disagreement, or a compile or capture that fails, warns once and training
        goes on eagerly, or uncompiled, or without graphs. Not used by L-BFGS.

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
        epochs=PAPER_PROTOCOL.epochs,
        batch_size=PAPER_PROTOCOL.batch_size,
        momentum=PAPER_PROTOCOL.momentum,
        schedule=PAPER_PROTOCOL.schedule,
        solver="sgd",
        tol=1e-4,
        device=None,
        dtype="float32",
        mixed_precision=None,
        memory_budget=None,
        random_state=None,
        warm_start=False,
        verbose=0,
        compile="auto",
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
        self.compile = compile

    _parameter_checks: ClassVar[dict[str, Param]] = {
        "lr": LR,
        "weight_decay": WEIGHT_DECAY,
        "solver": Param((str,), lambda v: v in ("sgd", "lbfgs"), "'sgd' or 'lbfgs'"),
        "tol": Param(REAL, lambda v: v > 0, "a float > 0"),
        **SGD_PARAMS,
        "compile": COMPILE,
        "dtype": DTYPE,
        "mixed_precision": MIXED_PRECISION,
    }

    def _check_params(self):
        check_params(self)
        return placement(self.device, self.dtype, self.mixed_precision)

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
        from ._train.engine import DeviceData, TrainConfig, train_lbfgs, train_many

        X, y = validate_data(self, X, y, dtype=(np.float64, np.float32))
        check_classification_targets(y)
        place = self._check_params()
        wdt, tf32 = place.weights, place.tf32
        if self.solver == "sgd":  # the official probe's solver
            _warn_unless_unit_norm(X, "LinearProbe")
        classes, y_enc = encode_labels(y)
        init = self._warm_weights(classes)
        data = DeviceData(
            X, y_enc, device=place.device, dtype=place.features, memory_budget=self.memory_budget
        )
        if self.solver == "sgd":
            cfg = TrainConfig(self.lr, self.weight_decay, int_seed(self.random_state), init=init)
            (res,) = train_many(
                data,
                [cfg],
                n_classes=len(classes),
                protocol=Protocol(
                    epochs=self.epochs,
                    batch_size=self.batch_size,
                    momentum=self.momentum,
                    schedule=self.schedule,
                ),
                dtype=wdt,
                tf32=tf32,
                verbose=self.verbose,
                compile=self.compile,
            )
            if res.diverged:
                raise ValueError(diverged_message(self.lr, self.weight_decay, res.n_epochs))
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

    def _class_scores(self, X):
        return self.decision_function(X)

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


class LinearProbeCV(DeviceTagsMixin, ProbeClassifierMixin, BaseEstimator):
    """The official ImageNet-CoG probe: a TPE search over ``lr`` and ``weight_decay``.

    The official protocol (the paper, supplement B.2): a per-class random 20% of the training set (``floor(0.2 n_c)``) is held out;
    30 Optuna TPE trials (``multivariate=True``, seeded with ``random_state``) draw ``lr``
    log-uniform in [0.1, 100] and ``wd`` log-uniform in [1e-12, 1e-4] and train a
    :class:`LinearProbe` on the rest; the objective is last-epoch validation top-1 and a
    non-finite loss fails the trial. The best pair is retrained on the whole training set as
    :attr:`best_estimator_`, which predicts. This is one search of :func:`run_searches`.
    By default TPE is asked for one trial at a time, as the official ``study.optimize`` loop
    asks; the installed Optuna's TPE still suggests other trials than the official Optuna
    2.3.0 after the startup ones (the user guide's page on the official code lists this and
    every other difference). Like the official probe, it expects l2-normalised features
    (``Normalizer()`` before it in a pipeline); feature vectors far from unit norm warn once
    per fit, as for :class:`LinearProbe`.

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
    trials_per_batch : int, default=1
        Trials asked and trained together after the startup round. 1, the official search,
        asks one at a time (a sequential ``study.optimize``); more takes fewer passes over the
        features (5: 30 trials in 5 passes instead of 21) but changes the TPE sequence from
        trial ``n_startup_trials + 2`` on (see :func:`run_searches`).
    epochs, batch_size, momentum, schedule, device, dtype, mixed_precision, memory_budget
        As for :class:`LinearProbe`.
    random_state : int, RandomState instance or None, default=None
        The search's seed: TPE, the split, and every fit.
    verbose : int, default=0
    compile : {"auto", True, False}, default="auto"
        The fused SGD step of every trial and of the final fit, as for :class:`LinearProbe`.

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

    _parameter_checks: ClassVar[dict[str, Param]] = {
        **SGD_PARAMS,
        "compile": COMPILE,
        "dtype": DTYPE,
        "mixed_precision": MIXED_PRECISION,
    }

    def __init__(
        self,
        n_trials=PAPER_PROTOCOL.n_trials,
        lr_range=PAPER_PROTOCOL.lr_range,
        wd_range=PAPER_PROTOCOL.wd_range,
        val_fraction=PAPER_PROTOCOL.val_fraction,
        n_shots=None,
        n_startup_trials=PAPER_PROTOCOL.n_startup_trials,
        trials_per_batch=PAPER_PROTOCOL.trials_per_batch,
        epochs=PAPER_PROTOCOL.epochs,
        batch_size=PAPER_PROTOCOL.batch_size,
        momentum=PAPER_PROTOCOL.momentum,
        schedule=PAPER_PROTOCOL.schedule,
        device=None,
        dtype="float32",
        mixed_precision=None,
        memory_budget=None,
        random_state=None,
        verbose=0,
        compile="auto",
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
        self.compile = compile

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
        check_params(self)
        _warn_unless_unit_norm(X, "LinearProbeCV")
        seed = int_seed(self.random_state)
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
            compile=self.compile,
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
            compile=self.compile,
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

    def _class_scores(self, X):
        return self._best().decision_function(X)

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

    def to_sklearn(self):
        """:meth:`LinearProbe.to_sklearn` of :attr:`best_estimator_`.

        Returns
        -------
        LogisticRegression
        """
        return self._best().to_sklearn()
