"""The self-contained HTML report of :meth:`Results.to_html` and ``imagenet-cog report
--html``: one file that opens offline in any browser and reads without its script.

Stage "results", the wing of what a reader reads. In order: the answer (each of the user's
models, its rank among the paper's models, its scores and its relative change from L1 to
L5), the verdict on comparability with its decisive reasons, the paper's Figures 3 and 4 as
inline SVG, the tables of Tables 5-10 (their columns sort), the paired comparison of two
models, the analyses beyond accuracy (every measure of the table of analyses that a run's
``analysis.json`` holds), the per-concept explorer (from saved predictions) and what made the
numbers.
"""

from __future__ import annotations

import datetime
import io
import math
import re

from .._analysis.table import (
    ANALYSES,
    digits_of,
    find_measure,
    header_of,
    scale_of,
    table_keys,
    title_of,
)
from .._comparability import COMPARABLE, comparability, not_comparable
from .._grid import Protocol, display_domain, display_shots, domain_key, normalize_shots
from .._optional_dependencies import INSTALLED
from .._paired import comparison_table
from .._provenance import weights_identity
from .._version import __version__
from .answer import answer_heading, answer_ranks, relative_change_lines
from .concepts import concept_rows
from .page import Cell, esc, page, table
from .protocols import concept_columns, protocols_section
from .verdict import CAVEATS_COMPARABLE, caveat_groups, summarize_reasons

__all__ = ["html_report"]

#: The figures of the report, in the paper's order, and the width each is made for.
FIGURES = (
    ("levels_absolute", "column", "Top-1 per domain with all training images (Figure 3a)."),
    ("levels_relative", "column", "Top-1 relative to the baseline (Figures 3b-e)."),
    ("fewshot", "page", "Top-1 against images per concept, per domain (Figure 4a-c)."),
    ("fewshot_relative", "page", "The same relative to the baseline (Figures 4d-f)."),
)


def _mine(results):
    """The user's models: those highlighted by :meth:`Results.compare`, else every model
    that is not a published one."""
    reference = set(results.reference_models())
    return list(results.meta.get("highlight") or [m for m in results.models if m not in reference])


def _number(value, form=".1f"):
    return "-" if value is None or math.isnan(value) else format(value, form)


# ------------------------------------------------------------------ the answer first
def _answer(results, mine, shots, flagged):
    if not mine:
        return (
            '<section id="answer"><h2>The paper\'s published results</h2><p>No run of yours: '
            "give RESULTS folders to see where your models stand.</p></section>"
        )
    baseline = results.meta.get("baseline")
    reference = results.reference_models()
    domains, _ = results.score_grid(shots=shots)
    ranks, n = answer_ranks(results, shots) if reference else ({}, 0)
    rel = results.relative_to(baseline) if baseline in results.models else None
    rows, attrs = [], []
    for model in mine:
        label = f"{model} †" if model in flagged else model
        if reference:
            shown = []
            for d in domains:
                r = ranks.get(model, {}).get(d)
                text = "-" if r is None else (f"({r})*/{n}" if model in flagged else f"{r}/{n}")
                shown.append(Cell(text, r, "rank"))
            rows.append([Cell(f"{label}: rank", css="text"), *shown])
            attrs.append({"class": "mine"})
        rows.append(
            [Cell(f"{label}: top-1 (%)", css="text")]
            + [
                Cell(_number(results.mean(model, d, shots)), results.mean(model, d, shots))
                for d in domains
            ]
        )
        attrs.append({})
        if rel is not None and model != baseline:
            rows.append(
                [Cell(f"{label}: vs {baseline} (points)", css="text")]
                + [Cell(_number(rel.mean(model, d, shots), "+.1f")) for d in domains]
            )
            attrs.append({})
    which = "all training images" if shots == "all" else f"{shots} images per concept"
    yours = "Your model" if len(mine) == 1 else f"Your {len(mine)} models"
    head = answer_heading(results, mine, which) if reference else f"{yours} ({which})"
    parts = [
        '<section id="answer" class="answer">',
        f"<h2>{esc(head)}</h2>",
        table(["", *map(display_domain, domains)], rows, css="answer", row_attrs=attrs),
    ]
    if reference and flagged:
        parts.append(
            '<p class="muted">(r)* not comparable with the paper: a rank for orientation only.</p>'
        )
    changes = [
        f"<li>{esc(line)}</li>" for line in relative_change_lines(results, mine, shots, arrow="→")
    ]
    if changes:
        parts.append("<ul>" + "".join(changes) + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)


def _verdict(results, mine, flagged):
    if not mine:
        return ""
    checked = comparability(results, by_model=True)
    parts = ['<section id="verdict">']
    if flagged:
        parts.append('<div class="verdict bad" role="alert">')
        parts.append(
            f'<strong class="head">NOT COMPARABLE with the paper: {esc(", ".join(flagged))}'
            "</strong>"
        )
        for model, reasons in flagged.items():
            lines = "".join(f"<li>{esc(r)}</li>" for r in summarize_reasons(reasons))
            name = f"<p><strong>{esc(model)}</strong></p>" if len(flagged) > 1 else ""
            parts.append(f"{name}<ul>{lines}</ul>")
        parts.append(
            "<p>Ranks of these models are shown in parentheses, for orientation only.</p></div>"
        )
    clean = [m for m in mine if m in checked and m not in flagged]
    if clean:
        parts.append(
            '<div class="verdict good"><strong class="head">Comparable with the paper: '
            f"{esc(', '.join(clean))}</strong><p>No deviation found in what the runs "
            "recorded.</p></div>"
        )
    for head, caveats in caveat_groups(results):
        # Under a NOT COMPARABLE banner, a model's caveats are not said to leave it comparable.
        items = []
        for model, found in caveats.items():
            if model not in mine:
                continue
            lines = "".join(f"<li>{esc(c)}</li>" for c in summarize_reasons(found))
            items.append(f"<p><strong>{esc(model)}</strong></p><ul>{lines}</ul>")
        if items:
            head = (
                "Caveats (the cells shown stay comparable)" if head == CAVEATS_COMPARABLE else head
            )
            parts.append(f"<details><summary>{esc(head)}</summary>" + "".join(items) + "</details>")
    parts.append(f"<details><summary>What comparable means</summary><p>{esc(COMPARABLE)}</p>")
    parts.append("</details></section>")
    return "\n".join(parts)


# ------------------------------------------------------------------ figures
def _svg(fig):
    """A figure as inline SVG: its text as text (the page's fonts), no XML prologue."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "imagenet-cog"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", pad_inches=0.04)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]

    def path(match):  # a tenth of a point is finer than any screen shows
        data = re.sub(r"(\d+\.\d)\d+", r"\1", match.group(1))
        return ' d="' + " ".join(data.split()) + '"'

    return re.sub(r' d="([^"]*)"', path, text)


def _figures(results, mine, compare):
    parts = ['<section id="figures">', "<h2>Figures 3 and 4, in the paper's groups</h2>"]
    if not INSTALLED["matplotlib"]:
        parts.append(
            "<p>The figures need matplotlib: pip install 'imagenet_cog[plot]', then make the "
            "report again.</p></section>"
        )
        return "\n".join(parts)
    import matplotlib.pyplot as plt

    baseline = results.meta.get("baseline")
    baseline = baseline if baseline in results.models else None
    highlight = list(dict.fromkeys([*mine, *(compare or [])]))
    figs = results.figures(baseline=baseline, highlight=highlight or None)
    parts.append('<div class="figures">')
    try:
        for name, width, caption in FIGURES:
            if name in figs:
                parts.append(
                    f'<figure class="{width}" id="figure-{name}">{_svg(figs[name])}'
                    f"<figcaption>{esc(caption)}</figcaption></figure>"
                )
    finally:
        for fig in figs.values():
            plt.close(fig)
    parts.append("</div></section>")
    return "\n".join(parts)


# ------------------------------------------------------------------ tables 5-10
def _score_table(results, mine, flagged, columns_of, header_of, ident):
    columns, scores = columns_of()
    rows, attrs = [], []
    for model in results.models:
        cells = scores.get(model) or []
        if not any(cells):
            continue
        label = f"{model} †" if model in flagged else model
        row = [
            Cell(
                label,
                css="text",
                title="not comparable with the paper" if model in flagged else None,
            )
        ]
        for summary in cells:
            if summary is None:
                row.append(Cell("-", ""))
            else:
                text = f"{summary['mean']:.1f} ± {summary['std']:.1f}"
                row.append(Cell(text, round(summary["mean"], 4)))
        rows.append(row)
        attrs.append({"class": "mine"} if model in mine else {})
    header = ["model", *(header_of(c) for c in columns)]
    return table(header, rows, ident=ident, row_attrs=attrs)


def _tables(results, mine, flagged, shots):
    parts = [
        '<section id="tables">',
        "<h2>Tables 5-10: top-1 (%), mean ± std over seeds</h2>",
        (
            '<p class="muted">Click a column\'s head to sort by it; your models are shaded, '
            "† marks a model not comparable with the paper.</p>"
        ),
        f"<h3>Every domain, {esc(display_shots(shots))} images per concept</h3>",
        '<div class="scroll">',
        _score_table(
            results,
            mine,
            flagged,
            lambda: results.score_grid(shots=shots),
            display_domain,
            "table-overview",
        ),
        "</div>",
    ]
    if len(results.shots) > 1:
        for domain in results.domains:
            parts += [
                f"<h3>{esc(display_domain(domain))}, by images per concept (N)</h3>",
                '<div class="scroll">',
                _score_table(
                    results,
                    mine,
                    flagged,
                    lambda d=domain: results.score_grid(domain=d),
                    lambda s: f"N={display_shots(s)}",
                    f"table-{domain.lower()}",
                ),
                "</div>",
            ]
    parts.append("</section>")
    return "\n".join(parts)


def _comparison(results, compare, shots):
    """The paired comparison of two models as a table whose verdicts wrap: it fits the page
    whatever the models' names."""
    if not compare:
        return ""
    a, b = compare
    found = comparison_table(results, a, b, shots=normalize_shots(shots))
    text = {"css": "text"}
    header = [Cell(found.header[0], **text), *found.header[1:-1], Cell("verdict", **text)]
    rows = [
        [Cell(row[0], **text), *row[1:-1], Cell(row[-1], css="text verdict-cell")]
        for row in found.rows
    ]
    flags = "".join(
        f'<div class="verdict bad" role="alert"><p>{esc(flag)}</p></div>' for flag in found.flags
    )
    notes = "".join(f'<p class="muted">{esc(note)}</p>' for note in found.notes)
    return (
        '<section id="compare">'
        f"<h2>Is {esc(a)} better than {esc(b)}?</h2>"
        f'<p class="compare-title">{esc(found.title)}</p>{flags}'
        f'<div class="scroll">{table(header, rows, css="compare", ident="compare-table")}</div>'
        f"{notes}</section>"
    )


# ------------------------------------------------------------------ the analyses
def _measure_cell(value, key):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        return Cell("-", "")
    scale = scale_of(key)
    places = digits_of(key, 1 if scale != 1.0 else 3)
    return Cell(format(scale * value, f".{places}f"), round(value, 6))


def _analysis_table(model, payload):
    """One model's analyses: a row per domain, a column per measure (its definition, unit
    and better way on its head), and what each measure is, under the table."""
    domains = payload.get("domains") or {}
    order = sorted(domains, key=domain_key)
    present = dict.fromkeys(
        m
        for d in order
        for m, v in domains[d].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    )
    keys = table_keys(present)
    if not order or not keys:
        return f"<h3>{esc(model)}</h3><p>No measure.</p>"
    described = {k: find_measure(k) for k in keys}
    header = [Cell("domain", css="text")]
    for key in keys:
        found = described[key]
        tip = f"{title_of(key)}: {found.describe(key)}" if found else None
        header.append(Cell(header_of(key), title=tip))
    rows = [
        [Cell(display_domain(d), css="text")] + [_measure_cell(domains[d].get(k), k) for k in keys]
        for d in order
    ]
    ident = "analysis-" + "".join(c if c.isalnum() else "-" for c in model.lower())
    items = []
    for row in ANALYSES.values():
        mine = [k for k in keys if described[k] in row.measures]
        if not mine:
            continue
        lines = "".join(
            f"<li><strong>{esc(header_of(k))}</strong>"
            + (f" ({esc(title_of(k))})" if title_of(k) != header_of(k) else "")
            + f": {esc(described[k].describe(k))}</li>"
            for k in mine
        )
        items.append(f"<p>{esc(row.title)} (<code>{esc(row.name)}</code>)</p><ul>{lines}</ul>")
    unknown = [k for k in keys if described[k] is None]
    if unknown:
        items.append(
            f"<p>Not described by this version of imagenet_cog: {esc(', '.join(unknown))}.</p>"
        )
    return "\n".join(
        [
            f"<h3>{esc(model)}</h3>",
            '<div class="scroll">',
            table(header, rows, ident=ident),
            "</div>",
            "<details><summary>What each measure is</summary>" + "".join(items) + "</details>",
            _row_figures(model, payload),
        ]
    )


def _row_figures(model, payload):
    """The figures of the analyses whose row draws one from a model's payload."""
    if not INSTALLED["matplotlib"]:
        return ""
    import matplotlib.pyplot as plt

    parts = []
    for row in ANALYSES.values():
        if row.figure is None or not payload.get(row.section or row.name):
            continue
        fig = row.figure(payload, model)
        if fig is None:
            continue
        try:
            parts.append(
                f'<figure class="page" id="figure-{esc(row.name)}">{_svg(fig)}'
                f"<figcaption>{esc(row.title)}.</figcaption></figure>"
            )
        finally:
            plt.close(fig)
    return '<div class="figures">' + "".join(parts) + "</div>" if parts else ""


def _analyses(results):
    """The analyses loaded with the results (``analysis.json`` beside a run): nothing when
    none was."""
    found = results.meta.get("analysis") or {}
    if not found:
        return ""
    parts = [
        '<section id="analyses"><h2>Analyses beyond accuracy</h2>',
        (
            '<p class="muted">What <code>imagenet-cog analyze</code> measured of the features '
            "and of the errors, per domain (<code>analysis.json</code> beside the run); a "
            "column's head says what it is, its unit and which way is better.</p>"
        ),
        *(_analysis_table(model, payload) for model, payload in found.items()),
        "</section>",
    ]
    return "\n".join(parts)


# ------------------------------------------------------------------ the concepts
def _confusion_text(confusions):
    parts = []
    for _, name, count, relation, distance in confusions:
        where = ", ".join(
            x for x in (relation, None if distance is None else f"distance {distance}") if x
        )
        parts.append(f"{name} ({count}×{', ' + where if where else ''})")
    return "; ".join(parts)


#: Tied nearest IN-1K concepts named in the explorer's cell; its tooltip names every one.
SHOWN_TIES = 3


def _nearest_cell(near):
    """The explorer's nearest IN-1K concept: every tied one named, as a tie (the first
    :data:`SHOWN_TIES` in the cell, all of them in its tooltip)."""
    if not near:
        return Cell("-", css="text")
    names = [f"{name} ({wnid})" for wnid, name in near]
    if len(names) == 1:
        return Cell(names[0], css="text")
    more = len(names) - SHOWN_TIES
    text = f"a tie of {len(names)}: " + ", ".join(names[:SHOWN_TIES])
    text += f" and {more} more" if more > 0 else ""
    return Cell(text, css="text", title=f"equally near: {', '.join(names)}")


def _explorer(results, mine, shots, levels=None):
    runs = {m: results.runs(m) for m in mine if results.runs(m)}
    # Every folder of a model: its seeds may have been run in several, as its tables read.
    folders = {m: [run["folder"] for run in found] for m, found in runs.items()}
    head = '<section id="concepts"><h2>Every concept</h2>'
    # The saved predictions are read here; the runs' config.json as Results.load read it.
    configs = {m: found[0]["config"] or {} for m, found in runs.items()}
    rows = concept_rows(folders, shots, configs, levels) if folders else None
    if rows is None:
        return (
            head + "<p>No saved predictions: run <code>imagenet-cog evaluate "
            "--save-predictions</code> (or <code>evaluate(..., save_predictions=True)</code>) to "
            "explore each concept's accuracy and confusions here.</p></section>"
        )
    models = rows.models
    options = "".join(f'<option value="{i}">{esc(m)}</option>' for i, m in enumerate(models))
    second = "".join(
        f'<option value="{i}"{" selected" if i == 1 else ""}>{esc(m)}</option>'
        for i, m in enumerate(models)
    )
    levels = sorted(set(rows.levels))
    pick = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in levels)
    seeds = "; ".join(f"{m}: seeds {', '.join(map(str, s))}" for m, s in rows.seeds.items())
    tools = [
        '<div class="explorer-tools">',
        (
            '<label>Search <input type="search" id="concept-search" '
            'placeholder="wnid or name"></label>'
        ),
        (
            f'<label>Level <select id="concept-level"><option value="">all</option>{pick}'
            "</select></label>"
        ),
    ]
    if len(models) > 1:
        tools.append(
            f'<label>Difference <select id="model-a">{options}</select></label>'
            f'<label>minus <select id="model-b">{second}</select></label>'
        )
    tools.append(f'<span id="concept-count" class="muted">{len(rows.wnids)} concepts</span>')
    tools.append("</div>")
    text = {"css": "text"}
    header = [
        Cell("concept", **text),
        Cell("name", **text),
        Cell("level", **text),
        "similarity",
        Cell("nearest IN-1K concept", **text),
    ]
    for m in models:
        header += [
            Cell(
                f"{m}: top-1 (%)", title="mean ± std over the seeds, on the concept's test images"
            ),
            Cell(f"{m}: most frequent confusions", **text),
        ]
    evaluated = concept_columns(results, models, rows.shots)  # k-NN, zero-shot per concept
    header += [Cell(head, title=tip) for head, tip, _ in evaluated]
    if len(models) > 1:
        # Its head names the pair the selects choose (the script changes it with them).
        header.append(Cell(f"{models[0]} − {models[1]}", css=None, ident="diff-head"))
    body, attrs = [], []
    for i, wnid in enumerate(rows.wnids):
        near = rows.nearest[i]
        row = [
            Cell(wnid, css="text"),
            Cell(rows.names[i], css="text"),
            Cell(display_domain(rows.levels[i]), css="text"),
            Cell(_number(rows.similarity[i], ".3f"), rows.similarity[i]),
            _nearest_cell(near),
        ]
        attr = {
            "data-level": display_domain(rows.levels[i]),
            "data-search": f"{wnid} {rows.names[i]}".lower(),
        }
        means = []
        for k, m in enumerate(models):
            acc = rows.accuracy[m][i]
            if acc is None:
                row.append(Cell("-", ""))
                means.append(None)
            else:
                text = f'{acc[0]:.1f} <span class="std">± {acc[1]:.1f}</span>'
                row.append(Cell(text, round(acc[0], 4), raw=True))
                attr[f"data-acc-{k}"] = f"{acc[0]:.4f}"
                means.append(acc[0])
            row.append(Cell(_confusion_text(rows.confusions[m][i]), css="conf"))
        for _, _, accuracy in evaluated:
            value = accuracy.get(wnid)
            row.append(Cell("-", "") if value is None else Cell(f"{value:.1f}", round(value, 4)))
        if len(models) > 1:
            if None in means[:2]:
                row.append(Cell("-", "", css="diff"))
            else:
                d = means[0] - means[1]
                sign = "pos" if d > 0 else "neg" if d < 0 else ""
                shown = ("+" if d > 0 else "−" if d < 0 else "") + f"{abs(d):.1f}"
                row.append(Cell(shown, round(d, 4), css=f"diff {sign}".strip()))
        body.append(row)
        attrs.append(attr)
    html_table = table(header, body, ident="concepts-table", row_attrs=attrs)
    notes = "".join(f'<p class="muted">{esc(n)}</p>' for n in rows.notes)
    if evaluated:  # name only the evaluations shown
        kinds = [k for k in ("k-NN", "zero-shot") if any(k in h for h, _, _ in evaluated)]
        trained = {"k-NN": "with all the training images", "zero-shot": "with no training image"}
        notes += (
            f'<p class="muted">The {esc(" and ".join(kinds))} columns: top-1 on the concept\'s '
            f"test images ({esc('; '.join(f'{k} {trained[k]}' for k in kinds))}), "
            f"{'other protocols' if len(kinds) > 1 else 'another protocol'} than the linear "
            "probe.</p>"
        )
    intro = (
        f"<p>Each concept of the levels, from the saved predictions with "
        f"N={esc(display_shots(rows.shots))} ({esc(seeds)}): its level, its similarity to IN-1K "
        "under the levels the run used, its nearest IN-1K concept under their measure (every "
        "one where several are equally near), each "
        "model's top-1 over its test images (mean ± std over the seeds) and its most frequent "
        "wrong predictions over the seeds, with where they sit in WordNet (sibling, parent, "
        "child, ancestor, descendant; distance: the shortest path's edges). The test images "
        "are fixed: the ± is the seeds' spread.</p>"
    )
    return "\n".join(
        [head, intro, notes, *tools, '<div class="scroll">', html_table, "</div></section>"]
    )


# ------------------------------------------------------------------ what made the numbers
def _provenance(results, mine):
    parts = ['<section id="provenance"><h2>What made the numbers</h2>']
    protocols = results.meta.get("protocol") or {}
    for model in mine:
        proto = protocols.get(model) or {}
        items = []
        data = proto.get("data") or {}
        ext = next(
            (
                i.get("extraction")
                for i in data.values()
                if isinstance(i, dict) and i.get("extraction")
            ),
            None,
        )
        if ext:
            items += [
                ("model spec (as stored)", ext.get("model")),
                ("weights", ext.get("weights")),
                *weights_identity(ext),
                ("feature layer", ext.get("layer")),
                ("preprocessing", ext.get("preprocessing")),
                ("decoder, amp", f"{ext.get('decoder', 'pil')}, {ext.get('amp', 'off')}"),
            ]
        for domain in sorted(data, key=lambda d: (d != "in1k", d)):
            info = data[domain] or {}
            split = info.get("split") or {}
            copy = split.get("copy") or {}
            what = (
                f"{info.get('n_classes', '?')} concepts, {info.get('n_train', '?')} training and "
                f"{info.get('n_test', '?')} test images"
            )
            if copy:
                what += (
                    f"; copy {copy.get('name', '?')} ({copy.get('layout', '?')}), "
                    f"{'processed: ' + str(copy.get('processing')) if copy.get('processed') else 'unprocessed'}"
                )
            items.append((f"data {display_domain(domain)}", what))
        constants = Protocol.rows(proto)  # the settings two runs must share, as recorded
        if constants:
            items.append(("protocol", ", ".join(f"{k} {v}" for k, v in constants)))
        if proto.get("levels") is not None:
            items.append(("levels", f"{proto.get('levels')} (sha256 {proto.get('levels_sha256')})"))
        if proto.get("versions"):
            items.append(("versions", ", ".join(f"{k} {v}" for k, v in proto["versions"].items())))
        for run in results.runs(model):  # as Results.load read them
            config = run["config"] or {}
            items += [
                ("run folder", run["folder"]),
                ("config.json sha256 (checked by verify)", config.get("config_sha256", "none")),
                ("configuration hash", config.get("config_hash") or proto.get("config_hash")),
                ("records", f"{run['records']} cells, {run['checksummed']} with their own sha256"),
            ]
        body = (
            "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items if v is not None)
            or "<dt>recorded</dt><dd>nothing (no config.json)</dd>"
        )
        parts.append(
            f"<details open><summary><strong>{esc(model)}</strong></summary>"
            f'<dl class="prov">{body}</dl></details>'
        )
    parts.append("</section>")
    return "\n".join(parts)


def html_report(results, compare=None, shots="all", title=None, levels=None):
    """The report's HTML; see :meth:`Results.to_html`."""
    shots = normalize_shots(shots)
    mine = _mine(results)
    flagged = {m: v for m, v in not_comparable(results).items() if m in mine}
    if compare is not None:
        compare = list(compare)
        unknown = [m for m in compare if m not in results.models]
        if len(compare) != 2 or unknown:
            raise ValueError(f"compare takes two of the models {results.models}, got {compare!r}")
    title = title or f"ImageNet-CoG report: {', '.join(mine) or 'the paper'}"
    analyses = _analyses(results)
    protocols = protocols_section(results, mine, _svg, shots)
    made = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections = [
        f"<header><h1>{esc(title)}</h1>",
        (
            f'<p class="sub">Made by imagenet_cog {esc(__version__)} on {esc(made)}; one file, '
            "nothing fetched.</p>"
        ),
        "<nav>"
        + ('<a href="#verdict">verdict</a>' if mine else "")
        + ('<a href="#protocols">protocols</a>' if protocols else "")
        + '<a href="#figures">figures</a><a href="#tables">tables</a>'
        + ('<a href="#compare">comparison</a>' if compare else "")
        + ('<a href="#analyses">analyses</a>' if analyses else "")
        + '<a href="#concepts">concepts</a><a href="#provenance">provenance</a></nav></header>',
        _answer(results, mine, shots, flagged),
        _verdict(results, mine, flagged),
        protocols,
        _figures(results, mine, compare),
        _tables(results, mine, flagged, shots),
        _comparison(results, compare, shots),
        analyses,
        _explorer(results, mine, shots, levels),
        _provenance(results, mine),
        (
            "<footer>ImageNet-CoG: Sariyildiz, Kalantidis, Larlus and Alahari, <em>Concept "
            "Generalization in Visual Representation Learning</em>, ICCV 2021. The paper's numbers "
            "are its supplementary Tables 5-10.</footer>"
        ),
    ]
    return page(title, "\n".join(s for s in sections if s))
