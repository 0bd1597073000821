"""The names a reader reads: a run's default name, from its extraction (a checkpoint by its
architecture and file stem), two checkpoint files that would get one name told apart by their
weights' sha256, the runs gathered under one name by :meth:`Results.load
<imagenet_cog.Results.load>`, one model only when their configurations agree, and a name
as a figure draws it (:func:`figure_name`).

Stage "results", the wing of what a reader reads. The identity of a model is its weights'
sha256 in the provenance; its name is only a label.
"""

from __future__ import annotations

from .._comparability import protocol_differences
from .._models.spec import default_name
from .._provenance import RANDOM_WEIGHTS
from .._runfolder import RECORD_CHECKSUM, read_config, read_records, read_run, runs_file

__all__ = [
    "figure_name",
    "figure_text",
    "names_apart",
    "read_runs",
    "records_models",
    "renamed",
    "run_facts",
    "short_name",
    "tell_checkpoints_apart",
]

#: The longest name a figure draws whole; a longer one keeps its start and its end.
FIGURE_NAME_CHARS = 60


def short_name(name, limit=FIGURE_NAME_CHARS):
    """``name`` cut in the middle (``…``) past ``limit`` characters, its start and end kept.

    Examples
    --------
    >>> short_name("a" * 50 + "-checkpoint-" + "b" * 50, 30)
    'aaaaaaaaaaaaaaaaaaaa…bbbbbbbbb'
    """
    text = str(name)
    if len(text) <= limit:
        return text
    tail = (limit - 1) // 3
    return text[: limit - 1 - tail] + "…" + text[len(text) - tail :]


def figure_text(text):
    r"""``text`` for a matplotlib text, drawn as written: every ``$`` escaped (two would make
    it mathtext, drawn as a formula or refused by the parser), and a leading ``_`` kept in
    the legend (matplotlib leaves labels starting with ``_`` out) by a zero-width space.

    Examples
    --------
    >>> print(figure_text("$x^2$"))
    \$x^2\$
    >>> figure_text("_private")
    '\u200b_private'
    """
    text = str(text).replace("$", r"\$")
    return "\u200b" + text if text.startswith("_") else text


def figure_name(name):
    """A model or domain name as a figure draws it: :func:`short_name`, then
    :func:`figure_text`."""
    return figure_text(short_name(name))


def records_models(records, given=()):
    """The model names of cells and summary rows, in order of first appearance."""
    return list(dict.fromkeys([r["model"] for r in records] + [r["model"] for r in given]))


def _extraction(protocol):
    """The extraction record of a run's recorded protocol (the same for every domain), or
    ``{}``."""
    for info in ((protocol or {}).get("data") or {}).values():
        if isinstance(info, dict) and isinstance(info.get("extraction"), dict):
            return info["extraction"]
    return {}


def _default_named(name, protocol):
    """Whether ``name`` is the default name of the run's extraction, not one given to it."""
    ext = _extraction(protocol)
    if not ext.get("model"):
        return False
    weights = ext.get("weights")
    return name == default_name(ext["model"], weights, random=weights == RANDOM_WEIGHTS)


def _hashed(name, protocol):
    return f"{name}-{_extraction(protocol)['weights_sha256'][:8]}"


def names_apart(clash, mine, theirs):
    """``({old: new}, {old: new})``: the clashing default names of two results whose runs
    hold different weights, each with the first digits of its weights' sha256; None when
    some clash is not of that kind."""
    if not clash:
        return None
    renames = ({}, {})
    for name in clash:
        protocols = (mine.get(name), theirs.get(name))
        shas = [_extraction(p).get("weights_sha256") for p in protocols]
        if None in shas or shas[0] == shas[1]:
            return None
        if not all(_default_named(name, p) for p in protocols):
            return None
        for side, protocol in zip(renames, protocols):
            side[name] = _hashed(name, protocol)
    return renames


def tell_checkpoints_apart(runs):
    """Rename, in place, the cells of runs (``[(path, records, protocol, analysis)]``) whose
    default names clash while their weights differ: each gets its weights' first digits."""
    by_name = {}
    for _, records, protocol, _ in runs:
        for name in dict.fromkeys(r["model"] for r in records):
            by_name.setdefault(name, []).append((records, protocol))
    for name, found in by_name.items():
        shas = {_extraction(p).get("weights_sha256") for _, p in found}
        if len(shas) < 2 or None in shas:
            continue
        if not all(_default_named(name, p) for _, p in found):
            continue
        for records, protocol in found:
            for r in records:
                if r["model"] == name:
                    r["model"] = _hashed(name, protocol)


def renamed(results, names):
    """``results`` with models renamed (``{old: new}``), in their cells and meta."""
    if not names:
        return results

    def one(name):
        return names.get(name, name)

    meta = {}
    for key, value in results.meta.items():
        if isinstance(value, dict):
            value = {one(k): v for k, v in value.items()}
        elif isinstance(value, list):
            value = [one(x) if isinstance(x, str) else x for x in value]
        meta[key] = value
    return type(results)(
        [{**r, "model": one(r["model"])} for r in results.records],
        [{**r, "model": one(r["model"])} for r in results.summaries],
        meta,
    )


def read_runs(paths, model=None):
    """``(records, meta, facts)`` of run folders (or ``runs.jsonl`` files), as
    :meth:`Results.load <imagenet_cog.Results.load>` describes: each model's protocol and
    folders in ``meta``, and ``facts``, ``{folder: what Results.runs says of it}``, from what
    was read."""
    read = [(path, read_run(path, model=model)) for path in paths]
    runs = [(path, run, protocol, analysis) for path, (run, protocol, analysis, _) in read]
    if model is None:
        tell_checkpoints_apart(runs)
    records, meta, first = [], {"protocol": {}, "run_folders": {}}, {}
    for path, run, protocol, analysis in runs:
        records += run
        for name in dict.fromkeys(r["model"] for r in run):
            meta["run_folders"].setdefault(name, []).append(str(runs_file(path).parent))
            if name not in first:
                first[name] = path
                if protocol is not None:
                    meta["protocol"][name] = protocol
                continue
            kept = meta["protocol"].get(name)
            differ = protocol_differences(kept, protocol)
            if differ:
                raise ValueError(
                    f"{first[name]} and {path} both hold cells of model {name!r}, made with "
                    f"different configurations ({'; '.join(differ[:4])}); load them apart, "
                    "under other names (Results.load(path, model=...)), and merge those"
                )
            if protocol is not None and protocol.get("versions") != kept.get("versions"):
                meta["protocol"][name] = {
                    **kept,
                    "versions": _joined_versions(
                        kept.get("versions") or {}, protocol.get("versions") or {}
                    ),
                }
        if analysis is not None:
            names = {r["model"] for r in run}
            name = model or (names.pop() if len(names) == 1 else analysis.get("model"))
            meta.setdefault("analysis", {})[name or "model"] = analysis
    facts = {str(runs_file(path).parent): _facts(config, run) for path, (run, _, _, config) in read}
    return records, meta, facts


def run_facts(folder):
    """What :meth:`Results.runs <imagenet_cog.Results.runs>` says of a run folder, read from
    it: its ``config.json`` (None without one) and the count of its records."""
    return _facts(read_config(folder), [r for _, r in read_records(runs_file(folder))])


def _facts(config, records):
    return {
        "config": config,
        "records": len(records),
        "checksummed": sum(RECORD_CHECKSUM in r for r in records),
    }


def _joined_versions(a, b):
    """The versions of two runs of one configuration: ``"x and y"`` where they differ."""
    return {
        k: a.get(k) if a.get(k) == b.get(k) else f"{a.get(k)} and {b.get(k)}"
        for k in dict.fromkeys([*a, *b])
    }
