"""Figures of results in the style of the paper's Figures 3 and 4 (matplotlib).

Stage "results": :meth:`~imagenet_cog.Results.figures` and :meth:`~imagenet_cog.Results.plot`
draw through here. matplotlib (the ``plot`` extra) is imported only when a figure is made.
"""

from __future__ import annotations

import io
import math

import numpy as np

from ._comparability import NOT_COMPARABLE_MARK, not_comparable, plot_footnote
from ._fileio import atomic_write_bytes
from ._grid import display_domain, display_shots

__all__ = ["pyplot", "results_figures", "save_png"]


def pyplot():
    """matplotlib's pyplot on the Agg backend, or an ImportError naming the extra."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError("plot() needs matplotlib: pip install 'matplotlib>=3.7'") from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path):
    """Write ``fig`` as a PNG file, atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=130, format="png")
    atomic_write_bytes(path, buffer.getvalue())


def _faint_legend_entry(ax, models, highlight):
    faint = [m for m in models if highlight and m not in highlight]
    if faint:
        ax.plot([], [], color="0.6", alpha=0.6, marker="o", markersize=2.5, linewidth=0.9,
                label=f"{len(faint)} other models")  # fmt: skip


def results_figures(results, baseline=None, models=None, highlight=None, metric="top1"):
    """The figures of :meth:`Results.figures`, by name."""
    plt = pyplot()
    models = list(models or results.models)
    if baseline is not None and baseline not in models:
        models.append(baseline)
    highlight = set(highlight or [])
    figures = {}
    domains = results.domains
    fig_shots = "all" if "all" in results.shots else results.shots[-1]
    # A non-comparable model is marked in the legend, and why in a footnote, so that a
    # figure shared alone keeps the caveat.
    flagged = {m: v for m, v in not_comparable(results).items() if m in models}
    footnote = plot_footnote(flagged)

    def mark(fig):
        if footnote:
            fig.text(0.01, 0.01, footnote, fontsize=7, va="bottom", color="darkred")
        return 0.03 + 0.025 * footnote.count("\n") if footnote else 0

    def style(model, i):
        faint = bool(highlight) and model not in highlight
        name = f"{model} {NOT_COMPARABLE_MARK}" if model in flagged else model
        return {
            "color": "0.6" if faint else f"C{i % 10}",
            "alpha": 0.45 if faint else 1.0,
            "linewidth": 0.9 if faint else 2.6,
            "marker": "o",
            "markersize": 2.5 if faint else 6,
            "zorder": 1 if faint else 3,
            "label": None if faint else name,
        }

    def finish(fig, ax, name, title, ylabel):
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _, labels = ax.get_legend_handles_labels()
        if labels:
            ax.legend(fontsize=8, loc="best", ncol=1 if len(labels) < 12 else 2)
        fig.tight_layout(rect=(0, mark(fig), 1, 1))
        figures[name] = fig

    x = np.arange(len(domains))
    labels = [display_domain(d) for d in domains]
    views = [("levels_absolute", results, "top-1 (%)")]
    if baseline is not None:
        views.append(
            (
                "levels_relative",
                results.relative_to(baseline, metric),
                f"top-1 − {baseline} (points)",
            )
        )
    for name, res, ylabel in views:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ordered = sorted(models, key=lambda m: m in highlight)  # bold on top
        for i, model in enumerate(ordered):
            y = [res.mean(model, d, fig_shots, metric) for d in domains]
            ax.plot(
                x, y, **style(model, results.models.index(model) if model in results.models else i)
            )
        ax.set_xticks(x, labels)
        _faint_legend_entry(ax, models, highlight)
        if res is not results:
            ax.axhline(0, color="k", linewidth=0.8)
        which = "all training images" if fig_shots == "all" else f"{fig_shots}-shot"
        finish(fig, ax, name, f"Linear classification on ImageNet-CoG ({which})", ylabel)

    numeric = [s for s in results.shots if s != "all"]
    if numeric:
        views = [("fewshot", results, "top-1 (%)")]
        if baseline is not None:
            views.append(
                ("fewshot_relative", results.relative_to(baseline, metric), f"top-1 − {baseline}")
            )
        for name, res, ylabel in views:
            cols = min(3, len(domains))
            rows = math.ceil(len(domains) / cols)
            fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
            ticks = numeric + (["all"] if "all" in results.shots else [])
            xs = np.arange(len(ticks))
            for ax, domain in zip(axes.ravel(), domains):
                for i, model in enumerate(sorted(models, key=lambda m: m in highlight)):
                    y = [res.mean(model, domain, s, metric) for s in ticks]
                    ax.plot(
                        xs,
                        y,
                        **style(
                            model, results.models.index(model) if model in results.models else i
                        ),
                    )
                ax.set_xticks(xs, [display_shots(s) for s in ticks], fontsize=8)
                _faint_legend_entry(ax, models, highlight)
                ax.set_title(display_domain(domain))
                ax.set_xlabel("images per class (N)")
                ax.set_ylabel(ylabel)
                ax.grid(alpha=0.3)
                if res is not results:
                    ax.axhline(0, color="k", linewidth=0.8)
            for ax in axes.ravel()[len(domains) :]:
                ax.axis("off")
            handles, labels = axes.ravel()[0].get_legend_handles_labels()
            bottom = mark(fig)
            if labels:
                fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)),
                           fontsize=8, bbox_to_anchor=(0.5, bottom))  # fmt: skip
            fig.suptitle("Few-shot linear classification on ImageNet-CoG")
            fig.tight_layout(rect=(0, bottom + (0.06 if labels else 0), 1, 1))
            figures[name] = fig
    return figures
