import json
import math
import sys
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
import torch
from helpers import needs, tiny_taxonomy
from sklearn import metrics
from sklearn.datasets import make_blobs

from imagenet_cog import load_taxonomy, similarity
from imagenet_cog._optional_dependencies import INSTALLED
from imagenet_cog.analysis import (
    AlignmentUniformity,
    alignment_uniformity,
    alignment_uniformity_per_domain,
    cluster_scores,
    kmeans,
    plot_analysis,
    purity_score,
    relative_to,
    semantic_errors,
)
from imagenet_cog.measures import _path_distance
from imagenet_cog.taxonomy import Taxonomy

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# ------------------------------------------------------------------ purity
def test_purity_by_hand():
    y = np.array(["a", "a", "a", "b", "b", "c", "c", "c"])
    c = np.array([0, 0, 1, 1, 1, 2, 2, 0])
    # Contingency (class × cluster): a: [2, 1, 0], b: [0, 2, 0], c: [1, 0, 2].
    # Per cluster, the majority class: 2 (a) + 2 (b) + 2 (c) = 6 of 8.
    assert purity_score(y, c) == pytest.approx(6 / 8)
    # Per concept, its share in its best cluster: a 2/3, b 2/2, c 2/3 -> 7/9.
    assert purity_score(y, c, per="concept") == pytest.approx((2 / 3 + 1 + 2 / 3) / 3)
    # One cluster for everything: purity is the largest class share, 3/8.
    assert purity_score(y, np.zeros(8)) == pytest.approx(3 / 8)
    assert purity_score(y, np.arange(8)) == 1.0


def test_purity_rejects_bad_input():
    with pytest.raises(ValueError, match="same length"):
        purity_score([0, 1], [0])
    with pytest.raises(ValueError, match="per must be"):
        purity_score([0, 1], [0, 1], per="sample")


# ------------------------------------------------------------------ k-means
def test_kmeans_by_hand_both_backends():
    X = np.array([[0.0, 0], [0, 2], [10, 0], [10, 2], [10, 4]])
    for backend in ("torch", "sklearn"):
        km = kmeans(X, 2, backend=backend, device="cpu")
        # Centroids (0, 1) and (10, 2); inertia 1 + 1 + 4 + 0 + 4 = 10.
        got = sorted(map(tuple, np.round(km.centroids, 9).tolist()))
        assert got == [(0.0, 1.0), (10.0, 2.0)]
        assert km.inertia == pytest.approx(10.0)
        assert km.labels[0] == km.labels[1] != km.labels[2] == km.labels[3] == km.labels[4]
        assert km.backend == backend


def test_torch_kmeans_matches_sklearn_inertia():
    X, _ = make_blobs(n_samples=2000, centers=20, n_features=8, cluster_std=1.0, random_state=0)
    ours = kmeans(X, 20, n_init=3, random_state=0, device="cpu", backend="torch")
    ref = kmeans(X, 20, n_init=3, random_state=0, backend="sklearn")
    assert ours.inertia == pytest.approx(ref.inertia, rel=0.01)
    # The inertia is that of the returned labels and centroids.
    direct = ((X - ours.centroids[ours.labels]) ** 2).sum()
    assert ours.inertia == pytest.approx(direct, rel=1e-9)
    # float32, small blocks and a k-means++ subset give the same clustering here.
    small = kmeans(X.astype(np.float32), 20, device="cpu", chunk_size=333, init_size=500)
    assert small.inertia == pytest.approx(ref.inertia, rel=0.01)
    assert small.centroids.dtype == np.float32


needs_faiss = pytest.mark.skipif(not INSTALLED["faiss"], reason="faiss is not installed")
#: The k-means of the analyses on the CPU: faiss's Lloyd iterations when installed.
CPU_BACKEND = "faiss" if INSTALLED["faiss"] else "sklearn"


@needs_faiss
def test_faiss_kmeans_is_sklearns_kmeans():
    # scikit-learn's seeds, tolerance and stopping rule, faiss's nearest centroids: the same
    # clustering as KMeans, its inertia up to float32 rounding, labelled as faiss's.
    X, _ = make_blobs(n_samples=3000, centers=20, n_features=16, cluster_std=3.0, random_state=4)
    X = X.astype(np.float32)
    ref = kmeans(X, 20, n_init=3, random_state=0, backend="sklearn")
    got = kmeans(X, 20, n_init=3, random_state=0, backend="faiss")
    assert got.backend == "faiss" and got.device == "cpu"
    assert got.inertia == pytest.approx(ref.inertia, rel=1e-5)
    assert metrics.adjusted_rand_score(ref.labels, got.labels) == 1.0
    np.testing.assert_allclose(
        np.sort(got.centroids, axis=0), np.sort(ref.centroids, axis=0), atol=1e-4
    )
    direct = ((X - got.centroids[got.labels]).astype(np.float64) ** 2).sum()
    assert got.inertia == pytest.approx(direct, rel=1e-5)
    # The CPU's default is faiss when it is installed.
    s = cluster_scores(X[:2400], X[2400:], np.zeros(600), k=20, device="cpu")
    assert s.backend == "faiss"


def test_runs_seeded_together_draw_the_seeds_of_sklearns_runs():
    # KMeans seeds its runs one after another from one RandomState; seeded together, each run
    # draws the same numbers and picks the same centres (well-separated points: no rounding).
    from sklearn.cluster import kmeans_plusplus
    from sklearn.utils import check_random_state

    from imagenet_cog._analysis.kmeans import _kmeans_plusplus_together, _run_states, _sq_norms

    X, _ = make_blobs(n_samples=600, centers=30, n_features=5, random_state=5)
    state = check_random_state(7)
    want = [kmeans_plusplus(X, 30, random_state=state)[1] for _ in range(3)]
    Xt = torch.as_tensor(X)
    states = _run_states(7, 3, len(X), 30, 2 + int(np.log(30)))
    got = _kmeans_plusplus_together(Xt, _sq_norms(Xt, 256), 30, states, 256)
    np.testing.assert_array_equal(got, np.stack(want))


@needs_faiss
def test_faiss_kmeans_relocates_empty_clusters_and_takes_tensors():
    X = np.array([[0.0], [0.0], [0.0], [0.0], [5.0], [9.0]])
    km = kmeans(torch.as_tensor(X), 3, backend="faiss", n_init=1)
    assert km.inertia == pytest.approx(0.0)
    assert len(set(km.labels.tolist())) == 3


def test_kmeans_relocates_empty_clusters():
    # Three distinct points, k = 3, but four copies of one point: k-means++ and
    # the relocation of empty clusters must still end with zero inertia.
    X = np.array([[0.0], [0.0], [0.0], [0.0], [5.0], [9.0]])
    km = kmeans(X, 3, device="cpu", n_init=1)
    assert km.inertia == pytest.approx(0.0)
    assert len(set(km.labels.tolist())) == 3


def test_kmeans_errors():
    X = np.zeros((5, 2))
    with pytest.raises(ValueError, match="only 5 samples"):
        kmeans(X, 6, device="cpu")
    with pytest.raises(ValueError, match="positive integer"):
        kmeans(X, 0, device="cpu")
    with pytest.raises(ValueError, match="unknown backend 'nope'; use 'torch', 'sklearn' or"):
        kmeans(X, 2, backend="nope")
    with pytest.raises(ValueError, match="the faiss backend runs on the CPU only"):
        kmeans(X, 2, backend="faiss", device="cuda")
    bad = np.ones((4, 3))
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite values in 1 of 4 rows"):
        kmeans(bad, 2, device="cpu")
    with pytest.raises(ValueError, match="2-D"):
        kmeans(np.zeros(4), 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_request_without_cuda_is_clear():
    with pytest.raises(ValueError, match="no CUDA device"):
        kmeans(np.zeros((4, 2)), 2, device="cuda")


@pytest.mark.gpu
@needs_cuda
def test_kmeans_on_gpu_matches_cpu():
    X, y = make_blobs(n_samples=4000, centers=20, n_features=16, cluster_std=1.5, random_state=1)
    gpu = kmeans(X.astype(np.float32), 20, device="cuda", chunk_size=1000)
    cpu = kmeans(X, 20, backend="sklearn")
    assert gpu.inertia == pytest.approx(cpu.inertia, rel=0.01)
    assert gpu.device.startswith("cuda")
    s = cluster_scores(X[:3000], X[3000:], y[3000:], device="cuda")
    assert s.backend == "torch" and s.nmi > 0.9


# ---------------------------------------------------------- cluster scores
def test_cluster_scores_by_hand():
    X_train = np.array([[0.0, 0], [0, 2], [10, 0], [10, 2]])
    X_test = np.array([[0.0, 1], [1, 1], [9, 1], [6, 1], [4, 1]])
    y_test = ["cat", "cat", "dog", "dog", "dog"]
    s = cluster_scores(X_train, X_test, y_test, device="cpu")
    # k = 2 distinct labels. Centroids (0, 1) and (10, 1); the test points go
    # to A, A, B, B, A (x = 4 is nearer 0 than 10). Inertia: 4 × 1² = 4.
    a = s.test_clusters[0]
    assert (s.test_clusters == a).tolist() == [True, True, False, False, True]
    assert s.inertia == pytest.approx(4.0)
    # Per concept (the paper's Eq. 3): cat 2/2 in A, dog 2/3 in B -> (1 + 2/3) / 2.
    assert s.purity == pytest.approx(5 / 6)
    # Per cluster: A holds cat, cat, dog (majority 2), B holds dog, dog (2): 4/5.
    assert s.purity_per_cluster == pytest.approx(4 / 5)
    assert (s.k, s.n_test, s.backend, s.device) == (2, 5, CPU_BACKEND, "cpu")


@pytest.mark.parametrize("backend", ["sklearn", "torch"])
def test_cluster_scores_equal_sklearn_metrics(backend):
    X, y = make_blobs(n_samples=1200, centers=12, n_features=6, cluster_std=2.5, random_state=2)
    s = cluster_scores(X[:900], X[900:], y[900:], device="cpu", backend=backend)
    c, yt = s.test_clusters, y[900:]
    assert s.nmi == metrics.normalized_mutual_info_score(yt, c)
    assert s.ami == metrics.adjusted_mutual_info_score(yt, c)
    assert s.ari == metrics.adjusted_rand_score(yt, c)
    assert s.purity == purity_score(yt, c, per="concept")
    assert s.purity_per_cluster == purity_score(yt, c)
    # Test samples go to their nearest centroid.
    d = ((X[900:, None, :] - s.centroids[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(c, d.argmin(1))
    assert s.k == 12 and s.backend == backend
    assert json.dumps(s.to_dict())


def test_cluster_scores_accepts_tensors_and_k():
    X, y = make_blobs(n_samples=300, centers=3, n_features=4, random_state=3)
    Xt = torch.as_tensor(X, dtype=torch.float32)
    s = cluster_scores(Xt[:200], Xt[200:], torch.as_tensor(y[200:]), k=5, device="cpu")
    assert s.k == 5 and len(s.centroids) == 5


def test_cluster_scores_errors():
    X = np.zeros((6, 3))
    with pytest.raises(ValueError, match="y_test has 2 labels but X_test has 6 rows"):
        cluster_scores(X, X, [0, 1], device="cpu")
    with pytest.raises(ValueError, match="X_train has 3 features but X_test has 2"):
        cluster_scores(X, np.zeros((6, 2)), np.zeros(6), device="cpu")
    with pytest.raises(ValueError, match="only 6 samples"):
        cluster_scores(X, X[:2], [0, 1], k=7, device="cpu")
    bad = X.copy()
    bad[4, 0] = np.inf
    with pytest.raises(ValueError, match="X_test contains NaN or infinite values"):
        cluster_scores(X, bad, np.arange(6), device="cpu")


# ------------------------------------------------ alignment and uniformity
def test_alignment_uniformity_by_hand():
    X = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]])
    au = alignment_uniformity(X, [0, 0, 1, 1], device="cpu")
    # Same-concept pairs: (1,0)-(0,1) and (-1,0)-(0,-1), both at distance² 2.
    assert au.alignment == pytest.approx(2.0)
    # Six distinct pairs: four neighbours at distance² 2, two opposite at 4.
    expected = math.log((4 * math.exp(-2 * 2) + 2 * math.exp(-2 * 4)) / 6)
    assert au.uniformity == pytest.approx(expected, rel=1e-12)
    assert (au.n_samples, au.n_positive_pairs, au.t) == (4, 2, 2.0)
    # Pairing opposite points instead: both pairs at distance² 4.
    assert alignment_uniformity(X, [0, 1, 0, 1], device="cpu").alignment == pytest.approx(4.0)
    # Three in one concept: pairs at 2, 4, 2 -> mean 8/3 (the singleton adds none).
    assert alignment_uniformity(X, [0, 0, 0, 1], device="cpu").alignment == pytest.approx(8 / 3)


def test_uniformity_excludes_the_diagonal_like_the_reference():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(203, 7))
    y = rng.integers(0, 9, size=203)
    # chunk_size 50 leaves a ragged last block and 5 × 5 blocks of pairs.
    au = alignment_uniformity(X, y, device="cpu", chunk_size=50)
    x = torch.as_tensor(X)
    x = x / x.norm(dim=1, keepdim=True)
    # Wang & Isola's reference code.
    reference = float(torch.pdist(x, p=2).pow(2).mul(-2).exp().mean().log())
    assert au.uniformity == pytest.approx(reference, rel=1e-12)
    # Brute-force alignment over ordered same-concept pairs x != y.
    d2 = ((x[:, None] - x[None]) ** 2).sum(-1).numpy()
    same = (y[:, None] == y[None]) & ~np.eye(len(y), dtype=bool)
    assert au.alignment == pytest.approx(d2[same].mean(), rel=1e-12)
    # Blocks of 101 rows leave a last diagonal block of a single sample (no pair).
    last = alignment_uniformity(X, y, device="cpu", chunk_size=101)
    assert last.uniformity == pytest.approx(reference, rel=1e-12)
    # float32 features and another block size agree closely.
    au32 = alignment_uniformity(X.astype(np.float32), y, device="cpu", chunk_size=64)
    assert au32.uniformity == pytest.approx(reference, rel=1e-5)
    assert au32.alignment == pytest.approx(au.alignment, rel=1e-5)


def test_alignment_uniformity_normalize_and_stability():
    X = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]])
    y = [0, 0, 1, 1]
    base = alignment_uniformity(X, y, device="cpu")
    scaled = alignment_uniformity(X * 7.5, y, device="cpu")
    assert scaled.alignment == pytest.approx(base.alignment)
    assert scaled.uniformity == pytest.approx(base.uniformity)
    # Without normalisation, one pair at distance² 10⁴: log(exp(-2·10⁴)) = -2·10⁴
    # exactly, where the naive mean of exp would underflow to log(0) = -inf.
    far = alignment_uniformity([[0.0], [100.0]], [0, 0], normalize=False, device="cpu")
    assert far.uniformity == pytest.approx(-20000.0)
    assert far.alignment == pytest.approx(10000.0)


def test_alignment_uniformity_errors():
    with pytest.raises(ValueError, match="no concept has 2 samples"):
        alignment_uniformity(np.eye(3), [0, 1, 2], device="cpu")
    with pytest.raises(ValueError, match="y has 2 labels but X has 3 rows"):
        alignment_uniformity(np.eye(3), [0, 1], device="cpu")
    with pytest.raises(ValueError, match="all-zero rows"):
        alignment_uniformity(np.zeros((3, 2)), [0, 0, 1], device="cpu")
    with pytest.raises(ValueError, match="NaN"):
        alignment_uniformity(np.full((3, 2), np.nan), [0, 0, 1], device="cpu")


def test_per_domain_and_relative_to_in1k():
    X = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]])
    scores = alignment_uniformity_per_domain(
        {"IN-1K": (X, [0, 1, 0, 1]), "L1": (X, [0, 0, 1, 1])}, device="cpu"
    )
    assert list(scores) == ["IN-1K", "L1"]
    assert scores["IN-1K"]["alignment"] == pytest.approx(4.0)
    rel = relative_to(scores)  # "in1k" matches "IN-1K"
    # Alignment: 2 - 4 = -2; uniformity is the same set of points, so 0.
    assert rel["L1"]["alignment"] == pytest.approx(-2.0)
    assert rel["L1"]["uniformity"] == pytest.approx(0.0)
    assert rel["IN-1K"] == {"alignment": 0.0, "uniformity": 0.0}  # not t, not n_samples
    assert relative_to(scores, how="ratio")["L1"]["alignment"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="baseline domain 'in21k'"):
        relative_to(scores, baseline="in21k")
    with pytest.raises(ValueError, match="pair"):
        alignment_uniformity_per_domain({"in1k": X})
    # Result objects work too.
    obj = {"in1k": alignment_uniformity(X, [0, 1, 0, 1], device="cpu")}
    assert isinstance(obj["in1k"], AlignmentUniformity)
    assert relative_to(obj)["in1k"]["alignment"] == 0.0


# -------------------------------------------------- semantic errors (tiny)
ROOT, ANIMAL, ARTIFACT, CAT, DOG, TIGER, HOUSE, TOY, TOY_DOG = (
    f"n0000000{i}" for i in range(1, 10)
)


def _tiny_result(top_k=5):
    # See helpers.tiny_taxonomy: toy dog's parents are toy (hypernym) and dog
    # (instance hypernym). lch_depth D = 3 (the deepest max_depth).
    y_true = [TIGER, TIGER, TIGER, TIGER, TIGER, HOUSE, HOUSE, CAT, DOG, DOG]
    y_pred = [TIGER, HOUSE, HOUSE, CAT, TOY_DOG, HOUSE, DOG, TIGER, TOY_DOG, DOG]
    return semantic_errors(y_true, y_pred, taxonomy=tiny_taxonomy(), top_k=top_k)


def test_semantic_errors_counts_and_mf_by_hand():
    res = _tiny_result()
    # Errors: tiger->house ×2, tiger->cat, tiger->toy dog, house->dog,
    # cat->tiger, dog->toy dog: 7 errors in 10 predictions.
    assert res.overall["n_samples"] == 10 and res.overall["n_errors"] == 7
    assert res.overall["accuracy"] == pytest.approx(0.3)
    assert res.classes.tolist() == [CAT, DOG, TIGER, HOUSE]
    assert res.per_class["support"].tolist() == [1, 2, 5, 2]
    assert res.per_class["n_errors"].tolist() == [1, 1, 4, 1]
    # MF(tiger -> house) = 2 of tiger's 4 errors; the others 1 of 4.
    assert res.mf(TIGER, HOUSE) == 0.5
    assert res.mf(TIGER, CAT) == 0.25 and res.mf(TIGER, TOY_DOG) == 0.25
    assert res.mf(HOUSE, DOG) == 1.0
    assert res.mf(TIGER, DOG) == 0.0  # never confused
    assert sorted(res.pairs["count"].tolist()) == [1, 1, 1, 1, 1, 2]


def test_semantic_errors_relations_by_hand():
    res = _tiny_result()
    pairs = {
        (t, p): (s, h, o)
        for t, p, s, h, o in zip(
            res.pairs["true"],
            res.pairs["pred"],
            res.pairs["sibling"],
            res.pairs["hypernym"],
            res.pairs["hyponym"],
        )
    }
    # (sibling, hypernym, hyponym)
    assert pairs[(TIGER, HOUSE)] == (True, False, False)  # both under cat
    assert pairs[(TIGER, CAT)] == (False, True, False)  # cat is tiger cat's parent
    assert pairs[(CAT, TIGER)] == (False, False, True)
    assert pairs[(DOG, TOY_DOG)] == (False, False, True)  # through an instance hypernym
    assert pairs[(HOUSE, DOG)] == (False, False, False)  # parents cat vs animal
    assert pairs[(TIGER, TOY_DOG)] == (False, False, False)
    o = res.overall
    # Sibling: the two tiger->house errors of 7; hypernym: 1 of 7; hyponym: 2 of 7.
    assert o["sibling_rate"] == pytest.approx(2 / 7)
    assert o["hypernym_rate"] == pytest.approx(1 / 7)
    assert o["hyponym_rate"] == pytest.approx(2 / 7)
    tiger = res.classes.tolist().index(TIGER)
    assert res.per_class["sibling_rate"][tiger] == pytest.approx(2 / 4)
    assert res.per_class["hypernym_rate"][tiger] == pytest.approx(1 / 4)
    assert res.per_class["hyponym_rate"][tiger] == 0.0


def test_semantic_errors_similarity_means_by_hand():
    res = _tiny_result()
    o, pc = res.overall, res.per_class
    # Shortest path lengths: tiger-house 2, tiger-cat 1, tiger-toy dog 4
    # (via animal), house-dog 3, cat-tiger 1, dog-toy dog 1.
    # Path = 1/(d+1): 1/3 ×2, 1/2, 1/5, 1/4, 1/2, 1/2 -> 157/60 over 7 errors.
    assert o["path"] == pytest.approx(157 / 420, rel=1e-12)
    tiger = res.classes.tolist().index(TIGER)
    assert pc["path"][tiger] == pytest.approx((2 / 3 + 1 / 2 + 1 / 5) / 4, rel=1e-12)  # 41/120
    # LCH = -log((d+1)/(2·3)) = log(6/(d+1)): tiger-house log 2 ×2, tiger-cat
    # log 3, tiger-toy dog log 1.2, house-dog log 1.5, cat-tiger and dog-toy dog log 3.
    lch = 2 * math.log(2) + 3 * math.log(3) + math.log(1.2) + math.log(1.5)
    assert o["lch"] == pytest.approx(lch / 7, rel=1e-12)
    # Wu-Palmer, NLTK's way (depth = max_depth + 1 of the subsumer):
    # tiger-house 6/8 ×2, tiger-cat 6/7, tiger-toy dog 4/8 (animal), house-dog
    # 4/7, cat-tiger 6/7, dog-toy dog 6/7 -> (2 + 22/7) / 7 = 36/49.
    assert o["wup"] == pytest.approx(36 / 49, rel=1e-12)
    assert pc["wup"][tiger] == pytest.approx((1.5 + 6 / 7 + 0.5) / 4, rel=1e-12)


def test_semantic_errors_top_k_and_paths_by_hand():
    res = _tiny_result(top_k=2)
    conf = res.confusions[TIGER]
    # House cat (2 errors) first; cat and toy dog tie at 1, the lower wnid wins.
    assert [(c.pred, c.count, c.mf) for c in conf] == [(HOUSE, 2, 0.5), (CAT, 1, 0.25)]
    assert conf[0].path == (TIGER, CAT, HOUSE) and conf[0].lcs == CAT
    assert conf[0].path_names == ("tiger cat", "cat", "house cat")
    assert conf[0].relation == "sibling"
    assert conf[0].explain() == "tiger cat → [cat] → house cat"
    assert conf[1].path == (TIGER, CAT) and conf[1].lcs == CAT
    assert conf[1].relation == "hypernym"
    assert conf[1].explain() == "tiger cat → [cat]"
    full = _tiny_result(top_k=5).confusions[TIGER][2]
    # Toy dog joins tiger cat through animal (2 + 2 hops), not the root (3 + 3).
    assert full.path == (TIGER, CAT, ANIMAL, DOG, TOY_DOG) and full.lcs == ANIMAL
    down = res.confusions[DOG][0]
    assert down.path == (DOG, TOY_DOG) and down.lcs == DOG and down.relation == "hyponym"
    assert res.confusions[CAT][0].explain() == "[cat] → tiger cat"


def test_common_subsumer_ties_are_deterministic():
    # A diamond: c and d both have parents a and b. d(c, a) + d(d, a) = 2 =
    # d(c, b) + d(d, b): a and b tie on length and depth; the lower wnid (a) wins.
    rows = {
        "n00000001": [],
        "n00000002": ["n00000001"],
        "n00000003": ["n00000001"],
        "n00000004": ["n00000003", "n00000002"],
        "n00000005": ["n00000002", "n00000003"],
    }
    tax = Taxonomy(
        wnids=list(rows),
        names=[f"x{i}.n.01" for i in range(5)],
        lemmas=[["root"], ["a"], ["b"], ["c"], ["d"]],
        glosses=[""] * 5,
        hypernyms=list(rows.values()),
        instance_hypernyms=[[]] * 5,
    )
    res = semantic_errors(["n00000004", "n00000005"], ["n00000005", "n00000004"], taxonomy=tax)
    assert res.confusions["n00000004"][0].path == ("n00000004", "n00000002", "n00000005")
    assert res.confusions["n00000005"][0].path == ("n00000005", "n00000002", "n00000004")
    assert res.overall["sibling_rate"] == 1.0


def test_semantic_errors_outputs():
    res = _tiny_result()
    d = res.to_dict()
    json.dumps(d, allow_nan=False)  # JSON-safe
    assert d["overall"]["n_errors"] == 7
    tiger = next(c for c in d["classes"] if c["wnid"] == TIGER)
    assert tiger["confusions"][0]["path_names"] == ["tiger cat", "cat", "house cat"]
    text = res.to_text()
    assert "7 errors in 10 predictions" in text
    assert "tiger cat → [cat] → house cat" in text
    assert str(res) == text and "n_errors=7" in repr(res)
    assert "1 of 4 classes shown" in res.to_text(max_rows=1)
    pd = needs("pandas")
    frame = res.to_frame()
    assert isinstance(frame, pd.DataFrame) and frame.loc[TIGER, "n_errors"] == 4
    assert len(res.to_frame("pairs")) == 6
    assert len(res.to_frame("confusions")) == 6


def test_semantic_errors_without_errors_and_with_indices():
    tax = tiny_taxonomy()
    res = semantic_errors([CAT, DOG], [CAT, DOG], taxonomy=tax)
    assert res.overall["n_errors"] == 0 and math.isnan(res.overall["path"])
    assert np.isnan(res.per_class["sibling_rate"]).all()
    assert res.confusions == {CAT: [], DOG: []}
    json.dumps(res.to_dict(), allow_nan=False)
    assert "0 errors" in res.to_text()
    # Class indices with classes= give the same answer as wnids.
    classes = [TIGER, HOUSE, CAT]
    by_index = semantic_errors([0, 0, 1], [1, 2, 1], taxonomy=tax, classes=classes)
    by_wnid = semantic_errors([TIGER, TIGER, HOUSE], [HOUSE, CAT, HOUSE], taxonomy=tax)
    assert by_index.overall == by_wnid.overall


def test_semantic_errors_errors():
    tax = tiny_taxonomy()
    with pytest.raises(ValueError, match="y_true has 2 labels but y_pred has 1"):
        semantic_errors([CAT, DOG], [CAT], taxonomy=tax)
    with pytest.raises(ValueError, match="unknown wnid 'n09999999'"):
        semantic_errors([CAT], ["n09999999"], taxonomy=tax)
    with pytest.raises(ValueError, match="pass classes="):
        semantic_errors([0, 1], [1, 0], taxonomy=tax)
    with pytest.raises(ValueError, match="outside"):
        semantic_errors([0, 3], [1, 0], taxonomy=tax, classes=[CAT, DOG])
    with pytest.raises(ValueError, match="top_k"):
        semantic_errors([CAT], [DOG], taxonomy=tax, top_k=0)
    with pytest.raises(ValueError, match="no predictions"):
        semantic_errors([], [], taxonomy=tax)


def test_path_kernel_agrees_with_the_similarity_kernel():
    # The joining paths have the length the path measure uses, on real WordNet.
    from imagenet_cog import imagenet1k_wnids

    tax = load_taxonomy()
    rng = np.random.default_rng(0)
    wn = np.array(imagenet1k_wnids())
    t, p = wn[rng.integers(0, 1000, 300)], wn[rng.integers(0, 1000, 300)]
    res = semantic_errors(t, p, top_k=1000)
    d = _path_distance(tax, tax.indices(res.pairs["true"]), tax.indices(res.pairs["pred"]))
    np.testing.assert_array_equal(res.pairs["distance"], np.diagonal(d))
    # Path and LCH come from that distance; they equal the similarity matrices.
    for name in ("path", "lch", "wup"):
        full = similarity(name, res.pairs["true"], res.pairs["pred"])
        np.testing.assert_allclose(res.pairs[name], np.diagonal(full), rtol=1e-12)
    for confs in res.confusions.values():
        for c in confs:
            # A path of d hops has d + 1 nodes, and path similarity 1 / (d + 1).
            assert c.similarity["path"] == pytest.approx(1 / len(c.path), rel=1e-12)


# ------------------------------------------------- semantic errors (WordNet)
CATS_AND_DOGS = [
    "n02123159",  # tiger cat
    "n02123045",  # tabby
    "n02123394",  # Persian cat
    "n02124075",  # Egyptian cat
    "n02127052",  # lynx
    "n02113978",  # Mexican hairless
    "n02085620",  # Chihuahua
    "n02690373",  # airliner
    "n02121808",  # domestic cat (the parent of the first four)
]


def _synset(wordnet, wnid):
    return wordnet.synset_from_pos_and_offset("n", int(wnid[1:]))


@pytest.mark.wordnet
def test_semantic_errors_equal_nltk(wordnet):
    rng = np.random.default_rng(0)
    y_true = np.array(CATS_AND_DOGS)[rng.integers(0, 9, 600)]
    y_pred = np.array(CATS_AND_DOGS)[rng.integers(0, 9, 600)]
    res = semantic_errors(y_true, y_pred, top_k=3)
    errors = [(t, p) for t, p in zip(y_true.tolist(), y_pred.tolist()) if t != p]
    assert res.overall["n_errors"] == len(errors)
    syn = {w: _synset(wordnet, w) for w in CATS_AND_DOGS}

    def parents(s):
        return set(s.hypernyms() + s.instance_hypernyms())

    # Per sample, as NLTK computes it (once per distinct pair, to keep the test fast).
    nltk = {
        "path": lambda a, b: a.path_similarity(b),
        # NLTK's lch_similarity formula, -log((d + 1) / (2 · 19)), with WordNet 3.0's
        # noun depth constant: calling it would first spend ~10 s computing that 19.
        "lch": lambda a, b: -math.log((a.shortest_path_distance(b) + 1) / (2 * 19)),
        "wup": lambda a, b: a.wup_similarity(b),
        "sibling_rate": lambda a, b: bool(parents(a) & parents(b)),
        "hypernym_rate": lambda a, b: b in parents(a),
        "hyponym_rate": lambda a, b: a in parents(b),
    }
    distinct = set(errors)
    ref = {}
    for key, fn in nltk.items():
        value = {(t, p): fn(syn[t], syn[p]) for t, p in distinct}
        ref[key] = [value[e] for e in errors]
    true_of = np.array([t for t, _ in errors])
    for key, values in ref.items():
        values = np.asarray(values, dtype=float)
        assert res.overall[key] == pytest.approx(values.mean(), rel=1e-9)
        for i, w in enumerate(res.classes.tolist()):
            assert res.per_class[key][i] == pytest.approx(values[true_of == w].mean(), rel=1e-9)
    # The hand-checked pair: tiger cat and tabby are siblings under domestic cat.
    assert res.mf("n02123159", "n02123045") > 0
    # MF and top-k against a Counter.
    for t, confs in res.confusions.items():
        counts = Counter(p for tt, p in errors if tt == t)
        total = sum(counts.values())
        expected = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        assert [(c.pred, c.count) for c in confs] == expected
        for c in confs:
            assert c.mf == pytest.approx(counts[c.pred] / total)
            # The path: hypernym links up to the subsumer, hyponym links down.
            nodes = [_synset(wordnet, w) for w in c.path]
            up = c.path.index(c.lcs)
            for a, b in pairwise(nodes[: up + 1]):
                assert b in parents(a)
            for a, b in pairwise(nodes[up:]):
                assert a in parents(b)
            assert len(c.path) - 1 == syn[t].shortest_path_distance(syn[c.pred])
            assert c.path_names[0] == syn[t].lemma_names()[0].replace("_", " ")


@pytest.mark.wordnet
def test_semantic_errors_real_paths_by_hand(wordnet):
    tiger, tabby, hairless, lynx = "n02123159", "n02123045", "n02113978", "n02127052"
    res = semantic_errors([tiger] * 4, [tabby, hairless, lynx, tabby])
    confs = {c.pred: c for c in res.confusions[tiger]}
    # Siblings under domestic cat (n02121808): path 1/3.
    assert confs[tabby].path == (tiger, "n02121808", tabby)
    assert confs[tabby].explain() == "tiger cat → [domestic cat] → tabby"
    assert confs[tabby].mf == 0.5 and confs[tabby].relation == "sibling"
    # Mexican hairless joins through domestic animal (n01317541, 2 + 2 hops),
    # a shorter path than through carnivore, NLTK's lowest common hypernym.
    assert confs[hairless].path == (tiger, "n02121808", "n01317541", "n02084071", hairless)
    assert [
        s.name()
        for s in _synset(wordnet, tiger).lowest_common_hypernyms(_synset(wordnet, hairless))
    ] == ["carnivore.n.01"]
    assert confs[hairless].similarity["path"] == pytest.approx(
        _synset(wordnet, tiger).path_similarity(_synset(wordnet, hairless))
    )
    assert confs[lynx].explain() == "tiger cat → domestic cat → [cat] → wildcat → lynx"
    # Path similarities 1/3, 1/5, 1/5, 1/3 over the 4 errors.
    assert res.overall["path"] == pytest.approx((2 / 3 + 2 / 5) / 4)
    assert res.overall["sibling_rate"] == 0.5


# ------------------------------------------------------------------ plotting
def test_plot_analysis_writes_a_png(tmp_path):
    needs("matplotlib")
    scores = {
        d: {"alignment": a, "uniformity": u, "nmi": n, "n_samples": 50}
        for d, a, u, n in [
            ("IN-1K", 0.8, -3.0, 0.81),
            ("L1", 0.9, -2.9, 0.73),
            ("L5", 1.1, -2.6, 0.57),
        ]
    }
    out = tmp_path / "one.png"
    fig = plot_analysis(scores, out, title="ResNet-50")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == [
        "Alignment (lower: tighter concepts)",
        "Uniformity (lower: more uniform)",
        "NMI",
    ]
    # Several models: one line each, a legend, and a chosen metric order.
    models = {"sup": scores, "byol": {d: {"nmi": v["nmi"] - 0.1} for d, v in scores.items()}}
    fig = plot_analysis(models, tmp_path / "two.png", metrics=["nmi"])
    assert len(fig.axes[0].lines) == 2 and fig.legends
    with pytest.raises(ValueError, match="no numeric metric"):
        plot_analysis({"in1k": {"n_samples": 3}})
    # Result objects: semantic_errors gives its overall values.
    tiny = _tiny_result()
    fig = plot_analysis({"in1k": tiny, "l1": tiny}, metrics=["wup", "sibling_rate"])
    assert fig.axes[0].lines[0].get_ydata() == pytest.approx([36 / 49, 36 / 49])
    assert relative_to({"in1k": tiny, "l1": tiny})["l1"]["wup"] == 0.0


def test_plot_analysis_without_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    # The hint works from a checkout as from PyPI: it names matplotlib, not the extra.
    with pytest.raises(ImportError, match=r"pip install 'matplotlib>=3\.7'"):
        plot_analysis({"in1k": {"nmi": 0.5}})


def test_results_plot_without_matplotlib_names_the_plot_extra_requirement(monkeypatch, tmp_path):
    # The hint is the 'plot' extra's own requirement, installable from a checkout or PyPI.
    import re
    from pathlib import Path

    from imagenet_cog import reference_results

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    (requirement,) = re.findall(r'^plot = \["([^"]+)"\]', pyproject, flags=re.MULTILINE)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=rf"pip install '{requirement}'") as info:
        reference_results().plot(tmp_path, baseline="ResNet50")
    assert "imagenet_cog[plot]" not in str(info.value)


def test_semantic_errors_any_measure_in_blocks(monkeypatch):
    # Any registered measure or callable works; a tiny block size makes the
    # pair measures run as several small matrices.
    from imagenet_cog import imagenet1k_wnids
    from imagenet_cog._analysis import semantic_errors as _semantic_errors

    monkeypatch.setattr(_semantic_errors, "_PAIR_BLOCK", 2000)
    wn = np.array(imagenet1k_wnids())
    rng = np.random.default_rng(1)
    t, p = wn[rng.integers(0, 1000, 200)], wn[rng.integers(0, 1000, 200)]

    def first_letter(a, b, *, taxonomy):
        first = np.array([taxonomy.name(w)[0] for w in a])
        return (first[:, None] == np.array([taxonomy.name(w)[0] for w in b])).astype(float)

    res = semantic_errors(t, p, measures=["lin", first_letter])
    assert res.measures == ("lin", "first_letter")
    for name, m in (("lin", "lin"), ("first_letter", first_letter)):
        full = similarity(m, res.pairs["true"], res.pairs["pred"])
        np.testing.assert_allclose(res.pairs[name], np.diagonal(full), rtol=1e-12)
    with pytest.raises(ValueError, match="distinct"):
        semantic_errors(t, p, measures=["path", "path"])
