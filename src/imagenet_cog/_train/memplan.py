"""The memory plan of ``evaluate``: which cells train together, and where their features live.

Before anything trains, :func:`plan_run` cuts the run into lockstep units from the sizes of
the domains and the memory of the device, once for the whole run:

* a unit is every (domain, seed) cell of one shots value whose domains share the feature
  width and the classes (CoG: 6 domains x 5 seeds = 30 searches); under torchrun each
  process takes a contiguous share of those cells (so it reads as few domains as it can);
* :func:`unit_memory` counts everything the unit puts on the device: the rows it uses (the
  union of its cells' training, validation and final rows) and the test rows, the labels,
  the weights, momentum and evaluation copy of every configuration of a round (and the
  bfloat16 copies and gradients of mixed precision),
  the logits and batch buffers, the epoch index, the evaluation blocks, and slack for the
  CUDA-graph pool and the allocator;
* a unit that does not fit is split into the largest groups of whole domains (all their
  seeds together) that do; a domain that does not fit alone streams its rows in chunks
  (:class:`~imagenet_cog._train.feed.ChunkStream`).

Which cells train together changes the GPU's rounding, so the plan is written into the run
folder (``plan.json``) and a resumed run follows it instead of planning again on a device with
other free memory. :func:`unit_data` assembles a unit's data as planned.

Imports only its neighbours in the wing (``engine``, ``feed``) and ``_fileio``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import numpy as np

from .._fileio import atomic_write_text, loads_json
from .._grid import holdout_sizes
from .feed import CHUNK_BYTES, HostRows

__all__ = [
    "PLAN",
    "DomainSize",
    "Unit",
    "describe_plan",
    "plan_run",
    "precision_text",
    "read_plan",
    "share",
    "unit_data",
    "unit_memory",
    "write_plan",
]

#: The plan's file in an ``evaluate`` output folder.
PLAN = "plan.json"
_FORMAT = 1
GB = 1e9
#: Slack on top of what is counted: the CUDA-graph pool's segments, cuBLAS workspaces...
FIXED_SLACK = 1 << 30
#: ... and the caching allocator's rounding and fragmentation, as a share of the rest.
SLACK_FRACTION = 0.04
#: Elements of one evaluation block of logits (``engine._EVAL_BLOCK_ELEMENTS``).
_EVAL_BLOCK = 1 << 24


@dataclasses.dataclass(frozen=True)
class DomainSize:
    """What the plan needs to know of a domain: its row counts, classes and width."""

    n_train: int
    n_test: int
    n_classes: int
    n_features: int
    n_val: int  # rows of one seed's validation holdout (per class, floor(20%))

    @classmethod
    def of(cls, X_train, y_train, X_test):
        counts = np.unique(np.asarray(y_train), return_counts=True)[1]
        n_val = int(holdout_sizes(counts).sum())  # make_search_spec's holdout
        return cls(
            int(X_train.shape[0]),
            int(X_test.shape[0]),
            int(counts.size),
            int(X_train.shape[1]),
            n_val,
        )


@dataclasses.dataclass
class Unit:
    """One lockstep unit of the plan."""

    shots: object
    cells: tuple  # ((domain, seed), ...)
    resident: bool
    rank: int = 0
    world: int = 1
    rows: int = 0  # training-side rows on the device (at most: see rows_bound)
    test_rows: int = 0
    bytes: int = 0  # what unit_memory counts, slack included
    usable_bytes: int | None = None  # the device memory it was planned for (None: no budget)

    def to_json(self):
        return {
            "shots": self.shots,
            "cells": [[d, int(s)] for d, s in self.cells],
            "resident": self.resident,
            "rank": self.rank,
            "world": self.world,
            "rows": self.rows,
            "test_rows": self.test_rows,
            "bytes": self.bytes,
            "usable_bytes": self.usable_bytes,
        }

    @classmethod
    def from_json(cls, obj):
        usable = obj.get("usable_bytes")
        return cls(
            obj["shots"],
            tuple((str(d), int(s)) for d, s in obj["cells"]),
            bool(obj["resident"]),
            int(obj["rank"]),
            int(obj["world"]),
            int(obj.get("rows", 0)),
            int(obj.get("test_rows", 0)),
            int(obj.get("bytes", 0)),
            None if usable is None else int(usable),
        )


# ------------------------------------------------------------------ accounting
def rows_bound(size, n_seeds, shots):
    """Training-side rows ``n_seeds`` cells of one domain use, at most.

    With all the shots, every row (the finals train on all of them). With ``N`` shots, each
    seed uses its validation holdout and ``N`` rows per class twice (search and final), so
    the union is at most ``n_seeds`` times that (overlaps only make it smaller).
    """
    if shots == "all":
        return size.n_train
    per_seed = size.n_val + 2 * int(shots) * size.n_classes
    return min(size.n_train, n_seeds * per_seed)


def _round_size(protocol):
    """The most trials of one search that train together (the startup round, usually)."""
    n_trials = protocol.n_trials
    startup = min(protocol.n_startup_trials, n_trials)
    later = min(protocol.trials_per_batch, n_trials - startup) if n_trials > startup else 0
    return max(startup, later, 1)


def _search_rows(size, shots):
    """Training rows of one search's trials and of its final fit."""
    if shots == "all":
        return size.n_train - size.n_val, size.n_train
    n = int(shots) * size.n_classes
    return n, n


def _by_domain(cells):
    groups = {}
    for d, s in cells:
        groups.setdefault(d, []).append((d, s))
    return list(groups.values())


def unit_memory(sizes, cells, shots, protocol, resident):
    """Bytes one unit takes on the device, by what takes them (a dict; ``"total"`` included).

    ``protocol`` (:class:`~imagenet_cog._grid.Protocol`): the run's trials and their rounds,
    its batch and its precision. The weights are float32; the features float32, or
    bfloat16 with ``mixed_precision="bf16"``. Each round keeps its own buffers, so the peak
    is that of the larger round: the search's first (its startup trials together) or the
    finals (one configuration per search, but all the training rows).
    """
    first = sizes[cells[0][0]]
    d, C, G = first.n_features, first.n_classes, len(cells)
    fb = 2 if protocol.mixed_precision == "bf16" else 4
    wb = 4
    low = fb != wb
    rows = sum(rows_bound(sizes[g[0][0]], len(g), shots) for g in _by_domain(cells))
    test_rows = sum(sizes[g[0][0]].n_test for g in _by_domain(cells))
    batch = protocol.batch_size
    search = max(_search_rows(sizes[c[0]], shots)[0] for c in cells)
    final = max(_search_rows(sizes[c[0]], shots)[1] for c in cells)
    mem = {"labels": (rows + test_rows) * 8}
    if resident:
        mem["features"] = (rows + test_rows) * d * fb
    peak = None
    for K, largest in ((_round_size(protocol), search), (1, final)):
        Bm = min(batch, largest)
        S = math.ceil(largest / Bm)
        weights = G * d * K * C
        # Weights, momentum and the evaluation's copy (in float32 both steps add the weights'
        # gradient straight into the momentum: no weight-sized gradient); bfloat16 features
        # add the low-precision weights, the eager step's gradient and the fused step's.
        weight_sized = weights * (3 * wb + (3 * fb if low else 0))
        phase = {
            # ... and the biases: weights, momentum, gradient, evaluation copy.
            "weights": weight_sized + G * K * C * 4 * wb,
            # logits and their gradient (plus their bfloat16 copy).
            "logits": G * Bm * K * C * (2 * wb + (fb if low else 0)),
            # the gathered batch: the eager step's buffer or the graph's.
            "batches": 2 * G * Bm * d * fb,
            # int64 on the device and its int32 upload, and the row weights.
            "epoch index": S * G * Bm * (8 + 4 + wb),
            "evaluation": 4 * _EVAL_BLOCK * wb,
        }
        if resident:
            # The fused step's check against the eager step (only resident features take the
            # fused step) keeps copies of the weights and momentum of every search while the
            # step runs: one weight-sized tensor more than counted above in float32 (the
            # evaluation's copy does not live then), none in bfloat16. Then one search's eager
            # step and comparison temporaries at a time.
            one = d * K * C
            held = weights * (4 * wb + (fb if low else 0))  # W, momentum, their 2 copies
            phase["self-check"] = (
                max(0, held - weight_sized)
                + 2 * G * K * C * wb
                + G * K * wb
                + 2 * Bm * K * C * wb
                + Bm * d * fb
                + 3 * one * wb
                + (2 * one * fb + Bm * K * C * fb if low else 0)
            )
        if not resident:
            # Two streams (training rows, test rows), two slots each; a training slot holds
            # at least one step's rows.
            chunk_rows = CHUNK_BYTES // (d * fb)
            train_slot = max(min(chunk_rows, rows), G * Bm)
            test_slot = min(chunk_rows, test_rows)
            phase["stream buffers"] = 2 * (train_slot + test_slot) * d * fb
        if peak is None or sum(phase.values()) > sum(peak.values()):
            peak = phase
    mem.update(peak)
    counted = sum(mem.values())
    mem["slack"] = FIXED_SLACK + int(SLACK_FRACTION * counted)
    mem["total"] = counted + mem["slack"]
    mem["rows"], mem["test_rows"] = rows, test_rows
    return mem


# ------------------------------------------------------------------ planning
def share(cells, rank, world):
    """Rank ``rank``'s contiguous share of ``cells`` (sizes differ by at most one).

    The cells run domain by domain, so a process gets as few domains as it can, and reads
    only those.
    """
    cells = list(cells)
    q, r = divmod(len(cells), world)
    start = rank * q + min(rank, r)
    return cells[start : start + q + (rank < r)]


def _make(shots, cells, sizes, protocol, resident):
    mem = unit_memory(sizes, cells, shots, protocol, resident)
    return Unit(
        shots,
        tuple(cells),
        resident,
        rows=mem["rows"],
        test_rows=mem["test_rows"],
        bytes=mem["total"],
    )


def gb_pair(a, b):
    """Two byte counts in GB, with as many decimals as it takes for unequal counts to read
    differently (``1.4 GB`` needed and ``1.4 GB`` usable would say nothing).

    Examples
    --------
    >>> gb_pair(1_400_000_000, 1_300_000_000)
    ('1.4', '1.3')
    >>> gb_pair(1_440_000_000, 1_420_000_000)
    ('1.44', '1.42')
    >>> gb_pair(1_400_000_123, 1_400_000_000)
    ('1.4000001', '1.4000000')
    """
    for digits in range(1, 10):
        shown = (f"{a / GB:.{digits}f}", f"{b / GB:.{digits}f}")
        if a == b or shown[0] != shown[1]:
            return shown
    return shown


def split_unit(shots, cells, sizes, budget, protocol, host=False):
    """The units ``cells`` (one shots value) train in: one when it fits ``budget``.

    Otherwise the largest runs of whole domains that fit stay resident; a domain that does not
    fit alone streams, with as many others as fit; a domain whose seeds do not fit together
    even streamed is split by seed. With ``host`` (a CPU run) the budget bounds only the
    copies of the features: cells over it stream, all together, and nothing is split or
    refused (the weights and buffers are host memory the run needs whatever the plan).

    Raises
    ------
    ValueError
        When one search does not fit even streamed.
    """
    cells = list(cells)

    def fits(cs, resident):
        return (
            budget is None or unit_memory(sizes, cs, shots, protocol, resident)["total"] <= budget
        )

    if fits(cells, True):
        return [_make(shots, cells, sizes, protocol, True)]
    if host:
        return [_make(shots, cells, sizes, protocol, False)]
    units, too_big = [], []
    for resident, items in ((True, _by_domain(cells)), (False, None)):
        if not resident:  # what did not fit alone: whole domains, else single searches
            items = []
            for group in too_big:
                items += [group] if fits(group, False) else [[c] for c in group]
        current = []
        for group in items:
            if current and fits(current + group, resident):
                current += group
                continue
            if current:
                units.append(_make(shots, current, sizes, protocol, resident))
            current = []
            if fits(group, resident):
                current = list(group)
            elif resident:
                too_big.append(group)
            else:
                ((domain, seed),) = group
                need = unit_memory(sizes, group, shots, protocol, False)["total"]
                need_gb, budget_gb = gb_pair(need, budget)
                raise ValueError(
                    f"{domain} N={shots} seed={seed}: one search needs {need_gb} GB on the "
                    f"device even with its features streamed (the weights, logits and buffers of "
                    f"{_round_size(protocol)} trials), but {budget_gb} GB are usable; use a "
                    "device with more memory, or fewer startup trials or trials per batch"
                )
        if current:
            units.append(_make(shots, current, sizes, protocol, resident))
    order = {c: i for i, c in enumerate(cells)}
    return sorted(units, key=lambda u: order[u.cells[0]])


def plan_run(domains, sizes, budget, protocol, world=1, stored=(), host=False):
    """Every rank's units of a run of ``protocol`` (its shots and seeds on ``domains``), in the
    order they train (then any recorded others).

    ``stored`` are the units of a plan recorded in the run folder: they are kept as they are
    (their cells train together again, resident or streamed as recorded), only cells they do
    not cover are planned; when the number of processes changed, the stored units are dealt
    out in turn. A stored resident unit that no longer fits ``budget`` streams, with a warning.
    ``host``: the budget is the host memory a CPU run may fill with copies of the features
    (:func:`split_unit`).
    """
    shapes = {}
    for domain in domains:
        size = sizes[domain]
        shapes.setdefault((size.n_features, size.n_classes), []).append(domain)
    shots, seeds = protocol.shots, protocol.seeds
    covered = {(u.shots, d, s) for u in stored for d, s in u.cells}
    units = []
    for n in shots:
        for i, unit in enumerate(u for u in stored if u.shots == n):
            unit = dataclasses.replace(unit)
            if unit.world != world:
                unit.rank, unit.world = i % world, world
            if unit.resident and budget is not None:
                need = unit_memory(sizes, list(unit.cells), n, protocol, True)["total"]
                if need > budget:
                    need_gb, budget_gb = gb_pair(need, budget)
                    warnings.warn(
                        f"the recorded plan keeps N={n} ({len(unit.cells)} searches) on the device, "
                        f"which needs {need_gb} GB, but {budget_gb} GB are usable here: "
                        f"its features stream instead (slower; on a GPU the rounding may differ "
                        f"from the rest of the run). Delete {PLAN} to plan the cells still to run "
                        "afresh for this device.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    unit.resident = False
            units.append(unit)
        for group in shapes.values():
            cells = [(d, s) for d in group for s in seeds if (n, d, s) not in covered]
            for rank in range(world):
                mine = share(cells, rank, world)
                for unit in split_unit(n, mine, sizes, budget, protocol, host) if mine else ():
                    unit.rank, unit.world, unit.usable_bytes = rank, world, budget
                    units.append(unit)
    # Recorded units of shots not asked for now stay in the record, for a later resume.
    return units + [u for u in stored if u.shots not in shots]


# ------------------------------------------------------------------ the plan file
def read_plan(folder, domains=None):
    """The units recorded in ``folder/plan.json`` (none without one).

    The plan is checked against the run: every cell (shots, domain, seed) in one unit at most,
    every domain one of ``domains`` (the run's, when given), the shots ``"all"`` or a count,
    each unit's rank one of its ``world`` processes.

    Raises
    ------
    ValueError
        Naming the file and what is wrong, when it is not a plan or not one of this run.
    """
    path = Path(folder) / PLAN
    if not path.is_file():
        return []
    try:
        obj = loads_json(path.read_text(encoding="utf-8"))
        if obj.get("format") != _FORMAT:
            raise ValueError(f"format {obj.get('format')!r}")
        units = [Unit.from_json(u) for u in obj["units"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{path}: not a memory plan this version reads ({exc}); delete it to plan again"
        ) from None
    problem = _plan_problem(units, domains)
    if problem:
        raise ValueError(f"{path}: {problem}; delete it to plan the cells still to run again")
    return units


def _plan_problem(units, domains):
    """What makes recorded ``units`` unfit for a run on ``domains``, or ``None``."""
    seen = set()
    for i, unit in enumerate(units, start=1):
        shots = unit.shots
        if shots != "all" and (isinstance(shots, bool) or not isinstance(shots, int) or shots < 1):
            return f"unit {i} has shots {shots!r}, not 'all' or a positive count"
        if not unit.cells:
            return f"unit {i} has no cells"
        if not (unit.world >= 1 and 0 <= unit.rank < unit.world):
            return f"unit {i} is for rank {unit.rank} of {unit.world} processes"
        for domain, seed in unit.cells:
            if domains is not None and domain not in domains:
                return (
                    f"unit {i} names the domain {domain!r}, which this run has no features for "
                    f"(it has {', '.join(domains)})"
                )
            if (shots, domain, seed) in seen:
                return f"the cell {domain} N={shots} seed={seed} is listed twice (unit {i})"
            seen.add((shots, domain, seed))
    return None


def write_plan(folder, units, device, protocol):
    """Record ``units`` in ``folder/plan.json`` (atomically)."""
    head = {
        "format": _FORMAT,
        "device": str(device),  # of the run that wrote the file; each unit says its budget
        "precision": precision_text(protocol.mixed_precision),
    }
    # One line per unit, so that the file reads as a table.
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    units = ",\n".join(f"    {json.dumps(u.to_json())}" for u in units)
    text = "{\n" + "\n".join(lines) + '\n  "units": [\n' + units + "\n  ]\n}\n"
    atomic_write_text(Path(folder) / PLAN, text)


def precision_text(mixed_precision):
    """How the probes compute, in words."""
    if mixed_precision == "bf16":
        return "bfloat16 features, float32 weights, bfloat16 matmuls with float32 accumulation"
    if mixed_precision == "tf32":
        return "float32 features and weights, TF32 matmuls"
    return "float32 features and weights, float32 matmuls (no TF32)"


def _domains_text(cells):
    groups = _by_domain(cells)
    if len({len(g) for g in groups}) == 1:
        seeds = len(groups[0])
        return " ".join(g[0][0] for g in groups) + f" ({seeds} seed{'s' * (seeds > 1)} each)"
    return " ".join(f"{g[0][0]} ({len(g)})" for g in groups)


def describe_plan(units, budget, device, protocol, host=False):
    """The plan as a table a person reads at a glance (``host``: the budget is a CPU run's,
    :func:`split_unit`)."""
    if budget is None:
        where = f"{device}, no device budget (the features stay in host memory)"
    elif host:
        where = (
            f"cpu, {budget / GB:.1f} GB of host memory for copies of the features "
            "(the rest streams from the stores' memory maps)"
        )
    else:
        where = f"{device}, {budget / GB:.1f} GB usable"
    world = max((u.world for u in units), default=1)
    head = [
        f"Memory plan: {len(units)} lockstep unit(s) on {where}; "
        + (f"{world} processes; " if world > 1 else "")
        + precision_text(protocol.mixed_precision),
        (
            f"{'shots':>5}  {'searches':>8}  {'rows':>10}  {'test rows':>9}  {'GB':>6}  "
            f"{'features':<9}  domains"
        ),
    ]
    lines = []
    for u in units:
        lines.append(
            f"{u.shots!s:>5}  {len(u.cells):>8}  {u.rows:>10,}  {u.test_rows:>9,}  "
            f"{u.bytes / GB:>6.1f}  {'resident' if u.resident else 'streamed':<9}  "
            + (f"[rank {u.rank}] " if world > 1 else "")
            + _domains_text(u.cells)
        )
    memory = "host memory" if host or budget is None else "device memory"
    foot = (
        "rows: at most (few-shot: each seed's 20% validation holdout and its shots); "
        "only the rows the unit's cells use are uploaded\n"
        f"GB: the most {memory} the unit holds at once, as planned: the weights and momentum "
        "of every trial it trains together, their logits and batches, the features' copies "
        "(resident) or stream buffers (streamed), and a margin of "
        f"{FIXED_SLACK / GB:.1f} GB + {SLACK_FRACTION:.0%}"
    )
    return "\n".join([*head, *lines, foot])


# ------------------------------------------------------------------ a unit's data
def unit_data(cells, arrays, specs, *, device, dtype, resident, keep=None):
    """The training and test data of a unit, holding only the rows its cells use.

    ``arrays[domain]`` is ``(X_train, y_train, X_test, y_test)``; ``specs[i]`` the
    :class:`~imagenet_cog.SearchSpec` of ``cells[i]``. Each domain contributes the union of
    its cells' search training, validation and final rows (read from its arrays straight
    into the device array, or streamed from them), then all its test rows.

    ``keep`` (a dict the caller holds across units; resident units only): the domains'
    training rows are put on the device whole, once, and the data of a later unit on the same
    domains is the same device arrays, nothing uploaded again. The caller passes it when the
    memory plan allows (see ``evaluate``: its all-data unit of the same cells is resident).

    Returns
    -------
    data, test : DeviceData
    rows : list of (train_idx, val_idx, final_idx, test_idx)
        Each cell's rows in ``data`` and ``test``.
    classes : dict
        Each domain's classes (sorted); the labels in ``data`` and ``test`` index them.
    """
    from .engine import DeviceData

    domains = list(dict.fromkeys(d for d, _ in cells))
    key = (tuple(domains), str(device), str(dtype))
    if keep is not None and keep.get("key") == key:  # every domain already on the device, whole
        data, test, place, all_classes = keep["data"]
        return data, test, _cell_rows(cells, specs, place), all_classes
    keep = keep if resident else None
    if keep is not None:
        keep.clear()  # another unit's domains go first
    parts, labels, test_parts, test_labels, place, all_classes = [], [], [], [], {}, {}
    n_rows = n_test = 0
    for domain in domains:
        X_train, y_train, X_test, y_test = arrays[domain]
        classes, y_enc = np.unique(np.asarray(y_train), return_inverse=True)
        mine = [specs[i] for i, (d, _) in enumerate(cells) if d == domain]
        used = np.unique(
            np.concatenate([np.concatenate([s.train_idx, s.val_idx, s.final_idx]) for s in mine])
        )
        # On the CPU a domain alone is used as it is: a copy of some rows would only add.
        whole = used.size == y_enc.size or (device.type == "cpu" and len(domains) == 1)
        rows = None if whole or keep is not None else used
        parts.append((X_train, rows))
        labels.append(y_enc if rows is None else y_enc[rows])
        test_parts.append((X_test, None))
        test_labels.append(np.searchsorted(classes, np.asarray(y_test)))
        place[domain] = (n_rows, rows, n_test, int(X_test.shape[0]))
        all_classes[domain] = classes
        n_rows += y_enc.size if rows is None else rows.size
        n_test += int(X_test.shape[0])
    data = DeviceData(
        HostRows(parts), np.concatenate(labels), device=device, dtype=dtype, resident=resident
    )
    test = DeviceData(
        HostRows(test_parts),
        np.concatenate(test_labels),
        device=device,
        dtype=dtype,
        resident=resident,
    )
    if keep is not None:
        keep.update(key=key, data=(data, test, place, all_classes))
    return data, test, _cell_rows(cells, specs, place), all_classes


def _cell_rows(cells, specs, place):
    """Each cell's ``(train, val, final, test)`` rows in its unit's data, from ``place``:
    per domain, its offset in the training data, the rows of the domain it holds (None: all),
    its offset in the test data and its test rows."""
    out = []
    for (domain, _), spec in zip(cells, specs):
        off, rows, off_te, m = place[domain]

        def local(idx, off=off, rows=rows):
            return off + (idx if rows is None else np.searchsorted(rows, idx))

        out.append(
            (
                local(spec.train_idx),
                local(spec.val_idx),
                local(spec.final_idx),
                np.arange(off_te, off_te + m),
            )
        )
    return out
