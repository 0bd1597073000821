import math
import struct

import numpy as np
import pytest
from helpers import tiny_taxonomy

from imagenet_cog import build_levels, load_taxonomy, similarity
from imagenet_cog.measures import (
    ConceptEmbeddings,
    available_measures,
    max_similarity,
    register_measure,
    word2vec_similarity,
)


# ------------------------------------------------------------ NLTK agreement
def _nltk_ic(tax):
    """The IC dictionary NLTK expects, built from the counts of the paper, supplement A.2."""
    ic = tax.information_content()
    g = np.flatnonzero(~np.isnan(ic))
    counts = np.rint(np.exp(-ic[g]) * len(g)).astype(int)
    out = {int(tax.wnids[i][1:]): int(c) for i, c in zip(g, counts)}
    out[0] = len(g)
    return {"n": out}, g


def _nltk_reference(wordnet, name, ic):
    return {
        "lin": lambda x, y: x.lin_similarity(y, ic),
        "jcn": lambda x, y: x.jcn_similarity(y, ic),
        "wup": lambda x, y: x.wup_similarity(y),
        "path": lambda x, y: x.path_similarity(y),
        "lch": lambda x, y: x.lch_similarity(y),
    }[name]


def _pairs(tax, g, rng):
    """2000 random pairs of G, plus ancestor, self and multiple-inheritance pairs."""
    a = tax.wnids[rng.choice(g, 2000)].tolist()
    b = tax.wnids[rng.choice(g, 2000)].tolist()
    multi = np.intersect1d(np.flatnonzero(np.diff(tax.parent_ptr) > 1), g)
    for i in rng.choice(multi, 150).tolist() + rng.choice(g, 150).tolist():
        j = int(rng.choice(tax.ancestor_matrix[i].indices))
        a += [tax.wnids[i], tax.wnids[j], tax.wnids[i]]
        b += [tax.wnids[j], tax.wnids[i], tax.wnids[i]]
    return a, b


@pytest.mark.wordnet
@pytest.mark.parametrize("name", ["lin", "jcn", "wup", "path", "lch"])
def test_measures_equal_nltk(wordnet, name):
    tax = load_taxonomy()
    ic, g = _nltk_ic(tax)
    a, b = _pairs(tax, g, np.random.default_rng(0))
    ref = _nltk_reference(wordnet, name, ic)

    def synset(w):
        return wordnet.synset_from_pos_and_offset("n", int(w[1:]))

    expect = np.array([ref(synset(x), synset(y)) for x, y in zip(a, b)], dtype=float)
    # Pairs are scattered over one big matrix computation, not computed one by one.
    ua, ub = sorted(set(a)), sorted(set(b))
    matrix = similarity(name, ua, ub)
    ia = {w: i for i, w in enumerate(ua)}
    ib = {w: i for i, w in enumerate(ub)}
    got = matrix[[ia[x] for x in a], [ib[y] for y in b]]
    np.testing.assert_allclose(got, expect, rtol=1e-9, atol=0)


@pytest.mark.wordnet
def test_wup_reproduces_nltk_asymmetry(wordnet):
    tax = load_taxonomy()
    _, g = _nltk_ic(tax)
    a, b = _pairs(tax, g, np.random.default_rng(1))

    def synset(w):
        return wordnet.synset_from_pos_and_offset("n", int(w[1:]))

    asym = [
        (x, y)
        for x, y in zip(a, b)
        if synset(x).wup_similarity(synset(y)) != synset(y).wup_similarity(synset(x))
    ]
    assert asym, "the sample should hold pairs where NLTK's Wu-Palmer is asymmetric"
    for x, y in asym:
        assert similarity("wup", [x], [y])[0, 0] == synset(x).wup_similarity(synset(y))
        assert similarity("wup", [y], [x])[0, 0] == synset(y).wup_similarity(synset(x))


# ------------------------------------------------------------ worked by hand
def test_tiny_taxonomy_by_hand():
    tax = tiny_taxonomy()
    universe = ["n00000006", "n00000007", "n00000005"]  # tiger cat, house cat, dog
    # G = root, animal, cat, tiger cat, house cat, dog: |G| = 6.
    ic_cat, ic_leaf, ic_animal = -math.log(3 / 6), -math.log(1 / 6), -math.log(5 / 6)
    lin = similarity(
        "lin", ["n00000006"], ["n00000007", "n00000005"], taxonomy=tax, universe=universe
    )
    assert lin[0, 0] == pytest.approx(2 * ic_cat / (2 * ic_leaf))
    assert lin[0, 1] == pytest.approx(2 * ic_animal / (2 * ic_leaf))
    jcn = similarity("jcn", ["n00000006"], ["n00000007"], taxonomy=tax, universe=universe)
    assert jcn[0, 0] == pytest.approx(1 / (2 * ic_leaf - 2 * ic_cat))
    # tiger cat -> cat -> house cat: 2 hops; tiger cat -> cat -> animal -> dog: 3 hops.
    path = similarity("path", ["n00000006"], ["n00000007", "n00000005", "n00000006"], taxonomy=tax)
    assert path.tolist() == [[1 / 3, 1 / 4, 1.0]]
    lch = similarity("lch", ["n00000006"], ["n00000007"], taxonomy=tax)
    assert lch[0, 0] == pytest.approx(-math.log(3 / (2 * tax.lch_depth)))
    assert tax.lch_depth == 3
    # Wu-Palmer of tiger cat and house cat: lcs cat, depth 2 + 1 = 3: 2*3 / (4 + 4).
    wup = similarity("wup", ["n00000006"], ["n00000007"], taxonomy=tax)
    assert wup[0, 0] == pytest.approx(6 / 8)
    # The toy dog is an instance of dog: dog is 1 hop up, animal 2.
    toy = similarity("path", ["n00000009"], ["n00000005", "n00000002", "n00000006"], taxonomy=tax)
    assert toy.tolist() == [[1 / 2, 1 / 3, 1 / 5]]


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown wnid 'n99999999'"):
        similarity("lin", ["n99999999"], ["n02123159"])
    with pytest.raises(ValueError, match="wnids_b is empty"):
        similarity("path", ["n02123159"], [])
    with pytest.raises(ValueError, match="unknown measure 'nope'"):
        similarity("nope", ["n02123159"], ["n02123159"])
    with pytest.raises(ValueError, match="outside the graph G"):
        similarity("lin", ["n02123159"], ["n00002137"], universe=["n02123159"])
    with pytest.raises(ValueError, match="needs vectors"):
        similarity("w2v", ["n02123159"], ["n02123159"])
    with pytest.raises(ValueError, match=r"reference \(seen\) set is empty"):
        max_similarity("lin", ["n02123159"], [])


def test_registry_and_a_measure_defined_outside_the_package():
    # The documented extension path: any callable (a, b, *, taxonomy) -> matrix.
    def shared_lemma_letters(wnids_a, wnids_b, *, taxonomy):
        """How many of the 26 letters the first lemma names share, vectorized."""

        def letters(wnids):
            names = [taxonomy.lemma_names(w)[0].lower() for w in wnids]
            codes = np.frombuffer("".join(names).encode("ascii", "replace"), dtype=np.uint8)
            owner = np.repeat(np.arange(len(names)), [len(n) for n in names])
            keep = (codes >= ord("a")) & (codes <= ord("z"))
            out = np.zeros((len(names), 26), dtype=np.float64)
            out[owner[keep], codes[keep] - ord("a")] = 1.0
            return out

        return letters(wnids_a) @ letters(wnids_b).T

    register_measure("test-letters", shared_lemma_letters, overwrite=True)
    assert "test-letters" in available_measures()
    with pytest.raises(ValueError, match="exists"):
        register_measure("test-letters", shared_lemma_letters)
    levels = build_levels(measure="test-letters", candidates="cog", n_levels=2, level_size=100)
    scores = levels.scores
    assert levels.provenance["measure"] == "test-letters"
    assert [len(x) for x in levels.levels] == [100, 100]
    assert min(scores[w] for w in levels.levels[0]) >= max(scores[w] for w in levels.levels[1])

    def bad_shape(wnids_a, wnids_b, *, taxonomy):
        return np.zeros(3)

    with pytest.raises(ValueError, match="returned shape"):
        similarity(bad_shape, ["n02123159"], ["n02123159"])


def test_max_similarity_equals_matrix_max():
    a = list(load_taxonomy().wnids[1000:1300])
    ref = ["n02123159", "n02085620", "n01440764"]
    np.testing.assert_array_equal(
        max_similarity("wup", a, ref, chunk_size=64), similarity("wup", a, ref).max(axis=1)
    )


# ------------------------------------------------------------------ word2vec
UNIVERSE = ["n02123159", "n02123045", "n02085620"]  # tiger cat, tabby, Chihuahua


def _toy_vectors(tax):
    """A deterministic small vector table covering some of the universe's words."""
    words = set()
    for w in UNIVERSE:
        words.update(tax.gloss(w).lower().replace("(", " ").replace(")", " ").split())
        for lemma in tax.lemma_names(w):
            words.update(lemma.lower().split("_"))
    words = sorted(x for x in words if x.isalpha())[::2]  # leave some words without vectors
    rng = np.random.default_rng(3)
    return {w: rng.normal(size=4).astype(np.float32) for w in words}


def _expected_w2v(tax, table):
    from sklearn.feature_extraction.text import TfidfVectorizer

    from imagenet_cog.measures import _tokens

    def name_tokens(w):
        return [t for lemma in tax.lemma_names(w) for t in _tokens(lemma.replace("_", " "))]

    docs = [name_tokens(w) + _tokens(tax.gloss(w)) for w in UNIVERSE]
    tfidf = TfidfVectorizer(analyzer=lambda x: x, norm=None, lowercase=False).fit(docs)
    idf = dict(zip(tfidf.get_feature_names_out(), tfidf.idf_))

    def average(tokens):
        num, den = np.zeros(4), 0.0
        for t in set(tokens):
            if t in table:
                weight = tokens.count(t) * idf[t]
                num += weight * table[t].astype(float)
                den += weight
        return num / den if den else num

    emb = np.array([average(name_tokens(w)) + average(_tokens(tax.gloss(w))) for w in UNIVERSE])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    return emb @ emb.T


def _write_text(path, table, header):
    lines = [f"{len(table)} 4"] if header else []
    lines += [f"{w} " + " ".join(repr(float(x)) for x in v) for w, v in table.items()]
    path.write_text("\n".join(lines) + "\n")


def _write_binary(path, table):
    with open(path, "wb") as f:
        f.write(f"{len(table)} 4\n".encode())
        f.writelines(
            w.encode() + b" " + struct.pack("<4f", *v.tolist()) + b"\n" for w, v in table.items()
        )


@pytest.mark.parametrize(
    "fmt", ["word2vec-text", "glove", "word2vec-binary", "keyedvectors", "callable"]
)
def test_word2vec_sources_agree_with_a_hand_computation(tmp_path, fmt):
    tax = load_taxonomy()
    table = _toy_vectors(tax)
    if fmt == "word2vec-text":
        vectors = tmp_path / "vec.txt"
        _write_text(vectors, table, header=True)
    elif fmt == "glove":
        vectors = tmp_path / "glove.txt"
        _write_text(vectors, table, header=False)
    elif fmt == "word2vec-binary":
        vectors = tmp_path / "vec.bin"
        _write_binary(vectors, table)
    elif fmt == "keyedvectors":

        class KeyedVectors:  # the part of gensim's interface we use
            def __init__(self):
                self.key_to_index = {w: i for i, w in enumerate(table)}
                self.vector_size = 4

            def __getitem__(self, key):
                return table[key]

        vectors = KeyedVectors()
    else:

        def vectors(tokens):
            return np.array([table.get(t, np.zeros(4)) for t in tokens])

    got = word2vec_similarity(UNIVERSE, UNIVERSE, vectors=vectors, universe=UNIVERSE)
    expect = _expected_w2v(tax, table)
    if fmt == "callable":
        # An encoder gives every token a vector (here zeros), which then counts
        # in the weighted average's denominator.
        assert got.shape == (3, 3)
        np.testing.assert_allclose(np.diag(got), 1.0, atol=1e-12)
    else:
        np.testing.assert_allclose(got, expect, atol=1e-6)


def test_word2vec_uses_multiword_entities(tmp_path):
    tax = load_taxonomy()
    table = _toy_vectors(tax)
    table["ENTITY/Tiger_cat"] = np.array([9.0, 0, 0, 0], dtype=np.float32)
    path = tmp_path / "vec.txt"
    _write_text(path, table, header=True)
    emb = ConceptEmbeddings(path, universe=UNIVERSE)
    # Wikipedia2Vec-style entity for the multi-word name; plain words otherwise.
    assert emb._name_tokens(tax.lemma_names("n02123159")) == ["ENTITY/Tiger_cat"]
    assert emb._name_tokens(tax.lemma_names("n02085620")) == ["chihuahua"]
    # An encoder knows every token, so a multi-word name goes to it whole.
    encoder = ConceptEmbeddings(lambda toks: np.ones((len(toks), 2)), universe=UNIVERSE)
    assert encoder._name_tokens(("tiger_cat",)) == ["tiger_cat"]


def test_word2vec_in_build_levels(tmp_path):
    tax = load_taxonomy()
    table = _toy_vectors(tax)
    path = tmp_path / "vec.txt"
    _write_text(path, table, header=True)
    pool = list(load_taxonomy().descendant_mask(["n02121620"]).nonzero()[0][:40])  # the cat family
    pool = [tax.wnids[i] for i in pool if tax.wnids[i] not in UNIVERSE]
    with pytest.warns(UserWarning, match="min-images filter"):
        levels = build_levels(
            measure="w2v",
            seen=UNIVERSE,
            candidates=pool,
            exclude=(),
            blocklist=None,
            n_levels=2,
            level_size=3,
            measure_kwargs={"vectors": path, "universe": UNIVERSE + pool},
        )
    assert levels.provenance["measure"] == "w2v"
    assert [len(x) for x in levels.levels] == [3, 3]
