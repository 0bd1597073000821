"""A model under each protocol, side by side: the paper's linear probe, then each evaluation of
its ``analysis.json`` (k-NN, zero-shot), every row named by its protocol.

Stage "results", the wing of what a reader reads. The evaluations come from the table of
analyses (the rows with a ``protocol``, through their ``scores``): a new evaluation shows
here with no edit. Nothing here ranks: the ranks among the paper's models are the linear
probe's alone, and every line that shows an evaluation's number says which protocol made it.
"""

from __future__ import annotations

import dataclasses
import math

from .._analysis.table import ANALYSES
from .._grid import display_domain, display_shots, domain_key, normalize_shots
from .._tables import align_rows, printable

__all__ = [
    "LINEAR",
    "ProtocolRow",
    "concept_columns",
    "evaluated_models",
    "not_ranked",
    "protocol_rows",
    "protocols_section",
    "protocols_text",
    "relative_change",
]

#: The label of the linear probe's row.
LINEAR = "linear probe (the paper's protocol)"


def not_ranked(protocols):
    """What every view of the evaluations says of them, naming ``protocols``."""
    protocols = list(dict.fromkeys(protocols))
    which = " and ".join(protocols)
    verb = "is another protocol" if len(protocols) == 1 else "are other protocols"
    return (
        f"{which} {verb} than the paper's linear probe: shown beside it, never ranked with "
        "the paper's numbers"
    )


@dataclasses.dataclass(frozen=True)
class ProtocolRow:
    """One protocol's numbers for a model.

    Attributes
    ----------
    label : str
        The protocol and its settings.
    kind : str
        ``"linear probe"``, or the evaluation's protocol (``"k-NN"``, ``"zero-shot"``).
    domains, stds : dict
        ``{domain: top-1 (%)}`` and ``{domain: std over the seeds}``.
    concepts : dict
        ``{wnid: top-1 (%)}`` where recorded (the evaluations' all-data cells).
    note : str
    """

    label: str
    kind: str
    domains: dict
    stds: dict
    concepts: dict
    note: str

    @property
    def change(self):
        """The relative change from L1 to L5, in percent of L1's (NaN without both)."""
        return relative_change(self.domains)


def relative_change(values):
    """``100 * (L5 - L1) / L1`` of ``{domain: top-1}``; NaN without both or with L1 at 0."""
    first, last = values.get("L1"), values.get("L5")
    if first is None or last is None or not first > 0:
        return math.nan
    return 100.0 * (last - first) / first


def _linear(results, model, shots):
    domains, stds, seeds = {}, {}, set()
    for domain in results.domains:
        cell = results.cell(model, domain, shots)
        if cell is not None:
            domains[domain], stds[domain] = cell["mean"], cell["std"]
    for record in results.records:
        if record["model"] == model and record["shots"] == shots and "seed" in record:
            seeds.add(record["seed"])
    which = "all training images" if shots == "all" else f"{shots} images per concept"
    note = f"{which}, mean over seeds {', '.join(map(str, sorted(seeds)))}" if seeds else which
    return ProtocolRow(LINEAR, "linear probe", domains, stds, {}, note)


def protocol_rows(results, model, shots="all"):
    """The rows of a model: the linear probe's (when it has cells), then each evaluation's
    that its ``analysis.json`` holds at ``shots``."""
    shots = normalize_shots(shots)
    rows = []
    linear = _linear(results, model, shots)
    if linear.domains:
        rows.append(linear)
    payload = (results.meta.get("analysis") or {}).get(model)
    for row in ANALYSES.values():
        if not row.protocol or row.scores is None or not payload:
            continue
        found = row.scores(payload, shots)
        if found is not None:
            rows.append(
                ProtocolRow(
                    found.label, row.protocol, found.domains, found.stds, found.concepts, found.note
                )
            )
    return rows


def evaluated_models(results, models):
    """The ``models`` whose ``analysis.json`` holds an evaluation's numbers."""
    return [
        m for m in models if any(r.kind != "linear probe" for r in protocol_rows(results, m, "all"))
    ]


def _cell(row, domain):
    value = row.domains.get(domain)
    if value is None:
        return "-"
    std = row.stds.get(domain)
    return f"{value:.1f} ± {std:.1f}" if std is not None else f"{value:.1f}"


def protocols_text(results, models, shots="all"):
    """For each of ``models`` with an evaluation: a table of its top-1 per domain under each
    protocol, with the relative change from L1 to L5; ``""`` when none has one."""
    shots = normalize_shots(shots)
    parts = []
    for model in evaluated_models(results, models):
        rows = protocol_rows(results, model, shots)
        domains = sorted({d for r in rows for d in r.domains}, key=domain_key)
        table = [["protocol", *map(display_domain, domains), "L1→L5"]]
        for row in rows:
            change = row.change
            table.append(
                [
                    row.label,
                    *(_cell(row, d) for d in domains),
                    "-" if math.isnan(change) else f"{change:+.1f}%",
                ]
            )
        which = "all training images" if shots == "all" else f"N={display_shots(shots)}"
        notes = [f"  {r.label}: {r.note}" for r in rows if r.note]
        parts.append(
            f"{printable(model)}: top-1 (%) under each protocol ({which}; mean ± std over "
            "the seeds where there are seeds)\n" + align_rows(table) + "\n" + "\n".join(notes)
        )
    if not parts:
        return ""
    kinds = [r.kind for m in models for r in protocol_rows(results, m, shots)]
    return "\n\n".join(parts) + f"\n({not_ranked(k for k in kinds if k != 'linear probe')}.)"


# ------------------------------------------------------------------ the HTML report
def protocols_section(results, mine, svg, shots="all"):
    """The HTML report's section of ``mine`` under each protocol (``""`` when no model of
    theirs has an evaluation): per model, a table of its top-1 per domain under each
    protocol, with the L1 → L5 relative change of each, and a figure of the same, each line
    named by its protocol; ``svg(fig)`` renders a figure inline."""
    from .._analysis.evaluation_figures import protocols_figure
    from .._optional_dependencies import INSTALLED
    from .page import Cell, esc, table

    shots = normalize_shots(shots)
    models = evaluated_models(results, mine)
    if not models:
        return ""
    which = "all training images" if shots == "all" else f"{shots} images per concept"
    kinds = [r.kind for m in models for r in protocol_rows(results, m, shots)]
    others = [k for k in dict.fromkeys(kinds) if k != "linear probe"]
    parts = [
        '<section id="protocols"><h2>Under each protocol: '
        + esc(", ".join(["the linear probe", *others]))
        + "</h2>",
        (
            f'<p class="muted">Top-1 (%) on the same test images, {esc(which)}'
            + (" (zero-shot trains on none)" if "zero-shot" in others else "")
            + "; mean ± std over the seeds where there are seeds; "
            f"{esc(not_ranked(others))}. The ranks above are the linear probe's alone.</p>"
        ),
    ]
    for model in models:
        rows = protocol_rows(results, model, shots)
        domains = sorted({d for r in rows for d in r.domains}, key=domain_key)
        body = []
        for row in rows:
            change = row.change
            body.append(
                [
                    Cell(row.label, css="text", title=row.note or None),
                    *(Cell(_cell(row, d), row.domains.get(d)) for d in domains),
                    Cell("-" if math.isnan(change) else f"{change:+.1f}%", change),
                ]
            )
        header = [
            Cell("protocol", css="text"),
            *map(display_domain, domains),
            Cell("L1 → L5", title="relative change from L1 to L5, in percent of L1's"),
        ]
        ident = "protocols-" + "".join(c if c.isalnum() else "-" for c in model.lower())
        notes = "".join(f"<li>{esc(r.label)}: {esc(r.note)}</li>" for r in rows if r.note)
        parts += [
            f"<h3>{esc(model)}</h3>",
            '<div class="scroll">',
            table(header, body, ident=ident),
            "</div>",
            f'<ul class="muted">{notes}</ul>',
        ]
        if INSTALLED["matplotlib"] and len(domains) > 1:
            import matplotlib.pyplot as plt

            fig = protocols_figure(
                [(r.label, r.kind, r.domains) for r in rows],
                model,
                title=f"{model}: top-1 per domain under each protocol ({which})",
            )
            try:
                parts.append(
                    '<div class="figures"><figure class="column">'
                    f"{svg(fig)}<figcaption>Top-1 per domain under each protocol, as the "
                    "paper's Figure 3a draws the linear probe's.</figcaption></figure></div>"
                )
            finally:
                plt.close(fig)
    parts.append("</section>")
    return "\n".join(parts)


def concept_columns(results, models, shots="all"):
    """The explorer's columns of the evaluations: ``[(head, tooltip, {wnid: top-1})]`` of
    each of ``models``' evaluations that recorded accuracy per concept at ``shots``."""
    out = []
    for model in models:
        for row in protocol_rows(results, model, shots):
            if row.kind != "linear probe" and row.concepts:
                out.append(
                    (
                        f"{model}: {row.label} top-1 (%)",
                        (
                            f"{row.label}, on the concept's test images ({row.note}); another "
                            "protocol than the linear probe"
                        ),
                        row.concepts,
                    )
                )
    return out
