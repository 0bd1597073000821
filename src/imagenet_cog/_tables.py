"""Tables: built once as rows of cells, rendered as aligned text a person reads at a glance
(missing cells as ``-``) or as Markdown; the table of the analyses beyond accuracy; and the
escaping of a name for each place it is written (a terminal, a CSV cell, a Markdown cell).

The results tables are :class:`Table` objects (:meth:`Results.table` renders one as text,
:meth:`Results.to_markdown` the same one as Markdown); their scores come from one grid
(:meth:`Results.score_grid <imagenet_cog.Results.score_grid>`), which the LaTeX export renders
too.

Stage "results"; imports nothing from the package but the grid's display names and the table
of analyses (the measures' column heads and units).
"""

from __future__ import annotations

import dataclasses
import math
import re

from ._grid import display_domain, display_shots, domain_key, normalize_shots

__all__ = [
    "Table",
    "align_rows",
    "check_name",
    "csv_cell",
    "format_analysis_table",
    "markdown_cell",
    "number_cell",
    "printable",
    "score_table",
    "score_text",
]

# Control characters (C0 but tab, DEL, C1) and the bidirectional overrides: a terminal acts
# on them (escape sequences, a line rewritten, text shown reversed) instead of showing them.
# Lone surrogates (bytes that were not UTF-8, or a JSON "\udc80") cannot be written as text.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def printable(text):
    r"""``text`` with every control character shown as its escape (``\x1b``, ``\n``),
    so that a terminal shows it rather than acts on it.

    Examples
    --------
    >>> printable("a\x1b[2Jb\nc")
    'a\\x1b[2Jb\\nc'
    """
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


def check_name(name, what="model"):
    """``name`` as a string, or ``ValueError`` when it holds a control character (a line
    break, an escape sequence), which no table, CSV, LaTeX or terminal can show as it is, or a
    lone surrogate, which no file can hold as text.

    Examples
    --------
    >>> check_name("ResNet50")
    'ResNet50'
    """
    text = str(name)
    if _SURROGATE.search(text):
        raise ValueError(
            f"the {what} name {text!r} holds a lone surrogate (bytes that are not UTF-8), "
            "which no table, export or figure can write: give the run another name "
            "(Results.load(path, model=...), evaluate --model)"
        )
    if _CONTROL.search(text):
        raise ValueError(
            f"the {what} name {text!r} holds a control character (a line break or "
            "an escape sequence), which no table or export can show: give the run another "
            "name (Results.load(path, model=...), evaluate --model)"
        )
    return text


def csv_cell(text):
    """A text cell of a CSV file that no spreadsheet reads as a formula: a leading ``=``,
    ``+``, ``-``, ``@``, tab or carriage return is quoted with ``'``.

    Examples
    --------
    >>> csv_cell("=HYPERLINK(1)"), csv_cell("ResNet50")
    ("'=HYPERLINK(1)", 'ResNet50')
    """
    text = str(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def markdown_cell(text):
    r"""Text for a Markdown table cell or line: its markup characters escaped (a ``|`` would
    split the cell) and control characters shown as escapes.

    Examples
    --------
    >>> markdown_cell("a|b_c")
    'a\\|b\\_c'
    """
    return re.sub(r"([\\`*_|<>\[\]])", r"\\\1", printable(text))


def number_cell(value, form):
    """``value`` formatted, or ``"-"`` for a missing cell (NaN), as every table shows it."""
    return "-" if math.isnan(value) else format(value, form)


def score_text(row, digits, with_std, signed=False):
    """A summary row's score as a text cell: ``mean ± std``, or the mean alone (with its sign
    when ``signed``); ``"-"`` for no row."""
    if row is None:
        return "-"
    if with_std:
        return f"{row['mean']:.{digits}f} ± {row['std']:.{digits}f}"
    return f"{row['mean']:+.{digits}f}" if signed else f"{row['mean']:.{digits}f}"


def align_rows(rows):
    """Rows of cells as aligned text: the first column left-aligned, the others right."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [str(row[0]).ljust(widths[0])] + [
            str(c).rjust(w) for c, w in zip(row[1:], widths[1:])
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Table:
    """A table with a title: a header row and body rows of cell texts, label first."""

    title: str
    header: tuple
    rows: tuple

    def text(self):
        """The title over aligned columns."""
        return self.title + "\n" + align_rows([self.header, *self.rows])

    def markdown(self):
        """The title in bold over a Markdown table (the label column left-aligned, the others
        right)."""
        lines = [f"**{markdown_cell(self.title)}**", "", _markdown_row(self.header)]
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(self.header) - 1)) + "|")
        lines += [_markdown_row(r) for r in self.rows]
        return "\n".join(lines)


def _markdown_row(cells):
    return "| " + " | ".join(markdown_cell(str(c).strip()) for c in cells) + " |"


def score_table(results, metric, shots, domain, models, digits, with_std):
    """The :class:`Table` of :meth:`Results.table <imagenet_cog.Results.table>`, from its
    :meth:`~imagenet_cog.Results.score_grid`."""
    models = list(models or results.models)
    relative = results.meta.get("relative_to")
    what = f"{metric.replace('top', 'top-')} (%)"
    if relative:
        what += f" relative to {relative} (points)"
        with_std = False
    if domain is not None:
        columns, scores = results.score_grid(metric, domain=domain)
        header = ["model"] + [f"N={display_shots(s)}" for s in columns]
        title = f"{what} on {display_domain(domain)}, by shots per class"
    else:
        if shots is None:
            shots = "all" if "all" in results.shots else results.shots[-1]
        shots = normalize_shots(shots)
        columns, scores = results.score_grid(metric, shots=shots)
        header = ["model"] + [display_domain(d) for d in columns]
        which = "all training images" if shots == "all" else f"{shots} images per class"
        title = f"{what}, {which}"
    if with_std:
        title += ", mean ± std over seeds"
    signed = "relative_to" in results.meta
    body = [
        (
            m,
            *(
                score_text(row, digits, with_std, signed)
                for row in scores.get(m, [None] * len(columns))
            ),
        )
        for m in models
    ]
    return Table(title, tuple(header), tuple(body))


def format_analysis_table(payload, model=None, digits=3):
    """The text table of one model's ``analysis.json`` payload (plain JSON in, text out).

    Rows are domains in paper order; columns the measures (rates in percent), plus
    ``Δalign``/``Δunif``: alignment and uniformity minus IN-1K's, when IN-1K is there.
    """
    from ._analysis.table import header_of, is_relative, scale_of, table_keys

    domains = payload.get("domains") or {}
    order = sorted(domains, key=domain_key)
    present = dict.fromkeys(
        m
        for d in order
        for m, v in domains[d].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    )
    metrics = table_keys(present)
    base = domains.get("in1k") or domains.get("IN-1K")
    relative = [m for m in metrics if is_relative(m) and base and m in base]

    def cell(v, rate=False, signed=False):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        if rate:
            return f"{100 * v:.1f}"
        return f"{v:+.{digits}f}" if signed and v != 0 else f"{v:.{digits}f}"

    header = ["domain"]
    for m in metrics:
        header.append(header_of(m))
        if m in relative:
            header.append("Δ" + header_of(m))
    rows = [header]
    for d in order:
        row = [printable(display_domain(d))]
        for m in metrics:
            v = domains[d].get(m)
            row.append(cell(v, rate=scale_of(m) != 1.0))
            if m in relative:
                b = base.get(m)
                row.append(cell(None if v is None or b is None else v - b, signed=True))
        rows.append(row)
    title = f"analysis of {printable(model or payload.get('model', 'model'))}"
    if not order:
        return title + "\n(no domains)"
    return title + "\n" + align_rows(rows)
