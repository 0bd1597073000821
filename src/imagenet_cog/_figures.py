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
from ._reporting.names import figure_name, figure_text, short_name
from ._reporting.verdict import plot_footnote

__all__ = ["footnote_text", "pyplot", "results_figures", "save_figure"]


def pyplot():
    """matplotlib's pyplot on the Agg backend, or an ImportError naming the extra."""
    matplotlib = require("matplotlib", "plot()")
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


#: Settings of every saved figure: TrueType (Type 42) fonts in PDF and PostScript, as
#: venues' checks require (matplotlib's default, Type 3, is refused by many).
SAVE_RC = {"pdf.fonttype": 42, "ps.fonttype": 42}


def save_figure(fig, path, format="png"):
    """Write ``fig`` atomically as PNG (130 dpi), PDF (TrueType fonts) or SVG (vector)."""
    import matplotlib

    if format not in FORMATS:
        raise ValueError(f"figure format {format!r}: choose from {', '.join(FORMATS)}")
    buffer = io.BytesIO()
    # A footnote under a constrained layout can reach the edge: keep a margin around all.
    with matplotlib.rc_context(SAVE_RC):
        fig.savefig(buffer, dpi=130, format=format, bbox_inches="tight", pad_inches=0.04)
    atomic_write_bytes(path, buffer.getvalue())


#: The paper's model groups (its Table 1 and Figures 3-4): prefix -> (name, colour map, marker).
GROUPS = {
    "": ("reference", "Greys", "*"),
    "a": ("a- architecture", "Blues", "s"),
    "s": ("s- self-supervision", "Reds", "o"),
    "r": ("r- regularisation", "Greens", "^"),
    "d": ("d- more data", "Purples", "D"),
}
#: Colours of the user's own models, in hues no group has (the groups' blues, reds, greens,
#: purples and greys): orange, magenta, gold, teal, brown, olive. The first three differ in
#: lightness too, and every one has its own marker and dash, so they stay apart in grayscale.
USER_COLOURS = ("#e66100", "#b0208f", "#c9a000", "#008c80", "#7a4a00", "#5f6b00")
USER_MARKERS = ("P", "X", "h", "v", "<", ">")
USER_DASHES = ("-", (0, (4, 1.5)), "-.", (0, (1, 1)), (0, (6, 2, 1, 2)), "--")
FORMATS = ("png", "pdf", "svg")
#: Figure widths in inches: a column of a two-column paper, and a page; a figure included at
#: ``\linewidth`` of that width shows its text at the size it is set in (6.5 to 8 pt).
COLUMN, PAGE = 3.3, 7.0
#: Which figure is made for which width.
WIDTHS = {
    "levels_absolute": COLUMN,
    "levels_relative": COLUMN,
    "fewshot": PAGE,
    "fewshot_relative": PAGE,
}
#: Text sizes (pt) of the figures: nothing under 6 pt at the width they are made for.
TEXT = {"title": 8, "label": 7, "tick": 6.5, "legend": 6.5, "note": 6.5}


def footnote_text(flagged, shown=2):
    """One footnote for the models that are not comparable: each model's ``shown`` most
    decisive reasons, a reason repeated over domains said once
    (:func:`~imagenet_cog._reporting.verdict.plot_footnote`, on one line)."""
    return plot_footnote(flagged, width=None, shown=shown)


def group_of(model, categories):
    """The paper's group prefix of a model (``"a"``, ``"s"``, ``"r"``, ``"d"``, ``""`` for
    ResNet50), or ``None`` for a model that is not one of the paper's."""
    if model not in categories:
        return None
    prefix = model.split("-", 1)[0] if "-" in model else ""
    return prefix if prefix in GROUPS else ""


def model_styles(models, categories, highlight, flagged, baseline=None):
    """Line style per model: the paper's models by group (colour family and marker), the
    user's own in colours outside every group, each with its own dash; faint and unlabelled
    when others are highlighted and a model is not (the baseline is always labelled)."""
    import matplotlib

    styles, by_group, user = {}, {}, 0
    for model in models:
        by_group.setdefault(group_of(model, categories), []).append(model)
    for group, members in by_group.items():
        for j, model in enumerate(members):
            dash = "-"
            if group is None:
                colour, marker = USER_COLOURS[user % 6], USER_MARKERS[user % 6]
                dash = USER_DASHES[user % 6]
                user += 1
            else:
                _, cmap, marker = GROUPS[group]
                shade = 0.9 if len(members) == 1 else 0.95 - 0.5 * j / (len(members) - 1)
                colour = matplotlib.colormaps[cmap](shade if group else 0.85)
            faint = bool(highlight) and model not in highlight and model != baseline
            name = figure_name(model)
            name = f"{name} {NOT_COMPARABLE_MARK}" if model in flagged else name
            if model == baseline:
                name += " (baseline)"
            styles[model] = {
                "color": colour,
                # Faint lines are the paper's context: their colour family says their group.
                "marker": None if faint else marker,
                "linestyle": dash,
                "alpha": 0.35 if faint else 1.0,
                "linewidth": 0.6 if faint else (1.6 if group is None else 1.1),
                "markersize": 2 if faint else 4,
                "zorder": 1 if faint else (4 if group is None else 3),
                "label": None if faint else name,
            }
    return styles


def _group_entries(ax, models, categories, highlight, baseline=None):
    """One legend entry per group of faint (unlabelled) paper models."""
    import matplotlib

    counts = {}
    for model in models:
        group = group_of(model, categories)
        faint = highlight and model not in highlight and model != baseline
        if faint and group is not None:
            counts[group] = counts.get(group, 0) + 1
    for group, n in counts.items():
        name, cmap, marker = GROUPS[group]
        ax.plot(
            [],
            [],
            color=matplotlib.colormaps[cmap](0.7),
            marker=marker,
            alpha=0.6,
            linewidth=0.6,
            markersize=2.5,
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


def _finish(fig, axes, footnote, width, title=None):
    """The legend over the panels, across their width, and the footnote under them: nothing
    over the data, no canvas left empty beside it."""
    handles, labels = axes[0].get_legend_handles_labels()
    if title:
        fig.suptitle(title, fontsize=TEXT["title"])
    if labels:
        fig.legend(
            handles,
            labels,
            loc="outside upper center",
            fontsize=TEXT["legend"],
            ncol=_legend_shape(labels, width)[0],
            frameon=True,
            edgecolor="none",
            handlelength=2.2,
            columnspacing=1.0,
        )
    if footnote:
        # As the figure's x label, so that the layout makes room for it under the panels.
        text = "\n".join(textwrap.wrap(footnote, _note_chars(width)))
        fig.supxlabel(text, fontsize=TEXT["note"], x=0.01, ha="left", color="darkred")


def _legend_shape(labels, width):
    """``(columns, rows)`` of a legend of these labels across ``width`` inches: as many
    columns as the width holds names of this length."""
    longest = max(len(x) for x in labels)
    columns = min(len(labels), max(1, int(width * 72 / (TEXT["legend"] * 0.6 * longest + 26))))
    return columns, math.ceil(len(labels) / columns)


def _legend_height(styles, models, categories, highlight, baseline, width):
    """Inches the legend of these models takes, so that the panels keep their height."""
    labels = [styles[m]["label"] for m in models if styles[m]["label"]]
    groups = {
        group_of(m, categories)
        for m in models
        if highlight
        and m not in highlight
        and m != baseline
        and group_of(m, categories) is not None
    }
    labels += [f"{GROUPS[g][0]} (31 models)" for g in groups]
    if not labels:
        return 0.0
    return _legend_shape(labels, width)[1] * TEXT["legend"] * 1.45 / 72 + 0.08


def _note_chars(width):
    """Characters of the footnote a line of ``width`` inches holds."""
    return int(width * 72 / (TEXT["note"] * 0.6))


def _note_height(footnote, width):
    """Inches the footnote takes under the panels, so that they keep their height."""
    if not footnote:
        return 0.0
    return len(textwrap.wrap(footnote, _note_chars(width))) * TEXT["note"] * 1.3 / 72 + 0.05


def _style_axes(ax):
    ax.tick_params(labelsize=TEXT["tick"], length=2.5, pad=2)
    ax.grid(alpha=0.3, linewidth=0.5)


def check_formats(formats):
    """Refuse, in one line, figure formats other than :data:`FORMATS`."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"figure formats {unknown}: choose from {', '.join(FORMATS)}")


def write_figures(figures, directory, prefix="", formats=("png",)):
    """Write ``{name: Figure}`` as ``directory/{prefix}{name}.{format}``, closing each; the
    caller checks ``formats`` first (:func:`check_formats`), before it draws the figures.

    Returns
    -------
    list of pathlib.Path
        The files written.
    """
    from pathlib import Path

    plt = pyplot()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures.items():
        for form in formats:
            path = directory / f"{prefix}{name}.{form}"
            save_figure(fig, path, form)
            written.append(path)
        plt.close(fig)
    return written


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
    footnote = figure_text(footnote_text({short_name(m): v for m, v in flagged.items()}))
    styles = model_styles(models, categories, highlight, flagged, baseline)
    # Bands for the drawn-bold models (all of them when there are few).
    banded = highlight or (set(models) if len(models) <= 6 else set())
    ordered = sorted(models, key=lambda m: styles[m]["zorder"])  # bold on top
    figures = {}
    what = metric.replace("top", "top-")

    def draw(ax, res, model, xs, cells):
        y = [res.mean(model, d, s, metric) for d, s in cells]
        ax.plot(xs, y, **styles[model])
        if model in banded:
            _band(ax, xs, y, [results.std(model, d, s, metric) for d, s in cells], styles[model])

    x = np.arange(len(domains))
    views = [("levels_absolute", results, f"{what} (%)")]
    if baseline is not None:
        views.append(
            (
                "levels_relative",
                results.relative_to(baseline, metric),
                f"{what} − {figure_name(baseline)} (points)",
            )
        )
    which = "all training images" if fig_shots == "all" else f"{fig_shots} images per class"
    for name, res, ylabel in views:
        legend = _legend_height(styles, models, categories, highlight, baseline, COLUMN)
        extra = legend + _note_height(footnote, COLUMN)
        fig, ax = plt.subplots(figsize=(COLUMN, 2.2 + extra), layout="constrained")
        for model in ordered:
            draw(ax, res, model, x, [(d, fig_shots) for d in domains])
        ax.set_xticks(x, [figure_name(display_domain(d)) for d in domains])
        _group_entries(ax, models, categories, highlight, baseline)
        if res is not results:
            ax.axhline(0, color="k", linewidth=0.6)
        ax.set_ylabel(ylabel, fontsize=TEXT["label"])
        _style_axes(ax)
        ax.set_title(f"ImageNet-CoG, {which}", fontsize=TEXT["title"])
        _finish(fig, [ax], footnote, COLUMN)
        figures[name] = fig

    numeric = [s for s in results.shots if s != "all"]
    if numeric:
        views = [("fewshot", results, f"{what} (%)")]
        if baseline is not None:
            views.append(
                (
                    "fewshot_relative",
                    results.relative_to(baseline, metric),
                    f"{what} − {figure_name(baseline)} (points)",
                )
            )
        ticks = numeric + (["all"] if "all" in results.shots else [])
        xs = np.arange(len(ticks))
        for name, res, ylabel in views:
            cols = min(3, len(domains))
            rows = math.ceil(len(domains) / cols)
            legend = _legend_height(styles, models, categories, highlight, baseline, PAGE)
            legend += _note_height(footnote, PAGE)
            fig, axes = plt.subplots(
                rows,
                cols,
                figsize=(PAGE, 1.75 * rows + 0.3 + legend),
                squeeze=False,
                layout="constrained",
            )
            for i, (ax, domain) in enumerate(zip(axes.ravel(), domains)):
                for model in ordered:
                    draw(ax, res, model, xs, [(domain, s) for s in ticks])
                ax.set_xticks(xs, [display_shots(s) for s in ticks])
                ax.set_title(figure_name(display_domain(domain)), fontsize=TEXT["title"], pad=3)
                if i // cols == rows - 1 or i + cols >= len(domains):
                    ax.set_xlabel("images per concept (N)", fontsize=TEXT["label"])
                if i % cols == 0:
                    ax.set_ylabel(ylabel, fontsize=TEXT["label"])
                _style_axes(ax)
                if res is not results:
                    ax.axhline(0, color="k", linewidth=0.6)
            _group_entries(axes.ravel()[0], models, categories, highlight, baseline)
            for ax in axes.ravel()[len(domains) :]:
                ax.axis("off")
            # No title over the legend: a paper's caption says what the figure is.
            _finish(fig, axes.ravel(), footnote, PAGE)
            figures[name] = fig
    return figures
