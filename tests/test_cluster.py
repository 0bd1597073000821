"""Past one machine: torchrun on several machines, srun's variables, parts of a job array,
``imagenet-cog submit`` through submitit, the plan of a cluster run, the shared filesystem.

The machines are simulated on this one: two torchrun launches that meet through a c10d
rendezvous on 127.0.0.1 (two "nodes" of two processes each, Gloo), four processes started
with SLURM's variables and no torchrun, parts started as separate processes, submitit's local
executor. Each run must end with the stores, records and report of one process: the same
bytes, but for what says how the work ran (the processes, the searches trained together,
the timings). NCCL across machines, a real SLURM cluster and Lustre cannot be tried here.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TIMING_FIELDS, needs, subprocess_env
from imagefiles import plain_concepts, write_concepts

from imagenet_cog import Levels
from imagenet_cog._distributed import (
    Part,
    expand_nodelist,
    launch_env,
    lock_problem,
)
from imagenet_cog._optional_dependencies import INSTALLED

WNIDS = ["n00000001", "n00000002", "n00000003", "n00000004"]
#: What a record says of how its cell ran, not of what it found: the processes of the run and
#: the searches trained together (on the CPU they change no number), and the timings.
HOW_IT_RAN = (*TIMING_FIELDS, "world_size", "searches_in_lockstep", "lockstep_cells")
#: 100 images a concept in shards of 64: every train store has 4 shards (one per process of a
#: 4-process run), and the untrained-network check a store records (its first 64 images) is
#: the same whoever computes them.
EXTRACT = [
    "torchvision:resnet18:none",
    "--n-test",
    "2",
    "--preprocessing",
    '{"size": 16}',
    "--batch-size",
    "16",
    "--shard-size",
    "64",
    "--device",
    "cpu",
    "--quiet",
]
EVALUATE = [
    "--shots",
    "1,all",
    "--seeds",
    "22,37",
    "--trials",
    "3",
    "--startup-trials",
    "2",
    "--epochs",
    "2",
    "--batch-size",
    "32",
    "--device",
    "cpu",
    "--quiet",
]
_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env(**extra):
    """A process of these tests: one thread (the CPU's sums depend on the thread count), none
    of the launchers' variables but ``extra``."""
    env = subprocess_env(OMP_NUM_THREADS="1")
    for name in list(env):
        if name in _LAUNCH or name.startswith(("SLURM_", "TORCHELASTIC_")):
            del env[name]
    return {**env, **extra}


def _cli(*args):
    return [sys.executable, "-m", "imagenet_cog", *map(str, args)]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(argv, **kwargs):
    done = subprocess.run(
        argv,
        env=kwargs.pop("env", _env()),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        **kwargs,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _wait_all(procs, timeout=900):
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    return outs


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """ImageNet-21K folders of four concepts (100 images each) and levels L1, L2 of two."""
    base = tmp_path_factory.mktemp("cluster")
    write_concepts(base / "in21k", plain_concepts(WNIDS, 100))
    Levels([WNIDS[:2], WNIDS[2:]]).save(base / "levels")
    return base


def _extract(data, out):
    return [
        "extract",
        *EXTRACT,
        "--in21k",
        data / "in21k",
        "--levels",
        data / "levels",
        "--out",
        out,
    ]


def _evaluate(features, out):
    return ["evaluate", features, "--out", out, *EVALUATE]


@pytest.fixture(scope="module")
def reference(data):
    """One process: the stores, the run folder and its report."""
    _run(_cli(*_extract(data, data / "one" / "features")))
    _run(_cli(*_evaluate(data / "one" / "features", data / "one" / "results")))
    return data / "one"


def _stores(root):
    """Every store file of a store root by path, as bytes; the manifests without their
    ``execution`` (how many processes, how long)."""
    files = {}
    for path in sorted(Path(root).rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        key = str(path.relative_to(root))
        if path.name == "manifest.json":
            manifest = json.loads(path.read_text())
            manifest.pop("execution")
            files[key] = manifest
        else:
            files[key] = path.read_bytes()
    return files


def _records(folder, drop=HOW_IT_RAN):
    """``{cell: record}`` of a run folder, without ``drop`` (its whole lines: a run may be
    appending one)."""
    out = {}
    text = (
        (Path(folder) / "runs.jsonl").read_text() if (Path(folder) / "runs.jsonl").is_file() else ""
    )
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        record = json.loads(line)
        key = (record["domain"], str(record["shots"]), record["seed"])
        assert key not in out, f"{key} twice in {folder}"
        out[key] = {k: v for k, v in record.items() if k not in drop}
    return out


def _plan(folder):
    """A run folder's ``plan.json`` without the memory the machine had free when it was made."""
    plan = json.loads((Path(folder) / "plan.json").read_text())
    for unit in plan["units"]:
        unit.pop("usable_bytes")
    return plan


def _report(folder):
    return _run(_cli("report", folder)).stdout


def _same_as_one_process(reference, features, results):
    """The stores, ``config.json``, the records and the report of one process's run."""
    assert _stores(features) == _stores(reference / "features")
    assert (results / "config.json").read_bytes() == (
        reference / "results" / "config.json"
    ).read_bytes()
    assert _records(results) == _records(reference / "results")
    assert len(_records(results)) == 8
    assert _report(results) == _report(reference / "results")


# ------------------------------------------------------------ torchrun, several machines
def _two_machines(command, port, name):
    """``command`` under two torchrun launches (two machines of two processes each) that meet
    through a c10d rendezvous on 127.0.0.1."""
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        name,
        "--max-restarts",
        "0",
        "-m",
        "imagenet_cog",
        *map(str, command),
    ]
    procs = [
        subprocess.Popen(
            launcher, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    return _wait_all(procs)


@pytest.mark.slow
def test_two_machines_of_two_processes_each_make_what_one_process_makes(data, reference):
    out = data / "torchrun"
    _two_machines(_extract(data, out / "features"), _free_port(), "extract")
    manifest = json.loads((out / "features" / "L1" / "train" / "manifest.json").read_text())
    assert manifest["execution"]["world_size"] == 4
    _two_machines(_evaluate(out / "features", out / "results"), _free_port(), "evaluate")
    _same_as_one_process(reference, out / "features", out / "results")
    assert {r["world_size"] for r in _records(out / "results", TIMING_FIELDS).values()} == {4}
    plan = json.loads((out / "results" / "plan.json").read_text())
    assert sorted(u["rank"] for u in plan["units"]) == [0, 0, 1, 1, 2, 2, 3, 3]


# -------------------------------------------------------------------- srun, no torchrun
def _srun(command, port, tasks=4, per_node=2):
    """``command`` in ``tasks`` processes started with the variables srun gives its tasks
    (``per_node`` a machine), and no torchrun."""
    procs = []
    for rank in range(tasks):
        env = _env(
            SLURM_JOB_ID="4242",
            SLURM_STEP_ID="0",
            SLURM_PROCID=str(rank),
            SLURM_NTASKS=str(tasks),
            SLURM_LOCALID=str(rank % per_node),
            SLURM_NODEID=str(rank // per_node),
            SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                _cli(*command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return _wait_all(procs)


@pytest.mark.slow
def test_four_processes_started_with_srun_variables_make_what_one_process_makes(data, reference):
    out = data / "srun"
    _srun(_extract(data, out / "features"), _free_port())
    manifest = json.loads((out / "features" / "L2" / "train" / "manifest.json").read_text())
    assert manifest["execution"]["world_size"] == 4
    _srun(_evaluate(out / "features", out / "results"), _free_port())
    _same_as_one_process(reference, out / "features", out / "results")
    # Four processes on one machine: the plan, and every byte of every record but the timings,
    # are those of four processes on two machines.
    if (data / "torchrun" / "results" / "runs.jsonl").is_file():
        torchrun = data / "torchrun" / "results"
        assert _records(out / "results", TIMING_FIELDS) == _records(torchrun, TIMING_FIELDS)
        assert _plan(out / "results") == _plan(torchrun)


def test_srun_variables_name_the_processes_and_torchrun_variables_win():
    slurm = {
        "SLURM_JOB_ID": "812",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu-a[07-08,11],gpu-b3",
    }
    found = launch_env(slurm)
    assert (found.rank, found.world, found.local_rank, found.source) == (5, 8, 1, "srun")
    assert found.master_addr == "gpu-a07"
    assert 20_000 <= found.master_port <= 60_000
    assert launch_env({**slurm, "SLURM_PROCID": "0"}).master_port == found.master_port
    assert launch_env({**slurm, "SLURM_JOB_ID": "813"}).master_port != found.master_port
    # A step on some of the job's nodes: rank 0 runs on the step's first node.
    assert launch_env({**slurm, "SLURM_STEP_NODELIST": "gpu-b3"}).master_addr == "gpu-b3"
    given = launch_env({**slurm, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500"})
    assert (given.master_addr, given.master_port) == ("10.0.0.9", 29500)
    # torchrun inside the allocation (srun torchrun ...): torchrun's variables win.
    both = launch_env({**slurm, "RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3"})
    assert (both.rank, both.world, both.local_rank, both.source) == (3, 16, 3, "torchrun")
    assert launch_env({**slurm, "RANK": "0", "WORLD_SIZE": "1"}) is None
    assert launch_env({**slurm, "SLURM_NTASKS": "1"}) is None


def test_a_batch_script_without_srun_runs_as_one_process_and_says_so():
    from imagenet_cog import _distributed

    _distributed._srun_hint_given = False
    batch = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}
    with pytest.warns(UserWarning, match="not started by srun: it runs as one process"):
        assert launch_env(batch) is None
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        launch_env({**batch, "SLURM_STEP_ID": "0"})


def test_slurm_node_lists_expand_without_scontrol():
    assert expand_nodelist("node[01-03,7]") == ["node01", "node02", "node03", "node7"]
    assert expand_nodelist("a1,b[9-11]") == ["a1", "b9", "b10", "b11"]
    assert expand_nodelist("r[1-2]-n[1-2]") == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
    for bad in ("node[01-03", "node[a-b]", "", "a,,b"):
        with pytest.raises(ValueError, match="cannot read the SLURM node list"):
            expand_nodelist(bad)


# ----------------------------------------------------------------------- parts
def test_parts_are_numbered_from_one_and_slurm_arrays_read_as_slurm_numbers_them():
    assert Part.parse("3/3") == Part(3, 3)
    for text in ("0/3", "4/3", "1/0", "x/2", "2"):
        with pytest.raises(ValueError, match="--part"):
            Part.parse(text, {})
    array = {"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "0"}
    for task in range(3):  # --array=0-2
        env = {**array, "SLURM_ARRAY_TASK_ID": str(task)}
        assert Part.parse(f"{task}/3", env) == Part(task + 1, 3)
    for task in (1, 2, 3):  # --array=1-3
        env = {**array, "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_ID": str(task)}
        assert Part.parse(f"{task}/3", env) == Part(task, 3)
    stepped = {"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "0"}
    stepped |= {"SLURM_ARRAY_TASK_STEP": "10", "SLURM_ARRAY_TASK_ID": "20"}  # --array=0-20:10
    assert Part.parse("20/3", stepped) == Part(3, 3)
    # Outside the array's own numbers, i/n is part i of n.
    assert Part.parse("1/3", {**array, "SLURM_ARRAY_TASK_ID": "2"}) == Part(1, 3)


def test_the_stores_are_dealt_out_to_the_parts_the_largest_first():
    from imagenet_cog._extract_all import store_parts

    owner = store_parts(
        {"in21k": "in21k"},
        Levels([WNIDS[:2], WNIDS[2:3], WNIDS[3:]]),
        n_test=2,
        count=2,
    )
    # Estimated images: 2 x 1300, 1300, 1300 to train, 4, 2, 2 to test.
    assert owner == {
        ("L1", "train"): 1,
        ("L1", "test"): 1,
        ("L2", "train"): 2,
        ("L2", "test"): 2,
        ("L3", "train"): 2,
        ("L3", "test"): 2,
    }


HOLD_PART = """
import sys, time
from imagenet_cog._fileio import FolderLock
folder, part = sys.argv[1], sys.argv[2]
FolderLock(folder, "run folder", shared=True, reader=f"evaluate --part {part} (PID 1 on h)").acquire()
number, count = part.split("/")
FolderLock(folder, name=f".lock-part-{number}-of-{count}").acquire()
print("held", flush=True)
time.sleep(60)
"""


def _arrays():
    import numpy as np

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(2), 10)
    X = rng.normal(size=(20, 8)).astype(np.float32)
    return dict.fromkeys(("L1", "L2"), (X, y, X, y))


def test_a_run_and_the_parts_of_another_split_are_refused_while_a_part_runs(tmp_path):
    from imagenet_cog import evaluate
    from imagenet_cog._fileio import FolderLockedError

    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_PART, str(tmp_path), "1/3"],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    kw = {"domains": ("L1", "L2"), "shots": ("all",), "seeds": (22,), "n_trials": 2}
    kw |= {"epochs": 1, "device": "cpu", "progress": False, "out": tmp_path}
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(FolderLockedError, match=r"being read by evaluate --part 1/3"):
            evaluate(_arrays(), **kw)
        with pytest.raises(FolderLockedError, match=r"part 1/3 of the run folder .* in use"):
            evaluate(_arrays(), part="1/3", **kw)
        with pytest.raises(ValueError, match=r"parts of another split .*--part 1/3"):
            evaluate(_arrays(), part="2/2", **kw)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    with pytest.raises(ValueError, match="part='1/2' needs an out folder"):
        evaluate(_arrays(), part="1/2", **{**kw, "out": None})


@pytest.mark.slow
def test_parts_of_a_job_array_fill_one_folder_as_one_run_makes_it(data, reference):
    out = data / "parts"
    features, results = out / "features", out / "results"
    # extract: parts 2/3 and 3/3 at once, then 1/3.
    _wait_all(
        [
            subprocess.Popen(
                _cli(*_extract(data, features), "--part", part),
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for part in ("3/3", "2/3")
        ]
    )
    assert not (features / "L1" / "train" / "manifest.json").is_file()  # part 1's
    printed = _run(_cli(*_extract(data, features), "--part", "1/3")).stdout
    assert "L1/train: 196 images" in printed
    # evaluate: parts 3/3 and 2/3 at once; then part 1/3, killed after its first unit.
    _wait_all(
        [
            subprocess.Popen(
                _cli(*_evaluate(features, results), "--part", part),
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for part in ("3/3", "2/3")
        ]
    )
    verified = subprocess.run(
        _cli("verify", results),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr
    assert "not finished: missing 4 of the 8 cells of plan.json: --part 1/3 makes " in (
        verified.stdout
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_AFTER_ONE_UNIT, *map(str, _evaluate(features, results))],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while len(_records(results)) < 6:
            assert killed.poll() is None, killed.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        killed.send_signal(signal.SIGKILL)
        killed.communicate()
    finally:
        killed.kill()
    assert len(_records(results)) == 6
    report = subprocess.run(
        _cli("report", results),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "missing 2 of the 8 cells of plan.json: --part 1/3 makes L" in report.stderr
    resumed = _run(_cli(*_evaluate(features, results), "--part", "1/3"))
    assert "model" in resumed.stdout  # the last part shows the report of the whole run
    _same_as_one_process(reference, features, results)
    plan = json.loads((results / "plan.json").read_text())
    assert {(u["rank"], u["world"]) for u in plan["units"]} == {(0, 3), (1, 3), (2, 3)}


#: Part 1/3 of evaluate that stops for good after its first unit, to be killed there.
KILLED_AFTER_ONE_UNIT = """
import sys, time
from imagenet_cog import cli, protocol
real = protocol._run_unit
def once(*args, **kwargs):
    if getattr(once, "ran", False):
        time.sleep(600)
    once.ran = True
    return real(*args, **kwargs)
protocol._run_unit = once
sys.exit(cli.main([*sys.argv[1:], "--part", "1/3"]))
"""


# ------------------------------------------------------------------- the filesystem
def _mounts(tmp_path, monkeypatch, kind, options, super_options="rw"):
    """This machine's mounts as ``/proc/self/mountinfo`` says, ``tmp_path`` on ``kind``."""
    from imagenet_cog import _distributed

    info = tmp_path / "mountinfo"
    point = str(tmp_path).replace(" ", "\\040")
    info.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"98 22 0:52 / {point} {options} shared:7 - {kind} 10.0.0.1@tcp:/fs {super_options}\n"
    )
    monkeypatch.setattr(_distributed, "MOUNTINFO", str(info))


@pytest.mark.parametrize(
    ("kind", "options", "super_options", "problem"),
    [
        ("lustre", "rw", "rw,flock,lazystatfs", None),
        ("lustre", "rw", "rw,localflock", "with localflock: its file locks are seen on this"),
        ("lustre", "rw", "rw,lazystatfs", "without flock: file locks fail there"),
        ("nfs4", "rw,relatime", "rw,vers=4.2,local_lock=none,addr=10.0.0.1", None),
        ("nfs4", "rw", "rw,vers=4.2,local_lock=all", "with local_lock=all: its file locks are"),
        ("nfs", "rw", "rw,vers=3,nolock,local_lock=all", "with nolock: its file locks are seen"),
        ("ext4", "rw", "rw", None),
    ],
)
def test_the_filesystems_that_keep_locks_on_one_machine_are_named(
    tmp_path, monkeypatch, kind, options, super_options, problem
):
    _mounts(tmp_path, monkeypatch, kind, options, super_options)
    found = lock_problem(tmp_path / "results" / "not yet made")
    if problem is None:
        assert found is None
    else:
        assert problem in found and f"is on {kind} (mounted at {tmp_path})" in found


def test_a_part_on_lustre_without_shared_locks_is_refused_in_one_line(
    tmp_path, monkeypatch, capsys
):
    from imagenet_cog.cli import main

    _mounts(tmp_path, monkeypatch, "lustre", "rw", "rw,localflock")
    args = ["evaluate", str(tmp_path / "features"), "--out", str(tmp_path / "r"), "--part", "1/2"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--part 1/2:" in err and "mount it with -o flock" in err
    assert not (tmp_path / "r").exists()


def test_the_shared_folder_probe_names_what_another_machine_would_get_wrong(tmp_path):
    import fcntl

    from imagenet_cog._distributed import _probe_problem

    hosts = ["node1", "node2"]
    probe = tmp_path / ".probe.tmp-0"
    assert "does not see the file rank 0 on node1 wrote" in _probe_problem(probe, 7, hosts)
    probe.write_text(f"{7:016x}\n")
    # Nobody holds the lock: a rank on another machine took it, as localflock lets it.
    assert "took a file lock that rank 0 on node1 holds" in _probe_problem(probe, 7, hosts)
    assert "reads another file" in _probe_problem(probe, 8, hosts)
    fd = os.open(probe, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert _probe_problem(probe, 7, hosts) == ""
    finally:
        os.close(fd)


def test_a_writer_names_its_readers_where_flock_is_emulated_as_on_nfs(tmp_path, monkeypatch):
    # NFS emulates flock with byte-range locks: an exclusive one on a file open read-only
    # fails with EBADF. A writer checking which readers are alive must not fail on it.
    import errno
    import fcntl

    from imagenet_cog import _fileio
    from imagenet_cog._fileio import FolderLock, FolderLockedError

    real = fcntl.flock

    def nfs_flock(fd, operation):
        exclusive = operation & fcntl.LOCK_EX
        if exclusive and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real(fd, operation)

    monkeypatch.setattr(_fileio.fcntl, "flock", nfs_flock)
    reader = FolderLock(tmp_path, "feature store", shared=True, reader="evaluate (PID 5)")
    reader.acquire()
    try:
        with pytest.raises(FolderLockedError, match=r"being read by evaluate \(PID 5\)"):
            FolderLock(tmp_path, "feature store").acquire()
    finally:
        reader.release()
    with FolderLock(tmp_path, "feature store"):
        assert not list(tmp_path.glob(".reader-*"))


# --------------------------------------------------------------- the plan of a cluster
def test_the_plan_of_a_cluster_gives_each_gpu_its_share_and_the_wall_time():
    from imagenet_cog import plan_evaluate

    kw = {"domains": ("L1", "L2"), "shots": (1, "all"), "seeds": (22, 37, 45), "n_trials": 3}
    kw |= {"n_startup_trials": 2, "epochs": 2, "device": "cpu"}
    one = plan_evaluate(_arrays(), **kw)
    plan = plan_evaluate(_arrays(), nodes=2, gpus_per_node=2, **kw)
    processes = plan.cluster["processes"]
    assert [(p["rank"], p["node"]) for p in processes] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert sum(p["cells"] for p in processes) == 12 == sum(len(u["cells"]) for u in one.units)
    assert [p["cells"] for p in processes] == [4, 4, 2, 2]  # 6 cells a shots value, 2, 2, 1, 1
    assert plan.cluster["wall_s"] == max(p["seconds"] for p in processes) > 0
    table = plan.table()
    assert "On 2 node(s) x 2 GPU(s) (4 processes" in table and "wall time: about" in table


def test_the_plan_of_a_cluster_on_the_default_protocol_shares_every_cell_once():
    import numpy as np

    from imagenet_cog import plan_evaluate
    from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS

    # Every domain, every shots value, five seeds: 270 cells; 170 images a class (N=128 fits beside the 20% validation holdout).
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(2), 170)
    X = rng.normal(size=(340, 8)).astype(np.float32)
    arrays = dict.fromkeys(DOMAINS, (X, y, X[:20], y[:20]))
    kw = {"n_trials": 3, "n_startup_trials": 2, "epochs": 1, "device": "cpu"}
    one = plan_evaluate(arrays, **kw)
    plan = plan_evaluate(arrays, nodes=2, gpus_per_node=4, **kw)
    processes = plan.cluster["processes"]
    cells = len(DOMAINS) * len(SHOTS) * len(SEEDS)
    assert sum(len(u["cells"]) for u in one.units) == cells == 270
    assert sum(p["cells"] for p in processes) == cells
    assert [(p["rank"], p["node"]) for p in processes] == [(k, k // 4) for k in range(8)]
    assert all(p["cells"] > 0 for p in processes)  # 270 cells keep 8 processes busy
    assert plan.cluster["wall_s"] == max(p["seconds"] for p in processes) > 0
    # The work is shared, not repeated: the wall time is under one process's.
    assert plan.cluster["wall_s"] < one.seconds["total"]
    with pytest.raises(ValueError, match=r"nodes=0 \(--nodes\): give a positive number"):
        plan_evaluate(_arrays(), nodes=0, **kw)


def test_nodes_shape_the_plan_only(capsys):
    from imagenet_cog.cli import main

    assert main(["evaluate", "features", "--out", "r", "--nodes", "2"]) == 2
    assert "shape the plan (with --plan)" in capsys.readouterr().err


# ------------------------------------------------------------------------- submit
def _submit_args(*extra):
    from imagenet_cog.cli import build_parser

    return build_parser().parse_args(["submit", *extra])


#: The options of a SLURM job the sbatch script is checked for.
SUBMIT_SLURM = [
    "--nodes",
    "2",
    "--gpus-per-node",
    "4",
    "--partition",
    "gpu",
    "--timeout",
    "1-00:00:00",
    "--slurm-account",
    "vision",
    "--slurm-exclusive",
    "--slurm-constraint=h100",
]
#: The options of the job run, preempted and requeued by submitit's local executor.
SUBMIT_LOCAL = ["--cluster", "local", "--gpus-per-node", "0", "--timeout", "20"]


def test_submit_writes_the_sbatch_script_of_its_options(tmp_path, monkeypatch):
    needs("submitit")
    from imagenet_cog._cli.submit import make_executor

    # A machine of the cluster has srun (never called here: the script is only written).
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")

    args = _submit_args(*SUBMIT_SLURM, "--", "evaluate", "features", "--out", "results")
    assert args.command[-4:] == ["evaluate", "features", "--out", "results"]
    executor = make_executor(args, tmp_path, args.command[-4:])
    script = executor._executor._make_submission_file_text("COMMAND", "uid")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1440",
        "#SBATCH --account=vision",
        "#SBATCH --exclusive",
        "#SBATCH --constraint=h100",
        "#SBATCH --signal=USR2@90",
        "#SBATCH --job-name=imagenet-cog-evaluate",
    ):
        assert line in script.splitlines(), script
    assert "srun --unbuffered" in script


def test_submit_refuses_in_one_line_what_it_cannot_run(tmp_path, capsys):
    from imagenet_cog.cli import main

    jobs = ["--jobs-dir", str(tmp_path)]
    cases = [
        (["--timeout", "60", *jobs], "give the command after --"),
        (["--timeout", "60", *jobs, "--", "levels"], "submit runs extract, evaluate, analyze"),
        (["--timeout", "60", *jobs, "--", "evaluate", "--no-such"], "does not parse"),
        ([*jobs, "--cluster", "local", "--", "evaluate", "f", "--out", "r"], "--timeout 24:00"),
    ]
    if INSTALLED["submitit"]:  # where it is absent, the cases above still run
        local = ["--cluster", "local", "--nodes", "2", "--timeout", "9", *jobs]
        cases.append(([*local, "--", "evaluate", "f", "--out", "r"], "give --nodes 1"))
        two = ["--cluster", "local", "--gpus-per-node", "2", "--timeout", "9", *jobs]
        cases.append(([*two, "--", "analyze", "f"], "analyze runs in one process"))
        slurm = ["--timeout", "9", *jobs, "--", "evaluate", "f", "--out", "r"]
        if shutil.which("srun") is None:
            cases.append((slurm, "no SLURM here (srun and sbatch are not on PATH)"))
    for args, message in cases:
        assert main(["submit", *args]) == 2, args
        assert message in capsys.readouterr().err, args
    assert main(["submit", "--status", *jobs]) == 0
    assert f"no job submitted from {tmp_path}" in capsys.readouterr().out


def test_submit_without_submitit_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from imagenet_cog.cli import main

    monkeypatch.setitem(sys.modules, "submitit", None)
    args = ["submit", "--timeout", "9", "--jobs-dir", str(tmp_path), "--", "evaluate", "f"]
    assert main([*args, "--out", "r"]) == 2
    assert "imagenet-cog submit needs submitit: pip install 'submitit>=1.5'" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_a_submitted_job_preempted_requeued_and_finished_is_a_direct_run(data, reference):
    needs("submitit")
    jobs, results = data / "jobs", data / "submitted"
    features = reference / "features"
    # Three units of 2 x 2 searches of 30 trials, to be preempted between: at 100 epochs the
    # two after the first take seconds (at 3 epochs all three took under a second, and the run
    # could end before the signal came).
    slow = ["--shots", "1,2,all", "--trials", "30", "--epochs", "100"]
    command = [*_evaluate(features, results), *slow]
    submit = ["submit", *SUBMIT_LOCAL]
    # Its output into a file: the local executor's job inherits it, and would hold a pipe open.
    printed = data / "submit.txt"
    # Submitted where Ctrl-C is ignored, as from a shell's background (nohup ... &): the job
    # inherits that, and its command must still stop when the job is preempted.
    with printed.open("w") as file:
        argv = _cli(*submit, "--jobs-dir", jobs, "--", *command)
        code = subprocess.run(
            argv,
            env=_env(),
            stdout=file,
            stderr=file,
            timeout=300,
            check=False,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        ).returncode
    assert code == 0, printed.read_text()
    assert "submitted job" in printed.read_text()
    assert "imagenet-cog submit --status" in printed.read_text()
    (entry,) = [json.loads(line) for line in (jobs / "jobs.jsonl").read_text().splitlines()]
    state_file = Path(entry["folder"]) / "state.json"
    deadline = time.monotonic() + 600
    while not _records(results):
        assert time.monotonic() < deadline, Path(entry["stderr"]).read_text()[-3000:]
        time.sleep(0.05)
    state = json.loads(state_file.read_text())
    done_at_signal = len(_records(results))
    os.kill(state["pid"], signal.SIGUSR2)  # submitit's preemption signal, as SLURM sends it
    while json.loads(state_file.read_text()).get("state") not in ("finished", "failed"):
        assert time.monotonic() < deadline, Path(entry["stderr"]).read_text()[-3000:]
        time.sleep(0.5)
    state = json.loads(state_file.read_text())
    assert (state["state"], state["attempts"]) == ("finished", 2)
    log = Path(entry["stderr"]).read_text()
    assert done_at_signal < 12, "the run ended before the signal came: make it longer"
    assert "imagenet-cog: interrupted;" in log and "the same command resumes" in log, log
    status = _run(_cli("submit", "--status", "--jobs-dir", jobs)).stdout
    assert entry["job_id"] in status and "finished" in status and entry["stdout"] in status
    direct = data / "direct"
    _run(_cli(*_evaluate(features, direct), *slow))
    assert _records(results, TIMING_FIELDS) == _records(direct, TIMING_FIELDS)
    assert len(_records(results)) == 12


@pytest.mark.slow
def test_the_plan_of_a_cluster_from_the_command_line(reference):
    features = reference / "features"
    shape = ["--nodes", "2", "--gpus-per-node", "2"]
    printed = _run(_cli("evaluate", features, "--plan", *shape, *EVALUATE)).stdout
    assert "On 2 node(s) x 2 GPU(s) (4 processes, each with a device like cpu here" in printed
    rows = [line.split() for line in printed.splitlines() if line[:4].strip().isdigit()]
    assert [(r[0], r[1], r[3]) for r in rows[-4:]] == [(str(k), str(k // 2), "2") for k in range(4)]
    assert "wall time: about" in printed


# ------------------------------------------------------------------- the guide
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "cluster.rst"


def _options(argv):
    return {str(w).split("=")[0] for w in argv if str(w).startswith("--")}


#: The options each launcher and command is run with by the tests above.
TESTED = {
    "torchrun": {"--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id"},
    "srun": set(),
    "python": set(),
    "extract": _options(EXTRACT) | {"--in21k", "--levels", "--out", "--part"},
    "evaluate": _options(EVALUATE) | {"--out", "--part", "--plan", "--nodes", "--gpus-per-node"},
    "submit": _options(SUBMIT_SLURM) | _options(SUBMIT_LOCAL) | {"--jobs-dir", "--status"},
    "verify": set(),
    "report": set(),
}


def _guide_commands():
    """``(line number, launcher words, imagenet-cog words)`` of every command of the guide: the
    ``$`` lines of its console blocks and the commands of its batch scripts."""
    import shlex

    found = []
    for n, line in enumerate(GUIDE.read_text().splitlines(), start=1):
        text = line.strip()
        if text.startswith("$ "):
            text = text[2:]
        elif text.startswith("#") or "-m imagenet_cog" not in text:
            continue
        words = shlex.split(text)
        if "imagenet-cog" in words:
            start = words.index("imagenet-cog")
            found.append((n, words[:start], words[start + 1 :]))
        else:
            start = words.index("imagenet_cog")
            found.append((n, words[: start - 1], words[start + 1 :]))
    return found


def test_every_command_of_the_cluster_guide_is_one_the_tests_run():
    commands = _guide_commands()
    assert len(commands) >= 10
    shown = set()
    for n, launcher, argv in commands:
        where = f"{GUIDE.name}:{n}"
        if launcher:
            tool = "srun" if launcher[0] == "srun" else launcher[0]
            assert tool in TESTED, f"{where}: {tool} is not run by the tests"
            assert _options(launcher) <= TESTED[tool], (
                f"{where}: {_options(launcher) - TESTED[tool]}"
            )
        command, rest = argv[0], argv[1:]
        if command == "submit" and "--" in rest:  # the job's own command
            job = rest[rest.index("--") + 1 :]
            rest = rest[: rest.index("--")]
            assert _options(job) <= TESTED[job[0]], f"{where}: {_options(job) - TESTED[job[0]]}"
        assert _options(rest) <= TESTED[command], f"{where}: {_options(rest) - TESTED[command]}"
        shown.add((launcher[0] if launcher else "", command))
    # torchrun on two machines, srun, submit, the parts, verify and the plan are all shown.
    assert {("torchrun", "extract"), ("torchrun", "evaluate"), ("srun", "evaluate")} <= shown
    assert {("", "submit"), ("python", "extract"), ("python", "evaluate"), ("", "verify")} <= shown
