"""Figures of the evaluations in the style of the paper's Figures 3 and 4: the k-NN's few-shot
curves per domain, and a model's top-1 per domain under each protocol, side by side.

Each figure names its protocols in its title and legend: k-NN and zero-shot numbers are never
drawn as if they were linear-probe numbers, and no figure ranks them with the paper's models.
matplotlib is imported only when a figure is made.
"""

from __future__ import annotations

import math

import numpy as np

from .._grid import display_domain, display_shots, domain_key, shot_key
from .._optional_dependencies import require

__all__ = ["knn_fewshot_figure", "protocols_figure"]

#: A page's width in inches and the text sizes (pt) of the paper-style figures of the results
#: (their module is a reader of the table of analyses, so this wing draws on its own).
PAGE = 7.0
TEXT = {"title": 8, "label": 7, "tick": 6.5, "legend": 6.5}


def pyplot():
    """matplotlib's pyplot on the Agg backend, or an ImportError naming the extra."""
    matplotlib = require("matplotlib", "the evaluations' figures")
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _style_axes(ax):
    ax.tick_params(labelsize=TEXT["tick"], length=2.5, pad=2)
    ax.grid(alpha=0.3, linewidth=0.5)


#: The colours of the k values, light (few neighbours) to dark, and of the protocols.
_K_COLOURS = ("#9ecae1", "#4292c6", "#08519c", "#08306b", "#041c40")
PROTOCOL_STYLES = {
    "linear probe": {"color": "#222222", "marker": "o", "linestyle": "-"},
    "k-NN": {"color": "#2171b5", "marker": "s", "linestyle": (0, (4, 1.5))},
    "zero-shot": {"color": "#d94801", "marker": "D", "linestyle": "-."},
}


def knn_fewshot_figure(payload, model, metric="top1"):
    """The k-NN's top-1 against images per concept, one panel per domain and a line per k
    (mean over the seeds, their std as a band), as the paper's Figure 4 draws the linear
    probe's; None when no domain has a few-shot cell.

    Parameters
    ----------
    payload : dict
        A model's ``analysis.json`` payload, with its ``"knn"`` section.
    model : str
    metric : {"top1", "top5"}
    """
    section = (payload or {}).get("knn") or {}
    domains = sorted(
        (d for d, v in section.items() if any(c["shots"] != "all" for c in v.get("grid", []))),
        key=domain_key,
    )
    if not domains:
        return None
    plt = pyplot()
    first = section[domains[0]]
    ks = [str(k) for k in first["ks"]]
    temperature = first["temperature"]
    ticks = sorted({c["shots"] for d in domains for c in section[d]["grid"]}, key=shot_key)
    xs = np.arange(len(ticks))
    cols = min(3, len(domains))
    rows = math.ceil(len(domains) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(PAGE, 1.75 * rows + 0.75), squeeze=False, layout="constrained"
    )
    what = metric.replace("top", "top-")
    for i, (ax, domain) in enumerate(zip(axes.ravel(), domains)):
        grid = {c["shots"]: c for c in section[domain]["grid"]}
        for j, k in enumerate(ks):
            style = {
                "color": _K_COLOURS[min(j, len(_K_COLOURS) - 1)],
                "marker": "s",
                "markersize": 3.5,
                "linewidth": 1.3,
                "linestyle": "-",
                "zorder": 3,
                "label": f"k-NN, k = {k}",
            }
            means = [grid[s][metric][k]["mean"] if s in grid else np.nan for s in ticks]
            stds = [grid[s][metric][k]["std"] if s in grid else np.nan for s in ticks]
            ax.plot(xs, means, **style)
            low, high = np.subtract(means, stds), np.add(means, stds)
            if np.any(np.nan_to_num(stds) > 0):
                ax.fill_between(xs, low, high, color=style["color"], alpha=0.1, linewidth=0)
        ax.set_xticks(xs, [display_shots(s) for s in ticks])
        ax.set_title(display_domain(domain), fontsize=TEXT["title"], pad=3)
        if i // cols == rows - 1 or i + cols >= len(domains):
            ax.set_xlabel("images per concept (N)", fontsize=TEXT["label"])
        if i % cols == 0:
            ax.set_ylabel(f"k-NN {what} (%)", fontsize=TEXT["label"])
        _style_axes(ax)
    for ax in axes.ravel()[len(domains) :]:
        ax.axis("off")
    fig.suptitle(
        f"{model}: k-NN {what} against images per concept (DINO's weighted k-NN, T = "
        f"{temperature:g}; mean ± std over the seeds)\nanother protocol than the paper's "
        "linear probe: not comparable with its numbers",
        fontsize=TEXT["title"],
    )
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=len(labels),
        fontsize=TEXT["legend"],
        frameon=False,
    )
    return fig


def protocols_figure(rows, model, title=None):
    """A model's top-1 per domain under each protocol, one line each, as the paper's Figure
    3a draws the linear probe's.

    Parameters
    ----------
    rows : list of (label, kind, {domain: value})
        ``kind`` one of :data:`PROTOCOL_STYLES` (the line's style), ``label`` its legend.
    model : str
    title : str, optional
    """
    plt = pyplot()
    domains = sorted({d for _, _, values in rows for d in values}, key=domain_key)
    x = np.arange(len(domains))
    fig, ax = plt.subplots(figsize=(3.6, 2.9), layout="constrained")
    for label, kind, values in rows:
        style = PROTOCOL_STYLES.get(kind, PROTOCOL_STYLES["linear probe"])
        ys = [values.get(d, np.nan) for d in domains]
        ys = [np.nan if v is None else v for v in ys]
        ax.plot(x, ys, markersize=3.5, linewidth=1.4, label=label, **style)
    ax.set_xticks(x, [display_domain(d) for d in domains])
    ax.set_ylabel("top-1 (%)", fontsize=TEXT["label"])
    _style_axes(ax)
    ax.set_title(title or f"{model}: top-1 per domain, by protocol", fontsize=TEXT["title"], pad=3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        fontsize=TEXT["legend"],
        ncol=1,
        frameon=False,
    )
    return fig
