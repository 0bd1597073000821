"""The ImageNet-CoG protocol: every domain × shots × seed cell, resumable.

Stage "protocol" of the pipeline (... → probe → results → **protocol**). For
each number of shots per class, the hyper-parameter searches of every domain
(IN-1K and L1..L5) and every seed run in lockstep: trial ``k`` of every search
trains in the same engine pass, and each search asks Optuna for one trial at a
time after its 10 random startup trials, as the official sequential loop does,
while thirty searches cost about what one costs. (The trials themselves follow
the installed Optuna's TPE, not the official code's Optuna 2.3.0: see
docs/guide/official.rst.) Each finished cell is appended to
``out/runs.jsonl``; a killed run resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ._distributed import Ranks as _Ranks
from ._distributed import check_shared_folder, lock_problem
from ._feature_source import feature_source, unfinished_note
from ._grid import DOMAINS, PAPER_PROTOCOL, SEEDS, SHOTS
from ._protocol.checks import (
    check_classes,
    check_domain,
    check_settings,
    data_summary,
    inert_settings,
)
from ._protocol.parts import RunFolderLocks, as_part
from ._protocol.plan import EvaluatePlan
from ._runfolder import RunLog, hash_config, protocol_record, write_predictions
from ._storecheck import lock_for_reading
from ._tables import check_name
from ._train.search import make_search_spec
from ._version import __version__, package_versions
from .results import Results

if TYPE_CHECKING:
    from ._device import Placement
    from ._grid import Protocol

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []


# ------------------------------------------------------------------ cells
@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every unit of one :func:`evaluate` run trains with, fixed before the first unit.

    Attributes
    ----------
    model : str
        The model name the records carry.
    protocol : Protocol
        The run's protocol as it runs on its device (``"tf32"`` off CUDA is ``None``).
    verbose : int
    progress : bool
        Whether the unit shows its search's progress bar.
    compile : "auto" or bool
        The fused SGD step's setting.
    versions : dict
        The package versions of the process, recorded in every cell.
    placement : Placement
        The run's one placement (device, dtypes, TF32), on this process's GPU under torchrun;
        set, with what follows, once the run folder is open.
    config_hash : str
        The hash the run folder's records carry.
    predictions_dir : str or None
        Where each cell's test predictions go; ``None`` saves none.
    world : int
        The number of processes the run's plan is made for: the processes of its job, times
        the parts it is split into.
    n_jobs : int or None
        Units run in parallel processes on the CPU (joblib's ``n_jobs``).
    part : Part or None
        The part of a run split into independent jobs this process belongs to.
    save_predictions : bool
        Whether each cell's test predictions are saved (into ``predictions_dir``).
    """

    model: str
    protocol: Protocol
    verbose: int
    progress: bool
    compile: str | bool
    versions: dict
    placement: Placement | None = None
    config_hash: str | None = None
    predictions_dir: str | None = None
    world: int = 1
    n_jobs: int | None = 1
    part: object = None
    save_predictions: bool = False


def _run_unit(shots, cells, arrays, settings, resident=True, keep=None):
    """One lockstep unit: the searches of ``cells`` ((domain, seed) pairs, one shots value)
    trained together on the rows they use of every domain (resident or streamed, as the
    memory plan says), or on the whole domains kept on the device across units (``keep``,
    see :func:`~imagenet_cog._train.memplan.unit_data`); then their finals."""
    from ._train.memplan import unit_data
    from ._train.search import Job, search_in_lockstep

    place, protocol = settings.placement, settings.protocol
    n_shots = None if shots == "all" else int(shots)
    specs = [
        make_search_spec(arrays[d][1], seed, n_shots=n_shots, val_fraction=protocol.val_fraction)
        for d, seed in cells
    ]
    data, test, rows, classes = unit_data(
        cells,
        arrays,
        specs,
        device=place.device,
        dtype=place.features,
        resident=resident,
        keep=keep,
    )
    steps = {}  # how the unit's fits trained (the SGD step, its self-check), for the records
    train_kw = {
        "n_classes": len(classes[cells[0][0]]),
        "dtype": place.weights,
        "tf32": place.tf32,
        "verbose": max(0, settings.verbose - 1),
        "compile": settings.compile,
        "stats": steps,
    }
    start = time.perf_counter()
    outcomes = search_in_lockstep(
        data,
        [Job(seed, *r) for (_, seed), r in zip(cells, rows)],
        protocol=protocol,
        train_kw=train_kw,
        test=test,
        verbose=settings.verbose,
        progress=f"N={shots}: {len(cells)} searches" if settings.progress else None,
        describe=lambda i: f"{cells[i][0]} N={shots} seed={cells[i][1]}",
    )
    elapsed = time.perf_counter() - start
    records = []
    for (domain, seed), spec, out in zip(cells, specs, outcomes):
        X_test, y_test = arrays[domain][2:]
        records.append(
            {
                "model": settings.model,
                "domain": domain,
                "shots": shots,
                "seed": int(seed),
                "top1": 100.0 * float(out.final.top1),
                "top5": 100.0 * float(out.final.top5),
                "val_top1": 100.0 * float(out.study.best_value),
                "lr": float(out.study.best_params["lr"]),
                "wd": float(out.study.best_params["wd"]),
                "n_train": len(spec.final_idx),
                "n_search_train": len(spec.train_idx),
                "n_val": len(spec.val_idx),
                "n_test": len(y_test),
                "n_classes": len(classes[domain]),
                "n_features": int(X_test.shape[1]),
                "n_trials": len(out.trials),
                "n_failed_trials": int(sum(t["state"] != "COMPLETE" for t in out.trials)),
                "searches_in_lockstep": len(cells),
                # Which searches trained together, in how many processes, on what data:
                # on a GPU they shape the rounding (the memory plan, plan.json, decides them).
                "lockstep_cells": [[d, int(s)] for d, s in cells],
                "world_size": settings.world,
                "features_resident": bool(data.resident),
                # How the unit's fits trained (the same for all its cells).
                "step_paths": dict(steps["step_paths"]),
                "step_check_max_diff": steps["step_check_max_diff"],
                "step_fallbacks": list(steps["step_fallbacks"]),
                "time_total_s": round(elapsed / len(cells), 3),
                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "library_version": __version__,
                "config_hash": settings.config_hash,
                # Floats as they are: json writes repr(), which reads back exactly.
                "trials": [dict(t) for t in out.trials],
            }
        )
        if settings.predictions_dir:
            records[-1] |= _save_predictions(
                settings.predictions_dir,
                domain,
                shots,
                seed,
                classes[domain],
                y_test,
                out.test_top,
            )
    return records


def _save_predictions(folder, domain, shots, seed, classes, y_test, top):
    """Write one cell's final-model test predictions; returns the fields of its record: the
    file's relative path and its sha256.

    ``top`` holds the final model's best classes on each test row, best first, as the
    engine's last evaluation found them. The file is written to a temporary name and
    renamed, so a reader never sees half a file. Arrays: ``y_true``, ``y_pred`` and
    ``classes`` as unicode strings and ``top5`` as int32 indices into ``classes`` (best
    first; fewer columns with fewer than 5 classes); nothing needs pickle to load.
    """
    classes = np.asarray(classes).astype(str)
    return write_predictions(
        Path(folder),
        domain,
        shots,
        seed,
        y_true=np.asarray(y_test).astype(str),
        y_pred=classes[top[:, 0]],
        top5=top,
        classes=classes,
    )


def evaluate(
    features,
    levels=None,
    domains=DOMAINS,
    shots=SHOTS,
    seeds=SEEDS,
    n_trials=PAPER_PROTOCOL.n_trials,
    device=None,
    out=None,
    resume=True,
    n_jobs=1,
    *,
    model=None,
    data=None,
    store=None,
    epochs=PAPER_PROTOCOL.epochs,
    batch_size=PAPER_PROTOCOL.batch_size,
    n_startup_trials=PAPER_PROTOCOL.n_startup_trials,
    trials_per_batch=PAPER_PROTOCOL.trials_per_batch,
    mixed_precision=PAPER_PROTOCOL.mixed_precision,
    extract_options=None,
    save_predictions=False,
    normalize=PAPER_PROTOCOL.normalize,
    progress=True,
    verbose=0,
    verify="cached",
    compile="auto",
    classes=None,
    part=None,
):
    """Run the ImageNet-CoG protocol and return its :class:`~imagenet_cog.Results`.

    For every domain × shots × seed cell, as the paper (Sec. 3.4.2, supplement B.2) and the official code do it: a per-class 20%
    validation holdout drawn with the seed; N images per class drawn from the
    other 80% for few-shot cells; an Optuna TPE search (30 trials, lr
    log-uniform in [0.1, 100], wd in [1e-12, 1e-4], multivariate, seeded)
    scoring last-epoch validation top-1 of 100-epoch SGD probes; then the
    best (lr, wd) retrained on the whole training set (or N images per class
    redrawn from it) and scored on the test set, top-1 and top-5, last epoch.

    The searches of every domain and seed of one shots value run in lockstep:
    trial ``k`` of every search trains in the same engine pass. With
    ``trials_per_batch=1`` (the default) every search asks for its trials one
    at a time, as the official sequential loop does (its 10 random startup
    trials train together, which TPE cannot tell apart); larger values batch
    later trials too, faster but further from the official search. The trials
    come from the installed Optuna, whose TPE differs from the official code's
    Optuna 2.3.0 after the startup trials (docs/guide/official.rst gives the
    measured effect).

    Parameters
    ----------
    features : path, mapping, str or torch.nn.Module
        A feature-store root (``ROOT/<domain>/<split>/``, see
        :func:`~imagenet_cog.extract`); a mapping ``{domain: (X_train, y_train,
        X_test, y_test)}`` with wnid (or any) labels; or a model spec such as
        ``"torchvision:resnet50:IMAGENET1K_V1"`` with ``data`` and ``store``, which extracts
        the features first.
    levels : None, "official", path or Levels
        The levels the features belong to. ``None`` (the default): for a feature store,
        the levels its stores were extracted with, read from their manifests; the official
        levels when extracting from a model spec; not known for arrays (their concepts are
        still checked by their labels). Given with a store, they must be the stores' levels
        (compared by content, not by name), else ``ValueError``. Recorded in
        ``config.json`` by name and content checksum; given (other than the official ones),
        copied into ``out``'s ``levels/``, whence the readers of the folder take each
        concept's similarity (they never read a path the folder names outside it).
    domains : sequence of str
    shots : sequence of int or "all"
    seeds : sequence of int
    n_trials : int
    device : str, optional
        ``None`` uses CUDA when available.
    out : path, optional
        Output folder: ``config.json``, ``runs.jsonl`` (one line per finished
        cell, with the per-trial table). Without it nothing is written and
        nothing resumes.
    resume : bool
        Skip the cells ``out/runs.jsonl`` already holds. A different
        configuration in ``out`` is refused, never mixed in, and so is a second
        run while one is running there (``out`` is locked for the whole run).
    n_jobs : int
        Groups run in parallel processes (joblib) on the CPU. Ignored on CUDA.
    model : str, optional
        The model name in the results (default: the store's model spec, or
        ``"model"``).
    data : dict, optional
        ``{"in1k": root, "in21k": root}`` when ``features`` is a model spec.
    store : path, optional
        Feature-store root to extract into when ``features`` is a model spec.
    epochs, batch_size : int
        The SGD protocol (100 and 1024).
    n_startup_trials, trials_per_batch : int
        See above.
    mixed_precision : str, optional
        ``"bf16"`` keeps features in bfloat16 on the device (weights stay
        float32); ``"tf32"`` lets CUDA's float32 matrix products use TF32. Not
        the official protocol. On a CPU TF32 changes nothing: the run is the
        default one and is recorded as such (``None``).
    extract_options : dict, optional
        Passed to :func:`~imagenet_cog.extract_all` (its ``progress`` is ``progress``
        unless given here).
    save_predictions : bool
        Also write each finished cell's final-model test predictions to
        ``out/predictions/<domain>__<shots>__<seed>.npz`` (arrays ``y_true``,
        ``y_pred``, ``classes`` as strings, ``top5`` as indices into
        ``classes``; ``numpy.load`` needs no pickle), and record the relative
        path as the cell's ``"predictions"``. They feed the knowledge-driven
        error analysis (:func:`imagenet_cog.analysis.analyze`). Needs ``out``.
        Cells a resumed run skips keep what they had.
    normalize : bool
        Scale every feature vector to unit l2 norm before the probes (default), as the
        official probe does to its input; the lr range [0.1, 100] assumes unit-norm
        features. Applies to every input (arrays, a store, a model spec). Features that
        are unit-norm already (a store extracted with ``normalize=True``) are used as they
        are, without a copy; others are normalised in blocks, into a copy for your arrays
        and in place for the in-memory copy of a store's. Recorded in ``config.json``;
        ``False`` makes the run not comparable with the paper
        (:func:`~imagenet_cog.comparability`).
    progress : bool
        Progress bars per lockstep unit and overall (and the extraction's, when ``features``
        is a model spec).
    verbose : int
    verify : {"cached", "sha256", "size", None}
        How the feature stores are checked when they are loaded (see
        :func:`imagenet_cog.open_store`): by default the sha256 of
        every file, computed once per file version and cached in the store.
    compile : "auto" or bool
        The fused SGD step of the probes: ``"auto"`` compiles it with ``torch.compile`` and
        replays it from CUDA graphs on CUDA; ``False`` always trains eagerly; ``True`` also
        compiles on the CPU. Same arithmetic. The fused step checks itself against the eager
        one as it trains; a disagreement, or a compile or capture that fails, warns once and
        training goes on eagerly (or uncompiled, or without graphs). Each record of
        ``runs.jsonl`` says how its unit trained: ``step_paths`` (fits per step:
        ``"eager"``, ``"compiled+graph"``...), ``step_check_max_diff`` (the largest
        difference of the checks, relative to an update; null when nothing was checked) and
        ``step_fallbacks``.
    classes : dict, optional
        ``{domain: [wnid, ...]}``: the concept of each integer label of a domain given as
        arrays, label ``i`` naming ``classes[domain][i]`` (the ``classes`` of a
        ``LabelEncoder`` or of torchvision's ``ImageFolder``). The concepts are then recorded
        by wnid and checked against the official lists; without it, integer labels leave
        them unchecked, and :func:`~imagenet_cog.comparability` counts that as a
        deviation from the paper.
    part : str, optional
        ``"i/n"``: train part ``i`` of ``n`` (numbered from 1) of the cells, in a job of its own,
        into ``out`` beside the other parts, which may run at the same time, on other machines
        too (a SLURM job array). The first part to start plans the cells of all in
        ``out/plan.json`` as a run of ``n`` processes would, and part ``i`` trains rank
        ``i - 1``'s, so that the finished folder is the one such a run makes; a killed part
        resumes when run again. Until every part has finished, ``out`` lacks the others' cells
        (``imagenet-cog report`` and ``verify`` name them and the part that makes them). Needs
        ``out``, on a filesystem whose file locks every machine sees.

    Returns
    -------
    Results

    Raises
    ------
    ValueError
        Before anything is written, naming the parameter, domain or class: a
        bad setting (``n_trials``, ``epochs``, ``batch_size``,
        ``trials_per_batch`` below 1, an unknown ``device`` or
        ``mixed_precision``, repeated seeds...), a model or domain name holding a
        control character, a missing domain, non-real
        (complex, string) or NaN features, labels that are not 1-d, a single
        class, no class large enough for the 20% validation holdout, N larger
        than a class's size, mismatched feature widths, test labels missing
        from the training set, feature stores made by different extractions
        (the store and the field named), ``levels`` other than the stores'
        own, a garbled ``runs.jsonl`` line (file and line named), a
        different configuration in ``out`` (each differing field named), or a
        store or ``out`` folder written in another format version (named, with
        what to do: extract again, or evaluate into a new folder).
    imagenet_cog._fileio.FolderLockedError
        When another process is running in the same ``out`` folder: one run
        per folder at a time (the lock is the OS's, released when the holder
        ends, even when killed), or, with ``part``, the same part twice. Wait for
        it, or use another folder.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog import evaluate
    >>> rng = np.random.default_rng(0)
    >>> def domain(sep):
    ...     means = rng.normal(size=(4, 16)) * sep
    ...     y_tr, y_te = np.repeat(np.arange(4), 40), np.repeat(np.arange(4), 10)
    ...     return (means[y_tr] + rng.normal(size=(160, 16)), y_tr,
    ...             means[y_te] + rng.normal(size=(40, 16)), y_te)
    >>> res = evaluate({"in1k": domain(3.0), "L5": domain(0.3)}, domains=("in1k", "L5"),
    ...                shots=("all",), seeds=(22, 37), n_trials=3, epochs=5,
    ...                device="cpu", progress=False)
    >>> res.mean("model", "in1k") > res.mean("model", "L5")
    True
    """
    part = as_part(part)
    protocol, domains, dev = check_settings(locals())
    classes = check_classes(classes, domains)
    if save_predictions and out is None:
        raise ValueError("save_predictions=True needs an out folder to write them to")
    if part is not None and (out is None or not resume):
        raise ValueError(
            f"part={str(part)!r} needs an out folder, resumed (resume=True): the parts fill one "
            "folder together"
        )
    if part is not None and (problem := lock_problem(out)):
        raise ValueError(f"--part {part}: {problem}")
    from ._train.engine import check_compile

    check_compile(compile)
    source = feature_source(
        features,
        data=data,
        store=store,
        levels="official" if levels is None else levels,
        extract_options={"progress": progress, **(extract_options or {})},
        verify=verify,
        normalize=normalize,
    )
    source.prepare(domains)
    _check_domains_present(source, domains, features)

    # The stores stay locked for reading until the run ends: an extraction that would rewrite
    # one under it is refused, naming this run.
    where = f", run folder {out}" if out is not None else ""
    readers = lock_for_reading(
        getattr(source, "root", None), domains, f"evaluate (PID {os.getpid()}{where})"
    )
    # One question, before anything is written: one extraction for every domain, the levels
    # the stores were made with, every domain's data checked, fingerprinted and traced.
    try:
        described = _described(source, domains, levels, protocol, classes)
        if model is None:
            model = described.model or "model"
            check_name(model)  # before anything is written: every record carries it
    except BaseException:
        readers.close()
        raise
    config = {
        "model": model,
        "levels": described.levels["name"],
        "levels_sha256": described.levels["sha256"],
        "features": described.features,
        "data": described.data,
        "protocol": protocol.record(),
        "library_version": __version__,
        "versions": package_versions("numpy", "optuna", "torch"),
    }
    settings = RunSettings(
        model,
        protocol,
        verbose,
        progress,
        compile,
        config["versions"],
        n_jobs=n_jobs,
        part=part,
        save_predictions=save_predictions,
    )
    # Under torchrun or srun, rank 0 owns the run folder; the others join it once it exists.
    ranks = _Ranks(dev).start()
    # One run per folder at a time, for the whole run: a second one is refused (the lock
    # file names the holder's PID); the OS releases it when the holder dies, even killed. The
    # parts of a split run share the folder (see _protocol.parts).
    locks = RunFolderLocks(out, part) if out is not None and ranks.rank == 0 else None
    try:
        with ranks:  # leaves the process group it started
            kept = _levels_to_keep(levels, config) if out is not None else None
            log = _open_log(out, config, resume or part is not None, ranks, locks, kept)
            return _evaluate_locked(source, domains, config, settings, log, ranks, locks)
    finally:
        readers.close()
        if locks is not None:
            locks.release()


def plan_evaluate(
    features,
    levels=None,
    domains=DOMAINS,
    shots=SHOTS,
    seeds=SEEDS,
    n_trials=PAPER_PROTOCOL.n_trials,
    device=None,
    *,
    epochs=PAPER_PROTOCOL.epochs,
    batch_size=PAPER_PROTOCOL.batch_size,
    n_startup_trials=PAPER_PROTOCOL.n_startup_trials,
    trials_per_batch=PAPER_PROTOCOL.trials_per_batch,
    mixed_precision=PAPER_PROTOCOL.mixed_precision,
    compile="auto",
    n_jobs=1,
    nodes=None,
    gpus_per_node=None,
):
    """What :func:`evaluate` would do with these arguments, without training.

    Refuses, in the same one line, every run :func:`evaluate` refuses before it trains (its
    settings, levels other than the stores', stores of different extractions, more shots than
    a class holds...), but for features that are not finite, which it does not read. Reads the
    stores' manifests and labels, and the device, and returns:

    - the memory plan, as ``evaluate`` would print it (which cells train together, resident
      or streamed, the gigabytes on the device or, on the CPU, in host memory);
    - the work: SGD rows, trial-steps and floating-point operations of each lockstep unit,
      and of the evaluation passes;
    - the time predicted on this device, from engine passes timed here at the run's shapes
      (searches, trials, the rows a step trains on, width and classes), Optuna timed on a
      study of at most 100 trials and scaled to the run's, and a cold read of one store
      file;
    - the bytes of the stores to read;
    - with ``nodes`` or ``gpus_per_node``, the run on that many machines and GPUs, as torchrun
      or srun would start it (one process per GPU, each with a device like this one): each
      process's units, memory and predicted time, and the run's wall time, its slowest
      process's.

    Parameters
    ----------
    features : path or mapping
        A feature-store root, or arrays as for :func:`evaluate` (features still to extract
        cannot be planned: extract, then plan).
    levels, domains, shots, seeds, n_trials, device
        As for :func:`evaluate`.
    epochs, batch_size, n_startup_trials, trials_per_batch, mixed_precision, compile, n_jobs
        As for :func:`evaluate`.
    nodes, gpus_per_node : int, optional
        The shape of the job to plan for (1 each by default).

    Returns
    -------
    EvaluatePlan
        ``table()`` for a person, ``to_dict()`` for a program, ``seconds["total"]`` the
        predicted time; with ``nodes`` or ``gpus_per_node``, its ``cluster`` attribute holds
        each process's share and the wall time (``cluster["wall_s"]``).

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog import plan_evaluate
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(np.arange(4), 40)
    >>> X = rng.normal(size=(160, 16)).astype(np.float32)
    >>> plan = plan_evaluate({"in1k": (X, y, X[:40], y[:40])}, domains=("in1k",),
    ...                      shots=("all",), seeds=(22,), n_trials=3, n_startup_trials=1,
    ...                      epochs=5, device="cpu")
    >>> plan.units[0]["trial_steps"], plan.flop["sgd"]  # 5 epochs of 128 rows x 3, 160 rows
    (20, 696320)
    >>> plan.seconds["total"] > 0
    True
    """
    from ._device import place_on
    from ._distributed import Ranks
    from ._protocol import plan as _plan_wing
    from ._train import memplan as _memplan
    from ._train.engine import check_compile

    protocol, domains, dev = check_settings(locals())
    check_compile(compile)
    shape = {}
    for name, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{name}={value!r} ({flag}): give a positive number")
        shape[name] = 1 if value is None else value
    world = shape["nodes"] * shape["gpus_per_node"]
    try:
        source = feature_source(features, levels=levels or "official", verify=None)
    except ValueError as exc:
        if "model spec" not in str(exc):
            raise
        raise ValueError(
            "plan_evaluate plans the evaluation of features already extracted: give their "
            "feature-store root (imagenet-cog extract makes it)"
        ) from None
    _check_domains_present(source, domains, features)
    _described(source, domains, levels, protocol, {}, scan=False)
    units, budget, host = _memory_plan(domains, protocol, source, dev, Ranks(dev), world=world)
    counts, test_rows, widths = {}, {}, {}
    for domain in domains:
        X_train, y_train, X_test, _ = source.load(domain, mmap=True)
        counts[domain] = np.unique(np.asarray(y_train), return_counts=True)[1]
        test_rows[domain] = int(X_test.shape[0])
        widths[domain] = (int(X_train.shape[1]), int(counts[domain].size))
    slots = 2 * _memplan.CHUNK_BYTES  # a streamed unit's two host slots on a GPU
    work = _plan_wing.count_work(units, counts, test_rows, widths, protocol, host, slots)
    placement = place_on(dev, "float32", protocol.mixed_precision)
    rates = _plan_wing.measure_rates(placement, work, protocol, compile)
    rates["optuna_s_per_trial"] = _plan_wing.measure_optuna(
        protocol.n_trials, protocol.n_startup_trials
    )
    files = source.store_files(domains)
    rates["read_bytes_per_s"] = _plan_wing.measure_read(files[0][0] if files else None)
    train_files = source.store_files(domains[:1], splits=("train",))
    X_first = source.load(domains[0], mmap=True)[0]
    passes = _plan_wing.measure_store_passes(train_files, X_first, protocol.batch_size)
    for name, rate in zip(("scan", "gather", "copy"), passes):
        rates[f"{name}_bytes_per_s"] = rate
    bytes_to_read = sum(b for _, b in files)
    rates["setup_s"] = _setup_seconds(dev, compile)
    seconds = _plan_wing.predict(work, rates, bytes_to_read, protocol)
    plan = EvaluatePlan(
        memory=_memplan.describe_plan(units, budget, dev, protocol, host=host),
        units=work,
        rates=rates,
        seconds=seconds,
        bytes_to_read=bytes_to_read,
        device=str(dev),
        settings={
            "domains": len(domains),
            "shots": len(protocol.shots),
            "seeds": len(protocol.seeds),
            "n_trials": protocol.n_trials,
            "epochs": protocol.epochs,
            "batch_size": protocol.batch_size,
            "mixed_precision": protocol.mixed_precision,
        },
    )
    if nodes is None and gpus_per_node is None:
        return plan
    from ._protocol.cluster import ClusterPlan, plan_processes

    store_bytes = {d: sum(b for _, b in source.store_files([d])) for d in domains}
    cluster = plan_processes(units, work, rates, store_bytes, protocol, **shape)
    return ClusterPlan(**vars(plan), cluster=cluster)


def _setup_seconds(device, compile):
    """Seconds of an evaluate run that trains almost nothing (one search of one trial and one
    epoch on 2 x 30 rows): what a run costs beside its work (the libraries it loads on first
    use, its checks, its plan, its records)."""
    rng = np.random.default_rng(0)
    y = np.repeat(["n00000001", "n00000002"], 30)
    X = rng.normal(size=(60, 8)).astype(np.float32)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a search of one trial warns that TPE never runs
        _tiny_run(X, y, device, compile)
    return time.perf_counter() - start


def _tiny_run(X, y, device, compile):
    evaluate(
        {"in1k": (X, y, X, y)},
        domains=("in1k",),
        shots=("all",),
        seeds=(22,),
        n_trials=1,
        n_startup_trials=1,
        epochs=1,
        device=device,
        compile=compile,
        progress=False,
    )


def _levels_to_keep(levels, config):
    """The levels :func:`evaluate`'s run folder keeps a copy of (the readers never read a path
    its ``config.json`` names outside it): those given, or, when none are, those the stores
    were extracted with, read where they name them if their contents are still the stores'.
    None for the official ones, which ship with the package, and for levels no longer there.
    """
    given = levels is not None
    levels = levels if given else config.get("levels")
    if levels is None or str(levels) == "official":
        return None
    from .levels import load_levels

    try:
        loaded = load_levels(levels)
    except (OSError, ValueError):
        if given:  # checked already against the stores: only a race could fail here
            raise
        return None  # moved or changed since the extraction: the readers will ask for them
    return loaded if loaded.checksum == config["levels_sha256"] else None


def _open_log(out, config, resume, ranks, locks, levels=None):
    """The run log: rank 0 locks the folder and checks its config first, then the others join;
    rank 0 keeps a copy of ``levels`` (the :class:`Levels` given) in it.

    Every rank learns whether that worked before anyone waits for anyone, so an error on one
    rank (the folder locked by another run, another configuration in it) ends every process
    with an error instead of leaving the others waiting at a barrier. In between, every rank
    checks that it sees the folder rank 0 opened, and its locks (machines may not share it).
    """
    if out is None:
        return None

    def open_on(mine, who, opener):
        # Every rank reaches all_ok whether or not it opened anything, so none waits alone.
        log = error = None
        if mine:
            try:
                log = opener()
            except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the others
                error = exc
        if not ranks.all_ok(error is None):
            if error is not None:
                raise error
            raise RuntimeError(f"{who} could not open the run folder {out}; see its error")
        return log

    def first():
        locks.acquire()
        return RunLog(out, config, resume, levels)

    log = open_on(ranks.rank == 0, "rank 0", first)
    check_shared_folder(out, ranks, "the run folder")
    joined = open_on(ranks.rank != 0, "another rank", lambda: RunLog(out, config, True))
    return log if ranks.rank == 0 else joined


def _evaluate_locked(source, domains, config, settings, log, ranks, locks):
    """The part of :func:`evaluate` that runs with the out folder locked and its log open
    (``locks``: rank 0's, whose setup lock goes once the plan is read)."""
    import torch

    from ._device import place_on

    protocol, save_predictions = settings.protocol, settings.save_predictions

    def asked(record):  # a cell of this run's grid
        return (
            record["domain"] in domains
            and record["shots"] in protocol.shots
            and int(record["seed"]) in protocol.seeds
        )

    done = log.done() if log is not None else set()
    ranks.barrier()
    if save_predictions and done:
        lacking = [r for r in log.records() if "predictions" not in r and asked(r)]
        if lacking:
            warnings.warn(
                f"{len(lacking)} cell(s) already in {log.dir} ran without save_predictions; "
                "resuming skips them, so they get no saved predictions (use another out folder "
                "to save every cell's)",
                UserWarning,
                stacklevel=3,
            )

    if ranks.world > 1 and log is None:
        raise ValueError("under torchrun, evaluate needs an out folder to gather the cells")
    config_hash = log.config_hash if log is not None else hash_config(config)
    part = settings.part
    settings = dataclasses.replace(
        settings,
        # The one placement of the run (under torchrun, on the GPU of this process).
        placement=place_on(torch.device(ranks.device), "float32", protocol.mixed_precision),
        # The hash the folder's records carry.
        config_hash=config_hash,
        predictions_dir=str(log.predictions_dir()) if save_predictions else None,
        world=ranks.world * (part.count if part is not None else 1),
    )
    units = _plan(domains, source, done, settings, ranks, log)
    if locks is not None:
        locks.setup_done()
    show = settings.progress and ranks.rank == 0
    try:
        new_records = _run_units(units, source, settings, log, show)
    except BaseException:
        ranks.failed()  # the others stop waiting for this rank
        raise
    # Every rank's cells are in runs.jsonl before anyone reads it.
    ranks.wait_for_all(show)
    records = [r for r in log.records() if asked(r)] if log is not None else new_records
    recorded = log.config if log is not None else {**config, "config_hash": config_hash}
    return Results(records, meta={"protocol": {settings.model: protocol_record(recorded)}})


def _described(source, domains, levels, protocol, classes, scan=True):
    """The features of ``domains`` checked as a whole and domain by domain, and what
    ``config.json`` records of them (:meth:`FeatureSource.describe`): one extraction for every
    domain, the stores' own levels, each domain's data (its classes against the shots, the
    holdout, its test labels; with ``scan``, every feature finite). :func:`evaluate` and
    :func:`plan_evaluate` refuse the same runs through it."""

    def checked(domain, arrays, provenance):
        check_domain(domain, *arrays, protocol.shots, scan=scan)
        summary = data_summary(arrays[1], arrays[3], domain, classes.get(domain))
        return {**summary, **inert_settings(arrays, {**summary, **provenance}, protocol.normalize)}

    return source.describe(domains, levels, check=checked)


def _check_domains_present(source, domains, features):
    """Refuse, in one line, domains that ``source`` holds no features for (naming the
    unfinished stores of a feature-store root ``features``, if any)."""
    available = source.available()
    missing = [d for d in domains if d not in available]
    if missing:
        raise ValueError(
            f"no features for domain(s) {missing}; available: {sorted(available)} (choose "
            "the domains with --domains, domains= in Python)" + unfinished_note(features)
        )


def _memory_plan(domains, protocol, source, device, ranks, stored=(), world=None):
    """``(units, budget, host)``: the memory plan of a run on ``device`` (the least memory of
    every rank's), from the domains' sizes, for ``world`` processes (those of ``ranks``);
    ``host`` when the budget is a CPU run's host memory for copies of the features."""
    from . import _device
    from ._train import memplan as _memplan

    sizes, given, in_memory = {}, 0, 0
    for domain in domains:
        X_train, y_train, X_test = source.load(domain, mmap=True)[:3]
        sizes[domain] = _memplan.DomainSize.of(X_train, y_train, X_test)
        given += _device.bytes_on(device, X_train, X_test)  # features given on the device
        in_memory += _device.bytes_in_host_memory(X_train, X_test)
    usable = _device.usable_bytes(device)
    host = usable is None and device.type == "cpu"
    if host:
        # A resident unit copies the rows it reads from memory maps (a store's shards) into
        # host memory; arrays already in memory are used as they are. The copies may fill a
        # share of the memory available; what does not fit streams from the maps, a chunk at a
        # time, so memory is bounded by the plan, not by the data.
        available = _device.host_available_bytes()
        usable = None if available is None else int(_device.HOST_SHARE * available) + in_memory
        budget = ranks.least(usable)
    else:
        budget = ranks.least(None if usable is None else usable - given)
    world = ranks.world if world is None else world
    plan = _memplan.plan_run(domains, sizes, budget, protocol, world, stored, host=host)
    return plan, budget, host


def _plan(domains, source, done, settings, ranks, log):
    """This rank's units still to run: ``(shots, cells, missing cells, resident)``.

    The memory plan (:mod:`imagenet_cog._train.memplan`) is made once for the whole run, from the
    domains' sizes and the memory the device has (the least of every rank's), and recorded
    in the run folder; a resumed run follows the recorded one. A unit cut short by a kill
    (some of its cells appended) reruns whole: lockstep results depend, to rounding, on
    which searches train together, and a resumed run must write what the uninterrupted one
    would have. Only the missing cells are appended.

    A part of a split run (``settings.part``) plans for the processes of every part (its
    job's times the parts) and trains the units of its own: the first part records the plan
    of all, the others follow it, and add to it only units of cells it does not hold.
    """
    from ._train import memplan as _memplan

    device, protocol, part = settings.placement.device, settings.protocol, settings.part
    first = part.index * ranks.world if part is not None else 0  # the plan's ranks of this job
    stored = _memplan.read_plan(log.dir, domains) if log is not None else []
    plan, budget, host = _memory_plan(
        domains, protocol, source, device, ranks, stored, world=settings.world
    )
    ranks.barrier()  # every rank has read the recorded plan before rank 0 rewrites it
    if log is not None and ranks.rank == 0:
        written = plan
        if part is not None:  # the plan of every part: as recorded, but for cells new to it
            kept = {(u.shots, u.cells): u.resident for u in stored}
            written = [
                dataclasses.replace(u, resident=kept.get((u.shots, u.cells), u.resident))
                for u in plan
            ]
        if part is None or [u.to_json() for u in written] != [u.to_json() for u in stored]:
            _memplan.write_plan(log.dir, written, device, protocol)
    every = {(d, n, s) for n in protocol.shots for d in domains for s in protocol.seeds}
    wanted = every - set(done)
    todo = [[(d, s) for d, s in u.cells if (d, u.shots, s) in wanted] for u in plan]
    ours = [first <= u.rank < first + ranks.world for u in plan]  # this job's units
    scope = every
    if part is not None:
        scope = every & {(d, u.shots, s) for u, o in zip(plan, ours) if o for d, s in u.cells}
    left = scope & wanted
    talk = (settings.progress or settings.verbose) and ranks.rank == 0
    whose = f"part {part}: " if part is not None else ""
    if talk and len(left) < len(scope):  # a resumed run says so before its plan
        print(
            f"{whose}{len(scope) - len(left)} of {len(scope)} cells done"
            + (f", resuming the other {len(left)}" if left else ": nothing left to train"),
            flush=True,
        )
    if talk and any(t for t, o in zip(todo, ours) if o):
        shown = [u for u, t, o in zip(plan, todo, ours) if t and o]
        print(
            whose + _memplan.describe_plan(shown, budget, device, protocol, host=host), flush=True
        )
    return [
        (u.shots, list(u.cells), t, u.resident)
        for u, t in zip(plan, todo)
        if t and u.rank == first + ranks.rank
    ]


def _unit_arrays(source, cells):
    return {d: source.training(d) for d in dict.fromkeys(d for d, _ in cells)}


def _run_units(units, source, settings, log, progress):
    from tqdm.auto import tqdm

    total = sum(len(u[2]) for u in units)
    bar = tqdm(total=total, desc="ImageNet-CoG cells", unit="cell", disable=not progress)
    records = []
    missing = {(d, n, s) for n, _, todo, _ in units for d, s in todo}

    def finish(recs):
        recs = [r for r in recs if (r["domain"], r["shots"], r["seed"]) in missing]
        for rec in recs:
            # The versions of the process that made the cell: a folder resumed with another
            # Optuna attributes each cell to its own.
            rec["versions"] = settings.versions
            if log is not None:
                log.append(rec)
            records.append(rec)
        bar.update(len(recs))

    n_jobs = settings.n_jobs
    use_jobs = n_jobs not in (None, 1) and settings.placement.device.type != "cuda"
    try:
        if use_jobs:
            from joblib import Parallel, delayed

            # Bars of several worker processes would overwrite each other: overall only.
            quiet = dataclasses.replace(settings, progress=False)
            jobs = (
                delayed(_run_unit)(n, cells, _unit_arrays(source, cells), quiet, resident)
                for n, cells, _, resident in units
            )
            for recs in Parallel(n_jobs=n_jobs, return_as="generator_unordered")(jobs):
                finish(recs)
        else:
            # A unit's domains stay on the device, whole, for the next units of the same cells
            # when their all-data unit is resident: holding them whole takes no more memory
            # than that unit does (the same searches and trials, no more rows, batches or steps).
            whole = {frozenset(cells) for n, cells, _, resident in units if n == "all" and resident}
            keep = {}
            for n, cells, _, resident in units:
                bar.set_postfix_str(f"N={n}, {len(cells)} searches")
                mine = keep if resident and frozenset(cells) in whole else None
                if mine is None:
                    keep.clear()  # the memory the unit was planned with
                arrays = _unit_arrays(source, cells)
                finish(_run_unit(n, cells, arrays, settings, resident, mine))
            keep.clear()
    finally:
        bar.close()
        if settings.placement.device.type == "cuda":
            import torch

            # The plan reserved most of the GPU: its cached blocks go back to the driver, so
            # that what this process runs next (cuBLAS creating a handle, another library)
            # finds the memory free.
            torch.cuda.empty_cache()
    return records
