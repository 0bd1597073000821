"""KNNProbe and the blocked cosine neighbour search behind it (DINO's weighted k-NN)."""

import pickle
import warnings

import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier
from sklearn.utils.estimator_checks import parametrize_with_checks

from imagenet_cog import KNNProbe, make_search_spec
from imagenet_cog._grid import SEEDS, SHOTS
from imagenet_cog._neighbors import search as knn_search
from imagenet_cog._neighbors.search import NeighborPlan, cosine_topk, plan_neighbors
from imagenet_cog._neighbors.votes import DINO_KS, DINO_TEMPERATURE, class_votes

CPU = torch.device("cpu")
# Small products: one thread avoids the synchronisation of two on a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@parametrize_with_checks([KNNProbe(n_neighbors=5, device="cpu")])
def test_sklearn_compatible(estimator, check):
    check(estimator)


# ------------------------------------------------------------------------------ references
def unit(a):
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(norms > 0, norms, 1)


def brute_force(X_train, y_codes, X_test, ks, temperature, n_classes):
    """DINO's weighted k-NN written plainly in NumPy float64: the whole similarity matrix,
    neighbours by (similarity descending, row ascending), votes exp(s / T) at each k.

    Returns ``(neighbours at the largest k, their similarities, {k: class probabilities})``.
    """
    S = unit(X_test.astype(np.float64)) @ unit(X_train.astype(np.float64)).T
    # A stable sort of the columns (rows in training order) puts equal similarities in row order.
    order = np.argsort(-S, axis=1, kind="stable")[:, : max(ks)]
    sims = np.take_along_axis(S, order, axis=1)
    probas = {}
    for k in ks:
        votes = np.zeros((len(X_test), n_classes))
        at = (np.arange(len(X_test))[:, None], y_codes[order[:, :k]])
        np.add.at(votes, at, np.exp(sims[:, :k] / temperature))
        probas[k] = votes / votes.sum(1, keepdims=True)
    return order, sims, probas


def sklearn_knn(k, temperature=DINO_TEMPERATURE):
    return KNeighborsClassifier(
        n_neighbors=k,
        metric="cosine",
        algorithm="brute",
        weights=lambda d: np.exp((1.0 - d) / temperature),
    )


def grid_data(n_classes=200, per_class=161, n_test=1, d=16, seed=0):
    """Features of a domain shaped for the default protocol: 128 shots can be drawn from the
    80% of each class the search trains on, and k = 200 fits in the 1-shot training set (200
    classes)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_classes, d))
    y = np.repeat(np.arange(n_classes), per_class)
    X = 3 * centers[y] + rng.normal(size=(len(y), d)) * 2.0
    y_test = np.repeat(np.arange(n_classes), n_test)
    X_test = 3 * centers[y_test] + rng.normal(size=(len(y_test), d)) * 2.0
    return X, y, X_test, y_test


# scikit-learn's reference warns on the 1-shot cells (as many classes as samples).
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The number of unique classes is greater than 50%")
def test_equal_to_numpy_and_sklearn_on_the_default_protocol_shape():
    # Every shots value and "all", the five seeds, each cell's training set drawn as the
    # linear protocol draws its final training set (make_search_spec's final_idx); DINO's
    # four k from one search per cell.
    X, y, X_test, y_test = grid_data()
    n_classes, ks = 200, DINO_KS
    checked, all_data = set(), None
    for shots in SHOTS:
        for seed in SEEDS:
            spec = make_search_spec(y, seed, n_shots=None if shots == "all" else shots)
            idx = spec.final_idx
            if shots == "all" and all_data is not None:  # every seed's all-data cell is one
                np.testing.assert_array_equal(idx, all_data)
                checked |= {(shots, seed, k) for k in ks}
                continue
            if shots == "all":
                all_data = idx
            Xc, yc = X[idx], y[idx]
            knn = KNNProbe(n_neighbors=max(ks), dtype="float64", device="cpu").fit(Xc, yc)
            distances, neighbours = knn.kneighbors(X_test)
            ranked = knn.top_classes(X_test, n_neighbors=ks, top=5)
            # The grid's path: the draw searched in place (key_rows), without a copy.
            values, rows = cosine_topk(
                X_test, X, max(ks), device=CPU, dtype=torch.float64, key_rows=idx
            )
            np.testing.assert_array_equal(rows, neighbours)
            np.testing.assert_allclose(1 - values, distances, atol=1e-12)
            order, sims, probas = brute_force(Xc, yc, X_test, ks, DINO_TEMPERATURE, n_classes)
            np.testing.assert_array_equal(neighbours, order)
            np.testing.assert_allclose(values, sims, atol=1e-12)
            reference = sklearn_knn(max(ks)).fit(Xc, yc)
            d_sk, i_sk = reference.kneighbors(X_test)
            np.testing.assert_array_equal(neighbours, i_sk)
            np.testing.assert_allclose(distances, d_sk, atol=1e-12)
            for k in ks:
                proba = class_votes(values, rows, yc, n_classes, k, DINO_TEMPERATURE)
                np.testing.assert_allclose(proba, probas[k], rtol=1e-9, atol=1e-12)
                proba_sk = reference.set_params(n_neighbors=k).predict_proba(X_test)
                np.testing.assert_allclose(proba, proba_sk, rtol=1e-9, atol=1e-12)
                np.testing.assert_array_equal(ranked[k][:, 0], proba_sk.argmax(1))
                top5 = np.argsort(-probas[k], axis=1, kind="stable")[:, :5]
                np.testing.assert_array_equal(ranked[k], top5)
                checked.add((shots, seed, k))
            # Each cell is a real classification, far above chance (1 in 200).
            assert (ranked[20][:, 0] == y_test).mean() > 0.3
    assert len(checked) == len(SHOTS) * len(SEEDS) * len(ks)
    # The estimator's own predict_proba and predict, at each k, on one cell.
    for k in ks:
        alone = KNNProbe(n_neighbors=k, dtype="float64", device="cpu").fit(X, y)
        proba_sk = sklearn_knn(k).fit(X, y).predict_proba(X_test)
        np.testing.assert_allclose(alone.predict_proba(X_test), proba_sk, rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(alone.predict(X_test), proba_sk.argmax(1))


def test_float32_search_agrees_with_the_float64_reference():
    X, y, X_test, _ = grid_data(n_classes=200, per_class=20, n_test=2)
    X, X_test = X.astype(np.float32), X_test.astype(np.float32)
    ours = KNNProbe(n_neighbors=20, device="cpu").fit(X, y)
    _, sims, probas = brute_force(X, y, X_test, [20], DINO_TEMPERATURE, 200)
    d, _ = ours.kneighbors(X_test)
    np.testing.assert_allclose(1 - d, sims, atol=1e-5)
    np.testing.assert_allclose(ours.predict_proba(X_test), probas[20], atol=1e-3)
    assert (ours.predict(X_test) == probas[20].argmax(1)).mean() > 0.99


# --------------------------------------------------------------------------- blocks, ties
def tiny_plan(n_q, n_k, d, k, qb, kb, group=None):
    return NeighborPlan(n_q, n_k, d, k, group or n_q, qb, kb, 8, "cpu")


@pytest.mark.parametrize(("qb", "kb", "group"), [(1, 201, None), (7, 256, 13), (64, 1000, 32)])
def test_blocks_do_not_change_the_neighbours(qb, kb, group):
    X, _y, X_test, _ = grid_data(n_classes=50, per_class=40, n_test=2)
    whole = cosine_topk(X_test, X, 200, device=CPU, dtype=torch.float64)
    plan = tiny_plan(len(X_test), len(X), X.shape[1], 200, qb, kb, group)
    blocked = cosine_topk(X_test, X, 200, device=CPU, dtype=torch.float64, plan=plan)
    np.testing.assert_array_equal(blocked[1], whole[1])
    np.testing.assert_allclose(blocked[0], whole[0], atol=1e-12)


def test_equal_similarities_go_to_the_lower_training_row_in_every_block():
    # 40 copies of one row (after 5 of its opposite): whichever block and topk boundary they
    # meet, the neighbours are the first copies, in row order. The row is a unit vector, so
    # that its products are exact in any order of summation: the ties are exact ties.
    rng = np.random.default_rng(0)
    row = np.eye(8)[2]
    keys = np.vstack([np.tile(-row, (5, 1)), np.tile(row, (40, 1)), rng.normal(size=(20, 8))])
    keys[20:22] = 4 * row  # same direction, another norm: tied after normalisation
    queries = np.vstack([row, 2 * row])
    expected = np.arange(5, 15)
    for kb in (3, 8, 11, 65):
        plan = tiny_plan(2, len(keys), 8, 10, 1, kb)
        values, rows = cosine_topk(queries, keys, 10, device=CPU, plan=plan)
        np.testing.assert_array_equal(rows, np.vstack([expected, expected]))
        np.testing.assert_allclose(values, 1.0, atol=1e-6)


def test_a_class_tie_goes_to_the_first_class():
    # Two neighbours at the same similarity, one of each class: the votes tie.
    X = np.array([[1.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    knn = KNNProbe(n_neighbors=2, device="cpu").fit(X, ["b", "a", "c"])
    proba = knn.predict_proba([[1.0, 1.0]])
    assert proba[0, 0] == proba[0, 1] == 0.5
    assert knn.predict([[1.0, 1.0]]).tolist() == ["a"]
    ranked = knn.top_classes([[1.0, 1.0]], n_neighbors=2, top=3)[2]
    assert ranked.tolist() == [["a", "b", "c"]]
    # scikit-learn decides the same way.
    assert sklearn_knn(2).fit(X, ["b", "a", "c"]).predict([[1.0, 1.0]]).tolist() == ["a"]


def test_zero_rows_have_similarity_zero_as_in_sklearn():
    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    knn = KNNProbe(n_neighbors=3, device="cpu").fit(X, [0, 1, 2])
    d, i = knn.kneighbors([[0.0, 0.0], [1.0, 0.2]])
    d_sk, _i_sk = sklearn_knn(3).fit(X, [0, 1, 2]).kneighbors([[0.0, 0.0], [1.0, 0.2]])
    np.testing.assert_allclose(d, d_sk, atol=1e-7)
    assert i[0].tolist() == [0, 1, 2]  # all at distance 1: row order


def test_several_k_from_one_search_equal_separate_estimators():
    X, y, X_test, _ = grid_data(n_classes=30, per_class=20, n_test=3)
    calls = []
    original = knn_search._search

    def counting(*args):
        calls.append(args[2])
        return original(*args)

    knn = KNNProbe(device="cpu").fit(X, y)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(knn_search, "_search", counting)
        ranked = knn.top_classes(X_test, n_neighbors=(100, 10, 20), top=5)
    assert calls == [100]  # one search, at the largest k
    for k in (10, 20, 100):
        alone = KNNProbe(n_neighbors=k, device="cpu").fit(X, y)
        np.testing.assert_array_equal(ranked[k][:, 0], alone.predict(X_test))


def test_tensors_and_a_few_shot_draw_search_as_arrays_do():
    # Features already in torch (on the GPU in evaluate's grid), a draw searched in place.
    X, y, X_test, _ = grid_data(n_classes=20, per_class=30, n_test=5)
    rows = make_search_spec(y, 22, n_shots=4).final_idx
    expected = cosine_topk(X_test, X[rows], 30, device=CPU, dtype=torch.float64)
    got = cosine_topk(
        torch.as_tensor(X_test),
        torch.as_tensor(X),
        30,
        device=CPU,
        dtype=torch.float64,
        key_rows=rows,
    )
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_allclose(got[0], expected[0], atol=1e-12)


# --------------------------------------------------------------------------------- the plan
def test_the_plan_bounds_memory_and_never_holds_test_by_train():
    n_q, n_k, d = 50_000, 1_281_167, 2048
    for budget in (40 * 2**30, 2**30, 2**27):
        plan = plan_neighbors(n_q, n_k, d, 200, device=CPU, memory_budget=budget)
        assert plan.peak_bytes <= budget
        assert plan.query_block * plan.key_block < n_q * n_k / 100
    small = plan_neighbors(n_q, n_k, d, 200, device=CPU, memory_budget=2**27)
    assert small.n_groups > 1  # 50,000 rows of queries do not fit 128 MB: groups
    free = plan_neighbors(n_q, n_k, d, 200, device=CPU)
    assert 2 * free.query_block * free.key_block * 4 <= 2**29
    assert free.flop == 2 * n_q * n_k * d
    with pytest.raises(ValueError, match="raise memory_budget"):
        plan_neighbors(10, 1000, 2048, 200, device=CPU, memory_budget=10_000)


def test_a_tiny_budget_streams_with_the_same_neighbours():
    X, y, X_test, _ = grid_data(n_classes=20, per_class=30, n_test=5)
    a = KNNProbe(n_neighbors=20, dtype="float64", device="cpu").fit(X, y)
    b = KNNProbe(n_neighbors=20, dtype="float64", device="cpu", memory_budget=200_000)
    np.testing.assert_array_equal(a.kneighbors(X_test)[1], b.fit(X, y).kneighbors(X_test)[1])
    plan = plan_neighbors(len(X_test), len(X), X.shape[1], 20, device=CPU, memory_budget=200_000)
    assert plan.n_groups > 1 and plan.key_block < len(X)


# -------------------------------------------------------------------------- the self-check
def test_a_search_that_fails_its_check_warns_and_runs_again_on_the_cpu(monkeypatch):
    X, _y, X_test, _ = grid_data(n_classes=20, per_class=30, n_test=5)
    original = knn_search._search

    def wrong_on_the_accelerator(queries, keys, k, plan, device, *rest):
        values, rows = original(queries, keys, k, plan, CPU, *rest)
        if device.type != "cpu":  # a faulty device: the neighbours of every row shifted
            rows = (rows + 1) % len(keys)
        return values, rows

    monkeypatch.setattr(knn_search, "_search", wrong_on_the_accelerator)
    expected = cosine_topk(X_test, X, 10, device=CPU)
    with pytest.warns(RuntimeWarning, match="failed its check against float64 on the host"):
        got = cosine_topk(X_test, X, 10, device=torch.device("meta"))
    np.testing.assert_array_equal(got[1], expected[1])


def test_a_search_wrong_on_the_cpu_raises(monkeypatch):
    X, _y, X_test, _ = grid_data(n_classes=20, per_class=30, n_test=5)
    original = knn_search._search

    def swapped(*args):
        values, rows = original(*args)
        return values, rows[:, ::-1].copy()

    monkeypatch.setattr(knn_search, "_search", swapped)
    with pytest.raises(RuntimeError, match="failed its own check"):
        cosine_topk(X_test, X, 10, device=CPU)


# ---------------------------------------------------------------------------------- errors
def test_bad_settings_get_one_line_naming_the_option():
    X, y = np.eye(4), [0, 1, 0, 1]
    with pytest.raises(ValueError, match="n_neighbors=20 is more than the 4 training rows"):
        KNNProbe(device="cpu").fit(X, y).predict(X)
    with pytest.raises(ValueError, match="temperature must be a finite float > 0"):
        KNNProbe(temperature=0, device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        KNNProbe(mixed_precision="bf16", device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="n_neighbors must be an int >= 1"):
        KNNProbe(device="cpu").fit(X, y).top_classes(X, n_neighbors=(2, 0))


def test_fitted_state_is_numpy_and_pickles():
    X, y, X_test, _ = grid_data(n_classes=10, per_class=30, n_test=2)
    knn = KNNProbe(n_neighbors=10, device="cpu").fit(X, y)
    blob = pickle.dumps(knn)
    assert b"torch" not in blob
    np.testing.assert_array_equal(pickle.loads(blob).predict(X_test), knn.predict(X_test))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert knn.score(X_test, np.repeat(np.arange(10), 2)) > 0.5


# ------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_search_equals_the_cpu_search():
    X, y, X_test, _ = grid_data(n_classes=200, per_class=50, n_test=5)
    cpu = KNNProbe(n_neighbors=200, device="cpu", dtype="float64").fit(X, y)
    gpu = KNNProbe(n_neighbors=200, device="cuda", dtype="float64").fit(X, y)
    np.testing.assert_array_equal(gpu.kneighbors(X_test)[1], cpu.kneighbors(X_test)[1])
    f32 = KNNProbe(n_neighbors=200, device="cuda", memory_budget=2**22).fit(X, y)
    assert (f32.predict(X_test) == cpu.predict(X_test)).mean() > 0.99
    # Features already on the GPU, a few-shot draw searched in place.
    cuda = torch.device("cuda", torch.cuda.current_device())
    rows = make_search_spec(y, 22, n_shots=4).final_idx
    on_gpu = [torch.as_tensor(a, device=cuda) for a in (X_test, X)]
    got = cosine_topk(*on_gpu, 200, device=cuda, dtype=torch.float64, key_rows=rows)
    expected = cosine_topk(X_test, X[rows], 200, device=CPU, dtype=torch.float64)
    np.testing.assert_array_equal(got[1], expected[1])


# ------------------------------------------------------------------------------- benchmark
def test_the_benchmark_runs_and_the_gpu_acceptance_reads_it(tmp_path, monkeypatch):
    import importlib
    import json
    import subprocess
    import sys
    from pathlib import Path

    from helpers import subprocess_env

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    out = tmp_path / "knn.json"
    done = subprocess.run(
        [sys.executable, str(bench / "bench_knn.py"), "--quick", "--json", str(out)],
        cwd=bench,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    assert "ratio" in done.stdout and "top-1 agreement" in done.stdout
    report = json.loads(out.read_text())
    # The same votes as scikit-learn's, at every k; real accuracy, far above chance (1/20).
    assert report["k_all"]["top1_agreement"] == {str(k): 1.0 for k in DINO_KS}
    assert report["k20"]["top1_ours"] > 0.3 and report["k20"]["ratio"] > 0
    monkeypatch.syspath_prepend(str(bench))
    acceptance = importlib.import_module("gpu_acceptance")
    assert "knn" in acceptance.NAMES
    products = [{"precision": "fp32", "trials": 30, "tflops": 48.0, "ms_per_trial_step": 0.17}]
    (tmp_path / "gemm.json").write_text(json.dumps({"device": "x", "products": products}))
    rows = [f for f in acceptance.summarize(tmp_path, {}) if f.phase == "knn"]
    assert len(rows) == 3 and rows[0].ratio.endswith("x faster")
    assert rows[2].ratio.endswith("of the floor")
