"""The table of analyses: one row per analysis, and all that the library knows of it.

A row (:class:`Analysis`) says what the analysis needs (a domain's features, or the linear
probe's saved test predictions), how it runs on one domain, and what it measures: each
:class:`Measure` with its title, its definition, its unit and which way is better.
:func:`~imagenet_cog.analysis.analyze` runs the rows, and everything that shows an analysis
reads them: the text table of ``analysis.json`` (``report``, ``AnalysisReport.table``), the
plot of its measures, the JSON it is saved as and the HTML report's section of analyses. A
new analysis is its module in this wing and its row here.

The rows run their modules through lazy imports: reading the table (every report does) loads
neither torch nor scikit-learn.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .checks import _json_float

__all__ = [
    "ANALYSES",
    "NEEDS",
    "Analysis",
    "DomainData",
    "Measure",
    "Options",
    "Outcome",
    "definitions",
    "find_measure",
    "plotted_keys",
    "table_keys",
]


@dataclass(frozen=True)
class Measure:
    """One measure of an analysis, as every table, plot and page shows it.

    Attributes
    ----------
    key : str
        Its name in ``analysis.json``; ``<k>`` stands for a number (``pca<k>_top1``).
    title : str or None
        The title of its plot panel and of its column in the HTML report (None: its key).
    definition : str
        What it is, in one sentence, for the reader.
    unit : str
        ``""`` for a score, ``"%"`` for a percentage.
    better : {"higher", "lower", None}
        Which way is better; None where neither is (where errors land).
    header : str or None
        Its column in the text table, among the named columns in the table's order; None:
        its key, after them.
    scale : float
        What its stored value is multiplied by to read in its unit (100: a share, stored in
        [0, 1] and shown in percent, to one decimal).
    shown : bool
        In the text and HTML tables; False keeps it in ``analysis.json`` only.
    plotted : bool
        In the default plot of :meth:`~imagenet_cog.analysis.AnalysisReport.plot`.
    relative : bool
        The text table adds its difference from IN-1K (``Δalign``).
    recorded : bool
        Its definition is written into ``analysis.json`` (``settings["definitions"]``): a
        measure whose name alone admits other definitions.
    """

    key: str
    title: str | None
    definition: str
    unit: str = ""
    better: str | None = "higher"
    header: str | None = None
    scale: float = 1.0
    shown: bool = True
    plotted: bool = True
    relative: bool = False
    recorded: bool = False

    def matches(self, key):
        """Whether ``key`` is this measure's (a number for each ``<k>``)."""
        return self._setting(key) is not None

    def _setting(self, key):
        """The number ``key`` holds for ``<k>`` (``""`` for a measure without one), or None
        when ``key`` is not this measure's."""
        if "<" not in self.key:
            return "" if key == self.key else None
        pattern = re.escape(self.key).replace(re.escape("<k>"), r"(\d+)")
        found = re.fullmatch(pattern, key)
        return found[1] if found else None

    @property
    def is_family(self):
        """Whether the key holds a number (one measure per setting, ``pca32_top1``...)."""
        return "<" in self.key

    def describe(self, key=None):
        """Its definition, unit and better way, in one line (the HTML report's tooltip), for
        ``key`` where the measure holds a number (``pca32_top1``: the first 32 components)."""
        what = self.definition.replace("<k>", (key and self._setting(key)) or "k")
        what = what[:1].upper() + what[1:]
        unit = f"; in {self.unit}" if self.unit else ""
        better = f"; {self.better} is better" if self.better else ""
        return f"{what}{unit}{better}."


@dataclass(frozen=True)
class Options:
    """The options of :func:`~imagenet_cog.analysis.analyze` that the rows read."""

    place: Any = None
    kmeans_seeds: int = 3
    top_k: int = 5
    shots: Any = "all"
    semantic_seed: Any = "first"
    taxonomy: Any = None
    probe_seeds: tuple = ()
    pca_components: tuple = ()
    probe_kw: dict = field(default_factory=dict)
    verbose: int = 0


@dataclass
class DomainData:
    """What an analysis of one domain may read.

    Attributes
    ----------
    domain : str
    features : tuple or None
        ``(X_train, y_train, X_test, y_test)``, loaded once for every analysis of the
        domain that needs features; None without features.
    cells : dict
        ``{(domain, shots, seed): path}`` of the saved test predictions.
    predictions : path or None
        The folder of the saved predictions.
    """

    domain: str
    features: tuple | None = None
    cells: dict = field(default_factory=dict)
    predictions: Any = None


@dataclass
class Outcome:
    """What an analysis found on one domain.

    Attributes
    ----------
    measures : dict
        ``{measure key: value}``, into the domain's row of ``analysis.json``.
    details : dict or None
        Into the analysis' section of ``analysis.json`` for the domain.
    kept : object
        The full result, kept in memory (``AnalysisReport.errors``, ``probe_scores``).
    inputs : dict
        ``{path: sha256}`` of the files it read, which ``analysis.json`` is bound to.
    skipped : str or None
        Why it did not run on this domain.
    """

    measures: dict = field(default_factory=dict)
    details: dict | None = None
    kept: Any = None
    inputs: dict = field(default_factory=dict)
    skipped: str | None = None


#: What an analysis may need, and why it is skipped without it.
NEEDS = {"features": "no features given", "predictions": "no predictions given"}


@dataclass(frozen=True)
class Analysis:
    """One row of the table of analyses.

    Attributes
    ----------
    name : str
        As ``analyze(analyses=...)``, ``--analyses`` and ``analysis.json`` name it.
    title : str
        What it is, as the HTML report heads it.
    needs : str
        ``"features"`` (a domain's train and test features) or ``"predictions"`` (the
        linear probe's saved test predictions): a key of :data:`NEEDS`.
    measures : tuple of Measure
        In the order they go into a domain's row.
    run : callable
        ``run(data, options) -> Outcome``: the analysis of one domain
        (:class:`DomainData`, :class:`Options`).
    default : bool
        Run by ``analyze`` unless ``analyses`` says otherwise.
    definition : str or None
        Written into ``analysis.json``'s definitions under its name.
    section : str or None
        The section of ``analysis.json`` its details go into, per domain: ``"semantic"``
        holds one record per domain, ``"probes"`` one per domain and analysis.
    settings : callable or None
        ``settings(options) -> dict``: what ``analysis.json``'s settings record of it,
        when it ran.
    """

    name: str
    title: str
    needs: str
    measures: tuple
    run: Callable
    default: bool = False
    definition: str | None = None
    section: str | None = None
    settings: Callable | None = None


#: The sections of ``analysis.json`` that hold one record per domain and analysis.
NESTED_SECTIONS = ("probes",)


def _say(options, line):
    if options.verbose:
        print(line)


# ------------------------------------------------------------------ the analyses
_CLUSTERS = (
    Measure(
        "purity",
        "Cluster purity (per concept, paper Eq. 3)",
        "per concept: mean over concepts of the share of its test samples in its most "
        "common cluster (the paper's Eq. 3, normalised to [0, 1])",
        header="purity",
        recorded=True,
    ),
    Measure(
        "purity_per_cluster",
        "Cluster purity (per cluster)",
        "per cluster: the share of the test samples that belong to their cluster's most "
        "common concept (the textbook purity)",
        shown=False,
        plotted=False,
    ),
    Measure(
        "nmi",
        "NMI",
        "normalised mutual information between the test samples' clusters and concepts",
        header="NMI",
    ),
    Measure(
        "ami",
        "AMI",
        "mutual information between clusters and concepts, adjusted for chance",
        header="AMI",
    ),
    Measure("ari", "ARI", "Rand index of clusters and concepts, adjusted for chance", header="ARI"),
    Measure(
        "inertia",
        "k-means inertia",
        "sum of the squared distances of the train features to their nearest centroid, the "
        "lowest of the k-means runs",
        better="lower",
        shown=False,
        plotted=False,
    ),
)


def _clusters(data, options):
    from .kmeans import cluster_scores

    X_train, _, X_test, y_test = data.features
    _say(options, f"{data.domain}: k-means on {X_train.shape[0]} train features")
    found = cluster_scores(
        X_train, X_test, y_test, seeds=options.kmeans_seeds, device=options.place
    )
    measures = {m.key: _json_float(getattr(found, m.key)) for m in _CLUSTERS}
    measures["backend"] = found.backend  # what ran the k-means (torch, sklearn or faiss)
    return Outcome(measures)


_ALIGNMENT = (
    Measure(
        "alignment",
        "Alignment (lower: tighter concepts)",
        "mean squared distance of l2-normalised same-concept test pairs",
        better="lower",
        header="align",
        relative=True,
        recorded=True,
    ),
    Measure(
        "uniformity",
        "Uniformity (lower: more uniform)",
        "log mean exp(-2 d^2) over distinct pairs of l2-normalised test features",
        better="lower",
        header="unif",
        relative=True,
        recorded=True,
    ),
)


def _alignment(data, options):
    from .alignment import alignment_uniformity

    _, _, X_test, y_test = data.features
    _say(options, f"{data.domain}: alignment and uniformity of {X_test.shape[0]} test features")
    found = alignment_uniformity(X_test, y_test, device=options.place)
    return Outcome({m.key: _json_float(getattr(found, m.key)) for m in _ALIGNMENT})


def _error_similarity(key, title, who):
    return Measure(
        key,
        f"{title} similarity of errors",
        f"mean {who} similarity in WordNet of the true and the predicted concept over the errors",
        header=key if key == "path" else {"lch": "LCH", "wup": "WuP"}[key],
    )


def _error_share(key, where, header):
    return Measure(
        key,
        f"Share of errors on a {where}",
        f"share of the errors that predict a {where} of the true concept in WordNet",
        unit="%",
        better=None,
        header=header,
        scale=100.0,
    )


_SEMANTIC = (
    _error_similarity("path", "Path", "path"),
    _error_similarity("lch", "Leacock-Chodorow", "Leacock-Chodorow"),
    _error_similarity("wup", "Wu-Palmer", "Wu-Palmer"),
    _error_share("sibling_rate", "sibling", "sib%"),
    _error_share("hypernym_rate", "parent", "hyper%"),
    _error_share("hyponym_rate", "child", "hypo%"),
)


def _semantic(data, options):
    from .._runfolder import find_predictions, read_predictions
    from .semantic_errors import semantic_errors, semantic_summary

    shots, seed = options.shots, options.semantic_seed
    found = sorted(s for (d, n, s) in data.cells if d == data.domain and n == shots)
    if seed not in ("first", "mean"):
        found = [s for s in found if s == int(seed)]
    if not found:
        return Outcome(
            skipped=f"no predictions for N={shots}"
            + ("" if seed in ("first", "mean") else f" seed {seed}")
        )
    use = found if seed == "mean" else found[:1]
    _say(options, f"{data.domain}: semantic errors of seed(s) {use}")
    errors, read = [], {}
    for s in use:
        file, _ = find_predictions(data.predictions, data.domain, shots, s)
        cell = read_predictions(file)
        read[str(file)] = cell["sha256"]  # what analysis.json is computed from
        errors.append(
            semantic_errors(cell["y_true"], cell["y_pred"], options.taxonomy, options.top_k)
        )
    summary = semantic_summary(errors, use, shots)
    measures = {m.key: summary["overall"].get(m.key) for m in _SEMANTIC}
    return Outcome(measures, details=summary, kept=errors[0], inputs=read)


def _probe_settings(options):
    return {
        "probes": {
            "seeds": [int(s) for s in options.probe_seeds],
            "pca_components": [int(k) for k in options.pca_components],
            **{k: v for k, v in options.probe_kw.items() if isinstance(v, (int, float, str, bool))},
        }
    }


def _pca(data, options):
    from .probes import pca_probe

    X_train, y_train, X_test, y_test = data.features
    _say(options, f"{data.domain}: pca probe")
    ks = [k for k in options.pca_components if k <= min(X_train.shape)]
    if not ks:
        raise ValueError(f"{data.domain}: every pca_components exceeds min(n, d)")
    kw = {"device": options.place} | options.probe_kw
    found = pca_probe(X_train, y_train, X_test, y_test, ks, options.probe_seeds, **kw)
    measures = {f"pca{k}_top1": _json_float(found.mean(k)) for k in found.settings}
    return Outcome(measures, details={"pca": found.to_dict()}, kept=found)


def _mlp(name, activation):
    def run(data, options):
        from .probes import mlp_probe

        X_train, y_train, X_test, y_test = data.features
        _say(options, f"{data.domain}: {name} probe")
        kw = {"device": options.place} | options.probe_kw
        found = mlp_probe(X_train, y_train, X_test, y_test, activation, options.probe_seeds, **kw)
        return Outcome(
            {f"{name}_top1": _json_float(found.mean())},
            details={name: found.to_dict()},
            kept=found,
        )

    return run


def _probe_accuracy(key, what):
    return Measure(
        key,
        None,
        f"top-1 accuracy on the test images of {what}, mean over the probe's seeds",
        unit="%",
    )


#: The table of analyses, in the order ``analyze`` runs them on a domain (those that need
#: features first, on features loaded once) and shows their measures.
ANALYSES = {
    row.name: row
    for row in (
        Analysis(
            "clusters",
            "Clustering: k-means with k = the number of concepts",
            "features",
            _CLUSTERS,
            _clusters,
            default=True,
        ),
        Analysis(
            "alignment",
            "Alignment and uniformity of the test features (Wang & Isola, 2020)",
            "features",
            _ALIGNMENT,
            _alignment,
            default=True,
        ),
        Analysis(
            "semantic",
            "Where the linear probe's errors land in WordNet (Lymperaiou et al., 2023)",
            "predictions",
            _SEMANTIC,
            _semantic,
            default=True,
            definition="WordNet measures of (true, predicted) over the errors; the joining "
            "path goes through the common subsumer minimising the path length",
            section="semantic",
        ),
        Analysis(
            "pca",
            "The linear probe on the first principal components",
            "features",
            (
                _probe_accuracy(
                    "pca<k>_top1", "the linear probe on the first <k> principal components"
                ),
            ),
            _pca,
            section="probes",
            settings=_probe_settings,
        ),
        Analysis(
            "mlp",
            "An MLP probe (two hidden layers, ReLU)",
            "features",
            (_probe_accuracy("mlp_top1", "an MLP probe with ReLU"),),
            _mlp("mlp", "relu"),
            section="probes",
            settings=_probe_settings,
        ),
        Analysis(
            "mlp_noact",
            "An MLP probe without activation",
            "features",
            (_probe_accuracy("mlp_noact_top1", "an MLP probe without activation"),),
            _mlp("mlp_noact", "identity"),
            section="probes",
            settings=_probe_settings,
        ),
    )
}


# ------------------------------------------------------------------ reading the table
def _measures():
    return [m for row in ANALYSES.values() for m in row.measures]


def find_measure(key):
    """The :class:`Measure` of a key of ``analysis.json``, or None for one the table does not
    know (an analysis of another version)."""
    return next((m for m in _measures() if m.matches(key)), None)


def scale_of(key):
    """What a stored value is multiplied by to read in its unit; a measure the table does
    not know is a share when its key ends in ``_rate``."""
    found = find_measure(key)
    if found is not None:
        return found.scale
    return 100.0 if key.endswith("_rate") else 1.0


def title_of(key):
    """The title of a measure, its key where it has none."""
    found = find_measure(key)
    return found.title if found is not None and found.title else key


def definitions():
    """What ``analysis.json`` records of the definitions, in the table's order."""
    out = {}
    for row in ANALYSES.values():
        out.update({m.key: m.definition for m in row.measures if m.recorded})
        if row.definition:
            out[row.name] = row.definition
    return out


#: Fields of a domain's row that are settings or counts, not measures (``backend``: what ran
#: the k-means).
_BOOKKEEPING = {"k", "t", "backend"}


def table_keys(present):
    """The columns of the text and HTML tables among the keys ``present`` (in the order
    first seen): the named measures in the table's order, then the others as found;
    counts, settings and the measures kept in ``analysis.json`` only are left out."""
    hidden = {m.key for m in _measures() if not m.shown}
    present = [k for k in present if k not in _BOOKKEEPING | hidden and not k.startswith("n_")]
    named = [m.key for m in _measures() if m.header and m.key in present]
    return named + [k for k in present if k not in named]


def header_of(key):
    """The text table's column head of a measure."""
    found = find_measure(key)
    return found.header if found is not None and found.header else key


def is_relative(key):
    """Whether the text table adds the measure's difference from IN-1K."""
    found = find_measure(key)
    return found is not None and found.relative


def plotted_keys(present):
    """What :meth:`~imagenet_cog.analysis.AnalysisReport.plot` draws by default among the
    keys ``present``: the plotted measures in the table's order, then every top-1 accuracy
    (a key ending in ``_top1``) by name."""
    named = [
        m.key
        for m in _measures()
        if m.plotted and not m.is_family and not m.key.endswith("_top1") and m.key in present
    ]
    return named + sorted(k for k in present if k.endswith("_top1"))
