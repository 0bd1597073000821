"""What an :func:`~imagenet_cog.evaluate` run will take, before it runs (``evaluate --plan``).

From the stores' manifests and labels and the device (a gigabyte of the first store is read, to
time the reads; nothing is written): the memory plan
(which cells train together, resident or streamed, the gigabytes on the device and on the
host), the work (the SGD rows and their floating-point operations, the evaluation passes),
the time predicted on this device from a short measured step at the run's shape, and the bytes
to read from disk.

How the time is predicted, per lockstep unit: its searches train in rounds (the startup round,
``n_startup_trials`` trials of every search together; then rounds of ``trials_per_batch``; then
the retrains), each round one engine pass in which every search is a group of the round's
trials. A pass's steps are known from the row counts: each step trains on the rows of its
largest group's batch (``min(batch_size, rows)``: a few-shot search of 48 rows steps on 48
rows, not on a full batch), and only the groups whose epoch is not over take it. Each shape of
pass (groups, trials per group, rows a step, width, classes) is timed here on a few of its
steps, each group on its own rows (at most a few full steps: a small search's one partial batch
stays partial beside a large one's full ones), each timing the median of a few runs (on the
CPU, a shape whose epoch holds more than about 50 GFLOP is extrapolated from one group of one
trial at the same rows, linearly in the trials, as a CPU's time grows at that size), with what
a pass costs beside its epochs. The evaluation passes (each trial's validation rows, each
retrain's test rows) are timed with each kind of pass (the rows beyond a few thousand a search
are costed at half a training row's measured time). Optuna's asking and telling is timed on a
study of at most 100 trials and scaled to the run's (TPE's time per trial grows with the trials
told); what a run costs beside its work, by an evaluate run of one tiny search; what the
command costs beside the run (Python's start, the imports, the report it prints), by a tiny run
of it in a fresh process. A store is read once at the rate of a cold read of one of its files,
and checked at the rate evaluate's checks run on one file; the rows a unit holds in memory (a
resident unit's training rows, every unit's test rows) are copied out of the memory maps once,
at the rate of copying one shard into new memory; a streamed unit's rows are gathered at the
rate measured on the store's first gigabyte. On CUDA the first step of a shape also compiles
and captures it: that cost, measured, is added once per shape.
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
        ``"setup"`` (what a run costs beside its work), ``"read"`` (the stores from the
        disk), ``"scans"`` (checking them again from the page cache), ``"copies"`` (rows
        copied into memory), ``"streaming"`` (streamed rows copied out of the memory maps),
        ``"command"`` (what ``imagenet-cog evaluate`` costs beside the run: Python's start,
        the imports, the report it prints) and their ``"total"``.
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
        steps = sorted(r["steps"], key=lambda x: (-x["rows"], -x["groups"] * x["configs"]))
        shown = ", ".join(
            f"{x['groups']} x {x['configs']} on {x['rows']:,} rows {x['step_ms']:.3f} ms"
            + (" (extrapolated)" if x["extrapolated"] else "")
            for x in steps[:3]
        )
        more = f" and {len(steps) - 3} more" if len(steps) > 3 else ""
        read = r.get("read_bytes_per_s")
        lines.append(
            f"measured here: SGD steps at the run's {len(steps)} shape(s) (searches x trials "
            f"on the rows a step trains, batch {s['batch_size']}): {shown}{more}"
            + f"; Optuna {1e3 * r['optuna_s_per_trial']:.1f} ms a trial"
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
            f"{_duration(sec['copies'])}, streaming rows {_duration(sec['streaming'])}, "
            f"starting the command and its report {_duration(sec.get('command', 0.0))}: "
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


def _epoch_steps(rows, batch):
    """The steps of one epoch of each of a pass's groups (``rows``: each group's training
    rows) as ``(rows a step, [[groups taking the step, steps], ...])``.

    The engine sizes every group's batch buffers to the largest batch, ``min(batch, rows)``
    of its largest group, and steps only the groups whose epoch is not over: they are sorted
    by their steps, so after the shortest group's last step fewer groups take the next ones.
    """
    per = sorted((math.ceil(r / min(batch, r)) for r in rows if r), reverse=True)
    if not per:
        return 0, []
    runs, done = [], 0
    for n in sorted(set(per)):
        runs.append([sum(1 for p in per if p >= n), n - done])
        done = n
    return max(min(batch, r) for r in rows if r), runs


def _phase(calls, configs, rows, evaluated, batch, epochs, final=False):
    """One kind of engine pass of a unit, ``calls`` times: each of its searches a group of
    ``configs`` trials training on its ``rows``, then evaluated on its ``evaluated`` rows
    (the validation rows of a search, the test rows of a retrain, whose best classes are
    kept: ``final``)."""
    step_rows, steps = _epoch_steps(rows, batch)
    return {
        "calls": calls,
        "groups": len(rows),
        "configs": configs,
        "rows": step_rows,
        "steps": steps,
        "group_rows": [int(r) for r in rows],
        "epochs": epochs,
        "eval_rows": [int(e) for e in evaluated],
        "final": final,
    }


def group_steps(phase):
    """Steps of one group an epoch of ``phase``, summed over its groups."""
    return sum(groups * n for groups, n in phase["steps"])


def count_work(units, class_counts, test_rows, widths, protocol, host=False, slots=0):
    """The work of each unit of a run of ``protocol``: its engine passes, rows, trial-steps
    and FLOP, and its memory on the device and in host memory.

    ``class_counts[domain]`` holds the training images of each class; ``test_rows[domain]``
    the test rows; ``widths[domain]`` ``(n_features, n_classes)``; ``host``: a CPU run, whose
    unit memory is host memory; ``slots``: the host bytes a streamed GPU unit's two slots take.

    Each unit trains in rounds (as :func:`~imagenet_cog._train.search.round_sizes` asks
    them), each round one engine pass in which every search of the unit is a group of the
    round's trials, then the retrains in one more pass. ``phases`` lists the kinds of pass
    with how many times each runs (``calls``), its groups and trials per group
    (``configs``), the rows a step trains on (``rows``: the largest group's batch), the
    steps of an epoch (``steps``: ``[[groups taking the step, steps], ...]``, see
    :func:`_epoch_steps`) and the rows each group's trials are evaluated on (``eval_rows``).
    """
    batch, epochs = protocol.batch_size, protocol.epochs
    n_trials = protocol.n_trials
    startup = min(protocol.n_startup_trials, n_trials)
    # The rounds of each size, as round_sizes asks them: counted, not listed (a search may
    # ask millions of trials).
    later, per_batch = n_trials - startup, protocol.trials_per_batch
    sizes = {startup: 1} if startup else {}
    for k, calls in ((per_batch, later // per_batch), (later % per_batch, 1)):
        if k and calls:
            sizes[k] = sizes.get(k, 0) + calls
    out = []
    for unit in units:
        n_shots = None if unit.shots == "all" else int(unit.shots)
        per_cell = [(d, _cell_rows(class_counts[d], n_shots)) for d, _ in unit.cells]
        search, held = [r[0] for _, r in per_cell], [r[1] for _, r in per_cell]
        phases = [_phase(n, k, search, held, batch, epochs) for k, n in sizes.items()]
        final, tests = [r[2] for _, r in per_cell], [test_rows[d] for d, _ in per_cell]
        phases.append(_phase(1, 1, final, tests, batch, epochs, final=True))
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
                # The steps each trial takes, summed: only the groups that take a step count.
                "trial_steps": int(
                    sum(p["calls"] * p["configs"] * epochs * group_steps(p) for p in phases)
                ),
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


#: Steps of a group an epoch that a timed pass takes at most: longer epochs are timed on this
#: many steps of the same rows.
TIMED_STEPS = 4
#: Rows of a group evaluated in a timed pass at most: the rest are costed by the row.
TIMED_EVAL_ROWS = 4096
#: Seconds a timing is repeated for at most (its median is kept; at least one run).
REPEAT_S = 0.3


def _timed_rows(phase):
    """The rows each group of ``phase`` trains on in a timed epoch: its own, at most
    :data:`TIMED_STEPS` full steps (a small search's one partial batch stays partial)."""
    return tuple(min(r, TIMED_STEPS * phase["rows"]) for r in phase["group_rows"])


def _shape_key(phase, width):
    return (phase["groups"], phase["configs"], phase["rows"], *width, _timed_rows(phase))


def _eval_key(phase, width):
    evaluated = tuple(min(e, TIMED_EVAL_ROWS) for e in phase["eval_rows"])
    return (*_shape_key(phase, width), evaluated, bool(phase["final"]))


def _median_time(fn, device):
    """The median seconds of ``fn`` run again while :data:`REPEAT_S` lasts (at most 5 runs): a
    busy machine's one slow run does not make the plan."""
    times = [_timed(fn, device)]
    while sum(times) < REPEAT_S and len(times) < 5:
        times.append(_timed(fn, device))
    return float(np.median(times))


def _timed_pass(data, groups, configs, rows, trained, c, kw, evaluated=None, top=False):
    """Seconds of engine passes of ``groups`` searches of ``configs`` trials each, group
    ``g`` training on ``trained[g]`` rows an epoch in steps of ``rows``, on ``data``, with
    ``kw["protocol"]``'s SGD settings and the other engine keywords of ``kw``: ``(epoch, call,
    first call)`` (the difference of a 1-epoch and a 3-epoch pass cancels what a pass costs
    once; the first pass also pays what a shape costs once: compiling, capturing), and with
    ``evaluated`` (each group's evaluated rows) what evaluating them adds to a pass (``top``:
    keeping their best classes, as a retrain's test rows are)."""
    from .._train.engine import TrainConfig, train_many

    rng = np.random.default_rng(0)
    device = data.device
    plain, scored = [], []
    for g in range(groups):
        idx = np.sort(rng.choice(data.n, trained[g], replace=False))
        ev = None if evaluated is None else np.sort(rng.choice(data.n, evaluated[g], replace=False))
        plain += [TrainConfig(1.0, 1e-6, seed=g, train_idx=idx) for _ in range(configs)]
        scored += [TrainConfig(1.0, 1e-6, seed=g, train_idx=idx, eval_idx=ev)] * configs
    one = kw["protocol"].replace(epochs=1, batch_size=rows)
    three = kw["protocol"].replace(epochs=3, batch_size=rows)
    kw = {**{k: v for k, v in kw.items() if k != "protocol"}, "n_classes": c}
    once = _timed(lambda: train_many(data, plain, protocol=one, **kw), device)
    t3 = _median_time(lambda: train_many(data, plain, protocol=three, **kw), device)
    t1 = _median_time(lambda: train_many(data, plain, protocol=one, **kw), device)
    # Two more epochs; on a busy machine, never less than half the mean epoch.
    epoch = max((t3 - t1) / 2, t3 / 3 / 2)
    if evaluated is None:
        return epoch, max(0.0, t1 - epoch), max(0.0, once - t1)
    t1e = _median_time(
        lambda: train_many(data, scored, protocol=one, top_classes=top, **kw), device
    )
    return max(0.0, t1e - t1)


def measure_rates(placement, work, protocol, compile="auto", limit_s=0.5):
    """Time the engine passes of every unit of ``work`` (:func:`count_work`) of a run of
    ``protocol`` on ``placement``'s device, at their shapes: searches (groups) of trials (configs), the rows
    a step trains on, the features' width and the classes; and what the command costs beside
    the run (:func:`measure_command`).

    Each shape is timed on passes whose groups train on the unit's rows an epoch (at most
    :data:`TIMED_STEPS` full steps each: ``timed_rows``): ``step_ms`` is an epoch's time over its steps of every group (what
    one step of all the groups costs, the epoch's own costs included), ``call_ms`` what a
    pass costs beside its epochs. Each kind of pass is timed again with its evaluation (each
    group's validation or test rows, at most :data:`TIMED_EVAL_ROWS`): ``evals`` gives what
    it adds to a pass (``eval_ms``). On the CPU, a shape whose epoch holds more than
    ``limit_s`` times 100 GFLOP of products and updates (or whose weights take more than a
    gigabyte) is timed on one search of one trial at its rows and extrapolated linearly in
    the trials it trains (a CPU's time grows so at that size; small steps are bound by what
    each costs beside its arithmetic, and are timed as they are): ``extrapolated`` says
    which, and its evaluation is costed by the row. On CUDA each shape is timed, and what a
    shape costs once (compiling and capturing its step) is returned apart (``compile_s``,
    the most it cost).
    """
    import torch

    from .._train.engine import DeviceData

    device = placement.device
    cpu = device.type != "cuda"
    kw = {"protocol": protocol, "dtype": placement.weights, "tf32": placement.tf32}
    kw["compile"] = compile
    shapes, evals = set(), set()  # the shapes of pass to time; with their evaluations
    for unit in work:
        for phase in unit["phases"]:
            shapes.add(_shape_key(phase, unit["width"]))
            evals.add(_eval_key(phase, unit["width"]))
    datas = {}

    def data_of(d, c):
        # The rows a pass gathers from span up to 256 MB (at least a group's timed steps and
        # evaluated rows), so that gathering a batch misses the caches as a run's does.
        if (d, c) not in datas:
            most = max(rows for _, _, rows, w, _, _ in shapes if w == d)
            n = max(TIMED_STEPS * most, min((256 << 20) // (4 * d), 16 * TIMED_STEPS * most))
            n = max(n, max((max(k[6], default=0) for k in evals if k[3] == d), default=0))
            gen = torch.Generator(device=device).manual_seed(0)
            X = torch.nn.functional.normalize(
                torch.randn(n, d, generator=gen, device=device), dim=1
            )
            y = torch.randint(0, c, (n,), generator=gen, device=device)
            datas[(d, c)] = DeviceData(
                X.to(placement.features), y, device=device, dtype=placement.features
            )
        return datas[(d, c)]

    out, first, extrapolated_shapes = [], [], set()
    for key in sorted(shapes):
        groups, configs, rows, d, c, trained = key
        data = data_of(d, c)
        steps = [math.ceil(r / rows) for r in trained]
        # The products and weight updates of a timed epoch, and the weights: beyond
        # ``limit_s`` at 100 GFLOP/s, or 1 GB, the shape is extrapolated (steps this large are
        # bound by their arithmetic, which grows linearly with the trials and the rows).
        flop = sum(trained) * configs * (4 + 8 / rows) * d * c
        weights = 4 * 4 * groups * configs * d * c  # weights, momentum, gradients, logits
        extrapolated = cpu and (flop > limit_s * 1e11 or weights > 1 << 30)
        if extrapolated:
            extrapolated_shapes.add(key)
            one, call, _ = _timed_pass(data, 1, 1, rows, [max(trained)], c, kw)
            epoch = one * configs * sum(trained) / max(trained)
            step_ms, call_ms = 1e3 * epoch * groups / sum(steps), 1e3 * call
        else:
            epoch, call, compiled = _timed_pass(data, groups, configs, rows, trained, c, kw)
            step_ms, call_ms = 1e3 * epoch * groups / sum(steps), 1e3 * call
            first.append(compiled)
        out.append(
            {
                "groups": groups,
                "configs": configs,
                "rows": rows,
                "timed_rows": list(trained),
                "width": [d, c],
                "step_ms": round(step_ms, 4),
                "call_ms": round(call_ms, 4),
                "extrapolated": extrapolated,
            }
        )
    timed_evals = []
    for key in sorted(evals):
        groups, configs, rows, d, c, trained, evaluated, top = key
        if key[:6] in extrapolated_shapes or not any(evaluated):
            continue
        data = data_of(d, c)
        seconds = _timed_pass(data, groups, configs, rows, trained, c, kw, evaluated, top)
        timed_evals.append(
            {
                "groups": groups,
                "configs": configs,
                "rows": rows,
                "timed_rows": list(trained),
                "width": [d, c],
                "eval_rows": list(evaluated),
                "final": top,
                "eval_ms": round(1e3 * seconds, 4),
            }
        )
    return {
        "steps": out,
        "evals": timed_evals,
        "compile_s": round(max(first), 2) if not cpu and first else 0.0,
        "command_s": measure_command(),
    }


#: The command's own work beside a run: Python, the imports, a tiny run, the report it prints.
_COMMAND = """
import sys, time, warnings
start = time.perf_counter()
import numpy as np
from imagenet_cog import cli, evaluate
import optuna, torch  # what evaluate imports when it starts: a cost of the command, not of the run
rng = np.random.default_rng(0)
y = np.repeat(["n00000001", "n00000002"], 30)
X = rng.normal(size=(60, 8)).astype(np.float32)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # a search of one trial warns that TPE never runs
    trained = time.perf_counter()
    results = evaluate({"in1k": (X, y, X, y)}, domains=("in1k",), shots=("all",), seeds=(22,),
                       n_trials=1, n_startup_trials=1, epochs=1, device="cpu", compile=False,
                       progress=False)
    trained = time.perf_counter() - trained
    results.report()
print(trained)
"""


def measure_command():
    """Seconds ``imagenet-cog evaluate`` costs beside the run itself, in a fresh process:
    Python's start, the imports (torch and optuna included, which ``evaluate`` imports when
    it starts), the report it prints when the run ends (the comparability check reads the
    official lists); a tiny run's own time is left out (the plan's ``setup``). None when the
    process cannot run."""
    import subprocess
    import sys

    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _COMMAND], capture_output=True, text=True, check=True
        )
        trained = float(done.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.CalledProcessError):
        return None
    return round(max(0.0, time.perf_counter() - start - trained), 3)


def measure_optuna(n_trials, n_startup_trials, fixed=100):
    """Seconds per trial of asking and telling a seeded multivariate TPE study of
    ``n_trials`` trials, ``n_startup_trials`` of them random.

    A study of at most ``fixed`` trials is timed (half of them at most random, as many as
    the run's): a study of the run's size when it is no longer; else its random trials' mean
    time and its TPE trials' time, which grows linearly with the trials told before (TPE's
    estimators are built on all of them), are scaled to the run's study.
    """
    import warnings

    import optuna

    from .._grid import PAPER_PROTOCOL

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n = min(n_trials, fixed)
    startup = min(n_startup_trials, n_trials, n if n == n_trials else n // 2)
    rng = np.random.default_rng(0)
    times = np.empty(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(n_startup_trials=startup, multivariate=True, seed=0)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        for i in range(n):
            start = time.perf_counter()
            trial = study.ask()
            trial.suggest_float("lr", *PAPER_PROTOCOL.lr_range, log=True)
            trial.suggest_float("wd", *PAPER_PROTOCOL.wd_range, log=True)
            study.tell(trial, float(rng.random()))
            times[i] = time.perf_counter() - start
    if n == n_trials:
        return float(times.sum() / n_trials)
    random_s = float(times[:startup].mean()) if startup else 0.0
    tpe = np.arange(startup, n)
    # Time against trials told, fitted over the TPE trials (never decreasing: noise).
    slope, intercept = np.polyfit(tpe, times[startup:], 1)
    slope = max(float(slope), 0.0)
    intercept = float(np.mean(times[startup:]) - slope * np.mean(tpe))
    runs_startup = min(n_startup_trials, n_trials)
    m = n_trials - runs_startup  # the run's TPE trials, told after runs_startup + i trials
    tpe_s = m * intercept + slope * (m * runs_startup + m * (m - 1) / 2)
    return (runs_startup * random_s + max(tpe_s, 0.0)) / n_trials


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

    def key_of(s):
        return (s["groups"], s["configs"], s["rows"], *s["width"], tuple(s["timed_rows"]))

    timed = {key_of(s): s for s in rates["steps"]}
    scored = {(*key_of(e), tuple(e["eval_rows"]), e["final"]): e for e in rates.get("evals", [])}
    # An evaluated row (a forward product only) that no timed pass evaluated costs half of a
    # trained row of one trial, at the shape that trains the most rows a step (the least
    # overhead per row).
    widest = max(rates["steps"], key=lambda s: s["groups"] * s["configs"] * s["rows"])
    per_row = widest["step_ms"] / 1e3 / (widest["groups"] * widest["configs"] * widest["rows"])
    total = {"sgd": 0.0, "evaluation": 0.0, "optuna": 0.0, "compile": 0.0}
    shapes = set()
    for unit in work:
        sgd = evaluation = compile_s = 0.0
        for phase in unit["phases"]:
            key = _shape_key(phase, unit["width"])
            shape = timed[key]
            # A step of fewer groups than the pass's (their epochs over) costs their share.
            epoch = shape["step_ms"] * group_steps(phase) / phase["groups"]
            sgd += phase["calls"] * (shape["call_ms"] + phase["epochs"] * epoch) / 1e3
            # The evaluations: as timed, and any rows beyond those by the row.
            timed_eval = scored.get(_eval_key(phase, unit["width"]))
            rows = sum(phase["eval_rows"])
            if timed_eval is not None:
                rows -= sum(timed_eval["eval_rows"])
            once = timed_eval["eval_ms"] / 1e3 if timed_eval is not None else 0.0
            evaluation += phase["calls"] * (once + rows * phase["configs"] * per_row / 2)
            if key not in shapes:
                shapes.add(key)
                compile_s += rates.get("compile_s", 0.0)
        optuna = len(unit["cells"]) * protocol.n_trials * rates["optuna_s_per_trial"]
        unit["seconds"] = round(sgd + evaluation + optuna + compile_s, 3)
        total["sgd"] += sgd
        total["evaluation"] += evaluation
        total["optuna"] += optuna
        total["compile"] += compile_s
    total["setup"] = rates.get("setup_s", 0.0)
    total["command"] = rates.get("command_s") or 0.0
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
