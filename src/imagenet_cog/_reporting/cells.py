"""The cells a run folder still lacks, as the readers say them: those a run split in parts
has not made yet (:func:`missing_cells`, :func:`describe_missing`), and the prediction files
no record names, of cells that did not finish or are still being written
(:func:`unfinished_cells`).

Stage "results", the wing of what a reader reads; the run folder's layout is
:mod:`imagenet_cog._runfolder`'s.
"""

from __future__ import annotations

from pathlib import Path

from .._fileio import loads_json
from .._grid import display_shots, domain_key, normalize_shots, shot_key
from .._runfolder import (
    PLAN,
    _all_prediction_cells,
    _named_predictions,
    read_records,
    runs_file,
)

__all__ = ["describe_missing", "missing_cells", "unfinished_cells"]


def missing_cells(folder):
    """The cells ``plan.json`` holds that ``runs.jsonl`` lacks, in the plan's order:
    ``[(domain, shots, seed, rank, world)]``, ``rank`` of ``world`` the process (or
    ``--part rank+1/world``) that trains it. A folder without a plan lacks none."""
    folder = Path(folder)
    try:
        units = loads_json((folder / PLAN).read_text(encoding="utf-8"))["units"]
        cells = [
            (str(d), normalize_shots(u["shots"]), int(s), int(u["rank"]), int(u["world"]))
            for u in units
            for d, s in u["cells"]
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    done = {
        (r.get("domain"), normalize_shots(r.get("shots", "all")), int(r.get("seed", -1)))
        for _, r in read_records(runs_file(folder))
    }
    return [c for c in cells if c[:3] not in done]


def describe_missing(folder, limit=4):
    """One line saying which cells of ``folder`` are missing and which part (or the same
    command) makes them; ``None`` when none is.

    Examples
    --------
    >>> import json, pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> units = [{"shots": 1, "cells": [["L1", 22], ["L1", 37]], "rank": 0, "world": 2},
    ...          {"shots": 1, "cells": [["L2", 22]], "rank": 1, "world": 2}]
    >>> _ = (folder / "plan.json").write_text(json.dumps({"units": units}))
    >>> print(describe_missing(folder))
    missing 3 of the 3 cells of plan.json: --part 1/2 makes L1 N=1 seeds 22 37; --part 2/2 makes L2 N=1 seed 22 (evaluate with the same options and --part; without it, one run makes them all)
    """
    folder = Path(folder)
    missing = missing_cells(folder)
    if not missing:
        return None
    try:
        total = sum(
            len(u["cells"])
            for u in loads_json((folder / PLAN).read_text(encoding="utf-8"))["units"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        total = len(missing)
    by_part = {}
    for domain, shots, seed, rank, world in missing:
        part = by_part.setdefault((rank, world), {})
        part.setdefault((domain, shots), []).append(seed)
    pieces = []
    for (rank, world), groups in sorted(by_part.items()):
        shown = [
            f"{d} N={n} seed{'s' * (len(seeds) > 1)} {' '.join(map(str, seeds))}"
            for (d, n), seeds in list(groups.items())[:limit]
        ]
        more = f" and {len(groups) - limit} more" if len(groups) > limit else ""
        cells = ", ".join(shown) + more
        pieces.append(f"--part {rank + 1}/{world} makes {cells}" if world > 1 else cells)
    how = (
        " (evaluate with the same options and --part; without it, one run makes them all)"
        if any(world > 1 for _, world in by_part)
        else " (the same evaluate command makes them)"
    )
    return f"missing {len(missing)} of the {total} cells of {PLAN}: " + "; ".join(pieces) + how


def unfinished_cells(folder):
    """The prediction files of a run folder's ``folder`` that no record names (a cell that
    did not finish, or that ``evaluate`` is still writing), in one line; None when there is
    none (or no record to name them, in a folder of predictions alone).

    Examples
    --------
    >>> import tempfile
    >>> unfinished_cells(tempfile.mkdtemp()) is None
    True
    """
    named = _named_predictions(folder)
    cells = _all_prediction_cells(folder)
    left = sorted(
        (k for k, f in cells.items() if named is not None and f.name not in named),
        key=lambda k: (domain_key(k[0]), shot_key(k[1]), k[2]),
    )
    if not left:
        return None
    groups = {}
    for domain, shots, seed in left:
        groups.setdefault((domain, shots), []).append(seed)
    said = "; ".join(
        f"{d} N={display_shots(n)} seed{'s' * (len(s) > 1)} {', '.join(map(str, s))}"
        for (d, n), s in groups.items()
    )
    return (
        f"{len(left)} prediction file{'s' * (len(left) > 1)} in {folder} "
        f"{'are' if len(left) > 1 else 'is'} named by no record (cells that did not finish, or "
        f"are still being written): not read: {said}"
    )
