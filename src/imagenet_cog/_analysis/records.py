"""The records of an evaluation on the levels (k-NN, zero-shot): one JSON line per finished
cell, in the folder ``analyze`` writes ``analysis.json`` to, resumable and bound by checksum.

``<out>/<evaluation>.jsonl`` (``knn.jsonl``, ``zeroshot.jsonl``) holds a line per cell (a
domain, and for k-NN its shots and seed), each with:

* ``settings`` and ``settings_sha256``: everything that shapes every cell of the evaluation
  (for k-NN its k, T and the rule of its draws; for zero-shot the text tower by content and the
  templates); a folder holding cells of other settings is refused, naming each field that
  differs, never mixed in;
* ``inputs``: what the cell was computed from (the domain's features, by the fingerprint of its
  stores' manifests; the class names); a cell whose inputs are not the ones given now is
  refused, naming the domain;
* ``record_sha256``: the sha256 of all its other fields; a line edited after it was written is
  refused, naming the file and the line.

A killed run leaves at most a partial last line, dropped with a warning; the cells already
there are read back instead of computed again. ``analysis.json`` is bound to the file by its
sha256.

Imports only the base modules.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

from .._fileio import atomic_write_bytes, changed_settings, file_sha256, locked_append

__all__ = ["RECORD_CHECKSUM", "EvaluationRecords", "record_sha256", "settings_sha256"]

#: The key of a record that holds the checksum of its other fields.
RECORD_CHECKSUM = "record_sha256"


def _sha256(payload):
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def record_sha256(record):
    """The checksum a record holds of itself: the sha256 of its other fields, as canonical
    JSON (as it reads back)."""
    kept = {k: v for k, v in record.items() if k != RECORD_CHECKSUM}
    return _sha256(json.loads(json.dumps(kept)))


def settings_sha256(settings):
    """The first 16 hex digits of the sha256 of an evaluation's settings."""
    return _sha256(json.loads(json.dumps(settings)))[:16]


class EvaluationRecords:
    """``<folder>/<name>.jsonl``: the cells of one evaluation, appended as they finish.

    Parameters
    ----------
    folder : path
        The analysis folder (``analyze``'s ``out``).
    name : str
        The evaluation (``"knn"``, ``"zeroshot"``): the file's stem and every record's
        ``"evaluation"``.
    settings : dict
        JSON-safe; what shapes every cell.
    key_fields : tuple of str
        The fields that name a cell (``("domain", "shots", "seed")``).

    Raises
    ------
    ValueError
        In one line naming the file (and line): a line that is not a JSON record, a record
        edited after it was written, records of other settings.
    """

    def __init__(self, folder, name, settings, key_fields):
        self.path = Path(folder) / f"{name}.jsonl"
        self.name = name
        self.settings = json.loads(json.dumps(settings))
        self.settings_sha256 = settings_sha256(self.settings)
        self.key_fields = tuple(key_fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        self._cells = {}
        for number, record in self._read():
            self._cells.setdefault(self.key(record), (number, record))

    def key(self, record):
        """The cell a record is of."""
        return tuple(record.get(f) for f in self.key_fields)

    def _repair(self):
        """Drop a partial last line left by a killed writer."""
        if not self.path.is_file():
            return
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            warnings.warn(
                f"{self.path}: dropping an unfinished last line left by an interrupted run",
                RuntimeWarning,
                stacklevel=4,
            )
            atomic_write_bytes(self.path, raw[: raw.rfind(b"\n") + 1])

    def _read(self):
        if not self.path.is_file():
            return []
        found = []
        redo = "remove that line (its cell is then computed again) or use another --out"
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{self.path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not a JSON line ({exc}); {redo}") from None
            if not isinstance(record, dict) or record.get("evaluation") != self.name:
                raise ValueError(f"{where}: not a record of the {self.name} evaluation; {redo}")
            stored = record.get(RECORD_CHECKSUM)
            if stored is None or stored != record_sha256(record):
                raise ValueError(
                    f"{where}: edited after it was written (its contents do not match its "
                    f"checksum {RECORD_CHECKSUM}); its numbers cannot be trusted: {redo}"
                )
            if record.get("settings_sha256") != self.settings_sha256:
                diff = changed_settings(record.get("settings") or {}, self.settings)
                raise ValueError(
                    f"{self.path} holds {self.name} cells of other settings ("
                    + "; ".join(diff[:6] or ["settings_sha256"])
                    + f", line {number}); refusing to mix them: use another --out (out= in "
                    "Python), or the settings they were made with to resume them"
                )
            found.append((number, record))
        return found

    def find(self, key, inputs):
        """The record of cell ``key``, or None when it is not there yet.

        Raises
        ------
        ValueError
            When the record there was computed from other inputs than ``inputs`` (the
            domain's features re-extracted, other class names), naming what differs.
        """
        found = self._cells.get(tuple(key))
        if found is None:
            return None
        number, record = found
        recorded = record.get("inputs") or {}
        wanted = json.loads(json.dumps(inputs))
        if recorded != wanted:
            diff = changed_settings(recorded, wanted)
            raise ValueError(
                f"{self.path}:{number} ({', '.join(map(str, key))}) was computed from other "
                f"inputs than those given now ({'; '.join(diff[:4])}): use another --out (out= "
                f"in Python), or remove its lines of that domain to compute them again"
            )
        return record

    def append(self, record):
        """Append one cell with its settings, inputs and checksum, in one write under a
        lock; returns the record as written."""
        record = {
            "evaluation": self.name,
            **record,
            "settings": self.settings,
            "settings_sha256": self.settings_sha256,
        }
        record = json.loads(json.dumps(record, allow_nan=False))
        record[RECORD_CHECKSUM] = record_sha256(record)
        locked_append(self.path, json.dumps(record, sort_keys=True) + "\n")
        self._cells.setdefault(self.key(record), (None, record))
        return record

    def binding(self):
        """``{path: sha256}`` of the file as it is now, which ``analysis.json`` is bound to."""
        return {str(self.path): file_sha256(self.path)} if self.path.is_file() else {}
