"""LaTeX tables of results, in the layout of the paper's supplementary Tables 5-10.

Stage "results". One ``table`` environment per domain: a row per model (grouped by the
paper's categories with a rule between groups when the categories are known), a column per
number of shots (:math:`2^0` ... :math:`2^7`, All), cells ``mean ± std`` over seeds, the best
mean of each column in bold. booktabs rules (``\\toprule``, ``\\midrule``, ``\\bottomrule``),
so the preamble needs ``\\usepackage{booktabs}``. The comparability verdict goes with the
table: a comment above it and, for a model that is not comparable with the paper, a
footnote mark on its name and the reasons under the table.
"""

from __future__ import annotations

import math
import re

from ._grid import display_domain

__all__ = ["escape", "latex_tables"]

_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def escape(text):
    """``text`` with LaTeX's special characters escaped.

    Examples
    --------
    >>> escape("50% of a_b & c")
    '50\\\\% of a\\\\_b \\\\& c'
    """
    return re.sub(r"[\\&%$#_{}~^]", lambda m: _SPECIAL[m.group()], str(text))


def _shot_header(shots):
    if shots == "all":
        return "All"
    exponent = int(shots).bit_length() - 1
    return f"$2^{{{exponent}}}$" if 1 << exponent == shots else str(shots)


def latex_tables(results, metric="top1", digits=1, domains=None, verdict=None, label_prefix="cog"):
    """The LaTeX source of one table per domain; see :meth:`Results.to_latex`."""
    domains = list(domains or results.domains)
    categories = results.meta.get("categories") or {}
    flagged = dict(verdict.get("not_comparable", {})) if verdict else {}
    caveats = dict(verdict.get("caveats", {})) if verdict else {}
    marks = {m: i + 1 for i, m in enumerate(flagged)}
    what = metric.replace("top", "Top-")
    relative = results.meta.get("relative_to")
    out = ["% Made by imagenet_cog; needs \\usepackage{booktabs} in the preamble."]
    reference = [m for m, v in (verdict or {}).get("comparable", {}).items() if v == "reference"]
    if reference:
        out.append("% Published results of the ImageNet-CoG paper: " + ", ".join(reference))
    if verdict is not None:
        if flagged:
            out.append("% NOT COMPARABLE with the paper: " + ", ".join(flagged))
        elif any(v == "yes" for v in verdict["comparable"].values()):
            checked = [m for m, v in verdict["comparable"].items() if v == "yes"]
            out.append("% Comparable with the paper (no deviation found): " + ", ".join(checked))
        for model, reasons in flagged.items():
            out += [f"%   {model}: {r}" for r in reasons]
        for model, reasons in caveats.items():
            out += [f"%   {model} (caveat): {r}" for r in reasons]
    tables = 0
    for domain in domains:
        # The same grid of scores as the text and Markdown tables of the domain.
        shots, scores = results._score_grid(metric, domain=domain)
        models = [m for m in results.models if any(row is not None for row in scores[m])]
        if not shots or not models:
            continue
        tables += 1
        best = {}
        for j, s in enumerate(shots):
            means = [scores[m][j]["mean"] for m in models if scores[m][j] is not None]
            best[s] = max(means) if means else math.nan
        caption = (
            f"{what} accuracies (\\%) of linear classifiers on {escape(display_domain(domain))}"
        )
        if relative:
            caption += f", relative to {escape(relative)} (points)"
        else:
            caption += ", mean $\\pm$ std over seeds"
        caption += "; best per column in bold."
        out += [
            "",
            "\\begin{table}[t]",
            "\\centering",
            "\\small",
            f"\\caption{{{caption}}}",
            f"\\label{{tab:{label_prefix}-{domain.lower()}}}",
            "\\begin{tabular}{l" + "c" * len(shots) + "}",
            "\\toprule",
            f" & \\multicolumn{{{len(shots)}}}{{c}}{{$N$ images per concept}} \\\\",
            f"\\cmidrule(lr){{2-{len(shots) + 1}}}",
            "Model & " + " & ".join(_shot_header(s) for s in shots) + " \\\\",
            "\\midrule",
        ]
        previous = None
        for i, model in enumerate(models):
            group = categories.get(model, "")
            if i and categories and group != previous:
                out.append("\\midrule")
            previous = group
            name = escape(model)
            if model in marks:
                name += f"$^{{\\dagger{marks[model]}}}$" if len(marks) > 1 else "$^\\dagger$"
            cells = []
            for s, row in zip(shots, scores[model]):
                if row is None:
                    cells.append("--")
                    continue
                mean = f"{row['mean']:+.{digits}f}" if relative else f"{row['mean']:.{digits}f}"
                if abs(row["mean"] - best[s]) < 0.5 * 10.0**-digits and not math.isnan(best[s]):
                    mean = f"\\mathbf{{{mean}}}"
                cell = mean if relative else f"{mean} \\pm {row['std']:.{digits}f}"
                cells.append(f"${cell}$")
            out.append(f"{name} & " + " & ".join(cells) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}"]
        for model, number in marks.items():
            sign = f"$^{{\\dagger{number}}}$" if len(marks) > 1 else "$^\\dagger$"
            reasons = "; ".join(escape(r) for r in flagged[model])
            out.append(
                f"\\par\\smallskip\\footnotesize{{{sign}Not comparable with the paper: {reasons}.}}"
            )
        out.append("\\end{table}")
    if tables == 0:
        raise ValueError(f"no {metric} scores for the domains {domains}: no LaTeX table to make")
    return "\n".join(out) + "\n"


def export_verdict(results):
    """The comparability verdict every export carries, per checked model.

    Returns
    -------
    dict
        ``comparable`` (``{model: "yes" | "no" | "reference"}``), ``not_comparable``
        (``{model: [deviations]}``) and ``caveats`` (``{model: [caveats]}``).
    """
    from ._comparability import comparability

    found = comparability(results, by_model=True)
    reference = set(results.reference_models())
    comparable = {m: "reference" for m in results.models if m in reference}
    comparable.update({m: "no" if v["deviations"] else "yes" for m, v in found.items()})
    return {
        "comparable": comparable,
        "not_comparable": {m: v["deviations"] for m, v in found.items() if v["deviations"]},
        "caveats": {m: v["caveats"] for m, v in found.items() if v["caveats"]},
    }


def markdown_verdict(verdict):
    """The verdict as Markdown lines (a quote block), ``[]`` when nothing is to be said."""
    lines = []
    for model, reasons in verdict["not_comparable"].items():
        lines.append(f"> **{model}: not comparable with the paper**: " + "; ".join(reasons) + ".")
    for model, reasons in verdict["caveats"].items():
        lines.append(f"> {model}, caveats (still comparable): " + "; ".join(reasons) + ".")
    checked = [m for m, v in verdict["comparable"].items() if v == "yes"]
    if checked and not verdict["not_comparable"]:
        lines.insert(0, f"> Comparable with the paper: {', '.join(checked)}.")
    return lines
