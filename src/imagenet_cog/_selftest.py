"""``imagenet-cog selftest``: one table that says whether this machine runs the library right.

:func:`run_selftest` runs six short phases and returns a :class:`SelftestReport`, whose
:meth:`~SelftestReport.table` is meant to be pasted into a bug report:

* the environment: library, Python, OS, CPU, torch, CUDA and its driver, the GPU, torchvision,
  Optuna, NumPy, scikit-learn, Pillow;
* the fast SGD step against the eager one: the same small problem trained by
  :func:`~imagenet_cog._train.engine.train_many` both ways, as the largest weight difference, and
  whether the fast path really ran (on CUDA the compiled step replayed from CUDA graphs, as
  ``evaluate`` runs it; on the CPU the fused step's plumbing, uncompiled);
* the tensor JPEG decoder against Pillow, on the real photos shipped in
  ``imagenet_cog/data/photos``: the cosine of their features, and the difference of the
  preprocessed pixels;
* an all-reduce across the processes of ``torchrun`` (NCCL on CUDA, Gloo on the CPU);
* milliseconds per trial-step with 1, 5 and 30 searches in lockstep, at ImageNet-CoG's shape on
  CUDA (2048-d features, 1000 classes, batches of 1024), smaller on the CPU;
* images per second: decoding and preprocessing alone, the network alone, and the whole
  extraction.

Each phase reports on stderr as it ends. Nothing here is a benchmark against a baseline (those
are in ``benchmarks/``): the figures tell whether a machine is in the expected range.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import platform
import sys
import time
import warnings
from datetime import datetime, timedelta, timezone

import numpy as np
import torch

from ._base import data_path
from ._device import resolve_device
from ._distributed import join_group, torchrun_env
from ._grid import Protocol
from ._models.registry import load_model
from ._train.engine import DeviceData, TrainConfig, forced_step, train_many
from ._version import __version__
from .features import FeatureExtractor

#: The phases, in the order they run (the all-reduce first, so that the other ranks of a
#: torchrun job can leave while rank 0 runs the rest).
PHASES = ("allreduce", "environment", "step", "decoder", "trial-steps", "throughput")
#: Largest weight difference of the fast step against the eager one that passes (float32).
STEP_BOUND = 1e-4
#: Smallest cosine of the tensor decoder's features with Pillow's that passes.
COSINE_BOUND = 0.99
#: Largest mean difference of the two decoders' preprocessed pixels that passes (8-bit levels).
PIXEL_BOUND = 2.0
#: The command that runs the all-reduce check.
TORCHRUN_HINT = "torchrun --nproc-per-node N -m imagenet_cog selftest"

# Sizes per device type: the CPU ones keep the test suite fast.
_SIZES = {
    "cuda": {
        "step": {"n": 12_000, "d": 2048, "classes": 1000, "subset": 2_500, "batch": 1024},
        "trial": {"n": 16 * 1024, "d": 2048, "classes": 1000, "batch": 1024, "epochs": (1, 5)},
        "model": "torchvision:resnet50:none",
        "images": 1024,
        "batch": 256,
        "allreduce_mb": 256,
    },
    "cpu": {
        "step": {"n": 3_000, "d": 64, "classes": 20, "subset": 700, "batch": 256},
        "trial": {"n": 2 * 1024, "d": 64, "classes": 50, "batch": 1024, "epochs": (1, 3)},
        "model": "torchvision:resnet18:none",
        "images": 4,
        "batch": 4,
        "allreduce_mb": 4,
    },
}


@dataclasses.dataclass
class Row:
    """One line of the table.

    ``status`` is ``"ok"``, ``"FAIL"``, ``"warn"``, ``"skip"`` or ``""`` (information only);
    ``value`` is the number the row reports, when it has one.
    """

    check: str
    status: str
    result: str
    details: str = ""
    value: float | None = None


@dataclasses.dataclass
class SelftestReport:
    """The rows of one self-test, in table order, and how it ran."""

    device: str
    rows: list
    started: str
    seconds: float
    cpu_seconds: float = float("nan")
    load: tuple = ()

    @property
    def failed(self):
        """The rows whose check failed."""
        return [r for r in self.rows if r.status == "FAIL"]

    def row(self, check):
        """The row named ``check``."""
        for r in self.rows:
            if r.check == check:
                return r
        raise KeyError(check)

    def to_dict(self):
        """The report as plain data (what ``imagenet-cog selftest --json`` writes); a value
        that is not a finite number is ``None``, so that the JSON is strict."""

        def finite(x):
            return x if x is None or math.isfinite(x) else None

        rows = [dataclasses.asdict(r) | {"value": finite(r.value)} for r in self.rows]
        return {
            "imagenet_cog": __version__,
            "device": self.device,
            "started": self.started,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": finite(round(self.cpu_seconds, 3)),
            "load": list(self.load),
            "failed": [r.check for r in self.failed],
            "rows": rows,
        }

    def table(self):
        """The table as text: a header line, then one line per row."""
        widths = [
            max([len(name), *(len(getattr(r, name)) for r in self.rows)])
            for name in ("check", "status", "result")
        ]
        head = (
            f"imagenet-cog selftest: imagenet_cog {__version__}, device {self.device}, "
            f"{self.started}, {self.seconds:.1f} s"
        )
        lines = [head]
        if self.load:
            # The speed rows mean little on a loaded machine: say how loaded it was.
            cores = self.cpu_seconds / self.seconds if self.seconds > 0 else float("nan")
            lines.append(
                f"machine load: {self.load[0]:.2f} at the start, {self.load[1]:.2f} at the end "
                f"(1-minute load average, {os.cpu_count()} cores); this process got "
                f"{self.cpu_seconds:.1f} s of CPU time in {self.seconds:.1f} s "
                f"({cores:.1f} cores)"
            )
        cols = ("check", "status", "result", "details")
        lines.append("  ".join(c.ljust(w) for c, w in zip(cols, [*widths, 0])).rstrip())
        lines.append("  ".join("-" * w for w in [*widths, 7]))
        for r in self.rows:
            cells = (r.check, r.status, r.result)
            lines.append(
                ("  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + r.details).rstrip()
            )
        failed = self.failed
        warned = [r.check for r in self.rows if r.status == "warn"]
        end = (
            f"{len(failed)} check(s) failed: " + ", ".join(r.check for r in failed)
            if failed
            else "no check failed"
        )
        lines.append(end + (f"; warnings: {', '.join(warned)}" if warned else ""))
        return "\n".join(lines)


def _log(message):
    print(f"selftest: {message}", file=sys.stderr, flush=True)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _warning_text(caught):
    """One line naming the distinct warnings caught in a phase, or ``""``."""
    seen = list(
        dict.fromkeys(f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught)
    )
    return "; ".join(seen)


def _split_warnings(caught):
    """The warnings that concern the row (its status becomes ``warn``), and the deprecation
    notices of torch or Python (shown as notes: they say nothing about this machine's run,
    e.g. torch 2.11's compiler deprecating ``torch.jit.script_method``)."""
    notice = (DeprecationWarning, PendingDeprecationWarning)
    concerns = [w for w in caught if not issubclass(w.category, notice)]
    notes = [w for w in caught if issubclass(w.category, notice)]
    return _warning_text(concerns), _warning_text(notes)


def _with_notes(text, notes):
    return f"{text}; notes: {notes}" if notes else text


# ------------------------------------------------------------------ environment
def _version(package):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _driver_version():
    """The NVIDIA driver's version from ``nvidia-smi``, else the CUDA driver API's."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            return out.stdout.splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    try:
        api = int(torch._C._cuda_getDriverVersion())
        return f"unknown (CUDA driver API {api // 1000}.{api % 1000 // 10})"
    except Exception:  # noqa: BLE001 - any failure: say it is unknown
        return "unknown"


def _cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_rows(device):
    """The environment, as information rows."""
    rows = [
        Row("imagenet_cog", "", __version__),
        Row("python", "", platform.python_version(), sys.executable),
        Row("os", "", platform.platform()),
        Row(
            "cpu",
            "",
            f"{os.cpu_count()} cores",
            f"{_cpu_name()}, torch uses {torch.get_num_threads()} threads",
        ),
        Row(
            "torch",
            "",
            torch.__version__,
            f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build",
        ),
    ]
    if torch.cuda.is_available():
        cudnn = torch.backends.cudnn.version()
        rows.append(
            Row(
                "cuda",
                "",
                str(torch.version.cuda),
                f"driver {_driver_version()}, cuDNN {cudnn}, "
                f"{torch.cuda.device_count()} GPU(s) visible",
            )
        )
    else:
        rows.append(Row("cuda", "", "not available", "the GPU checks run on the CPU"))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        rows.append(
            Row(
                "gpu",
                "",
                props.name,
                f"{device}, {props.total_memory / 2**30:.1f} GiB, compute capability "
                f"{props.major}.{props.minor}",
            )
        )
    for package in ("torchvision", "optuna", "numpy", "scikit-learn", "pillow"):
        rows.append(Row(package, "", _version(package)))
    return rows


# ------------------------------------------------------------------- all-reduce
def allreduce_row(device, size_mb):
    """The all-reduce check under torchrun: ``(row, rank, device)``; rank 0 outside it."""
    if torchrun_env() is None:
        why = f"needs several processes under torchrun: {TORCHRUN_HINT}"
        return Row("all-reduce", "skip", "not run", why), 0, device
    import torch.distributed as dist

    rank, world, where, created = join_group(str(device), timedelta(minutes=5))
    device = torch.device(where)  # cuda:N (the GPU LOCAL_RANK names) or the device given
    backend = dist.get_backend()
    try:
        small = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(small)
        expected = world * (world + 1) / 2
        correct = bool((small == expected).all())
        big = torch.ones(size_mb * 2**20 // 4, device=device)
        dist.all_reduce(big)  # also the warm-up: connections, buffers
        correct &= bool((big == world).all())
        repeats = 5
        _sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(big)
        _sync(device)
        seconds = (time.perf_counter() - start) / repeats
    finally:
        if created:
            dist.destroy_process_group()
    # The bus bandwidth of a ring all-reduce: each byte crosses 2 (world - 1) / world links.
    bus = size_mb * 2**20 * 2 * (world - 1) / world / seconds / 1e9
    row = Row(
        "all-reduce",
        "ok" if correct else "FAIL",
        f"sum {'right' if correct else 'WRONG'} on {world} ranks",
        f"{backend}; {size_mb} MB in {1e3 * seconds:.1f} ms, bus bandwidth {bus:.1f} GB/s",
        value=float(correct),
    )
    return row, rank, device


# --------------------------------------------------------------- fast vs eager
def _mixture(n, d, classes, seed):
    """l2-normalised Gaussian classes (float32, on the CPU) and their labels."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, d, generator=gen) * 3 / math.sqrt(d)
    y = torch.randint(0, classes, (n,), generator=gen)
    X = means[y] + torch.randn(n, d, generator=gen) / math.sqrt(d)
    return torch.nn.functional.normalize(X, dim=1), y


def step_row(device, size, fast=None):
    """The fast SGD step against the eager one, on the same problem.

    ``fast`` (``train_many``'s arguments for the fast step) defaults to what ``evaluate`` runs
    on CUDA, and to the fused step uncompiled on the CPU. The fast fits report the step that
    trained them and the largest difference of the step's own check against the eager step;
    a check that caught the fast step computing something else fails the row, even though
    the fit went on eagerly (as ``evaluate`` would).
    """
    X, y = _mixture(size["n"], size["d"], size["classes"], seed=0)
    data = DeviceData(X, y, device=device)
    rng = np.random.default_rng(0)
    subset = np.sort(rng.choice(size["n"], size["subset"], replace=False))
    # Two seeds, one on a subset (fewer steps, a partial last batch), two rates on one seed.
    configs = [
        TrainConfig(1.0, 1e-6, seed=22),
        TrainConfig(10.0, 1e-4, seed=22),
        TrainConfig(3.0, 1e-5, seed=37, train_idx=subset),
    ]
    kw = {"n_classes": size["classes"], "protocol": Protocol(epochs=4, batch_size=size["batch"])}
    forced = contextlib.nullcontext()
    if fast is None and device.type == "cuda":  # evaluate's: compiled, replayed from CUDA graphs
        fast = {"compile": "auto"}
    elif fast is None:  # no CUDA graphs and no compiling here: the fused step's plumbing
        fast, forced = {}, forced_step("fused")
    eager = train_many(data, configs, **kw, compile=False)
    stats = {}  # how the fast fits trained: their step, its checks against the eager one
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with forced:
            got = train_many(data, configs, **kw, **fast, stats=stats)
    diff = scale = 0.0
    for a, b in zip(eager, got):
        for u, v in ((a.coef, b.coef), (a.intercept, b.intercept)):
            diff = max(diff, float(np.max(np.abs(u - v))))
            scale = max(scale, float(np.max(np.abs(u))))
    paths = ", ".join(stats.get("step_paths", {})) or "none"
    checked = stats.get("step_check_max_diff")
    fallbacks = stats.get("step_fallbacks", [])
    # The step's own check caught it computing something else than the eager step: evaluate
    # would fall back too, but the fast path is broken here (worth a report).
    caught_wrong = any(" is wrong: " in f or " SGD step ran " in f for f in fallbacks)
    fell_back, notices = _split_warnings(caught)
    finite = all(np.isfinite(r.coef).all() for r in (*eager, *got))
    shape = f"{size['n']} x {size['d']}, {size['classes']} classes, 3 configs, 4 epochs, float32"
    if not finite or not math.isfinite(diff) or diff > STEP_BOUND or caught_wrong:
        status = "FAIL"
    else:
        status = "warn" if fell_back or fallbacks else "ok"
    used = f"path {paths}"
    if checked is not None:
        used += f", its check {checked:.1e} of an update"
    if fell_back:
        used += f", fell back: {fell_back}"
    return Row(
        "fast step vs eager",
        status,
        f"max |dW| {diff:.1e}",
        _with_notes(f"{used}; bound {STEP_BOUND:.0e}, max |W| {scale:.2f}; {shape}", notices),
        value=diff,
    )


# -------------------------------------------------------------------- decoder
def photos():
    """Paths of the real photos shipped for the self-test."""
    folder = data_path("photos")
    return sorted(str(p) for p in folder.iterdir() if p.name.endswith(".jpg"))


def _transform_both(extractor, paths):
    """Features of ``paths`` with Pillow and with the tensor decoder, and what was caught."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pil = extractor.set_params(decoder="pil", resize="pil").transform(paths)
        tensor = extractor.set_params(decoder="torchvision", resize="auto").transform(paths)
    return pil, tensor, caught


def decoder_row(device, model, spec, preprocessing):
    """The tensor decoder's features against Pillow's on the shipped photos (``model``: a
    spec, whose features are where extraction reads them, or a module)."""
    paths = photos()
    ext = FeatureExtractor(
        model,
        preprocessing=preprocessing,
        device=str(device),
        num_workers=0,
        batch_size=len(paths),
    )
    pil, tensor, caught = _transform_both(ext, paths)
    cosine = np.sum(pil * tensor, axis=1)
    gram = pil @ pil.T
    others = float(gram[~np.eye(len(paths), dtype=bool)].mean())  # different photos, for scale
    # The preprocessed pixels themselves (no network, no normalisation), in 8-bit levels.
    raw = FeatureExtractor(
        torch.nn.Identity(),
        layer="output",  # the pixels themselves: a module with no classifier to find
        preprocessing={**preprocessing, "mean": None, "std": None},
        normalize=False,
        device=str(device),
        num_workers=0,
        batch_size=len(paths),
    )
    px_pil, px_tensor, caught_px = _transform_both(raw, paths)
    levels = 255 * np.abs(px_pil - px_tensor)
    worst = float(cosine.min())
    weights = "random weights" if spec.count(":") < 2 or spec.endswith(":none") else "its weights"
    notes, notices = _split_warnings([*caught, *caught_px])
    agree = worst >= COSINE_BOUND and levels.mean() <= PIXEL_BOUND
    status = "ok" if np.isfinite(cosine).all() and agree else "FAIL"
    if status == "ok" and notes:  # e.g. a photo left to Pillow
        status = "warn"
    details = (
        f"{len(paths)} photos, {spec} ({weights}); different photos: {others:.3f}; "
        f"pixels: mean |d| {levels.mean():.2f}, max {levels.max():.0f} of 255; "
        f"bounds: cosine {COSINE_BOUND}, mean |d| {PIXEL_BOUND:.0f}"
        + (f"; {notes}" if notes else "")
    )
    details = _with_notes(details, notices)
    return Row("tensor decoder vs Pillow", status, f"min cosine {worst:.7f}", details, value=worst)


# ----------------------------------------------------------------- trial-steps
def _timed(fn, device):
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def trial_step_rows(device, size):
    """Milliseconds per trial-step with 1, 5 and 30 searches in lockstep (one trial each)."""
    from ._train.engine import _step_mode

    n, d, classes, batch = size["n"], size["d"], size["classes"], size["batch"]
    gen = torch.Generator(device=device).manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, device=device), dim=1)
    y = torch.randint(0, classes, (n,), generator=gen, device=device)
    data = DeviceData(X, y, device=device)
    path = _step_mode("auto", device, data.resident)
    steps = -(-n // batch)
    e1, e2 = size["epochs"]
    shape = f"d={d}, {classes} classes, batch {batch}, {n} rows, float32 (TF32 off), step {path}"
    rows = []
    kw = {"n_classes": classes}

    def epochs(n):  # the protocol's SGD, n epochs of this batch
        return Protocol(epochs=n, batch_size=batch)

    for searches in (1, 5, 30):
        # One trial per search, each its own seed: what evaluate runs after the startup round.
        configs = [TrainConfig(1.0, 1e-6, seed=s) for s in range(searches)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # Makes the step of this shape on these features (compiles, captures, checks it),
            # which the two timed runs replay; their difference cancels what a call costs.
            train_many(data, configs, protocol=epochs(1), **kw)
            t1 = _timed(
                functools.partial(train_many, data, configs, protocol=epochs(e1), **kw), device
            )
            t2 = _timed(
                functools.partial(train_many, data, configs, protocol=epochs(e2), **kw), device
            )
        per_step = (t2 - t1) / ((e2 - e1) * steps)
        how = f"{e2} minus {e1} epochs of {steps} steps"
        if per_step <= 0:  # noise on a busy machine: the whole run instead
            per_step, how = t2 / (e2 * steps), f"{e2} epochs of {steps} steps, whole run"
        ms = 1e3 * per_step / searches
        notes, notices = _split_warnings(caught)
        # The result is per trial and step; the details give the whole step of all searches.
        details = f"{1e3 * per_step:.2f} ms per step of all {searches} ({how}); {shape}"
        rows.append(
            Row(
                f"trial-step, {searches} search{'es' if searches > 1 else ''}",
                "warn" if notes else "",
                f"{ms:.3f} ms/trial-step",
                _with_notes(details + (f"; {notes}" if notes else ""), notices),
                value=ms,
            )
        )
    return rows


# ------------------------------------------------------------------ throughput
def throughput_rows(device, module, spec, preprocessing, n_images, batch):
    """Images per second: decoding and preprocessing, the network, and both through extraction."""
    paths = photos()
    paths = [paths[i % len(paths)] for i in range(n_images)]
    crop = preprocessing["crop"]
    # FeatureExtractor's default workers: none on the CPU, the cores less one with CUDA.
    workers = FeatureExtractor(torch.nn.Identity())._workers(device)
    ext_kw = {
        "preprocessing": preprocessing,
        "device": str(device),
        "batch_size": batch,
        "num_workers": workers,
    }
    rows = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Decoding and preprocessing (the decoder "auto" picks here), then a 3-number pooling.
        pool = FeatureExtractor(
            torch.nn.AdaptiveAvgPool2d(1), layer="output", normalize=False, **ext_kw
        )
        pool.get_preprocessing()  # loads it outside the timing
        seconds = _timed(lambda: pool.transform(paths), device)
        decoder = f"worker path, {pool._resize_name(device)} resize"
        rows.append(
            Row(
                "decode + preprocess",
                "",
                f"{n_images / seconds:.1f} img/s",
                f"{n_images} images ({len(set(paths))} photos repeated), {decoder}, "
                f"{workers} workers",
                value=n_images / seconds,
            )
        )
        x = torch.randn(batch, 3, crop, crop, device=device)
        with torch.inference_mode():
            module(x[:2])  # warm-up: kernel choice
            seconds = _timed(
                lambda: [module(x[: min(batch, n_images - i)]) for i in range(0, n_images, batch)],
                device,
            )
        rows.append(
            Row(
                "model",
                "",
                f"{n_images / seconds:.1f} img/s",
                f"{spec}, {crop} px, batch {batch}, float32, no AMP, random input",
                value=n_images / seconds,
            )
        )
        # From the spec, as extraction reads its features (a hub model's own feature layer).
        ext = FeatureExtractor(spec, **ext_kw)
        ext.get_preprocessing()  # loads and hashes the weights outside the timing
        seconds = _timed(lambda: ext.transform(paths), device)
        rows.append(
            Row(
                "end to end",
                "",
                f"{n_images / seconds:.1f} img/s",
                f"FeatureExtractor.transform: files to features, {spec}",
                value=n_images / seconds,
            )
        )
    notes, notices = _split_warnings(caught)
    if notes:
        rows[-1] = dataclasses.replace(
            rows[-1], status="warn", details=f"{rows[-1].details}; {notes}"
        )
    rows[-1] = dataclasses.replace(rows[-1], details=_with_notes(rows[-1].details, notices))
    return rows


# ------------------------------------------------------------------------- run
def _check_device(device):
    """One line for a device the self-test cannot run on (it checks CPUs and CUDA GPUs)."""
    if device is None:
        return
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(
            f"device {device!r} is not a device name; use cpu, cuda or cuda:N"
        ) from None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"the self-test runs on cpu or cuda (cuda:N), not {device!r}")


def run_selftest(device=None, *, model=None, phases=PHASES, log=_log):
    """Run the self-test; the report, or ``None`` on a torchrun rank other than 0.

    Parameters
    ----------
    device : str, optional
        ``None`` is CUDA when available, else the CPU. Under torchrun each process takes the
        GPU its ``LOCAL_RANK`` names.
    model : str, optional
        The network of the decoder and throughput checks; defaults to
        ``torchvision:resnet50:none`` on CUDA and ``torchvision:resnet18:none`` on the CPU:
        random weights, chosen on purpose (no warning about them). Random weights understate how much the decoders differ: pass a spec with
        weights (``torchvision:resnet50:IMAGENET1K_V2``) for a figure that transfers.
    phases : sequence of str
        Which of :data:`PHASES` to run (the table holds their rows only); at least one.
    log : callable
        Receives one line as each phase ends.
    """
    phases = list(phases)
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise ValueError(f"unknown self-test phases {sorted(unknown)}; choose from {PHASES}")
    if not phases:
        raise ValueError(f"no self-test phase chosen; choose from {PHASES}")
    _check_device(device)
    started, cpu_started, load_started = time.perf_counter(), time.process_time(), _load()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    device = resolve_device(device)
    found = {}

    def phase(name, fn):
        t = time.perf_counter()
        rows = fn()
        rows = rows if isinstance(rows, list) else [rows]
        found[name] = rows
        summary = (
            "; ".join(f"{r.check}: {r.status + ' ' if r.status else ''}{r.result}" for r in rows)
            if name != "environment"
            else f"{len(rows)} rows"
        )
        log(f"{name} done in {time.perf_counter() - t:.1f} s: {summary}")

    if "allreduce" in phases:
        t = time.perf_counter()
        row, rank, device = allreduce_row(device, _SIZES[_kind(device)]["allreduce_mb"])
        found["allreduce"] = [row]
        log(f"allreduce done in {time.perf_counter() - t:.1f} s: {row.result} ({row.details})")
        if rank != 0:
            return None
    elif (torchrun_env() or (0,))[0] != 0:  # under torchrun, without the all-reduce: rank 0 only
        return None
    size = _SIZES[_kind(device)]
    if "environment" in phases:
        phase("environment", lambda: environment_rows(device))
    if "step" in phases:
        phase("step", lambda: step_row(device, size["step"]))
    spec = model or size["model"]
    if {"decoder", "throughput"} & set(phases):
        # The preprocessing the spec calls for (its model-zoo preset), then the network itself.
        preprocessing = FeatureExtractor(spec, device="cpu").get_preprocessing()
        module = load_model(spec).to(device)
    if "decoder" in phases:
        phase("decoder", lambda: decoder_row(device, spec, spec, preprocessing))
    if "trial-steps" in phases:
        phase("trial-steps", lambda: trial_step_rows(device, size["trial"]))
    if "throughput" in phases:
        phase(
            "throughput",
            lambda: throughput_rows(
                device, module, spec, preprocessing, size["images"], size["batch"]
            ),
        )
    order = ("environment", "step", "decoder", "allreduce", "trial-steps", "throughput")
    rows = [r for name in order for r in found.get(name, [])]
    load = (load_started, _load()) if load_started is not None else ()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return SelftestReport(str(device), rows, stamp, seconds, cpu, load)


def _load():
    """The 1-minute load average, or None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _kind(device):
    return "cuda" if device.type == "cuda" else "cpu"
