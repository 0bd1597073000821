"""GPU acceptance: every GPU path of imagenet_cog run, checked and timed on one GPU, in one command.

::

    nox -s gpu                          # on a machine with a GPU (docs/guide/cost.rst)
    nox -s gpu -- --dry-run             # the phases and their expected times, on any machine
    python benchmarks/gpu_acceptance.py --budget 480 --out gpu-acceptance --only selftest,protocol

The phases, in the order they run (the most telling first, so that a short budget keeps them):

- ``gemm``: the matrix products of CoG's SGD step (1024 x 2048 by 2048 x 1000 classes, one
  trial and 30 stacked) in float32 without TF32, TF32 and bfloat16: the FLOP floor every
  timing below is compared with, measured on this GPU in this run;
- ``extract``: ``bench_extract.py`` at ImageNet's image sizes: the data loading alone and
  files to features by each path (the worker path with Pillow's and torch's resize, the
  tensor path with nvJPEG, DALI when installed) against a Pillow DataLoader loop, the
  workers' per-stage split, and the network alone with TF32 off and on;
- ``protocol-30``: ``bench_protocol.py`` with 30 searches in lockstep (6 domains x 5 seeds,
  1000 classes, 2048-d, 100 images a class) for 10 epochs, ``evaluate``'s defaults: the
  all-data and few-shot rates against the products of one lockstep step, timed in the same
  run;
- ``cuda-tests``: the test suite's CUDA tests (``pytest -m gpu``);
- ``step``: ``bench_step.py``, ms per trial-step of the four lockstep shapes, eager and
  compiled, float32 and bfloat16, 10 epochs, each against its products alone timed in the
  same run;
- ``extract-fidelity``: the same script's fidelity phases on the GPU: each path's pixels
  and features against the exact Pillow path with real ImageNet weights (nvJPEG included),
  and the batched exact resize run on the GPU against Pillow's pixels;
- ``selftest``: ``imagenet-cog selftest --device cuda`` (the fused step against the eager one,
  nvJPEG against Pillow, trial-steps, images per second);
- ``protocol``: ``bench_protocol.py`` on IN-1K at full size (1.1M x 2048, 1000 classes, 9 shots
  x 5 seeds x 30 trials) for ``--epochs`` epochs, float32 as ``evaluate`` runs by default,
  with the official loop on one cell as the anchor;
- ``kmeans``: k-means at IN-1K's size (1,281,167 x 2048, k = 1000) on the GPU;
- ``knn``: ``bench_knn.py``, DINO's weighted k-NN at IN-1K's size (1,281,167 training x 50,000
  test rows x 2048, k = 10, 20, 100, 200) against scikit-learn's ``KNeighborsClassifier``
  (timed on 256 test rows, extrapolated);
- ``protocol-bf16``, ``protocol-tf32``: the protocol phase with those opt-in precisions;
- ``scale``: the scale ladder's full-size rung on the GPU, when ``benchmarks/bench_scale.py``
  is in the tree.

Each phase runs in its own process, prints as it goes, and its output and JSON land in
``--out``. A phase whose expected time (measured or computed) exceeds what is left of ``--budget`` is skipped with a
line that says so; a phase still running when the budget ends is stopped. The run ends with
one table: each figure with its ratio to the FLOP floor measured in the ``gemm`` phase or to
its stated anchor (the official loop, the DataLoader loop). Nothing asserts a time; the exit
status is 1 when a check fails (a test, a self-test row, a phase that crashed).
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

print = functools.partial(print, flush=True)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: CoG's SGD step: a batch of 1024 rows of 2048 features, 1000 classes.
BATCH, FEATURES, CLASSES = 1024, 2048, 1000
#: One trial-step: the logits and the weight gradient, each 2 x 1024 x 2048 x 1000 FLOP.
TRIAL_STEP_FLOP = 4 * BATCH * FEATURES * CLASSES
#: IN-1K's training images, the size of k-means in the analyses.
IN1K_TRAIN = 1_281_167


@dataclasses.dataclass
class Phase:
    """One phase: what it runs, and its time on one H100 (``basis``: measured or computed)."""

    name: str
    what: str
    seconds: float  # on one H100, measured or computed: ``basis`` says which, and from what
    basis: str
    argv: callable  # (args, out folder) -> command line, or a string saying why it cannot run


def _py(*argv):
    return [sys.executable, *map(str, argv)]


def _bench(script, *argv):
    return _py(HERE / script, *argv)


def _gpu_test_files():
    """The test files that hold a test marked ``gpu`` (collecting only them keeps the phase
    free of the docs tools the rest of the suite imports)."""
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").glob("test_*.py")
        if "mark.gpu" in p.read_text(encoding="utf-8")
    )


def _protocol(precision, only=None):
    def argv(args, out):
        extra = ["--only", only] if only else []
        return _bench(
            "bench_protocol.py",
            "--device",
            args.device,
            "--domains",
            "in1k",
            "--epochs",
            args.epochs,
            "--precision",
            precision,
            *extra,
            "--json",
            out / f"protocol-{precision}.json",
        )

    return argv


def _extract(only, name, *extra):
    def argv(args, out):
        return _bench(
            "bench_extract.py",
            "--device",
            args.device,
            "--only",
            only,
            *extra,
            "--json",
            out / f"{name}.json",
        )

    return argv


def _scale(args, out):
    script = HERE / "bench_scale.py"
    if not script.is_file():
        return "benchmarks/bench_scale.py is not in this tree"
    return _py(
        script,
        "protocol",
        "--device",
        args.device,
        "--rungs",
        "100",
        "--work",
        "/tmp/imagenet_cog_scale",
        "--json",
        out / "scale.json",
    )


PHASES = (
    Phase(
        "gemm",
        "the step's matrix products: the FLOP floor",
        10,
        "measured on one H100 (2026-11-27): 4.9 and 5.3 s",
        lambda a, out: _py(__file__, "--measure-gemm", out / "gemm.json", "--device", a.device),
    ),
    Phase(
        "extract",
        "bench_extract: ResNet-50 at ImageNet's sizes, each path against a Pillow loop",
        90,
        "computed: writing 2,048 JPEGs (about 10 s on 16 cores), then 5 loaders and 4 to 5 "
        "extractions of 2,048 images at 500 to 4,000 img/s, the network alone twice",
        _extract("stages,loaders,extract,model", "extract", "--images", 2048, "--repeats", 1),
    ),
    Phase(
        "protocol-30",
        "bench_protocol: 30 searches in lockstep, 10 epochs, fp32, rates against the floor",
        330,
        "computed: 6 domains of 100,000 x 2048, shots 1, 8 and all, 5 seeds, 30 trials: 6.8 "
        "PFLOP of SGD products (140 s at the 48 TFLOP/s measured for the floor on one H100), "
        "at 0.6 to 0.8 of it, plus generating the domains, compiling and Optuna",
        lambda a, out: _bench(
            "bench_protocol.py",
            "--device",
            a.device,
            "--domains",
            "in1k,L1,L2,L3,L4,L5",
            "--n-train",
            100,
            "--epochs",
            10,
            "--shots",
            "1,8,all",
            "--only",
            "ours",
            "--json",
            out / "protocol-30.json",
        ),
    ),
    Phase(
        "cuda-tests",
        "the CUDA tests (pytest -m gpu)",
        45,
        "measured on one H100 (2026-11-27): 24 and 34 s for 8 tests",
        lambda a, out: _py(
            "-m",
            "pytest",
            "-m",
            "gpu",
            "-q",
            "-p",
            "no:cacheprovider",
            "--junitxml",
            out / "cuda-tests.xml",
            *_gpu_test_files(),
        ),
    ),
    Phase(
        "step",
        "bench_step: 4 lockstep shapes, eager and compiled, fp32 and bf16, 10 epochs, floor",
        330,
        "computed: 131,072 rows (128 steps an epoch), 4 shapes x 2 steps x 2 precisions of 11 "
        "epochs (1 to make the step, 10 timed), 86 trial-steps a step of all 4 shapes at "
        "0.2-0.4 ms (about 200 s), 8 compiled shapes at 10-20 s each",
        lambda a, out: _bench(
            "bench_step.py",
            "--device",
            a.device,
            "--rows",
            131_072,
            "--epochs",
            10,
            "--precision",
            "fp32,bf16",
            "--json",
            out / "step.json",
        ),
    ),
    Phase(
        "extract-fidelity",
        "bench_extract: pixels and features of each path against Pillow's, real weights",
        90,
        "computed: 1,000 JPEGs through 3 paths for the pixels and 2 networks, and 1,000 of "
        "varied sizes through the batched resize (the CPU's Pillow path is the slow side)",
        _extract("fidelity,resize", "extract-fidelity"),
    ),
    Phase(
        "selftest",
        "imagenet-cog selftest --device cuda",
        60,
        "measured on one H100 (2026-11-27): 41 s, of which the self-test 33 s",
        lambda a, out: _py(
            "-m", "imagenet_cog", "selftest", "--device", a.device, "--json", out / "selftest.json"
        ),
    ),
    Phase(
        "protocol",
        "bench_protocol: IN-1K at full size, fp32 (evaluate's default), official loop on 1 cell",
        320,
        "measured on one H100 (2026-11-27) at 2 epochs: evaluate 250 and 286 s, the official "
        "loop's cell 7 s, generating the domain and starting up about 15 s",
        _protocol("fp32"),
    ),
    Phase(
        "kmeans",
        "k-means at IN-1K's size (1,281,167 x 2048, k=1000, 50 iterations)",
        25,
        "measured on one H100 (2026-11-27): 15 s (7 iterations to converge)",
        lambda a, out: _bench(
            "bench_analysis.py",
            "--device",
            a.device,
            "--only",
            "kmeans",
            "--no-sklearn",
            "--no-cpu",
            "--n",
            IN1K_TRAIN,
            "--d",
            FEATURES,
            "--k",
            CLASSES,
            "--n-init",
            1,
            "--max-iter",
            50,
            "--json",
            out / "kmeans.json",
        ),
    ),
    Phase(
        "knn",
        "bench_knn: k-NN at IN-1K's size (1,281,167 x 50,000 x 2048) against scikit-learn",
        150,
        "computed: 2 searches of 2.6e14 FLOP of float32 products (5 s each at 50 TFLOP/s), "
        "making and copying 11 GB of features (about 30 s), scikit-learn's 5 predictions of "
        "256 test rows (about 15 s each on 16 cores)",
        lambda a, out: _bench(
            "bench_knn.py",
            "--device",
            a.device,
            "--baseline-queries",
            256,
            "--json",
            out / "knn.json",
        ),
    ),
    Phase(
        "protocol-bf16",
        "bench_protocol as above with bf16 features and products (opt-in)",
        150,
        "computed: the protocol phase, evaluate's side only (its time is mostly fixed costs)",
        _protocol("bf16", only="ours"),
    ),
    Phase(
        "protocol-tf32",
        "bench_protocol as above with TF32 products (opt-in)",
        150,
        "computed: the protocol phase, evaluate's side only (its time is mostly fixed costs)",
        _protocol("tf32", only="ours"),
    ),
    Phase(
        "scale",
        "the scale ladder's full-size rung (1.28M x 2048 store on disk) on the GPU",
        240,
        "computed: writing a 10.9 GB store (110 s measured on 2 cores), evaluate --plan, "
        "then evaluate for 1 epoch, 2 trials and the retrain (3,256 trial-steps: seconds)",
        _scale,
    ),
)
NAMES = [p.name for p in PHASES]


# ----------------------------------------------------------------------------- the floor
def measure_gemm(path, device):
    """Time the products of one trial-step (one trial, and 30 trials stacked) at each precision
    and write their TFLOP/s to ``path``."""
    import torch

    device = torch.device(device)
    rows = []
    for precision, dtype, tf32 in (
        ("fp32", torch.float32, False),
        ("tf32", torch.float32, True),
        ("bf16", torch.bfloat16, False),
    ):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for trials in (1, 30):
            a = torch.randn(BATCH, FEATURES, device=device, dtype=dtype)
            w = torch.randn(FEATURES, CLASSES * trials, device=device, dtype=dtype)
            for _ in range(5):
                a @ w
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(50):
                a @ w
            torch.cuda.synchronize(device)
            seconds = (time.perf_counter() - start) / 50
            flop = 2 * BATCH * FEATURES * CLASSES * trials
            rows.append(
                {
                    "precision": precision,
                    "trials": trials,
                    "tflops": round(flop / seconds / 1e12, 2),
                    # Two such products per trial-step (logits, weight gradient).
                    "ms_per_trial_step": round(2 * seconds / trials * 1e3, 5),
                }
            )
            print(
                f"gemm {precision} 1024x2048 @ 2048x{CLASSES * trials}: "
                f"{rows[-1]['tflops']} TFLOP/s"
            )
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(device), "products": rows}
    Path(path).write_text(json.dumps(result, indent=2))


# ------------------------------------------------------------------------------- running
def run_phase(phase, argv, out, seconds_left):
    """Run one phase's command with its output on the terminal and in ``out/<name>.log``;
    stop it when the budget ends. Returns (status, seconds)."""
    import selectors

    log_path = out / f"{phase.name}.log"
    start = time.perf_counter()
    deadline = start + seconds_left
    timed_out = False
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    at_line_start = True

    def show(text, log):
        # Chunks as they come (progress bars end their updates with \r, not \n), each line
        # on the terminal prefixed with the phase's name.
        nonlocal at_line_start
        log.write(text)
        for piece in text.splitlines(True):
            sys.stdout.write((f"[{phase.name}] " if at_line_start else "") + piece)
            at_line_start = piece.endswith(("\n", "\r"))
        sys.stdout.flush()

    with (
        open(log_path, "w") as log,
        subprocess.Popen(
            [str(a) for a in argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # so that the phase's own workers stop with it
        ) as proc,
        selectors.DefaultSelector() as sel,
    ):
        sel.register(proc.stdout, selectors.EVENT_READ)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                timed_out = True
                os.killpg(proc.pid, 9)
                break
            if not sel.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            show(decoder.decode(chunk), log)
        show(decoder.decode(b"", final=True), log)
        proc.wait()
    seconds = time.perf_counter() - start
    if timed_out:
        return f"stopped at the budget's end after {seconds:.0f} s", seconds
    return ("ok" if proc.returncode == 0 else f"FAIL (exit {proc.returncode})"), seconds


def _load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------- summary
@dataclasses.dataclass
class Figure:
    phase: str
    figure: str
    measured: str
    reference: str = ""
    ratio: str = ""
    status: str = ""


def floor_ms(gemm, precision="fp32"):
    """ms per trial-step of the products alone, at the stacked (30-trial) rate of this run."""
    if not gemm:
        return None
    for r in gemm["products"]:
        if r["precision"] == precision and r["trials"] == 30:
            return r["ms_per_trial_step"]
    return None


def _vs_floor(ms, floor):
    if floor is None or not ms:
        return "", ""
    return f"floor {floor:.3f} ms", f"{floor / ms:.2f} of the floor"


def summarize(out, statuses):
    gemm = _load(out / "gemm.json")
    figures = []
    if gemm:
        for r in gemm["products"]:
            figures.append(
                Figure(
                    "gemm",
                    f"{r['precision']} products, {r['trials']} trial(s)",
                    f"{r['tflops']:.1f} TFLOP/s",
                    f"{r['ms_per_trial_step']:.4f} ms/trial-step",
                )
            )
    st = _load(out / "selftest.json")
    if st:
        for r in st["rows"]:
            if r["status"] in ("ok", "FAIL", "warn") or r["check"].startswith(
                ("trial-step", "decode", "model", "end to end")
            ):
                ref, ratio = "", ""
                if r["check"].startswith("trial-step") and r["value"]:
                    ref, ratio = _vs_floor(r["value"], floor_ms(gemm))
                figures.append(Figure("selftest", r["check"], r["result"], ref, ratio, r["status"]))
    junit = out / "cuda-tests.xml"
    if junit.is_file():
        try:
            root = ET.parse(junit).getroot()
            suite = root if root.tag == "testsuite" else root.find("testsuite")
            n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
            passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
            bad = n["failures"] + n["errors"]
            figures.append(
                Figure(
                    "cuda-tests",
                    "pytest -m gpu",
                    f"{passed} passed, {bad} failed, {n['skipped']} skipped",
                    status="FAIL" if bad else "ok",
                )
            )
        except (ET.ParseError, AttributeError):
            figures.append(
                Figure("cuda-tests", "pytest -m gpu", "no readable report", status="FAIL")
            )
    for precision in ("fp32", "bf16", "tf32"):
        pr = _load(out / f"protocol-{precision}.json")
        if not pr or "ours_s" not in pr:
            continue
        name = "protocol" if precision == "fp32" else f"protocol-{precision}"
        epochs = pr["settings"]["epochs"]
        rate = pr["sgd_flop"] / pr["ours_s"] / 1e12
        fl = floor_ms(gemm, precision)
        floor_s = pr["sgd_flop"] / TRIAL_STEP_FLOP * fl / 1e3 if fl else None
        figures.append(
            Figure(
                name,
                f"evaluate, IN-1K full size, {epochs} epochs",
                f"{pr['ours_s']:.0f} s ({rate:.1f} TFLOP/s)",
                f"floor {floor_s:.0f} s" if floor_s else "",
                f"{floor_s / pr['ours_s']:.2f} of the floor" if floor_s else "",
            )
        )
        if "baseline_s" in pr:
            figures.append(
                Figure(
                    name,
                    "official loop, same cells (extrapolated from 1 cell)",
                    f"{pr['baseline_s']:.0f} s",
                    f"evaluate {pr['ours_s']:.0f} s",
                    f"{pr['speedup']:.1f}x faster" if "speedup" in pr else "",
                )
            )
        whole_h = pr["ours_s"] * 6 * 100 / epochs / 3600
        figures.append(
            Figure(
                name,
                "whole protocol, 6 domains x 100 epochs (extrapolated, upper bound)",
                f"{whole_h:.2f} GPU-hours",
                "official README: 37.5 V100-hours (all-data cells)",
            )
        )
        if "whole_protocol_s" in pr:
            figures.append(
                Figure(
                    name,
                    "whole protocol, computed from its work at the all-data cells' rate",
                    f"{pr['whole_protocol_s'] / 3600:.2f} GPU-hours",
                    f"all-data cells at {pr['all_data_tflops']:.1f} TFLOP/s",
                    f"{pr['all_data_tflops'] / (TRIAL_STEP_FLOP / fl / 1e9):.2f} of the floor"
                    if fl
                    else "",
                )
            )
        figures.append(
            Figure(name, "mean top-1 of evaluate", f"{pr.get('mean_top1_ours', float('nan')):.2f}%")
        )
    km = _load(out / "kmeans.json")
    if km and km.get("kmeans"):
        r = km["kmeans"][-1]
        per_iter = r["seconds"] / max(r["n_iter"], 1)
        fl = floor_ms(gemm)
        # Lloyd's distances are the step's fp32 products at another shape; the same rate.
        floor_s = r["flop_per_iter"] / TRIAL_STEP_FLOP * fl / 1e3 if fl else None
        figures.append(
            Figure(
                "kmeans",
                f"{r['n']:,} x {r['d']}, k={r['k']}, {r['n_iter']} iterations",
                f"{r['seconds']:.1f} s ({per_iter:.3f} s/iteration, init included)",
                f"floor {floor_s:.3f} s/iteration" if floor_s else "",
                f"{floor_s / per_iter:.2f} of the floor" if floor_s else "",
            )
        )
    kn = _load(out / "knn.json")
    if kn and kn.get("k_all"):
        fp32 = next(
            (r["tflops"] for r in (gemm or {}).get("products", ()) if r["precision"] == "fp32"),
            None,
        )
        floor_s = kn["plan"]["flop"] / (fp32 * 1e12) if fp32 else None
        for key, label in (("k20", "k=20"), ("k_all", "k=10,20,100,200 from one search")):
            r = kn[key]
            figures.append(
                Figure(
                    "knn",
                    f"KNNProbe, {label}, IN-1K size",
                    f"{r['ours_s']:.1f} s",
                    f"scikit-learn {r['sklearn_s']:.0f} s (extrapolated)",
                    f"{r['ratio']:.0f}x faster",
                )
            )
        figures.append(
            Figure(
                "knn",
                "KNNProbe's products at k=200",
                f"{kn['tflops_ours']:.1f} TFLOP/s",
                f"floor {floor_s:.1f} s" if floor_s else "",
                f"{floor_s / kn['k_all']['ours_s']:.2f} of the floor" if floor_s else "",
            )
        )
    figures += extract_figures(_load(out / "extract.json"), _load(out / "extract-fidelity.json"))
    p30 = _load(out / "protocol-30.json")
    if p30 and "rates" in p30:
        epochs = p30["settings"]["epochs"]
        for name, r in p30["rates"].items():
            if name not in ("all-data cells", "few-shot cells"):
                continue
            figures.append(
                Figure(
                    "protocol-30",
                    f"{name}, {p30['searches_in_lockstep']} searches, {epochs} epochs",
                    f"{r['tflops']:.1f} TFLOP/s ({r['seconds']:.0f} s)",
                    f"floor {p30['floor_tflops']:.1f} TFLOP/s, same run",
                    f"{r['of_floor']:.2f} of the floor",
                )
            )
    sp = _load(out / "step.json")
    if sp:
        for r in sp["timings"]:
            # The step's products alone at its own shape, timed in bench_step's run.
            own = r.get("floor_ms_per_trial_step")
            ref, ratio = _vs_floor(r["ms_per_trial_step"], own or floor_ms(gemm, r["precision"]))
            figures.append(
                Figure(
                    "step",
                    f"{r['shape']}, {r['precision']}, {r['step']}",
                    f"{r['ms_per_trial_step']:.4f} ms/trial-step",
                    ref,
                    ratio,
                )
            )
    sc = _load(out / "scale.json")
    if sc and sc.get("protocol"):
        for r in sc["protocol"]["rungs"]:
            figures.append(
                Figure(
                    "scale",
                    f"evaluate on a {r['rows']:,}-row store ({r['store']}), streamed "
                    f"{not r['resident']}",
                    f"{r['seconds']:.0f} s, peak {r['peak_rss']} host memory",
                    f"evaluate --plan: {r['predicted_s']:.0f} s",
                    f"{r['predicted_vs_measured']:.2f} predicted/measured",
                )
            )
    for name, status in statuses.items():
        if status != "ok":
            figures.append(Figure(name, "phase", status, status="FAIL" if "FAIL" in status else ""))
    return figures


def extract_figures(speed, fidelity):
    """The rows of the extract phases: each path's images/s against the plain Pillow loop, the
    network alone with TF32 off and on, and each path's pixels and features against Pillow's."""
    figures = []
    for key, what in (("loaders", "loading alone"), ("extract", "files to features")):
        for name, r in ((speed or {}).get(key) or {}).items():
            if isinstance(r, dict):
                figures.append(
                    Figure(
                        "extract",
                        f"{what}: {name}",
                        f"{r['img_s']:.0f} img/s",
                        "plain Pillow DataLoader loop",
                        f"{r['vs_plain_loop']:.2f}x",
                    )
                )
    alone = (speed or {}).get("model_alone_img_s") or {}
    if "float32" in alone:
        tf32 = alone.get("tf32")
        figures.append(
            Figure(
                "extract",
                f"network alone ({speed['model']}), float32 / TF32",
                f"{alone['float32']:.0f} / {tf32:.0f} img/s" if tf32 else f"{alone['float32']:.0f}",
                "",
                f"TF32 {tf32 / alone['float32']:.2f}x" if tf32 else "",
            )
        )
    for name, r in ((fidelity or {}).get("fidelity") or {}).items():
        if not isinstance(r, dict):
            continue
        figures.append(
            Figure(
                "extract-fidelity",
                f"{name}: input pixels vs Pillow",
                f"max {r['pixels']['max_levels']}, mean {r['pixels']['mean_levels']:.4f} levels",
            )
        )
        for net, f in r.items():
            if isinstance(f, dict) and "cosine_min" in f:
                figures.append(
                    Figure(
                        "extract-fidelity",
                        f"{name}: {net} features vs Pillow",
                        f"min cosine {f['cosine_min']:.6f}, top-1 unchanged "
                        f"{100 * f['top1_unchanged']:.2f}%",
                    )
                )
    resize = (fidelity or {}).get("resize")
    if resize:
        worst = resize["max_levels_on_device"]
        figures.append(
            Figure(
                "extract-fidelity",
                f"batched exact resize on the device, {resize['images']} images",
                f"max {max(worst.values())} levels from Pillow's",
                status="ok" if max(worst.values()) == 0 else "FAIL",
            )
        )
    return figures


def table(figures):
    cols = ("phase", "figure", "measured", "reference", "ratio", "status")
    cells = [[getattr(f, c) for c in cols] for f in figures]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="the GPU (default: cuda)")
    p.add_argument(
        "--budget", type=float, default=480, help="seconds for all phases (default: 480)"
    )
    p.add_argument("--epochs", type=int, default=2, help="epochs of the protocol phases (2 to 4)")
    p.add_argument("--out", default="gpu-acceptance", help="folder for logs and JSON")
    p.add_argument("--only", default=None, help=f"comma-separated among {', '.join(NAMES)}")
    p.add_argument("--skip", default="", help="comma-separated phases not to run")
    p.add_argument("--dry-run", action="store_true", help="print the phases and their times")
    p.add_argument("--measure-gemm", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for option in ("only", "skip"):
        names = [x.strip() for x in (getattr(args, option) or "").split(",") if x.strip()]
        unknown = sorted(set(names) - set(NAMES))
        if unknown:
            p.error(f"--{option}: unknown phase(s) {unknown}; choose among {', '.join(NAMES)}")
        setattr(args, option, names)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.measure_gemm:
        measure_gemm(args.measure_gemm, args.device)
        return 0
    chosen = [p for p in PHASES if (not args.only or p.name in args.only)]
    chosen = [p for p in chosen if p.name not in args.skip]
    out = Path(args.out).resolve()
    if args.dry_run:
        total = 0.0
        print(f"GPU acceptance: {len(chosen)} phases, budget {args.budget:.0f} s")
        print("times on one H100, each measured (date given) or computed (from what):")
        for p in chosen:
            argv_ = p.argv(args, out)
            fits = total + p.seconds <= args.budget
            total += p.seconds if fits else 0
            state = "" if fits else "  [would be skipped: over the budget]"
            print(f"  {p.name:<14}{p.seconds:>5.0f} s  {p.what}{state}")
            print(f"  {'':<14}        {p.basis}")
            cmd = argv_ if isinstance(argv_, str) else " ".join(map(str, argv_))
            print(f"  {'':<14}        runs: {cmd}")
        print(f"total: {total:.0f} s of {args.budget:.0f} s")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: the GPU acceptance needs a GPU (--dry-run prints its phases)")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    statuses, seconds = {}, {}
    print(
        f"GPU acceptance on {torch.cuda.get_device_name()}: {', '.join(p.name for p in chosen)}; "
        f"budget {args.budget:.0f} s; logs in {out}"
    )
    for phase in chosen:
        left = args.budget - (time.perf_counter() - start)
        argv_ = phase.argv(args, out)
        if isinstance(argv_, str):
            statuses[phase.name] = f"skipped: {argv_}"
            print(f"== {phase.name}: skipped: {argv_}")
            continue
        if phase.seconds > left:
            statuses[phase.name] = (
                f"skipped: {phase.seconds:.0f} s expected, {max(left, 0):.0f} s of the budget left"
            )
            print(f"== {phase.name}: {statuses[phase.name]}")
            continue
        print(f"== {phase.name}: {phase.what} ({phase.seconds:.0f} s expected, {left:.0f} s left)")
        status, took = run_phase(phase, argv_, out, left)
        statuses[phase.name], seconds[phase.name] = status, took
        print(f"== {phase.name}: {status}, {took:.1f} s")
    figures = summarize(out, statuses)
    elapsed = time.perf_counter() - start
    text = (
        f"GPU acceptance, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {elapsed:.0f} s\n"
        + "phase times: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
        + "\n"
        + table(figures)
    )
    print("\n" + text)
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(
        json.dumps(
            {
                "statuses": statuses,
                "seconds": seconds,
                "figures": [dataclasses.asdict(f) for f in figures],
            },
            indent=2,
        )
    )
    failed = any(f.status == "FAIL" for f in figures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
