"""Searches in lockstep: the round loop behind :func:`imagenet_cog.probe.run_searches` and
:func:`imagenet_cog.evaluate`.

Every search is an Optuna TPE study asked in rounds (the startup trials together, then
``trials_per_batch`` trials); round ``r`` of *every* search trains in one
:func:`~imagenet_cog._engine.train_many` pass, whatever domain, shots or seed the search
belongs to, as long as they share one feature array (several domains' features concatenated
with row offsets) and one number of classes. Each search keeps the trial sequence it would
have alone. Then the finals train together in one more pass.

Nothing here is public API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings

import numpy as np


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
    study: object
    trials: list
    final: object  # the final fit's TrainResult


def lockstep(
    data,
    jobs,
    *,
    train_kw=None,
    n_trials,
    n_startup_trials,
    trials_per_batch,
    lr_range,
    wd_range,
    test=None,
    verbose=0,
    bar=None,
    describe=None,
    trainer=None,
    diverged_hint="",
):
    """Run every job's search in lockstep, then their finals; a list of :class:`Outcome`.

    ``describe(i)`` names job ``i`` in errors (default: its seed); ``diverged_hint`` ends the
    error of a search whose trials all diverged.

    ``trainer(configs, eval_data)`` trains a round: a list of :class:`~imagenet_cog._engine.
    TrainConfig` (each trial's ``lr``, ``wd``, seed, training and evaluation rows), evaluated
    on ``data`` (``eval_data=None``) or on the test data (the finals), and returns one result
    per config with ``diverged``, ``top1``, ``top5``, ``loss_curve`` and ``n_epochs``. By
    default, one :func:`~imagenet_cog._engine.train_many` pass of linear probes with
    ``train_kw``.
    """
    import optuna

    from .engine import TrainConfig, train_many

    describe = describe or (lambda i: f"search seed={jobs[i].seed}")
    one_pass = trainer is None
    if one_pass:

        def trainer(configs, eval_data):
            return train_many(data, configs, eval_data=eval_data, **train_kw)

    tables = [[] for _ in jobs]
    with quiet_optuna(verbose):
        studies = [make_study(j.seed, n_startup_trials) for j in jobs]
        for rnd, size in enumerate(round_sizes(n_trials, n_startup_trials, trials_per_batch)):
            asked, configs = [], []
            for i, (job, study) in enumerate(zip(jobs, studies)):
                for _ in range(size):
                    trial = study.ask()
                    lr = trial.suggest_float("lr", *lr_range, log=True)
                    wd = trial.suggest_float("wd", *wd_range, log=True)
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
            if bar is not None:
                bar.update(size)

        finals = []
        for i, (job, study) in enumerate(zip(jobs, studies)):
            done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
            if not done:
                raise ValueError(
                    f"{describe(i)}: all {n_trials} trials diverged (non-finite loss)"
                    + diverged_hint
                )
            best = study.best_trial.params
            eval_idx = None if test is None else job.test_idx
            finals.append(
                TrainConfig(best["lr"], best["wd"], job.seed, job.final_idx, eval_idx=eval_idx)
            )
        final_res = trainer(finals, test)
        if bar is not None:
            bar.update(1)
    return [Outcome(s, t, f) for s, t, f in zip(studies, tables, final_res)]
