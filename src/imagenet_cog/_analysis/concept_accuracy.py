"""Accuracy per concept, against each concept's similarity to ImageNet-1K.

Stage "analysis". The levels sort concepts by their similarity to the 1000 seen concepts and
average over a thousand at a time; this looks inside a level: each unseen concept's top-1
over the seeds (from the predictions ``evaluate`` saves), beside the similarity that placed
it in its level. Spearman's rank correlation says how far the similarity alone orders the
concepts by accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._grid import display_domain, display_shots, domain_key, normalize_shots, shot_key
from .._optional_dependencies import require
from .._reporting.concepts import concept_names, run_levels
from .._runfolder import concept_hits, prediction_cells, predictions_folder
from .._tables import printable

__all__ = ["ConceptAccuracy", "concept_accuracy"]


@dataclass(frozen=True)
class ConceptAccuracy:
    """Top-1 accuracy of each concept, with its level and its similarity to IN-1K.

    Attributes
    ----------
    wnids : ndarray of str
    domains : ndarray of str
        The level each concept was evaluated in (``"L1"`` ... ``"L5"``).
    similarity : ndarray of float
        The similarity to the seen set that ranked the concept (the levels' scores).
    accuracy : ndarray of float
        Top-1 (%) over the concept's test images, mean over the seeds.
    std : ndarray of float
        Its standard deviation over the seeds (population, as the tables).
    n_test : ndarray of int
        Test images of the concept.
    shots : int or "all"
    seeds : tuple of int
    spearman : float
        Rank correlation of similarity and accuracy over all concepts.
    names : ndarray of str, optional
        Each concept's readable name (its first WordNet lemma); looked up in the bundled
        WordNet when not given.

    Examples
    --------
    >>> import numpy as np
    >>> c = ConceptAccuracy(np.array(["n01440764", "n15102894"]), np.array(["L1", "L5"]),
    ...                     np.array([0.9, 0.4]), np.array([80.0, 40.0]), np.zeros(2),
    ...                     np.array([50, 50]), "all", (22,), 1.0)
    >>> print(c.table(2))
    concept    name      level  similarity  top-1 (%)  ± seeds  test images
    n01440764  tench     L1          0.900       80.0      0.0           50
    n15102894  knothole  L5          0.400       40.0      0.0           50
    """

    wnids: np.ndarray
    domains: np.ndarray
    similarity: np.ndarray
    accuracy: np.ndarray
    std: np.ndarray
    n_test: np.ndarray
    shots: object
    seeds: tuple
    spearman: float
    names: np.ndarray = None

    def __post_init__(self):
        if self.names is None:  # frozen: set once, here
            object.__setattr__(self, "names", concept_names(self.wnids))

    def table(self, rows=20):
        """The first ``rows`` concepts, most similar to IN-1K first, as text: each concept's
        wnid beside its name, as the error analysis names them."""
        order = np.argsort(-self.similarity, kind="stable")[:rows]
        lines = [("concept", "name", "level", "similarity", "top-1 (%)", "± seeds", "test images")]
        for i in order:
            lines.append(
                (
                    printable(self.wnids[i]),
                    printable(self.names[i]),
                    printable(display_domain(str(self.domains[i]))),
                    f"{self.similarity[i]:.3f}",
                    f"{self.accuracy[i]:.1f}",
                    f"{self.std[i]:.1f}",
                    str(int(self.n_test[i])),
                )
            )
        widths = [max(len(r[j]) for r in lines) for j in range(7)]
        return "\n".join(
            "  ".join(
                c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))
            ).rstrip()
            for r in lines
        )

    def to_csv(self, path=None):
        """Every concept as CSV (``wnid,name,level,similarity,top1,std,n_test``); written
        atomically to ``path`` if given."""
        import csv
        import io

        from .._fileio import atomic_write_text
        from .._tables import csv_cell

        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["wnid", "name", "level", "similarity", "top1", "std", "n_test"])
        for i in range(len(self.wnids)):
            writer.writerow(
                [
                    csv_cell(self.wnids[i]),
                    csv_cell(self.names[i]),
                    csv_cell(self.domains[i]),
                    f"{self.similarity[i]:.6f}",
                    f"{self.accuracy[i]:.4f}",
                    f"{self.std[i]:.4f}",
                    int(self.n_test[i]),
                ]
            )
        text = buffer.getvalue()
        if path is not None:
            atomic_write_text(path, text)
        return text

    def plot(self, path=None, note=None):
        """Accuracy against similarity to IN-1K, a point per concept coloured by level, with
        the mean accuracy in bins of similarity; saved to ``path`` (PNG, PDF or SVG) if given.

        Returns
        -------
        matplotlib.figure.Figure
        """
        matplotlib = require("matplotlib", "ConceptAccuracy.plot()")
        from matplotlib.figure import Figure

        # A page's width (7 in): its text is the size it is set in when the figure is
        # included at \linewidth.
        fig = Figure(figsize=(7.0, 3.6), layout="constrained")
        ax = fig.subplots()
        levels = sorted(set(self.domains.tolist()), key=domain_key)
        # viridis without its pale yellow end, which vanishes on white.
        cmap = matplotlib.colormaps["viridis"]
        for i, level in enumerate(levels):
            keep = self.domains == level
            ax.scatter(
                self.similarity[keep],
                self.accuracy[keep],
                s=14,
                alpha=0.75,
                color=cmap(0.78 * i / max(1, len(levels) - 1)),
                label=display_domain(level),
                linewidths=0,
            )
        edges = np.quantile(self.similarity, np.linspace(0, 1, 11))
        which = np.clip(np.searchsorted(edges, self.similarity, side="right") - 1, 0, 9)
        centres = [self.similarity[which == b].mean() for b in range(10) if np.any(which == b)]
        means = [self.accuracy[which == b].mean() for b in range(10) if np.any(which == b)]
        ax.plot(centres, means, color="black", marker="o", linewidth=2, label="mean per decile")
        ax.set_xlabel("similarity of the concept to IN-1K (the levels' measure)", fontsize=8)
        ax.set_ylabel("top-1 (%), mean over seeds", fontsize=8)
        ax.tick_params(labelsize=7)
        rho = "no rank correlation" if np.isnan(self.spearman) else f"Spearman {self.spearman:+.2f}"
        ax.set_title(
            f"Accuracy per concept, N={display_shots(self.shots)} "
            f"({rho}, {len(self.wnids)} concepts)",
            fontsize=9,
        )
        ax.grid(alpha=0.3)
        fig.legend(loc="outside right upper", fontsize=7, markerscale=1.5)
        if note:
            import textwrap

            text = "\n".join(textwrap.wrap(note, 125))
            fig.supxlabel(text, fontsize=6.5, x=0.01, ha="left", color="darkred")
        if path is not None:
            from .._figures import save_figure

            save_figure(fig, path, str(path).rsplit(".", 1)[-1].lower())
        return fig


def concept_accuracy(predictions, levels=None, shots="all", domains=None):
    """Accuracy of each unseen concept from an ``evaluate`` run's saved predictions.

    Parameters
    ----------
    predictions : path
        An ``evaluate`` output folder run with ``save_predictions=True`` (or its
        ``predictions/`` folder); prediction files no record names (cells that did not
        finish) are left out.
    levels : str, path or Levels, optional
        The levels whose scores give each concept's similarity to IN-1K. By default the
        levels the run was made with, as its ``config.json`` records them (the official
        ones for a folder without one); levels given must be those, by content.
    shots : int or "all"
    domains : list of str, optional
        Levels to include; default every level (``"L1"`` ... ``"L5"``) with predictions.

    Returns
    -------
    ConceptAccuracy

    Raises
    ------
    FileNotFoundError
        When no predictions of these shots are saved for any level.
    ValueError
        When a concept of the predictions has no score in the levels, or the levels given
        are not the run's.

    Examples
    --------
    >>> from imagenet_cog.analysis import concept_accuracy
    >>> c = concept_accuracy("results/resnet50")  # doctest: +SKIP
    >>> print(c.table(5))  # doctest: +SKIP
    """
    from scipy.stats import spearmanr

    lv = run_levels(predictions, levels)
    scores = lv.scores or {}
    folder = predictions_folder(predictions)
    shots = normalize_shots(shots)
    cells = prediction_cells(folder)
    present = sorted({d for (d, n, _) in cells if n == shots and d != "in1k"}, key=domain_key)
    wanted = present if domains is None else [d for d in domains if d in present]
    if not wanted:
        have = sorted(
            {(d, n) for (d, n, _) in cells}, key=lambda x: (domain_key(x[0]), shot_key(x[1]))
        )
        raise FileNotFoundError(
            f"no saved predictions of a level with N={display_shots(shots)} in {folder}; have "
            f"{[f'{d} N={display_shots(n)}' for d, n in have]} (evaluate --save-predictions "
            "saves them)"
        )
    rows = {"wnids": [], "domains": [], "similarity": [], "accuracy": [], "std": [], "n": []}
    seeds_used = set()
    for domain in wanted:
        per_seed = []
        # Few-shot cells sit beside the "all" ones: only this shots value, by seed.
        mine = sorted(
            (seed, path) for (d, n, seed), path in cells.items() if (d, n) == (domain, shots)
        )
        for seed, path in mine:
            concepts, hits, counts = concept_hits(path)
            per_seed.append((concepts, 100.0 * hits / counts, counts))
            seeds_used.add(seed)
        concepts = per_seed[0][0]
        if any(not np.array_equal(c, concepts) for c, _, _ in per_seed):
            raise ValueError(f"the seeds of {domain} N={display_shots(shots)} saved other concepts")
        acc = np.stack([a for _, a, _ in per_seed])
        missing = [w for w in concepts if w not in scores]
        if missing:
            raise ValueError(
                f"{len(missing)} concept(s) of {domain} have no similarity score in the levels "
                f"({missing[:3]}...): give the levels the run used (levels=)"
            )
        rows["wnids"] += concepts.tolist()
        rows["domains"] += [domain] * len(concepts)
        rows["similarity"] += [float(scores[w]) for w in concepts]
        rows["accuracy"] += acc.mean(axis=0).tolist()
        rows["std"] += acc.std(axis=0).tolist()
        rows["n"] += per_seed[0][2].tolist()
    sim, acc = np.array(rows["similarity"]), np.array(rows["accuracy"])
    # No correlation where either side does not vary (every concept at 0% with one shot).
    varies = len(sim) > 2 and np.ptp(sim) > 0 and np.ptp(acc) > 0
    rho = float(spearmanr(sim, acc).statistic) if varies else float("nan")
    return ConceptAccuracy(
        np.array(rows["wnids"]),
        np.array(rows["domains"]),
        sim,
        acc,
        np.array(rows["std"]),
        np.array(rows["n"], dtype=int),
        shots,
        tuple(sorted(seeds_used)),
        rho,
    )
