"""The answer first: where each of a run's models stands among the paper's, its scores, its
relative change from L1 to L5, then the verdict (:meth:`Results.comparison_report`).

Stage "results", the wing of what a reader reads.
"""

from __future__ import annotations

import math

from .._comparability import not_comparable
from .._grid import display_domain, normalize_shots
from .._tables import align_rows, number_cell
from .verdict import caveat_lines, not_comparable_banner

__all__ = ["comparison_report", "relative_change_lines"]


def comparison_report(results, shots="all", metric="top1", banner=True):
    """The text of :meth:`Results.comparison_report`."""
    baseline = results.meta.get("baseline")
    mine = results.meta.get("highlight") or results.models
    shots = normalize_shots(shots)
    ranks = results.ranks(shots, metric)
    n = len(results.models)
    flagged = not_comparable(results)
    domains, _ = results.score_grid(shots=shots)
    header = ["model"] + [display_domain(d) for d in domains]
    rows = [header]
    rel = results.relative_to(baseline, metric) if baseline else None
    for model in mine:
        rank = [ranks[model].get(d) for d in domains]
        shown = ["-" if r is None else (f"({r})*" if model in flagged else str(r)) for r in rank]
        rows.append([f"{model} rank"] + [r if r == "-" else f"{r}/{n}" for r in shown])
        means = [number_cell(results.mean(model, d, shots, metric), ".1f") for d in domains]
        rows.append([f"{model} top-1", *means])
        if rel is not None and baseline != model:
            rows.append(
                [f"{model} vs {baseline}"]
                + [number_cell(rel.mean(model, d, shots, metric), "+.1f") for d in domains]
            )
    which = "all training images" if shots == "all" else f"{shots} images per class"
    yours = "Your model" if len(mine) == 1 else f"Your {len(mine)} models"
    parts = [f"{yours} among {n} models ({which}; rank 1 = best)", align_rows(rows)]
    if flagged:
        parts.append("(r)* not comparable with the paper: a rank for orientation only")
    changes = relative_change_lines(results, mine, shots, metric)
    if changes:
        parts += ["", *changes]
    banner = not_comparable_banner(results) if banner else ""
    if banner:
        parts += ["", banner]
    notes = caveat_lines(results)  # the deviations are the banner's
    if notes:
        parts += ["", *notes]
    return "\n".join(parts)


def relative_change_lines(results, models, shots, metric="top1", arrow="->"):
    """Lines of the relative change from L1 to L5 of ``models``, beside the range of the
    other models' (the paper's, in a comparison)."""
    others = [results.relative_change(m, shots, metric) for m in results.models if m not in models]
    others = [x for x in others if not math.isnan(x)]
    lines = []
    for model in models:
        value = results.relative_change(model, shots, metric)
        if math.isnan(value):
            continue
        line = f"{model}: L1 {arrow} L5 relative change {value:+.1f}%"
        if others:
            below = sum(x < value for x in others)
            line += (
                f" (the other {len(others)} model{'s' * (len(others) != 1)}: "
                f"{min(others):+.1f}% to {max(others):+.1f}%; {below} of them fall further)"
            )
        lines.append(line)
    return lines
