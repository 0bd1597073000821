"""Semantic similarity between WordNet concepts, as full vectorized matrices.

Second stage of the pipeline (taxonomy → **measures** → levels). Every
measure takes two lists of wnids and returns the ``len(a) × len(b)`` matrix of
similarities, higher meaning more similar. The WordNet measures agree with
NLTK's functions of the same name (to 1e-9) without any Python loop over
pairs: a pair's common ancestors are found by gathering rows of a small dense
"ancestor × concept" table and reducing them with ``numpy.ufunc.reduceat``.

A measure is any callable ``measure(wnids_a, wnids_b, *, taxonomy, **kwargs)``
returning that matrix. Register your own with :func:`register_measure` and it
works everywhere a measure name is accepted (:func:`similarity`,
:func:`~imagenet_cog.build_levels`, ``imagenet-cog levels --measure``).
"""

from __future__ import annotations

import inspect
import math
import re
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ._base import concat_ranges
from ._plugins import (
    MEASURES,
    PluginError,
    entry_point,
    entry_point_names,
    is_object_path,
    load_object,
)
from .taxonomy import Ancestry, load_taxonomy, resolve_universe, universe_key

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []

#: What NLTK returns for an infinite Jiang-Conrath similarity.
JCN_INFINITY = 1e300

# Elements of the gathered (ancestor × concept) block per reduction step: about
# 64 MB of int16, which keeps the working set in cache-friendly chunks.
_ANCESTOR_BLOCK_ELEMENTS = 1 << 25
_ROW_CHUNK = 32768


# ------------------------------------------------------------------ kernels
def _columns(reference):
    """The union U of the reference concepts' ancestors, and a node → column map."""
    cols = np.unique(reference.ancestor)
    return cols


def _profile_groups(owner, col, val, n_rows):
    """Group rows whose sparse (column, value) profiles are identical.

    Many concepts share the same ancestors among the reference's ancestors
    (siblings under a node outside that set), and then every measure gives
    them the same row. Hashing each profile as a sum of random 64-bit keys
    finds those groups in linear time; a second, independent hash must agree
    within each group, or we fall back to the exact (slow) comparison.

    Returns
    -------
    reps : ndarray
        One representative row per group, sorted.
    inverse : ndarray
        For each row, the index of its group in ``reps``.
    """
    rng = np.random.default_rng(0x5EED)
    width = int(val.max()) + 2 if len(val) else 1
    hashes = []
    for _ in range(2):
        keys = rng.integers(
            0, np.iinfo(np.int64).max, size=(int(col.max()) + 1, width), dtype=np.int64
        )
        contrib = keys[col, val.astype(np.int64) + 1].astype(np.uint64)
        h = np.zeros(n_rows, dtype=np.uint64)
        np.add.at(h, owner, contrib)
        hashes.append(h)
    _, reps, inverse = np.unique(hashes[0], return_index=True, return_inverse=True)
    if not np.array_equal(hashes[1], hashes[1][reps][inverse]):  # pragma: no cover - ~2**-64
        dense = np.full((n_rows, int(col.max()) + 1), -1, dtype=np.int64)
        dense[owner, col] = val
        _, reps, inverse = np.unique(dense, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(reps)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return reps[order], rank[inverse.ravel()]


def _reduce_over_common(tax, ia, ib, value, reduce, fill, add_b_dist=False):
    """``out[a, b] = reduce over common ancestors k of value(k, d(a,k)) [+ d(b,k)]``.

    Parameters
    ----------
    value : callable(ancestor_nodes, dist_from_a) -> int array
        The quantity each common ancestor contributes for the ``a`` side.
    reduce : numpy ufunc
        ``np.maximum`` or ``np.minimum``.
    fill : int
        The neutral value for "not an ancestor of a".
    add_b_dist : bool
        Add ``d(b, k)`` before reducing (for path lengths through ``k``).
    """
    anc_b = Ancestry(tax, ib)
    cols = _columns(anc_b)
    col_of_b = np.searchsorted(cols, anc_b.ancestor)
    widest_b = max(1, int(np.diff(anc_b.ptr).max()))
    out = np.empty((len(ia), len(ib)), dtype=np.int16)
    for a0 in range(0, len(ia), _ROW_CHUNK):
        chunk = ia[a0 : a0 + _ROW_CHUNK]
        anc_a = Ancestry(tax, chunk)
        pos = np.minimum(np.searchsorted(cols, anc_a.ancestor), len(cols) - 1)
        hit = cols[pos] == anc_a.ancestor
        owner, col = anc_a.owner[hit], pos[hit]
        val = np.asarray(value(anc_a.ancestor[hit], anc_a.dist[hit]), dtype=np.int64)
        reps, group = _profile_groups(owner, col, val, len(chunk))
        group_of_rep = np.full(len(chunk), -1)
        group_of_rep[reps] = np.arange(len(reps))
        keep = group_of_rep[owner] >= 0
        table = np.full((len(cols), len(reps)), fill, dtype=np.int16)
        table[col[keep], group_of_rep[owner[keep]]] = val[keep]
        reduced = np.empty((len(reps), len(ib)), dtype=np.int16)
        per_b = max(1, _ANCESTOR_BLOCK_ELEMENTS // (len(reps) * widest_b))
        for b0 in range(0, len(ib), per_b):
            b1 = min(len(ib), b0 + per_b)
            lo, hi = anc_b.ptr[b0], anc_b.ptr[b1]
            block = table[col_of_b[lo:hi]]
            if add_b_dist:
                block += anc_b.dist[lo:hi, None]
            reduced[:, b0:b1] = reduce.reduceat(block, anc_b.ptr[b0:b1] - lo, axis=0).T
        out[a0 : a0 + len(chunk)] = reduced[group]
    return out


def _rank(keys_sorted_order, n):
    rank = np.empty(n, dtype=np.int64)
    rank[keys_sorted_order] = np.arange(n)
    return rank


def _lcs_information_content(tax, ia, ib, ic):
    """IC of the most informative common ancestor of every pair."""
    anc_b = Ancestry(tax, ib)
    cols = _columns(anc_b)
    order = np.argsort(ic[cols], kind="stable")  # rank 0 = least informative
    rank_of_col = _rank(order, len(cols))
    if len(cols) > np.iinfo(np.int16).max:
        raise ValueError("too many ancestors for the int16 kernel; split the reference set")

    def value(nodes, _dist):
        return rank_of_col[np.searchsorted(cols, nodes)]

    best = _reduce_over_common(tax, ia, ib, value, np.maximum, fill=-1)
    if (best < 0).any():
        # Only possible in a forest with several roots: no common ancestor, IC 0 like NLTK.
        lcs = np.where(best < 0, 0.0, ic[cols[order]][np.maximum(best, 0)])
    else:
        lcs = ic[cols[order]][best]
    return lcs


def _path_distance(tax, ia, ib):
    """NLTK's ``shortest_path_distance``: min over common ancestors of d(a,k) + d(b,k)."""

    def value(_nodes, dist):
        return dist

    # 2 * 1000 leaves room for "+ d(b, k)" without overflowing int16.
    return _reduce_over_common(tax, ia, ib, value, np.minimum, fill=10000, add_b_dist=True)


def _ancestor_path_distance(tax, nodes):
    """``shortest_path_distance(x, k)`` for every node x and each ancestor k of x.

    Returns the flat ancestry of ``nodes`` and the distances, aligned with it.
    Usually ``d(x, k)``, but NLTK allows the detour through a common ancestor
    of x and k, which can be shorter in a graph with multiple inheritance.
    """
    anc = tax.ancestor_matrix
    n = len(tax)
    fam = Ancestry(tax, nodes)
    starts, ends = anc.indptr[fam.ancestor], anc.indptr[fam.ancestor + 1]
    flat = concat_ranges(starts, ends)
    pair = np.repeat(np.arange(len(fam.ancestor)), ends - starts)
    j = anc.indices[flat].astype(np.int64)
    d_kj = anc.data[flat].astype(np.int64) - 1
    x = nodes[fam.owner[pair]]
    # d(x, j): look (x, j) up in the ancestor matrix by its flat key.
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(anc.indptr))
    keys = rows * n + anc.indices
    where = np.searchsorted(keys, x * n + j)
    d_xj = anc.data[where].astype(np.int64) - 1
    seg = np.concatenate([[0], np.cumsum(ends - starts)[:-1]])
    spd = np.minimum.reduceat(d_xj + d_kj, seg)
    return fam, spd.astype(np.int16)


def _ancestor_table(tax, fam, values, cols, fill):
    """Dense ``(len(cols), len(fam.nodes))`` table of per-(ancestor, node) values."""
    pos = np.minimum(np.searchsorted(cols, fam.ancestor), len(cols) - 1)
    hit = cols[pos] == fam.ancestor
    table = np.full((len(cols), len(fam.nodes)), fill, dtype=np.int16)
    table[pos[hit], fam.owner[hit]] = values[hit]
    return table


# ------------------------------------------------------------------ measures
def _nodes(tax, wnids, what):
    wnids = list(wnids) if not isinstance(wnids, str) else [wnids]
    if not wnids:
        raise ValueError(f"{what} is empty")
    return tax.indices(wnids)


def _pair_nodes(taxonomy, wnids_a, wnids_b):
    """The taxonomy in use and the node indices of both sides (named errors if unknown)."""
    tax = taxonomy or load_taxonomy()
    return tax, _nodes(tax, wnids_a, "wnids_a"), _nodes(tax, wnids_b, "wnids_b")


def _ic_for(tax, universe, ia, ib):
    ic = tax.information_content(universe)
    for idx in (ia, ib):
        bad = np.isnan(ic[idx])
        if bad.any():
            shown = ", ".join(tax.wnids[idx[bad]][:5].tolist())
            raise ValueError(
                f"{int(bad.sum())} concept(s) lie outside the graph G of the universe used for "
                f"information content ({shown}); pass universe=[...] that includes them"
            )
    return ic


def lin_similarity(wnids_a, wnids_b, *, taxonomy=None, universe="imagenet"):
    """Lin similarity ``2·IC(lcs) / (IC(a) + IC(b))`` for all pairs.

    Information content as in the paper's supplement A.2: ``IC(c) = -log(|{c} ∪ desc_G(c)| / |G|)``
    over the graph G of ``universe`` (IN-21K ∪ IN-1K by default, ``|G| = 23,547``).
    Equals NLTK's ``lin_similarity`` with the matching IC dictionary.

    Parameters
    ----------
    wnids_a, wnids_b : sequence of str
    taxonomy : Taxonomy, optional
        Defaults to the bundled WordNet 3.0 taxonomy.
    universe : "imagenet" or sequence of str
        The concepts whose graph defines the information content.

    Returns
    -------
    ndarray of float64, shape (len(wnids_a), len(wnids_b))

    Examples
    --------
    >>> from imagenet_cog import similarity
    >>> s = similarity("lin", ["n02123159", "n02085620"], ["n02123045", "n02123159"])
    >>> s.shape, float(s[0, 1])
    ((2, 2), 1.0)
    """
    tax, ia, ib = _pair_nodes(taxonomy, wnids_a, wnids_b)
    ic = _ic_for(tax, universe, ia, ib)
    lcs = _lcs_information_content(tax, ia, ib, ic)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (2.0 * lcs) / (ic[ia][:, None] + ic[ib][None, :])


def jcn_similarity(wnids_a, wnids_b, *, taxonomy=None, universe="imagenet"):
    """Jiang-Conrath similarity ``1 / (IC(a) + IC(b) - 2·IC(lcs))`` for all pairs.

    Follows NLTK's ``jcn_similarity`` to the letter: identical concepts and a
    zero distance give ``1e300``, and a root concept (IC 0) gives 0.

    Parameters
    ----------
    wnids_a, wnids_b : sequence of str
    taxonomy : Taxonomy, optional
    universe : "imagenet" or sequence of str

    Returns
    -------
    ndarray of float64, shape (len(wnids_a), len(wnids_b))

    Examples
    --------
    >>> from imagenet_cog import similarity
    >>> float(similarity("jcn", ["n02123159"], ["n02123159"])[0, 0])
    1e+300
    """
    tax, ia, ib = _pair_nodes(taxonomy, wnids_a, wnids_b)
    ic = _ic_for(tax, universe, ia, ib)
    lcs = _lcs_information_content(tax, ia, ib, ic)
    ic_a, ic_b = ic[ia][:, None], ic[ib][None, :]
    diff = ic_a + ic_b - 2 * lcs
    with np.errstate(divide="ignore"):
        out = np.where(diff == 0, JCN_INFINITY, 1 / diff)
    out = np.where((ic_a == 0) | (ic_b == 0), 0.0, out)
    out[ia[:, None] == ib[None, :]] = JCN_INFINITY
    return out


def path_similarity(wnids_a, wnids_b, *, taxonomy=None):
    """Path similarity ``1 / (1 + shortest hypernym path length)`` for all pairs.

    Equals NLTK's ``path_similarity`` on WordNet 3.0 nouns.

    Parameters
    ----------
    wnids_a, wnids_b : sequence of str
    taxonomy : Taxonomy, optional

    Returns
    -------
    ndarray of float64, shape (len(wnids_a), len(wnids_b))

    Examples
    --------
    >>> from imagenet_cog import similarity
    >>> float(similarity("path", ["n02123159"], ["n02121808"])[0, 0])  # tiger cat, house cat
    0.5
    """
    tax, ia, ib = _pair_nodes(taxonomy, wnids_a, wnids_b)
    dist = _path_distance(tax, ia, ib).astype(np.float64)
    return 1.0 / (dist + 1)


def lch_similarity(wnids_a, wnids_b, *, taxonomy=None):
    """Leacock-Chodorow similarity ``-log((path length + 1) / (2·D))`` for all pairs.

    ``D`` is the taxonomy's ``lch_depth`` (19 for WordNet 3.0 nouns), as in
    NLTK's ``lch_similarity``.

    Parameters
    ----------
    wnids_a, wnids_b : sequence of str
    taxonomy : Taxonomy, optional

    Returns
    -------
    ndarray of float64, shape (len(wnids_a), len(wnids_b))

    Examples
    --------
    >>> from imagenet_cog import similarity
    >>> round(float(similarity("lch", ["n02123159"], ["n02123159"])[0, 0]), 4)  # -log(1/38)
    3.6376
    """
    tax, ia, ib = _pair_nodes(taxonomy, wnids_a, wnids_b)
    dist = _path_distance(tax, ia, ib).astype(np.float64)
    return -np.log((dist + 1) / (2.0 * tax.lch_depth))


def wup_similarity(wnids_a, wnids_b, *, taxonomy=None):
    """Wu-Palmer similarity for all pairs, exactly as NLTK's ``wup_similarity``.

    NLTK picks the subsumer among the common hypernyms of greatest
    ``min_depth``, preferring ``a`` itself, then the first by synset name; its
    depth is ``max_depth + 1``, and the path lengths to it are shortest
    hypernym path distances. All of this is reproduced, including the
    asymmetry it implies in rare cases.

    Parameters
    ----------
    wnids_a, wnids_b : sequence of str
    taxonomy : Taxonomy, optional

    Returns
    -------
    ndarray of float64, shape (len(wnids_a), len(wnids_b))

    Examples
    --------
    >>> from imagenet_cog import similarity
    >>> float(similarity("wup", ["n02123159"], ["n02085620"])[0, 0])  # tiger cat, Chihuahua
    0.75
    """
    tax, ia, ib = _pair_nodes(taxonomy, wnids_a, wnids_b)
    n = len(tax)
    fam_b, spd_b = _ancestor_path_distance(tax, ib)
    cols = _columns(fam_b)
    if len(cols) > np.iinfo(np.int16).max:
        raise ValueError("too many ancestors for the int16 kernel; split the reference set")
    # Preference order of subsumers: deepest min_depth first, then synset name.
    names = np.asarray(tax.names, dtype=object)[cols]
    order = np.lexsort((names, -tax.min_depth[cols]))
    goodness = np.empty(len(cols), dtype=np.int64)
    goodness[order] = np.arange(len(cols))[::-1]

    def value(nodes, _dist):
        return goodness[np.searchsorted(cols, nodes)]

    spd_b_table = _ancestor_table(tax, fam_b, spd_b, cols, fill=-1)
    # (b, k) pairs where k is an ancestor of b, as sorted flat keys.
    b_keys = np.sort(ib[fam_b.owner] * n + fam_b.ancestor)
    out = np.empty((len(ia), len(ib)), dtype=np.float64)
    for a0 in range(0, len(ia), _ROW_CHUNK):
        chunk = ia[a0 : a0 + _ROW_CHUNK]
        best = _reduce_over_common(tax, chunk, ib, value, np.maximum, fill=-1)
        sub_col = order[len(cols) - 1 - best.astype(np.int64)]
        sub = cols[sub_col]
        # "self if self in subsumers": a is a common hypernym at the best min_depth.
        maybe_self = tax.min_depth[chunk][:, None] == tax.min_depth[sub]
        if maybe_self.any():
            ra, rb = np.nonzero(maybe_self)
            key = ib[rb] * n + chunk[ra]
            pos = np.minimum(np.searchsorted(b_keys, key), len(b_keys) - 1)
            is_self = b_keys[pos] == key
            sub[ra[is_self], rb[is_self]] = chunk[ra[is_self]]
            sub_col[ra[is_self], rb[is_self]] = np.searchsorted(cols, chunk[ra[is_self]])
        fam_a, spd_a = _ancestor_path_distance(tax, chunk)
        spd_a_table = _ancestor_table(tax, fam_a, spd_a, cols, fill=-1)
        len_a = spd_a_table[sub_col, np.arange(len(chunk))[:, None]].astype(np.float64)
        len_b = spd_b_table[sub_col, np.arange(len(ib))[None, :]].astype(np.float64)
        depth = tax.max_depth[sub].astype(np.float64) + 1
        out[a0 : a0 + len(chunk)] = (2.0 * depth) / ((len_a + depth) + (len_b + depth))
    return out


# ------------------------------------------------------------------ word2vec
_TOKEN_RE = re.compile(r"[a-z0-9]+(?:['\-][a-z0-9]+)*")


def _tokens(text):
    return _TOKEN_RE.findall(text.lower())


class _VectorTable:
    """Token → vector lookups from any supported source, for a known vocabulary."""

    def __init__(self, source, wanted):
        wanted = list(dict.fromkeys(wanted))
        if callable(source) and not hasattr(source, "key_to_index"):
            matrix = np.asarray(source(wanted), dtype=np.float64)
            if matrix.shape[0] != len(wanted):
                raise ValueError(
                    f"the encoder returned {matrix.shape[0]} vectors for {len(wanted)} tokens"
                )
            self.index = {w: i for i, w in enumerate(wanted)}
            self.matrix = matrix
        elif hasattr(source, "key_to_index"):  # gensim KeyedVectors
            keys = [w for w in wanted if w in source.key_to_index]
            self.index = {w: i for i, w in enumerate(keys)}
            self.matrix = np.asarray(
                [source[w] for w in keys] if keys else np.zeros((0, source.vector_size)),
                dtype=np.float64,
            )
        elif isinstance(source, (str, Path)):
            self.index, self.matrix = _read_vector_file(Path(source), set(wanted))
        else:
            raise TypeError(
                "vectors must be a gensim KeyedVectors, a word2vec/GloVe file path, or a "
                f"callable encoder; got {type(source).__name__}"
            )
        if not self.index:
            raise ValueError("none of the concept words has a vector in the given table")

    def __contains__(self, token):
        return token in self.index


def _read_vector_file(path, wanted):
    """Read only the wanted tokens of a word2vec (text or binary) or GloVe file."""
    if not path.is_file():
        raise FileNotFoundError(f"no word-vector file at {path}")
    index, rows = {}, []
    with open(path, "rb") as f:
        first = f.readline()
        parts = first.split()
        header = len(parts) == 2 and all(p.isdigit() for p in parts)
        if header:
            count, dim = int(parts[0]), int(parts[1])
            rest = f.read(64)
            f.seek(len(first))
            binary = b"\0" in rest or any(b > 127 for b in rest[: 4 * dim])
            if binary:
                for _ in range(count):
                    word = bytearray()
                    while (ch := f.read(1)) not in (b" ", b""):
                        if ch != b"\n":
                            word += ch
                    vec = np.frombuffer(f.read(4 * dim), dtype="<f4")
                    token = word.decode("utf-8", errors="replace")
                    if token in wanted and token not in index:
                        index[token] = len(rows)
                        rows.append(vec.astype(np.float64))
                return index, _stack(rows, dim)
            lines = f
        else:
            f.seek(0)
            lines = f
        dim = None
        for raw in lines:
            token, _, values = raw.decode("utf-8", errors="replace").rstrip("\n").partition(" ")
            if token in wanted and token not in index:
                vec = np.array(values.split(), dtype=np.float64)
                if dim is None:
                    dim = len(vec)
                elif len(vec) != dim:
                    raise ValueError(
                        f"{path}: vector of {token!r} has {len(vec)} values, expected {dim}"
                    )
                index[token] = len(rows)
                rows.append(vec)
    return index, _stack(rows, dim or 0)


def _stack(rows, dim):
    return np.vstack(rows) if rows else np.zeros((0, dim))


class ConceptEmbeddings:
    """tf-idf weighted word-vector embeddings of concepts (paper supplement D).

    tf-idf weights are learnt over the names and glosses of all concepts of the
    universe. Each concept gets the tf-idf weighted average of the vectors of
    its name's words, plus that of its gloss's words. A multi-word name that
    the table knows as one token (e.g. ``tiger_cat``, or Wikipedia2Vec's
    ``ENTITY/Tiger_cat``) is used whole, as the paper did with entities.

    Parameters
    ----------
    vectors : gensim KeyedVectors, path, or callable
        A table with ``key_to_index`` and item access (gensim), a word2vec
        text or binary file or a GloVe text file, or a callable that maps a
        list of tokens to an ``(n, d)`` array.
    taxonomy : Taxonomy, optional
    universe : "imagenet" or sequence of str
        Concepts whose names and glosses define the tf-idf weights.
    entity_prefix : str
        Prefix of entity keys in the table (Wikipedia2Vec uses ``"ENTITY/"``).

    Examples
    --------
    The ``"w2v"`` measure builds them from its ``vectors``:

    >>> import numpy as np
    >>> from imagenet_cog import similarity
    >>> encode = lambda tokens: np.array([[len(t), t.count("a") + 1.0] for t in tokens])
    >>> s = similarity("w2v", ["n02123159"], ["n02085620"], vectors=encode,
    ...                universe=["n02123159", "n02085620"])
    >>> s.shape
    (1, 1)
    """

    def __init__(self, vectors, taxonomy=None, universe="imagenet", entity_prefix="ENTITY/"):
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.taxonomy = tax = taxonomy or load_taxonomy()
        self.universe = resolve_universe(universe)
        self.entity_prefix = entity_prefix
        idx = tax.indices(self.universe)
        lemma_lists = [tax.lemmas[i] for i in idx]
        glosses = [tax.glosses[i] for i in idx]
        wanted = {t for g in glosses for t in _tokens(g)}
        for lemmas in lemma_lists:
            for lemma in lemmas:
                wanted.update(_tokens(lemma.replace("_", " ")))
                wanted.update(self._entity_keys(lemma))
        self.table = _VectorTable(vectors, sorted(wanted))
        names = [self._name_tokens(lemmas) for lemmas in lemma_lists]
        glosses_tok = [_tokens(g) for g in glosses]
        self._tfidf = TfidfVectorizer(analyzer=lambda tokens: tokens, norm=None, lowercase=False)
        self._tfidf.fit([n + g for n, g in zip(names, glosses_tok)])
        self._cache = {}

    def _entity_keys(self, lemma):
        if "_" not in lemma:
            return []
        return [lemma, lemma.lower(), self.entity_prefix + lemma[:1].upper() + lemma[1:]]

    def _name_tokens(self, lemmas):
        tokens = []
        for lemma in lemmas:
            whole = next((k for k in self._entity_keys(lemma) if k in self.table), None)
            tokens += [whole] if whole else _tokens(lemma.replace("_", " "))
        return tokens

    def _average(self, docs):
        weights = self._tfidf.transform(docs).tocsr()  # (n, vocab) tf·idf
        vocab = self._tfidf.get_feature_names_out()
        has_vec = np.array([t in self.table for t in vocab])
        rows = np.array([self.table.index.get(t, 0) for t in vocab])
        weights = weights[:, np.flatnonzero(has_vec)]
        vecs = self.table.matrix[rows[has_vec]]
        total = np.asarray(weights.sum(axis=1)).ravel()
        avg = weights @ vecs
        with np.errstate(invalid="ignore", divide="ignore"):
            avg = avg / total[:, None]
        return np.nan_to_num(avg)

    def embed(self, wnids):
        """Embeddings of ``wnids``: name average plus gloss average.

        Returns
        -------
        ndarray of float64, shape (len(wnids), d)
        """
        tax = self.taxonomy
        idx = tax.indices(wnids)
        missing = [i for i in dict.fromkeys(idx.tolist()) if i not in self._cache]
        if missing:
            names = [self._name_tokens(tax.lemmas[i]) for i in missing]
            glosses = [_tokens(tax.glosses[i]) for i in missing]
            vecs = self._average(names) + self._average(glosses)
            self._cache.update(zip(missing, vecs))
        return np.vstack([self._cache[i] for i in idx.tolist()])

    def similarity(self, wnids_a, wnids_b):
        """Cosine similarity of the embeddings, ``len(a) × len(b)``."""
        ea, eb = _unit(self.embed(wnids_a)), _unit(self.embed(wnids_b))
        return ea @ eb.T


def _unit(x):
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


_EMBEDDINGS = OrderedDict()


def word2vec_similarity(
    wnids_a, wnids_b, *, taxonomy=None, vectors=None, universe="imagenet", entity_prefix="ENTITY/"
):
    """Cosine similarity of tf-idf weighted word-vector embeddings (supplement D).

    Parameters
    ----------
    wnids_a, wnids_b : sequence of str
    taxonomy : Taxonomy, optional
    vectors : gensim KeyedVectors, path, callable or ConceptEmbeddings
        The word vectors; see :class:`ConceptEmbeddings`. Required.
    universe : "imagenet" or sequence of str
        Concepts whose names and glosses define the tf-idf weights.
    entity_prefix : str

    Returns
    -------
    ndarray of float64, shape (len(wnids_a), len(wnids_b))

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog import similarity
    >>> encode = lambda tokens: np.array([[len(t), 1.0] for t in tokens])
    >>> s = similarity("w2v", ["n02123159"], ["n02123159"], vectors=encode,
    ...                universe=["n02123159", "n02085620"])
    >>> round(float(s[0, 0]), 6)
    1.0
    """
    if vectors is None:
        raise ValueError(
            "the word2vec measure needs vectors=: a gensim KeyedVectors, a word2vec/GloVe "
            "file, or a callable encoder (no model can be downloaded at run time)"
        )
    if isinstance(vectors, ConceptEmbeddings):
        return vectors.similarity(wnids_a, wnids_b)
    tax = taxonomy or load_taxonomy()
    key = (
        id(tax),
        str(vectors) if isinstance(vectors, (str, Path)) else id(vectors),
        universe_key(universe),
        entity_prefix,
    )
    emb = _EMBEDDINGS.get(key)
    if emb is None:
        emb = ConceptEmbeddings(
            vectors, taxonomy=tax, universe=universe, entity_prefix=entity_prefix
        )
        _EMBEDDINGS[key] = emb
        while len(_EMBEDDINGS) > 4:
            _EMBEDDINGS.popitem(last=False)
    return emb.similarity(wnids_a, wnids_b)


# ------------------------------------------------------------------ registry
_REGISTRY = OrderedDict(
    [
        ("lin", lin_similarity),
        ("wup", wup_similarity),
        ("jcn", jcn_similarity),
        ("path", path_similarity),
        ("lch", lch_similarity),
        ("w2v", word2vec_similarity),
    ]
)


def register_measure(name, measure, *, overwrite=False):
    """Make ``measure`` available by ``name`` everywhere a measure is accepted.

    Parameters
    ----------
    name : str
    measure : callable
        ``measure(wnids_a, wnids_b, *, taxonomy, **kwargs) -> array`` of shape
        ``(len(wnids_a), len(wnids_b))``, higher meaning more similar.
    overwrite : bool
        Replace an existing measure of that name.

    Returns
    -------
    callable
        ``measure``, so this also works as a decorator factory's target.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog import register_measure, similarity
    >>> def same_first_letter(a, b, *, taxonomy):
    ...     names = lambda ws: np.array([taxonomy.name(w)[0] for w in ws])
    ...     return (names(a)[:, None] == names(b)[None, :]).astype(float)
    >>> _ = register_measure("first-letter", same_first_letter, overwrite=True)
    >>> similarity("first-letter", ["n02123159"], ["n02123045", "n02085620"]).tolist()
    [[1.0, 0.0]]
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a measure needs a non-empty string name")
    if not callable(measure):
        raise PluginError(f"measure {name!r} is not callable")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"a measure named {name!r} exists; pass overwrite=True to replace it")
    _REGISTRY[name] = measure
    return measure


def available_measures():
    """Names of the registered measures.

    Returns
    -------
    list of str
        The built-in measures first, then the registered ones.

    Examples
    --------
    >>> from imagenet_cog import available_measures
    >>> available_measures()[:6]
    ['lin', 'wup', 'jcn', 'path', 'lch', 'w2v']
    """
    return list(_REGISTRY) + [n for n in entry_point_names(MEASURES) if n not in _REGISTRY]


def get_measure(measure):
    """The callable behind a measure name (a callable is returned as is).

    Parameters
    ----------
    measure : str or callable

    Returns
    -------
    callable

    Raises
    ------
    ValueError
        For an unknown name; the message lists the available ones.

    Examples
    --------
    Every measure name :func:`similarity` accepts is looked up here:

    >>> from imagenet_cog import available_measures
    >>> "lin" in available_measures()
    True
    """
    if callable(measure):
        return measure
    if isinstance(measure, str) and measure in _REGISTRY:
        return _REGISTRY[measure]
    if is_object_path(measure):  # package.module:function, imported now
        found = load_object(measure, "measure")
    else:  # a measure an installed package offers
        found = entry_point(MEASURES, measure, "measure") if isinstance(measure, str) else None
    if found is None:
        raise ValueError(
            f"unknown measure {measure!r}; available: {', '.join(available_measures())} "
            "(add your own with register_measure, name one as package.module:function, or "
            f"install a package offering it in the entry-point group {MEASURES})"
        )
    if not callable(found):
        raise PluginError(f"measure {measure!r} is not callable")
    _REGISTRY[measure] = found
    return found


def measure_name(measure):
    """A readable name for a measure (its registry name if it has one)."""
    if isinstance(measure, str):
        return measure
    for name, fn in _REGISTRY.items():
        if fn is measure:
            return name
    return getattr(measure, "__name__", type(measure).__name__)


def similarity(measure, wnids_a, wnids_b, *, taxonomy=None, **kwargs):
    """The ``len(wnids_a) × len(wnids_b)`` similarity matrix of a measure.

    Parameters
    ----------
    measure : str or callable
        A registered name (see :func:`available_measures`) or a callable
        following the measure interface of :func:`register_measure`.
    wnids_a, wnids_b : sequence of str
    taxonomy : Taxonomy, optional
        Defaults to the bundled WordNet 3.0 taxonomy.
    **kwargs
        Passed to the measure (``universe=`` for Lin and Jiang-Conrath,
        ``vectors=`` for word2vec).

    Returns
    -------
    ndarray of float64

    Examples
    --------
    >>> from imagenet_cog import similarity
    >>> similarity("path", ["n02123159"], ["n02121808", "n02123159"]).tolist()
    [[0.5, 1.0]]
    """
    tax = taxonomy or load_taxonomy()
    wnids_a = [wnids_a] if isinstance(wnids_a, str) else list(wnids_a)
    wnids_b = [wnids_b] if isinstance(wnids_b, str) else list(wnids_b)
    fn = get_measure(measure)
    _check_call(fn, measure, wnids_a, wnids_b, tax, kwargs)
    out = np.asarray(fn(wnids_a, wnids_b, taxonomy=tax, **kwargs), dtype=np.float64)
    if out.shape != (len(wnids_a), len(wnids_b)):
        raise ValueError(
            f"measure {measure_name(measure)!r} returned shape {out.shape}, "
            f"expected {(len(wnids_a), len(wnids_b))}"
        )
    return out


def _check_call(fn, measure, wnids_a, wnids_b, taxonomy, kwargs):
    """Raise :class:`PluginError` when ``fn`` cannot be called as a measure is (its signature
    refuses the arguments), before it runs: a measure written without ``taxonomy=`` fails
    there, in one line, not deep inside the call."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): it is called as is
        return
    try:
        signature.bind(wnids_a, wnids_b, taxonomy=taxonomy, **kwargs)
    except TypeError as exc:
        given = ", ".join(["wnids_a", "wnids_b", "taxonomy=...", *(f"{k}=..." for k in kwargs)])
        raise PluginError(
            f"measure {measure_name(measure)!r} cannot be called as measure({given}): {exc}; a "
            "measure takes two lists of wnids and the keyword argument taxonomy (see "
            "register_measure)"
        ) from None


def max_similarity(measure, wnids, reference, *, taxonomy=None, chunk_size=8192, **kwargs):
    """``max over r in reference of sim(c, r)`` for each concept c, in chunks.

    This is ``sim_IN1K`` of the paper (Sec. 3.3) when ``reference`` is the IN-1K list.

    Parameters
    ----------
    measure : str or callable
    wnids : sequence of str
    reference : sequence of str
    taxonomy : Taxonomy, optional
    chunk_size : int
        Rows of the similarity matrix computed at a time.
    **kwargs
        Passed to the measure.

    Returns
    -------
    ndarray of float64, shape (len(wnids),)

    Examples
    --------
    >>> from imagenet_cog import max_similarity
    >>> max_similarity("lin", ["n02123159"], ["n02123159", "n02085620"]).tolist()
    [1.0]
    """
    wnids = list(wnids)
    reference = list(reference)
    if not reference:
        raise ValueError("the reference (seen) set is empty")
    tax = taxonomy or load_taxonomy()
    out = np.empty(len(wnids), dtype=np.float64)
    for start in range(0, len(wnids), chunk_size):
        block = similarity(
            measure, wnids[start : start + chunk_size], reference, taxonomy=tax, **kwargs
        )
        out[start : start + len(block)] = block.max(axis=1) if block.size else -math.inf
    return out
