"""LaTeX tables of results, in the layout of the paper's supplementary Tables 5-10.

Stage "results". One ``table`` environment per domain: a row per model (grouped by the
paper's categories with a rule between groups when the categories are known), a column per
number of shots (:math:`2^0` ... :math:`2^7`, All), cells ``mean ± std`` over seeds, the best
printed mean of each column among the comparable entries in bold. booktabs rules
(``\\toprule``, ``\\midrule``, ``\\bottomrule``), and a table wider than the text scaled
down to it (``\\resizebox``), so the preamble needs ``\\usepackage{booktabs}`` and
``\\usepackage{graphicx}``. The comparability verdict goes with the table: a comment above it
and, for a model that is not comparable with the paper, a footnote mark on its name and the
reasons under the table, this table's domain only. Every name is escaped: LaTeX's special
characters in cells and captions, line breaks in comments, anything but letters and digits in
labels.
"""

from __future__ import annotations

import math
import re

from ._grid import display_domain, normalize_shots

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
    # A cell starting with "[" after "\\" or "\midrule" would be their optional argument.
    "[": "{[}",
    "]": "{]}",
}


def escape(text):
    """``text`` with LaTeX's special characters escaped, and control characters (a line
    break included) made spaces.

    Examples
    --------
    >>> escape("50% of a_b & c")
    '50\\\\% of a\\\\_b \\\\& c'
    """
    return re.sub(r"[\\&%$#_{}~^\[\]]", lambda m: _SPECIAL[m.group()], _comment(text))


def _shot_header(shots):
    if shots == "all":
        return "All"
    exponent = int(shots).bit_length() - 1
    return f"$2^{{{exponent}}}$" if 1 << exponent == shots else str(shots)


def _comment(text):
    """``text`` for one comment line: a line break in a name would end the comment and make
    the rest live LaTeX."""
    return re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", " ", str(text))


def _label(text):
    """``text`` as the part of a ``\\label`` key: lower-case letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "domain"


def _bold_rows(models, scores, shots, digits, eligible, signed):
    """``{(model, column)}`` of the cells printed in bold: in each column, the comparable
    entries whose printed mean is the best printed one (two means that print alike are
    both bold, two that print differently are not)."""
    bold, form = set(), f"{'+' if signed else ''}.{digits}f"
    for j in range(len(shots)):
        printed = {
            m: float(format(scores[m][j]["mean"], form))
            for m in models
            if m in eligible and scores[m][j] is not None and not math.isnan(scores[m][j]["mean"])
        }
        if printed:
            best = max(printed.values())
            bold |= {(m, j) for m, v in printed.items() if v == best}
    return bold


#: Floats the tables of :func:`latex_tables` may be put in.
FLOATS = ("table", "table*")


def latex_tables(
    results,
    metric="top1",
    digits=1,
    domains=None,
    verdict=None,
    label_prefix="cog",
    shots=None,
    float_env="table",
):
    """The LaTeX source of one table per domain; see :meth:`Results.to_latex`."""
    from ._reporting.verdict import summarize_reasons

    if float_env not in FLOATS:
        raise ValueError(f"float_env must be one of {FLOATS}, got {float_env!r}")
    domains = list(domains or results.domains)
    unknown = [d for d in domains if d not in results.domains]
    if unknown:
        raise ValueError(f"no results for the domains {unknown}; have {results.domains}")
    categories = results.meta.get("categories") or {}
    flagged = dict(verdict.get("not_comparable", {})) if verdict else {}
    caveats = dict(verdict.get("caveats", {})) if verdict else {}
    # Bold goes to comparable entries only, whether or not the verdict is written out.
    excluded = set(flagged) if verdict else set(_not_comparable(results))
    marks = {m: i + 1 for i, m in enumerate(flagged)}
    what = metric.replace("top", "Top-")
    relative = results.meta.get("relative_to")
    out = [
        (
            "% Made by imagenet_cog; needs \\usepackage{booktabs} and \\usepackage{graphicx} in "
            "the preamble."
        ),
        (
            "% A table wider than the text is scaled down to \\linewidth; in a two-column "
            "document, to_latex(float_env='table*') spans both columns."
        ),
    ]
    reference = [m for m, v in (verdict or {}).get("comparable", {}).items() if v == "reference"]
    if reference:
        out.append(
            _comment("% Published results of the ImageNet-CoG paper: " + ", ".join(reference))
        )
    if verdict is not None:
        if flagged:
            out.append(_comment("% NOT COMPARABLE with the paper: " + ", ".join(flagged)))
        elif any(v == "yes" for v in verdict["comparable"].values()):
            checked = [m for m, v in verdict["comparable"].items() if v == "yes"]
            out.append(
                _comment("% Comparable with the paper (no deviation found): " + ", ".join(checked))
            )
        for model, reasons in flagged.items():
            out.append(_comment(f"%   {model}:"))
            out += [_comment(f"%     - {r}") for r in summarize_reasons(reasons)]
        for model, reasons in caveats.items():
            out.append(_comment(f"%   {model}, caveats (still comparable):"))
            out += [_comment(f"%     - {r}") for r in summarize_reasons(reasons)]
    wanted = None if shots is None else [normalize_shots(s) for s in shots]
    tables = 0
    for domain in domains:
        # The same grid of scores as the text and Markdown tables of the domain.
        columns, grid = results.score_grid(metric, domain=domain)
        keep = [j for j, s in enumerate(columns) if wanted is None or s in wanted]
        columns = [columns[j] for j in keep]
        scores = {m: [grid[m][j] for j in keep] for m in grid}
        models = [m for m in results.models if any(row is not None for row in scores[m])]
        if not columns or not models:
            continue
        tables += 1
        bold = _bold_rows(models, scores, columns, digits, set(models) - excluded, relative)
        name = escape(display_domain(domain))
        caption = f"{what} accuracies (\\%) of linear classifiers on {name}"
        if relative:
            caption += f", relative to {escape(relative)} (points)"
        else:
            caption += ", mean $\\pm$ std over seeds"
        shown_flagged = [m for m in models if m in excluded]
        caption += (
            "; best comparable value per column in bold."
            if shown_flagged
            else "; best per column in bold."
        )
        out += [
            "",
            f"\\begin{{{float_env}}}[t]",
            "\\centering",
            f"\\caption{{{caption}}}",
            f"\\label{{tab:{_label(label_prefix)}-{_label(domain)}}}",
            "\\footnotesize",
            "\\setlength{\\tabcolsep}{3pt}",
            # Scaled down only when wider than the text: its natural size otherwise.
            "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%",
            "\\begin{tabular}{l" + "c" * len(columns) + "}",
            "\\toprule",
            f" & \\multicolumn{{{len(columns)}}}{{c}}{{$N$ images per concept}} \\\\",
            f"\\cmidrule(lr){{2-{len(columns) + 1}}}",
            "Model & " + " & ".join(_shot_header(s) for s in columns) + " \\\\",
            "\\midrule",
        ]
        previous = None
        for i, model in enumerate(models):
            group = categories.get(model, "")
            if i and categories and group != previous:
                out.append("\\midrule")
            previous = group
            label = escape(model)
            if model in marks:
                label += f"$^{{\\dagger{marks[model]}}}$" if len(marks) > 1 else "$^\\dagger$"
            cells = []
            for j, row in enumerate(scores[model]):
                if row is None:
                    cells.append("--")
                    continue
                mean = f"{row['mean']:+.{digits}f}" if relative else f"{row['mean']:.{digits}f}"
                if (model, j) in bold:
                    mean = f"\\mathbf{{{mean}}}"
                cell = (
                    f"${mean}$"
                    if relative
                    else f"${mean}$\\,{{\\scriptsize$\\pm${row['std']:.{digits}f}}}"
                )
                cells.append(cell)
            out.append(f"{label} & " + " & ".join(cells) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}}"]
        for model, number in marks.items():
            if model not in models:
                continue
            sign = f"$^{{\\dagger{number}}}$" if len(marks) > 1 else "$^\\dagger$"
            # This table's domain only, the decisive reasons first.
            lines = summarize_reasons(flagged[model], domains=[display_domain(domain)])
            reasons = "; ".join(escape(r) for r in lines)
            out.append(
                f"\\par\\smallskip{{\\scriptsize {sign}Not comparable with the paper: {reasons}.\\par}}"
            )
        out.append(f"\\end{{{float_env}}}")
    if tables == 0:
        raise ValueError(f"no {metric} scores for the domains {domains}: no LaTeX table to make")
    return "\n".join(out) + "\n"


def _not_comparable(results):
    from ._comparability import not_comparable

    return not_comparable(results)


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
    """The verdict as Markdown lines (a quote block), ``[]`` when nothing is to be said;
    names and reasons escaped."""
    from ._tables import markdown_cell as md

    lines = []
    for model, reasons in verdict["not_comparable"].items():
        lines.append(
            f"> **{md(model)}: not comparable with the paper**: "
            + "; ".join(map(md, reasons))
            + "."
        )
    for model, reasons in verdict["caveats"].items():
        lines.append(
            f"> {md(model)}, caveats (still comparable): " + "; ".join(map(md, reasons)) + "."
        )
    checked = [md(m) for m, v in verdict["comparable"].items() if v == "yes"]
    if checked and not verdict["not_comparable"]:
        lines.insert(0, f"> Comparable with the paper: {', '.join(checked)}.")
    return lines


def csv_text(results, metric):
    """The aggregated rows of ``results`` as CSV, each with its model's verdict."""
    import csv
    import io

    from ._tables import csv_cell

    verdict = export_verdict(results)
    buf = io.StringIO()
    fields = ["model", "domain", "shots", "metric", "mean", "std", "n", "comparable"]
    fields.append("deviations")
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in results.summary(metric):
        model = row["model"]
        reasons = "; ".join(verdict["not_comparable"].get(model, []))
        comparable = verdict["comparable"].get(model, "")
        # Text cells that a spreadsheet would run as a formula are quoted.
        text = {k: csv_cell(row[k]) for k in ("model", "domain")}
        writer.writerow({**row, **text, "comparable": comparable, "deviations": csv_cell(reasons)})
    return buf.getvalue()


def json_text(results, metrics):
    """Records, aggregated rows of ``metrics``, meta and the verdict of ``results`` as JSON."""
    import json

    payload = {
        "records": results.records,
        "summary": {m: results.summary(m) for m in metrics if results.summary(m)},
        "meta": results.meta,
        "verdict": export_verdict(results),
    }
    return json.dumps(payload, indent=2, default=str) + "\n"


def markdown_text(results, metric, digits):
    """The tables of ``results.report()`` as Markdown, under the comparability verdict."""
    verdict = markdown_verdict(export_verdict(results))
    parts = ["\n".join(verdict)] if verdict else []
    views = [("all", None)]
    if len(results.shots) > 1:
        views += [(None, d) for d in results.domains]
    for shots, domain in views:
        parts.append(results.score_table(metric, shots, domain, None, digits, True).markdown())
    return "\n\n".join(parts) + "\n"
