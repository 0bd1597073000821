"""Hyper-parameter searches of the official protocol: the splits, the few-shot draws, and the
searches in lockstep.

Every search is an Optuna TPE study asked in rounds (the startup trials together, then
``trials_per_batch`` trials); round ``r`` of *every* search trains in one
:func:`~imagenet_cog._train.engine.train_many` pass, whatever domain, shots or seed the search
belongs to, as long as they share one feature array (several domains' features concatenated
with row offsets) and one number of classes. Each search keeps the trial sequence it would
have alone. Then the finals train together in one more pass.

:func:`search_in_lockstep` is that loop, with its checks and its errors; :func:`run_searches`
(public), ``evaluate`` and the MLP probe's search call it. The package
(:mod:`imagenet_cog`) exports the public names here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import warnings

import numpy as np

from .._grid import PAPER_PROTOCOL, VAL_FRACTION, Protocol, holdout_sizes, short_class
from .._validation import check_labelled_features, encode_labels, encode_test_labels

__all__ = [
    "SearchResult",
    "SearchSpec",
    "make_search_spec",
    "run_searches",
]

#: What to do when a linear probe's loss turns non-finite.
LINEAR_HINT = "lower lr, or scale the features (e.g. Normalizer())"


def diverged_message(lr, weight_decay, epoch, hint=LINEAR_HINT):
    """The error of a fit whose loss turned non-finite at epoch ``epoch`` (0-based)."""
    return (
        f"the training loss became non-finite at epoch {epoch + 1} (lr={lr:g}, "
        f"weight_decay={weight_decay:g}); {hint}"
    )


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


def make_search_spec(y, seed, *, n_shots=None, val_fraction=VAL_FRACTION):
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
    n_val = holdout_sizes(counts, val_fraction)
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
    short = short_class(avail, n_shots)
    if short is not None:
        c, more = short
        raise ValueError(
            f"n_shots={n_shots}: class {classes[c].item()!r} has only {avail[c]} samples in "
            f"{where}{more}"
        )
    take = np.full(len(classes), n_shots)
    return rows[_per_class_draw(y_enc, rows, take, rng)]


@contextlib.contextmanager
def quiet_optuna(verbose):
    """Silence Optuna's per-trial log lines unless ``verbose``; restore the level after."""
    import optuna

    old = optuna.logging.get_verbosity()
    if not verbose:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(old)


def round_sizes(n_trials, n_startup_trials, trials_per_batch):
    """Trials asked per engine pass: the startup trials together, then batches."""
    sizes = [min(n_startup_trials, n_trials)] if n_startup_trials > 0 else []
    left = n_trials - sum(sizes)
    while left > 0:
        sizes.append(min(trials_per_batch, left))
        left -= sizes[-1]
    return sizes


def make_study(seed, n_startup_trials):
    import optuna

    with warnings.catch_warnings():
        # multivariate TPE and constant_liar are flagged experimental; that is not actionable.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            multivariate=True,
            seed=seed,
            n_startup_trials=n_startup_trials,
            constant_liar=True,
        )
    return optuna.create_study(direction="maximize", sampler=sampler)


@dataclasses.dataclass
class Job:
    """One search: rows of the (concatenated) training data, and its final model's test rows."""

    seed: int
    train_idx: np.ndarray
    val_idx: np.ndarray
    final_idx: np.ndarray
    test_idx: np.ndarray | None = None


@dataclasses.dataclass
class Outcome:
    """What :func:`search_in_lockstep` returns for one search.

    ``final`` is the final fit's result (``coef``, ``intercept``, ``loss_curve``, ``top1``,
    ``top5``...); ``test_top`` the final model's best classes on the search's test rows, best
    first (``(n_test, min(5, n_classes))`` int32 indices into the classes), or None without
    test rows.
    """

    study: object
    trials: list
    final: object
    test_top: np.ndarray | None = None

    @property
    def best_params(self):
        return dict(self.study.best_params)


def search_in_lockstep(
    data,
    jobs,
    *,
    protocol,
    train_kw=None,
    test=None,
    verbose=0,
    progress=None,
    describe=None,
    trainer=None,
    hint=LINEAR_HINT,
):
    """Run every job's search in lockstep, then their finals; a list of :class:`Outcome`.

    ``protocol`` (a :class:`~imagenet_cog._grid.Protocol`, checked when it was made) gives the
    searches (trials, their rounds, the lr and wd ranges) and the training. ``progress`` labels a progress bar over the
    rounds' trials and the finals (None: no bar). ``describe(i)`` names job ``i`` in errors
    (default: its seed); ``hint`` ends the error of a search whose trials all diverged, or
    whose final fit did.

    ``trainer(configs, eval_data)`` trains a round: a list of
    :class:`~imagenet_cog._train.engine.TrainConfig` (each trial's ``lr``, ``wd``, seed,
    training and evaluation rows), evaluated on ``data`` (``eval_data=None``) or on the test
    data (the finals), and returns one result per config with ``diverged``, ``top1``,
    ``top5``, ``loss_curve`` and ``n_epochs`` (and the finals' ``top_classes``, when it has
    them). By default, one :func:`~imagenet_cog._train.engine.train_many` pass of linear
    probes with ``protocol`` and ``train_kw``.
    """
    import optuna
    from tqdm.auto import tqdm

    from .engine import TrainConfig, train_many

    n_trials, n_startup_trials = protocol.n_trials, protocol.n_startup_trials
    bar = tqdm(total=n_trials + 1, desc=progress, unit="trial", leave=False, disable=not progress)
    describe = describe or (lambda i: f"search seed={jobs[i].seed}")
    one_pass = trainer is None
    if one_pass:

        def trainer(configs, eval_data):
            return train_many(
                data,
                configs,
                protocol=protocol,
                eval_data=eval_data,
                top_classes=eval_data is not None,
                **train_kw,
            )

    tables = [[] for _ in jobs]
    with bar, quiet_optuna(verbose):
        studies = [make_study(j.seed, n_startup_trials) for j in jobs]
        rounds = round_sizes(n_trials, n_startup_trials, protocol.trials_per_batch)
        for rnd, size in enumerate(rounds):
            asked, configs = [], []
            for i, (job, study) in enumerate(zip(jobs, studies)):
                for _ in range(size):
                    trial = study.ask()
                    lr = trial.suggest_float("lr", *protocol.lr_range, log=True)
                    wd = trial.suggest_float("wd", *protocol.wd_range, log=True)
                    asked.append((i, trial, lr, wd))
                    configs.append(
                        TrainConfig(lr, wd, job.seed, job.train_idx, eval_idx=job.val_idx)
                    )
            if verbose and one_pass:
                print(f"round {rnd + 1}: {len(configs)} trials in one pass", flush=True)
            for (i, trial, lr, wd), res in zip(asked, trainer(configs, None)):
                state = "FAIL" if res.diverged else "COMPLETE"
                if res.diverged:
                    studies[i].tell(trial, state=optuna.trial.TrialState.FAIL)
                else:
                    studies[i].tell(trial, res.top1)
                last = res.loss_curve[max(res.n_epochs - 1, 0)] if res.n_epochs else math.nan
                tables[i].append(
                    {
                        "number": trial.number,
                        "round": rnd,
                        "lr": lr,
                        "wd": wd,
                        "state": state,
                        "val_top1": res.top1,
                        "val_top5": res.top5,
                        "train_loss": float(last),
                        "epochs": res.n_epochs,
                    }
                )
            bar.update(size)

        finals = []
        for i, (job, study) in enumerate(zip(jobs, studies)):
            done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
            if not done:
                raise ValueError(
                    f"{describe(i)}: all {n_trials} trials diverged (non-finite loss); {hint}"
                )
            best = study.best_trial.params
            eval_idx = None if test is None else job.test_idx
            finals.append(
                TrainConfig(best["lr"], best["wd"], job.seed, job.final_idx, eval_idx=eval_idx)
            )
        final_res = trainer(finals, test)
        bar.update(1)
    outcomes = []
    for i, (study, table, res) in enumerate(zip(studies, tables, final_res)):
        if res.diverged:
            best = study.best_trial.params
            raise ValueError(
                f"{describe(i)}: final fit: "
                + diverged_message(best["lr"], best["wd"], res.n_epochs, hint)
            )
        outcomes.append(Outcome(study, table, res, getattr(res, "top_classes", None)))
    return outcomes


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
    n_trials=PAPER_PROTOCOL.n_trials,
    n_startup_trials=PAPER_PROTOCOL.n_startup_trials,
    trials_per_batch=PAPER_PROTOCOL.trials_per_batch,
    lr_range=PAPER_PROTOCOL.lr_range,
    wd_range=PAPER_PROTOCOL.wd_range,
    epochs=PAPER_PROTOCOL.epochs,
    batch_size=PAPER_PROTOCOL.batch_size,
    momentum=PAPER_PROTOCOL.momentum,
    schedule=PAPER_PROTOCOL.schedule,
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
    them), so five seeds' searches take as many passes as one. Each pass does their
    arithmetic: the gain is on a GPU, where a small probe's step is bound by kernel launches,
    not on a CPU. The final fits share one pass too. The features move to the device once for
    everything.

    Batching and TPE: round 1 asks the ``n_startup_trials`` startup trials, which TPE draws at
    random without looking at results, so asking them together changes nothing. Later rounds
    ask ``trials_per_batch`` trials each; the trials of a round see the same finished trials.
    With ``trials_per_batch=1``, the default and the official search, each search asks the
    trials a sequential ``study.optimize`` loop with the same Optuna would (the official
    code pinned Optuna 2.3.0, whose TPE suggests other trials after the startup ones). More
    is an opt-in for speed: 5 makes 30 trials 5 passes instead of 21, but the trials of a
    round do not see each other's results, so from trial ``n_startup_trials + 2`` on (the
    first trial of a round is asked with none pending) the sequence, and possibly the chosen
    ``(lr, wd)``, change; the sampler's ``constant_liar`` (always on, without effect when one
    trial is pending) counts the round's pending trials as bad results, so a round spreads out
    instead of suggesting one point several times.

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
    trials_per_batch : int, default=1
        Trials per round after the startup round: 1 is the official sequential search.
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
        arithmetic; the fused step checks itself against the eager one as it trains, and a
        disagreement, or a compile or capture that fails, warns once and trains eagerly (or
        uncompiled, or without graphs).

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
    >>> from imagenet_cog._grid import SEEDS
    >>> X, y = make_blobs(n_samples=300, centers=3, n_features=8, random_state=0)
    >>> X = normalize(X)
    >>> specs = [make_search_spec(y, seed) for seed in SEEDS[:2]]  # the official 22 and 37
    >>> res = run_searches(X, y, specs, n_trials=4, n_startup_trials=2, epochs=3,
    ...                    device="cpu")
    >>> [len(r.trials) for r in res], sorted(res[0].best_params)
    ([4, 4], ['lr', 'wd'])
    """
    from .._device import placement
    from .engine import DeviceData

    protocol = Protocol.from_arguments(locals())
    place = placement(device, dtype, mixed_precision)
    searches = list(searches)
    classes, y_enc = encode_labels(np.asarray(y))
    check_labelled_features(X, y_enc.size, "X")
    data = DeviceData(
        X, y_enc, device=place.device, dtype=place.features, memory_budget=memory_budget
    )
    test = None
    if (X_test is None) != (y_test is None):
        raise ValueError("pass X_test and y_test together")
    if X_test is not None:
        check_labelled_features(X_test, len(y_test), "X_test", n_features=data.d)
        pos = encode_test_labels(classes, y_test, "y")
        test = DeviceData(
            X_test, pos, device=place.device, dtype=place.features, memory_budget=memory_budget
        )
    train_kw = {
        "n_classes": len(classes),
        "dtype": place.weights,
        "tf32": place.tf32,
        "verbose": max(0, verbose - 1),
        "compile": compile,
    }
    test_idx = None if test is None else np.arange(test.n)
    jobs = [Job(s.seed, s.train_idx, s.val_idx, s.final_idx, test_idx) for s in searches]
    outcomes = search_in_lockstep(
        data,
        jobs,
        protocol=protocol,
        train_kw=train_kw,
        test=test,
        verbose=verbose,
        progress=(progress if isinstance(progress, str) else "search") if progress else None,
    )
    return [
        SearchResult(
            spec=spec,
            best_params=out.best_params,
            best_score=float(out.study.best_value),
            study=out.study,
            trials=out.trials,
            classes=classes,
            coef=out.final.coef,
            intercept=out.final.intercept,
            loss_curve=out.final.loss_curve,
            test_top1=out.final.top1,
            test_top5=out.final.top5,
        )
        for spec, out in zip(searches, outcomes)
    ]
