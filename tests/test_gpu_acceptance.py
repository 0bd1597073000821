"""The GPU acceptance (``nox -s gpu``): its phases, its budget, its table, and the wheels that
take it to a GPU machine without network. What runs only on a GPU runs there; here, what can
be checked without one."""

import importlib
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import subprocess_env

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture
def acceptance(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("gpu_acceptance")


def test_the_dry_run_lists_every_phase_with_its_computed_time(acceptance, capsys):
    assert acceptance.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for phase in acceptance.PHASES:
        assert f"  {phase.name}" in out
        assert f"{phase.seconds:.0f} s" in out
    assert "times on one H100, each measured (date given) or computed (from what):" in out
    # The default budget (8 minutes) cannot hold every phase: those past it say so.
    assert "[would be skipped: over the budget]" in out
    assert "total: " in out


def test_only_and_skip_name_phases(acceptance, capsys):
    assert acceptance.main(["--dry-run", "--only", "gemm,protocol", "--skip", "gemm"]) == 0
    out = capsys.readouterr().out
    assert "  protocol" in out and "  gemm " not in out and "  selftest" not in out
    with pytest.raises(SystemExit):
        acceptance.main(["--dry-run", "--only", "nope"])
    assert "unknown phase(s) ['nope']" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_without_a_gpu_it_says_so_in_one_line(acceptance, capsys):
    assert acceptance.main(["--only", "gemm"]) == 1
    assert "needs a GPU" in capsys.readouterr().out


def test_a_phase_past_the_budget_is_stopped_and_its_output_kept(acceptance, tmp_path):
    phase = acceptance.PHASES[0]
    # A progress bar's update ends with \r, not \n: a phase stuck there is stopped too.
    code = "import sys, time; print('started'); sys.stdout.write('bar 50%\\r'); sys.stdout.flush(); time.sleep(60)"
    status, seconds = acceptance.run_phase(phase, [sys.executable, "-c", code], tmp_path, 3)
    assert status.startswith("stopped at the budget's end") and seconds < 30
    assert (tmp_path / f"{phase.name}.log").read_bytes() == b"started\nbar 50%\r"
    status, _ = acceptance.run_phase(
        phase, [sys.executable, "-c", "raise SystemExit(3)"], tmp_path, 30
    )
    assert status == "FAIL (exit 3)"


@pytest.mark.slow
def test_the_table_reads_what_the_benchmarks_write(acceptance, tmp_path):
    # The benchmarks' own JSON, written by quick CPU runs, and a floor as the gemm phase
    # writes it: every phase's figures reach the table, each with its ratio.
    env = subprocess_env(OMP_NUM_THREADS="1")
    runs = {
        "step.json": ["bench_step.py", "--quick"],
        "protocol-fp32.json": ["bench_protocol.py", "--quick"],
        "kmeans.json": [
            "bench_analysis.py",
            "--only",
            "kmeans",
            "--no-sklearn",
            "--n",
            "2000",
            "--d",
            "8",
            "--k",
            "5",
            "--n-init",
            "1",
            "--max-iter",
            "10",
        ],
    }
    for name, argv in runs.items():
        cmd = [sys.executable, str(BENCH / argv[0]), *argv[1:], "--json", str(tmp_path / name)]
        subprocess.run(cmd, cwd=BENCH, env=env, check=True, capture_output=True)
    # The 30-search phase writes what the protocol phase writes, at another shape.
    (tmp_path / "protocol-30.json").write_text((tmp_path / "protocol-fp32.json").read_text())
    products = [
        {"precision": p, "trials": 30, "tflops": t, "ms_per_trial_step": ms}
        for p, t, ms in (("fp32", 48.0, 0.1746), ("tf32", 320.0, 0.0262), ("bf16", 740.0, 0.0113))
    ]
    (tmp_path / "gemm.json").write_text(json.dumps({"device": "x", "products": products}))
    (tmp_path / "cuda-tests.xml").write_text(
        '<testsuites><testsuite tests="8" failures="1" errors="0" skipped="2"/></testsuites>'
    )
    figures = acceptance.summarize(tmp_path, {"extract": "skipped: computed 60 s, 35 s left"})
    table = acceptance.table(figures)
    by_phase = {}
    for f in figures:
        by_phase.setdefault(f.phase, []).append(f)
    assert {"gemm", "cuda-tests", "protocol", "kmeans", "step", "extract"} <= set(by_phase)
    assert by_phase["cuda-tests"][0].measured == "5 passed, 1 failed, 2 skipped"
    assert by_phase["cuda-tests"][0].status == "FAIL"
    assert any("of the floor" in f.ratio for f in by_phase["protocol"])
    assert any(f.ratio.endswith("x faster") for f in by_phase["protocol"])
    assert "(extrapolated, upper bound)" in table and "GPU-hours" in table
    assert len(by_phase["step"]) == 4 and all("of the floor" in f.ratio for f in by_phase["step"])
    # The step's and the 30-search protocol's floors are their own runs' products.
    assert all("same run" in f.reference for f in by_phase["protocol-30"])
    assert [f.figure.split(",")[0] for f in by_phase["protocol-30"]] == [
        "all-data cells",
        "few-shot cells",
    ]
    assert all(f.ratio.endswith("of the floor") for f in by_phase["protocol-30"])
    assert "2,000 x 8, k=5" in table
    assert by_phase["extract"][0].measured.startswith("skipped")


# ------------------------------------------------------------------------- the wheels
def _wheel(folder, name, version="1.0"):
    """A minimal pure-Python wheel holding one module, in the layout pip installs."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}.py", "VALUE = 42\n")
        zf.writestr(
            f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        zf.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(
            f"{dist}/RECORD", f"{name}.py,,\n{dist}/METADATA,,\n{dist}/WHEEL,,\n{dist}/RECORD,,\n"
        )
    return path


@pytest.mark.slow
def test_only_the_missing_distributions_are_installed(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "cog_gpu_missing_dist")
    _wheel(wheels, "numpy", "0.0.1")  # installed here: the machine's own stays
    site = tmp_path / "site"
    script = [sys.executable, str(ROOT / "tools" / "install_missing_wheels.py")]
    first = subprocess.run(
        [*script, str(wheels), str(site)], check=False, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    assert "installing 1 missing distribution(s)" in first.stdout
    assert "cog-gpu-missing-dist" in first.stdout and "numpy" not in first.stdout
    assert (site / "cog_gpu_missing_dist.py").is_file() and not (site / "numpy").exists()
    again = subprocess.run(
        [*script, str(wheels), str(site)], check=False, capture_output=True, text=True
    )
    assert "already installed" in again.stdout
    check = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {str(site)!r})
        import cog_gpu_missing_dist, numpy
        print(cog_gpu_missing_dist.VALUE, numpy.__version__ != "0.0.1")
        """
    )
    assert subprocess.check_output([sys.executable, "-c", check], text=True).split() == [
        "42",
        "True",
    ]


def test_no_wheels_says_how_to_get_them(tmp_path):
    script = [sys.executable, str(ROOT / "tools" / "install_missing_wheels.py")]
    done = subprocess.run(
        [*script, str(tmp_path), str(tmp_path / "site")],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "run 'nox -s gpu_wheels'" in done.stdout


def test_the_noxfile_has_the_gpu_sessions():
    text = (ROOT / "noxfile.py").read_text()
    assert "def gpu(session" in text and "def gpu_wheels(session" in text
    assert "benchmarks/gpu_acceptance.py" in text
    assert ".gpu-wheels" in (ROOT / ".gitignore").read_text()


@pytest.mark.slow
def test_the_extract_phases_rows_read_what_bench_extract_writes(acceptance, tmp_path):
    env = subprocess_env(OMP_NUM_THREADS="1")
    runs = {
        "extract.json": ["--only", "loaders,model", "--images", "16", "--repeats", "1"],
        "extract-fidelity.json": [
            *("--only", "fidelity,resize", "--images", "4"),
            *("--fidelity-images", "4", "--resize-images", "8"),
        ],
    }
    for name, argv in runs.items():
        cmd = [sys.executable, str(BENCH / "bench_extract.py"), *argv, "--batch-size", "8"]
        cmd += ["--workers", "1", "--json", str(tmp_path / name)]
        subprocess.run(cmd, cwd=BENCH, env=env, check=True, capture_output=True)
    speed = json.loads((tmp_path / "extract.json").read_text())
    fidelity = json.loads((tmp_path / "extract-fidelity.json").read_text())
    figures = acceptance.extract_figures(speed, fidelity)
    rows = {f.figure: f for f in figures}
    for path in ("worker path, resize pil", "worker path, resize torch", "tensor path"):
        row = rows[f"loading alone: {path}"]
        assert row.measured.endswith("img/s") and row.ratio.endswith("x")
    assert rows["loading alone: plain Pillow loop"].ratio == "1.00x"
    assert any(f.figure.startswith("network alone") for f in figures)
    # The fidelity phase, with real weights, as the GPU run's extract-fidelity phase runs it.
    for path in ("worker path, resize torch", "tensor path"):
        assert rows[f"{path}: input pixels vs Pillow"].measured.startswith("max ")
    assert rows["tensor path: input pixels vs Pillow"].measured.startswith("max 0,")
    features = [f for f in figures if "features vs Pillow" in f.figure]
    assert {f.figure.split(": ")[1] for f in features} >= {"MobileNetV2 features vs Pillow"}
    resize = rows["batched exact resize on the device, 8 images"]
    assert resize.measured == "max 0 levels from Pillow's" and resize.status == "ok"
    # In the whole summary, from the files the phases write.
    assert any(f.phase == "extract" for f in acceptance.summarize(tmp_path, {}))
