"""Results of the ImageNet-CoG protocol: tables, relative scores, exports and plots.

Stage "results" of the pipeline (... → probe → **results** → protocol → analysis). A
:class:`Results` holds per-seed cells (one linear probe's final test scores
for a model, domain, number of shots and seed) and/or already aggregated rows
(mean ± std over seeds, e.g. the paper's published tables). Everything a
person reads is derived from those: the paper-style tables, scores relative to
a baseline model, ranks, CSV/JSON/Markdown exports and the figures.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ._comparability import (
    PAPER_SOURCE,
    NotComparableError,
    comparability,
    published_cells,
)
from ._fileio import atomic_write_text
from ._grid import display_shots, domain_key, normalize_shots, shot_key
from ._optional_dependencies import require
from ._reporting.names import names_apart, read_runs, records_models, renamed, run_facts
from ._reporting.verdict import not_comparable_banner
from ._tables import check_name, format_analysis_table, printable, score_table

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []

_METRICS = ("top1", "top5", "val_top1")

#: How to show one of two runs of one name under another.
_NAME_ONE = "load one under another name (Results.load(names=...), report --name FOLDER=NAME)"
#: Keys of ``meta`` that hold one entry per model: an entry travels with its model's rows, so
#: that a subset or a merge never keeps one model's record under another's name.
_PER_MODEL_META = ("protocol", "categories", "analysis")


class Results:
    """Linear-probe results of one or more models over domains and shots.

    Parameters
    ----------
    records : iterable of dict, optional
        Per-seed cells, each with at least ``model``, ``domain``, ``shots``,
        ``seed`` and ``top1`` (percent); ``top5``, ``val_top1``, ``lr``, ``wd``
        and timings are kept when present. These are the lines of the
        ``runs.jsonl`` that :func:`~imagenet_cog.evaluate` writes.
    summaries : iterable of dict, optional
        Aggregated rows with ``model``, ``domain``, ``shots``, ``metric``,
        ``mean``, ``std`` and ``n`` (number of seeds), for sources that publish
        only means (the paper). A (model, domain, shots, metric) given both
        ways is an error.
    meta : dict, optional
        Anything worth keeping with the results: per-model protocol settings
        (``meta["protocol"][model]``), categories, sources.

    Notes
    -----
    The standard deviation over seeds is the population one (``ddof=0``),
    like the official ``print_results.py`` (``numpy.std``).

    Examples
    --------
    >>> from imagenet_cog import Results
    >>> cells = [
    ...     {"model": "mine", "domain": d, "shots": "all", "seed": s, "top1": t + s / 100}
    ...     for d, t in [("in1k", 75.0), ("L5", 50.0)] for s in (22, 37)
    ... ]
    >>> res = Results(cells)
    >>> res.mean("mine", "L5", "all")
    50.295
    >>> print(res.table(shots="all"))
    top-1 (%), all training images, mean ± std over seeds
    model       IN-1K          L5
    mine   75.3 ± 0.1  50.3 ± 0.1
    """

    def __init__(self, records=(), summaries=(), meta=None):
        self.records = []
        for rec in records:
            rec = dict(rec)
            for key in ("model", "domain", "shots", "top1"):
                if key not in rec:
                    raise ValueError(f"a result record lacks {key!r}: {printable(rec)}")
            # A name goes into every table and export: one that a terminal or LaTeX would
            # act on (a line break, an escape sequence) is refused here, once.
            check_name(rec["model"])
            check_name(rec["domain"], "domain")
            rec["shots"] = normalize_shots(rec["shots"])
            self.records.append(rec)
        #: The aggregated rows given (``summaries``), each with its ``metric``.
        self.summaries = []
        for row in summaries:
            row = dict(row)
            check_name(row["model"])
            check_name(row["domain"], "domain")
            row["shots"] = normalize_shots(row["shots"])
            row.setdefault("metric", "top1")
            self.summaries.append(row)
        self.meta = dict(meta or {})
        self._summary_cache = None
        # What load read of each run folder, for runs(): {folder: {config, records, ...}}.
        self._runs = {}

    # --------------------------------------------------------------- loading
    @classmethod
    def load(cls, *paths, model=None, names=None):
        """Read ``runs.jsonl`` files (or folders holding one) into Results.

        Parameters
        ----------
        *paths : path
            Files, or folders containing ``runs.jsonl``.
        model : str, optional
            One name for the cells of every path.
        names : dict, optional
            ``{folder (or its runs.jsonl): name}``, as ``report --name FOLDER=NAME``: shown,
            never written (each record keeps its written name beside, ``model_as_recorded``,
            and its checksum still checks).

        Notes
        -----

        An ``analysis.json`` beside a ``runs.jsonl`` (written by ``imagenet-cog analyze`` or
        :func:`imagenet_cog.analysis.analyze`) is read into ``meta["analysis"][model]``;
        :meth:`analysis_table` shows it.

        Cells of one model may come from several runs (seeds run on different machines) only
        when the runs' configurations agree (their versions aside): in any order, runs of
        one model with different configurations are refused (``ValueError`` naming the
        model, the paths and the fields), so a merge never reports one run's settings for
        another's numbers. Give such runs names of their own (``names=``). Two runs of
        different checkpoint files that got the same default name (their architecture and
        file stem) are told apart by the first digits of their weights' sha256
        (``resnet50-checkpoint-1a2b3c4d``); ``meta["run_folders"]`` records each model's
        folders.
        """
        records, meta, runs = read_runs(paths, model, names)
        out = cls(records, meta=meta)
        out._runs = runs
        return out

    # ------------------------------------------------------------- structure
    def _summary(self):
        if self._summary_cache is None:
            groups = {}
            for rec in self.records:
                for metric in _METRICS:
                    value = rec.get(metric)
                    if value is None:
                        continue
                    key = (rec["model"], rec["domain"], rec["shots"], metric)
                    groups.setdefault(key, []).append(float(value))
            rows = {}
            for key, values in groups.items():
                arr = np.asarray(values)
                rows[key] = {"mean": float(arr.mean()), "std": float(arr.std()), "n": len(arr)}
            for row in self.summaries:
                key = (row["model"], row["domain"], row["shots"], row["metric"])
                if key in rows:
                    raise ValueError(f"{key} is given both as per-seed records and as a summary")
                rows[key] = {
                    "mean": float(row["mean"]),
                    "std": float(row["std"]),
                    "n": int(row.get("n", 0)),
                }
            self._summary_cache = rows
        return self._summary_cache

    @property
    def models(self):
        """Model names, in order of first appearance."""
        seen = dict.fromkeys(k[0] for k in self._summary())
        return list(seen)

    @property
    def domains(self):
        """Domains present, in paper order (IN-1K, L1..L5, then others)."""
        return sorted({k[1] for k in self._summary()}, key=domain_key)

    @property
    def shots(self):
        """Shots present, increasing, ``"all"`` last."""
        return sorted({k[2] for k in self._summary()}, key=shot_key)

    def summary(self, metric="top1"):
        """Aggregated rows: ``model``, ``domain``, ``shots``, ``mean``, ``std``, ``n``.

        Sorted by model (first appearance), domain and shots.
        """
        order = {m: i for i, m in enumerate(self.models)}
        rows = [
            {"model": m, "domain": d, "shots": s, "metric": metric, **v}
            for (m, d, s, met), v in self._summary().items()
            if met == metric
        ]
        rows.sort(key=lambda r: (order[r["model"]], domain_key(r["domain"]), shot_key(r["shots"])))
        return rows

    def cell(self, model, domain, shots="all", metric="top1"):
        """The aggregate of one cell over its seeds, or None when it is absent.

        Parameters
        ----------
        model, domain : str
        shots : int or "all"
        metric : {"top1", "top5", "val_top1"}

        Returns
        -------
        dict or None
            ``mean``, ``std`` (population, over the seeds) and ``n`` (the number of seeds;
            for a published summary, the number it states).

        Examples
        --------
        >>> from imagenet_cog import reference_results
        >>> reference_results().cell("ResNet50", "L5")
        {'mean': 52.0, 'std': 0.0, 'n': 5}
        """
        return self._summary().get((model, domain, normalize_shots(shots), metric))

    def mean(self, model, domain, shots="all", metric="top1"):
        """Mean score of one cell (NaN when absent)."""
        row = self.cell(model, domain, shots, metric)
        return row["mean"] if row else math.nan

    def std(self, model, domain, shots="all", metric="top1"):
        """Standard deviation over seeds of one cell (NaN when absent)."""
        row = self.cell(model, domain, shots, metric)
        return row["std"] if row else math.nan

    # ----------------------------------------------------------- combination
    def __add__(self, other):
        return self.merge(other)

    def merge(self, *others):
        """Results holding this one's models and the others', side by side.

        Each model keeps its own per-model records (``meta["protocol"]``, its categories and
        analysis), taken from the results that hold its cells: a model of one never takes
        the record of another's model of the same name. A model in two of them is refused.
        """
        records, given = list(self.records), list(self.summaries)
        meta = _meta_of(self.meta, self.models)
        held = set(self.models)
        for other in others:
            clash = held & set(other.models)
            apart = names_apart(clash, meta.get("protocol") or {}, other.meta.get("protocol") or {})
            if apart:  # two checkpoint files, one default name: the weights' hash tells them
                mine = renamed(Results(records, given, meta), apart[0])
                records, given, meta = mine.records, mine.summaries, mine.meta
                other = renamed(other, apart[1])
                held = set(records_models(records, given))
                clash = held & set(other.models)
            if clash:
                raise ValueError(f"models {sorted(clash)} appear in both results; {_NAME_ONE}")
            held |= set(other.models)
            records += other.records
            given += other.summaries
            theirs = _meta_of(other.meta, other.models)
            for key, value in theirs.items():
                if isinstance(value, dict) and isinstance(meta.get(key), dict):
                    meta[key] = {**meta[key], **value}
                else:
                    meta.setdefault(key, value)
        return _with_runs(Results(records, given, meta), self, *others)

    def subset(self, models=None, domains=None, shots=None):
        """Results restricted to some models, domains and/or shots."""
        models = None if models is None else set(models)
        missing = (models or set()) - set(self.models)
        if missing:
            raise ValueError(f"unknown models {sorted(missing)}; have {self.models}")
        domains = None if domains is None else set(domains)
        shots = None if shots is None else {normalize_shots(s) for s in shots}

        def keep(row):
            return (
                (models is None or row["model"] in models)
                and (domains is None or row["domain"] in domains)
                and (shots is None or normalize_shots(row["shots"]) in shots)
            )

        records = [r for r in self.records if keep(r)]
        given = [r for r in self.summaries if keep(r)]
        kept = {r["model"] for r in records} | {r["model"] for r in given}
        return _with_runs(Results(records, given, _meta_of(self.meta, kept)), self)

    def reference_models(self):
        """The models whose cells are the paper's published ones, by provenance and content.

        A reference model has no per-seed record, and each of its cells is a summary that
        :func:`reference_results` made, marked with the paper as its source and holding the
        published mean and standard deviation. A name decides nothing: a run of yours
        called ``"s-DINO"`` is yours, and :func:`comparability` checks it.

        Returns
        -------
        list of str

        Examples
        --------
        >>> from imagenet_cog import Results, reference_results
        >>> mine = Results([{"model": "s-DINO", "domain": "L5", "shots": "all", "seed": 22,
        ...                  "top1": 99.0}])
        >>> both = mine.compare(reference_results(), models=["ResNet50"])
        >>> both.reference_models()
        ['ResNet50']
        """
        published, seeded, found = published_cells(), {r["model"] for r in self.records}, {}
        for row in self.summaries:
            key = (row["model"], row["domain"], row["shots"])
            cell = (float(row["mean"]), float(row["std"]))
            ours = row.get("source") == PAPER_SOURCE and row.get("metric") == "top1"
            found[row["model"]] = (
                found.get(row["model"], True) and ours and published.get(key) == cell
            )
        return [m for m in self.models if found.get(m) and m not in seeded]

    def relative_to(self, baseline, metric="top1"):
        """Mean scores minus the baseline model's, per domain and shots.

        This is what the paper plots in Figures 3(b)-(e) and 4(d)-(f):
        percentage points above or below the baseline (ResNet50 there).

        Returns
        -------
        Results
            Aggregated rows (``mean`` is the difference, ``std`` the model's
            own spread over seeds); cells the baseline lacks are dropped.
        """
        if baseline not in self.models:
            raise ValueError(f"baseline {baseline!r} is not among the models {self.models}")
        base = {
            (r["domain"], r["shots"]): r["mean"]
            for r in self.summary(metric)
            if r["model"] == baseline
        }
        rows = [
            {**r, "mean": r["mean"] - base[(r["domain"], r["shots"])]}
            for r in self.summary(metric)
            if (r["domain"], r["shots"]) in base
        ]
        meta = {**self.meta, "relative_to": baseline}
        return _with_runs(Results(summaries=rows, meta=meta), self)

    def ranks(self, shots="all", metric="top1", among=None):
        """Rank of every model per domain (1 = best mean score), ties share the best rank.

        Parameters
        ----------
        shots : int or "all"
        metric : str
        among : list of str, optional
            Rank each model among these only, itself aside (the reports rank yours among
            the paper's, :meth:`reference_models`, never among your others); default all.

        Returns
        -------
        dict
            ``{model: {domain: rank}}``.
        """
        shots = normalize_shots(shots)
        out = {m: {} for m in self.models}
        pool = self.models if among is None else [m for m in self.models if m in set(among)]
        for domain in self.domains:
            scores = {
                m: self.mean(m, domain, shots, metric)
                for m in self.models
                if not math.isnan(self.mean(m, domain, shots, metric))
            }
            others = [(k, scores[k]) for k in pool if k in scores]
            for m, value in scores.items():
                out[m][domain] = 1 + sum(v > value for k, v in others if k != m)
        return out

    def compare(self, reference, baseline="ResNet50", models=None, strict=False):
        """Place this run's models among reference models (e.g. the paper's 31).

        Parameters
        ----------
        reference : Results
            Typically :func:`reference_results`.
        baseline : str
            The model scores are made relative to (it must be in either).
        models : list of str, optional
            Reference models to keep (default all); the baseline is always kept.
        strict : bool
            Raise :class:`~imagenet_cog.NotComparableError` when a model
            of this run deviates from the paper's protocol (see
            :func:`comparability`) instead of marking it.

        Returns
        -------
        Results
            Both sets side by side, with ``meta["highlight"]`` naming this
            run's models (drawn bold by :meth:`plot`) and
            ``meta["baseline"]``. Use :meth:`ranks`, :meth:`relative_to`,
            :meth:`table` and :meth:`plot` on it; :func:`comparability` tells
            what makes the comparison fair, and :meth:`comparison_report`
            puts a non-comparable model's ranks in parentheses under a banner.

        Raises
        ------
        NotComparableError
            With ``strict=True``, naming each deviation.

        Examples
        --------
        >>> from imagenet_cog import Results, reference_results
        >>> mine = Results([{"model": "mine", "domain": "L5", "shots": "all", "seed": s,
        ...                  "top1": 58.0} for s in (22, 37, 45, 77, 93)])
        >>> both = mine.compare(reference_results(), models=["s-DINO"])
        >>> both.models
        ['mine', 'ResNet50', 's-DINO']
        >>> both.ranks()["mine"]["L5"]
        1
        """
        if strict:
            found = comparability(self, by_model=True)
            reasons = [f"{m}: {r}" for m, v in found.items() for r in v["deviations"]]
            if reasons:
                raise NotComparableError(
                    "NOT COMPARABLE with the paper (strict): " + "; ".join(reasons)
                )
        if models is not None:
            keep = list(dict.fromkeys([*models, baseline]))
            known = set(reference.models)
            unknown = [m for m in keep if m not in known and m not in self.models]
            if unknown:
                raise ValueError(f"unknown reference models {unknown}; known: {reference.models}")
            reference = reference.subset(models=[m for m in keep if m in known])
        # A run of yours named as a reference model it is shown beside would take its place.
        clash = [m for m in self.models if m in reference.models]
        if clash:
            raise ValueError(
                f"your results hold a model named {clash[0]!r}, as one of the reference models "
                "they are compared with: its cells would stand for the published ones. Load "
                "them under another name (Results.load(path, model=...), report --name "
                f"FOLDER=NAME), or leave {clash[0]!r} out of the reference models (models=, "
                "report --models)"
            )
        merged = self.merge(reference)
        if baseline not in merged.models:
            raise ValueError(f"baseline {baseline!r} is in neither results")
        merged.meta["highlight"] = list(self.models)
        merged.meta["baseline"] = baseline
        return merged

    def comparison_report(self, shots="all", metric="top1", banner=True):
        """The answer first: each of this run's models' rank per level, its scores, its scores
        relative to the baseline and its relative change from L1 to L5; then the verdict.

        For Results made by :meth:`compare`. Each model is ranked among the reference
        (published) models only, never among your others. A model that deviates from the
        paper's protocol (see :func:`comparability`) has its ranks in parentheses, ``(3)*/32``, for
        orientation, not as a place among the paper's models, and is named with its reasons,
        the most decisive first, in the banner under the ranking (``banner=False`` leaves the
        banner to the caller). The caveats follow.
        """
        from ._reporting.answer import comparison_report

        return comparison_report(self, shots, metric, banner)

    def relative_change(self, model, shots="all", metric="top1"):
        """The relative change of a model's score from L1 to L5, in percent of L1's: negative
        where the score falls (the paper's models all fall, by 19% to 29%); NaN without both.

        Examples
        --------
        >>> from imagenet_cog import reference_results
        >>> round(reference_results(["ResNet50"]).relative_change("ResNet50"), 1)
        -23.4
        """
        first, last = (self.mean(model, d, shots, metric) for d in ("L1", "L5"))
        return 100 * (last - first) / first if first > 0 else math.nan

    # ------------------------------------------------------------------ text
    def score_grid(self, metric="top1", shots=None, domain=None):
        """The scores of one table: its columns and each model's cell per column.

        The text, Markdown and LaTeX tables and the HTML report are rendered from it.

        Parameters
        ----------
        metric : {"top1", "top5", "val_top1"}
        shots : int or "all", optional
            One column per domain with a score for these shots.
        domain : str, optional
            Instead, one column per number of shots with a score for this domain.

        Returns
        -------
        columns : list
            Domains, or numbers of shots, in the paper's order.
        cells : dict of str to list
            ``{model: [the cell's aggregate (see :meth:`cell`) or None, per column]}``, every
            model included.

        Examples
        --------
        >>> from imagenet_cog import reference_results
        >>> columns, cells = reference_results(["ResNet50"]).score_grid(domain="L5")
        >>> columns[0], columns[-1], cells["ResNet50"][-1]["mean"]
        (1, 'all', 52.0)
        """
        summary = self._summary()
        if domain is not None:
            columns = [s for s in self.shots if self._has(domain=domain, shots=s)]
            cells = {m: [summary.get((m, domain, s, metric)) for s in columns] for m in self.models}
        else:
            shots = None if shots is None else normalize_shots(shots)
            columns = [d for d in self.domains if self._has(domain=d, shots=shots)]
            cells = {m: [summary.get((m, d, shots, metric)) for d in columns] for m in self.models}
        return columns, cells

    def table(self, metric="top1", shots=None, domain=None, models=None, digits=1, with_std=True):
        """A text table a person reads at a glance.

        Parameters
        ----------
        metric : {"top1", "top5", "val_top1"}
        shots : int or "all", optional
            One column per domain for these shots (the all-data view of the
            paper's Figure 3). Default: ``"all"`` if present.
        domain : str, optional
            Instead, one column per number of shots for this domain (the
            layout of the paper's Tables 5-10).
        models : list of str, optional
        digits : int
        with_std : bool
            Show ``mean ± std``.

        Returns
        -------
        str
        """
        return self.score_table(metric, shots, domain, models, digits, with_std).text()

    def score_table(
        self, metric="top1", shots=None, domain=None, models=None, digits=1, with_std=True
    ):
        """The table of :meth:`table` (same parameters), built once for every rendering: its
        ``title``, ``header`` and ``rows`` of cell texts, with ``text()`` and ``markdown()``.

        Examples
        --------
        >>> from imagenet_cog import reference_results
        >>> found = reference_results(["ResNet50"]).score_table(domain="L5", with_std=False)
        >>> found.header[:3], found.rows[0][-1]
        (('model', 'N=1', 'N=2'), '52.0')
        """
        return score_table(self, metric, shots, domain, models, digits, with_std)

    def runs(self, model):
        """What made a model's numbers, as :meth:`load` read each of its run folders (the
        HTML report's provenance shows it): one dict per folder, ``folder``, ``config`` (its
        ``config.json``, None without one), ``records`` (the cells of its ``runs.jsonl``) and
        ``checksummed`` (how many carry their own sha256); ``[]`` for a model not loaded.

        Examples
        --------
        >>> from imagenet_cog import reference_results
        >>> reference_results().runs("ResNet50")
        []
        """
        found = []
        for folder in (self.meta.get("run_folders") or {}).get(model, []):
            facts = self._runs.get(folder)
            if facts is None:  # a folder named in meta that load did not read
                facts = run_facts(folder)
            found.append({"folder": folder, **facts})
        return found

    def analysis_table(self, models=None, digits=3):
        """The feature-space and error analyses loaded with the results, as text.

        One table per model with an ``analysis.json`` (see :meth:`load`): a row per domain,
        a column per measure, and alignment and uniformity relative to IN-1K.

        Parameters
        ----------
        models : list of str, optional
        digits : int

        Returns
        -------
        str

        Raises
        ------
        ValueError
            When no analysis was loaded.

        Examples
        --------
        >>> from imagenet_cog import Results
        >>> analysis = {"domains": {"in1k": {"nmi": 0.8, "alignment": 0.9},
        ...                         "L5": {"nmi": 0.6, "alignment": 1.1}}}
        >>> res = Results([{"model": "m", "domain": "in1k", "shots": "all", "top1": 70.0}],
        ...               meta={"analysis": {"m": analysis}})
        >>> print(res.analysis_table())
        analysis of m
        domain    NMI  align  Δalign
        IN-1K   0.800  0.900   0.000
        L5      0.600  1.100  +0.200
        """
        found = self.meta.get("analysis") or {}
        if not found:
            raise ValueError(
                "no analysis loaded: run `imagenet-cog analyze` (or analysis.analyze) with the "
                "results folder, then load it again"
            )
        names = [m for m in (models or found) if m in found]
        return "\n\n".join(format_analysis_table(found[m], m, digits) for m in names)

    def _has(self, domain=None, shots=None):
        return any(
            (domain is None or k[1] == domain) and (shots is None or k[2] == shots)
            for k in self._summary()
        )

    def report(self, metric="top1", digits=1, banner=True):
        """Every table: the all-data overview, then one table per domain; above them, with
        ``banner``, the banner naming each model not comparable with the paper and why."""
        parts = [not_comparable_banner(self)] if banner else []
        parts = [p for p in parts if p] + [self.table(metric, digits=digits)]
        if len(self.shots) > 1:
            parts += [self.table(metric, domain=d, digits=digits) for d in self.domains]
        return "\n\n".join(parts)

    def __repr__(self):
        return (
            f"Results(models={self.models}, domains={self.domains}, "
            f"shots={[display_shots(s) for s in self.shots]}, cells={len(self.records)})"
        )

    def __str__(self):
        return self.report()

    # --------------------------------------------------------------- exports
    def to_frame(self, metric="top1"):
        """Aggregated rows as a pandas DataFrame (needs the ``pandas`` extra)."""
        pd = require("pandas", "to_frame()")
        return pd.DataFrame(self.summary(metric))

    def to_csv(self, path=None, metric="top1"):
        """Aggregated rows as CSV text; written atomically to ``path`` if given.

        Each row carries the comparability verdict of its model: ``comparable`` is ``yes``,
        ``no`` (with the reasons in ``deviations``) or ``reference`` (a published model).
        """
        from ._exports import csv_text

        return _emit(csv_text(self, metric), path)

    def to_json(self, path=None):
        """Records, aggregated rows, meta and the comparability verdict as JSON text; written
        atomically to ``path``."""
        from ._exports import json_text

        return _emit(json_text(self, _METRICS), path)

    def to_markdown(self, path=None, metric="top1", digits=1):
        """The tables of :meth:`report` as Markdown, under the comparability verdict; written
        atomically to ``path``."""
        from ._exports import markdown_text

        return _emit(markdown_text(self, metric, digits), path)

    def to_latex(
        self,
        path=None,
        metric="top1",
        digits=1,
        domains=None,
        verdict=True,
        shots=None,
        float_env="table",
    ):
        """LaTeX tables in the layout of the paper's Tables 5-10; written atomically to ``path``.

        One ``table`` per domain: a row per model (a rule between the paper's model groups
        when they are known), a column per number of shots, ``mean ± std`` over seeds, the
        best printed mean of each column among the comparable entries in bold, booktabs rules.
        A table wider than the text is scaled down to ``\\linewidth`` (the paper's nine
        columns at ``\\footnotesize`` are); the preamble needs ``\\usepackage{booktabs}``
        and ``\\usepackage{graphicx}``.

        Parameters
        ----------
        path : path, optional
        metric : {"top1", "top5", "val_top1"}
        digits : int
        domains : list of str, optional
            Default: every domain present.
        verdict : bool
            Put the comparability verdict in: a comment above the tables and, under each,
            a footnote with the reasons for each model that is not comparable (marked
            :math:`\\dagger` after its name), that table's domain only. Bold goes to
            comparable entries either way.
        shots : list of int or "all", optional
            The columns (default every number of shots present): fewer columns need no
            scaling.
        float_env : {"table", "table*"}
            ``"table*"`` spans both columns of a two-column document.

        Returns
        -------
        str

        Examples
        --------
        >>> from imagenet_cog import reference_results
        >>> tex = reference_results(["ResNet50", "s-DINO"]).to_latex(domains=["L5"])
        >>> print(next(line for line in tex.splitlines() if line.startswith("s-DINO"))[:49])
        s-DINO & $\\mathbf{12.6}$\\,{\\scriptsize$\\pm$0.1} &
        """
        from ._exports import export_verdict, latex_tables

        found = export_verdict(self) if verdict else None
        text = latex_tables(self, metric, digits, domains, found, shots=shots, float_env=float_env)
        return _emit(text, path)

    def to_html(
        self, path=None, compare=None, shots="all", reference=True, baseline="ResNet50", levels=None
    ):
        """One self-contained HTML report; written atomically to ``path`` if given.

        The file opens offline in any browser (styles, script, figures inline; nothing is
        fetched) and reads in full without its script. In order: the answer (each of your
        models, its rank among the paper's 31, its scores, its relative change from L1 to L5),
        the verdict on comparability with its decisive reasons, the paper's Figures 3 and 4 in
        its groups (inline SVG), the tables of Tables 5-10 (click a column's head to sort),
        the paired comparison of ``compare``, a per-concept explorer from the predictions the
        runs saved (each concept's level, its similarity to IN-1K under the run's levels, its
        nearest IN-1K concept, each model's accuracy over the seeds and confusions in WordNet;
        search, filter, sort, two models' difference), and what made the numbers (model spec,
        weights sha256, copy, protocol, versions, the checksums ``imagenet-cog verify`` checks).

        Parameters
        ----------
        path : path, optional
        compare : (str, str), optional
            Two models whose paired comparison (:meth:`compare_models`) the report holds.
        shots : int or "all"
            The shots of the answer, the overview table and the concepts.
        reference : bool
            Place the models among the paper's 31 (as :meth:`compare` does) when these
            results do not hold them already.
        baseline : str
            The model the relative scores and figures subtract (with ``reference``).
        levels : str, path or Levels, optional
            The runs' levels, checked by content; their own are read only inside their folder.

        Returns
        -------
        str

        Examples
        --------
        >>> from imagenet_cog import Results
        >>> run = Results([{"model": "mine", "domain": d, "shots": "all", "seed": s,
        ...                 "top1": 60.0} for d in ("L1", "L5") for s in (22, 37)])
        >>> html = run.to_html(reference=False)
        >>> html.startswith("<!DOCTYPE html>"), "NOT COMPARABLE with the paper: mine" in html
        (True, True)
        """
        from ._reporting.html import html_report

        results = self
        if reference and not self.reference_models():
            results = self.compare(reference_results(), baseline=baseline)
        return _emit(html_report(results, compare=compare, shots=shots, levels=levels), path)

    def paired_difference(self, a, b, domain, shots="all", metric="top1", confidence=0.95):
        """Does model ``a`` beat model ``b`` on one cell by more than the seeds' spread?

        With per-seed records of both models, the scores are paired by seed (every model
        runs each cell with the same seeds, which fix the same validation split, few-shot
        draw and search sampler): the mean paired difference, the one-sided paired t-test of
        "a beats b" with its one-sided Student-t lower bound at ``confidence`` (above 0
        exactly when the p-value is below ``1 - confidence``), and the exact sign-flip test.
        Where a model has only a published mean ± std (the paper's), Welch's unpaired t-test
        from the summaries instead. The tests are over the seeds: the test images are fixed.

        Parameters
        ----------
        a, b : str
            Models; differences are ``a - b`` in points.
        domain : str
        shots : int or "all"
        metric : str
        confidence : float
            Of the one-sided bound.

        Returns
        -------
        PairedComparison
            See :class:`imagenet_cog._paired.PairedComparison`.

        Examples
        --------
        >>> from imagenet_cog import Results
        >>> cells = [{"model": m, "domain": "L5", "shots": "all", "seed": s, "top1": v + d}
        ...          for m, v, noise in [("A", 51.0, (0.1, -0.2, 0.0, 0.2, -0.1)),
        ...                          ("B", 50.0, (0.0, 0.1, -0.1, 0.1, 0.0))]
        ...          for s, d in zip((22, 37, 45, 77, 93), noise)]
        >>> c = Results(cells).paired_difference("A", "B", "L5")
        >>> round(c.mean, 2), round(c.ci_low, 2), round(c.p_value, 6), round(c.p_sign_flip, 4)
        (0.98, 0.81, 0.000128, 0.0312)
        """
        from ._paired import paired_comparison

        return paired_comparison(self, a, b, domain, shots, metric, confidence)

    def compare_models(self, a, b, shots="all", metric="top1", alpha=0.05):
        """A table of :meth:`paired_difference` over every domain both models have.

        Each row's verdict is the one-sided t-test of "a beats b", its p-value adjusted over
        the domains with Holm's method, so "A better on L5" keeps its error rate when all six
        domains are looked at; its bound is the simultaneous one-sided lower bound compatible
        with Holm's procedure at the same level, so the bound is above 0 exactly where the
        verdict says "A better". The title names the test; the lines under the table say
        what the test is over and, with 5 seeds, that the sign-flip test cannot pass Holm
        over six domains. Runs made with different protocols are flagged above the table.

        Parameters
        ----------
        a, b : str
        shots : int or "all"
        metric : str
        alpha : float
            Level of the verdict and of the bounds (``1 - alpha``).

        Returns
        -------
        str

        Examples
        --------
        >>> from imagenet_cog import Results
        >>> cells = [{"model": m, "domain": "L5", "shots": "all", "seed": s, "top1": v + d}
        ...          for m, v, noise in [("A", 51.0, (0.1, -0.2, 0.0, 0.2, -0.1)),
        ...                          ("B", 50.0, (0.0, 0.1, -0.1, 0.1, 0.0))]
        ...          for s, d in zip((22, 37, 45, 77, 93), noise)]
        >>> print(Results(cells).compare_models("A", "B").splitlines()[2])
        L5      +0.98      +0.81      5  0.000128  0.000128          0.031  A better
        """
        from ._paired import compare_models

        return compare_models(self, a, b, shots, metric, alpha)

    # ----------------------------------------------------------------- plots
    def plot(
        self,
        directory,
        baseline=None,
        models=None,
        highlight=None,
        metric="top1",
        prefix="",
        formats=("png",),
    ):
        """Write the figures of :meth:`figures` as PNG, PDF and/or SVG files.

        Parameters
        ----------
        directory : path
            Created if missing; each figure becomes ``{prefix}{name}.{format}``.
        baseline, models, highlight, metric
            As in :meth:`figures`.
        prefix : str
            File name prefix.
        formats : sequence of {"png", "pdf", "svg"}
            PDF and SVG are vector formats, for papers.

        Returns
        -------
        list of pathlib.Path
            The files written.

        Examples
        --------
        >>> from imagenet_cog import reference_results
        >>> paths = reference_results(["ResNet50"]).plot("figs")  # doctest: +SKIP
        """
        from ._figures import check_formats, write_figures

        check_formats(formats)  # before the figures are drawn
        figures = self.figures(baseline, models, highlight, metric)
        return write_figures(figures, directory, prefix, formats)

    def figures(self, baseline=None, models=None, highlight=None, metric="top1"):
        """Figures in the style of the paper's Figures 3 and 4, as matplotlib Figures.

        Nothing is written: save them with ``fig.savefig`` or call :meth:`plot`.

        - ``"levels_absolute"``: top-1 per domain, one line per model (Fig. 3(a));
        - ``"levels_relative"``: top-1 minus the baseline's, per domain
          (Fig. 3(b)-(e)), when ``baseline`` is given;
        - ``"fewshot"``: top-1 against shots per class, one panel per domain
          (Fig. 4), when there is more than one number of shots;
        - ``"fewshot_relative"``: the same relative to the baseline.

        Parameters
        ----------
        baseline : str, optional
            Model to subtract (the paper uses ResNet50).
        models : list of str, optional
            Models to draw (default all).
        highlight : list of str, optional
            Models drawn bold; the others are drawn faintly (used to place a
            model among the paper's 31).
        metric : str

        Returns
        -------
        dict of str to matplotlib.figure.Figure

        Examples
        --------
        >>> from imagenet_cog import reference_results
        >>> figs = reference_results(["ResNet50", "s-DINO"]).figures(baseline="ResNet50")
        >>> sorted(figs)
        ['fewshot', 'fewshot_relative', 'levels_absolute', 'levels_relative']
        >>> import matplotlib.pyplot as plt; plt.close("all")
        """
        from ._figures import results_figures

        return results_figures(self, baseline, models, highlight, metric)


def _meta_of(meta, models):
    """``meta`` with its per-model entries restricted to ``models``."""
    models = set(models)
    return {
        k: {m: v for m, v in value.items() if m in models}
        if k in _PER_MODEL_META and isinstance(value, dict)
        else value
        for k, value in meta.items()
    }


def _with_runs(results, *sources):
    """``results`` with what the ``sources`` loaded of their run folders."""
    for source in sources:
        results._runs.update(source._runs)
    return results


def _emit(text, path):
    if path is not None:
        atomic_write_text(Path(path), text)
    return text


# ------------------------------------------------------------- the paper
def reference_results(models=None):
    """The paper's published results for its 31 models, as :class:`Results`.

    Supplementary Tables 5-10 of the ImageNet-CoG paper (ICCV 2021): top-1
    mean ± std over 5 seeds on IN-1K and L1-L5, for N = 1, 2, 4, ..., 128
    and all images per concept. Model names follow the paper's Table 1
    (``"ResNet50"``, ``"a-DeiT-S"``, ``"s-DINO"``, ...), with the category
    prefix a- (architecture), s- (self-supervision), r- (regularization) or
    d- (use of web data); ``meta["categories"]`` maps names to categories.

    Parameters
    ----------
    models : list of str, optional
        Keep only these models.

    Returns
    -------
    Results

    Examples
    --------
    >>> from imagenet_cog import reference_results
    >>> paper = reference_results()
    >>> len(paper.models), paper.mean("ResNet50", "L5", "all")
    (31, 52.0)
    >>> print(paper.subset(models=["ResNet50", "s-DINO"]).table(with_std=False))
    top-1 (%), all training images
    model     IN-1K    L1    L2    L3    L4    L5
    ResNet50   75.8  67.9  63.1  59.0  58.1  52.0
    s-DINO     74.8  71.1  67.2  63.2  62.6  57.6
    """
    from ._comparability import paper_summaries

    summaries, meta = paper_summaries()
    res = Results(summaries=summaries, meta=meta)
    return res.subset(models=models) if models is not None else res
