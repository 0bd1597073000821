"""The names a reader reads: a run's default name, from its extraction (a checkpoint by its
architecture and file stem), two checkpoint files that would get one name told apart by their
weights' sha256, a name the user gives a run folder, the runs gathered under one name by
:meth:`Results.load <imagenet_cog.Results.load>`, one model only when their configurations
agree, and a name as a figure draws it (:func:`figure_name`).

Stage "results", the wing of what a reader reads. The identity of a model is its weights'
sha256 in the provenance; its name is only a label. A name shown is never written into what a
checksum covers: a record shown under another name keeps the name it was written with beside
it (:func:`shown_as`), and its checksum is checked against the record as written.
"""

from __future__ import annotations

from pathlib import Path

from .._comparability import protocol_differences
from .._models.spec import default_name
from .._provenance import RANDOM_WEIGHTS
from .._runfolder import (
    RECORD_CHECKSUM,
    RECORDED_MODEL,
    read_config,
    read_records,
    read_run,
    runs_file,
)

__all__ = [
    "figure_name",
    "figure_text",
    "given_names",
    "names_apart",
    "read_runs",
    "records_models",
    "renamed",
    "run_facts",
    "short_name",
    "shown_as",
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


def shown_as(record, name):
    """``record`` shown under the model name ``name``: the name it was written with stays
    beside it (``model_as_recorded``), so its checksum, which covers the written name, still
    matches the record as written (``_runfolder.as_recorded``).

    Examples
    --------
    >>> shown = shown_as({"model": "resnet18-checkpoint", "top1": 70.0}, "run 1")
    >>> shown["model"], shown["model_as_recorded"]
    ('run 1', 'resnet18-checkpoint')
    >>> shown_as(shown, "resnet18-checkpoint")
    {'model': 'resnet18-checkpoint', 'top1': 70.0}
    """
    written = record.get(RECORDED_MODEL, record["model"])
    out = {k: v for k, v in record.items() if k != RECORDED_MODEL}
    out["model"] = name
    if name != written:
        out[RECORDED_MODEL] = written
    return out


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
            for i, r in enumerate(records):
                if r["model"] == name:
                    records[i] = shown_as(r, _hashed(name, protocol))


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
        [shown_as(r, one(r["model"])) for r in results.records],
        [{**r, "model": one(r["model"])} for r in results.summaries],
        meta,
    )


def _folder(path):
    """The run folder ``path`` names (a folder, or its ``runs.jsonl``), resolved; None when
    there is nothing at ``path``."""
    path = Path(path)
    if not path.exists():
        return None
    return (path if path.is_dir() else path.parent).resolve()


def given_names(paths, names):
    """``{index of a path: the name given to its folder}``, from ``names`` (``{folder or
    runs.jsonl: name}``); a name given to a folder that is not among ``paths`` is refused in
    one line."""
    folders = [_folder(p) for p in paths]
    found = {}
    for key, name in (names or {}).items():
        where = _folder(key)
        hits = [i for i, folder in enumerate(folders) if where is not None and folder == where]
        if not hits:
            raise ValueError(
                f"a name ({name!r}) is given to {key}, which is not one of the results loaded "
                f"({', '.join(map(str, paths))})"
            )
        found.update(dict.fromkeys(hits, name))
    return found


def read_runs(paths, model=None, names=None):
    """``(records, meta, facts)`` of run folders (or ``runs.jsonl`` files), as
    :meth:`Results.load <imagenet_cog.Results.load>` describes: each model's protocol and
    folders in ``meta``, and ``facts``, ``{folder: what Results.runs says of it}``, from what
    was read. ``names`` (``{folder: name}``) shows a folder's cells under the name given."""
    if model is not None and names:
        raise ValueError("give model= (one name for every path) or names=, not both")
    given = given_names(paths, names)
    read = [(path, read_run(path, model=model or given.get(i))) for i, path in enumerate(paths)]
    runs = [(path, run, protocol, analysis) for path, (run, protocol, analysis, _) in read]
    if model is None:  # the names given are the user's: only default names are told apart
        tell_checkpoints_apart([r for i, r in enumerate(runs) if i not in given])
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
                    f"different configurations ({'; '.join(differ[:4])}); give each a name of "
                    "its own (report --name FOLDER=NAME, Results.load(..., names={folder: "
                    "name}))"
                )
            if protocol is not None and protocol.get("versions") != kept.get("versions"):
                meta["protocol"][name] = {
                    **kept,
                    "versions": _joined_versions(
                        kept.get("versions") or {}, protocol.get("versions") or {}
                    ),
                }
        if analysis is not None:
            held = {r["model"] for r in run}
            name = model or (held.pop() if len(held) == 1 else analysis.get("model"))
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
