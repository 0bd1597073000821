"""What an :func:`~imagenet_cog.evaluate` run will take, before it runs (``evaluate --plan``).

From the stores' manifests and labels and the device (a gigabyte of the first store is read, to
time the reads; nothing is written): the memory plan
(which cells train together, resident or streamed, the gigabytes on the device and on the
host), the work (the SGD rows and their floating-point operations, the evaluation passes),
the time predicted on this device from a short measured step at the run's shape, and the bytes
to read from disk.

How the time is predicted, per lockstep unit: its searches train in rounds (the startup round,
``n_startup_trials`` trials of every search together; then rounds of ``trials_per_batch``;
then the retrains), each round a number of SGD steps known from the row counts. A step of
``K`` configurations at the run's width, classes and batch is timed here, for each ``K`` a
round uses (on the CPU one configuration is timed, and a wider step whose time would exceed
about half a second is extrapolated linearly in ``K``, as a CPU's time grows). The evaluation
passes (each trial's validation rows, each retrain's test rows) are forward products, costed
at half a training row's measured time. Optuna's asking and telling is timed on a study of the
run's size; what a run costs beside its work, by an evaluate run of one tiny search. A store is
read once at the rate of a cold read of one of its files, and checked at the rate evaluate's
checks run on one file; the rows a unit holds in memory (a resident unit's training rows, every
unit's test rows) are copied out of the memory maps once, at the rate of copying one shard
into new memory; a streamed unit's rows are gathered at the rate measured on the store's first
gigabyte. On CUDA the first step of a shape also compiles and captures it: that cost,
measured, is added once per shape.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import numpy as np

from .._grid import holdout_sizes

__all__ = ["EvaluatePlan", "count_work", "measure_rates", "predict"]

GB = 1e9


@dataclasses.dataclass
class EvaluatePlan:
    """The plan of one :func:`~imagenet_cog.evaluate` run, made by
    :func:`~imagenet_cog.plan_evaluate`.

    Attributes
    ----------
    memory : str
        The memory plan as ``evaluate`` prints it.
    units : list of dict
        Per lockstep unit: shots, cells, resident, device and host gigabytes, SGD rows,
        trial-steps, floating-point operations and predicted seconds.
    rates : dict
        What was measured on this device: milliseconds per step for each width, the
        evaluation rate, Optuna's seconds per trial, the disk's bytes per second.
    seconds : dict
        Predicted seconds: ``"sgd"``, ``"evaluation"``, ``"optuna"``, ``"compile"``,
        ``"setup"`` (what a run costs beside its work), ``"read"`` (the stores from the disk), ``"scans"`` (checking them again from the page
        cache), ``"streaming"`` (streamed rows copied out of the memory maps) and their
        ``"total"``.
    bytes_to_read : int
        The stores' bytes (train and test, every domain asked for).
    device : str
    settings : dict
        The protocol's numbers the plan was made for.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog import plan_evaluate
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(np.arange(3), 50)
    >>> X = rng.normal(size=(150, 8)).astype(np.float32)
    >>> plan = plan_evaluate({"in1k": (X, y, X[:30], y[:30])}, domains=("in1k",),
    ...                      shots=(1, "all"), seeds=(22, 37), n_trials=2, n_startup_trials=1,
    ...                      epochs=3, device="cpu")
    >>> [(u["shots"], len(u["cells"]), u["trial_steps"]) for u in plan.units]
    [(1, 2, 18), ('all', 2, 18)]
    >>> print(plan.table())  # doctest: +ELLIPSIS
    Plan of evaluate on cpu: 4 cells (1 domain(s) x 2 shots value(s) x 2 seed(s)), ...
    """

    memory: str
    units: list
    rates: dict
    seconds: dict
    bytes_to_read: int
    device: str
    settings: dict

    @property
    def flop(self):
        """Floating-point operations of the SGD products and of the evaluations."""
        return {
            "sgd": sum(u["flop_sgd"] for u in self.units),
            "evaluation": sum(u["flop_eval"] for u in self.units),
        }

    def to_dict(self):
        """The plan as plain data (JSON)."""
        out = dataclasses.asdict(self)
        out["flop"] = self.flop
        return out

    def table(self):
        """The plan as text a person reads at a glance."""
        s, f = self.settings, self.flop
        cells = sum(len(u["cells"]) for u in self.units)
        head = (
            f"Plan of evaluate on {self.device}: {cells} cells ({s['domains']} domain(s) x "
            f"{s['shots']} shots value(s) x {s['seeds']} seed(s)), {s['n_trials']} trials of "
            f"{s['epochs']} epochs and the retrain per cell. Nothing has been trained."
        )
        lines = [head, "", self.memory, ""]
        lines.append(
            f"{'shots':>5}  {'searches':>8}  {'trial-steps':>12}  {'SGD PFLOP':>9}  "
            f"{'eval PFLOP':>10}  {'predicted':>10}"
        )
        for u in self.units:
            lines.append(
                f"{u['shots']!s:>5}  {len(u['cells']):>8}  {u['trial_steps']:>12,}  "
                f"{u['flop_sgd'] / 1e15:>9.3f}  {u['flop_eval'] / 1e15:>10.3f}  "
                f"{_duration(u['seconds']):>10}"
            )
        sec = self.seconds
        lines.append(
            f"work: {f['sgd'] / 1e15:.3f} PFLOP of SGD products and {f['evaluation'] / 1e15:.3f} "
            "PFLOP of evaluations (computed from the row counts)"
        )
        r = self.rates
        widths = ", ".join(
            f"{k} config(s) {v:.3f} ms"
            for k, v in sorted(r["ms_per_step"].items(), key=lambda x: int(x[0]))
        )
        read = r.get("read_bytes_per_s")
        lines.append(
            f"measured here: one SGD step of {widths} (batch {s['batch_size']}"
            + (
                f"; {', '.join(map(str, r['extrapolated']))} config(s) extrapolated"
                if r["extrapolated"]
                else ""
            )
            + f"); Optuna {1e3 * r['optuna_s_per_trial']:.1f} ms a trial"
            + (
                f"; a store read {read / 1e9:.2f} GB/s cold, checked "
                f"{r['scan_bytes_per_s'] / 1e9:.1f} GB/s, rows gathered "
                f"{r['gather_bytes_per_s'] / 1e9:.2f} GB/s, copied into memory "
                f"{r['copy_bytes_per_s'] / 1e9:.2f} GB/s"
                if read and r.get("scan_bytes_per_s")
                else ""
            )
            + (f"; compiling a shape {r['compile_s']:.1f} s" if r.get("compile_s") else "")
        )
        lines.append(
            f"predicted on this device: SGD {_duration(sec['sgd'])}, evaluations "
            f"{_duration(sec['evaluation'])}, Optuna {_duration(sec['optuna'])}, compiling "
            f"{_duration(sec['compile'])}, setting up {_duration(sec['setup'])}, reading and "
            f"checking the stores "
            f"{_duration(sec['read'] + sec['scans'])}, copying rows into memory "
            f"{_duration(sec['copies'])}, streaming rows {_duration(sec['streaming'])}: "
            f"about {_duration(sec['total'])} in all"
        )
        lines.append(
            f"disk: {self.bytes_to_read / GB:.2f} GB of stores to read (streamed units read "
            "their rows again each epoch when the page cache cannot hold them)"
        )
        return "\n".join(lines)


def _duration(seconds):
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


# ---------------------------------------------------------------------- the work
def _cell_rows(counts, n_shots):
    """``(search rows, validation rows, final rows)`` of one cell from its class counts."""
    counts = np.asarray(counts, dtype=np.int64)
    held = holdout_sizes(counts)
    if n_shots is None:
        return int((counts - held).sum()), int(held.sum()), int(counts.sum())
    return (
        int(np.minimum(n_shots, counts - held).sum()),
        int(held.sum()),
        int(np.minimum(n_shots, counts).sum()),
    )


def _steps(rows, batch, epochs):
    return epochs * math.ceil(rows / min(batch, rows)) if rows else 0


def count_work(units, class_counts, test_rows, widths, protocol, host=False, slots=0):
    """The work of each unit of a run of ``protocol``: rounds of SGD steps, rows, trial-steps
    and FLOP, and its memory on the device and in host memory.

    ``class_counts[domain]`` holds the training images of each class; ``test_rows[domain]``
    the test rows; ``widths[domain]`` ``(n_features, n_classes)``; ``host``: a CPU run, whose
    unit memory is host memory; ``slots``: the host bytes a streamed GPU unit's two slots take.
    """
    batch, epochs = protocol.batch_size, protocol.epochs
    n_trials, startup, per_batch = (
        protocol.n_trials,
        min(protocol.n_startup_trials, protocol.n_trials),
        protocol.trials_per_batch,
    )
    rounds = [startup] if startup else []
    left = n_trials - startup
    while left > 0:
        rounds.append(min(per_batch, left))
        left -= rounds[-1]
    out = []
    for unit in units:
        n_shots = None if unit.shots == "all" else int(unit.shots)
        searches = len(unit.cells)
        per_cell = [(d, _cell_rows(class_counts[d], n_shots)) for d, _ in unit.cells]
        # The searches of a unit step together: a round lasts as long as its longest search.
        search_steps = max(_steps(rows[0], batch, epochs) for _, rows in per_cell)
        final_steps = max(_steps(rows[2], batch, epochs) for _, rows in per_cell)
        phases = [(searches * k, search_steps) for k in rounds] + [(searches, final_steps)]
        sgd_rows = sum(epochs * (n_trials * r[0] + r[2]) for _, r in per_cell)
        eval_rows = sum(n_trials * r[1] + test_rows[d] for d, r in per_cell)
        d, c = widths[unit.cells[0][0]]
        # The rows taken out of the stores' memory maps into memory once: a resident unit's
        # training rows (only those its cells use) and test rows; a streamed unit's test rows.
        copy_rows = 0
        for domain in dict.fromkeys(dom for dom, _ in unit.cells):
            if unit.resident:
                used = sum(r[1] + r[2] for dom, r in per_cell if dom == domain)
                copy_rows += min(int(np.sum(class_counts[domain])), used)
            copy_rows += test_rows[domain]
        out.append(
            {
                "shots": unit.shots,
                "cells": [list(x) for x in unit.cells],
                "resident": bool(unit.resident),
                "device_gb": 0.0 if host else round(unit.bytes / GB, 3),
                # A CPU unit's memory is the host's; a GPU unit streams through two host slots.
                "host_gb": round(
                    unit.bytes / GB if host else (0 if unit.resident else slots / GB), 3
                ),
                "phases": phases,
                "sgd_rows": int(sgd_rows),
                "eval_rows": int(eval_rows),
                "copy_rows": int(copy_rows),
                "trial_steps": int(sum(k * s for k, s in phases)),
                "flop_sgd": 4 * d * c * int(sgd_rows),
                "flop_eval": 2 * d * c * int(eval_rows),
                "width": [d, c],
            }
        )
    return out


# --------------------------------------------------------------------- measuring
def _timed(fn, device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure_rates(placement, d, c, widths_needed, protocol, compile="auto", limit_s=0.5):
    """Time SGD steps of ``K`` configurations (``K`` in ``widths_needed``) at width ``d``,
    ``c`` classes and ``protocol``'s batch on ``placement``'s device, as ``evaluate`` trains
    them.

    The difference of a 1-epoch and a 3-epoch run over 4 batches cancels what a call costs
    once; on CUDA that cost (compiling and capturing the step) is returned apart. On the CPU
    one configuration is timed first, and a width whose step would exceed ``limit_s`` is
    extrapolated linearly from the widest one timed (``"extrapolated"`` lists them).
    """
    import torch

    from .._train.engine import DeviceData, TrainConfig, train_many

    device, batch = placement.device, protocol.batch_size
    cpu = device.type != "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    # The 4 batches of each epoch are drawn from up to 256 MB of rows (at most 64 batches), so
    # that gathering a batch misses the caches as a run's does (its rows span gigabytes).
    pool = min(max(4 * batch, (256 << 20) // (4 * d)), 64 * batch)
    X = torch.nn.functional.normalize(torch.randn(pool, d, generator=gen, device=device), dim=1).to(
        placement.features
    )
    y = torch.randint(0, c, (pool,), generator=gen, device=device)
    data = DeviceData(X, y, device=device, dtype=placement.features)
    rows = np.sort(np.random.default_rng(0).choice(pool, 4 * batch, replace=False))
    kw = {
        "n_classes": c,
        "dtype": placement.weights,
        "tf32": placement.tf32,
        "compile": compile,
    }

    def time_width(k):
        configs = [TrainConfig(1.0, 1e-6, seed=s, train_idx=rows) for s in range(k)]
        one, three = protocol.replace(epochs=1), protocol.replace(epochs=3)
        once = _timed(lambda: train_many(data, configs, protocol=one, **kw), device)
        t3 = _timed(lambda: train_many(data, configs, protocol=three, **kw), device)
        t1 = _timed(lambda: train_many(data, configs, protocol=one, **kw), device)
        # Two more epochs of 4 steps; on a busy machine, never less than half the mean step.
        per_step = max((t3 - t1) / 8, t3 / 12 / 2)
        return 1e3 * per_step, max(0.0, once - t1)

    ms, first, extrapolated = {}, [], []
    widths = sorted({int(w) for w in widths_needed})
    if cpu and 1 not in widths:
        ms[1], _ = time_width(1)
    widest = 1 if cpu and 1 in ms else None
    for k in widths:
        if cpu and widest is not None and ms[widest] * k / widest > 1e3 * limit_s:
            ms[k] = ms[widest] * k / widest  # a CPU's step grows linearly with the configs
            extrapolated.append(k)
            continue
        ms[k], compiled = time_width(k)
        first.append(compiled)
        widest = k
    return {
        "ms_per_step": {str(k): round(v, 4) for k, v in ms.items()},
        "extrapolated": extrapolated,
        "compile_s": round(max(first), 2) if not cpu and first else 0.0,
    }


def measure_optuna(n_trials, n_startup_trials):
    """Seconds per trial of asking and telling a seeded multivariate TPE study of this size."""
    import warnings

    import optuna

    from .._grid import PAPER_PROTOCOL

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            n_startup_trials=min(n_startup_trials, n_trials), multivariate=True, seed=0
        )
        study = optuna.create_study(direction="maximize", sampler=sampler)
        start = time.perf_counter()
        for _ in range(n_trials):
            trial = study.ask()
            trial.suggest_float("lr", *PAPER_PROTOCOL.lr_range, log=True)
            trial.suggest_float("wd", *PAPER_PROTOCOL.wd_range, log=True)
            study.tell(trial, float(rng.random()))
    return (time.perf_counter() - start) / n_trials


def measure_read(path, limit=256 << 20):
    """Bytes per second of a cold read of ``path`` (at most ``limit`` bytes), its pages dropped
    from the page cache first where the system allows it; None without a file."""
    if path is None:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start, read = time.perf_counter(), 0
        while read < limit:
            chunk = os.read(fd, 8 << 20)
            if not chunk:
                break
            read += len(chunk)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
    return read / seconds if seconds > 0 and read else None


#: How much of a training store the gather measurement reads first, into the page cache.
GATHER_SPAN = 1 << 30


def measure_store_passes(files, rows_of, batch):
    """``(scan, gather, copy)`` bytes per second on the training store of ``files``
    (``[(path, bytes)]`` of its shards, in row order) and ``rows_of`` (its rows,
    memory-mapped).

    ``scan``: evaluate's passes over a store before it trains (the finite-values and unit-norm
    checks, the normalisation's check), on its first shard. ``gather``: copying ``batch``
    random rows out of the memory maps, as a streamed unit does at every step, over the rows of
    the first shards (up to :data:`GATHER_SPAN` bytes), read into the page cache first, as
    evaluate's first pass leaves a store that fits there. ``copy``: copying the first shard
    out of its memory map into new memory, as a unit's rows are taken into memory before it
    trains (a first touch of every page: far slower than ``gather``'s reused buffers).
    ``(None, None, None)`` without a store.
    """
    if not files:
        return None, None, None
    from .._feature_source import l2_normalize
    from .checks import _finite_rows, _unit_norm

    span, rows = 0, 0
    for path, size in files:
        if span and span + size > GATHER_SPAN:
            break
        with open(path, "rb") as f:  # into the page cache, not into this process's mappings
            while f.read(8 << 20):
                pass
        span += size
        X = np.load(path, mmap_mode="r", allow_pickle=False)
        rows += len(X)
    first = np.load(files[0][0], mmap_mode="r", allow_pickle=False)
    if first.ndim != 2 or not len(first):
        return None, None, None
    start = time.perf_counter()
    _finite_rows(first)
    _unit_norm(first)
    l2_normalize(first)
    scan = first.nbytes / (time.perf_counter() - start)
    rng = np.random.default_rng(0)
    rows = min(rows, len(rows_of))
    picks = [np.sort(rng.choice(rows, min(batch, rows), replace=False)) for _ in range(8)]
    start = time.perf_counter()
    for pick in picks:
        np.asarray(rows_of[pick])
    seconds = time.perf_counter() - start
    gather = sum(p.size for p in picks) * first.shape[1] * first.itemsize / seconds
    start = time.perf_counter()
    np.array(first)
    copy = first.nbytes / (time.perf_counter() - start)
    return scan, gather, copy


def predict(work, rates, bytes_to_read, protocol):
    """Predicted seconds per unit (``unit["seconds"]``) and in all (see the module docstring)."""
    ms = {int(k): v for k, v in rates["ms_per_step"].items()}
    # A training row costs a step's time over its rows at the narrowest width timed; an
    # evaluated row (a forward product only) half of that.
    narrow = min(ms)
    per_row = ms[narrow] / 1e3 / narrow / protocol.batch_size
    total = {"sgd": 0.0, "evaluation": 0.0, "optuna": 0.0, "compile": 0.0}
    shapes = set()
    for unit in work:
        sgd = sum(steps * ms[k] / 1e3 for k, steps in unit["phases"])
        evaluation = unit["eval_rows"] * per_row / 2
        optuna = len(unit["cells"]) * protocol.n_trials * rates["optuna_s_per_trial"]
        compile_s = 0.0
        for k, _ in unit["phases"]:
            if (k, tuple(unit["width"])) not in shapes:
                shapes.add((k, tuple(unit["width"])))
                compile_s += rates.get("compile_s", 0.0)
        unit["seconds"] = round(sgd + evaluation + optuna + compile_s, 3)
        total["sgd"] += sgd
        total["evaluation"] += evaluation
        total["optuna"] += optuna
        total["compile"] += compile_s
    total["setup"] = rates.get("setup_s", 0.0)
    cold, scan, gather = (
        rates.get(k) for k in ("read_bytes_per_s", "scan_bytes_per_s", "gather_bytes_per_s")
    )
    # Before training, evaluate passes over every store three times (the finite-values and
    # unit-norm checks, the normalisation's check): the first read comes from the disk. A
    # streamed unit copies each step's rows out of the memory maps.
    total["read"] = bytes_to_read / cold if cold else 0.0
    total["scans"] = bytes_to_read / scan if scan else 0.0
    streamed = sum(u["sgd_rows"] * u["width"][0] * 4 for u in work if not u["resident"])
    total["streaming"] = streamed / gather if gather else 0.0
    copy = rates.get("copy_bytes_per_s")
    copied = sum(u.get("copy_rows", 0) * u["width"][0] * 4 for u in work)
    total["copies"] = copied / copy if copy else 0.0
    total["total"] = sum(total.values())
    return {k: round(v, 3) for k, v in total.items()}
