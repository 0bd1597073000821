"""The verdict on comparability as a reader takes it in: the most decisive reason first, a
reason repeated over domains said once, a model's name said once over its reasons.

Stage "results", the wing of what a reader reads. :mod:`imagenet_cog._comparability` finds
the deviations and caveats of each model; this writes them for the banner of the reports,
the footnote of the figures, the caveats under a report, and the LaTeX and HTML exports, all
in one order.
"""

from __future__ import annotations

import re
import textwrap

from .._comparability import COMPARABLE, NOT_COMPARABLE_MARK, comparability, not_comparable
from .._grid import Protocol, domain_key

__all__ = [
    "DECISIVE",
    "caveat_lines",
    "decisive_first",
    "decisive_rank",
    "not_comparable_banner",
    "plot_footnote",
    "summarize_reasons",
]

#: Words of a deviation, by how much it decides the numbers: the weights, the records'
#: integrity, the data (concepts and images), the extraction, the protocol's constants,
#: the seeds; anything else after them.
DECISIVE = (
    ("random-initialised", "randomly initialised", "nearly identical"),
    ("edited after", "another configuration", "different configurations"),
    ("concepts", "test images", "training images", "levels", "labels are not wnids"),
    ("extract", "preset", "amp=", "input of", "decoder"),
    ("l2-normalised", "protocol settings", "instead of", "mixed precision", "trials"),
    ("seed",),
)
# "IN-1K: ...", "L3: ...": a reason about one domain.
_DOMAIN_REASON = r"^(?P<domain>IN-1K|L\d+): (?P<rest>.+)$"
# A number as the reasons print them: 50000, 1,118,804, 0.912.
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# "epochs: 2 instead of 100": one of the protocol's constants.
_CONSTANT = r"^(?P<key>[a-z_]+|mixed precision): (?P<used>.+) instead of (?P<paper>.+)$"


def _constant_words():
    """What a deviation of the protocol's constants starts with: a setting's name or words."""
    names = Protocol.compared()
    return {*names, *map(Protocol.label, names)}


def decisive_rank(reason):
    """How much a deviation decides the numbers: 0 for the weights, then the records, the
    data, the extraction, the protocol's constants, the seeds; ``len(DECISIVE)`` for others."""
    text = str(reason)
    return next(
        (rank for rank, words in enumerate(DECISIVE) if any(w in text for w in words)),
        len(DECISIVE),
    )


def decisive_first(reasons):
    """``reasons`` ordered by how much each changes the numbers (:func:`decisive_rank`),
    otherwise in their given order.

    Examples
    --------
    >>> decisive_first(["epochs: 5 instead of 100", "random-initialised weights: 'x' names no "
    ...                 "weights", "L1: 3 concepts instead of the paper's 1000 (a subset)"])[0]
    "random-initialised weights: 'x' names no weights"
    """
    return sorted(reasons, key=decisive_rank)


def _domain_list(names):
    """``IN-1K, L1-L5``: domain names, a run of consecutive levels joined by a dash."""
    levels = sorted(int(n[1:]) for n in names if re.fullmatch(r"L\d+", n))
    others = [n for n in names if not re.fullmatch(r"L\d+", n)]
    runs, start = [], None
    for i, k in enumerate(levels):
        if start is None:
            start = k
        if i + 1 == len(levels) or levels[i + 1] != k + 1:
            runs.append(f"L{start}" if start == k else f"L{start}-L{k}")
            start = None
    return ", ".join(sorted(others, key=lambda n: domain_key(n.lower().replace("-", ""))) + runs)


def _span(values):
    """``3-4``: the numbers one placeholder took over a group of reasons, as printed."""
    numbers = sorted(set(values), key=lambda v: float(v.replace(",", "")))
    return numbers[0] if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}"


def summarize_reasons(reasons, domains=None):
    """The deviations (or caveats) of one model as a reader takes them in: the most decisive
    first (:func:`decisive_first`), a reason repeated over several domains said once for all
    of them, the protocol's constants on one line.

    A subset of concepts and of test images over the same domains becomes one line
    (``IN-1K, L1-L5: subsets of 3-4 concepts and 150 test images instead of the paper's 1,000
    and 50,000``); the same caveat of a copy on every level is said once.

    Parameters
    ----------
    reasons : list of str
    domains : list of str, optional
        Display names of the domains to speak of (a table's own): reasons about another
        domain are left out; reasons about no domain stay.

    Returns
    -------
    list of str

    Examples
    --------
    >>> for line in summarize_reasons(["epochs: 2 instead of 100", "L1: 3 concepts instead "
    ...     "of the paper's 1000 (a subset)", "L2: 4 concepts instead of the paper's 1000 (a "
    ...     "subset)", "n_trials: 3 instead of 30"]):
    ...     print(line)
    L1-L2: 3-4 concepts instead of the paper's 1000 (a subset)
    protocol constants: epochs 2 instead of 100, n_trials 3 instead of 30
    """
    groups, order, constants = {}, [], []
    for reason in decisive_first([str(r) for r in reasons]):
        found = re.match(_DOMAIN_REASON, reason)
        constant = re.match(_CONSTANT, reason)
        if found:
            if domains is not None and found["domain"] not in domains:
                continue  # another table's domain
            domain, rest = found["domain"], found["rest"]
        elif constant and constant["key"] in _constant_words():
            if not constants:
                order.append(None)
            constants.append(constant)
            continue
        else:
            domain, rest = None, reason
        key = (re.sub(_NUMBER, "#", rest), domain is None)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((domain, re.findall(_NUMBER, rest), rest))
    lines = []
    for key in order:
        if key is None:
            if len(constants) == 1:
                lines.append(constants[0][0])
            else:
                lines.append(
                    "protocol constants: "
                    + ", ".join(
                        f"{c['key']} {c['used']} instead of {c['paper']}" for c in constants
                    )
                )
            continue
        members = groups[key]
        if len(members) == 1:
            rest = members[0][2]
        else:  # each number as the span it takes over the group
            spans = [_span(column) for column in zip(*(n for _, n, _ in members))]
            rest = key[0]
            for span in spans:
                rest = rest.replace("#", span, 1)
        names = list(dict.fromkeys(d for d, _, _ in members if d is not None))
        lines.append(f"{_domain_list(names)}: {rest}" if names else rest)
    return _joined_subsets(lines)


def _joined_subsets(lines):
    """A concept subset and a test-image subset over the same domains, as one line."""
    concepts = r"^(.+): (\S+) concepts instead of the paper's (\S+) \(a subset\)$"
    images = r"^(.+): (\S+) test images instead of the paper's (\S+)$"
    for i, line in enumerate(lines):
        c = re.match(concepts, line)
        t = next(
            (m for m in (re.match(images, x) for x in lines) if m and c and m[1] == c[1]), None
        )
        if c and t:
            paper = [f"{int(x):,}" if x.isdigit() else x for x in (c[3], t[3])]
            lines[i] = (
                f"{c[1]}: subsets of {c[2]} concepts and {t[2]} test images instead of the "
                f"paper's {paper[0]} and {paper[1]}"
            )
            lines.remove(t[0])
            break
    return lines


def not_comparable_banner(results):
    """The banner naming each non-comparable model and why, or ``""`` when there is none.

    The reasons come most decisive first, a reason repeated over domains said once
    (:func:`summarize_reasons`); a model's name heads its reasons, said once.

    Examples
    --------
    >>> from imagenet_cog import Results
    >>> run = Results([{"model": "m", "domain": "L1", "shots": "all", "seed": 22, "top1": 60.0}])
    >>> print(not_comparable_banner(run).splitlines()[0])
    !!! NOT COMPARABLE with the paper: m !!!
    """
    found = not_comparable(results)
    if not found:
        return ""
    lines = [f"!!! NOT COMPARABLE with the paper: {', '.join(found)} !!!"]
    for model, reasons in found.items():
        if len(found) > 1:
            lines.append(f"  {model}:")
        lines += [f"  {'  ' * (len(found) > 1)}- {r}" for r in summarize_reasons(reasons)]
    lines.append("  Ranks of these models are shown in parentheses, for orientation only.")
    return "\n".join(lines)


def caveat_lines(results):
    """The caveats of the checked models, as a report prints them under its banner: each
    model named once over its caveats (its cells stay comparable), summarized as the banner's
    reasons are (:func:`summarize_reasons`), then what "comparable" means; ``[]`` when there
    is no caveat."""
    found = {
        m: v["caveats"] for m, v in comparability(results, by_model=True).items() if v["caveats"]
    }
    if not found:
        return []
    lines = ["Caveats (the cells shown stay comparable with the paper):"]
    for model, caveats in found.items():
        lines.append(f"  {model}:")
        lines += [f"    - {c}" for c in summarize_reasons(caveats)]
    return [*lines, "  " + COMPARABLE]


def plot_footnote(flagged, width=110, shown=2):
    """The footnote of a figure with non-comparable models (``{model: [deviations]}``), so a
    figure shared alone keeps the caveat: each model's ``shown`` most decisive reasons
    (:func:`summarize_reasons`), wrapped at ``width`` characters (None: one line); ``""``
    when there is none."""
    if not flagged:
        return ""
    parts = []
    for model, reasons in flagged.items():
        lines = summarize_reasons(reasons)
        more = f" (+{len(lines) - shown} more)" if len(lines) > shown else ""
        parts.append(f"{model}: " + "; ".join(lines[:shown]) + more)
    text = f"{NOT_COMPARABLE_MARK} " + " | ".join(parts)
    return text if width is None else "\n".join(textwrap.wrap(text, width))
