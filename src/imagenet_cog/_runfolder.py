"""The output folder of ``evaluate``: its file names, its run log and its saved predictions.

One place knows how a run folder is laid out, so the protocol that writes it, the results
and analysis that read it, and the command line only ask for what they need::

    out/
        .lock              the folder lock of the running ``evaluate`` (see ``_fileio``)
        config.json        the run's configuration, written once
        plan.json          the memory plan: which cells train together, and which process
                           (or part of the run) trains them (``_train.memplan``)
        runs.jsonl         one JSON line per finished cell, appended under a lock
        predictions/       <domain>__<shots>__<seed>.npz, with save_predictions
        levels/            a copy of the levels the run was made with (levels.tsv,
                           provenance.json) and checksums.json binding it to the run
        analysis.json      written by ``analyze``
        knn.jsonl          one JSON line per k-NN cell ``analyze`` computed (zeroshot.jsonl:
                           per zero-shot domain), bound by checksum (``_analysis/records.py``)

``config.json`` records the folder's format version (:data:`FORMAT_VERSION`), and so does
``analysis.json``; a folder or file of another version is refused, in one line saying to run
``evaluate`` (or ``analyze``) again into a new folder.

Every file a number rests on is bound to it by a checksum, which this format always writes,
so a missing one is itself a mismatch: ``config.json`` holds the sha256 of its other fields
and the configuration hash of its configuration (both recomputed when it is read); each
``runs.jsonl`` record the sha256 of all its fields and the configuration hash; a record
whose cell saved predictions the sha256 of that ``.npz`` file; ``analysis.json`` the sha256
of its other fields, of each prediction file it read and of the evaluations' records;
``levels/checksums.json`` the configuration hash, the levels' checksum (that of
``config.json``), the sha256 of each file of the copy of the levels and of itself: the
readers read the levels from that copy, never from a path ``config.json`` names elsewhere.

Imports only the base modules ``_fileio`` and ``_grid``; numpy only when predictions are
written or read.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path

from ._fileio import (
    LOCK_NAME,
    NullableShape,
    atomic_write_bytes,
    atomic_write_text,
    changed_settings,
    check_json_shape,
    file_sha256,
    loads_json,
    locked_append,
    locked_file,
    read_locked,
)
from ._grid import normalize_shots

__all__ = [
    "ANALYSIS",
    "ANALYSIS_CHECKSUM",
    "CONFIG",
    "FORMAT",
    "FORMAT_VERSION",
    "LEVELS_DIR",
    "LOCK_NAME",
    "PLAN",
    "PREDICTIONS_CHECKSUM",
    "PREDICTIONS_DIR",
    "RECORDED_MODEL",
    "RUNS",
    "UNHASHED",
    "RunLog",
    "analysis_path",
    "as_recorded",
    "concept_hits",
    "config_checksum",
    "find_predictions",
    "has_predictions",
    "hash_config",
    "keep_levels",
    "levels_copy_problems",
    "prediction_cells",
    "predictions_folder",
    "predictions_name",
    "protocol_record",
    "read_analysis",
    "read_config",
    "read_predictions",
    "read_records",
    "read_run",
    "record_checksum",
    "runs_file",
    "verify_run",
    "write_analysis",
    "write_predictions",
]

RUNS = "runs.jsonl"
CONFIG = "config.json"
ANALYSIS = "analysis.json"
#: Folder of the saved test predictions inside an ``evaluate`` output folder.
PREDICTIONS_DIR = "predictions"
_PREDICTIONS_GLOB = "*__*__*.npz"
#: The format of a run folder and of ``analysis.json``, and its version: the one this
#: version of the library writes and reads (a folder without one is of version 1).
FORMAT = "imagenet_cog.run"
FORMAT_VERSION = 3
_ANALYSIS_FORMAT = "imagenet_cog.analysis"
#: config.json keys that do not make another configuration: a resumed run may differ there
#: (the format version is checked before anything is compared).
UNHASHED = (
    "library_version",
    "versions",
    "config_hash",
    "config_sha256",
    "format",
    "format_version",
)
#: The key of config.json that holds the checksum of the rest of the file.
CONFIG_CHECKSUM = "config_sha256"
#: The key of a runs.jsonl record that holds the checksum of the rest of the record.
RECORD_CHECKSUM = "record_sha256"
#: The key of a runs.jsonl record that holds the sha256 of its cell's predictions file.
PREDICTIONS_CHECKSUM = "predictions_sha256"
#: The key of analysis.json that holds the checksum of the rest of the file.
ANALYSIS_CHECKSUM = "analysis_sha256"
#: The key a record renamed by ``Results.load(model=...)`` keeps its recorded name under.
RECORDED_MODEL = "model_as_recorded"
#: Folder of a run folder holding a copy of the levels the run was made with.
LEVELS_DIR = "levels"
#: The file of :data:`LEVELS_DIR` that binds the copy to the run, and its own checksum's key.
LEVELS_CHECKSUMS, _LEVELS_CHECKSUM = "checksums.json", "checksums_sha256"
_LEVELS_FILES = ("levels.tsv", "provenance.json")
_LEVELS_FORMAT = "imagenet_cog.levels_copy"


def hash_config(config):
    """The configuration hash of a run: the first 12 hex digits of the sha256 of its
    ``config.json`` without the :data:`UNHASHED` keys. Every record of the run carries it.

    The configuration is hashed as JSON reads it back (tuples as lists, keys as strings), so
    the hash of the file read from disk is the hash of the configuration that wrote it.
    """
    import hashlib

    kept = json.loads(json.dumps({k: v for k, v in config.items() if k not in UNHASHED}))
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


def _content_sha256(payload, skip):
    """sha256 of ``payload`` as canonical JSON (sorted keys), without the keys in ``skip``."""
    import hashlib

    kept = {k: v for k, v in payload.items() if k not in skip}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def config_checksum(config):
    """The checksum ``config.json`` holds of itself (:data:`CONFIG_CHECKSUM`): the sha256 of
    every other field, as canonical JSON."""
    return _content_sha256(config, (CONFIG_CHECKSUM,))


def record_checksum(record):
    """The checksum a ``runs.jsonl`` record holds of itself (:data:`RECORD_CHECKSUM`): the
    sha256 of every other field, ``model`` included, as canonical JSON. An accuracy edited by
    hand, or a run relabelled as another model, no longer matches it."""
    return _content_sha256(record, (RECORD_CHECKSUM,))


def as_recorded(record):
    """A record as its file holds it: a record that ``Results.load(model=...)`` renamed
    keeps its recorded name in :data:`RECORDED_MODEL`, which only the reader sets (a file
    holding that key fails its checksum, which covers every field it holds)."""
    if RECORDED_MODEL not in record:
        return record
    out = {k: v for k, v in record.items() if k != RECORDED_MODEL}
    out["model"] = record[RECORDED_MODEL]
    return out


def protocol_record(config):
    """What a ``config.json`` tells of how the numbers were made: the protocol constants, with
    the levels (name and checksum), the data of each domain and the versions."""
    protocol = {**config.get("protocol", {}), "levels": config.get("levels")}
    for key in ("levels_sha256", "data", "versions", "config_hash"):
        if key in config:
            protocol[key] = config[key]
    return protocol


def _check_format(obj, path, fmt, redo):
    """Raise ``ValueError`` in one line when the JSON object read from ``path`` is not of this
    :data:`FORMAT_VERSION` (an object without a version is of version 1)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: not a JSON object")  # noqa: TRY004 - bad file content
    found = obj.get("format_version", 1) if obj.get("format", fmt) == fmt else None
    if found != FORMAT_VERSION:
        what = f"format version {found!r}" if found is not None else repr(obj.get("format"))
        raise ValueError(
            f"{path}: written in {what}, and this version of imagenet_cog reads format version "
            f"{FORMAT_VERSION} only; {redo}"
        )


# ------------------------------------------------------------------ reading
def runs_file(path):
    """The ``runs.jsonl`` of a run folder, or ``path`` itself when it is a file."""
    path = Path(path)
    return path / RUNS if path.is_dir() else path


_TEXT, _COUNT, _OBJECT = (str, type(None)), (int, type(None)), (dict, type(None))
#: The types of the fields of ``config.json`` that its readers use (any other is not read).
CONFIG_SHAPE = {
    "model": _TEXT,
    "levels": _TEXT,
    "levels_sha256": _TEXT,
    "config_hash": _TEXT,
    "protocol": (dict,),
    "versions": NullableShape({"*": _TEXT}),
    "features": _OBJECT,
    "data": NullableShape(
        {
            "*": {
                "n_classes": _COUNT,
                "n_test": _COUNT,
                "n_train": _COUNT,
                "classes_sha256": _TEXT,
                "test_ids_sha256": _TEXT,
                "train_ids_sha256": _TEXT,
                "wnid_labels": (bool, type(None)),
                "uncapped": (bool, type(None)),
                "skipped": NullableShape({"*": _COUNT}),
                "feature_check": _OBJECT,
                "split": NullableShape(
                    {
                        "copy": NullableShape(
                            {
                                "name": _TEXT,
                                "layout": _TEXT,
                                "processing": _TEXT,
                                "seen": _TEXT,
                                "processed": (bool, type(None)),
                                "samples": _COUNT,
                                "resized": _COUNT,
                                "formats": NullableShape({"*": _COUNT}),
                            }
                        )
                    }
                ),
                "extraction": NullableShape(
                    {
                        "model": _TEXT,
                        "weights": _TEXT,
                        "weights_sha256": _TEXT,
                        "preprocessing": _OBJECT,
                        "differs_from_preset": NullableShape({"*": (dict,)}),
                    }
                ),
            }
        }
    ),
}


def read_config(folder):
    """The folder's ``config.json`` as a dict, or None when there is none.

    Raises
    ------
    ValueError
        Naming the file, when it is not JSON.
    """
    path = Path(folder) / CONFIG
    if not path.is_file():
        return None
    try:
        config = loads_json(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON file ({exc})") from None
    _check_format(
        config, path, FORMAT, "run evaluate again into a new out folder to get results it reads"
    )
    check_json_shape(config, CONFIG_SHAPE, path, "evaluate never writes that: rerun evaluate")
    return config


def write_analysis(path, payload, predictions=None, stores=None, records=None):
    """Write ``analyze``'s ``payload`` (a JSON-safe dict) to ``path`` atomically, with the
    format version, the sha256 of each prediction file it read (``predictions``: ``{path:
    sha256}``, stored relative to ``path``'s folder where they lie under it), that of each
    feature store's manifest it read (``stores``, likewise; a manifest holds the sha256 of
    each of its shards), that of each evaluation's records (``records``: ``knn.jsonl``,
    ``zeroshot.jsonl``) and the sha256 of the whole; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = {"format": _ANALYSIS_FORMAT, "format_version": FORMAT_VERSION, **payload}
    obj["inputs"] = {
        "predictions": {_relative(f, path.parent): d for f, d in (predictions or {}).items()}
    }
    if stores:
        obj["inputs"]["stores"] = {_relative(f, path.parent): d for f, d in stores.items()}
    if records:
        obj["inputs"]["records"] = {_relative(f, path.parent): d for f, d in records.items()}
    obj = json.loads(json.dumps(obj, allow_nan=False))  # hashed as it is read back
    obj[ANALYSIS_CHECKSUM] = _content_sha256(obj, (ANALYSIS_CHECKSUM,))
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")
    return path


def _relative(file, folder):
    file, folder = Path(file).resolve(), Path(folder).resolve()
    return file.relative_to(folder).as_posix() if file.is_relative_to(folder) else str(file)


def _analysis_problems(path, obj):
    """``(problems, unchecked)``: lines naming what in an ``analysis.json`` does not match
    what made it (its own contents, each prediction file and each feature store it was
    computed from), and the stores it names that are not where it recorded them (moved, or
    on another machine: a results folder taken without its stores stays readable)."""
    stored = obj.get(ANALYSIS_CHECKSUM)
    if stored is None:
        return [
            f"{path} carries no checksum {ANALYSIS_CHECKSUM}, which this format always writes"
        ], []
    if stored != _content_sha256(obj, (ANALYSIS_CHECKSUM,)):
        return [
            f"{path} was edited after analyze wrote it (its contents do not match its checksum)"
        ], []
    problems, unchecked = [], []
    inputs = obj.get("inputs") if isinstance(obj.get("inputs"), dict) else {}
    for name, digest in {
        **(inputs.get("predictions") or {}),
        **(inputs.get("records") or {}),
    }.items():
        file = path.parent / name
        if not _within(path.parent, file):  # a received file can name any file of the reader's
            problems.append(f"{path} names {name!r}, outside its folder: not read")
        elif not file.is_file():
            problems.append(f"{path}: {name}, which it was computed from, is missing")
        elif file_sha256(file) != digest:
            problems.append(
                f"{path} was computed from another {name} than the folder holds now (its "
                "sha256 differs): run analyze again"
            )
    for name, digest in (inputs.get("stores") or {}).items():
        file = path.parent / name
        if not file.is_file():
            unchecked.append(
                f"{file}, which {path.name} was computed from, is not there: not checked"
            )
        elif file_sha256(file) != digest:
            problems.append(
                f"{path} was computed from the features of another store than {file.parent} "
                "holds now (its manifest's sha256 differs): run analyze again"
            )
    return problems, unchecked


def _within(folder, file):
    """Whether ``file`` (links followed) lies inside ``folder``."""
    try:
        return Path(file).resolve().is_relative_to(Path(folder).resolve())
    except (OSError, ValueError):  # a name no file system takes
        return False


def read_analysis(path):
    """The payload of the ``analysis.json`` at ``path``, its format version and its checksums
    (of itself and of the prediction files it was computed from) checked.

    Raises
    ------
    ValueError
        Naming the file, when it is not JSON, of another format version, or does not match
        its checksums.
    """
    path = Path(path)
    try:
        obj = loads_json(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON file ({exc})") from None
    _check_format(obj, path, _ANALYSIS_FORMAT, "run analyze again to write one it reads")
    problems = _analysis_problems(path, obj)[0]
    if problems:
        raise ValueError(f"{problems[0]}; its numbers cannot be trusted: run analyze again")
    skip = ("format", "format_version", ANALYSIS_CHECKSUM, "inputs")
    return {k: v for k, v in obj.items() if k not in skip}


def read_records(file, hint=""):
    """``[(line number, record)]`` of a ``runs.jsonl``; a garbled line is named by file and line.

    ``hint`` is added to the error of a line that is not JSON. No file: no records.
    """
    file = Path(file)
    if not file.is_file():
        return []
    records = []
    # Read under the appends' lock: another process (a part of the run) may be appending.
    text = read_locked(file).decode("utf-8")
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = loads_json(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file}:{n}: not a JSON line ({exc}){hint}") from None
        if not isinstance(rec, dict):
            # Bad file content, not a bad argument: ValueError.
            raise ValueError(f"{file}:{n}: not a result record (a JSON object)")  # noqa: TRY004
        records.append((n, rec))
    return records


def read_run(path, model=None):
    """``(records, protocol, analysis, config)`` of a run folder or a ``runs.jsonl`` file.

    Each record gets a ``"model"`` (``model`` when given, else its own, else the folder's
    name). ``protocol`` is what ``config.json`` records of the protocol (None without one);
    ``analysis`` is the ``analysis.json`` payload beside it (None without one); ``config`` is
    the ``config.json`` itself (None without one).

    Raises
    ------
    FileNotFoundError
        When there is no ``runs.jsonl``.
    ValueError
        A garbled line (file and line named), or a file mixing configurations.
    """
    path = Path(path)
    file = runs_file(path)
    if not file.is_file():
        raise FileNotFoundError(f"no results at {path} (expected a {RUNS})")
    records, hashes = [], {}
    for n, rec in read_records(file):
        if "config_hash" in rec:
            hashes.setdefault(rec["config_hash"], n)
        if model is not None:
            if "model" in rec and rec["model"] != model:
                rec[RECORDED_MODEL] = rec["model"]  # its checksum stays checkable
            rec["model"] = model
        rec.setdefault("model", path.name if path.is_dir() else path.parent.name)
        records.append(rec)
    if len(hashes) > 1:
        # Two configurations in one file (runs that raced on one folder): their
        # means would silently average different protocols.
        raise ValueError(
            f"{file} mixes results of {len(hashes)} configurations (config_hash "
            + ", ".join(f"{h} from line {n}" for h, n in hashes.items())
            + "); keep the lines of one and rerun the others into another folder"
        )
    problems = verify_run(file, predictions=False)["problems"]
    if problems:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ValueError(
            f"{file.parent} does not match what made it: {'; '.join(problems[:3])}{more} "
            f"(imagenet-cog verify {file.parent} lists every mismatch); its numbers cannot be "
            "trusted: rerun it, or restore the files the run wrote"
        )
    protocol = None
    conf = read_config(file.parent)
    if conf is not None:
        protocol = protocol_record(conf)
    analysis = None
    if (file.parent / ANALYSIS).is_file():
        analysis = read_analysis(file.parent / ANALYSIS)
    return records, protocol, analysis, conf


def verify_run(path, predictions=True):
    """Check a run folder against itself: ``config.json`` against its own checksum and its
    configuration hash against its configuration; each ``runs.jsonl`` record against that
    hash and against its own checksum; with ``predictions``, each saved predictions file
    against the checksum its record holds, ``analysis.json`` against its own and its
    prediction files', and the copy of the levels in :data:`LEVELS_DIR` against its checksums,
    the run and the levels ``config.json`` records (:func:`levels_copy_problems`).

    What it detects: records made by another configuration (a ``runs.jsonl`` copied from
    another run's folder, lines of two runs joined), a ``config.json`` edited after the run
    wrote it, a record edited by hand (an accuracy, a seed, the model's name), a checksum
    removed (this format always writes them), a predictions file edited or cut short, an
    ``analysis.json`` edited or computed from other predictions or from feature stores that
    have changed since (a store that is not where it was is listed as unchecked), a copy of
    the levels edited or leading out of the folder (a folder without a copy of levels other
    than the official ones is listed as unchecked). What it cannot: an edit that recomputes
    the checksums (they are not signatures).

    Parameters
    ----------
    path : path
        An ``evaluate`` output folder, or its ``runs.jsonl``.
    predictions : bool
        Also read every predictions file, ``analysis.json`` and the copy of the levels
        (``Results.load`` reads none, and leaves them to their own readers).

    Returns
    -------
    dict
        ``problems``: one line per mismatch, naming the file (and line); ``unchecked``: one
        line per file that cannot be checked (no ``config.json``, and then records without a
        checksum, since nothing names the format they were written in; a predictions file
        that no record names, or one that a record names and that is gone); ``records``: how
        many records were read.
    """
    file = runs_file(path)
    folder = file.parent
    conf_path = folder / CONFIG
    config = read_config(folder)
    problems, unchecked = [], []
    bound = None
    if config is None:
        unchecked.append(f"no {CONFIG} beside {file}: its records are bound to no configuration")
    else:
        problems += _config_problems(conf_path, config)
        bound = config.get("config_hash")
    records = read_records(file)
    bare = 0
    for n, rec in records:
        where = f"{file}:{n}"
        made_by = rec.get("config_hash")
        if bound is not None and made_by != bound:
            problems.append(
                f"{where}: made by another configuration (config_hash {made_by}, {CONFIG} has "
                f"{bound})"
            )
        stored = rec.get(RECORD_CHECKSUM)
        if stored is None and config is None:  # no config.json names the format it was written in
            bare += 1
        elif stored is None:
            problems.append(
                f"{where}: carries no checksum {RECORD_CHECKSUM}, which this format always "
                "writes (removed by hand?)"
            )
        elif stored != record_checksum(rec):
            problems.append(
                f"{where}: edited after it was written (its contents do not match its checksum "
                f"{RECORD_CHECKSUM})"
            )
    if bare:
        unchecked.append(f"{bare} of the {len(records)} records of {file} carry no checksum")
    if predictions:
        found, named = _prediction_problems(folder, records)
        problems += found
        unchecked += named
        if (folder / ANALYSIS).is_file():
            try:
                obj = loads_json((folder / ANALYSIS).read_text(encoding="utf-8"))
                _check_format(obj, folder / ANALYSIS, _ANALYSIS_FORMAT, "run analyze again")
            except (ValueError, UnicodeDecodeError) as exc:
                problems.append(str(exc))
            else:
                found, missing = _analysis_problems(folder / ANALYSIS, obj)
                problems += found
                unchecked += missing
        copied = levels_copy_problems(folder, config) if config is not None else []
        if copied is None and config.get("levels") not in (None, "official"):
            unchecked.append(
                f"no copy of the levels {config.get('levels')!r} in {folder / LEVELS_DIR} (a run "
                "of an earlier version, or made when they were no longer where its stores name "
                "them): report --html and analyze --concepts need them given with --levels"
            )
        problems += copied or []
    return {"problems": problems, "unchecked": unchecked, "records": len(records)}


def _config_problems(conf_path, config):
    """Mismatches of a ``config.json`` with itself: its checksum and its configuration hash,
    both recomputed."""
    problems = []
    stored = config.get(CONFIG_CHECKSUM)
    if stored is None:
        problems.append(
            f"{conf_path} carries no checksum {CONFIG_CHECKSUM}, which this format always "
            "writes (removed by hand?)"
        )
    elif stored != config_checksum(config):
        problems.append(
            f"{conf_path} was edited after the run wrote it (its contents do not match its "
            f"checksum {CONFIG_CHECKSUM})"
        )
    bound = config.get("config_hash")
    if bound is None:
        problems.append(f"{conf_path} holds no config_hash, which this format always writes")
    elif bound != hash_config(config):
        problems.append(
            f"{conf_path}: its config_hash {bound} is not the hash of its configuration "
            f"({hash_config(config)})"
        )
    return problems


def _prediction_problems(folder, records):
    """``(problems, unchecked)`` of the predictions files of a run folder: each against the
    checksum of the record that names it."""
    problems, unchecked, named = [], [], set()
    for n, rec in records:
        name = rec.get("predictions")
        if not isinstance(name, str):
            continue
        named.add(name)
        file = folder / name
        digest = rec.get(PREDICTIONS_CHECKSUM)
        if not file.is_file():
            unchecked.append(f"{file}, which {RUNS}:{n} names, is missing")
        elif digest is None:
            problems.append(
                f"{RUNS}:{n} names {name} but carries no {PREDICTIONS_CHECKSUM}, which this "
                "format always writes"
            )
        elif file_sha256(file) != digest:
            problems.append(
                f"{file} was changed after the run wrote it (its sha256 is not the one "
                f"{RUNS}:{n} holds)"
            )
    for file in sorted((folder / PREDICTIONS_DIR).glob(_PREDICTIONS_GLOB)):
        if f"{PREDICTIONS_DIR}/{file.name}" not in named:
            unchecked.append(f"{file} is named by no record (a cell that did not finish)")
    return problems, unchecked


#: The memory plan of a run (written by ``_train.memplan``): its units, each with its cells and
#: the rank (of how many processes, or parts of the run) that trains it.
PLAN = "plan.json"


def analysis_path(folder):
    """Where ``analyze`` writes its report in ``folder``."""
    return Path(folder) / ANALYSIS


# ------------------------------------------------------- the copy of the levels
def keep_levels(folder, levels, config):
    """Write a copy of ``levels`` (the :class:`~imagenet_cog.Levels` ``config`` records) into
    the run folder's :data:`LEVELS_DIR`, each file atomically, then (last) the checksums that
    bind it to the run: its configuration hash, the levels' checksum, each file's sha256."""
    where = Path(folder) / LEVELS_DIR
    levels.save(where)
    obj = {"format": _LEVELS_FORMAT, "format_version": FORMAT_VERSION}
    obj |= {"config_hash": config.get("config_hash"), "levels_sha256": levels.checksum}
    obj["files"] = {name: file_sha256(where / name) for name in _LEVELS_FILES}
    obj[_LEVELS_CHECKSUM] = _content_sha256(obj, (_LEVELS_CHECKSUM,))
    atomic_write_text(where / LEVELS_CHECKSUMS, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def levels_copy_problems(folder, config):
    """Lines naming what in a run folder's copy of its levels does not match the run (see
    :func:`keep_levels`), ``[]`` when all does, None when the folder holds none (a folder of
    an earlier version). Nothing outside ``folder`` is read; no line of the copy is quoted.

    Examples
    --------
    >>> import tempfile
    >>> levels_copy_problems(tempfile.mkdtemp(), {}) is None
    True
    """
    where = Path(folder) / LEVELS_DIR
    manifest = where / LEVELS_CHECKSUMS
    if not (where.is_dir() or where.is_symlink()):
        return None
    if not _within(folder, where):
        return [f"{where} lies outside the run's folder (a link): not read"]
    if not manifest.is_file():
        return None
    if not _within(folder, manifest):
        return [f"{manifest} lies outside the run's folder (a link): not read"]
    try:
        obj = loads_json(manifest.read_text(encoding="utf-8"))
        _check_format(obj, manifest, _LEVELS_FORMAT, "run evaluate again to write it")
    except (ValueError, UnicodeDecodeError) as exc:
        return [" ".join(str(exc).split())]
    recorded = {k: config.get(k) for k in ("config_hash", "levels_sha256")}
    if obj.get(_LEVELS_CHECKSUM) != _content_sha256(obj, (_LEVELS_CHECKSUM,)):
        return [f"{manifest} was edited after evaluate wrote it (it does not match its checksum)"]
    if any(obj.get(k) != v for k, v in recorded.items()):
        return [f"{where} holds other levels, or those of another run, than its {CONFIG} records"]
    digests, problems = obj.get("files") if isinstance(obj.get("files"), dict) else {}, []
    for file in (where / name for name in _LEVELS_FILES):
        if not _within(folder, file) or not file.is_file():
            problems.append(f"{file} is missing (or a link out of the run's folder: not read)")
        elif file_sha256(file) != digests.get(file.name):
            problems.append(
                f"{file} was changed after evaluate wrote it (its sha256 is not the one "
                f"{LEVELS_DIR}/{LEVELS_CHECKSUMS} holds)"
            )
    return problems


# ------------------------------------------------------------------ run log
class RunLog:
    """``out/runs.jsonl`` plus ``out/config.json``: append-only and resumable.

    The caller holds the folder's :class:`~imagenet_cog._fileio.FolderLock` for the life of
    the run, so no other process appends or writes a config meanwhile. A config that
    differs in anything but :data:`UNHASHED` is refused, naming each field that differs; a
    folder of another format version is refused (:func:`read_config`); a partial last line
    left by a killed writer is dropped with a warning. ``levels`` (a
    :class:`~imagenet_cog.Levels`, those ``config`` records): a copy is kept in the folder
    (:func:`keep_levels`), written again on a resume where it does not match.
    """

    def __init__(self, out, config, resume, levels=None):
        self.dir = Path(out)
        self.path = self.dir / RUNS
        self.dir.mkdir(parents=True, exist_ok=True)
        old = read_config(self.dir)
        if old is not None:
            if not resume:
                raise ValueError(
                    f"{self.dir} already holds a run; pass resume=True to continue it, or use "
                    "another out folder"
                )
            stored = old.get(CONFIG_CHECKSUM)
            if stored is not None and stored != config_checksum(old):
                raise ValueError(
                    f"{self.dir / CONFIG} was edited after the run wrote it (its contents do not "
                    f"match its checksum {CONFIG_CHECKSUM}); refusing to resume a run whose "
                    "configuration is not the one its records were made with: use another out "
                    "folder"
                )
            diff = changed_settings(old, config, ignore=UNHASHED)
            if diff:
                more = f"; and {len(diff) - 6} more" if len(diff) > 6 else ""
                raise ValueError(
                    f"{self.dir} holds results of a different configuration "
                    f"({'; '.join(diff[:6])}{more}); refusing to mix them: use another out "
                    "folder, or the settings it was made with to resume it"
                )
            before, now = old.get("versions") or {}, config.get("versions") or {}
            changed = {k: (before.get(k), v) for k, v in now.items() if before.get(k) != v}
            if before and changed:
                warnings.warn(
                    f"{self.dir}: resuming with other versions than the run started with ("
                    + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
                    + f"); {CONFIG} keeps the first ones, and each record of {RUNS} the ones "
                    "that made it",
                    UserWarning,
                    stacklevel=3,
                )
            #: The hash the folder's records carry.
            self.config_hash = old["config_hash"]
            self.config = {**config, **{k: old[k] for k in UNHASHED if k in old}}
        else:
            self.config_hash = hash_config(config)  # as JSON reads it back: recomputable
            self.config = {
                **config,
                "config_hash": self.config_hash,
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
            }
            self._write_config()
        self._repair()
        problems = verify_run(self.dir, predictions=False)["problems"]
        if problems:
            more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
            raise ValueError(
                f"{self.dir} holds records that do not match its {CONFIG}: "
                f"{'; '.join(problems[:3])}{more}; refusing to resume them as this run's (imagenet-cog "
                f"verify {self.dir} lists every mismatch): use another out folder"
            )
        if levels is not None and levels_copy_problems(self.dir, self.config) != []:
            keep_levels(self.dir, levels, self.config)

    def _write_config(self):
        config = {k: v for k, v in self.config.items() if k != CONFIG_CHECKSUM}
        self.config = {**config, CONFIG_CHECKSUM: config_checksum(config)}
        text = json.dumps(self.config, indent=2, sort_keys=True) + "\n"
        atomic_write_text(self.dir / CONFIG, text)

    def _repair(self):
        """Drop a partial last line left by a killed writer.

        Under the lock the appends take, in place: another process appending to the same log
        (a part of the run) is never half-way through a line then, and keeps appending to
        the same file.
        """
        if not self.path.is_file():
            return
        with locked_file(self.path) as fd:
            raw = os.pread(fd, os.fstat(fd).st_size, 0)
            if raw and not raw.endswith(b"\n"):
                warnings.warn(
                    f"{self.path}: dropping an unfinished last line left by an interrupted run",
                    RuntimeWarning,
                    stacklevel=3,
                )
                os.ftruncate(fd, raw.rfind(b"\n") + 1)
                os.fsync(fd)

    def records(self):
        hint = "; remove or repair that line (its cell then runs again)"
        return [rec for _, rec in read_records(self.path, hint=hint)]

    def done(self):
        """``{(domain, shots, seed)}`` of the cells already in the log."""
        return {(r["domain"], normalize_shots(r["shots"]), int(r["seed"])) for r in self.records()}

    def append(self, record):
        """Append one record, with its checksum, in a single write under an exclusive lock."""
        record = {k: v for k, v in record.items() if k != RECORD_CHECKSUM}
        record[RECORD_CHECKSUM] = record_checksum(record)
        locked_append(self.path, json.dumps(record, sort_keys=True) + "\n")

    def predictions_dir(self):
        return self.dir / PREDICTIONS_DIR


# -------------------------------------------------------------- predictions
def predictions_name(domain, shots, seed):
    """File name of one cell's saved test predictions: ``<domain>__<shots>__<seed>.npz``."""
    return f"{domain}__{shots}__{int(seed)}.npz"


def write_predictions(folder, domain, shots, seed, **arrays):
    """Write one cell's prediction arrays atomically; returns the fields its record takes:
    ``predictions`` (the path relative to the run folder) and :data:`PREDICTIONS_CHECKSUM`.

    ``numpy.savez`` into memory, then one atomic write: a reader never sees half a file.
    """
    import hashlib

    import numpy as np

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = predictions_name(domain, shots, seed)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    atomic_write_bytes(folder / name, data)
    return {
        "predictions": f"{PREDICTIONS_DIR}/{name}",
        PREDICTIONS_CHECKSUM: hashlib.sha256(data).hexdigest(),
    }


def read_predictions(file, keys=("y_true", "y_pred", "top5", "classes")):
    """The arrays of one saved predictions file, checked against the record that names it.

    In a run folder (``<out>/predictions/`` beside ``<out>/runs.jsonl``) the file must be
    the one its record's :data:`PREDICTIONS_CHECKSUM` names: a file edited, cut short or
    that no record names (a cell that did not finish) is refused. A folder of ``.npz``
    files alone is read as it is. Nothing is unpickled.

    Returns
    -------
    dict
        ``{key: ndarray}`` for ``keys``, and ``sha256`` (of the file).

    Raises
    ------
    ValueError
        In one line naming the file: it does not match its record, or it is not a
        readable ``.npz`` holding ``keys``.
    """
    import hashlib
    import zipfile

    import numpy as np

    file = Path(file)
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    run = file.parent.parent
    if file.parent.name == PREDICTIONS_DIR and (run / RUNS).is_file():
        name = f"{PREDICTIONS_DIR}/{file.name}"
        named = [(n, r) for n, r in read_records(run / RUNS) if r.get("predictions") == name]
        if not named:
            raise ValueError(
                f"{file}: no record of {run / RUNS} names it (a cell that did not finish, or "
                "a file put there by hand): not read"
            )
        n, rec = named[-1]
        if rec.get(PREDICTIONS_CHECKSUM) != digest:
            raise ValueError(
                f"{file} was changed after the run wrote it (its sha256 is not the one "
                f"{RUNS}:{n} holds): its predictions cannot be trusted; rerun the cell"
            )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            out = {k: z[k] for k in keys}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(
            f"{file}: not a readable predictions file ({why}); cut short, or not written by "
            "evaluate: rerun the cell"
        ) from None
    return out | {"sha256": digest}


def has_predictions(folder):
    """Whether ``folder`` is a run folder holding saved predictions."""
    return (Path(folder) / PREDICTIONS_DIR).is_dir()


def predictions_folder(path):
    """The ``predictions/`` folder of an evaluate output folder, or the folder itself."""
    path = Path(path)
    if has_predictions(path):
        return path / PREDICTIONS_DIR
    if path.is_dir() and any(path.glob(_PREDICTIONS_GLOB)):
        return path
    raise FileNotFoundError(
        f"no saved predictions in {path}: expected {path / PREDICTIONS_DIR}/ with "
        "<domain>__<shots>__<seed>.npz files (run evaluate with save_predictions=True, or "
        "imagenet-cog evaluate --save-predictions)"
    )


def prediction_cells(folder):
    """``{(domain, shots, seed): path}`` of the prediction files in ``folder``; in a run
    folder, only those a record names (see :func:`imagenet_cog._reporting.cells.unfinished_cells`
    for the others)."""
    cells = _all_prediction_cells(folder)
    named = _named_predictions(folder)
    return cells if named is None else {k: f for k, f in cells.items() if f.name in named}


def _all_prediction_cells(folder):
    cells = {}
    for f in sorted(Path(folder).glob(_PREDICTIONS_GLOB)):
        parts = f.stem.rsplit("__", 2)
        try:
            cells[(parts[0], normalize_shots(parts[1]), int(parts[2]))] = f
        except ValueError:  # not a file of ours
            continue
    return cells


def _named_predictions(folder):
    """The file names of ``folder`` the records of its run folder name; None for a folder
    of predictions alone."""
    folder = Path(folder)
    run = folder.parent / RUNS
    if folder.name != PREDICTIONS_DIR or not run.is_file():
        return None
    prefix = f"{PREDICTIONS_DIR}/"
    named = (str(r.get("predictions", "")) for _, r in read_records(run))
    return {n[len(prefix) :] for n in named if n.startswith(prefix)}


def concept_hits(path):
    """``(concepts, hits, counts)`` of one saved prediction file: the sorted true concepts,
    the test images of each predicted right, and its test images."""
    import numpy as np

    found = read_predictions(path, keys=("y_true", "y_pred"))  # checked, one line
    y_true, y_pred = found["y_true"], found["y_pred"]
    concepts, idx = np.unique(y_true, return_inverse=True)
    hits = np.bincount(idx, weights=(y_true == y_pred), minlength=len(concepts))
    return concepts, hits, np.bincount(idx, minlength=len(concepts))


def find_predictions(path, domain, shots="all", seed=None):
    """``(file, seed)`` of one cell's saved predictions; the lowest seed by default.

    Raises
    ------
    FileNotFoundError
        Naming the cell and what the folder has instead.
    """
    folder = predictions_folder(path)
    shots = normalize_shots(shots)
    cells = prediction_cells(folder)
    found = sorted(s for (d, n, s) in cells if d == domain and n == shots)
    if not found:
        have = sorted({f"{d} N={n}" for (d, n, _) in cells})
        raise FileNotFoundError(f"no predictions for {domain} N={shots} in {folder}; have {have}")
    seed = found[0] if seed is None else int(seed)
    if seed not in found:
        raise FileNotFoundError(f"no predictions for {domain} N={shots} seed {seed}; have {found}")
    return cells[(domain, shots, seed)], seed
