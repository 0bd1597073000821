"""The WordNet 3.0 noun taxonomy as arrays, and the ImageNet concept lists.

This is the first stage of the pipeline: every later stage asks it for wnids,
ancestors, depths and information content. The taxonomy ships inside the
package (``data/wordnet30_nouns.tsv.gz``, built by ``tools/build_taxonomy.py``
from NLTK's WordNet 3.0 reader), so nothing here needs NLTK data at run time.
"""

from __future__ import annotations

import functools
import gzip
import os
import shutil
from importlib import resources
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ._base import WNID_RE, concat_ranges, data_path
from ._fileio import atomic_write_bytes

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []

#: ``entity.n.01``, the root of every WordNet 3.0 noun.
ROOT_WNID = "n00001740"

_FORMAT_LINE = "# imagenet_cog taxonomy v1"
_COLUMNS = ("wnid", "name", "hypernyms", "instance_hypernyms", "lemmas", "gloss")


class Taxonomy:
    """WordNet noun synsets with their hypernym graph, stored as arrays.

    Nodes are numbered ``0..n-1``. ``wnids[i]`` is the wnid of node ``i`` and
    ``index[wnid]`` gives ``i`` back. Parents are hypernyms and instance
    hypernyms, stored in compressed sparse row form (``parent_ptr``,
    ``parent_idx``), so that graph work is vectorized.

    Parameters
    ----------
    wnids : sequence of str
        ``"n"`` followed by the 8-digit synset offset.
    names : sequence of str
        NLTK synset names such as ``"dog.n.01"``.
    lemmas : sequence of sequence of str
        Lemma names of each synset, in WordNet order.
    glosses : sequence of str
        The definition of each synset.
    hypernyms, instance_hypernyms : sequence of sequence of str
        Parent wnids of each synset. Every parent must be a node too. The order
        is kept as given (:meth:`from_nltk` sorts them by wnid).
    lch_depth : int, optional
        The depth constant of the Leacock-Chodorow measure: NLTK uses the
        largest ``max_depth`` over *all* noun synsets of the WordNet version.
        Defaults to the largest ``max_depth`` of this taxonomy.
    source : str, optional
        Where the data came from, for provenance.

    Examples
    --------
    >>> from imagenet_cog import load_taxonomy
    >>> tax = load_taxonomy()
    >>> tax.name("n02123159"), tax.lemma_names("n02123159")
    ('tiger_cat.n.02', ('tiger_cat',))
    >>> tax.parents("n02123159")
    ['n02121808']
    """

    def __init__(
        self,
        wnids,
        names,
        lemmas,
        glosses,
        hypernyms,
        instance_hypernyms,
        lch_depth=None,
        source="",
    ):
        self.wnids = np.asarray(wnids, dtype="<U9")
        n = len(self.wnids)
        if not (len(names) == len(lemmas) == len(glosses) == n):
            raise ValueError("wnids, names, lemmas and glosses differ in length")
        if len(hypernyms) != n or len(instance_hypernyms) != n:
            raise ValueError("hypernyms and instance_hypernyms need one entry per wnid")
        self.index = {w: i for i, w in enumerate(self.wnids.tolist())}
        if len(self.index) != n:
            raise ValueError("duplicate wnids in the taxonomy")
        self.names = list(names)
        self.lemmas = [tuple(x) for x in lemmas]
        self.glosses = list(glosses)
        self.source = source
        child, parent, instance = [], [], []
        for flag, lists in ((False, hypernyms), (True, instance_hypernyms)):
            counts = np.fromiter((len(x) for x in lists), dtype=np.int64, count=n)
            flat = [p for x in lists for p in x]
            child.append(np.repeat(np.arange(n), counts))
            parent.append(self.indices(flat) if flat else np.zeros(0, dtype=np.int64))
            instance.append(np.full(len(flat), flag))
        self._set_parents(np.concatenate(child), np.concatenate(parent), np.concatenate(instance))
        self._lch_depth = lch_depth
        self._ic_cache = {}

    def _set_parents(self, child, parent, is_instance):
        # Hypernyms first, then instance hypernyms, each in the given order.
        order = np.lexsort((np.arange(len(child)), is_instance, child))
        self.parent_idx = parent[order].astype(np.int64)
        self.parent_is_instance = is_instance[order].astype(bool)
        counts = np.bincount(child, minlength=len(self.wnids))
        self.parent_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    # ------------------------------------------------------------------ basics
    def __len__(self):
        return len(self.wnids)

    def __contains__(self, wnid):
        return wnid in self.index

    def __repr__(self):
        return f"Taxonomy({len(self)} synsets, source={self.source!r})"

    def indices(self, wnids):
        """Node indices of ``wnids``; a clear ``ValueError`` names unknown ones.

        Parameters
        ----------
        wnids : str or iterable of str

        Returns
        -------
        ndarray of int64

        Examples
        --------
        >>> from imagenet_cog import load_taxonomy
        >>> tax = load_taxonomy()
        >>> tax.indices(["n00001740"]).tolist() == [tax.index["n00001740"]]
        True
        """
        if isinstance(wnids, str):
            wnids = [wnids]
        index = self.index
        out = np.fromiter((index.get(w, -1) for w in wnids), dtype=np.int64)
        if (out < 0).any():
            wnids = list(wnids)
            bad = [w for w, i in zip(wnids, out.tolist()) if i < 0]
            malformed = [w for w in bad if not isinstance(w, str) or not WNID_RE.match(w)]
            what = "malformed wnid" if malformed else "unknown wnid"
            shown = ", ".join(repr(w) for w in bad[:5])
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            raise ValueError(
                f"{what}{'s' if len(bad) > 1 else ''} {shown}{more}: not a noun synset "
                f"of this taxonomy ({self.source or 'custom'}); a wnid is 'n' followed "
                "by the 8-digit WordNet 3.0 offset, e.g. 'n02123159'"
            )
        return out

    def name(self, wnid):
        """NLTK synset name, e.g. ``'tiger_cat.n.02'``."""
        return self.names[self.indices(wnid)[0]]

    def lemma_names(self, wnid):
        """Lemma names of ``wnid`` in WordNet order."""
        return self.lemmas[self.indices(wnid)[0]]

    def gloss(self, wnid):
        """The WordNet definition of ``wnid``."""
        return self.glosses[self.indices(wnid)[0]]

    def parents(self, wnid):
        """Hypernyms then instance hypernyms of ``wnid``, as wnids."""
        i = self.indices(wnid)[0]
        return self.wnids[self.parent_idx[self.parent_ptr[i] : self.parent_ptr[i + 1]]].tolist()

    # ------------------------------------------------------------ graph arrays
    @functools.cached_property
    def parent_matrix(self):
        """Sparse ``(n, n)`` matrix with a 1 at ``(child, parent)``."""
        n = len(self)
        data = np.ones(len(self.parent_idx), dtype=np.int8)
        return sp.csr_matrix((data, self.parent_idx, self.parent_ptr), shape=(n, n))

    @functools.cached_property
    def ancestor_matrix(self):
        """Sparse ``(n, n)`` CSR matrix of ancestors with hop distances.

        Entry ``(i, j)`` is ``1 + d`` where ``d`` is the length of the shortest
        upward path from node ``i`` to its ancestor ``j`` (a node is its own
        ancestor, at ``d = 0``), and absent when ``j`` is not an ancestor of
        ``i``. This is what NLTK's ``_shortest_hypernym_paths`` computes per
        synset, for every node at once (a breadth-first search by sparse
        products).
        """
        n = len(self)
        parents = self.parent_matrix.astype(np.int32)
        dist = sp.identity(n, dtype=np.int32, format="csr")
        frontier = dist
        hop = 0
        while frontier.nnz:
            hop += 1
            if hop > n:
                raise ValueError("the hypernym graph has a cycle")
            step = frontier @ parents
            step.data[:] = 1
            # Keep only nodes reached for the first time: their distance is hop.
            new = step - step.multiply(dist.astype(bool))
            new.eliminate_zeros()
            dist = dist + new * (hop + 1)
            frontier = new
        dist = dist.astype(np.int16).tocsr()
        dist.sort_indices()
        return dist

    @functools.cached_property
    def min_depth(self):
        """Length of the shortest hypernym path to a root, per node (NLTK ``min_depth``)."""
        anc = self.ancestor_matrix
        roots = self.parent_ptr[1:] == self.parent_ptr[:-1]
        coo = anc.tocoo()
        on_root = roots[coo.col]
        depth = np.full(len(self), np.iinfo(np.int64).max)
        np.minimum.at(depth, coo.row[on_root], coo.data[on_root].astype(np.int64) - 1)
        return depth

    @functools.cached_property
    def max_depth(self):
        """Length of the longest hypernym path to a root, per node (NLTK ``max_depth``)."""
        n = len(self)
        child = np.repeat(np.arange(n), np.diff(self.parent_ptr))
        parent = self.parent_idx
        depth = np.zeros(n, dtype=np.int64)
        for _ in range(n + 1):
            new = np.zeros(n, dtype=np.int64)
            np.maximum.at(new, child, depth[parent] + 1)
            if np.array_equal(new, depth):
                return depth
            depth = new
        raise ValueError("the hypernym graph has a cycle")  # pragma: no cover

    @property
    def lch_depth(self):
        """Depth constant of the Leacock-Chodorow measure (19 for WordNet 3.0 nouns)."""
        if self._lch_depth is None:
            return int(self.max_depth.max())
        return int(self._lch_depth)

    def ancestors(self, wnids, include_self=True):
        """Union of the ancestors of ``wnids`` (hypernyms and instance hypernyms).

        Returns
        -------
        ndarray of str
            Sorted wnids.
        """
        mask = self.ancestor_mask(wnids, include_self=include_self)
        return self.wnids[mask]

    def ancestor_mask(self, wnids, include_self=True):
        """Boolean mask over nodes: the ancestors of any of ``wnids``."""
        idx = self.indices(wnids)
        mask = np.zeros(len(self), dtype=bool)
        if len(idx):
            sub = self.ancestor_matrix[idx]
            mask[sub.indices] = True
            if not include_self:
                # A node counts only when it is a strict ancestor of some node.
                strict = sub.data > 1
                mask[:] = False
                mask[sub.indices[strict]] = True
        return mask

    def descendant_mask(self, wnids, include_self=True):
        """Boolean mask over nodes: the descendants of any of ``wnids``."""
        idx = self.indices(wnids)
        target = np.zeros(len(self), dtype=bool)
        target[idx] = True
        anc = self.ancestor_matrix
        hits = target[anc.indices]
        if not include_self:
            hits &= anc.data > 1
        row_of = np.repeat(np.arange(len(self)), np.diff(anc.indptr))
        mask = np.zeros(len(self), dtype=bool)
        mask[row_of[hits]] = True
        return mask

    def closure(self, wnids):
        """Boolean mask of the graph G: ``wnids`` and all their ancestors."""
        return self.ancestor_mask(wnids, include_self=True)

    def information_content(self, universe="imagenet"):
        """Information content over the graph G of a concept universe (the paper, supplement A.2).

        ``IC(c) = -log(|{c} ∪ descendants_G(c)| / |G|)``, where G is the
        universe plus all its ancestors. The root gets 0.

        Parameters
        ----------
        universe : "imagenet" or iterable of str
            ``"imagenet"`` is IN-21K Fall 2011 ∪ IN-1K (``|G| = 23,547``).

        Returns
        -------
        ndarray of float64, shape (n,)
            NaN for nodes outside G.

        Examples
        --------
        >>> from imagenet_cog import load_taxonomy
        >>> tax = load_taxonomy()
        >>> ic = tax.information_content()
        >>> int((~np.isnan(ic)).sum()), float(ic[tax.index["n00001740"]])
        (23547, 0.0)
        """
        key = universe_key(universe)
        if key not in self._ic_cache:
            in_g = self.closure(resolve_universe(universe))
            anc = self.ancestor_matrix
            rows = np.flatnonzero(in_g)
            starts, ends = anc.indptr[rows], anc.indptr[rows + 1]
            cols = anc.indices[concat_ranges(starts, ends)]
            counts = np.bincount(cols, minlength=len(self)).astype(np.float64)
            with np.errstate(divide="ignore"):
                ic = -np.log(counts / in_g.sum())
            ic[~in_g] = np.nan
            ic[in_g & (ic == 0)] = 0.0  # -0.0 at the root reads badly
            ic.setflags(write=False)
            self._ic_cache[key] = ic
        return self._ic_cache[key]

    # --------------------------------------------------------------- builders
    @classmethod
    def from_nltk(cls, reader=None, synsets=None):
        """Build a taxonomy from an NLTK WordNet reader.

        Parameters
        ----------
        reader : nltk WordNetCorpusReader, optional
            Defaults to :func:`nltk_wordnet`.
        synsets : iterable of str or NLTK synsets, optional
            Restrict to these synsets and all their ancestors. Defaults to every
            noun synset.

        Returns
        -------
        Taxonomy

        Examples
        --------
        >>> tax = Taxonomy.from_nltk(synsets=["n02123159"])  # doctest: +SKIP
        >>> len(tax)  # doctest: +SKIP
        14
        """
        if reader is None:
            reader = nltk_wordnet()
        if synsets is None:
            todo = list(reader.all_synsets("n"))
        else:
            todo = []
            for s in synsets:
                if isinstance(s, str):
                    if not WNID_RE.match(s):
                        raise ValueError(f"malformed wnid {s!r}")
                    s = reader.synset_from_pos_and_offset("n", int(s[1:]))
                todo.append(s)
            seen, stack = set(), list(todo)
            todo = []
            while stack:
                s = stack.pop()
                if s in seen:
                    continue
                seen.add(s)
                todo.append(s)
                stack.extend(s.hypernyms() + s.instance_hypernyms())
        todo.sort(key=lambda s: s.offset())

        def wnid(s):
            return f"n{s.offset():08d}"

        version = reader.get_version()
        import nltk

        return cls(
            wnids=[wnid(s) for s in todo],
            names=[s.name() for s in todo],
            lemmas=[s.lemma_names() for s in todo],
            glosses=[s.definition() for s in todo],
            # NLTK keeps pointers in sets, whose order changes from one process
            # to the next (string hashing is salted): sort them for stable files.
            hypernyms=[sorted(wnid(h) for h in s.hypernyms()) for s in todo],
            instance_hypernyms=[sorted(wnid(h) for h in s.instance_hypernyms()) for s in todo],
            lch_depth=reader._compute_max_depth("n", False),
            source=f"WordNet {version} via NLTK {nltk.__version__}",
        )

    def save(self, path):
        """Write the taxonomy as gzip-compressed, tab-separated text.

        The format: a first line ``# imagenet_cog taxonomy v1``, ``# key: value``
        header lines (``source``, ``lch_depth``), a column header, then one
        row per synset: wnid, NLTK name, hypernym wnids and instance hypernym
        wnids (space separated), lemma names (``|`` separated) and gloss.
        """
        path = Path(path)
        lines = [
            _FORMAT_LINE,
            f"# source: {self.source}",
            f"# lch_depth: {self.lch_depth}",
            "\t".join(_COLUMNS),
        ]
        for i, w in enumerate(self.wnids.tolist()):
            lo, hi = self.parent_ptr[i], self.parent_ptr[i + 1]
            par = self.parent_idx[lo:hi]
            inst = self.parent_is_instance[lo:hi]
            fields = [
                w,
                self.names[i],
                " ".join(self.wnids[par[~inst]].tolist()),
                " ".join(self.wnids[par[inst]].tolist()),
                "|".join(self.lemmas[i]),
                self.glosses[i],
            ]
            if any(("\t" in x or "\n" in x) for x in fields):
                raise ValueError(f"a field of {w} holds a tab or a newline")
            lines.append("\t".join(fields))
        payload = ("\n".join(lines) + "\n").encode("utf-8")
        if path.suffix == ".gz":
            # mtime=0 keeps the bytes reproducible from one build to the next.
            payload = gzip.compress(payload, compresslevel=9, mtime=0)
        atomic_write_bytes(path, payload)

    @classmethod
    def load(cls, path):
        """Read a file written by :meth:`save`."""
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
        lines = text.split("\n")
        if lines[0] != _FORMAT_LINE:
            raise ValueError(f"{path} is not an imagenet_cog taxonomy file")
        meta = {}
        pos = 1
        while lines[pos].startswith("# "):
            key, _, value = lines[pos][2:].partition(": ")
            meta[key] = value
            pos += 1
        if lines[pos].split("\t") != list(_COLUMNS):
            raise ValueError(f"{path}: unexpected columns {lines[pos]!r}")
        rows = [line.split("\t") for line in lines[pos + 1 :] if line]
        wnids, names, hyp, inst, lemmas, glosses = zip(*rows)
        # Split the parent columns in one go rather than row by row: this keeps
        # loading the 82k-synset taxonomy well under a second.
        n = len(wnids)
        tax = cls(
            wnids=wnids,
            names=names,
            lemmas=[()] * n,
            glosses=glosses,
            hypernyms=[()] * n,
            instance_hypernyms=[()] * n,
            lch_depth=int(meta["lch_depth"]) if "lch_depth" in meta else None,
            source=meta.get("source", str(path)),
        )
        tax.lemmas = _LazySplit(lemmas, "|")
        child, parent, instance = [], [], []
        for flag, column in ((False, hyp), (True, inst)):
            counts = np.fromiter((x.count(" ") + 1 if x else 0 for x in column), np.int64, n)
            flat = " ".join(column).split()
            child.append(np.repeat(np.arange(n), counts))
            parent.append(tax.indices(flat))
            instance.append(np.full(len(flat), flag))
        tax._set_parents(np.concatenate(child), np.concatenate(parent), np.concatenate(instance))
        return tax


class _LazySplit:
    """A read-only list of tuples, split from joined strings on first access."""

    def __init__(self, joined, sep):
        self._joined = joined
        self._sep = sep
        self._cache = {}

    def __len__(self):
        return len(self._joined)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        out = self._cache.get(i)
        if out is None:
            out = self._cache[i] = tuple(self._joined[i].split(self._sep))
        return out

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class Ancestry:
    """Ancestors of a list of nodes as flat arrays, grouped by node.

    ``ancestor[ptr[i]:ptr[i + 1]]`` are the ancestors of ``nodes[i]`` (itself included) and
    ``dist`` their distances in edges; ``owner`` maps each flat entry back to ``i``. The
    vectorised measures gather and reduce over these arrays.
    """

    def __init__(self, tax, nodes):
        anc = tax.ancestor_matrix
        self.nodes = nodes
        starts, ends = anc.indptr[nodes], anc.indptr[nodes + 1]
        flat = concat_ranges(starts, ends)
        self.ptr = np.concatenate([[0], np.cumsum(ends - starts)])
        self.owner = np.repeat(np.arange(len(nodes)), ends - starts)
        self.ancestor = anc.indices[flat].astype(np.int64)
        self.dist = (anc.data[flat] - 1).astype(np.int16)


@functools.lru_cache(maxsize=1)
def load_taxonomy():
    """The bundled WordNet 3.0 noun taxonomy (82,115 synsets), loaded once.

    Returns
    -------
    Taxonomy

    Examples
    --------
    >>> from imagenet_cog import load_taxonomy
    >>> len(load_taxonomy())
    82115
    """
    with resources.as_file(data_path("wordnet30_nouns.tsv.gz")) as path:
        return Taxonomy.load(path)


def _read_wnid_list(name):
    text = data_path(name).read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip() and line[0] != "#")


@functools.cache
def imagenet1k_wnids():
    """The 1000 ImageNet-1K (ILSVRC-2012) class wnids, sorted.

    Examples
    --------
    >>> from imagenet_cog import imagenet1k_wnids
    >>> len(imagenet1k_wnids())
    1000
    """
    return _read_wnid_list("imagenet1k_wnids.txt")


@functools.cache
def imagenet21k_wnids():
    """The 21,841 synsets of the ImageNet-21K Fall 2011 release, sorted.

    Examples
    --------
    >>> from imagenet_cog import imagenet21k_wnids
    >>> len(imagenet21k_wnids())
    21841
    """
    return _read_wnid_list("imagenet21k_fall2011_wnids.txt")


def resolve_universe(universe):
    """The wnids of a concept universe: ``"imagenet"`` or an explicit list."""
    if isinstance(universe, str):
        if universe == "imagenet":
            return sorted(set(imagenet21k_wnids()) | set(imagenet1k_wnids()))
        raise ValueError(f"unknown universe {universe!r}; use 'imagenet' or a list of wnids")
    universe = list(universe)
    if not universe:
        raise ValueError("the concept universe is empty")
    return universe


def universe_key(universe):
    """A hashable key for a universe, for caches."""
    if isinstance(universe, str):
        return universe
    return tuple(sorted(set(universe)))


# ---------------------------------------------------------------- NLTK access
_LEXNAMES = [
    "adj.all",
    "adj.pert",
    "adv.all",
    "noun.Tops",
    "noun.act",
    "noun.animal",
    "noun.artifact",
    "noun.attribute",
    "noun.body",
    "noun.cognition",
    "noun.communication",
    "noun.event",
    "noun.feeling",
    "noun.food",
    "noun.group",
    "noun.location",
    "noun.motive",
    "noun.object",
    "noun.person",
    "noun.phenomenon",
    "noun.plant",
    "noun.possession",
    "noun.process",
    "noun.quantity",
    "noun.relation",
    "noun.shape",
    "noun.state",
    "noun.substance",
    "noun.time",
    "verb.body",
    "verb.change",
    "verb.cognition",
    "verb.communication",
    "verb.competition",
    "verb.consumption",
    "verb.contact",
    "verb.creation",
    "verb.emotion",
    "verb.motion",
    "verb.perception",
    "verb.possession",
    "verb.social",
    "verb.stative",
    "verb.weather",
    "adj.ppl",
]
_LEX_POS = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}


def _default_cache_dir():
    base = os.environ.get("IMAGENET_COG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "imagenet_cog"
    )
    return Path(base)


def nltk_wordnet(dict_dir=None, data_home=None):
    """An NLTK WordNet 3.0 reader, set up from a WordNet dictionary folder if needed.

    NLTK's own ``wordnet`` corpus is used when it is installed. Otherwise the
    WordNet database files (Debian's ``wordnet-base`` puts them in
    ``/usr/share/wordnet``) are copied to ``data_home/corpora/wordnet`` with
    the ``lexnames`` file that Debian does not ship, and ``data_home`` is put
    on ``nltk.data.path``. Only the taxonomy build script and the tests need
    this; the library itself reads its bundled taxonomy.

    Parameters
    ----------
    dict_dir : path, optional
        A WordNet ``dict`` folder. Defaults to ``$WNSEARCHDIR`` or
        ``/usr/share/wordnet``.
    data_home : path, optional
        Where to put the NLTK copy. Defaults to ``~/.cache/imagenet_cog/nltk_data``.

    Returns
    -------
    nltk.corpus.reader.wordnet.WordNetCorpusReader

    Raises
    ------
    LookupError
        When neither NLTK's corpus nor a WordNet folder is found.

    Examples
    --------
    >>> wn = nltk_wordnet()  # doctest: +SKIP
    >>> wn.synset_from_pos_and_offset("n", 2123159).name()  # doctest: +SKIP
    'tiger_cat.n.02'
    """
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    if dict_dir is None:
        try:
            nltk.data.find("corpora/wordnet")
        except LookupError:
            pass
        else:
            from nltk.corpus import wordnet

            wordnet.ensure_loaded()
            return wordnet
        dict_dir = os.environ.get("WNSEARCHDIR") or "/usr/share/wordnet"
    dict_dir = Path(dict_dir)
    if not (dict_dir / "data.noun").is_file():
        raise LookupError(
            f"no WordNet 3.0 database in {dict_dir}: install Debian's wordnet-base "
            "(apt-get install wordnet-base wordnet-sense-index) or NLTK's wordnet corpus"
        )
    data_home = Path(data_home) if data_home else _default_cache_dir() / "nltk_data"
    target = data_home / "corpora" / "wordnet"
    if not (target / "lexnames").is_file():
        staging = data_home / "corpora" / f".wordnet-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for src in dict_dir.iterdir():
            if src.is_file() and not src.name.startswith("."):
                shutil.copyfile(src, staging / src.name)  # copies, never links
        lex = "".join(
            f"{i:02d}\t{name}\t{_LEX_POS[name.split('.')[0]]}\n" for i, name in enumerate(_LEXNAMES)
        )
        (staging / "lexnames").write_text(lex)
        try:
            os.replace(staging, target)
        except OSError:  # another process won the race
            shutil.rmtree(staging, ignore_errors=True)
    if str(data_home) not in nltk.data.path:
        nltk.data.path.insert(0, str(data_home))
    return WordNetCorpusReader(nltk.data.find("corpora/wordnet"), None)
