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

from ._grid import display_domain, display_shots, domain_key, normalize_shots
from ._optional_dependencies import require
from ._runfolder import prediction_cells, predictions_folder, read_predictions

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

    Examples
    --------
    >>> import numpy as np
    >>> c = ConceptAccuracy(np.array(["n1", "n2"]), np.array(["L1", "L5"]),
    ...                     np.array([0.9, 0.4]), np.array([80.0, 40.0]), np.zeros(2),
    ...                     np.array([50, 50]), "all", (22,), 1.0)
    >>> print(c.table(2))
    concept  level  similarity  top-1 (%)  ± seeds  test images
    n1       L1          0.900       80.0      0.0           50
    n2       L5          0.400       40.0      0.0           50
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

    def table(self, rows=20):
        """The first ``rows`` concepts, most similar to IN-1K first, as text."""
        order = np.argsort(-self.similarity, kind="stable")[:rows]
        lines = [("concept", "level", "similarity", "top-1 (%)", "± seeds", "test images")]
        for i in order:
            lines.append(
                (
                    str(self.wnids[i]),
                    display_domain(str(self.domains[i])),
                    f"{self.similarity[i]:.3f}",
                    f"{self.accuracy[i]:.1f}",
                    f"{self.std[i]:.1f}",
                    str(int(self.n_test[i])),
                )
            )
        widths = [max(len(r[j]) for r in lines) for j in range(6)]
        return "\n".join(
            "  ".join(
                c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))
            )
            for r in lines
        )

    def to_csv(self, path=None):
        """Every concept as CSV (``wnid,level,similarity,top1,std,n_test``); written
        atomically to ``path`` if given."""
        from ._fileio import atomic_write_text

        lines = ["wnid,level,similarity,top1,std,n_test"]
        for i in range(len(self.wnids)):
            lines.append(
                f"{self.wnids[i]},{self.domains[i]},{self.similarity[i]:.6f},"
                f"{self.accuracy[i]:.4f},{self.std[i]:.4f},{int(self.n_test[i])}"
            )
        text = "\n".join(lines) + "\n"
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

        fig = Figure(figsize=(7.5, 4.8), layout="constrained")
        ax = fig.subplots()
        levels = sorted(set(self.domains.tolist()), key=domain_key)
        cmap = matplotlib.colormaps["viridis"]
        for i, level in enumerate(levels):
            keep = self.domains == level
            ax.scatter(
                self.similarity[keep],
                self.accuracy[keep],
                s=6,
                alpha=0.45,
                color=cmap(i / max(1, len(levels) - 1)),
                label=display_domain(level),
                linewidths=0,
            )
        edges = np.quantile(self.similarity, np.linspace(0, 1, 11))
        which = np.clip(np.searchsorted(edges, self.similarity, side="right") - 1, 0, 9)
        centres = [self.similarity[which == b].mean() for b in range(10) if np.any(which == b)]
        means = [self.accuracy[which == b].mean() for b in range(10) if np.any(which == b)]
        ax.plot(centres, means, color="black", marker="o", linewidth=2, label="mean per decile")
        ax.set_xlabel("similarity of the concept to IN-1K (the levels' measure)")
        ax.set_ylabel("top-1 (%), mean over seeds")
        ax.set_title(
            f"Accuracy per concept, N={display_shots(self.shots)} "
            f"(Spearman {self.spearman:+.2f}, {len(self.wnids)} concepts)"
        )
        ax.grid(alpha=0.3)
        fig.legend(loc="outside right upper", fontsize=8, markerscale=2)
        if note:
            fig.supxlabel(note, fontsize=7, x=0.01, ha="left", color="darkred")
        if path is not None:
            from ._figures import save_figure

            save_figure(fig, path, str(path).rsplit(".", 1)[-1].lower())
        return fig


def concept_accuracy(predictions, levels="official", shots="all", domains=None):
    """Accuracy of each unseen concept from an ``evaluate`` run's saved predictions.

    Parameters
    ----------
    predictions : path
        An ``evaluate`` output folder run with ``save_predictions=True`` (or its
        ``predictions/`` folder).
    levels : str, path or Levels
        The levels the run used (their scores give each concept's similarity to IN-1K);
        ``"official"`` by default.
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
        When a concept of the predictions has no score in the levels.

    Examples
    --------
    >>> from imagenet_cog.analysis import concept_accuracy
    >>> c = concept_accuracy("results/resnet50")  # doctest: +SKIP
    >>> print(c.table(5))  # doctest: +SKIP
    """
    from scipy.stats import spearmanr

    from .levels import Levels, load_levels

    lv = levels if isinstance(levels, Levels) else load_levels(levels)
    scores = lv.scores or {}
    folder = predictions_folder(predictions)
    shots = normalize_shots(shots)
    cells = prediction_cells(folder)
    present = sorted({d for (d, n, _) in cells if n == shots and d != "in1k"}, key=domain_key)
    wanted = present if domains is None else [d for d in domains if d in present]
    if not wanted:
        have = sorted({f"{d} N={display_shots(n)}" for (d, n, _) in cells})
        raise FileNotFoundError(
            f"no saved predictions of a level with N={display_shots(shots)} in {folder}; have "
            f"{have} (evaluate --save-predictions saves them)"
        )
    rows = {"wnids": [], "domains": [], "similarity": [], "accuracy": [], "std": [], "n": []}
    seeds_used = set()
    for domain in wanted:
        per_seed = []
        for (d, n, seed), path in sorted(cells.items()):
            if d != domain or n != shots:
                continue
            found = read_predictions(path, keys=("y_true", "y_pred"))  # checked, one line
            y_true, y_pred = found["y_true"], found["y_pred"]
            concepts, idx = np.unique(y_true, return_inverse=True)
            hits = np.bincount(idx, weights=(y_true == y_pred), minlength=len(concepts))
            counts = np.bincount(idx, minlength=len(concepts))
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
    rho = float(spearmanr(sim, acc).statistic) if len(sim) > 2 else float("nan")
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
