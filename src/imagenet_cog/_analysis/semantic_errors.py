"""Knowledge-driven error analysis: where in WordNet a classifier's errors land.

:func:`semantic_errors` measures how far the predicted concepts are from the
true ones with the similarity measures, and explains the top confusions of
each class with the WordNet path that joins them (:class:`Confusion`).
Public names are re-exported by :mod:`imagenet_cog.analysis`.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from .._base import concat_ranges
from .._optional_dependencies import require
from ..measures import (
    get_measure,
    lch_similarity,
    measure_name,
    path_similarity,
    similarity,
)
from ..taxonomy import Ancestry, load_taxonomy
from .checks import _json_float

# Similarity matrix entries computed at once by semantic_errors.
_PAIR_BLOCK = 1 << 22


# ------------------------------------------------------ semantic error analysis
_GRAPH_KEYS = weakref.WeakKeyDictionary()


def _graph_keys(tax):
    """Sorted flat keys ``child·n + ancestor`` and ``child·n + parent`` of a taxonomy."""
    keys = _GRAPH_KEYS.get(tax)
    if keys is None:
        n = len(tax)
        anc = tax.ancestor_matrix
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(anc.indptr))
        anc_keys = rows * n + anc.indices  # sorted: CSR rows in order, indices sorted
        child = np.repeat(np.arange(n, dtype=np.int64), np.diff(tax.parent_ptr))
        parent_keys = np.sort(child * n + tax.parent_idx)
        keys = _GRAPH_KEYS[tax] = (anc_keys, parent_keys)
    return keys


def _lookup(sorted_keys, queries):
    """Positions of ``queries`` in ``sorted_keys`` and whether they were found."""
    pos = np.minimum(np.searchsorted(sorted_keys, queries), max(len(sorted_keys) - 1, 0))
    found = sorted_keys[pos] == queries if len(sorted_keys) else np.zeros(len(queries), bool)
    return pos, found


def _ancestor_distance(tax, x, k):
    """Hop distance from each node ``x`` up to ``k``; -1 when k is not an ancestor."""
    anc_keys, _ = _graph_keys(tax)
    pos, found = _lookup(anc_keys, x.astype(np.int64) * len(tax) + k)
    return np.where(found, tax.ancestor_matrix.data[pos].astype(np.int64) - 1, -1)


def _pair_relations(tax, a, b):
    """For pairs (a, b): b is a parent of a, b is a child of a, a and b share a parent.

    Parents are hypernyms and instance hypernyms, as everywhere in the taxonomy.
    """
    n = len(tax)
    _, parent_keys = _graph_keys(tax)
    hypernym = _lookup(parent_keys, a * n + b)[1]
    hyponym = _lookup(parent_keys, b * n + a)[1]
    ptr, idx = tax.parent_ptr, tax.parent_idx
    pa = concat_ranges(ptr[a], ptr[a + 1])
    owner_a = np.repeat(np.arange(len(a), dtype=np.int64), ptr[a + 1] - ptr[a])
    pb = concat_ranges(ptr[b], ptr[b + 1])
    owner_b = np.repeat(np.arange(len(b), dtype=np.int64), ptr[b + 1] - ptr[b])
    shared = np.isin(owner_a * n + idx[pa], owner_b * n + idx[pb])
    sibling = np.bincount(owner_a[shared], minlength=len(a)) > 0
    return sibling, hypernym, hyponym


def _common_subsumer(tax, a, b):
    """The node k joining a and b by the shortest path, and that path's length.

    k minimises ``d(a, k) + d(b, k)`` over common ancestors (the distance of
    the path and Leacock-Chodorow measures); ties go to the larger
    ``max_depth`` (the more specific concept), then to the lower node index
    (wnid order in the bundled taxonomy). -1 where there is no common ancestor.
    """
    n = len(tax)
    fa, fb = Ancestry(tax, a), Ancestry(tax, b)
    ka = fa.owner.astype(np.int64) * n + fa.ancestor
    kb = fb.owner.astype(np.int64) * n + fb.ancestor
    common, ia, ib = np.intersect1d(ka, kb, assume_unique=True, return_indices=True)
    owner, node = common // n, common % n
    total = fa.dist[ia].astype(np.int64) + fb.dist[ib]
    order = np.lexsort((node, -tax.max_depth[node], total, owner))
    owner_sorted = owner[order]
    first = order[np.r_[True, owner_sorted[1:] != owner_sorted[:-1]]] if len(order) else order
    lcs = np.full(len(a), -1, dtype=np.int64)
    dist = np.full(len(a), -1, dtype=np.int64)
    lcs[owner[first]] = node[first]
    dist[owner[first]] = total[first]
    return lcs, dist


def _up_paths(tax, start, target):
    """Shortest upward paths from ``start`` to its ancestor ``target``, all at once.

    Returns an (n_pairs, longest + 1) array of nodes, padded with -1. Each step
    takes the first parent (hypernyms before instance hypernyms, in stored
    order) that is one hop closer to the target.
    """
    dist = _ancestor_distance(tax, start, target)
    if (dist < 0).any():
        raise ValueError("internal error: a path target is not an ancestor")
    width = int(dist.max()) + 1 if len(dist) else 1
    out = np.full((len(start), width), -1, dtype=np.int64)
    out[:, 0] = start
    cur = start.astype(np.int64).copy()
    ptr, idx = tax.parent_ptr, tax.parent_idx
    for step in range(1, width):
        active = np.flatnonzero(dist >= step)
        c = cur[active]
        cand = concat_ranges(ptr[c], ptr[c + 1])
        owner = np.repeat(np.arange(len(active)), ptr[c + 1] - ptr[c])
        par = idx[cand]
        ok = _ancestor_distance(tax, par, target[active][owner]) == dist[active][owner] - step
        hits = np.flatnonzero(ok)
        # Candidates come grouped by owner in parent order: keep the first hit.
        owners_hit, first = np.unique(owner[hits], return_index=True)
        if len(owners_hit) != len(active):  # pragma: no cover - BFS distances guarantee it
            raise ValueError("internal error: no parent one hop closer to the target")
        cur[active] = par[hits[first]]
        out[active, step] = cur[active]
    return out


def _readable(tax, node):
    return tax.lemmas[int(node)][0].replace("_", " ")


def _pair_measure(measure, tax, labels, pt, pp):
    """A measure on the pairs (labels[pt], labels[pp]); pt is sorted.

    The measure is evaluated as small matrices over the true labels of a block
    of pairs × their predicted labels, never pair by pair.
    """
    out = np.empty(len(pt), dtype=np.float64)
    rows_t = np.unique(pt)
    per = max(1, _PAIR_BLOCK // max(1, len(labels)))
    for s in range(0, len(rows_t), per):
        rows = rows_t[s : s + per]
        lo = np.searchsorted(pt, rows[0])
        hi = np.searchsorted(pt, rows[-1], side="right")
        cols = np.unique(pp[lo:hi])
        m = similarity(measure, labels[rows].tolist(), labels[cols].tolist(), taxonomy=tax)
        out[lo:hi] = m[np.searchsorted(rows, pt[lo:hi]), np.searchsorted(cols, pp[lo:hi])]
    return out


# Measures that are a function of the shortest path length d alone, as in
# path_similarity and lch_similarity.
_FROM_DISTANCE = {
    path_similarity: lambda d, tax: 1.0 / (d + 1),
    lch_similarity: lambda d, tax: -np.log((d + 1) / (2.0 * tax.lch_depth)),
}


@dataclass(frozen=True, eq=False)
class Confusion:
    """One of a class's top confusions, explained by a WordNet path.

    Attributes
    ----------
    true, pred : str
        wnids of the true and the predicted concept.
    count : int
        Test samples of ``true`` predicted as ``pred``.
    mf : float
        Misclassification frequency: ``count`` / all errors of ``true``.
    lcs : str or None
        The common subsumer the path goes through (None when the taxonomy has
        no common ancestor).
    path : tuple of str
        wnids from ``true`` up to ``lcs`` and down to ``pred``.
    path_names : tuple of str
        The first lemma of each node of ``path``, readable.
    sibling, hypernym, hyponym : bool
        ``pred`` shares a parent with ``true``, is a parent of it, is a child
        of it.
    similarity : dict of str to float
        The measures of :func:`semantic_errors` for this pair.

    Examples
    --------
    >>> from imagenet_cog.analysis import semantic_errors
    >>> res = semantic_errors(["n02123159"] * 2, ["n02123045", "n02123045"])
    >>> c = res.confusions["n02123159"][0]
    >>> c.pred, c.count, c.mf, c.sibling, c.explain()
    ('n02123045', 2, 1.0, True, 'tiger cat → [domestic cat] → tabby')
    """

    true: str
    pred: str
    count: int
    mf: float
    lcs: str | None
    path: tuple
    path_names: tuple
    sibling: bool
    hypernym: bool
    hyponym: bool
    similarity: dict

    @property
    def relation(self):
        """``"hypernym"``, ``"hyponym"``, ``"sibling"`` or ``""``."""
        for name in ("hypernym", "hyponym", "sibling"):
            if getattr(self, name):
                return name
        return ""

    def explain(self):
        """The path as text, the common subsumer in brackets.

        Examples
        --------
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159"], ["n02123045"])  # tiger cat as tabby
        >>> res.confusions["n02123159"][0].explain()
        'tiger cat → [domestic cat] → tabby'
        """
        if self.lcs is None:
            return f"{self.path_names[0]} ↛ {self.path_names[-1]} (no common ancestor)"
        up = self.path.index(self.lcs)
        return " → ".join(f"[{x}]" if i == up else x for i, x in enumerate(self.path_names))

    def to_dict(self):
        """JSON-safe dictionary."""
        return {
            "true": self.true,
            "pred": self.pred,
            "count": self.count,
            "mf": self.mf,
            "relation": self.relation,
            "lcs": self.lcs,
            "path": list(self.path),
            "path_names": list(self.path_names),
            "explanation": self.explain(),
            "similarity": {k: _json_float(v) for k, v in self.similarity.items()},
        }


class SemanticErrors:
    """Knowledge-driven error analysis, returned by :func:`semantic_errors`.

    Attributes
    ----------
    classes : ndarray of str
        The true classes (sorted wnids); per-class arrays follow this order.
    names : list of str
        Readable name (first lemma) of each class.
    per_class : dict of str to ndarray
        ``support``, ``n_errors``, ``accuracy``, one entry per measure (mean
        similarity of true and predicted concept over the class's errors),
        ``sibling_rate``, ``hypernym_rate``, ``hyponym_rate`` (shares of the
        class's errors). NaN for a class without errors.
    overall : dict
        ``n_samples``, ``n_errors``, ``accuracy`` and the same measures and
        rates over all errors (each error counts once).
    pairs : dict of str to ndarray
        One entry per distinct error (true ≠ predicted): ``true``, ``pred``
        (wnids), ``count``, ``mf`` (MF(t→p) = count / errors of t), each
        measure, the ``sibling``, ``hypernym`` and ``hyponym`` flags, and the
        ``lcs`` and ``distance`` of the joining path.
    confusions : dict of str to list of Confusion
        The ``top_k`` most frequent errors of each class, most frequent first
        (ties: lower predicted wnid first).
    measures : tuple of str
    top_k : int

    Examples
    --------
    >>> from imagenet_cog.analysis import semantic_errors
    >>> tiger_cat, tabby, lynx = "n02123159", "n02123045", "n02127052"
    >>> res = semantic_errors([tiger_cat] * 3, [tiger_cat, tabby, lynx])
    >>> res.overall["n_errors"], res.overall["sibling_rate"], res.mf(tiger_cat, lynx)
    (2, 0.5, 0.5)
    """

    def __init__(
        self, *, taxonomy, classes, per_class, overall, pairs, confusions, measures, top_k
    ):
        self.taxonomy = taxonomy
        self.classes = classes
        self.names = [_readable(taxonomy, i) for i in taxonomy.indices(classes)]
        self.per_class = per_class
        self.overall = overall
        self.pairs = pairs
        self.confusions = confusions
        self.measures = measures
        self.top_k = top_k
        self._pair_index = None

    def mf(self, true, pred):
        """Misclassification frequency MF(true → pred); 0 when never confused.

        Examples
        --------
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159"] * 3, ["n02123045", "n02123045", "n02124075"])
        >>> round(res.mf("n02123159", "n02123045"), 4)  # 2 of the 3 errors
        0.6667
        """
        if self._pair_index is None:
            self._pair_index = {
                (t, p): i
                for i, (t, p) in enumerate(
                    zip(self.pairs["true"].tolist(), self.pairs["pred"].tolist())
                )
            }
        i = self._pair_index.get((true, pred))
        return 0.0 if i is None else float(self.pairs["mf"][i])

    def __repr__(self):
        o = self.overall
        sims = ", ".join(f"{m}={_fmt(o[m])}" for m in self.measures)
        return (
            f"SemanticErrors(n_samples={o['n_samples']}, n_errors={o['n_errors']}, "
            f"classes={len(self.classes)}, {sims}, sibling_rate={_fmt(o['sibling_rate'])})"
        )

    def __str__(self):
        return self.to_text()

    def to_text(self, max_rows=20, sort_by="n_errors", paths=True):
        """A readable report: the overall means, then a table of classes.

        Parameters
        ----------
        max_rows : int or None
            Classes shown (None: all).
        sort_by : str
            A ``per_class`` key, largest first (``"n_errors"``), or
            ``"class"`` for wnid order.
        paths : bool
            List each shown class's top confusions with their WordNet path.

        Returns
        -------
        str

        Examples
        --------
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159", "n02123159"], ["n02123159", "n02123045"])
        >>> print(res.to_text())  # doctest: +NORMALIZE_WHITESPACE
        1 errors in 2 predictions (accuracy 50.0%), 1 true classes
        over all errors: path 0.333  lch 2.539  wup 0.875  sibling 100.0%  hypernym 0.0%  hyponym 0.0%
        class                        n    err    acc   path    lch    wup    sib  top confusions (MF)
        n02123159 tiger cat          2      1  50.0%  0.333  2.539  0.875 100.0%  tabby 100%
            tiger cat → [domestic cat] → tabby  (1, MF 100%, sibling)
        """
        o, pc = self.overall, self.per_class
        lines = [
            (
                f"{o['n_errors']} errors in {o['n_samples']} predictions "
                f"(accuracy {_pct(o['accuracy'])}), {len(self.classes)} true classes"
            ),
            "over all errors: "
            + "  ".join(f"{m} {_fmt(o[m])}" for m in self.measures)
            + f"  sibling {_pct(o['sibling_rate'])}  hypernym {_pct(o['hypernym_rate'])}"
            + f"  hyponym {_pct(o['hyponym_rate'])}",
        ]
        if sort_by == "class":
            order = np.arange(len(self.classes))
        elif sort_by in pc:
            key = np.nan_to_num(pc[sort_by].astype(float), nan=-np.inf)
            order = np.lexsort((np.arange(len(key)), -key))
        else:
            raise ValueError(f"sort_by must be 'class' or one of {list(pc)}, got {sort_by!r}")
        shown = order if max_rows is None else order[:max_rows]
        head = f"{'class':<30} {'n':>4} {'err':>6} {'acc':>6}"
        head += "".join(f" {m[:6]:>6}" for m in self.measures)
        lines.append(head + f" {'sib':>6}  top confusions (MF)")
        for i in shown.tolist():
            w = self.classes[i]
            conf = self.confusions.get(w, [])
            tops = ", ".join(
                f"{_readable(self.taxonomy, self.taxonomy.index[c.pred])} {c.mf:.0%}" for c in conf
            )
            row = f"{w} {self.names[i][:20]:<20} {pc['support'][i]:>4} {pc['n_errors'][i]:>6}"
            row += f" {_pct(pc['accuracy'][i]):>6}"
            row += "".join(f" {_fmt(pc[m][i]):>6}" for m in self.measures)
            lines.append(row + f" {_pct(pc['sibling_rate'][i]):>6}  {tops}")
            if paths:
                for c in conf:
                    rel = f", {c.relation}" if c.relation else ""
                    lines.append(f"    {c.explain()}  ({c.count}, MF {c.mf:.0%}{rel})")
        if len(shown) < len(order):
            lines.append(
                f"({len(shown)} of {len(order)} classes shown, sorted by {sort_by}; "
                "to_text(max_rows=None) shows all)"
            )
        return "\n".join(lines)

    def to_dict(self):
        """Everything as JSON-safe built-in types (NaN becomes None).

        Returns
        -------
        dict
            ``overall``, ``measures``, ``top_k``, and ``classes``: one dict per
            class with its per-class values and ``confusions``.

        Examples
        --------
        >>> import json
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159"], ["n02123045"])
        >>> d = res.to_dict()
        >>> d["classes"][0]["confusions"][0]["path_names"]
        ['tiger cat', 'domestic cat', 'tabby']
        >>> _ = json.dumps(d, allow_nan=False)
        """
        classes = []
        for i, w in enumerate(self.classes.tolist()):
            row = {"wnid": w, "name": self.names[i]}
            for key, values in self.per_class.items():
                v = values[i]
                row[key] = int(v) if values.dtype.kind in "iu" else _json_float(v)
            row["confusions"] = [c.to_dict() for c in self.confusions.get(w, [])]
            classes.append(row)
        overall = {
            k: (v if isinstance(v, int) else _json_float(v)) for k, v in self.overall.items()
        }
        return {
            "overall": overall,
            "measures": list(self.measures),
            "top_k": self.top_k,
            "classes": classes,
        }

    def to_frame(self, kind="classes"):
        """A pandas DataFrame (pandas is optional).

        Parameters
        ----------
        kind : {"classes", "pairs", "confusions"}
            One row per true class, per distinct error pair, or per top
            confusion (with its path).

        Returns
        -------
        pandas.DataFrame

        Examples
        --------
        >>> from imagenet_cog.analysis import semantic_errors
        >>> res = semantic_errors(["n02123159", "n02123159"], ["n02123045", "n02123159"])
        >>> res.to_frame()[["name", "n_errors", "sibling_rate"]]  # doctest: +NORMALIZE_WHITESPACE
                        name  n_errors  sibling_rate
        wnid
        n02123159  tiger cat         1           1.0
        """
        pd = require("pandas", "to_frame()", alternative="use to_dict()")
        if kind == "classes":
            df = pd.DataFrame({"wnid": self.classes, "name": self.names, **self.per_class})
            return df.set_index("wnid")
        if kind == "pairs":
            return pd.DataFrame(self.pairs)
        if kind == "confusions":
            rows = [
                {k: v for k, v in c.to_dict().items() if k != "similarity"} | c.similarity
                for w in self.classes.tolist()
                for c in self.confusions.get(w, [])
            ]
            return pd.DataFrame(rows)
        raise ValueError(f"kind must be 'classes', 'pairs' or 'confusions', got {kind!r}")


def _fmt(x):
    return "nan" if x is None or not math.isfinite(float(x)) else f"{float(x):.3f}"


def _pct(x):
    return "-" if x is None or not math.isfinite(float(x)) else f"{float(x):.1%}"


def _wnid_labels(y, classes, name):
    y = y.detach().cpu().numpy() if hasattr(y, "detach") else np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {y.shape}")
    if len(y) == 0:
        return y.astype(str)
    if classes is not None:
        if y.dtype.kind not in "iu":
            raise ValueError(f"with classes=, {name} must hold class indices, got {y.dtype}")
        classes = np.asarray(classes)
        if y.min() < 0 or y.max() >= len(classes):
            raise ValueError(
                f"{name} has class indices outside [0, {len(classes)}) of the {len(classes)} "
                "classes given"
            )
        return classes[y].astype(str)
    if y.dtype.kind not in "UO":
        raise ValueError(
            f"{name} must hold wnids such as 'n02123159', got {y.dtype} values; for class "
            "indices pass classes= (the wnid of each index)"
        )
    return y.astype(str)


def semantic_errors(
    y_true, y_pred, taxonomy=None, top_k=5, *, classes=None, measures=("path", "lch", "wup")
):
    """Where in WordNet a classifier's errors land (Lymperaiou et al., 2023).

    For every error (true concept t, predicted p, t ≠ p) this measures the
    WordNet similarity of t and p, whether p is a sibling of t (they share an
    immediate parent), a 1-hop hypernym (p is a parent of t) or a 1-hop
    hyponym (p is a child of t), and the misclassification frequency
    ``MF(t→p) = #(t predicted as p) / #(errors of t)``. Each class's ``top_k``
    confusions are explained by the WordNet path joining t and p.

    Work is done once per distinct (t, p) pair (``np.unique`` over pair
    codes), never per sample: the measures are small matrices from
    :func:`~imagenet_cog.similarity` over true × predicted
    classes, and the counts are ``bincount`` sums. 50,000 predictions over
    the 1000 IN-1K classes take well under a second once the taxonomy is
    loaded.

    Definitions:

    - Parents are hypernyms and instance hypernyms. With several parents, t
      and p are siblings when they share at least one.
    - The path joining t and p goes up from t to a common subsumer k, then
      down to p. k minimises ``d(t, k) + d(p, k)``, so the path has the
      length behind the path and Leacock-Chodorow similarities (NLTK's
      ``shortest_path_distance``); ties go to the deeper k (larger
      ``max_depth``), then to the lower wnid. This k can differ from NLTK's
      ``lowest_common_hypernyms``, which takes the deepest common ancestor
      whatever the path length: tiger cat and Mexican hairless join through
      *domestic animal* (4 hops), not *carnivore* (7 hops).
    - Means are over errors, each error counting once; per class over the
      errors of that class.

    Parameters
    ----------
    y_true, y_pred : array-like of str, shape (n_samples,)
        wnids (``"n"`` + 8-digit WordNet 3.0 offset), or class indices with
        ``classes``.
    taxonomy : Taxonomy, optional
        Defaults to the bundled WordNet 3.0 taxonomy.
    top_k : int
        Confusions kept per class.
    classes : sequence of str, optional
        The wnid of each class index, when the labels are indices.
    measures : sequence of str or callable
        Similarity measures (any name of
        :func:`~imagenet_cog.available_measures`); path,
        Leacock-Chodorow and Wu-Palmer by default.

    Returns
    -------
    SemanticErrors

    Examples
    --------
    >>> from imagenet_cog.analysis import semantic_errors
    >>> tiger_cat, tabby, lynx = "n02123159", "n02123045", "n02127052"
    >>> res = semantic_errors([tiger_cat] * 4, [tiger_cat, tabby, tabby, lynx])
    >>> res.overall["n_errors"], round(res.overall["sibling_rate"], 4)  # tabby is a sibling
    (3, 0.6667)
    >>> round(res.mf(tiger_cat, tabby), 4), round(res.overall["path"], 4)  # (1/3 + 1/3 + 1/5) / 3
    (0.6667, 0.2889)
    >>> res.confusions[tiger_cat][1].explain()
    'tiger cat → domestic cat → [cat] → wildcat → lynx'
    """
    tax = taxonomy or load_taxonomy()
    if not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    measures = tuple(measures)
    names = tuple(measure_name(m) for m in measures)
    # Measure names become keys next to these in per_class, overall and pairs.
    reserved = {"true", "pred", "count", "mf", "lcs", "distance", "support", "accuracy"}
    reserved |= {"n_errors", "n_samples", "sibling", "hypernym", "hyponym"}
    reserved |= {f"{x}_rate" for x in ("sibling", "hypernym", "hyponym")}
    if len(set(names)) != len(names) or reserved & set(names):
        raise ValueError(f"measure names must be distinct and not one of {sorted(reserved)}")
    y_true = _wnid_labels(y_true, classes, "y_true")
    y_pred = _wnid_labels(y_pred, classes, "y_pred")
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} labels but y_pred has {len(y_pred)}")
    n = len(y_true)
    if n == 0:
        raise ValueError("no predictions to analyse")

    labels, inv = np.unique(np.concatenate([y_true, y_pred]), return_inverse=True)
    nodes = tax.indices(labels.tolist())  # a clear error names unknown wnids
    n_labels = len(labels)
    t, p = inv[:n].astype(np.int64), inv[n:].astype(np.int64)
    wrong = t != p
    support = np.bincount(t, minlength=n_labels)
    n_err = np.bincount(t[wrong], minlength=n_labels)
    codes, count = np.unique(t[wrong] * n_labels + p[wrong], return_counts=True)
    pt, pp = codes // n_labels, codes % n_labels  # sorted by pt, then pp

    sibling, hypernym, hyponym = _pair_relations(tax, nodes[pt], nodes[pp])
    lcs, distance = _common_subsumer(tax, nodes[pt], nodes[pp])
    sims = {}
    for name, m in zip(names, measures):
        from_distance = _FROM_DISTANCE.get(get_measure(m))
        if from_distance is not None and (distance >= 0).all():
            # The joining path's length is NLTK's shortest_path_distance: no
            # need for a similarity matrix.
            sims[name] = from_distance(distance.astype(np.float64), tax)
        else:
            sims[name] = _pair_measure(m, tax, labels, pt, pp)
    mf = count / n_err[pt]

    # Per class (indexed by label code, then restricted to the true classes).
    true_codes = np.unique(t)
    total_err = int(wrong.sum())
    class_err = n_err[true_codes]

    def per_label(values):
        # Sums over the distinct pairs of each class, weighted by their counts.
        sums = np.bincount(pt, weights=count * values, minlength=n_labels)[true_codes]
        return np.divide(sums, class_err, out=np.full(len(sums), np.nan), where=class_err > 0)

    def overall_mean(values):
        return float((count * values).sum() / total_err) if total_err else math.nan

    per_class = {
        "support": support[true_codes],
        "n_errors": n_err[true_codes],
        "accuracy": 1 - n_err[true_codes] / support[true_codes],
    }
    per_class |= {name: per_label(v) for name, v in sims.items()}
    flags = {"sibling": sibling, "hypernym": hypernym, "hyponym": hyponym}
    per_class |= {f"{k}_rate": per_label(v.astype(float)) for k, v in flags.items()}
    overall = {"n_samples": n, "n_errors": total_err, "accuracy": 1 - total_err / n}
    overall |= {name: overall_mean(v) for name, v in sims.items()}
    overall |= {f"{k}_rate": overall_mean(v.astype(float)) for k, v in flags.items()}

    lcs_w = np.where(lcs >= 0, tax.wnids[np.maximum(lcs, 0)], "")
    pairs = {"true": labels[pt], "pred": labels[pp], "count": count, "mf": mf}
    pairs |= sims | flags | {"lcs": lcs_w, "distance": distance}

    # Top-k per class: by count (descending), then predicted wnid.
    order = np.lexsort((pp, -count, pt))
    group = pt[order]
    rank = np.arange(len(order)) - np.searchsorted(group, group)
    top = order[rank < top_k]
    confusions = {w: [] for w in labels[true_codes].tolist()}
    if len(top):
        a, b, k = nodes[pt[top]], nodes[pp[top]], lcs[top]
        has = k >= 0
        # Both halves of every path at once: t up to the subsumer, p up to it.
        ua, ub = _up_paths(tax, a[has], k[has]), _up_paths(tax, b[has], k[has])
        up_a = np.full((len(top), ua.shape[1]), -1, dtype=np.int64)
        up_b = np.full((len(top), ub.shape[1]), -1, dtype=np.int64)
        up_a[has], up_b[has] = ua, ub
        name_of = {}
        for row, j in enumerate(top.tolist()):
            if has[row]:
                up = up_a[row][up_a[row] >= 0].tolist()
                down = up_b[row][up_b[row] >= 0].tolist()[::-1][1:]
                path_nodes = up + down
            else:
                path_nodes = [int(a[row]), int(b[row])]
            for x in path_nodes:
                if x not in name_of:
                    name_of[x] = _readable(tax, x)
            confusions[labels[pt[j]]].append(
                Confusion(
                    true=str(labels[pt[j]]),
                    pred=str(labels[pp[j]]),
                    count=int(count[j]),
                    mf=float(mf[j]),
                    lcs=str(tax.wnids[k[row]]) if has[row] else None,
                    path=tuple(tax.wnids[path_nodes].tolist()),
                    path_names=tuple(name_of[x] for x in path_nodes),
                    sibling=bool(sibling[j]),
                    hypernym=bool(hypernym[j]),
                    hyponym=bool(hyponym[j]),
                    similarity={name: float(v[j]) for name, v in sims.items()},
                )
            )
    return SemanticErrors(
        taxonomy=tax,
        classes=labels[true_codes],
        per_class=per_class,
        overall=overall,
        pairs=pairs,
        confusions=confusions,
        measures=names,
        top_k=int(top_k),
    )


#: Top confusions of a domain kept in ``analysis.json``.
JSON_CONFUSIONS = 20


def semantic_summary(errors, seeds, shots):
    """The JSON summary of a domain's semantic errors (``errors``: one per seed of ``seeds``;
    the confusions are the first seed's), as ``analysis.json`` holds it."""
    overall = {}
    for key in errors[0].overall:
        vals = [e.overall[key] for e in errors]
        vals = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
        overall[key] = _json_float(np.mean(vals)) if vals else None
    for key in ("n_samples", "n_errors"):
        if len(errors) == 1:
            overall[key] = int(errors[0].overall[key])
    first = errors[0]
    pairs = first.pairs
    order = np.lexsort((pairs["pred"], pairs["true"], -pairs["count"]))[:JSON_CONFUSIONS]
    tops = []
    for i in order.tolist():
        t, p = str(pairs["true"][i]), str(pairs["pred"][i])
        conf = next((c for c in first.confusions.get(t, []) if c.pred == p), None)
        row = {"true": t, "pred": p, "count": int(pairs["count"][i]), "mf": float(pairs["mf"][i])}
        if conf is not None:
            row |= {"relation": conf.relation, "explanation": conf.explain()}
        tops.append(row)
    return {
        "shots": shots,
        "seeds": [int(s) for s in seeds],
        "overall": overall,
        "n_classes": len(first.classes),
        "top_confusions": tops,
        "confusions_seed": int(seeds[0]),
    }
