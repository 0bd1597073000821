"""LinearProbeCV, run_searches and the official splits (the paper, supplement B.2)."""

import pickle

import numpy as np
import optuna
import pytest
from sklearn.base import clone
from sklearn.datasets import make_blobs
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import normalize
from sklearn.utils.estimator_checks import parametrize_with_checks

from imagenet_cog import LinearProbe, LinearProbeCV, make_search_spec, run_searches
from imagenet_cog._train.search import round_sizes

#: The search holds out floor(0.2 n_c) samples of every class for validation; one sample
#: leaves none, and its error says that (the cause) rather than naming one sample.
_ONE_SAMPLE = (
    "a one-sample fit is refused as 'the validation holdout is empty: floor(0.2 * n_c) is 0 "
    "for every class', which names the cause instead of sklearn's '1 sample' wording"
)


@parametrize_with_checks(
    [LinearProbeCV(n_trials=2, n_startup_trials=1, epochs=2, device="cpu", random_state=0)],
    expected_failed_checks=lambda est: {"check_fit2d_1sample": _ONE_SAMPLE},
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def blobs(n=300, centers=3, d=8, seed=0):
    X, y = make_blobs(n_samples=n, centers=centers, n_features=d, random_state=seed)
    return normalize(X).astype(np.float32), y


def gaussian_mixture(n, d=32, n_classes=10, seed=0):
    """Train and test draws of an isotropic Gaussian mixture, l2-normalised as CoG features."""
    rng = np.random.default_rng(seed)
    means = normalize(rng.normal(size=(n_classes, d))) * 0.35 * np.sqrt(d)

    def draw(r):
        y = r.integers(0, n_classes, n)
        return normalize(means[y] + r.normal(size=(n, d))).astype(np.float32), y

    return draw(rng), draw(np.random.default_rng(seed + 1))


# ------------------------------------------------------------------------------------ splits
def test_split_holds_out_floor_20_percent_per_class():
    y = np.repeat(np.array(["a", "b", "c", "d"]), [10, 7, 4, 23])
    spec = make_search_spec(y, seed=22)
    val_counts = {c: int((y[spec.val_idx] == c).sum()) for c in "abcd"}
    assert val_counts == {"a": 2, "b": 1, "c": 0, "d": 4}
    assert np.intersect1d(spec.train_idx, spec.val_idx).size == 0
    np.testing.assert_array_equal(np.union1d(spec.train_idx, spec.val_idx), np.arange(len(y)))
    np.testing.assert_array_equal(spec.final_idx, np.arange(len(y)))
    again = make_search_spec(y, seed=22)
    np.testing.assert_array_equal(again.val_idx, spec.val_idx)
    other = [make_search_spec(y, seed=s).val_idx for s in (37, 45, 77, 93)]
    assert any(not np.array_equal(o, spec.val_idx) for o in other)


def test_few_shot_split():
    y = np.repeat(np.arange(5), 30)
    full = make_search_spec(y, seed=7)
    spec = make_search_spec(y, seed=7, n_shots=4)
    # the holdout is drawn first and is the whole holdout
    np.testing.assert_array_equal(spec.val_idx, full.val_idx)
    assert np.bincount(y[spec.train_idx]).tolist() == [4] * 5
    assert np.isin(spec.train_idx, full.train_idx).all()
    # the final draw comes from the whole training set, holdout included
    assert np.bincount(y[spec.final_idx]).tolist() == [4] * 5
    draws = [make_search_spec(y, seed=s, n_shots=4).final_idx for s in range(20)]
    assert np.isin(np.concatenate(draws), full.val_idx).any()


def test_few_shot_short_class_is_named():
    y = np.repeat(np.array(["cat", "dog", "emu"]), [20, 20, 5])
    # emu: 5 samples, 1 held out, 4 left for the search
    with pytest.raises(ValueError, match=r"class 'emu' has only 4 samples in the search"):
        make_search_spec(y, seed=0, n_shots=5)
    y = np.repeat(np.array(["cat", "dog", "emu"]), [40, 40, 8])
    with pytest.raises(ValueError, match=r"class 'emu' has only 7 samples"):
        make_search_spec(y, seed=0, n_shots=8)
    assert len(make_search_spec(y, seed=0, n_shots=7).final_idx) == 21
    with pytest.raises(ValueError, match="n_shots"):
        make_search_spec(y, seed=0, n_shots=0)


def test_empty_holdout_is_an_error():
    with pytest.raises(ValueError, match="holdout is empty"):
        make_search_spec(np.repeat([0, 1], 4), seed=0)


def test_round_sizes():
    assert round_sizes(30, 10, 5) == [10, 5, 5, 5, 5]
    assert round_sizes(30, 10, 1) == [10] + [1] * 20
    assert round_sizes(30, 10, 8) == [10, 8, 8, 4]
    assert round_sizes(4, 10, 5) == [4]
    assert round_sizes(7, 0, 3) == [3, 3, 1]


# ---------------------------------------------------------------------------------- searches
def sequential_search(X, y, spec, n_trials, **kw):
    """The official search loop: ``study.optimize`` asks TPE for one trial at a time."""

    def objective(trial):
        lr = trial.suggest_float("lr", 0.1, 100, log=True)
        wd = trial.suggest_float("wd", 1e-12, 1e-4, log=True)
        probe = LinearProbe(lr=lr, weight_decay=wd, random_state=spec.seed, **kw)
        probe.fit(X[spec.train_idx], y[spec.train_idx])
        return probe.score(X[spec.val_idx], y[spec.val_idx])

    sampler = optuna.samplers.TPESampler(multivariate=True, seed=spec.seed, constant_liar=False)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective, n_trials=n_trials)
    return study.trials


def test_default_search_is_the_sequential_one():
    # By default, LinearProbeCV and run_searches ask one trial at a time after the batched
    # startup round: exactly the trials of the official loop, study.optimize(objective).
    X, y = blobs(n=150)
    kw = {"epochs": 2, "batch_size": 32, "device": "cpu"}
    cv = LinearProbeCV(n_trials=14, random_state=22, **kw).fit(X, y)
    (res,) = run_searches(X, y, [cv.split_], n_trials=14, **kw)
    want = sequential_search(X, y, cv.split_, 14, **kw)
    for trials in (cv.trials_, res.trials):
        got = [(t["lr"], t["wd"]) for t in trials]
        np.testing.assert_allclose(
            got, [(t.params["lr"], t.params["wd"]) for t in want], rtol=1e-12
        )
        np.testing.assert_allclose([t["val_top1"] for t in trials], [t.value for t in want])
        assert [t["round"] for t in trials] == [0] * 10 + list(range(1, 5))
    (one,) = run_searches(X, y, [cv.split_], n_trials=14, trials_per_batch=1, **kw)
    assert one.trials == res.trials


def test_default_search_reproduces_the_recorded_sequential_run():
    # benchmarks/results/optuna_<version>.json records the official search loop
    # (study.optimize, one LinearProbe per trial) on the benchmark's task for five seeds. The
    # default lockstep search of those seeds draws the same 30 trials and the same test top-1.
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "benchmarks"
    record = root / "results" / f"optuna_{optuna.__version__}.json"
    if not record.exists():
        pytest.skip(f"no recorded run for Optuna {optuna.__version__}")
    doc = json.loads(record.read_text())
    spec = importlib.util.spec_from_file_location("cov", root / "compare_optuna_versions.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    X, y, X_test, y_test = bench.make_task()
    specs = [make_search_spec(y, row["seed"]) for row in doc["seeds"]]
    results = run_searches(
        X,
        y,
        specs,
        n_trials=doc["n_trials"],
        epochs=doc["epochs"],
        device="cpu",
        X_test=X_test,
        y_test=y_test,
    )
    for row, res in zip(doc["seeds"], results):
        want = [t[:2] for t in row["trials"]]
        np.testing.assert_allclose(
            [(t["lr"], t["wd"]) for t in res.trials], want, rtol=1e-9, atol=0
        )
        assert 100 * res.test_top1 == pytest.approx(row["test_top1"], abs=1e-9)


def test_batched_trials_leave_the_sequence_after_the_first_of_a_round():
    # The opt-in trials_per_batch=5: trial 11 is asked with no trial pending, as in the
    # sequential loop; trial 12 is asked before trial 11's result is known.
    X, y = blobs(n=150)
    kw = {"epochs": 2, "batch_size": 32, "device": "cpu"}
    spec = make_search_spec(y, seed=22)
    (res,) = run_searches(X, y, [spec], n_trials=12, trials_per_batch=5, **kw)
    want = sequential_search(X, y, spec, 12, **kw)
    got = [(t["lr"], t["wd"]) for t in res.trials]
    np.testing.assert_allclose(
        got[:11], [(t.params["lr"], t.params["wd"]) for t in want[:11]], rtol=1e-12
    )
    assert got[11] != pytest.approx((want[11].params["lr"], want[11].params["wd"]), rel=1e-6)
    assert [t["round"] for t in res.trials] == [0] * 10 + [1, 1]


def test_search_is_reproducible():
    X, y = blobs(n=200)
    kw = {"n_trials": 8, "n_startup_trials": 4, "trials_per_batch": 2, "epochs": 3}
    a = LinearProbeCV(device="cpu", random_state=5, **kw).fit(X, y)
    b = LinearProbeCV(device="cpu", random_state=5, **kw).fit(X, y)
    c = LinearProbeCV(device="cpu", random_state=6, **kw).fit(X, y)
    assert a.trials_ == b.trials_
    assert a.best_params_ == b.best_params_
    np.testing.assert_array_equal(a.best_estimator_.coef_, b.best_estimator_.coef_)
    assert [t["lr"] for t in a.trials_] != [t["lr"] for t in c.trials_]


def test_searched_probe_matches_best_logistic_regression():
    (X, y), (X_test, y_test) = gaussian_mixture(4000)
    search = LinearProbeCV(device="cpu", random_state=22).fit(X, y)
    assert len(search.trials_) == 30
    probe_acc = search.score(X_test, y_test)
    # the best C for the test set itself: a bar the probe's own validation cannot see
    lr_acc = max(
        LogisticRegression(C=C, max_iter=1000).fit(X, y).score(X_test, y_test)
        for C in np.logspace(-2, 3, 11)
    )
    assert probe_acc >= lr_acc - 0.005, (probe_acc, lr_acc)


def test_lockstep_searches_equal_separate_searches():
    X, y = blobs(n=240, centers=4)
    X_test, y_test = blobs(n=90, centers=4, seed=0)
    specs = [make_search_spec(y, seed) for seed in (22, 37)]
    specs.append(make_search_spec(y, 45, n_shots=5))
    kw = {
        "n_trials": 6,
        "n_startup_trials": 3,
        "trials_per_batch": 2,
        "epochs": 3,
        "batch_size": 32,
        "device": "cpu",
        "X_test": X_test,
        "y_test": y_test,
    }
    together = run_searches(X, y, specs, **kw)
    for spec, got in zip(specs, together):
        (alone,) = run_searches(X, y, [spec], **kw)
        assert [t["lr"] for t in got.trials] == [t["lr"] for t in alone.trials]
        assert [t["val_top1"] for t in got.trials] == [t["val_top1"] for t in alone.trials]
        assert got.best_params == alone.best_params
        # float32 weights of size ~100 after learning rates up to 100: compare relative to
        # the weights' scale (the engine-level 1e-5 test uses moderate learning rates).
        scale = np.abs(alone.coef).max()
        np.testing.assert_allclose(got.coef, alone.coef, rtol=0, atol=1e-5 * scale)
        assert got.test_top1 == alone.test_top1
    assert len({r.best_params["lr"] for r in together}) == 3


def test_final_model_and_test_scores_agree_with_a_plain_refit():
    X, y = blobs(n=240, centers=4)
    X_test, y_test = blobs(n=120, centers=4, seed=0)
    spec = make_search_spec(y, seed=22)
    (res,) = run_searches(
        X,
        y,
        [spec],
        n_trials=4,
        n_startup_trials=4,
        epochs=4,
        batch_size=64,
        device="cpu",
        X_test=X_test,
        y_test=y_test,
    )
    refit = LinearProbe(
        lr=res.best_params["lr"],
        weight_decay=res.best_params["wd"],
        epochs=4,
        batch_size=64,
        device="cpu",
        random_state=22,
    ).fit(X, y)
    np.testing.assert_allclose(refit.coef_, res.coef, atol=1e-5)
    assert res.test_top1 == pytest.approx(refit.score(X_test, y_test))
    proba = refit.predict_proba(X_test)
    top5 = np.argsort(-proba, axis=1)[:, :5]
    assert res.test_top5 == pytest.approx((top5 == y_test[:, None]).any(1).mean())
    best = max(res.trials, key=lambda t: t["val_top1"])
    assert res.best_score == best["val_top1"]


def test_diverging_trials_fail_and_are_skipped():
    X, y = blobs(n=150)
    X = X * 1e10  # lr near the top of the range overflows float32
    spec = make_search_spec(y, seed=0)
    kw = {"n_trials": 8, "n_startup_trials": 8, "epochs": 2, "device": "cpu"}
    (res,) = run_searches(X, y, [spec], lr_range=(1e-30, 1e30), **kw)
    states = [t["state"] for t in res.trials]
    assert "FAIL" in states
    assert "COMPLETE" in states
    fails = res.study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert len(fails) == states.count("FAIL")
    assert res.best_params["lr"] < 1e10
    with pytest.raises(ValueError, match="all 8 trials diverged"):
        run_searches(X, y, [spec], lr_range=(1e28, 1e30), **kw)


def test_run_searches_input_errors():
    X, y = blobs(n=100)
    spec = make_search_spec(y, seed=0)
    bad = X.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        run_searches(bad, y, [spec], n_trials=1, epochs=1, device="cpu")
    with pytest.raises(ValueError, match="X_test has 3 features, but X has 8"):
        run_searches(X, y, [spec], n_trials=1, epochs=1, device="cpu", X_test=X[:, :3], y_test=y)
    with pytest.raises(ValueError, match="together"):
        run_searches(X, y, [spec], n_trials=1, epochs=1, device="cpu", X_test=X)
    with pytest.raises(ValueError, match="absent from y"):
        run_searches(X, y, [spec], n_trials=1, epochs=1, device="cpu", X_test=X, y_test=y + 10)


# ----------------------------------------------------------------------------- edge cases
FAST = {"n_trials": 3, "n_startup_trials": 3, "epochs": 3, "device": "cpu", "random_state": 0}


def test_cv_with_a_one_sample_class():
    X, y = blobs(n=200)
    y = y.copy()
    y[0] = 7  # a class with one sample: never in the holdout, always trained on
    search = LinearProbeCV(**FAST).fit(X, y)
    assert search.classes_.tolist() == [0, 1, 2, 7]
    assert 0 not in search.split_.val_idx
    assert search.predict_proba(X).shape == (200, 4)


def test_cv_with_two_classes():
    X, y = blobs(n=100, centers=2)
    search = LinearProbeCV(**FAST).fit(X, y)
    assert search.decision_function(X).shape == (100,)
    assert search.best_estimator_.coef_.shape == (1, 8)
    assert search.score(X, y) > 0.9


def test_cv_with_a_thousand_classes():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(1000), 5)
    X = normalize(normalize(rng.normal(size=(1000, 32)))[y] + 0.1 * rng.normal(size=(5000, 32)))
    search = LinearProbeCV(batch_size=256, **{**FAST, "epochs": 10}).fit(X, y)
    assert search.best_estimator_.coef_.shape == (1000, 32)
    assert len(search.split_.val_idx) == 1000  # floor(0.2 * 5) per class
    assert search.score(X, y) > 0.5


def test_cv_few_shot():
    X, y = blobs(n=300)
    search = LinearProbeCV(n_shots=8, **FAST).fit(X, y)
    assert np.bincount(y[search.split_.final_idx]).tolist() == [8, 8, 8]
    assert np.bincount(y[search.split_.train_idx]).tolist() == [8, 8, 8]
    assert len(search.split_.val_idx) == sum(int(0.2 * c) for c in np.bincount(y))
    with pytest.raises(ValueError, match=r"class 0 has only 80 samples.*2 more classes"):
        LinearProbeCV(n_shots=95, **FAST).fit(X, y)


def test_cv_string_labels_clone_pickle_and_attributes():
    X, y = blobs(n=150)
    labels = np.array(["n02123159", "n02123045", "n02124075"])[y]
    search = LinearProbeCV(**FAST).fit(X, labels)
    assert set(search.predict(X)) <= set(labels)
    assert isinstance(search.study_, optuna.Study)
    assert set(search.trials_[0]) >= {"number", "lr", "wd", "state", "val_top1", "val_top5"}
    assert 0 <= search.best_score_ <= 1
    assert search.to_sklearn().classes_.tolist() == sorted(set(labels))
    again = pickle.loads(pickle.dumps(search))
    np.testing.assert_array_equal(again.predict_proba(X), search.predict_proba(X))
    assert not hasattr(clone(search), "best_estimator_")


def test_cv_unfitted_raises_not_fitted():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        LinearProbeCV().predict(np.zeros((1, 2)))


# ------------------------------------------------------------------------- the trainer hook
def test_lockstep_trains_through_a_trainer_hook_with_the_linear_probes_trials():
    from types import SimpleNamespace

    import torch

    from imagenet_cog._grid import Protocol
    from imagenet_cog._train.engine import DeviceData
    from imagenet_cog._train.search import Job, search_in_lockstep

    X, y = blobs(n=120)
    spec = make_search_spec(y, 22)
    kw = {"n_trials": 4, "n_startup_trials": 2, "trials_per_batch": 1, "epochs": 3}
    (ref,) = run_searches(X, y, [spec], device="cpu", X_test=X, y_test=y, **kw)
    calls = []

    def trainer(configs, eval_data):  # a fake model: its score is a function of lr alone
        calls.append((len(configs), eval_data))
        return [
            SimpleNamespace(
                diverged=c.lr > 50, top1=1 / c.lr, top5=1.0, n_epochs=3, loss_curve=np.zeros(3)
            )
            for c in configs
        ]

    data = DeviceData(X, y, device=torch.device("cpu"))
    job = Job(spec.seed, spec.train_idx, spec.val_idx, spec.final_idx, np.arange(len(y)))
    (out,) = search_in_lockstep(
        data, [job], protocol=Protocol(**kw), test="the test data", trainer=trainer
    )
    # One round per trial after the startup round, then the final on the test data.
    assert calls == [(2, None), (1, None), (1, None), (1, "the test data")]
    # The same sampler asks the same first trials whatever trains them.
    assert [t["lr"] for t in out.trials[:2]] == [t["lr"] for t in ref.trials[:2]]
    done = [t for t in out.trials if t["state"] == "COMPLETE"]
    assert out.study.best_params["lr"] == min(t["lr"] for t in done)
