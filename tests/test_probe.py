"""LinearProbe and the batched SGD engine behind it."""

import math
import pickle
import re
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.datasets import make_blobs
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer, normalize
from sklearn.utils.estimator_checks import parametrize_with_checks

from imagenet_cog import LinearProbe, LinearProbeCV
from imagenet_cog._grid import Protocol
from imagenet_cog._train.engine import DeviceData, TrainConfig, lr_schedule, train_many
from imagenet_cog._validation import COMPILE

CPU = torch.device("cpu")


def blobs(n=300, centers=4, d=8, seed=0, scale=True):
    X, y = make_blobs(n_samples=n, centers=centers, n_features=d, random_state=seed)
    return (normalize(X) if scale else X).astype(np.float32), y


@parametrize_with_checks([LinearProbe(device="cpu")])
def test_sklearn_compatible(estimator, check):
    check(estimator)


# ------------------------------------------------------------------------------------ engine
def reference_sgd(X, y, n_classes, lr, wd, seed, epochs, batch_size, momentum=0.9):
    """The official protocol written plainly: nn.Linear, torch.optim.SGD, CrossEntropyLoss."""
    gen = torch.Generator().manual_seed(seed)
    d = X.shape[1]
    lin = torch.nn.Linear(d, n_classes)
    bound = 1 / np.sqrt(d)
    with torch.no_grad():  # nn.Linear's own init, drawn from the seeded generator
        lin.weight.uniform_(-bound, bound, generator=gen)
        lin.bias.uniform_(-bound, bound, generator=gen)
    opt = torch.optim.SGD(lin.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    bs = min(batch_size, len(y))
    for epoch in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), bs):
            rows = perm[start : start + bs]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(lin(X[rows]), y[rows]).backward()
            opt.step()
        # The official adjust_learning_rate: after epoch e, for the next one.
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))
    return lin.weight.detach().numpy(), lin.bias.detach().numpy()


def test_cosine_schedule_is_applied_after_each_epoch_like_the_official_code():
    f = lr_schedule("cosine", 100)
    assert f[0] == f[1] == 1.0  # epoch 0 and 1 both at lr0
    assert f[2] == pytest.approx(0.5 * (1 + math.cos(math.pi / 100)))
    assert f[99] == pytest.approx(0.5 * (1 + math.cos(math.pi * 98 / 100)))
    assert (np.diff(f) <= 0).all()
    assert (lr_schedule("constant", 3) == 1).all()


@pytest.mark.parametrize(("n", "batch_size"), [(250, 64), (40, 1024)])
def test_engine_follows_torch_sgd_protocol(n, batch_size):
    # Weight decay on weight and bias, momentum, the partial last batch, the batch mean and the
    # cosine schedule all as torch.optim.SGD over an nn.Linear: the official code.
    X, y = blobs(n=n, centers=3)
    data = DeviceData(X, y, device=CPU)
    cfg = TrainConfig(lr=0.7, weight_decay=3e-3, seed=5)
    (res,) = train_many(
        data, [cfg], n_classes=3, protocol=Protocol(epochs=6, batch_size=batch_size)
    )
    W, b = reference_sgd(X, y, 3, 0.7, 3e-3, 5, epochs=6, batch_size=batch_size)
    np.testing.assert_allclose(res.coef, W, atol=1e-5)
    np.testing.assert_allclose(res.intercept, b, atol=1e-5)
    assert res.n_epochs == 6
    assert not res.diverged


def mixed_configs(n):
    rng = np.random.default_rng(1)
    sub_a = np.sort(rng.choice(n, 170, replace=False))
    sub_b = np.sort(rng.choice(n, 90, replace=False))
    ev = np.arange(0, n, 3)
    return [
        # group 1: three configurations sharing seed and subset (one GEMM)
        TrainConfig(0.5, 1e-4, seed=1, eval_idx=ev),
        TrainConfig(2.0, 0.0, seed=1, eval_idx=ev),
        TrainConfig(0.1, 1e-2, seed=1),
        # group 2: another subset with fewer steps per epoch (masked steps)
        TrainConfig(1.0, 1e-3, seed=1, train_idx=sub_a, eval_idx=ev),
        # group 3: the same subset, another seed; group 4: a tiny subset (one partial batch)
        TrainConfig(1.0, 1e-3, seed=2, train_idx=sub_a),
        TrainConfig(0.3, 1e-6, seed=3, train_idx=sub_b, eval_idx=np.arange(5)),
    ]


def test_batched_fits_equal_separate_fits():
    X, y = blobs(n=400, centers=5, d=12)
    data = DeviceData(X, y, device=CPU)
    configs = mixed_configs(len(y))
    kw = {"n_classes": 5, "protocol": Protocol(epochs=7, batch_size=64)}
    together = train_many(data, configs, **kw)
    for cfg, got in zip(configs, together):
        (alone,) = train_many(data, [cfg], **kw)
        np.testing.assert_allclose(got.coef, alone.coef, atol=1e-5)
        np.testing.assert_allclose(got.intercept, alone.intercept, atol=1e-5)
        np.testing.assert_allclose(got.loss_curve, alone.loss_curve, atol=1e-5)
        np.testing.assert_allclose(got.top1, alone.top1, atol=1e-9)
        np.testing.assert_allclose(got.top5, alone.top5, atol=1e-9)
    # The configurations differ, so the test compares distinct trajectories.
    assert not np.allclose(together[0].coef, together[1].coef)
    assert np.isnan(together[2].top1)
    assert together[0].top1 > 0.5


def test_streaming_matches_resident():
    X, y = blobs(n=400, centers=5, d=12)
    configs = mixed_configs(len(y))
    kw = {"n_classes": 5, "protocol": Protocol(epochs=3, batch_size=64)}
    resident = train_many(DeviceData(X, y, device=CPU), configs, **kw)
    tiny = DeviceData(X.astype(np.float64), y, device=CPU, dtype=torch.float32, memory_budget=500)
    assert not tiny.resident
    assert tiny.rows_per_chunk < 64
    streamed = train_many(tiny, configs, **kw)
    for a, b in zip(resident, streamed):
        np.testing.assert_array_equal(a.coef, b.coef)
        np.testing.assert_array_equal(a.loss_curve, b.loss_curve)
        assert a.top1 == b.top1 or (np.isnan(a.top1) and np.isnan(b.top1))


def test_probe_streaming_matches_resident():
    X, y = blobs(n=200, centers=3)
    a = LinearProbe(epochs=4, batch_size=32, device="cpu", random_state=0).fit(X, y)
    b = LinearProbe(epochs=4, batch_size=32, device="cpu", random_state=0, memory_budget=100)
    np.testing.assert_array_equal(a.coef_, b.fit(X, y).coef_)


def test_diverging_configuration_is_frozen_alone():
    X, y = blobs(n=200, centers=3)
    data = DeviceData(X * 1e10, y, device=CPU)
    good = TrainConfig(1e-9, 0.0, seed=0, eval_idx=np.arange(200))
    bad = TrainConfig(1e30, 0.0, seed=0, eval_idx=np.arange(200))
    kw = {"n_classes": 3, "protocol": Protocol(epochs=4, batch_size=64)}
    res_good, res_bad = train_many(data, [good, bad], **kw)
    assert res_bad.diverged
    assert not res_good.diverged
    assert np.isnan(res_bad.coef).all()
    assert np.isnan(res_bad.top1)
    assert np.isnan(res_bad.loss_curve[res_bad.n_epochs :]).all()
    (alone,) = train_many(data, [good], **kw)
    np.testing.assert_allclose(res_good.coef, alone.coef, atol=1e-5)
    np.testing.assert_allclose(res_good.loss_curve, alone.loss_curve, rtol=1e-6)


def test_engine_validates_configs():
    X, y = blobs(n=20, centers=2)
    data = DeviceData(X, y, device=CPU)
    with pytest.raises(ValueError, match="outside"):
        train_many(data, [TrainConfig(1.0, train_idx=np.array([0, 99]))], n_classes=2)
    with pytest.raises(ValueError, match="lr"):
        train_many(data, [TrainConfig(float("nan"))], n_classes=2)
    with pytest.raises(ValueError, match="empty"):
        train_many(data, [TrainConfig(1.0, train_idx=np.array([], dtype=int))], n_classes=2)


def test_engine_accepts_device_tensor_without_copy():
    X, y = blobs(n=50, centers=2)
    t = torch.from_numpy(X)
    data = DeviceData(t, y, device=CPU)
    assert data.X.data_ptr() == t.data_ptr()


# ------------------------------------------------------------------------------ LinearProbe
def test_bit_identical_refits_and_seed_matters():
    X, y = blobs()
    a = LinearProbe(epochs=5, batch_size=64, device="cpu", random_state=3).fit(X, y)
    b = LinearProbe(epochs=5, batch_size=64, device="cpu", random_state=3).fit(X, y)
    c = LinearProbe(epochs=5, batch_size=64, device="cpu", random_state=4).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.loss_curve_, b.loss_curve_)
    assert not np.array_equal(a.coef_, c.coef_)


def test_fitted_state_is_numpy_and_pickles_without_torch():
    X, y = blobs()
    probe = LinearProbe(epochs=3, device="cpu", random_state=0).fit(X, y)
    for name in ("coef_", "intercept_", "classes_", "loss_curve_"):
        assert isinstance(getattr(probe, name), np.ndarray)
    blob = pickle.dumps(probe)
    assert b"torch" not in blob
    np.testing.assert_array_equal(pickle.loads(blob).predict_proba(X), probe.predict_proba(X))


def test_string_labels_and_attributes():
    X, y = blobs(centers=3)
    names = np.array(["n01440764", "n01443537", "n01484850"])[y]
    probe = LinearProbe(epochs=20, device="cpu", random_state=0).fit(X, names)
    assert probe.classes_.tolist() == sorted(set(names))
    assert probe.predict(X).dtype == names.dtype
    assert probe.score(X, names) > 0.9
    assert probe.coef_.shape == (3, 8)
    assert probe.intercept_.shape == (3,)
    assert probe.n_iter_ == 20
    assert probe.loss_curve_.shape == (20,)
    assert probe.loss_curve_[-1] < probe.loss_curve_[0]


def test_binary_uses_logistic_regression_shapes():
    X, y = blobs(centers=2)
    probe = LinearProbe(epochs=20, device="cpu", random_state=0).fit(X, y)
    assert probe.coef_.shape == (1, 8)
    assert probe.intercept_.shape == (1,)
    dec = probe.decision_function(X)
    assert dec.shape == (len(y),)
    np.testing.assert_array_equal(probe.predict(X), probe.classes_[(dec > 0).astype(int)])
    np.testing.assert_allclose(probe.predict_proba(X).sum(1), 1.0)
    np.testing.assert_allclose(np.exp(probe.predict_log_proba(X)), probe.predict_proba(X))


@pytest.mark.parametrize("centers", [2, 4])
def test_to_sklearn_predicts_the_same(centers):
    X, y = blobs(centers=centers)
    probe = LinearProbe(epochs=10, weight_decay=1e-3, device="cpu", random_state=0).fit(X, y)
    lr = probe.to_sklearn()
    assert isinstance(lr, LogisticRegression)
    np.testing.assert_array_equal(lr.coef_, probe.coef_)
    np.testing.assert_array_equal(lr.classes_, probe.classes_)
    np.testing.assert_allclose(lr.predict_proba(X), probe.predict_proba(X), atol=1e-12)
    np.testing.assert_array_equal(lr.predict(X), probe.predict(X))
    np.testing.assert_allclose(lr.C, 1 / (1e-3 * len(y)))


def test_pipeline_gridsearch_cross_val_clone_pickle():
    X, y = blobs(n=240, centers=3, scale=False)
    pipe = make_pipeline(Normalizer(), LinearProbe(epochs=10, device="cpu", random_state=0))
    scores = cross_val_score(pipe, X, y, cv=3)
    assert scores.shape == (3,)
    assert scores.min() > 0.8
    grid = GridSearchCV(pipe, {"linearprobe__lr": [0.5, 5.0]}, cv=3).fit(X, y)
    assert grid.best_params_["linearprobe__lr"] in (0.5, 5.0)
    cloned = clone(grid.best_estimator_)
    assert not hasattr(cloned[-1], "coef_")
    again = pickle.loads(pickle.dumps(grid.best_estimator_))
    np.testing.assert_array_equal(again.predict(X), grid.predict(X))


def test_nan_and_inf_features_are_named():
    X, y = blobs(n=40, centers=2)
    bad = X.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        LinearProbe(device="cpu").fit(bad, y)
    bad[3, 2] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        LinearProbe(device="cpu").fit(bad, y)
    probe = LinearProbe(epochs=2, device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="NaN"):
        probe.predict(np.where(np.isinf(bad), np.nan, bad))


def test_wrong_feature_width_says_expected_and_got():
    X, y = blobs(n=40, centers=2, d=5)
    probe = LinearProbe(epochs=2, device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="X has 3 features, but LinearProbe is expecting 5"):
        probe.predict(X[:, :3])


def test_non_finite_loss_raises():
    X, y = blobs(n=100, centers=3)
    # A fixed seed: at this scale the softmax is one-hot, so an initialisation that already
    # classifies every point (possible with random_state=None) has zero gradient and never
    # diverges.
    with pytest.raises(ValueError, match=r"non-finite at epoch 1 .*lr=1e\+30"):
        LinearProbe(lr=1e30, epochs=3, device="cpu", random_state=0).fit(X * 1e10, y)


def test_one_class_and_one_sample_per_class():
    X, _y = blobs(n=40, centers=2)
    with pytest.raises(ValueError, match="1 class"):
        LinearProbe(device="cpu").fit(X, np.zeros(len(X)))
    # a class with a single sample is fine
    y1 = np.r_[np.zeros(39, int), [1]]
    probe = LinearProbe(epochs=50, device="cpu", random_state=0).fit(X, y1)
    assert probe.classes_.tolist() == [0, 1]


def test_thousand_classes():
    rng = np.random.default_rng(0)
    means = normalize(rng.normal(size=(1000, 64)))
    y = np.repeat(np.arange(1000), 3)
    X = normalize(means[y] + 0.05 * rng.normal(size=(len(y), 64))).astype(np.float32)
    probe = LinearProbe(lr=5.0, epochs=30, batch_size=256, device="cpu", random_state=0)
    probe.fit(X, y)
    assert probe.coef_.shape == (1000, 64)
    assert probe.score(X, y) > 0.95


def test_warm_start_continues_from_previous_weights():
    for centers in (2, 3):
        X, y = blobs(centers=centers)
        probe = LinearProbe(epochs=5, device="cpu", random_state=0).fit(X, y)
        before = probe.predict_proba(X)
        # a vanishing learning rate leaves the warm-started weights where they were
        probe.set_params(warm_start=True, lr=1e-12)
        np.testing.assert_allclose(probe.fit(X, y).predict_proba(X), before, atol=1e-5)
        cold = clone(probe).set_params(warm_start=False).fit(X, y)
        assert not np.allclose(cold.predict_proba(X), before, atol=1e-3)
        with pytest.raises(ValueError, match="same classes"):
            probe.fit(X, np.where(y == 0, 99, y))


def test_lbfgs_with_bf16_features_reaches_the_float32_solution():
    X, y = make_blobs(n_samples=600, centers=5, n_features=16, cluster_std=3.0, random_state=1)
    X = normalize(X)
    kw = {"solver": "lbfgs", "weight_decay": 1e-3, "epochs": 200, "device": "cpu"}
    full = LinearProbe(**kw).fit(X, y)
    half = LinearProbe(mixed_precision="bf16", **kw).fit(X, y)
    scale = np.abs(full.coef_).max()
    np.testing.assert_allclose(half.coef_, full.coef_, atol=0.02 * scale)
    assert (half.predict(X) == full.predict(X)).mean() >= 0.99


def test_bf16_mixed_precision_is_close_to_float32():
    X, y = blobs(n=400, centers=4, d=16)
    kw = {"lr": 2.0, "epochs": 10, "batch_size": 64, "device": "cpu", "random_state": 0}
    full = LinearProbe(**kw).fit(X, y)
    half = LinearProbe(mixed_precision="bf16", **kw).fit(X, y)
    np.testing.assert_allclose(half.coef_, full.coef_, atol=0.05 * np.abs(full.coef_).max())
    assert abs(half.score(X, y) - full.score(X, y)) < 0.02
    assert not np.array_equal(half.coef_, full.coef_)  # it did run in bfloat16


def test_tf32_is_a_no_op_on_the_cpu():
    X, y = blobs()
    a = LinearProbe(epochs=3, device="cpu", random_state=0).fit(X, y)
    b = LinearProbe(epochs=3, device="cpu", random_state=0, mixed_precision="tf32").fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_float64_and_constant_schedule():
    X, y = blobs()
    probe = LinearProbe(epochs=5, dtype="float64", schedule="constant", device="cpu").fit(X, y)
    assert probe.score(X, y) > 0.9


@pytest.mark.parametrize(
    ("params", "err", "match"),
    [
        ({"lr": 0.0}, ValueError, "lr must be"),
        ({"epochs": 0}, ValueError, "epochs must be"),
        ({"epochs": 2.5}, TypeError, "epochs must be"),
        ({"momentum": 1.0}, ValueError, "momentum"),
        ({"schedule": "step"}, ValueError, "schedule"),
        ({"solver": "adam"}, ValueError, "solver"),
        ({"dtype": "float16"}, ValueError, "dtype"),
        ({"mixed_precision": "fp8"}, ValueError, "mixed_precision"),
        ({"mixed_precision": "tf32", "dtype": "float64"}, ValueError, "tf32"),
    ],
)
def test_bad_parameters(params, err, match):
    X, y = blobs(n=30, centers=2)
    with pytest.raises(err, match=match):
        LinearProbe(device="cpu", **params).fit(X, y)


def test_non_deterministic_tag_follows_device():
    assert not LinearProbe(device="cpu").__sklearn_tags__().non_deterministic
    assert LinearProbe(device="cuda").__sklearn_tags__().non_deterministic


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error():
    X, y = blobs(n=30, centers=2)
    with pytest.raises(ValueError, match="CUDA is not available"):
        LinearProbe(device="cuda").fit(X, y)


def test_verbose_prints_epochs(capsys):
    X, y = blobs(n=30, centers=2)
    LinearProbe(epochs=2, device="cpu", verbose=1).fit(X, y)
    out = capsys.readouterr().out
    assert "epoch 1/2: loss" in out
    assert "epoch 2/2" in out


# ---------------------------------------------------------------------------------- L-BFGS
def test_lbfgs_solves_logistic_regression():
    X, y = blobs(n=300, centers=3, d=6, scale=False)
    X = X.astype(np.float64)  # scikit-learn fits float32 input in float32
    C = 0.5
    wd = 1 / (C * len(y))
    probe = LinearProbe(
        solver="lbfgs", weight_decay=wd, epochs=500, tol=1e-9, dtype="float64", device="cpu"
    ).fit(X, y)
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=2000).fit(X, y)
    np.testing.assert_allclose(probe.coef_, ref.coef_, atol=1e-4)
    np.testing.assert_allclose(probe.intercept_, ref.intercept_, atol=1e-4)
    np.testing.assert_allclose(probe.to_sklearn().C, C)
    assert 1 <= probe.n_iter_ < 500


def test_lbfgs_warns_when_it_runs_out_of_iterations():
    X, y = blobs(scale=False)
    with pytest.warns(ConvergenceWarning, match="did not converge in 2"):
        LinearProbe(solver="lbfgs", weight_decay=1e-3, epochs=2, device="cpu").fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LinearProbe(solver="lbfgs", weight_decay=1e-2, epochs=300, device="cpu").fit(X, y)


def test_lbfgs_streaming_matches_resident():
    X, y = blobs()
    # blocks of 4 rows sum the loss in another order: float64 keeps that rounding invisible
    kw = {"solver": "lbfgs", "weight_decay": 1e-3, "epochs": 50, "dtype": "float64"}
    a = LinearProbe(device="cpu", **kw).fit(X, y)
    b = LinearProbe(device="cpu", memory_budget=256, **kw).fit(X, y)
    np.testing.assert_allclose(a.coef_, b.coef_, atol=1e-9)


# ------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fit_matches_cpu_and_loads_as_numpy():
    X, y = blobs(n=500, centers=5, d=32)
    kw = {"epochs": 5, "batch_size": 64, "random_state": 0}
    cpu = LinearProbe(device="cpu", **kw).fit(X, y)
    gpu = LinearProbe(device="cuda", **kw).fit(X, y)
    np.testing.assert_allclose(gpu.coef_, cpu.coef_, atol=1e-4)
    blob = pickle.dumps(gpu)
    assert b"torch" not in blob
    np.testing.assert_array_equal(pickle.loads(blob).predict(X), gpu.predict(X))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bf16_tf32_and_streaming():
    X, y = blobs(n=500, centers=5, d=32)
    kw = {"epochs": 5, "batch_size": 64, "random_state": 0, "device": "cuda"}
    ref = LinearProbe(**kw).fit(X, y)
    for extra in ({"mixed_precision": "tf32"}, {"mixed_precision": "bf16"}):
        other = LinearProbe(**kw, **extra).fit(X, y)
        assert abs(other.score(X, y) - ref.score(X, y)) < 0.02
    streamed = LinearProbe(memory_budget=4096, **kw).fit(X, y)
    np.testing.assert_allclose(streamed.coef_, ref.coef_, atol=1e-5)


# ------------------------------------------------------------------------------- benchmark
def test_benchmark_script_quick_run(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import imagenet_cog

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(Path(imagenet_cog.__file__).parents[1]))
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "bench_probe.py"), "--quick", "--json", out],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    )
    assert "30-trial search" in proc.stdout
    report = json.loads(out.read_text())
    assert report["lbfgs"]["speedup"] > 0
    assert abs(report["lbfgs"]["acc_delta_points"]) < 1.0
    search = report["search"]
    # the batched trials score exactly as the same trials trained one by one
    assert search["max_val_top1_diff_batched_vs_sequential"] == 0.0
    assert search["engine_passes_batched"] < search["engine_passes_sequential"]


def test_the_probes_share_one_predict_surface():
    # predict, predict_proba, predict_log_proba and score live in one mixin; each probe gives
    # only its class scores.
    from imagenet_cog._classifier import ProbeClassifierMixin
    from imagenet_cog.analysis import MLPProbe

    for cls in (LinearProbe, LinearProbeCV, MLPProbe):
        assert issubclass(cls, ProbeClassifierMixin)
        for name in ("predict", "predict_proba", "predict_log_proba", "score"):
            assert name not in vars(cls), f"{cls.__name__} defines its own {name}"


@pytest.mark.parametrize("name", ["LinearProbe", "LinearProbeCV", "MLPProbe"])
def test_each_probe_checks_its_parameters_with_one_table(name):
    import imagenet_cog
    import imagenet_cog.analysis

    cls = getattr(imagenet_cog, name, None) or getattr(imagenet_cog.analysis, name)
    table = cls._parameter_checks
    assert set(table) <= set(cls().get_params()), "a checked name that is not a parameter"
    assert "compile" not in cls().get_params() or table["compile"] is COMPILE  # one validator
    bad = type("BadType", (), {})()
    for param, check in table.items():
        message = f"^{param} must be {re.escape(check.wording)}, got <"
        with pytest.raises((TypeError, ValueError), match=message):
            cls(device="cpu", **{param: bad}).fit([[0.0], [1.0]], [0, 1])
