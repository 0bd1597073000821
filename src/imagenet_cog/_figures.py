"""Figures of results in the style of the paper's Figures 3 and 4 (matplotlib).

Stage "results": :meth:`~imagenet_cog.Results.figures` and :meth:`~imagenet_cog.Results.plot`
draw through here. matplotlib (the ``plot`` extra) is imported only when a figure is made.
"""

from __future__ import annotations

import io
import math
import textwrap

import numpy as np

from ._comparability import NOT_COMPARABLE_MARK, not_comparable
from ._fileio import atomic_write_bytes
from ._grid import display_domain, display_shots
from ._optional_dependencies import require

__all__ = ["decisive_first", "footnote_text", "pyplot", "results_figures", "save_figure"]


def pyplot():
    """matplotlib's pyplot on the Agg backend, or an ImportError naming the extra."""
    matplotlib = require("matplotlib", "plot()")
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, format="png"):
    """Write ``fig`` atomically as PNG (130 dpi), PDF or SVG (vector)."""
    if format not in FORMATS:
        raise ValueError(f"figure format {format!r}: choose from {', '.join(FORMATS)}")
    buffer = io.BytesIO()
    # A footnote under a constrained layout can reach the edge: keep a margin around all.
    fig.savefig(buffer, dpi=130, format=format, bbox_inches="tight", pad_inches=0.12)
    atomic_write_bytes(path, buffer.getvalue())


#: The paper's model groups (its Table 1 and Figures 3-4): prefix -> (name, colour map, marker).
GROUPS = {
    "": ("reference", "Greys", "*"),
    "a": ("a- architecture", "Blues", "s"),
    "s": ("s- self-supervision", "Reds", "o"),
    "r": ("r- regularisation", "Greens", "^"),
    "d": ("d- more data", "Purples", "D"),
}
#: Colours of the user's own models: none of the groups' hues (Dark2's orange, teal, pink...).
USER_COLOURS = ("#d95f02", "#1b9e77", "#e7298a", "#e6ab02", "#a6761d", "#666666")
USER_MARKERS = ("P", "X", "h", "v", "<", ">")
#: Words of a deviation, most decisive first: what changes the data or the network before
#: what changes the protocol's constants.
DECISIVE = (
    "concepts",
    "random-initialised",
    "test images",
    "training images",
    "levels",
    "extraction",
    "preset",
    "amp=",
    "normalised",
    "seed",
)
FORMATS = ("png", "pdf", "svg")


def decisive_first(reasons):
    """``reasons`` ordered by how much each changes the numbers (the data and the network
    first, the protocol's constants after), otherwise in their given order."""

    def rank(reason):
        hits = [i for i, word in enumerate(DECISIVE) if word in reason]
        return min(hits) if hits else len(DECISIVE)

    return sorted(reasons, key=rank)


def footnote_text(flagged, shown=2):
    """One footnote for the models that are not comparable, their decisive reasons first."""
    if not flagged:
        return ""
    parts = []
    for model, reasons in flagged.items():
        ordered = decisive_first(reasons)
        more = f" (+{len(ordered) - shown} more)" if len(ordered) > shown else ""
        parts.append(f"{model}: " + "; ".join(ordered[:shown]) + more)
    return f"{NOT_COMPARABLE_MARK} " + " | ".join(parts)


def group_of(model, categories):
    """The paper's group prefix of a model (``"a"``, ``"s"``, ``"r"``, ``"d"``, ``""`` for
    ResNet50), or ``None`` for a model that is not one of the paper's."""
    if model not in categories:
        return None
    prefix = model.split("-", 1)[0] if "-" in model else ""
    return prefix if prefix in GROUPS else ""


def model_styles(models, categories, highlight, flagged):
    """Line style per model: the paper's models by group (colour family and marker), the
    user's own in colours outside every group; faint and unlabelled when others are
    highlighted and a model is not."""
    import matplotlib

    styles, by_group, user = {}, {}, 0
    for model in models:
        by_group.setdefault(group_of(model, categories), []).append(model)
    for group, members in by_group.items():
        for j, model in enumerate(members):
            if group is None:
                colour, marker = USER_COLOURS[user % 6], USER_MARKERS[user % 6]
                user += 1
            else:
                _, cmap, marker = GROUPS[group]
                shade = 0.9 if len(members) == 1 else 0.95 - 0.5 * j / (len(members) - 1)
                colour = matplotlib.colormaps[cmap](shade if group else 0.85)
            faint = bool(highlight) and model not in highlight
            name = f"{model} {NOT_COMPARABLE_MARK}" if model in flagged else model
            styles[model] = {
                "color": colour,
                "marker": marker,
                "alpha": 0.35 if faint else 1.0,
                "linewidth": 0.8 if faint else (2.6 if group is None else 1.8),
                "markersize": 2.5 if faint else 6,
                "zorder": 1 if faint else (4 if group is None else 3),
                "label": None if faint else name,
            }
    return styles


def _group_entries(ax, models, categories, highlight):
    """One legend entry per group of faint (unlabelled) paper models."""
    import matplotlib

    counts = {}
    for model in models:
        group = group_of(model, categories)
        if highlight and model not in highlight and group is not None:
            counts[group] = counts.get(group, 0) + 1
    for group, n in counts.items():
        name, cmap, marker = GROUPS[group]
        ax.plot(
            [],
            [],
            color=matplotlib.colormaps[cmap](0.7),
            marker=marker,
            alpha=0.6,
            linewidth=0.8,
            markersize=3,
            label=f"{name} ({n} model{'s' * (n > 1)})",
        )


def _band(ax, x, mean, std, style):
    """The std over seeds as a shaded band (drawn where a std is known)."""
    mean, std = np.asarray(mean, float), np.asarray(std, float)
    if np.all(np.isnan(std)) or not np.any(std > 0):
        return
    ax.fill_between(
        x,
        mean - std,
        mean + std,
        color=style["color"],
        alpha=0.18,
        linewidth=0,
        zorder=style["zorder"] - 0.5,
    )


def _finish(fig, axes, footnote, title=None):
    """Legend to the right of every panel, the footnote under them: nothing over the data."""
    handles, labels = axes[0].get_legend_handles_labels()
    if title:
        fig.suptitle(title)
    if labels:
        fig.legend(
            handles,
            labels,
            loc="outside right upper",
            fontsize=8,
            ncol=1 if len(labels) <= 18 else 2,
            frameon=True,
        )
    if footnote:
        # As the figure's x label, so that the layout makes room for it under the panels.
        text = "\n".join(textwrap.wrap(footnote, 110))
        fig.supxlabel(text, fontsize=7, x=0.01, ha="left", color="darkred")


def results_figures(results, baseline=None, models=None, highlight=None, metric="top1"):
    """The figures of :meth:`Results.figures`, by name."""
    plt = pyplot()
    models = list(models or results.models)
    if baseline is not None and baseline not in models:
        models.append(baseline)
    highlight = set(highlight or [])
    categories = results.meta.get("categories") or {}
    domains = results.domains
    fig_shots = "all" if "all" in results.shots else results.shots[-1]
    # A non-comparable model is marked in the legend, and why in a footnote (its decisive
    # reasons first), so that a figure shared alone keeps the caveat.
    flagged = {m: v for m, v in not_comparable(results).items() if m in models}
    footnote = footnote_text(flagged)
    styles = model_styles(models, categories, highlight, flagged)
    # Bands for the drawn-bold models (all of them when there are few).
    banded = highlight or (set(models) if len(models) <= 6 else set())
    ordered = sorted(models, key=lambda m: styles[m]["zorder"])  # bold on top
    figures = {}

    def draw(ax, res, model, xs, cells):
        y = [res.mean(model, d, s, metric) for d, s in cells]
        ax.plot(xs, y, **styles[model])
        if model in banded:
            _band(ax, xs, y, [results.std(model, d, s, metric) for d, s in cells], styles[model])

    x = np.arange(len(domains))
    views = [("levels_absolute", results, f"{metric.replace('top', 'top-')} (%)")]
    if baseline is not None:
        views.append(
            ("levels_relative", results.relative_to(baseline, metric), f"− {baseline} (points)")
        )
    which = "all training images" if fig_shots == "all" else f"{fig_shots}-shot"
    for name, res, ylabel in views:
        fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
        for model in ordered:
            draw(ax, res, model, x, [(d, fig_shots) for d in domains])
        ax.set_xticks(x, [display_domain(d) for d in domains])
        _group_entries(ax, models, categories, highlight)
        if res is not results:
            ax.axhline(0, color="k", linewidth=0.8)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.set_title(f"ImageNet-CoG, {which}")
        _finish(fig, [ax], footnote)
        figures[name] = fig

    numeric = [s for s in results.shots if s != "all"]
    if numeric:
        views = [("fewshot", results, "top-1 (%)")]
        if baseline is not None:
            views.append(
                ("fewshot_relative", results.relative_to(baseline, metric), f"− {baseline}")
            )
        ticks = numeric + (["all"] if "all" in results.shots else [])
        xs = np.arange(len(ticks))
        for name, res, ylabel in views:
            cols = min(3, len(domains))
            rows = math.ceil(len(domains) / cols)
            fig, axes = plt.subplots(
                rows,
                cols,
                figsize=(4.2 * cols + 2.5, 3.4 * rows + 0.4),
                squeeze=False,
                layout="constrained",
            )
            for ax, domain in zip(axes.ravel(), domains):
                for model in ordered:
                    draw(ax, res, model, xs, [(domain, s) for s in ticks])
                ax.set_xticks(xs, [display_shots(s) for s in ticks], fontsize=8)
                ax.set_title(display_domain(domain))
                ax.set_xlabel("images per class (N)")
                ax.set_ylabel(ylabel)
                ax.grid(alpha=0.3)
                if res is not results:
                    ax.axhline(0, color="k", linewidth=0.8)
            _group_entries(axes.ravel()[0], models, categories, highlight)
            for ax in axes.ravel()[len(domains) :]:
                ax.axis("off")
            _finish(fig, axes.ravel(), footnote, "Few-shot linear classification on ImageNet-CoG")
            figures[name] = fig
    return figures
