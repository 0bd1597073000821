"""PCA and MLP probes (supplements C.2 and C.3 of the CoG paper's first version)."""

import itertools
import math
import pickle

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs, make_circles
from sklearn.decomposition import PCA
from sklearn.preprocessing import normalize
from sklearn.utils.estimator_checks import parametrize_with_checks

import imagenet_cog._analysis.probes as extra_probes
from imagenet_cog import LinearProbe, make_search_spec, run_searches
from imagenet_cog.analysis import MLPProbe, ProbeScores, mlp_probe, pca_probe

FAST_SEARCH = {"n_trials": 3, "n_startup_trials": 2, "epochs": 8, "batch_size": 64, "device": "cpu"}


pytestmark = pytest.mark.usefixtures("one_thread")


def gaussian_classes(n_classes=6, n_train=40, n_test=30, dim=16, sep=2.0, seed=0):
    """l2-normalised Gaussian classes, as a feature store holds them."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim)) * sep / np.sqrt(2)
    y_tr, y_te = np.repeat(np.arange(n_classes), n_train), np.repeat(np.arange(n_classes), n_test)
    X_tr = normalize(means[y_tr] + rng.normal(size=(y_tr.size, dim))).astype(np.float32)
    X_te = normalize(means[y_te] + rng.normal(size=(y_te.size, dim))).astype(np.float32)
    return X_tr, y_tr, X_te, y_te


# --------------------------------------------------------------------------- MLPProbe
@parametrize_with_checks([MLPProbe(hidden_layer_sizes=(16,), epochs=20, device="cpu")])
def test_sklearn_compatible(estimator, check):
    # Every check passes; a small network and 20 epochs keep them fast (the defaults would
    # pass too, 2048-2048 units just take longer).
    check(estimator)


def reference_mlp(X, y, sizes, activation, lr, wd, seed, epochs, batch_size, momentum=0.9):
    """The protocol written plainly: nn.Sequential, torch.optim.SGD, cross_entropy."""
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        lin = torch.nn.Linear(a, b)
        bound = 1 / math.sqrt(a)
        with torch.no_grad():  # nn.Linear's init, from the seeded generator, weight then bias
            lin.weight.uniform_(-bound, bound, generator=gen)
            lin.bias.uniform_(-bound, bound, generator=gen)
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU() if activation == "relu" else torch.nn.Identity())
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    bs = min(batch_size, len(y))
    for epoch in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), bs):
            rows = perm[start : start + bs]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(X[rows]), y[rows]).backward()
            opt.step()
        for group in opt.param_groups:  # the official schedule: after epoch e, for the next
            group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))
    lins = [m for m in net if isinstance(m, torch.nn.Linear)]
    return [m.weight.detach().numpy().T for m in lins], [m.bias.detach().numpy() for m in lins]


@pytest.mark.parametrize("activation", ["relu", "identity"])
def test_mlp_training_matches_a_plain_torch_loop(activation):
    # Partial last batch (250 = 3 x 64 + 58), momentum, weight decay on every parameter, the
    # cosine schedule after each epoch, nn.Linear's initialisation.
    X, y = make_blobs(n_samples=250, centers=3, n_features=5, random_state=0)
    X = X.astype(np.float32)
    mlp = MLPProbe(
        hidden_layer_sizes=(16, 8),
        activation=activation,
        lr=0.05,
        weight_decay=1e-3,
        epochs=6,
        batch_size=64,
        device="cpu",
        random_state=7,
    )
    mlp.fit(X, y)
    W, b = reference_mlp(X, y, (5, 16, 8, 3), activation, 0.05, 1e-3, 7, epochs=6, batch_size=64)
    assert len(mlp.coefs_) == 3
    for got, want in zip(mlp.coefs_ + mlp.intercepts_, W + b):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert mlp.n_iter_ == 6 and mlp.loss_curve_.shape == (6,) and mlp.n_layers_ == 4


def test_mlp_without_hidden_layers_is_the_linear_probe():
    X, y = make_blobs(n_samples=200, centers=4, n_features=6, random_state=1)
    X = normalize(X)
    kw = {
        "lr": 2.0,
        "weight_decay": 1e-4,
        "epochs": 7,
        "batch_size": 32,
        "device": "cpu",
        "random_state": 3,
    }
    mlp = MLPProbe(hidden_layer_sizes=(), **kw).fit(X, y)
    lin = LinearProbe(**kw).fit(X, y)
    np.testing.assert_allclose(mlp.coefs_[0], lin.coef_.T, atol=1e-5)
    np.testing.assert_allclose(mlp.intercepts_[0], lin.intercept_, atol=1e-5)
    np.testing.assert_allclose(mlp.loss_curve_, lin.loss_curve_, atol=1e-5)


def test_mlp_noact_is_a_linear_model_overall():
    X, y = make_blobs(n_samples=150, centers=3, n_features=4, random_state=2)
    mlp = MLPProbe(
        hidden_layer_sizes=(8, 8),
        activation="identity",
        lr=0.02,
        epochs=10,
        device="cpu",
        random_state=0,
    ).fit(X, y)
    (W1, W2, W3), (b1, b2, b3) = mlp.coefs_, mlp.intercepts_
    W = W1 @ W2 @ W3
    b = (b1 @ W2 + b2) @ W3 + b3
    logits = X @ W + b
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(mlp.predict_proba(X), expected, atol=1e-10)
    # ...which ReLU is not: the same weights through ReLU give other logits.
    relu = MLPProbe(hidden_layer_sizes=(8, 8), lr=0.02, epochs=10, device="cpu", random_state=0)
    relu.fit(X, y)
    (V1, V2, V3), (c1, c2, c3) = relu.coefs_, relu.intercepts_
    linear = X @ V1 @ V2 @ V3 + (c1 @ V2 + c2) @ V3 + c3
    assert np.abs(relu._logits(X) - linear).max() > 1e-3


def test_mlp_beats_logreg_where_classes_are_not_linearly_separable():
    X, y = make_circles(n_samples=600, factor=0.5, noise=0.08, random_state=0)
    X_tr, y_tr, X_te, y_te = X[:400], y[:400], X[400:], y[400:]
    lin = LinearProbe(lr=1.0, epochs=50, batch_size=32, device="cpu", random_state=0)
    mlp = MLPProbe(
        hidden_layer_sizes=(64, 64), lr=0.1, epochs=50, batch_size=32, device="cpu", random_state=0
    )
    lin_acc = lin.fit(X_tr, y_tr).score(X_te, y_te)
    mlp_acc = mlp.fit(X_tr, y_tr).score(X_te, y_te)
    noact = MLPProbe(
        hidden_layer_sizes=(64, 64),
        activation="identity",
        lr=0.01,
        epochs=50,
        batch_size=32,
        device="cpu",
        random_state=0,
    ).fit(X_tr, y_tr)
    assert lin_acc < 0.7 and noact.score(X_te, y_te) < 0.7  # linear: about chance
    assert mlp_acc > 0.95


def test_mlp_refits_identically_and_pickles_without_torch():
    X, y = make_blobs(n_samples=120, centers=3, n_features=4, random_state=0)
    a = MLPProbe(hidden_layer_sizes=(8,), epochs=5, device="cpu", random_state=11).fit(X, y)
    b = MLPProbe(hidden_layer_sizes=(8,), epochs=5, device="cpu", random_state=11).fit(X, y)
    for u, v in zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_):
        assert np.array_equal(u, v)
    blob = pickle.dumps(a)
    assert b"torch" not in blob
    assert all(type(c) is np.ndarray for c in a.coefs_ + a.intercepts_)
    np.testing.assert_array_equal(pickle.loads(blob).predict(X), a.predict(X))


def test_mlp_streamed_features_give_the_same_model():
    X, y = make_blobs(n_samples=300, centers=3, n_features=8, random_state=0)
    kw = {
        "hidden_layer_sizes": (8,),
        "epochs": 3,
        "batch_size": 32,
        "device": "cpu",
        "random_state": 0,
        "dtype": "float64",
    }
    resident = MLPProbe(**kw).fit(X, y)
    # 100 rows of 8 float64 per chunk: three batches of 32 per gathered chunk.
    streamed = MLPProbe(memory_budget=100 * 8 * 8, **kw).fit(X, y)
    for u, v in zip(resident.coefs_, streamed.coefs_):
        np.testing.assert_allclose(u, v, atol=1e-12)


def test_mlp_divergence_and_bad_parameters_are_clear_errors():
    X, y = make_blobs(n_samples=60, centers=2, n_features=3, random_state=0)
    # Seeded: an unseeded start whose ReLUs all die never diverges (about 1 run in 100).
    probe = MLPProbe(hidden_layer_sizes=(8,), lr=1e8, epochs=5, device="cpu", random_state=0)
    with pytest.raises(ValueError, match="non-finite at epoch"):
        probe.fit(X * 1e3, y)
    with pytest.raises(ValueError, match="hidden_layer_sizes"):
        MLPProbe(hidden_layer_sizes=(8, 0), device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="activation"):
        MLPProbe(activation="tanh", device="cpu").fit(X, y)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mlp_on_cuda_matches_the_cpu_and_streams():
    X, y = make_blobs(n_samples=300, centers=3, n_features=8, random_state=0)
    kw = {
        "hidden_layer_sizes": (16,),
        "epochs": 4,
        "batch_size": 32,
        "random_state": 0,
        "dtype": "float64",
    }
    cpu = MLPProbe(device="cpu", **kw).fit(X, y)
    gpu = MLPProbe(device="cuda", **kw).fit(X, y)
    streamed = MLPProbe(device="cuda", memory_budget=100 * 8 * 8, **kw).fit(X, y)
    for a, b, c in zip(cpu.coefs_, gpu.coefs_, streamed.coefs_):
        np.testing.assert_allclose(a, b, atol=1e-8)
        np.testing.assert_allclose(b, c, atol=1e-10)
    assert all(type(c) is np.ndarray for c in gpu.coefs_)
    assert MLPProbe(device="cuda").__sklearn_tags__().non_deterministic


# --------------------------------------------------------------------------- mlp_probe
def test_mlp_probe_searches_the_papers_ranges_and_is_reproducible():
    X_tr, y_tr, X_te, y_te = gaussian_classes(n_classes=3, n_train=30, n_test=20, dim=6)
    kw = {
        "seeds": (22, 37),
        "n_trials": 3,
        "n_startup_trials": 2,
        "hidden_layer_sizes": (16,),
        "epochs": 6,
        "batch_size": 32,
        "device": "cpu",
    }
    relu = mlp_probe(X_tr, y_tr, X_te, y_te, "relu", **kw)
    noact = mlp_probe(X_tr, y_tr, X_te, y_te, "identity", **kw)
    assert relu.probe == "mlp" and noact.probe == "mlp_noact"
    assert [r["seed"] for r in relu.records] == [22, 37]
    for scores, (lo, hi) in ((relu, (0.1, 100)), (noact, (0.01, 10))):
        trials = [t for r in scores.records for t in r["trials"]]
        assert len(trials) == 6
        assert all(lo <= t["lr"] <= hi and 1e-8 <= t["wd"] <= 1e-4 for t in trials)
    again = mlp_probe(X_tr, y_tr, X_te, y_te, "relu", **kw)
    assert again.records == relu.records
    assert relu.summary()["relu"]["n_seeds"] == 2
    assert 0 <= relu.mean() <= 100 and relu.mean(metric="top5") == 100.0  # 3 classes
    d = relu.to_dict()
    assert set(d["summary"]) == {"relu"} and d["probe"] == "mlp"


def test_mlp_probe_rejects_bad_input():
    X_tr, y_tr, X_te, y_te = gaussian_classes(n_classes=3, n_train=10, n_test=5, dim=4)
    with pytest.raises(ValueError, match="activation"):
        mlp_probe(X_tr, y_tr, X_te, y_te, activation="tanh")
    with pytest.raises(ValueError, match="absent from y_train"):
        mlp_probe(X_tr, y_tr, X_te, y_te + 7, device="cpu")
    with pytest.raises(ValueError, match="lr_range"):
        mlp_probe(X_tr, y_tr, X_te, y_te, lr_range=(1.0, 0.1), device="cpu")


# --------------------------------------------------------------------------- pca_probe
def test_pca_probe_with_every_component_matches_the_plain_probe():
    X_tr, y_tr, X_te, y_te = gaussian_classes(n_classes=12, dim=16, sep=1.0, seed=3)
    seeds = (22, 37)
    pca = pca_probe(X_tr, y_tr, X_te, y_te, n_components=(4, 16), seeds=seeds, **FAST_SEARCH)
    specs = [make_search_spec(y_tr, s) for s in seeds]
    plain = run_searches(
        X_tr, y_tr, specs, X_test=X_te, y_test=y_te, trials_per_batch=1, **FAST_SEARCH
    )
    plain_top1 = 100 * np.mean([r.test_top1 for r in plain])
    # All 16 components: a rotation of the centred features, so the same accuracy up to the
    # SGD noise of a different input basis.
    assert abs(pca.mean(16) - plain_top1) <= 3.0, (pca.mean(16), plain_top1)
    assert pca.mean(4) < pca.mean(16) - 5  # 4 of 16 components lose information
    summary = pca.summary()
    assert summary[16]["explained_variance"] == pytest.approx(1.0)
    assert 0 < summary[4]["explained_variance"] < 1
    assert "variance kept" in pca.table()


def test_pca_probe_feeds_the_probe_l2_normalised_projections(monkeypatch):
    X_tr, y_tr, X_te, y_te = gaussian_classes(n_classes=3, n_train=20, n_test=10, dim=8)
    seen = []

    def fake_run_searches(X, y, specs, *, X_test, y_test, **kw):
        seen.append((X, X_test, kw))
        return real(X, y, specs, X_test=X_test, y_test=y_test, **kw)

    real = extra_probes.run_searches
    monkeypatch.setattr(extra_probes, "run_searches", fake_run_searches)
    scores = pca_probe(X_tr, y_tr, X_te, y_te, n_components=(2, 5), seeds=(22,), **FAST_SEARCH)
    assert scores.settings == [2, 5]
    ref = PCA(n_components=5, svd_solver="full").fit(X_tr.astype(np.float64))
    for (Z, Z_te, kw), k in zip(seen, (2, 5)):
        assert Z.shape == (60, k) and Z_te.shape == (30, k)
        np.testing.assert_allclose(np.linalg.norm(Z, axis=1), 1, atol=1e-5)
        want = normalize(ref.transform(X_tr)[:, :k])
        # Principal axes are defined up to sign.
        signs = np.sign((Z * want).sum(0))
        np.testing.assert_allclose(Z * signs, want, atol=1e-4)
        assert kw["trials_per_batch"] == 1  # the official sequential TPE by default
    seen.clear()
    pca_probe(X_tr, y_tr, X_te, y_te, n_components=3, seeds=(22,), normalize=False, **FAST_SEARCH)
    assert not np.allclose(np.linalg.norm(seen[0][0], axis=1), 1)


def test_pca_probe_rejects_too_many_components():
    X_tr, y_tr, X_te, y_te = gaussian_classes(n_classes=3, n_train=10, n_test=5, dim=8)
    with pytest.raises(
        ValueError, match=r"n_components=16 exceeds min\(n_samples, n_features\) = 8"
    ):
        pca_probe(X_tr, y_tr, X_te, y_te, n_components=(4, 16), seeds=(22,))
    with pytest.raises(ValueError, match="positive ints"):
        pca_probe(X_tr, y_tr, X_te, y_te, n_components=(0,), seeds=(22,))
    with pytest.raises(ValueError, match="features but X_test"):
        pca_probe(X_tr, y_tr, X_te[:, :4], y_te, n_components=(2,), seeds=(22,))


def test_probe_scores_mean_needs_a_setting_when_there_are_several():
    s = ProbeScores(
        "pca", [{"setting": 8, "seed": 1, "top1": 50.0}, {"setting": 16, "seed": 1, "top1": 60.0}]
    )
    with pytest.raises(ValueError, match="several settings"):
        s.mean()
    with pytest.raises(KeyError, match="setting 4"):
        s.mean(4)
