"""Analyses of a model's feature space and of its errors.

Clustering and alignment/uniformity follow the first version of the ImageNet-CoG paper
(arXiv 2012.05649v1, Sec. 4.3); the knowledge-driven error analysis follows Lymperaiou et
al., *Fine-Grained ImageNet Classification in the Wild* (2023).

The last stage of the pipeline (taxonomy → measures → levels → datasets →
features → probe → results → protocol → **analysis**). It reads features,
labels and predictions, and uses the taxonomy and the similarity measures;
no earlier stage imports it. It is the face of the analysis wing
(``_analysis/``): each analysis is a module of the wing and a row of its table
of analyses, which :func:`analyze` runs and every report shows.

- Clustering: :func:`cluster_scores` runs k-means with k = the number of
  concepts on the train features, assigns each test sample to its nearest
  centroid and scores the assignment against the concept labels
  (:func:`purity_score`, NMI, AMI, ARI). :func:`kmeans` is the k-means behind
  it: batched Lloyd iterations in torch (GPU or CPU), or scikit-learn.
- Alignment and uniformity of Wang & Isola (2020):
  :func:`alignment_uniformity`, :func:`alignment_uniformity_per_domain`, and
  :func:`relative_to` for scores relative to IN-1K.
- Knowledge-driven error analysis: :func:`semantic_errors` measures how far in
  WordNet the predicted concepts are from the true ones, and explains the top
  confusions of each class with the WordNet path that joins them.
- Probes beyond the linear one (supplement C of the first version):
  :func:`pca_probe` runs the LogReg protocol on the first 32...1024 principal
  components, :func:`mlp_probe` searches :class:`MLPProbe` (two hidden layers
  of 2048 units, with ReLU or without activation).
- :func:`plot_analysis` draws any of these measures per domain (matplotlib).
- :func:`analyze` runs the analyses of a model's domains from its feature
  store and the test predictions that :func:`~imagenet_cog.evaluate` saves,
  and writes ``analysis.json``, which :class:`~imagenet_cog.Results` reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ._analysis.alignment import (
    AlignmentUniformity,
    alignment_uniformity,
    alignment_uniformity_per_domain,
)
from ._analysis.concept_accuracy import ConceptAccuracy, concept_accuracy
from ._analysis.kmeans import ClusterScores, KMeansResult, cluster_scores, kmeans, purity_score
from ._analysis.mlp import MLPProbe
from ._analysis.probes import PCA_COMPONENTS, ProbeScores, mlp_probe, pca_probe
from ._analysis.semantic_errors import Confusion, SemanticErrors, semantic_errors
from ._analysis.table import (
    ANALYSES,
    NEEDS,
    NESTED_SECTIONS,
    DomainData,
    Options,
    definitions,
    plotted_keys,
    scale_of,
    title_of,
)
from ._device import Placement, resolve_analysis_device
from ._feature_source import feature_source
from ._fileio import file_sha256
from ._grid import SEEDS, SHOTS, Seeds, Shots
from ._neighbors.votes import DINO_KS, DINO_TEMPERATURE
from ._optional_dependencies import require
from ._reporting.cells import unfinished_cells
from ._runfolder import (
    analysis_path,
    find_predictions,
    prediction_cells,
    predictions_folder,
    read_config,
    read_predictions,
    write_analysis,
)

__all__ = [
    "AlignmentUniformity",
    "AnalysisReport",
    "ClusterScores",
    "ConceptAccuracy",
    "Confusion",
    "KMeansResult",
    "MLPProbe",
    "ProbeScores",
    "SemanticErrors",
    "alignment_uniformity",
    "alignment_uniformity_per_domain",
    "analyze",
    "cluster_scores",
    "concept_accuracy",
    "kmeans",
    "load_predictions",
    "mlp_probe",
    "pca_probe",
    "plan_knn",
    "plot_analysis",
    "purity_score",
    "relative_to",
    "semantic_errors",
]


# Numeric fields of the result objects that are settings or counts, not measures.
_SETTINGS = {"k", "t"}


def _domain_key(name):
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def _as_metrics(value):
    if isinstance(getattr(value, "overall", None), Mapping):  # SemanticErrors
        return value.overall
    if hasattr(value, "to_dict") and not isinstance(value, Mapping):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return value
    raise TypeError(f"expected a mapping of metrics, got {type(value).__name__}")


def _is_number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def relative_to(scores, baseline="in1k", *, how="difference", metrics=None):
    """Per-domain scores relative to a baseline domain (IN-1K by default).

    Parameters
    ----------
    scores : mapping of str to mapping or result object
        ``{domain: {metric: value}}``, e.g. from
        :func:`alignment_uniformity_per_domain`; the results of
        :func:`cluster_scores`, :func:`alignment_uniformity` and
        :func:`semantic_errors` work as values too.
    baseline : str
        The reference domain. Matched ignoring case and punctuation, so
        ``"in1k"`` finds ``"IN-1K"``.
    how : {"difference", "ratio"}
        ``value - baseline`` or ``value / baseline``.
    metrics : sequence of str, optional
        Which metrics; by default every numeric one of the baseline, except
        counts and settings (``n_*``, ``k``, ``t``).

    Returns
    -------
    dict of str to dict
        Same domains in the same order (the baseline gives 0 or 1).

    Examples
    --------
    >>> from imagenet_cog.analysis import relative_to
    >>> scores = {"IN-1K": {"alignment": 0.8, "uniformity": -3.0},
    ...           "L5": {"alignment": 1.0, "uniformity": -2.4}}
    >>> out = relative_to(scores)
    >>> {k: round(v, 6) for k, v in out["L5"].items()}
    {'alignment': 0.2, 'uniformity': 0.6}
    >>> round(relative_to(scores, how="ratio")["L5"]["alignment"], 6)
    1.25
    """
    if how not in ("difference", "ratio"):
        raise ValueError(f"how must be 'difference' or 'ratio', got {how!r}")
    table = {name: _as_metrics(v) for name, v in scores.items()}
    keys = {_domain_key(name): name for name in table}
    if _domain_key(baseline) not in keys:
        raise ValueError(f"baseline domain {baseline!r} is not among the domains {list(table)}")
    base = table[keys[_domain_key(baseline)]]
    if metrics is None:
        metrics = [
            m for m, v in base.items() if _is_number(v) and m not in _SETTINGS and m[:2] != "n_"
        ]
    else:
        missing = [m for m in metrics if m not in base]
        if missing:
            raise ValueError(f"baseline {baseline!r} has no metric {missing[0]!r}")
    out = {}
    for name, values in table.items():
        row = {}
        for m in metrics:
            v, b = values.get(m), base[m]
            if v is None or b is None:
                row[m] = None
            elif how == "difference":
                row[m] = float(v) - float(b)
            else:
                row[m] = float(v) / float(b) if b != 0 else None
        out[name] = row
    return out


# ----------------------------------------------------------------- plotting
#: Titles of fields of the result objects that are no measure of an analysis.
_FIELD_TITLES = {"accuracy": "Accuracy"}


def _title(metric):
    return _FIELD_TITLES.get(metric) or title_of(metric)


_NOT_PLOTTED = {"k", "t", "inertia", "normalized", "backend", "device"}


def plot_analysis(scores, path=None, *, metrics=None, title=None, dpi=120, note=None):
    """Line charts of analysis measures across domains, one panel per measure.

    Parameters
    ----------
    scores : mapping
        ``{domain: {metric: value}}`` for one model, or
        ``{model: {domain: {metric: value}}}`` for several (one line each).
        The results of :func:`cluster_scores`, :func:`alignment_uniformity`
        and :func:`semantic_errors` (its ``overall`` values) work as the
        innermost mappings.
        Domains appear on the x axis in the order given (IN-1K, L1, ..., L5).
    path : str or path-like, optional
        Where to save the figure (PNG, or any format matplotlib knows from
        the suffix).
    metrics : sequence of str, optional
        Which measures, in this order; by default every numeric one except
        counts and bookkeeping (``n_*``, ``k``, ``t``, ``inertia``).
    title : str, optional
    dpi : int
    note : str, optional
        A footnote under the panels, such as why the run is not comparable with the paper.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ImportError
        When matplotlib is missing (it is an optional dependency).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from imagenet_cog.analysis import plot_analysis
    >>> scores = {"IN-1K": {"alignment": 0.8, "nmi": 0.81},
    ...           "L1": {"alignment": 0.9, "nmi": 0.73}}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     fig = plot_analysis(scores, pathlib.Path(tmp) / "analysis.png")
    ...     (pathlib.Path(tmp) / "analysis.png").stat().st_size > 0
    True
    >>> len(fig.axes)
    2
    """
    require("matplotlib", "plot_analysis")
    from matplotlib.figure import Figure

    if not isinstance(scores, Mapping) or not scores:
        raise ValueError("scores must be a non-empty mapping")
    first = next(iter(scores.values()))
    first = first if isinstance(first, Mapping) else _as_metrics(first)
    nested = all(isinstance(v, Mapping) or hasattr(v, "to_dict") for v in first.values())
    models = (
        {m: {d: _as_metrics(v) for d, v in doms.items()} for m, doms in scores.items()}
        if nested
        else {None: {d: _as_metrics(v) for d, v in scores.items()}}
    )
    domains = list(dict.fromkeys(d for doms in models.values() for d in doms))
    if metrics is None:
        metrics = list(
            dict.fromkeys(
                m
                for doms in models.values()
                for values in doms.values()
                for m, v in values.items()
                if _is_number(v) and m not in _NOT_PLOTTED and not m.startswith("n_")
            )
        )
    if not metrics:
        raise ValueError("no numeric metric to plot")
    # A measure with no value in any domain (the error measures of a probe that made no
    # errors) gets no panel: the figure says so instead of drawing it empty.
    empty = [
        m
        for m in metrics
        if not any(
            _is_number(v) and math.isfinite(v)
            for doms in models.values()
            for v in (d.get(m) for d in doms.values())
        )
    ]
    metrics = [m for m in metrics if m not in empty]
    if not metrics:
        raise ValueError(f"no value to plot: {', '.join(empty)} have none in any domain")
    ncols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    # A page's width (7 in) whatever the panels: its text (6.5 to 8 pt) keeps its size when
    # the figure is included at \linewidth.
    fig = Figure(figsize=(7.0, 1.9 * nrows + (0.3 if title else 0)), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    x = np.arange(len(domains))
    for ax, metric in zip(axes, metrics):
        # On the scale the analysis table prints: shares in percent; one precision a panel.
        scale = scale_of(metric)
        rate = scale != 1.0
        form = ".1f" if rate else ".3f"
        for model, doms in models.items():
            ys = [doms.get(d, {}).get(metric) for d in domains]
            ys = scale * np.array([np.nan if v is None else float(v) for v in ys])
            ax.plot(x, ys, marker="o", markersize=3.5, linewidth=1.2, label=model)
            if model is None:
                for xi, yi in zip(x, ys):
                    if np.isfinite(yi):
                        ax.annotate(
                            format(yi, form),
                            (xi, yi),
                            textcoords="offset points",
                            xytext=(0, 5),
                            ha="center",
                            fontsize=6.5,
                            # An opaque box keeps the label readable over the line (a
                            # see-through one let the line read as a minus sign).
                            bbox={
                                "boxstyle": "round,pad=0.15",
                                "fc": "white",
                                "ec": "none",
                                "alpha": 1.0,
                            },
                            zorder=5,
                        )
        name = _title(metric)
        ax.set_title(f"{name} (%)" if rate else name, fontsize=7.5, pad=3)
        ax.set_xticks(x, domains)
        ax.tick_params(labelsize=6.5, length=2.5, pad=2)
        ax.grid(alpha=0.3, linewidth=0.5)
        ax.margins(y=0.25)
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    if nested:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncols=min(len(labels), 6),
            frameon=False,
            fontsize=6.5,
        )
    if title:
        fig.suptitle(title, fontsize=8)
    notes = [note] if note else []
    if empty:
        notes.append("not drawn, no value in any domain: " + ", ".join(_title(m) for m in empty))
    if notes:
        import textwrap

        lines = [line for n in notes for line in textwrap.wrap(n, 125)]
        fig.supxlabel("\n".join(lines), fontsize=6.5, color="darkred" if note else "black")
    if path is not None:
        import matplotlib

        from ._figures import SAVE_RC

        # The tight box takes in every label, so none is cut at the canvas' edge; PDF with
        # TrueType fonts.
        with matplotlib.rc_context(SAVE_RC):
            fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.05)
    return fig


# ------------------------------------------------------------------ analyze
def load_predictions(path, domain, shots="all", seed=None):
    """Saved test predictions of :func:`~imagenet_cog.evaluate` (``save_predictions=True``).

    Parameters
    ----------
    path : path
        An ``evaluate`` output folder (holding ``predictions/``), or that folder itself.
    domain : str
    shots : int or "all"
    seed : int, optional
        Defaults to the lowest seed saved for the cell.

    Returns
    -------
    dict
        ``y_true``, ``y_pred``, ``classes`` (str arrays), ``top5`` (int indices into
        ``classes``), ``seed``, ``path`` and ``sha256`` (of the file). Loaded without
        pickle.

    Raises
    ------
    ValueError
        In one line naming the file, when the file of a run folder is not the one its
        record's checksum names (edited, cut short, or named by no record), or is not a
        readable ``.npz``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import numpy as np
    >>> from imagenet_cog.analysis import load_predictions
    >>> folder = pathlib.Path(tempfile.mkdtemp()) / "predictions"
    >>> folder.mkdir()
    >>> np.savez(folder / "L1__all__22.npz", y_true=np.array(["a", "b"]),
    ...          y_pred=np.array(["a", "a"]), top5=np.array([[0, 1], [0, 1]]),
    ...          classes=np.array(["a", "b"]))
    >>> p = load_predictions(folder.parent, "L1")
    >>> p["seed"], p["y_pred"].tolist()
    (22, ['a', 'a'])
    """
    file, seed = find_predictions(path, domain, shots, seed)
    return read_predictions(file) | {"seed": seed, "path": str(file)}


class AnalysisReport:
    """What :func:`analyze` returns: the analyses of one model's domains.

    Attributes
    ----------
    model : str
    domains : dict of str to dict
        ``{domain: {measure: value}}``: cluster scores (``purity`` is the paper's Eq. 3, per
        concept; ``purity_per_cluster`` the textbook one; ``nmi``, ``ami``, ``ari``,
        ``inertia``), ``alignment`` and ``uniformity``, the semantic measures of the errors
        (``path``, ``lch``, ``wup``, ``sibling_rate``, ``hypernym_rate``, ``hyponym_rate``)
        and probe accuracies (``pca<k>_top1``, ``mlp_top1``, ``mlp_noact_top1``, in %).
    semantic : dict of str to dict
        JSON summary of each domain's error analysis: ``overall``, ``seeds``, ``shots`` and
        its ``top_confusions`` with their WordNet explanation.
    probes : dict of str to dict
        ``{domain: {"pca": ProbeScores.to_dict(), ...}}`` when probes ran.
    settings : dict
    errors : dict of str to SemanticErrors
        The full error analysis of each domain (first seed), not saved to JSON.
    probe_scores : dict of str to dict of ProbeScores
        Not saved to JSON.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import analyze
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(np.arange(3), 10)
    >>> X = rng.normal(size=(3, 4))[y] * 5 + rng.normal(size=(30, 4))
    >>> report = analyze({"L1": (X, y, X, y)}, analyses=("alignment",), device="cpu")
    >>> sorted(report.domains["L1"])[:2], report.to_dict()["model"]
    (['alignment', 'uniformity'], 'model')
    """

    def __init__(
        self,
        model,
        domains,
        semantic=None,
        probes=None,
        settings=None,
        errors=None,
        probe_scores=None,
    ):
        self.model = model
        self.domains = domains
        self.semantic = semantic or {}
        self.probes = probes or {}
        self.settings = settings or {}
        self.errors = errors or {}
        self.probe_scores = probe_scores or {}
        #: ``{path: sha256}`` of the prediction files the report was computed from.
        self.inputs = {}
        #: ``{path: sha256}`` of the manifests of the feature stores it was computed from.
        self.stores = {}
        #: ``{path: sha256}`` of the evaluations' records (``knn.jsonl``, ``zeroshot.jsonl``).
        self.records = {}
        #: The other sections of ``analysis.json``, one per evaluation (``"knn"``,
        #: ``"zeroshot"``): ``{section: {domain: details}}``.
        self.sections = {}

    def to_dict(self):
        """Everything but the in-memory objects, JSON-safe (what ``analysis.json`` holds, with
        its format version)."""
        out = {"model": self.model, "domains": self.domains, "semantic": self.semantic}
        if self.probes:
            out["probes"] = self.probes
        return out | self.sections | {"settings": self.settings}

    def save(self, path):
        """Write :meth:`to_dict` as JSON with the format version, atomically (a temporary
        file, then a rename), bound by checksums to itself and to the prediction files and
        feature stores it was computed from (``imagenet-cog verify`` and every reader check
        them).

        Returns
        -------
        pathlib.Path
        """
        return write_analysis(path, self.to_dict(), self.inputs, self.stores, self.records)

    def table(self, digits=3):
        """A text table: one row per domain, a column per measure, and alignment and
        uniformity relative to IN-1K (``Δalign``, ``Δunif``). Rates are in percent.

        Returns
        -------
        str
        """
        from ._tables import format_analysis_table

        return format_analysis_table(self.to_dict(), self.model, digits)

    def __str__(self):
        return self.table()

    def __repr__(self):
        return (
            f"AnalysisReport(model={self.model!r}, domains={list(self.domains)}, "
            f"analyses={self.settings.get('analyses')})"
        )

    def plot(self, path=None, metrics=None, dpi=120, note=None):
        """The measures per domain, one panel each (:func:`plot_analysis`).

        Parameters
        ----------
        path : path, optional
            Where to save (PNG).
        metrics : sequence of str, optional
            By default the paper's measures present: purity, NMI, AMI, ARI, alignment,
            uniformity, the semantic measures, and the probe accuracies.
        dpi : int
        note : str, optional
            A footnote under the panels (the command line puts there why the run is not
            comparable with the paper).

        Returns
        -------
        matplotlib.figure.Figure
        """
        from ._grid import display_domain

        present = {m for values in self.domains.values() for m in values}
        if metrics is None:
            metrics = plotted_keys(present)
        scores = {display_domain(d): v for d, v in self.domains.items()}
        return plot_analysis(scores, path, metrics=metrics, title=self.model, dpi=dpi, note=note)


def analyze(
    features=None,
    out=None,
    domains=None,
    analyses=None,
    predictions=None,
    seeds=3,
    device=None,
    *,
    model=None,
    top_k=5,
    shots="all",
    semantic_seed="first",
    taxonomy=None,
    probe_seeds=SEEDS,
    pca_components=PCA_COMPONENTS,
    probe_kw=None,
    knn_k=DINO_KS,
    knn_temperature=DINO_TEMPERATURE,
    knn_shots=SHOTS,
    knn_seeds=SEEDS,
    text_tower=None,
    classnames=None,
    templates=None,
    embeddings_cache=None,
    progress=False,
    verbose=0,
):
    """Run the analyses beyond accuracy on a model's features and predictions.

    Per domain (IN-1K and L1..L5, or whatever the features hold):

    - ``"clusters"``: :func:`cluster_scores`: k-means (k = the number of concepts, the lowest
      inertia of ``seeds`` runs) on the train features, test samples assigned to the nearest
      centroid, scored with purity (per concept, the paper's Eq. 3), NMI, AMI and ARI;
    - ``"alignment"``: :func:`alignment_uniformity` on the l2-normalised test features;
    - ``"semantic"``: :func:`semantic_errors` of the linear probe's test predictions saved by
      :func:`~imagenet_cog.evaluate` (``save_predictions=True``): by default the all-data
      cell of the lowest seed (``semantic_seed="first"``); ``"mean"`` averages the overall
      measures over every saved seed (the confusions stay the first seed's); an int picks
      that seed;
    - optional and costly: ``"pca"`` (:func:`pca_probe` over the ``pca_components`` that
      do not exceed ``min(n_train, n_features)``), ``"mlp"`` and ``"mlp_noact"``
      (:func:`mlp_probe`), over ``probe_seeds``;
    - the *evaluations*, other protocols than the paper's linear probe, labelled by their
      protocol in every report and never ranked with linear-probe numbers (see the guide's
      "Other evaluations"): ``"knn"``, DINO's weighted k-NN (:class:`~imagenet_cog.KNNProbe`'s
      search and votes) on the linear protocol's grid: for each of ``knn_shots`` and each of
      ``knn_seeds``, the rows the linear protocol's final model trains on
      (``make_search_spec(y_train, seed, n_shots=N).final_idx``), and all the training
      images once; ``"zeroshot"``, the model's text tower classifying each domain's test
      images among its concepts' names. With ``out``, each cell is recorded in
      ``out/knn.jsonl`` (``out/zeroshot.jsonl``), bound by checksum, and a rerun reads back
      the cells already there instead of computing them again.

    Without ``features`` only the semantic analysis runs; without ``predictions`` it is
    skipped. ``settings["skipped"]`` says what was skipped and why (``"unfinished cells"``:
    the prediction files no record names, left out). The analyses that need
    features run first on each domain, on its features loaded once.

    Parameters
    ----------
    features : path or mapping, optional
        A feature-store root, or ``{domain: (X_train, y_train, X_test, y_test)}`` as for
        :func:`~imagenet_cog.evaluate`.
    out : path, optional
        Folder to write ``analysis.json`` into (atomically). Put it beside the ``runs.jsonl``
        of the evaluation and :meth:`Results.load <imagenet_cog.Results.load>` shows it.
    domains : sequence of str, optional
        Default: every domain of the features (or of the predictions).
    analyses : sequence of str, optional
        Among ``"clusters"``, ``"alignment"``, ``"semantic"``, ``"knn"``, ``"zeroshot"``,
        ``"pca"``, ``"mlp"``, ``"mlp_noact"``; by default the first three.
    predictions : path, optional
        An evaluate output folder holding ``predictions/`` (or that folder).
    seeds : int
        k-means runs per domain (the paper: 3).
    device : str, optional
        For k-means, alignment/uniformity and the probes; default CUDA when available.
    model : str, optional
        Name in the output (default: the store's model spec, or the evaluation's model).
    top_k : int
        Confusions explained per class.
    shots : int or "all"
        The cell whose predictions the semantic analysis reads.
    semantic_seed : "first", "mean" or int
    taxonomy : Taxonomy, optional
        For the semantic analysis; the bundled WordNet by default.
    probe_seeds, pca_components : sequences
        For the PCA and MLP probes.
    probe_kw : dict, optional
        Passed to :func:`pca_probe` and :func:`mlp_probe` (``n_trials``, ``epochs``, ...).
    knn_k : sequence of int
        The k of the k-NN (DINO's 10, 20, 100 and 200), all from one search per cell; a k
        above a cell's training rows votes with all of them (the record says ``k_searched``).
    knn_temperature : float
        T of the k-NN's votes ``exp(s / T)`` (DINO's 0.07).
    knn_shots, knn_seeds : sequences
        The k-NN's grid (the paper's shots and five seeds); a shots value larger than a
        class of a domain holds is skipped there, and said in ``settings["skipped"]``.
    text_tower : str, optional
        The model spec whose text tower classifies for ``"zeroshot"``; by default the spec
        the store's features were extracted with. Refused unless its image tower has the
        weights and the feature layer of the store's.
    classnames : None, "openai", path or mapping
        Zero-shot's class names: a file (``wnid<TAB>name``), ``{wnid: name}``, ``"openai"``
        (OpenAI's curated IN-1K names, as published CLIP IN-1K numbers use; the levels keep
        the package's), or None: the package's WordNet names.
    templates : path or sequence of str, optional
        Zero-shot's prompt templates (``{c}`` where the name goes); OpenAI's 80 ImageNet
        templates by default.
    embeddings_cache : path or False, optional
        Where the class embeddings are cached (default ``~/.cache/imagenet_cog``); False:
        not cached.
    progress : bool
        Progress bars of the evaluations' searches and embeddings.
    verbose : int
        1: a line per domain and analysis (and per k-NN cell).

    Returns
    -------
    AnalysisReport

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import analyze
    >>> rng = np.random.default_rng(0)
    >>> def domain(sep):
    ...     means = rng.normal(size=(3, 8)) * sep
    ...     y_tr, y_te = np.repeat(np.arange(3), 20), np.repeat(np.arange(3), 10)
    ...     return (means[y_tr] + rng.normal(size=(60, 8)), y_tr,
    ...             means[y_te] + rng.normal(size=(30, 8)), y_te)
    >>> report = analyze({"in1k": domain(4.0), "L5": domain(0.5)}, device="cpu")
    >>> report.domains["in1k"]["nmi"] > report.domains["L5"]["nmi"]
    True
    >>> print(report.table())  # doctest: +ELLIPSIS
    analysis of model
    domain  purity    NMI    AMI    ARI  align  Δalign    unif   Δunif
    IN-1K    1.000  1.000  1.000  1.000 ...
    L5 ...
    """
    from . import __version__
    from ._grid import DOMAINS, normalize_shots

    if analyses is None:
        analyses = [name for name, row in ANALYSES.items() if row.default]
    analyses = tuple(dict.fromkeys(analyses))
    unknown = [a for a in analyses if a not in ANALYSES]
    if unknown:
        raise ValueError(f"unknown analyses {unknown}; choose among {list(ANALYSES)}")
    if semantic_seed not in ("first", "mean") and not isinstance(semantic_seed, (int, np.integer)):
        raise ValueError(f"semantic_seed must be 'first', 'mean' or a seed, got {semantic_seed!r}")
    shots = normalize_shots(shots)
    source = None
    if features is not None:
        if not isinstance(features, Mapping) and not Path(features).is_dir():
            raise FileNotFoundError(f"features: no feature-store folder at {features}")
        source = feature_source(features)
    cells = {}
    pred_folder = None
    if predictions is not None:
        pred_folder = predictions_folder(predictions)
        cells = prediction_cells(pred_folder)
    given = {
        "features": source is not None,
        "stores": source is not None,
        "predictions": pred_folder is not None,
    }
    skipped = {}
    if pred_folder is not None and (unfinished := unfinished_cells(pred_folder)):
        skipped["unfinished cells"] = unfinished  # the finished cells are read
    for need, why in NEEDS.items():  # what cannot run, in the order of what it needs
        skipped |= {a: why for a in analyses if ANALYSES[a].needs == need and not given[need]}
    todo = [a for a in analyses if a not in skipped]
    if not todo:
        raise ValueError(
            f"nothing to compute: {'; '.join(f'{a}: {why}' for a, why in skipped.items())}"
        )

    if source is not None:
        available = source.available()
    else:
        available = list(dict.fromkeys(d for (d, n, _) in cells if n == shots))

    def order(names):
        return sorted(names, key=lambda d: (DOMAINS.index(d), "") if d in DOMAINS else (9, d))

    if domains is None:
        domains = order(available)
    else:
        domains = list(domains)
        missing = [d for d in domains if d not in available]
        if missing:
            what = "features" if source is not None else f"predictions (N={shots})"
            raise ValueError(f"no {what} for domain(s) {missing}; available: {order(available)}")
    if not domains:
        raise ValueError("no domains to analyse")

    if model is None:
        model = _model_name(source, predictions)
    # The one resolution of the device: each analysis takes the placement as resolved.
    place = Placement(resolve_analysis_device(device))
    ks = _ks(knn_k)
    if not (isinstance(knn_temperature, (int, float)) and 0 < knn_temperature < math.inf):
        raise ValueError(f"knn_temperature must be a finite float > 0, got {knn_temperature!r}")
    options = Options(
        place=place,
        kmeans_seeds=seeds,
        top_k=top_k,
        shots=shots,
        semantic_seed=semantic_seed,
        taxonomy=taxonomy,
        probe_seeds=probe_seeds,
        pca_components=pca_components,
        probe_kw=dict(probe_kw or {}),
        verbose=verbose,
        progress=bool(progress),
        model=str(model),
        out=None if out is None else Path(out),
        knn_ks=ks,
        knn_temperature=float(knn_temperature),
        grid_shots=tuple(Shots(knn_shots)),
        grid_seeds=tuple(Seeds(knn_seeds)),
        text_tower=text_tower,
        classnames=classnames,
        templates=templates,
        embeddings_cache=embeddings_cache,
    )
    # The rows that need features run first, on the domain's features loaded once.
    rows = [row for row in ANALYSES.values() if row.name in todo]
    on_features = [row for row in rows if row.needs == "features"]
    rows = on_features + [row for row in rows if row.needs != "features"]
    per_domain, sections, kept, read, stores, records = {}, {}, {}, {}, {}, {}
    for domain in domains:
        data = DomainData(domain, cells=cells, predictions=pred_folder, source=source)
        measures = {}
        for row in rows:
            if row.needs in ("features", "stores") and source is not None:
                for manifest in source.manifest_files([domain]):  # what analysis.json rests on
                    stores[str(manifest)] = file_sha256(manifest)
            if row.needs == "features" and data.features is None:
                data.features = source.load(domain)
            found = row.run(data, options)
            if on_features and row is on_features[-1]:  # the features' last analysis
                data.features = None
                source.release(domain)
            if found.skipped is not None:
                skipped.setdefault(f"{row.name}_domains", {})[domain] = found.skipped
                continue
            measures |= found.measures
            read |= found.inputs
            records |= found.records
            if found.details is not None:
                sections.setdefault(row.section, {}).setdefault(domain, {}).update(found.details)
            if found.kept is not None:
                kept.setdefault(row.name, {})[domain] = found.kept
        per_domain[domain] = measures
    for name in todo:  # skipped on every domain for one reason: skipped, said once
        found = skipped.get(f"{name}_domains") or {}
        if set(found) == set(domains) and len(set(found.values())) == 1:
            skipped[name] = skipped.pop(f"{name}_domains")[domains[0]]
    ran = [a for a in analyses if a not in skipped]
    settings = {
        "analyses": ran,
        "skipped": skipped,
        "features": None
        if features is None
        else ("arrays" if isinstance(features, Mapping) else str(features)),
        "predictions": None if pred_folder is None else str(pred_folder),
        "kmeans_seeds": int(seeds),
        "device": str(place.device),
        "top_k": int(top_k),
        "shots": shots,
        "semantic_seed": semantic_seed if isinstance(semantic_seed, str) else int(semantic_seed),
        "definitions": definitions(),
        "library_version": __version__,
    }
    for name in ran:
        if ANALYSES[name].settings is not None:
            settings |= ANALYSES[name].settings(options)
    report = AnalysisReport(
        model,
        per_domain,
        sections.get("semantic"),
        sections.get("probes"),
        settings,
        _kept(kept, "semantic"),
        _kept(kept, "probes"),
    )
    report.inputs = read
    report.stores = stores
    report.records = records
    report.sections = {
        name: found
        for name, found in sections.items()
        if name is not None and name not in ("semantic", "probes")
    }
    if out is not None:
        report.save(analysis_path(out))
    return report


def _ks(knn_k):
    """The k of the k-NN as a sorted tuple of ints >= 1, or a one-line ``ValueError``."""
    values = [knn_k] if isinstance(knn_k, (int, np.integer)) else list(knn_k)
    if not values or any(
        isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in values
    ):
        raise ValueError(f"knn_k must be ints >= 1 (--knn-k 10,20,100,200), got {knn_k!r}")
    return tuple(sorted({int(k) for k in values}))


def plan_knn(
    features, domains=None, *, knn_k=DINO_KS, knn_shots=SHOTS, knn_seeds=SEEDS, device=None
):
    """What ``analyze(..., analyses=["knn"])`` would compute and what it costs, without
    computing it: per domain the cells of the grid, the floating-point operations of their
    searches, the most memory one search holds on the device (from its
    :class:`~imagenet_cog._neighbors.search.NeighborPlan`) and the time predicted from a
    search timed here. Reads the stores' labels, not their features.

    Parameters
    ----------
    features : path or mapping
        A feature-store root, or arrays as for :func:`analyze`.
    domains : sequence of str, optional
    knn_k, knn_shots, knn_seeds, device
        As for :func:`analyze`.

    Returns
    -------
    KNNPlan
        ``table()`` for a person, ``to_dict()`` for a program, ``seconds`` the predicted
        time.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import plan_knn
    >>> y = np.repeat(np.arange(4), 40)
    >>> X = np.random.default_rng(0).normal(size=(160, 16)).astype(np.float32)
    >>> plan = plan_knn({"L1": (X, y, X[:40], y[:40])}, knn_shots=(1, "all"),
    ...                 knn_seeds=(22, 37), device="cpu")
    >>> plan.rows[0]["cells"], plan.flop  # 2 seeds of N=1, and all: 2 x 40 x (2x4 + 160) x 16
    (3, 215040)
    """
    from ._analysis.knn_grid import plan_knn as _plan

    source = feature_source(features)
    available = source.available()
    domains = list(domains) if domains is not None else available
    missing = [d for d in domains if d not in available]
    if missing:
        raise ValueError(f"no features for domain(s) {missing}; available: {available}")
    return _plan(
        source,
        domains,
        ks=_ks(knn_k),
        shots=tuple(Shots(knn_shots)),
        seeds=tuple(Seeds(knn_seeds)),
        device=resolve_analysis_device(device),
    )


def _kept(kept, section):
    """The results kept in memory of the analyses of a section of ``analysis.json``:
    ``{domain: result}``, or ``{domain: {analysis: result}}`` for a section that holds one
    record per analysis."""
    out = {}
    for name, found in kept.items():
        if ANALYSES[name].section != section:
            continue
        for domain, result in found.items():
            if section in NESTED_SECTIONS:
                out.setdefault(domain, {})[name] = result
            else:
                out[domain] = result
    return out


def _model_name(source, predictions):
    """The store's model spec, else the evaluation's model, else ``"model"``."""
    if source is not None:
        try:
            name = source.model_name()
        except (OSError, KeyError, ValueError, IndexError):
            name = None
        if name:
            return name
    if predictions is not None:
        base = Path(predictions)
        for folder in (base, base.parent):
            name = (read_config(folder) or {}).get("model")
            if name:
                return str(name)
    return "model"
