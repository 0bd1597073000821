"""``imagenet-cog selftest``: its table on the CPU, its checks, its photos, torchrun."""

import hashlib
import io
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import subprocess_env
from PIL import Image

from imagenet_cog import _selftest, cli
from imagenet_cog._data.tensor_decode import jpeg_refusal
from imagenet_cog._train import fused as _fused

ROWS = [
    "imagenet_cog",
    "python",
    "os",
    "cpu",
    "torch",
    "cuda",
    "torchvision",
    "optuna",
    "numpy",
    "scikit-learn",
    "pillow",
    "fast step vs eager",
    "tensor decoder vs Pillow",
    "all-reduce",
    "trial-step, 1 search",
    "trial-step, 5 searches",
    "trial-step, 30 searches",
    "decode + preprocess",
    "model",
    "end to end",
]


@pytest.fixture(scope="module")
def cpu_run():
    """One whole self-test on the CPU, and the lines it logged as its phases ended."""
    lines = []
    report = _selftest.run_selftest("cpu", log=lines.append)
    return report, lines


def test_the_cpu_table_has_every_row_and_sane_numbers(cpu_run):
    report, _ = cpu_run
    assert [r.check for r in report.rows] == ROWS
    assert not report.failed, report.table()
    step = report.row("fast step vs eager")
    assert step.status == "ok" and 0 <= step.value < _selftest.STEP_BOUND
    assert "path fused" in step.details
    decoder = report.row("tensor decoder vs Pillow")
    assert decoder.status == "ok" and _selftest.COSINE_BOUND <= decoder.value <= 1 + 1e-6
    assert "4 photos" in decoder.details
    for searches in ("1 search", "5 searches", "30 searches"):
        row = report.row(f"trial-step, {searches}")
        assert math.isfinite(row.value) and row.value > 0
        assert "d=64, 50 classes, batch 1024" in row.details  # the shape is printed
        assert "float32 (TF32 off), step eager" in row.details
    for name in ("decode + preprocess", "model", "end to end"):
        row = report.row(name)
        assert math.isfinite(row.value) and row.value > 0
        assert row.result.endswith(" img/s")
    assert report.row("torch").result == torch.__version__
    assert report.row("cuda").result == "not available"


def test_the_all_reduce_row_says_how_to_run_it_outside_torchrun(cpu_run):
    row = cpu_run[0].row("all-reduce")
    assert (row.status, row.result) == ("skip", "not run")
    assert "torchrun --nproc-per-node N -m imagenet_cog selftest" in row.details


def test_each_phase_reports_as_it_ends(cpu_run):
    report, lines = cpu_run
    assert [line.split(" done in ")[0] for line in lines] == list(_selftest.PHASES)
    assert all(re.search(r" done in \d+\.\d s: ", line) for line in lines)
    table = report.table()
    assert table.splitlines()[0].startswith("imagenet-cog selftest: imagenet_cog ")
    for row in report.rows:
        assert row.check in table and row.result in table
    assert table.splitlines()[-1] == "no check failed"


def test_a_wrong_fast_step_fails_its_check(monkeypatch):
    real = _fused.grad_logits

    def wrong(z, b, y, w, loss, K, C):
        g, g_b = real(z, b, y, w, loss, K, C)
        return 1.5 * g, 1.5 * g_b

    monkeypatch.setattr(_fused, "grad_logits", wrong)
    row = _selftest.step_row(torch.device("cpu"), _selftest._SIZES["cpu"]["step"])
    # The step's own check catches it and the fit goes on eagerly: the weights are right, and
    # the row still fails, naming what the check saw.
    assert row.status == "FAIL" and row.value <= _selftest.STEP_BOUND
    assert "path eager" in row.details and "differs from the eager step" in row.details


def test_a_fast_step_that_falls_back_to_eager_is_reported(monkeypatch):
    def broken(fn, **kw):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    size = _selftest._SIZES["cpu"]["step"]
    row = _selftest.step_row(torch.device("cpu"), size, fast={"compile": True})
    assert row.status == "warn"  # the arithmetic is right, but the fast path did not run
    assert "path fused" in row.details and "fell back" in row.details
    assert "no compiler here" in row.details


def test_a_deprecation_notice_of_torch_is_a_note_not_a_fallback(monkeypatch):
    # What an H100 with torch 2.11 showed: torch.compile warns that torch.jit.script_method is
    # deprecated, while the compiled step runs and passes its check. (The step is left
    # uncompiled here: what counts is the notice on the way.)
    def compile_with_a_notice(fn, **kw):
        warnings.warn("`torch.jit.script_method` is deprecated", DeprecationWarning, stacklevel=1)
        return fn

    monkeypatch.setattr(torch, "compile", compile_with_a_notice)
    size = _selftest._SIZES["cpu"]["step"]
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # the notice reaches the row, as without -W error
        row = _selftest.step_row(torch.device("cpu"), size, fast={"compile": True})
    assert row.status == "ok" and "fell back" not in row.details
    assert "path compiled" in row.details and "DeprecationWarning" not in row.details


def test_deprecation_notices_are_notes_and_other_warnings_concerns():
    # e.g. Python 3.12's notice that DataLoader workers fork a multi-threaded process
    def caught(category, text):
        return warnings.WarningMessage(category(text), category, "x.py", 1)

    notice = caught(DeprecationWarning, "This process is multi-threaded, use of fork()")
    concern = caught(UserWarning, "1 image decoded with Pillow")
    assert _selftest._split_warnings([notice, concern]) == (
        "UserWarning: 1 image decoded with Pillow",
        "DeprecationWarning: This process is multi-threaded, use of fork()",
    )
    assert _selftest._with_notes("details", "") == "details"


def test_a_tensor_decoder_that_differs_from_pillow_fails_its_check(monkeypatch):
    from imagenet_cog._data.tensor_decode import TensorDecoder

    real = TensorDecoder._resize
    # A mirrored image: the kind of slip that random weights hide in the cosine (their
    # features of different photos are close), but not in the pixels.
    monkeypatch.setattr(TensorDecoder, "_resize", lambda self, *a: real(self, *a).flip(-1))
    # Its features: the input of its classifier, the flattened convolution.
    head = torch.nn.Linear(4 * 62 * 62, 2)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), head)
    p = {"resize": 64, "crop": 64, "interpolation": "bicubic", "mean": None, "std": None}
    row = _selftest.decoder_row(torch.device("cpu"), module, "a test network", p)
    assert row.status == "FAIL"


def test_the_photos_are_real_jpegs_with_their_provenance():
    from imagenet_cog._base import data_path

    provenance = data_path("PROVENANCE.rst").read_text(encoding="utf-8")
    paths = _selftest.photos()
    assert len(paths) == 4
    for path in paths:
        data = Path(path).read_bytes()
        assert len(data) < 64_000  # small: tens of KB
        assert jpeg_refusal(data) is None  # the tensor decoder takes it
        with Image.open(io.BytesIO(data)) as image:
            assert image.format == "JPEG"
            assert min(image.size) >= 150
            # a photo, not a synthetic pattern: many distinct grey levels
            assert len(np.unique(np.asarray(image.convert("L")))) > 200
        name = Path(path).name
        assert f"``{name}``" in provenance
        assert hashlib.sha256(data).hexdigest() in provenance  # the bytes described


def test_the_table_ends_with_the_failed_and_warned_checks():
    rows = [
        _selftest.Row("a", "ok", "1"),
        _selftest.Row("b", "warn", "2", "fell back"),
        _selftest.Row("c", "FAIL", "3"),
    ]
    lines = _selftest.SelftestReport("cpu", rows, "now", 1.0).table().splitlines()
    assert lines[-1] == "1 check(s) failed: c; warnings: b"
    assert lines[4].split() == ["b", "warn", "2", "fell", "back"]
    empty = _selftest.SelftestReport("cpu", [], "now", 1.0).table()
    assert empty.splitlines()[-1] == "no check failed"


def test_unknown_phases_are_refused():
    with pytest.raises(ValueError, match="unknown self-test phases"):
        _selftest.run_selftest("cpu", phases=["environment", "gpu"])


def _report(status):
    rows = [
        _selftest.Row("numpy", "", np.__version__),
        _selftest.Row("fast step vs eager", status, "max |dW| 1.0e-06", "path fused"),
    ]
    return _selftest.SelftestReport("cpu", rows, "2026-01-01 00:00 UTC", 1.0)


@pytest.mark.parametrize(("status", "code"), [("ok", 0), ("FAIL", 1)])
def test_the_cli_prints_the_table_and_exits_1_on_a_failed_check(monkeypatch, capsys, status, code):
    seen = {}

    def fake(device, *, model, phases):
        seen.update(device=device, model=model, phases=list(phases))
        return _report(status)

    monkeypatch.setattr(_selftest, "run_selftest", fake)
    assert cli.main(["selftest", "--device", "cpu", "--only", "environment,step"]) == code
    out = capsys.readouterr().out
    assert "fast step vs eager" in out and "max |dW| 1.0e-06" in out
    assert seen == {"device": "cpu", "model": None, "phases": ["environment", "step"]}
    assert ("1 check(s) failed: fast step vs eager" in out) == (status == "FAIL")


def test_the_cli_writes_the_rows_as_json(monkeypatch, capsys, tmp_path):
    import json

    report = _report("ok")
    report.rows.append(_selftest.Row("trial-step, 1 search", "", "nan", value=float("nan")))
    monkeypatch.setattr(_selftest, "run_selftest", lambda device, **kw: report)
    path = tmp_path / "selftest.json"
    assert cli.main(["selftest", "--device", "cpu", "--json", str(path)]) == 0
    data = json.loads(path.read_text())  # strict JSON: a NaN value is written as null
    assert data["device"] == "cpu" and data["failed"] == []
    assert [r["check"] for r in data["rows"]] == [
        "numpy",
        "fast step vs eager",
        "trial-step, 1 search",
    ]
    assert data["rows"][1]["result"] == "max |dW| 1.0e-06" and data["rows"][2]["value"] is None


def test_the_cli_refuses_an_unknown_phase(capsys):
    assert cli.main(["selftest", "--device", "cpu", "--only", "gpu"]) == 2
    assert "unknown self-test phases ['gpu']" in capsys.readouterr().err


@pytest.mark.slow
def test_all_reduce_under_torchrun_with_two_processes():
    env = subprocess_env(OMP_NUM_THREADS="1")
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    done = subprocess.run(
        [
            *launcher,
            "-m",
            "imagenet_cog",
            "selftest",
            "--device",
            "cpu",
            "--only",
            "environment,allreduce",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("all-reduce")]
    assert len(rows) == 1, done.stdout  # one table: rank 0's
    assert re.match(r"all-reduce\s+ok\s+sum right on 2 ranks\s+gloo; 4 MB in ", rows[0]), rows[0]
    assert done.stdout.count("imagenet-cog selftest:") == 1


# ------------------------------------------- the benchmarks: precision stated, progress shown
BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import importlib

    return importlib.import_module


def test_the_cuda_benchmarks_default_to_evaluates_precision(bench):
    # float32 features, no TF32, the default compile: what evaluate does by default
    protocol, probe = bench("bench_protocol"), bench("bench_probe")
    assert protocol.parse_args(["--device", "cuda"]).precision == "fp32"
    assert protocol.PRECISIONS["fp32"][0] is None  # evaluate's mixed_precision default
    assert probe.settings(probe.parse_args(["--device", "cuda"]))["precision"] == "fp32"
    assert protocol.parse_args(["--device", "cuda", "--precision", "bf16"]).precision == "bf16"


def test_the_official_loop_reports_its_progress(bench):
    official = bench("_official")
    gen = torch.Generator().manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(300, 8, generator=gen), dim=1)
    y = torch.arange(300) % 3

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    rows = torch.arange(250)
    official.official_train(X, y, rows, X[250:], y[250:], 1.0, 0.0, 3, gen, batch_size=100, bar=bar)
    assert bar.n == 3 * 3  # 3 epochs of 3 batches (100, 100, 50)


def _run_bench(script, *args):
    env = subprocess_env()
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )


@pytest.mark.slow
def test_bench_protocol_states_its_precision_and_shows_the_official_loop(tmp_path):
    out = tmp_path / "protocol.json"
    done = _run_bench("bench_protocol.py", "--quick", "--json", str(out))
    assert (
        "precision of evaluate: fp32: float32 features, no TF32, compile='auto' "
        "(evaluate's defaults); the official loop: float32"
    ) in done.stdout
    assert "imagenet_cog.evaluate (fp32)" in done.stdout
    assert "official loop: 100%" in done.stderr  # its progress bar
    import json

    assert json.loads(out.read_text())["precision"].endswith("(evaluate's defaults)")


@pytest.mark.slow
def test_bench_step_labels_each_precision():
    done = _run_bench("bench_step.py", "--quick", "--precision", "fp32,bf16")
    rows = [line for line in done.stdout.splitlines() if "trial" in line and "ms" not in line]
    assert len(rows) == 8  # 4 shapes x 2 precisions, eager on the CPU
    assert sum("fp32 (evaluate's default)" in r for r in rows) == 4
    assert sum("bf16 (opt-in)" in r for r in rows) == 4


def test_under_torchrun_without_the_all_reduce_only_rank_0_runs(monkeypatch):
    lines = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert _selftest.run_selftest("cpu", phases=["environment"], log=lines.append) is None
    assert lines == []  # rank 1 ran nothing
    monkeypatch.setenv("RANK", "0")
    report = _selftest.run_selftest("cpu", phases=["environment"], log=lines.append)
    assert report.rows[0].check == "imagenet_cog"
    assert len(lines) == 1


def test_a_long_benchmark_phase_prints_while_it_runs(bench, capsys):
    import time

    heartbeat = bench("_heartbeat").heartbeat
    with heartbeat("a long phase", every=0.05):
        time.sleep(0.5)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3
    assert all(re.fullmatch(r"a long phase: running for \d+ s", line) for line in lines)
    time.sleep(0.2)
    assert capsys.readouterr().err == ""  # it stops with its block


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "device 'tpu' is not a device name; use cpu, cuda or cuda:N"),
        ("", "device '' is not a device name"),
        ("meta", "the self-test runs on cpu or cuda (cuda:N), not 'meta'"),
    ],
)
def test_a_device_the_selftest_cannot_use_gives_one_line(capsys, device, message):
    assert cli.main(["selftest", "--device", device, "--only", "environment"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"imagenet-cog: error: {message}") and len(err.splitlines()) == 1
    assert "no check failed" not in captured.out


@pytest.mark.parametrize("only", [",", "", " , "])
def test_only_naming_no_phase_is_refused(capsys, only):
    assert cli.main(["selftest", "--device", "cpu", "--only", only]) == 2
    captured = capsys.readouterr()
    assert "no self-test phase chosen" in captured.err and "no check failed" not in captured.out


def test_only_accepts_spaces_after_the_commas(monkeypatch):
    seen = {}

    def fake(device, *, model, phases):
        seen.update(phases=list(phases))
        return _report("ok")

    monkeypatch.setattr(_selftest, "run_selftest", fake)
    assert cli.main(["selftest", "--device", "cpu", "--only", "environment, step"]) == 0
    assert seen == {"phases": ["environment", "step"]}


def test_the_header_says_how_loaded_the_machine_was(cpu_run):
    report, _ = cpu_run
    second = report.table().splitlines()[1]
    assert second.startswith("machine load: ") and "1-minute load average" in second
    assert re.search(
        r"this process got \d+\.\d s of CPU time in \d+\.\d s \(\d+\.\d cores\)", second
    )
    assert report.cpu_seconds > 0 and len(report.load) == 2


def test_each_result_cell_names_its_unit(cpu_run):
    report, _ = cpu_run
    for searches in ("1 search", "5 searches", "30 searches"):
        row = report.row(f"trial-step, {searches}")
        assert row.result.endswith(" ms/trial-step")
        assert " ms per step of all " in row.details
    for name in ("decode + preprocess", "model", "end to end"):
        assert report.row(name).result.endswith(" img/s")


def test_its_own_choice_of_random_weights_warns_nothing(caplog):
    with caplog.at_level("WARNING", logger="imagenet_cog"):
        report = _selftest.run_selftest("cpu", phases=("decoder",), log=lambda line: None)
    assert not [r for r in caplog.records if "names no weights" in r.getMessage()]
    assert "random weights" in report.row("tensor decoder vs Pillow").details
