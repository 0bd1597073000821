"""The answer first: where each of a run's models stands among the paper's published models
(never among the user's other models), its scores, its relative change from L1 to L5, then
the verdict (:meth:`Results.comparison_report`).

Stage "results", the wing of what a reader reads.
"""

from __future__ import annotations

import math

from .._comparability import not_comparable
from .._grid import display_domain, normalize_shots
from .._tables import align_rows, number_cell
from .verdict import caveat_lines, not_comparable_banner

__all__ = ["answer_heading", "answer_ranks", "comparison_report", "relative_change_lines"]


def comparison_report(results, shots="all", metric="top1", banner=True):
    """The text of :meth:`Results.comparison_report`."""
    baseline = results.meta.get("baseline")
    mine = results.meta.get("highlight") or results.models
    shots = normalize_shots(shots)
    ranks, n = answer_ranks(results, shots, metric)
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
    parts = [answer_heading(results, mine, which), align_rows(rows)]
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


def answer_ranks(results, shots, metric="top1"):
    """``(ranks, out of)``: each model's rank per domain among the paper's published models
    only (:meth:`Results.reference_models`), never among the user's other models, and how
    many places that ranking has (the paper's models and the one ranked); among every model
    when none is the paper's."""
    reference = results.reference_models()
    if not reference:
        return results.ranks(shots, metric), len(results.models)
    return results.ranks(shots, metric, among=reference), len(reference) + 1


def answer_heading(results, mine, which):
    """The answer's first line: whose ranks, among which models, of which cells."""
    reference = results.reference_models()
    if not reference:
        yours = "Your model" if len(mine) == 1 else f"Your {len(mine)} models"
        return f"{yours} among {len(results.models)} models ({which}; rank 1 = best)"
    among = f"the paper's {len(reference)} model{'s' * (len(reference) != 1)}"
    if len(mine) == 1:
        return f"Your model among {among} ({which}; rank 1 = best)"
    return f"Your {len(mine)} models, each ranked among {among} only ({which}; rank 1 = best)"


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
