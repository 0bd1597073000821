"""Probes beyond the linear one: PCA and MLP probes (supplement C of the paper's first version).

:func:`pca_probe` runs the LogReg protocol on the first 32...1024 principal
components; :func:`mlp_probe` searches an :class:`MLPProbe` (two hidden layers
of 2048 units, with ReLU or without activation). Both return a
:class:`ProbeScores`. Public names are re-exported by :mod:`imagenet_cog.analysis`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._grid import PAPER_PROTOCOL, SEEDS
from .._train.search import make_search_spec, run_searches
from .._validation import Param
from .checks import _DISTANCE_BLOCK_ELEMENTS, _finite_float_features, _json_float
from .mlp import ACTIVATIONS, MLP_WD_RANGE

# ------------------------------------------------------- PCA and MLP probes
#: Principal components of the PCA probes (supplement C.2 of the first version).
PCA_COMPONENTS = (32, 64, 128, 256, 512, 1024)
_PROBE_METRICS = ("top1", "top5", "val_top1")
#: mlp_probe's constraint table (the rest is checked against the data).
_MLP_PROBE_PARAMS = {"activation": Param(None, lambda v: v in ACTIVATIONS, "'relu' or 'identity'")}


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
    _finite_float_features(X_train, "X_train")  # NaN would make PCA fail obscurely
    _finite_float_features(X_test, "X_test")
    pca = PCA(n_components=ks[-1], svd_solver=svd_solver).fit(X_train)
    comps = pca.components_.astype(np.float32)
    mean = pca.mean_.astype(np.float32)

    def project(X):
        Z = np.empty((X.shape[0], ks[-1]), dtype=np.float32)
        rows = max(1, _DISTANCE_BLOCK_ELEMENTS // (4 * max(d, 1)))
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
    n_trials=PAPER_PROTOCOL.n_trials,
    *,
    hidden_layer_sizes=(2048, 2048),
    lr_range=None,
    wd_range=MLP_WD_RANGE,
    n_startup_trials=PAPER_PROTOCOL.n_startup_trials,
    epochs=PAPER_PROTOCOL.epochs,
    batch_size=PAPER_PROTOCOL.batch_size,
    momentum=PAPER_PROTOCOL.momentum,
    device=None,
    dtype="float32",
    memory_budget=None,
    verbose=0,
):
    """The MLP probe's search and test accuracy (supplement C.3 of the first version).

    For each seed, the official search (the paper, supplement B.2): a per-class random 20%
    of the training set is held out (:func:`~imagenet_cog.make_search_spec`); ``n_trials``
    Optuna TPE trials (``multivariate=True``, seeded with the seed) draw ``lr`` log-uniform
    in [0.1, 100] for the MLP (``activation="relu"``) or [0.01, 10] for MLP_NoAct
    (``"identity"``), and ``wd`` log-uniform in [1e-8, 1e-4]; each trial trains an
    :class:`MLPProbe` (same seed) on the rest and scores its last-epoch validation top-1, a
    non-finite loss failing the trial; the best pair is retrained on the whole training set
    and scored on the test set (top-1, top-5, last epoch).

    The seeds' searches advance in lockstep rounds of one trial each, so every trial sees all
    earlier ones, as in the official sequential order; an MLP's hidden layers do not batch
    into the linear engine's shared passes, so each trial is trained on its own. Each trial
    is a full MLP fit, so at the paper's scale (2048-2048 hidden units,
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
    from .._device import placement
    from .._grid import Protocol
    from .._train.engine import DeviceData
    from .._train.search import Job, search_in_lockstep
    from .._validation import (
        check_labelled_features,
        check_values,
        encode_labels,
        encode_test_labels,
    )
    from .mlp import MLP_LR_RANGES, _check_hidden, train_mlp

    check_values(_MLP_PROBE_PARAMS, activation=activation)
    lr_range = tuple(MLP_LR_RANGES[activation] if lr_range is None else lr_range)
    hidden = _check_hidden(hidden_layer_sizes)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty")
    X_train = X_train if hasattr(X_train, "ndim") else np.asarray(X_train)
    X_test = X_test if hasattr(X_test, "ndim") else np.asarray(X_test)
    y_train = np.asarray(y_train)
    classes, y_enc = encode_labels(y_train)
    check_labelled_features(X_train, y_enc.size, "X_train")
    y_test = np.asarray(y_test)
    check_labelled_features(X_test, len(y_test), "X_test", n_features=X_train.shape[1])
    pos = encode_test_labels(classes, y_test, "y_train")
    place = placement(device, dtype)
    data = DeviceData(
        X_train, y_enc, device=place.device, dtype=place.weights, memory_budget=memory_budget
    )
    test = DeviceData(
        X_test, pos, device=place.device, dtype=place.weights, memory_budget=memory_budget
    )
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

    def train_round(configs, eval_data):
        # MLPs do not batch: each configuration is its own fit, in the order asked.
        return [
            train_mlp(
                data,
                lr=c.lr,
                weight_decay=c.weight_decay,
                seed=c.seed,
                train_idx=c.train_idx,
                eval_data=eval_data,
                eval_idx=c.eval_idx,
                **fit_kw,
            )
            for c in configs
        ]

    specs = [make_search_spec(y_train, seed) for seed in seeds]
    jobs = [Job(s.seed, s.train_idx, s.val_idx, s.final_idx, np.arange(test.n)) for s in specs]
    # One trial per round: each trial sees every earlier one, as a sequential study would.
    outcomes = search_in_lockstep(
        data,
        jobs,
        protocol=Protocol(
            n_trials=n_trials,
            n_startup_trials=n_startup_trials,
            trials_per_batch=1,
            lr_range=lr_range,
            wd_range=tuple(wd_range),
            epochs=epochs,
            batch_size=batch_size,
            momentum=momentum,
        ),
        test=test,
        verbose=verbose,
        describe=lambda i: f"{probe} search seed={seeds[i]}",
        trainer=train_round,
        hint="lower lr_range",
    )
    records = []
    for seed, out in zip(seeds, outcomes):
        study, final = out.study, out.final
        best = study.best_trial.params
        table = [
            {
                "number": t["number"],
                "lr": t["lr"],
                "wd": t["wd"],
                "state": t["state"],
                "val_top1": _json_float(t["val_top1"]),
                "val_top5": _json_float(t["val_top5"]),
                "epochs": t["epochs"],
            }
            for t in out.trials
        ]
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
