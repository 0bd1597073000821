"""Concept generalization levels: eligibility, ranking and the cut into levels.

Third stage of the pipeline (taxonomy → measures → **levels**). See the paper, Sec. 3.2–3.3 and supplement A.1
and the paper's supplement A.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np

from . import measures
from ._base import WNID_RE, data_path
from ._fileio import atomic_write_text, loads_json
from ._optional_dependencies import require
from ._version import __version__
from .taxonomy import imagenet1k_wnids, imagenet21k_wnids, load_taxonomy

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []

#: ``person.n.01``: its whole subtree is excluded (the paper, supplement A.1, step 3).
PERSON_WNID = "n00007846"
#: 732 train + 50 test images, the least any IN-1K class has (the paper, supplement A.1, step 2).
MIN_IMAGES = 782


class UnofficialLevelsWarning(UserWarning):
    """:func:`build_levels` ran without image counts: the min-images filter (the paper's
    supplement A.1, step 2) was skipped, so the levels are not the official ones.

    ``imagenet-cog levels`` says so in its summary instead, with the options that apply
    the filter.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", UnofficialLevelsWarning)
    ...     levels = build_levels(candidates=load_levels("official").levels[0][:40],
    ...                           n_levels=2, level_size=10)
    >>> levels.provenance["filters"][2]["detail"]
    'skipped: no image counts'
    """


class Levels:
    """Concept generalization levels: lists of wnids, most similar level first.

    Parameters
    ----------
    levels : list of list of str
        ``levels[0]`` is L1, the level most similar to the seen concepts.
    scores : dict, optional
        ``{wnid: similarity to the seen set}``.
    provenance : dict, optional
        How the levels were made: the measure, the filters with their counts,
        the library version.
    test_images : dict, optional
        ``{wnid: [relative image paths]}``: the fixed test images of each
        concept, for the official levels.

    Attributes
    ----------
    levels : list of list of str
    scores : dict
    provenance : dict
    test_images : dict or None

    Examples
    --------
    >>> from imagenet_cog import load_levels
    >>> levels = load_levels("official")
    >>> len(levels), [len(x) for x in levels.levels]
    (5, [1000, 1000, 1000, 1000, 1000])
    >>> levels.level_of("n01322508")
    'L1'
    """

    def __init__(self, levels, scores=None, provenance=None, test_images=None):
        self.levels = [list(map(str, level)) for level in levels]
        flat = [w for level in self.levels for w in level]
        if len(set(flat)) != len(flat):
            raise ValueError("a wnid appears in more than one level")
        self.scores = dict(scores or {})
        self.provenance = dict(provenance or {})
        self.test_images = test_images

    @property
    def names(self):
        """Level names, ``["L1", "L2", ...]``."""
        return [f"L{i + 1}" for i in range(len(self.levels))]

    def __len__(self):
        return len(self.levels)

    def __iter__(self):
        return iter(self.levels)

    def __getitem__(self, key):
        """A level's wnids, by name (``"L2"``) or by number (``2`` is L2)."""
        if isinstance(key, str):
            if key not in self.names:
                raise KeyError(f"unknown level {key!r}; levels are {', '.join(self.names)}")
            return self.levels[self.names.index(key)]
        if not 1 <= key <= len(self.levels):
            raise KeyError(f"level numbers run from 1 to {len(self.levels)}, got {key}")
        return self.levels[key - 1]

    @property
    def checksum(self):
        """sha256 of the levels' contents: one ``L<k><TAB>wnid`` line per concept, each level
        sorted. Neither the name, the scores nor the provenance count: two copies of the
        same levels have the same checksum wherever they are saved.

        Examples
        --------
        >>> a, b = Levels([["n2", "n1"], ["n3"]]), Levels([["n1", "n2"], ["n3"]])
        >>> a.checksum == b.checksum, a.checksum == Levels([["n3"], ["n1", "n2"]]).checksum
        (True, False)
        """
        import hashlib

        lines = [
            f"{name}\t{w}" for name, level in zip(self.names, self.levels) for w in sorted(level)
        ]
        return hashlib.sha256(("\n".join(lines) + "\n").encode("utf-8")).hexdigest()

    def level_of(self, wnid):
        """The name of the level that holds ``wnid``."""
        for name, level in zip(self.names, self.levels):
            if wnid in level:
                return name
        raise KeyError(f"{wnid} is in no level")

    def __repr__(self):
        sizes = ", ".join(f"{n}={len(x)}" for n, x in zip(self.names, self.levels))
        measure = self.provenance.get("measure", "?")
        return f"Levels({sizes}; measure={measure})"

    def rows(self):
        """``(level, wnid, score)`` tuples, level numbered from 1."""
        return [
            (i + 1, w, self.scores.get(w, math.nan))
            for i, level in enumerate(self.levels)
            for w in level
        ]

    def to_frame(self):
        """A pandas DataFrame with columns ``level``, ``wnid``, ``score``, ``name``.

        Needs pandas (the ``pandas`` extra).
        """
        pd = require("pandas", "to_frame()")
        tax = load_taxonomy()
        rows = self.rows()
        return pd.DataFrame(
            {
                "level": [f"L{r[0]}" for r in rows],
                "wnid": [r[1] for r in rows],
                "score": [r[2] for r in rows],
                "name": [tax.lemma_names(r[1])[0] if r[1] in tax else "" for r in rows],
            }
        )

    def save(self, path):
        """Write ``levels.tsv`` and ``provenance.json``.

        ``path`` is a folder (created if needed) or a ``.tsv`` file path, in
        which case the provenance goes beside it with a ``.json`` suffix.

        The TSV has a header and three columns: ``level`` (1 for L1, ...),
        ``wnid`` and ``score`` (the similarity to the seen set, ``nan`` when
        unknown), one row per concept, in level order. Both files are written
        atomically.

        Returns
        -------
        pathlib.Path
            The TSV file written.
        """
        tsv, meta = _level_paths(path, create=True)
        lines = ["level\twnid\tscore"]
        lines += [f"{level}\t{wnid}\t{score!r}" for level, wnid, score in self.rows()]
        atomic_write_text(tsv, "\n".join(lines) + "\n")
        atomic_write_text(meta, json.dumps(self.provenance, indent=2, sort_keys=True) + "\n")
        return tsv

    @classmethod
    def load(cls, path):
        """Read levels written by :meth:`save` (a folder or the ``.tsv`` file).

        A malformed file raises ``ValueError`` naming the file and the line.
        """
        tsv, meta = _level_paths(path, create=False)
        if not tsv.is_file():
            raise FileNotFoundError(f"no levels file at {tsv}")
        try:
            lines = tsv.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{tsv}: not a UTF-8 text file ({exc.reason})") from None
        if not lines:
            raise ValueError(f"{tsv}: empty file; expected a 'level<TAB>wnid[<TAB>score]' header")
        header = lines[0].split("\t")
        if header[:2] != ["level", "wnid"]:
            raise ValueError(
                f"{tsv}:1: expected a 'level<TAB>wnid[<TAB>score]' header, got {lines[0]!r}"
            )
        by_level, scores, where = OrderedDict(), {}, {}
        for n, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) < 2 or not parts[1].strip():
                raise ValueError(f"{tsv}:{n}: expected 'level<TAB>wnid[<TAB>score]', got {line!r}")
            try:
                level = int(parts[0].lstrip("L"))
            except ValueError:
                raise ValueError(f"{tsv}:{n}: bad level {parts[0]!r}") from None
            wnid = parts[1]
            if wnid in where:
                # Caught here, where the line is known, rather than by the constructor.
                raise ValueError(f"{tsv}:{n}: {wnid} is already listed on line {where[wnid]}")
            where[wnid] = n
            by_level.setdefault(level, []).append(wnid)
            if len(parts) > 2 and parts[2] not in ("", "nan"):
                try:
                    scores[wnid] = float(parts[2])
                except ValueError:
                    raise ValueError(f"{tsv}:{n}: bad score {parts[2]!r} for {wnid}") from None
        if not by_level:
            raise ValueError(f"{tsv}: no levels: the file has a header and no rows")
        if sorted(by_level) != list(range(1, len(by_level) + 1)):
            raise ValueError(f"{tsv}: levels must be numbered 1..n, got {sorted(by_level)}")
        provenance = {}
        if meta.is_file():
            try:
                provenance = loads_json(meta.read_text(encoding="utf-8"))
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
                raise ValueError(f"{meta}: not valid JSON ({exc})") from None
            if not isinstance(provenance, dict):
                raise ValueError(f"{meta}: expected a JSON object, got {type(provenance).__name__}")
        return cls([by_level[k] for k in sorted(by_level)], scores, provenance)


def _level_paths(path, create):
    path = Path(path)
    if path.suffix == ".tsv":
        return path, path.with_suffix(".json")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path / "levels.tsv", path / "provenance.json"


# ------------------------------------------------------------ official levels
@functools.lru_cache(maxsize=1)
def official_level_wnids():
    """The wnids of the five official levels, as published, without their similarities."""
    text = data_path("cog_levels.tsv").read_text(encoding="utf-8")
    levels = [[] for _ in range(5)]
    for line in text.splitlines()[2:]:
        level, _label, wnid = line.split("\t")
        levels[int(level) - 1].append(wnid)
    return tuple(tuple(x) for x in levels)


@functools.lru_cache(maxsize=1)
def official_test_images():
    """The test images of the 5000 CoG concepts, 50 each: a copy of the official lists.

    The lists ship with the package as copied from github.com/syuan8889/HTH (commit
    15d0fc5a), whose authors extracted them from the official ImageNet-CoG split file. This
    third-party copy has not been verified against the official
    ``cog_concepts_split_file.pkl``; ``data/PROVENANCE.rst`` says what was checked (5000
    distinct wnids in 5 disjoint levels, none an ImageNet-1K class, 50 images each, labels
    in the official order).

    Returns
    -------
    dict
        ``{wnid: (path, ...)}`` with paths relative to an IN-21K root, such as
        ``"n01322508/n01322508_2514.JPEG"``, in the order of the source lists.

    Examples
    --------
    >>> images = official_test_images()
    >>> len(images), len(images["n01322508"]), images["n01322508"][0]
    (5000, 50, 'n01322508/n01322508_2514.JPEG')
    """
    raw = data_path("cog_test_images.tsv.gz").read_bytes()
    out = {}
    for line in gzip.decompress(raw).decode("utf-8").splitlines()[2:]:
        _level, wnid, path = line.split("\t")
        out.setdefault(wnid, []).append(path)
    return {w: tuple(p) for w, p in out.items()}


@functools.lru_cache(maxsize=1)
def _official_levels():
    levels = [list(x) for x in official_level_wnids()]
    flat = [w for x in levels for w in x]
    scores = dict(zip(flat, measures.max_similarity("lin", flat, imagenet1k_wnids()).tolist()))
    provenance = {
        "name": "official",
        "source": "ImageNet-CoG levels as published (naver/cog), via github.com/syuan8889/HTH",
        "measure": "lin",
        "scores": "Lin similarity to IN-1K recomputed by imagenet_cog (the paper, supplement A.2)",
        "n_levels": 5,
        "level_size": 1000,
        "library_version": __version__,
    }
    return levels, scores, provenance


def load_levels(name="official"):
    """Load levels by name or from a file.

    Parameters
    ----------
    name : str or path
        ``"official"`` for the published ImageNet-CoG levels (with the test
        images of each concept, from a third-party copy of the official
        lists, in ``test_images``), or a folder/``.tsv`` written by
        :meth:`Levels.save` or ``imagenet-cog levels``.

    Returns
    -------
    Levels

    Examples
    --------
    >>> from imagenet_cog import load_levels
    >>> official = load_levels("official")
    >>> official["L5"][:2]
    ['n00120010', 'n00141669']
    """
    if isinstance(name, Levels):
        return name
    if str(name) == "official":
        levels, scores, provenance = _official_levels()
        return Levels(levels, scores, provenance, test_images=official_test_images())
    path = Path(name)
    if not path.exists():
        raise FileNotFoundError(f"no levels named {name!r}: use 'official' or a levels folder/file")
    return Levels.load(path)


# ------------------------------------------------------------- image counts
def count_images(root, *, progress=False):
    """Count the images of each concept in an ImageNet-21K copy.

    The images are those the one listing of a copy finds, with its checks: the count of a
    concept is the number of images :func:`~imagenet_cog.extract` would read of it.

    Parameters
    ----------
    root : path
        A folder with one sub-folder per wnid (``root/nXXXXXXXX/*.JPEG``), or
        with one tar file per wnid (``root/nXXXXXXXX.tar``, the Winter 2021
        release), or a copy in another layout the listing reads (webdataset
        shards, Parquet files). Tar members are counted from their headers,
        never extracted; a concept with both a folder and a tar is read from
        its folder.
    progress : bool
        Show a progress bar.

    Returns
    -------
    dict
        ``{wnid: number of images}``.

    Raises
    ------
    ValueError
        For a damaged or unsafe tar (cut short, a damaged header, a member named twice or
        outside the tar), or a concept without images; the message names the file.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "n02123159").mkdir()
    >>> for i in range(3):
    ...     _ = (root / "n02123159" / f"n02123159_{i}.JPEG").write_bytes(b"")
    >>> count_images(root)
    {'n02123159': 3}
    """
    from ._data.listing import list_root

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no image folder at {root}")
    images = list_root(root, None, progress=progress).images
    if not images:
        raise ValueError(f"{root} holds neither nXXXXXXXX/ folders nor nXXXXXXXX.tar files")
    return {wnid: len(found) for wnid, found in images.items()}


def read_counts(path):
    """Read a counts file: ``wnid`` and ``count`` per line (tab, comma or spaces).

    Blank lines, ``#`` comments and a header line are allowed.

    Parameters
    ----------
    path : path

    Returns
    -------
    dict
        ``{wnid: count}``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "counts.tsv"
    >>> _ = path.write_text("wnid count\\nn01322508 1350\\nn01322898,812\\n")
    >>> read_counts(path)
    {'n01322508': 1350, 'n01322898': 812}
    """
    counts = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2 or not parts[1].isdigit():
            if not counts and not WNID_RE.match(parts[0]):
                continue  # a header line
            raise ValueError(f"{path}:{n}: expected 'wnid count', got {line!r}")
        counts[parts[0]] = int(parts[1])
    if not counts:
        raise ValueError(f"{path}: no 'wnid count' lines")
    return counts


def _resolve_counts(image_counts, progress):
    if image_counts is None:
        return None, None
    if isinstance(image_counts, dict):
        return {str(k): int(v) for k, v in image_counts.items()}, "dict"
    path = Path(image_counts)
    if path.is_dir():
        return count_images(path, progress=progress), f"counted in {path}"
    if path.is_file():
        return read_counts(path), f"read from {path}"
    raise FileNotFoundError(
        f"image_counts {image_counts!r} is neither a counts file nor an image folder"
    )


# ------------------------------------------------------------- build_levels
def _resolve_wnids(value, what):
    if isinstance(value, str):
        if value == "imagenet1k":
            return list(imagenet1k_wnids()), value
        if value == "imagenet21k":
            return list(imagenet21k_wnids()), value
        if value == "cog":
            return [w for level in official_level_wnids() for w in level], value
        raise ValueError(f"unknown {what} {value!r}; use a list of wnids or a known name")
    wnids = list(dict.fromkeys(value))
    return wnids, f"{len(wnids)} given wnids"


def _resolve_blocklist(blocklist):
    if blocklist is None:
        return [], "none"
    if isinstance(blocklist, str):
        if blocklist == "cog":
            text = data_path("cog_blocklist_70.txt").read_text()
            return [
                x for x in text.split() if x.startswith("n")
            ], "cog (paper Table 2, 70 concepts)"
        path = Path(blocklist)
        if path.is_file():
            return [x for x in path.read_text().split() if not x.startswith("#")], str(path)
        raise ValueError(f"unknown blocklist {blocklist!r}; use 'cog', None, a list or a file")
    return list(blocklist), f"{len(list(blocklist))} given wnids"


def level_starts(n_eligible, n_levels, level_size):
    """Start ranks of the levels: the leftover concepts become equal gaps.

    With ``M`` ranked concepts, level ``k`` (from 0) starts at
    ``k·level_size + floor(k·(M − n_levels·level_size) / (n_levels − 1))``: L1
    starts at the top of the ranking, the last level ends at its bottom, and
    the gaps between consecutive levels differ by at most one concept.

    Parameters
    ----------
    n_eligible : int
        Number of ranked concepts.
    n_levels, level_size : int

    Returns
    -------
    list of int
        The rank at which each level starts.

    Examples
    --------
    >>> level_starts(5146, 5, 1000)
    [0, 1036, 2073, 3109, 4146]
    """
    leftover = n_eligible - n_levels * level_size
    if leftover < 0:
        raise ValueError(
            f"only {n_eligible} eligible concepts for {n_levels} levels of {level_size}"
        )
    if n_levels == 1:
        return [0]
    return [k * level_size + (k * leftover) // (n_levels - 1) for k in range(n_levels)]


def _too_few_message(steps, n_left, n_levels, level_size, not_counted):
    """The error of :func:`build_levels` when the filters leave too few concepts: which filter
    brought the pool under what the levels need, and how many each filter removed."""
    needed = n_levels * level_size
    removed = ", ".join(f"{s['step']} {s['removed']:,}" for s in steps if "removed" in s)
    text = (
        f"{n_left:,} eligible concepts remain after the filters, fewer than the {n_levels} "
        f"levels x {level_size} concepts asked for ({needed:,})"
    )
    culprit = next((s for s in steps if s["remaining"] < needed), steps[0])
    if "removed" in culprit:
        text += (
            f": the {culprit['step']} filter ({culprit['detail']}) removed "
            f"{culprit['removed']:,} of {culprit['remaining'] + culprit['removed']:,}"
        )
        if culprit["step"] == "min_images" and not_counted:
            text += (
                f", {not_counted:,} of them absent from the image counts (a partial copy of "
                "ImageNet-21K?)"
            )
    else:  # the candidate pool itself is too small
        text += f": the candidate pool holds {steps[0]['remaining']:,}"
    return f"{text}. Removed by each filter: {removed}"


def build_levels(
    measure="lin",
    seen="imagenet1k",
    candidates="imagenet21k",
    image_counts=None,
    min_images=MIN_IMAGES,
    exclude=(PERSON_WNID,),
    blocklist="cog",
    n_levels=5,
    level_size=1000,
    *,
    measure_kwargs=None,
    taxonomy=None,
    progress=False,
):
    """Rank unseen concepts by similarity to the seen ones and cut them into levels.

    Eligibility follows the paper's supplement A.1, in this order:

    1. start from ``candidates``; remove the seen concepts and every WordNet
       ancestor of a seen concept;
    2. remove concepts with fewer than ``min_images`` images (needs
       ``image_counts``; skipped with a warning without them);
    3. remove the subtrees of ``exclude`` (``person.n.01`` by default);
    4. remove every concept that is an ancestor of another still-eligible
       concept (keep leaves);
    5. remove the ``blocklist``.

    The eligible concepts are ranked by ``sim(c) = max over seen s of
    measure(c, s)``, most similar first, ties broken by wnid. L1 takes the
    first ``level_size``, the last level the last ``level_size``, and the
    concepts left over become equal gaps between levels (:func:`level_starts`).

    Parameters
    ----------
    measure : str or callable
        A registered measure name (``"lin"``, ``"wup"``, ``"jcn"``, ``"path"``,
        ``"lch"``, ``"w2v"`` or your own) or a measure callable.
    seen : "imagenet1k" or sequence of str
        The concepts the model has seen.
    candidates : "imagenet21k", "cog" or sequence of str
        The pool of unseen concepts. ``"cog"`` is the official 5000 concepts,
        re-ranked by ``measure`` (paper supplement D).
    image_counts : dict, path or None
        ``{wnid: n}``, a counts file (``wnid count`` per line), or an IN-21K
        copy (``nXXXXXXXX/`` folders or ``nXXXXXXXX.tar`` files) to count.
        Candidates missing from the counts have no images. Not needed with
        ``candidates="cog"``: the official concepts all pass this step.
    min_images : int
        Step 2's threshold, 782 = 732 train + 50 test.
    exclude : sequence of str
        Roots of subtrees to remove in step 3.
    blocklist : "cog", path, sequence of str or None
        Step 5's list; ``"cog"`` is the paper's 70 concepts.
    n_levels, level_size : int
    measure_kwargs : dict, optional
        Extra arguments of the measure, e.g. ``{"vectors": path}`` for w2v.
    taxonomy : Taxonomy, optional
    progress : bool
        Show progress while counting images.

    Returns
    -------
    Levels
        With ``provenance["filters"]`` listing each step's remaining count.

    Raises
    ------
    ValueError
        For an unknown wnid, an empty seen set, or more levels than eligible
        concepts allow.

    Examples
    --------
    >>> from imagenet_cog import build_levels
    >>> levels = build_levels(candidates="cog")
    >>> [len(x) for x in levels.levels]
    [1000, 1000, 1000, 1000, 1000]
    >>> levels.provenance["filters"][-1]["remaining"]
    5000
    """
    tax = taxonomy or load_taxonomy()
    seen_wnids, seen_name = _resolve_wnids(seen, "seen set")
    if not seen_wnids:
        raise ValueError("the seen set is empty: give at least one seen concept")
    pool, pool_name = _resolve_wnids(candidates, "candidates")
    if not pool:
        raise ValueError("the candidate pool is empty")
    tax.indices(seen_wnids)  # names unknown wnids
    pool_idx = tax.indices(pool)
    if n_levels < 1 or level_size < 1:
        raise ValueError(
            f"n_levels and level_size must be positive, got {n_levels} and {level_size}"
        )

    eligible = np.zeros(len(tax), dtype=bool)
    eligible[pool_idx] = True
    steps = [{"step": "candidates", "detail": pool_name, "remaining": int(eligible.sum())}]

    def record(step, detail, remove):
        before = int(eligible.sum())
        eligible[remove] = False
        steps.append(
            {
                "step": step,
                "detail": detail,
                "removed": before - int(eligible.sum()),
                "remaining": int(eligible.sum()),
            }
        )

    record("seen", "remove seen concepts and their ancestors", tax.ancestor_mask(seen_wnids))

    counts, counts_source = _resolve_counts(image_counts, progress)
    if counts is None and candidates == "cog":
        # The official concepts were chosen with their counts: all pass step 2.
        steps.append(
            {
                "step": "min_images",
                "detail": "not needed: the official CoG concepts "
                f"all have at least {min_images} images",
                "removed": 0,
                "remaining": int(eligible.sum()),
            }
        )
    elif counts is None:
        warnings.warn(
            f"no image counts: the min-images filter (fewer than {min_images} images, the "
            "paper's supplement A.1) is skipped, so these are not the official ImageNet-CoG "
            "levels (with the defaults, only 1,913 of their 5,000 concepts are official CoG "
            "concepts). extract uses the official levels unless given these, and evaluate "
            "the levels its features were extracted with. Pass "
            "image_counts= (a dict, a counts file, or your IN-21K copy) to apply the filter; "
            "no offline source of these counts is known.",
            UnofficialLevelsWarning,
            stacklevel=2,
        )
        steps.append(
            {
                "step": "min_images",
                "detail": "skipped: no image counts",
                "removed": 0,
                "remaining": int(eligible.sum()),
            }
        )
    else:
        have = np.zeros(len(tax), dtype=np.int64)
        known = [w for w in counts if w in tax.index]
        have[tax.indices(known)] = [counts[w] for w in known]
        counted = np.zeros(len(tax), dtype=bool)
        counted[tax.indices(known)] = True
        not_counted = int((eligible & ~counted).sum())  # for the error of a partial copy
        record("min_images", f"fewer than {min_images} images ({counts_source})", have < min_images)

    exclude = list(exclude or ())
    if exclude:
        mask = tax.descendant_mask(exclude)  # refuses an unknown wnid first
        # Named as people read them (person.n.01), not by offset.
        record("exclude", f"subtrees of {', '.join(map(tax.name, exclude))}", mask)
    else:
        steps.append(
            {"step": "exclude", "detail": "none", "removed": 0, "remaining": int(eligible.sum())}
        )

    record(
        "leaves",
        "remove ancestors of other eligible concepts",
        tax.ancestor_mask(tax.wnids[eligible], include_self=False) if eligible.any() else eligible,
    )

    block, block_name = _resolve_blocklist(blocklist)
    block_mask = np.zeros(len(tax), dtype=bool)
    if block:
        block_mask[tax.indices(block)] = True
    record("blocklist", block_name, block_mask)

    wnids = tax.wnids[eligible].tolist()
    needed = n_levels * level_size
    if len(wnids) < needed:
        raise ValueError(
            _too_few_message(
                steps, len(wnids), n_levels, level_size, not_counted if counts is not None else 0
            )
        )
    kwargs = dict(measure_kwargs or {})
    scores = measures.max_similarity(measure, wnids, seen_wnids, taxonomy=tax, **kwargs)
    if not np.isfinite(scores).all():
        # An infinite score ties with every other infinite one: the ranking would be the
        # wnids' order, not the measure's.
        bad = [f"{w} ({s})" for w, s in zip(wnids, scores.tolist()) if not math.isfinite(s)]
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ValueError(
            f"measure {measures.measure_name(measure)!r} gave {len(bad)} concept(s) a score "
            f"that is not a finite number (NaN or infinity): {', '.join(bad[:5])}{more}; "
            "levels rank the concepts by finite similarities"
        )
    order = np.lexsort((np.asarray(wnids), -scores))  # most similar first, ties by wnid
    ranked = [wnids[i] for i in order]
    starts = level_starts(len(ranked), n_levels, level_size)
    levels = [ranked[s : s + level_size] for s in starts]
    provenance = {
        "measure": measures.measure_name(measure),
        "measure_kwargs": {k: str(v) for k, v in kwargs.items()},
        "seen": seen_name,
        "n_seen": len(seen_wnids),
        "candidates": pool_name,
        "min_images": min_images if counts is not None else None,
        "image_counts": counts_source,
        "exclude": exclude,
        "blocklist": block_name,
        "filters": steps,
        "n_eligible": len(ranked),
        "n_levels": n_levels,
        "level_size": level_size,
        "level_starts": starts,
        "tie_break": "wnid ascending",
        "taxonomy": tax.source,
        "library_version": __version__,
    }
    return Levels(levels, dict(zip(wnids, scores.tolist())), provenance)
