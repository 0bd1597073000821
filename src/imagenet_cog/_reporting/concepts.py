"""Each concept as a reader explores it: its level, its similarity to IN-1K under the levels
the run used, its nearest IN-1K concept, each model's accuracy over the seeds and its most
frequent confusions, where they sit in WordNet.

Stage "results", the wing of what a reader reads: the per-concept data of the HTML report,
read from the predictions ``evaluate`` saves, and the run's own levels and the concepts'
names, which :func:`imagenet_cog.analysis.concept_accuracy` uses too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._grid import domain_key, normalize_shots
from .._runfolder import (
    LEVELS_DIR,
    PREDICTIONS_DIR,
    concept_hits,
    levels_copy_problems,
    prediction_cells,
    predictions_folder,
    read_config,
)
from .cells import unfinished_cells

__all__ = [
    "ConceptRows",
    "concept_names",
    "concept_rows",
    "nearest_seen",
    "run_levels",
]

#: Confusions of a concept shown per model.
TOP_CONFUSIONS = 3


def concept_names(wnids):
    """The readable name (first WordNet lemma, spaces for underscores) of each wnid; the wnid
    itself where the bundled WordNet does not know it.

    Examples
    --------
    >>> concept_names(["n01440764", "n99999999"]).tolist()
    ['tench', 'n99999999']
    """
    from ..taxonomy import load_taxonomy

    tax = load_taxonomy()
    return np.array(
        [
            tax.lemma_names(w)[0].replace("_", " ") if w in tax else str(w)
            for w in np.asarray(wnids).tolist()
        ],
        dtype=object,
    ).astype(str)


def _run_folder(predictions):
    folder = Path(predictions)
    if folder.name == PREDICTIONS_DIR and not (folder / "config.json").is_file():
        folder = folder.parent
    return folder


def run_levels(predictions, levels=None, config=None):
    """The levels an ``evaluate`` run was made with, as its ``config.json`` records them.

    Parameters
    ----------
    predictions : path
        The run folder (or its ``predictions/`` folder).
    levels : str, path or Levels, optional
        Given: checked against the recorded ones, by content. Not given: the recorded
        levels (the official ones when the run records none, as a folder of predictions
        alone does), read only from inside the run's folder: from the copy ``evaluate``
        keeps there (``levels/``, checked against its checksums and the run's), or from a
        path inside it the run recorded. A path it names elsewhere (a folder received from
        someone else can name any file of the reader's) is never read, and never quoted.
    config : dict, optional
        The run's ``config.json`` as already read (``{}`` for a run without one): it is not
        read again.

    Returns
    -------
    Levels

    Raises
    ------
    ValueError
        When ``levels`` are not the run's, or the run's levels are neither in a copy that
        matches its checksums nor inside its folder at the path it recorded.

    Examples
    --------
    >>> import tempfile
    >>> run_levels(tempfile.mkdtemp()).names  # no config.json: the official levels
    ['L1', 'L2', 'L3', 'L4', 'L5']
    """
    from ..levels import load_levels

    folder = _run_folder(predictions)
    if config is None:
        config = read_config(folder) if folder.is_dir() else None
    name = (config or {}).get("levels")
    sha = (config or {}).get("levels_sha256")
    if levels is not None:
        given = load_levels(levels)
        if sha is not None and given.checksum != sha:
            shown = levels if isinstance(levels, str) else "a Levels"
            raise ValueError(
                f"the levels given ({shown}) are not those the run in {folder} was made with "
                f"({name!r}, sha256 {sha[:12]}): leave levels= (--levels) out to use the run's "
                "own"
            )
        return given
    if name is None or sha is None:
        return load_levels("official")
    official = load_levels("official")
    if sha == official.checksum:
        return official
    made = f"the run in {folder} was made with the levels {name!r} (sha256 {sha[:12]})"
    copied = levels_copy_problems(folder, config or {})
    if copied is not None:
        found = None if copied else _loaded(folder / LEVELS_DIR)
        if found is not None and found.checksum == sha:
            return found
        said = copied[0] if copied else f"{folder / LEVELS_DIR} holds other levels"
        raise ValueError(
            f"{made}, and their copy in its folder does not match what the run recorded: "
            f"{said}; it is not read: give them with levels= (--levels)"
        )
    where = _inside(folder, name)
    if where is None:
        raise ValueError(
            f"{made}, which, outside the run's folder, is not read unless given (the folder "
            "keeps no copy of them): give them with levels= (--levels)"
        )
    found = _loaded(where)
    if found is not None and found.checksum == sha:
        return found
    raise ValueError(
        f"{made}, which are not at that path any more: give them with levels= (--levels)"
    )


def _loaded(path):
    """The levels at ``path``, or None where they are gone, emptied or not levels (the
    file is never quoted)."""
    from ..levels import load_levels

    try:
        return load_levels(path)
    except (OSError, ValueError):
        return None


def _inside(folder, name):
    """The levels path a run's ``config.json`` records, resolved in the run's folder (links
    followed), or None where it lies outside that folder."""
    try:
        root = Path(folder).resolve()
        path = (root / str(name)).resolve()  # an absolute name stays itself
    except (OSError, ValueError):  # a name no file system takes
        return None
    return path if path != root and path.is_relative_to(root) else None


def nearest_seen(wnids, levels):
    """``(nearest IN-1K wnids, their similarity)`` of each concept under the levels' measure:
    every IN-1K concept at the highest similarity, in wnid order (under Lin a quarter of the
    concepts have several, equally near); ``None`` where the measure cannot be computed here
    (one that needs its own files, such as word vectors, or a measure given as a function).

    Examples
    --------
    >>> from imagenet_cog import load_levels
    >>> [(wnids, round(sim, 3)) for wnids, sim in nearest_seen(["n01442972"],
    ...                                                        load_levels("official"))]
    [(('n01440764', 'n01443537'), 0.725)]
    """
    from .. import measures
    from ..taxonomy import imagenet1k_wnids

    measure = (levels.provenance or {}).get("measure")
    if not isinstance(measure, str) or not len(wnids):
        return None
    seen = np.asarray(imagenet1k_wnids())
    try:
        sims = measures.similarity(measure, list(wnids), seen.tolist())
    except (ValueError, TypeError, KeyError, OSError):
        return None
    best = sims.max(axis=1)
    # Equal but for rounding is a tie too: the measures compute each pair alike.
    tied = sims >= (best - 1e-12 * np.maximum(1.0, np.abs(best)))[:, None]
    return [(tuple(seen[row].tolist()), float(b)) for row, b in zip(tied, best)]


class _WordNet:
    """Names, parents and ancestors of wnids, each looked up once."""

    def __init__(self):
        from ..taxonomy import load_taxonomy

        self.tax = load_taxonomy()
        self._parents, self._ancestors = {}, {}

    def name(self, wnid):
        return self.tax.lemma_names(wnid)[0].replace("_", " ") if wnid in self.tax else wnid

    def parents(self, wnid):
        if wnid not in self._parents:
            self._parents[wnid] = set(self.tax.parents(wnid))
        return self._parents[wnid]

    def ancestors(self, wnid):
        if wnid not in self._ancestors:
            self._ancestors[wnid] = set(self.tax.ancestors([wnid], include_self=False).tolist())
        return self._ancestors[wnid]

    def relation(self, true, pred):
        """How ``pred`` sits in WordNet from ``true``: parent, child, sibling, ancestor,
        descendant, or ``""``."""
        if pred in self.parents(true):
            return "parent"
        if true in self.parents(pred):
            return "child"
        if self.parents(true) & self.parents(pred):
            return "sibling"
        if pred in self.ancestors(true):
            return "ancestor"
        if true in self.ancestors(pred):
            return "descendant"
        return ""


def _explained(wordnet, confusions):
    """``{true: [(pred, name, count, relation, distance)]}`` of each concept's most frequent
    confusions; the WordNet distances of a domain's pairs computed at once."""
    from .. import measures

    top = {t: preds[:TOP_CONFUSIONS] for t, preds in confusions.items()}
    trues = sorted(t for t in top if t in wordnet.tax)
    preds = sorted({p for t in trues for p, _ in top[t] if p in wordnet.tax})
    distance = {}
    if trues and preds:
        sims = measures.similarity("path", trues, preds)
        row, col = {t: i for i, t in enumerate(trues)}, {p: j for j, p in enumerate(preds)}
        for t in trues:
            for p, _ in top[t]:
                s = sims[row[t], col[p]] if p in col else 0.0
                if s > 0:
                    distance[(t, p)] = round(1 / s - 1)
    out = {}
    for t, pairs in top.items():
        out[t] = [
            (
                p,
                wordnet.name(p),
                n,
                wordnet.relation(t, p) if (t, p) in distance else "",
                distance.get((t, p)),
            )
            for p, n in pairs
        ]
    return out


@dataclass
class ConceptRows:
    """The per-concept data of the HTML report.

    Attributes
    ----------
    wnids, names, levels : list of str
        Every concept of the levels with predictions, by level, most similar first.
    similarity : list of float
        Its similarity to IN-1K under the levels the runs used.
    nearest : list of list of (str, str), or None
        Its nearest IN-1K concepts (wnid, name) under the levels' measure: several where
        they tie.
    models : list of str
        The models with predictions.
    accuracy : dict of str to list
        Per model, per concept: ``(mean, std, n_test)`` over the seeds, or None.
    confusions : dict of str to list
        Per model, per concept: its most frequent wrong predictions, each
        ``(wnid, name, count, relation, WordNet distance)``.
    shots : int or "all"
    seeds : dict of str to tuple
    notes : list of str
        What the reader should know of the data (levels that differ between runs, cells
        that did not finish...).
    """

    wnids: list
    names: list
    levels: list
    similarity: list
    nearest: list
    models: list
    accuracy: dict
    confusions: dict
    shots: object
    seeds: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def _read_cells(folder, shots):
    """``{domain: [(seed, path)]}`` of the saved predictions of one shots value, levels only."""
    found = {}
    for (domain, n, seed), path in prediction_cells(predictions_folder(folder)).items():
        if n == shots and domain != "in1k":
            found.setdefault(domain, []).append((seed, path))
    return {d: sorted(v) for d, v in found.items()}


def _confusions(paths):
    """``{true: [(pred, count)]}`` of the wrong predictions summed over the seeds' files."""
    pairs = {}
    for _, path in paths:
        with np.load(path, allow_pickle=False) as f:
            y_true, y_pred = f["y_true"].astype(str), f["y_pred"].astype(str)
        wrong = y_true != y_pred
        keys, counts = np.unique(
            np.stack([y_true[wrong], y_pred[wrong]], axis=1), axis=0, return_counts=True
        )
        for (t, p), n in zip(keys.tolist(), counts.tolist()):
            pairs[(t, p)] = pairs.get((t, p), 0) + int(n)
    out = {}
    for (t, p), n in sorted(pairs.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1])):
        out.setdefault(t, []).append((p, n))
    return out


def concept_rows(folders, shots="all", configs=None, levels=None):
    """The per-concept data of the models whose runs saved predictions.

    Parameters
    ----------
    folders : dict of str to path or list of paths
        ``{model: evaluate output folder}``, or ``{model: [folders]}`` for a model whose
        seeds were run in several folders (their predictions are read together, as the
        tables read their cells); models without saved predictions of ``shots`` are left
        out.
    shots : int or "all"
    configs : dict of str to dict, optional
        ``{model: its run's config.json as already read}`` (see :func:`run_levels`).
    levels : str, path or Levels, optional
        The levels of the first model's run (see :func:`run_levels`), checked by content;
        by default its own, read only from inside its folder.

    Returns
    -------
    ConceptRows or None
        None when no model has saved predictions of a level.

    Raises
    ------
    ValueError
        When ``levels`` are not the first model's run's.

    Examples
    --------
    >>> concept_rows({}) is None
    True
    """
    shots = normalize_shots(shots)
    folders = {m: [f] if isinstance(f, (str, Path)) else list(f) for m, f in folders.items() if f}
    cells, notes = {}, []
    for model, where in folders.items():
        found = {}
        for folder in where:
            try:
                read = _read_cells(folder, shots)
            except FileNotFoundError:
                continue
            unfinished = unfinished_cells(predictions_folder(folder))
            notes += [unfinished] if unfinished else []  # the finished cells are read
            for domain, paths in read.items():
                found[domain] = sorted(found.get(domain, []) + paths)
        if found:
            cells[model] = found
    # One model's folders hold one configuration (Results.load refuses others): the first
    # folder's levels are theirs.
    folders = {m: where[0] for m, where in folders.items()}
    if not cells:
        return None
    models = list(cells)
    configs = configs or {}
    given = levels
    try:
        levels = run_levels(folders[models[0]], config=configs.get(models[0]), levels=given)
    except ValueError as exc:  # the run's levels moved: the rest of the page still stands
        if given is not None:  # ...but levels the reader gives are theirs
            raise
        levels = None
        notes.append(f"{exc}; no similarity is shown")
    for model in models[1:] if levels is not None else ():
        try:  # checked by content against the levels found: nothing more is read
            run_levels(folders[model], config=configs.get(model), levels=levels)
        except ValueError:
            notes.append(
                f"{model}'s run used other levels than {models[0]}'s: each concept's similarity "
                f"is under {models[0]}'s"
            )
    scores = (levels.scores or {}) if levels is not None else {}
    accuracy, confusions, seeds, concepts = {}, {}, {}, {}
    wordnet = _WordNet()
    for model, domains in cells.items():
        accuracy[model], confusions[model] = {}, {}
        seeds[model] = tuple(sorted({s for paths in domains.values() for s, _ in paths}))
        for domain, paths in domains.items():
            per_seed = [concept_hits(path) for _, path in paths]
            wnids = per_seed[0][0]
            if any(not np.array_equal(c, wnids) for c, _, _ in per_seed):
                raise ValueError(f"the seeds of {model}'s {domain} saved other concepts")
            acc = np.stack([100.0 * h / n for _, h, n in per_seed])
            for i, w in enumerate(wnids.tolist()):
                concepts.setdefault(w, domain)
                accuracy[model][w] = (
                    float(acc[:, i].mean()),
                    float(acc[:, i].std()),
                    int(per_seed[0][2][i]),
                )
            confusions[model].update(_explained(wordnet, _confusions(paths)))
    order = sorted(
        concepts, key=lambda w: (domain_key(concepts[w]), -float(scores.get(w, np.nan)), w)
    )
    nearest = (nearest_seen(order, levels) if levels is not None else None) or [None] * len(order)
    names = concept_names(order).tolist()
    seen_names = concept_names([w for n in nearest if n for w in n[0]]).tolist()
    it = iter(seen_names)
    return ConceptRows(
        wnids=order,
        names=names,
        levels=[concepts[w] for w in order],
        similarity=[float(scores.get(w, np.nan)) for w in order],
        nearest=[[(w, next(it)) for w in n[0]] if n else None for n in nearest],
        models=models,
        accuracy={m: [accuracy[m].get(w) for w in order] for m in models},
        confusions={m: [confusions[m].get(w, []) for w in order] for m in models},
        shots=shots,
        seeds=seeds,
        notes=notes,
    )
