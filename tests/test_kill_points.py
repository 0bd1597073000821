"""Every writer killed with SIGKILL at random points, then run again: nothing left behind.

A real process runs each writer of the library (one store's extraction, the one pass over a
shard copy for four stores, ``evaluate`` saving its predictions, the HTML report, the
figures, the exports) and kills itself with SIGKILL at a point drawn from a seeded
generator: at the k-th file written through a temporary name, just after the temporary file
is created, half-written, written whole, or flushed but not yet renamed. The same command,
run again, must end with what an uninterrupted run gives, and leave no temporary file
(``.NAME.tmp-PID``) and no one-pass record folder (``.pass/``) anywhere: not in the output,
not in the listing cache.
"""

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from copyfiles import write_copy_layouts
from helpers import strip_timings, subprocess_env

pytestmark = pytest.mark.slow

#: Where a write is cut: its temporary file just created, half of its bytes written, all of
#: them, flushed to disk but not renamed, or just renamed (the writer's next step not taken).
PHASES = ("created", "half", "written", "flushed", "renamed")

CHILD = r"""
import os, re, signal, sys
from pathlib import Path

import numpy as np
from imagenet_cog import _fileio

writer, out, plan, data = sys.argv[1], Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
real_open, real_write, real_replace = os.open, _fileio._write_all, os.replace
count, armed = [0], [None]
temporary = re.compile(r"^\.(.+)\.tmp-\d+$")  # the library's ".NAME.tmp-PID"


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def opening(path, flags, *args, **kwargs):
    fd = real_open(path, flags, *args, **kwargs)
    name = temporary.match(os.path.basename(os.fspath(path)))
    if name and flags & os.O_CREAT:  # a file written through a temporary name starts
        count[0] += 1
        if plan == "count":
            print("WROTE", os.path.join(os.path.dirname(os.fspath(path)), name[1]), flush=True)
        if plan.startswith(f"{count[0]}:"):
            armed[0] = plan.split(":")[1]
            if armed[0] == "created":
                die()
    return fd


def writing(fd, payload):
    if armed[0] == "half":
        real_write(fd, bytes(payload)[: len(payload) // 2])
        die()
    real_write(fd, payload)
    if armed[0] == "written":
        die()


def replacing(src, dst):
    if armed[0] == "flushed":
        die()
    real_replace(src, dst)
    if armed[0] == "renamed":
        die()


os.open = opening
_fileio._write_all = writing
os.replace = replacing

from imagenet_cog import Levels, Results, evaluate, extract, extract_all
from imagenet_cog.cli import main

a, b = (data / "wnids").read_text().split()
tiny = {"preprocessing": {"size": 16}, "batch_size": 4, "num_workers": 0, "progress": False}
if writer == "extract":
    extract("torchvision:resnet18:none", data / "copies" / "folders", "L1", "test", out,
            wnids=[a, b], shard_size=20, **tiny)
elif writer == "one_pass":
    extract_all("torchvision:resnet18:none", {"in21k": data / "copies" / "wds"}, out,
                Levels([[a], [b]]), n_test=5, shard_size=20, **tiny)
elif writer == "evaluate":
    arrays = np.load(data / "features.npz")
    feats = {d: tuple(arrays[f"{d}_{k}"] for k in ("Xtr", "ytr", "Xte", "yte"))
             for d in ("in1k", "L1")}
    evaluate(feats, domains=("in1k", "L1"), shots=(1, "all"), seeds=(22, 37), out=out,
             save_predictions=True, n_trials=2, n_startup_trials=1, epochs=2, batch_size=64,
             device="cpu", progress=False)
elif writer == "html":
    out.mkdir(parents=True, exist_ok=True)
    assert main(["report", str(data / "run"), "--html", str(out / "page.html")]) == 0
elif writer == "figures":
    argv = ["report", str(data / "run"), "--plot", str(out / "figures")]
    assert main([*argv, "--plot-format", "png,svg", "--baseline", "mine"]) == 0
elif writer == "exports":
    results = Results.load(data / "run")
    out.mkdir(parents=True, exist_ok=True)
    results.to_latex(out / "tables.tex")
    results.to_csv(out / "results.csv")
    results.to_markdown(out / "results.md")
    results.to_json(out / "results.json")
else:
    raise SystemExit(f"unknown writer {writer}")
"""

WRITERS = ("extract", "one_pass", "evaluate", "html", "figures", "exports")
#: Kill points drawn per writer.
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """What the writers read: two official concepts as folders and shards, synthetic
    features, a results folder on the default protocol's shape."""
    from test_names_in_exports import _write_run
    from test_protocol import write_synthetic_npz

    data = tmp_path_factory.mktemp("inputs")
    _, wnids, _ = write_copy_layouts(data / "copies")
    (data / "wnids").write_text(" ".join(wnids))
    write_synthetic_npz(data / "features.npz")
    _write_run(data / "run")
    (data / "child.py").write_text(CHILD)
    return data


def _run(inputs, writer, out, plan, cache):
    env = subprocess_env(OMP_NUM_THREADS="1", IMAGENET_COG_CACHE=str(cache))
    return subprocess.run(
        [sys.executable, str(inputs / "child.py"), writer, str(out), plan, str(inputs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def references(inputs, tmp_path_factory):
    """Per writer: its uninterrupted output folder and the files it writes through a
    temporary name, in order (relative to the output folder, or absolute elsewhere)."""
    made = {}

    def reference(writer):
        if writer not in made:
            base = tmp_path_factory.mktemp(f"reference-{writer}")
            done = _run(inputs, writer, base / "out", "count", base / "cache")
            assert done.returncode == 0, done.stderr[-3000:]
            written = [x.split(" ", 1)[1] for x in done.stdout.splitlines() if x[:6] == "WROTE "]
            prefix = str(base / "out") + "/"
            made[writer] = (base / "out", [w.removeprefix(prefix) for w in written])
        return made[writer]

    return reference


def _left_behind(*roots):
    """Temporary files and one-pass record folders anywhere under ``roots``."""
    found = []
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.name == ".pass" or (path.name.startswith(".") and ".tmp-" in path.name):
                found.append(str(path.relative_to(root)))
    return sorted(found)


def _files(root):
    """``{relative path: bytes}`` of what a writer leaves, but what varies between identical
    runs: the manifests' execution section, the records' timings, the listing of stores'
    verified hashes, the lock files, the HTML page and figures (they carry the date)."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        name = path.relative_to(root).as_posix()
        if not path.is_file() or path.name in (".lock", ".verified.json"):
            continue
        if path.name == "manifest.json":
            manifest = json.loads(path.read_bytes())
            manifest.pop("execution", None)
            out[name] = manifest
        elif path.name == "runs.jsonl":
            lines = [strip_timings(json.loads(x)) for x in path.read_text().splitlines()]
            out[name] = sorted(lines, key=lambda r: (r["domain"], str(r["shots"]), r["seed"]))
        elif path.suffix in (".html", ".png", ".svg") or path.name in ("plan.json",):
            out[name] = "present"
        else:
            out[name] = path.read_bytes()
    return out


def _draw(writer, seed, n_writes):
    """The seeded kill point of one case: ``(k, phase)``, the phase drawn first."""
    rng = np.random.default_rng([45, WRITERS.index(writer), seed])
    phase = PHASES[int(rng.integers(len(PHASES)))]
    return int(rng.integers(1, n_writes + 1)), phase


def test_the_seeded_kill_points_meet_every_phase():
    phases = {_draw(w, s, 1)[1] for w in WRITERS for s in SEEDS}
    assert phases == set(PHASES)


def _kill_and_resume(inputs, writer, tmp_path, k, phase):
    out, cache = tmp_path / "out", tmp_path / "cache"
    killed = _run(inputs, writer, out, f"{k}:{phase}", cache)
    assert killed.returncode == -signal.SIGKILL, (k, phase, killed.stderr[-3000:])
    resumed = _run(inputs, writer, out, "resume", cache)
    assert resumed.returncode == 0, (k, phase, resumed.stderr[-3000:])
    assert _left_behind(out, cache) == [], (k, phase)
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("writer", WRITERS)
def test_a_writer_killed_at_a_random_point_resumes_and_leaves_nothing_behind(
    inputs, references, tmp_path, writer, seed
):
    reference, written = references(writer)
    k, phase = _draw(writer, seed, len(written))
    out = _kill_and_resume(inputs, writer, tmp_path, k, phase)
    assert _files(out) == _files(reference), (k, phase, written[k - 1])


def test_a_one_pass_killed_once_a_store_is_finished_leaves_no_records_after_its_rerun(
    inputs, references, tmp_path
):
    # Killed just after the first store's manifest is renamed, before its records are
    # removed: the rerun skips that store as finished, and still removes them.
    reference, written = references("one_pass")
    k = 1 + next(i for i, w in enumerate(written) if w.endswith("/manifest.json"))
    out, cache = tmp_path / "out", tmp_path / "cache"
    killed = _run(inputs, "one_pass", out, f"{k}:renamed", cache)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    finished = (out / written[k - 1]).parent
    assert (finished / ".pass").is_dir()  # the state the kill leaves
    assert _run(inputs, "one_pass", out, "resume", cache).returncode == 0
    assert _left_behind(out, cache) == []
    assert _files(out) == _files(reference)
