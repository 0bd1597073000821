"""``imagenet-cog submit``: a command of imagenet-cog run as a SLURM job through submitit.

``imagenet-cog submit --nodes N --gpus-per-node G --partition P --timeout T [--slurm-OPTION
VALUE ...] -- extract|evaluate|analyze ...`` asks submitit for a job of ``N`` machines and ``G``
tasks on each (one per GPU); every task runs the command, which takes its rank from the
variables torch.distributed reads (submitit's ``TorchDistributedEnvironment``). When SLURM
warns the job that it runs out of time or is preempted (``USR2``, 90 s before), submitit
calls :meth:`CommandJob.checkpoint`: the command stops as on Ctrl-C (its files whole, its
locks released) and the same command is requeued; run again, it resumes where it stopped
(every command of imagenet-cog resumes). A job preempted without warning is requeued by
SLURM and resumes alike.

The jobs folder (``--jobs-dir``, ``imagenet-cog-jobs`` by default)::

    imagenet-cog-jobs/
        jobs.jsonl                one line per job submitted: its id, command, shape, logs
        <job id>/                 submitit's folder of the job
            <job id>_0_log.out    what rank 0 printed, attempt after attempt (then _1_...)
            <job id>_0_log.err
            state.json            running, requeued, finished or failed; its attempts

``imagenet-cog submit --status`` reads them, with SLURM's state of each job where ``sacct``
answers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .._fileio import atomic_write_text, locked_append

__all__ = ["CommandJob", "add_submit", "slurm_options", "timeout_minutes"]

#: The jobs folder by default (in the folder the command is given in).
JOBS_DIR = "imagenet-cog-jobs"
INDEX = "jobs.jsonl"
STATE = "state.json"
#: The commands a job may run.
COMMANDS = ("extract", "evaluate", "analyze")
#: Seconds a stopped command has to end (Ctrl-C) before it is killed.
STOP_S = 60.0


def slurm_options(argv):
    """``argv`` of ``submit`` with each ``--slurm-NAME VALUE`` (or ``--slurm-NAME=VALUE``, or
    ``--slurm-NAME`` alone: a flag) before ``--`` written as ``--slurm NAME=VALUE``.

    Examples
    --------
    >>> slurm_options(["--slurm-account", "vision", "--slurm-exclusive", "--nodes", "2",
    ...                "--", "evaluate", "--slurm-x"])
    ['--slurm', 'account=vision', '--slurm', 'exclusive', '--nodes', '2', '--', 'evaluate', '--slurm-x']
    """
    argv = list(argv)
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return out + argv[i:]
        if word.startswith("--slurm-"):
            name, eq, value = word[len("--slurm-") :].partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                value, eq, i = argv[i + 1], "=", i + 1
            out += ["--slurm", f"{name}{eq}{value}"]
        else:
            out.append(word)
        i += 1
    return out


class _SubmitParser(argparse.ArgumentParser):
    """``submit``'s parser: ``--slurm-NAME VALUE`` options read as ``--slurm NAME=VALUE``."""

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(slurm_options(args or []), namespace)


def timeout_minutes(text):
    """A SLURM time limit (``90``, ``1:30:00``, ``2-00:00:00``, ``2-12``) in whole minutes.

    Examples
    --------
    >>> timeout_minutes("90"), timeout_minutes("1:30:00"), timeout_minutes("2-12")
    (90, 90, 3600)
    """
    text = str(text).strip()
    days, dash, rest = text.rpartition("-") if "-" in text else ("", "", text)
    try:
        day = int(days) if dash else 0
        parts = [int(p) for p in rest.split(":")]
    except ValueError:
        parts = []
    if not parts or len(parts) > 3 or any(p < 0 for p in parts) or (dash and not days):
        raise argparse.ArgumentTypeError(
            f"--timeout {text!r}: give minutes, H:MM:SS or D-HH:MM:SS (SLURM's --time)"
        )
    if dash:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
        seconds = ((day * 24 + parts[0]) * 60 + parts[1]) * 60 + parts[2]
    elif len(parts) == 1:  # minutes
        seconds = parts[0] * 60
    elif len(parts) == 2:  # minutes:seconds
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"--timeout {text!r}: give a time longer than zero")
    return -(-seconds // 60)


def add_submit(sub, check):
    """Declare ``submit``; ``check(argv)`` parses the command to submit (the CLI's parser)."""
    p = sub.add_parser(
        "submit",
        help="run extract, evaluate or analyze as a SLURM job (submitit), requeued and "
        "resumed when preempted",
        description="Submit one imagenet-cog command as a SLURM job through submitit: NODES "
        "machines, one task per GPU, each a process of the command. A job that runs out of "
        "time or is preempted stops the command (its files stay whole) and is requeued with the "
        "same command, which resumes. Its logs and state are in the jobs folder: imagenet-cog "
        "submit --status. Any sbatch option OPT is given as --slurm-OPT VALUE (--slurm-account "
        "vision, --slurm-qos high, --slurm-exclusive).",
        usage="imagenet-cog submit --nodes N --gpus-per-node G --partition P --timeout T "
        "[--slurm-OPTION VALUE ...] -- extract|evaluate|analyze ...\n"
        "       imagenet-cog submit --status",
    )
    p.__class__ = _SubmitParser
    p.add_argument("--nodes", type=int, default=1, help="machines (1)")
    p.add_argument("--gpus-per-node", type=int, default=1, help="GPUs on each machine (1)")
    p.add_argument(
        "--tasks-per-node",
        type=int,
        default=None,
        help="processes on each machine (default: one per GPU, at least one)",
    )
    p.add_argument("--partition", default=None, help="the SLURM partition")
    p.add_argument(
        "--timeout",
        type=timeout_minutes,
        default=None,
        metavar="T",
        help="the job's time limit: minutes, H:MM:SS or D-HH:MM:SS (needed to submit)",
    )
    p.add_argument("--cpus-per-task", type=int, default=None, help="CPU cores of each task")
    p.add_argument("--mem-gb", type=float, default=None, help="memory of each machine, in GB")
    p.add_argument("--name", default=None, help="the job's name (default: imagenet-cog-COMMAND)")
    p.add_argument(
        "--requeues",
        type=int,
        default=3,
        help="times a job that runs out of time is requeued (a preempted job, every time)",
    )
    p.add_argument(
        "--jobs-dir",
        default=JOBS_DIR,
        metavar="DIR",
        help="where the jobs' logs and state go (on a filesystem the machines share)",
    )
    p.add_argument(
        "--cluster",
        choices=["slurm", "local"],
        default="slurm",
        help="slurm, or local: on this machine through submitit's local executor, a try of the "
        "job before the cluster",
    )
    p.add_argument(
        "--slurm",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="an sbatch option (written --slurm-OPTION VALUE); repeatable",
    )
    p.add_argument("--status", action="store_true", help="show the jobs of --jobs-dir and end")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the imagenet-cog command")
    p.set_defaults(run=lambda args: run_submit(args, check))


def _command(args, check):
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ValueError(
            "give the command after --: imagenet-cog submit --nodes 1 --gpus-per-node 4 "
            "--timeout 24:00:00 -- evaluate FEATURES --out RESULTS"
        )
    if command[0] not in COMMANDS:
        raise ValueError(f"submit runs {', '.join(COMMANDS)}, not {command[0]!r}")
    try:
        check(command)  # a typo fails here, not in the queue
    except SystemExit:
        raise ValueError(
            f"the command to submit does not parse (see above): imagenet-cog {' '.join(command)}"
        ) from None
    return command


def make_executor(args, folder, command):
    """submitit's executor of ``args`` (``--cluster`` slurm or local), its jobs in ``folder``."""
    from .._optional_dependencies import require

    submitit = require("submitit", "imagenet-cog submit")
    if args.timeout is None:
        raise ValueError("give the job's time limit: --timeout 24:00:00 (SLURM's --time)")
    for name in ("nodes", "gpus_per_node", "requeues"):
        if getattr(args, name) < (0 if name != "nodes" else 1):
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: too few")
    if args.cluster == "local" and args.nodes != 1:
        raise ValueError("--cluster local runs the job on this machine: give --nodes 1")
    if command[0] == "analyze" and args.nodes * params_tasks(args) > 1:
        raise ValueError(
            "analyze runs in one process: give --nodes 1 and --gpus-per-node 1 (or "
            "--tasks-per-node 1)"
        )
    if args.cluster == "slurm" and shutil.which("srun") is None:
        raise ValueError(
            "no SLURM here (srun and sbatch are not on PATH): submit from a machine of the "
            "cluster, or try the job on this one with --cluster local"
        )
    executor = submitit.AutoExecutor(
        folder=Path(folder) / "%j",
        cluster=args.cluster,
        slurm_max_num_timeout=args.requeues,
        local_max_num_timeout=args.requeues,
    )
    params = {
        "name": args.name or f"imagenet-cog-{command[0]}",
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "tasks_per_node": args.tasks_per_node or max(1, args.gpus_per_node),
        "timeout_min": args.timeout,
    }
    if args.cpus_per_task is not None:
        params["cpus_per_task"] = args.cpus_per_task
    if args.mem_gb is not None:
        params["mem_gb"] = args.mem_gb
    if args.cluster == "slurm":
        if args.partition:
            params["slurm_partition"] = args.partition
        extra = {}
        for item in args.slurm:
            name, eq, value = item.partition("=")
            if not name:
                raise ValueError(f"--slurm-{item}: give --slurm-OPTION VALUE")
            extra[name] = value if eq else True
        if extra:
            params["slurm_additional_parameters"] = extra
    executor.update_parameters(**params)
    return executor


def run_submit(args, check):
    folder = Path(args.jobs_dir).absolute()
    if args.status:
        print(status_table(folder))
        return 0
    command = _command(args, check)
    executor = make_executor(args, folder, command)
    job = executor.submit(CommandJob(command))
    shape = (
        f"{args.nodes} node(s) x {params_tasks(args)} task(s)"
        + (f", {args.gpus_per_node} GPU(s) each" if args.gpus_per_node else "")
        + (f", partition {args.partition}" if args.partition and args.cluster == "slurm" else "")
        + f", {args.timeout} min"
    )
    entry = {
        "job_id": str(job.job_id),
        "cluster": args.cluster,
        "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": command,
        "shape": shape,
        "folder": str(job.paths.folder),
        "stdout": str(job.paths.stdout),
        "stderr": str(job.paths.stderr),
    }
    folder.mkdir(parents=True, exist_ok=True)
    locked_append(folder / INDEX, json.dumps(entry, sort_keys=True) + "\n")
    print(f"submitted job {job.job_id} ({args.cluster}, {shape}): imagenet-cog {' '.join(command)}")
    print(f"its log: {job.paths.stdout} (and .err); its state: imagenet-cog submit --status")
    return 0


def params_tasks(args):
    return args.tasks_per_node or max(1, args.gpus_per_node)


# ------------------------------------------------------------------ the job
def _before_the_command():  # pragma: no cover - runs in the child, before exec
    """Ctrl-C back to its default in the command, and the command dies with its task.

    A job started where Ctrl-C is ignored (from a shell's background, as ``nohup ... &``
    does) passes that on, and Python turns Ctrl-C into KeyboardInterrupt only when it is not
    ignored: the stop :meth:`CommandJob.checkpoint` sends would not reach the command. On
    Linux, a task ended by its scheduler leaves no command behind to race the requeued one.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class CommandJob:
    """One imagenet-cog command run by each task of a submitit job.

    Called in the job, it runs ``python -m imagenet_cog COMMAND`` with the variables of
    torch.distributed set for its task (when the job has several), and rank 0 keeps the job's
    ``state.json``. Preempted or out of time, submitit calls :meth:`checkpoint` on rank 0: the
    command is stopped (Ctrl-C) and the same command is requeued, to resume.

    Parameters
    ----------
    command : list of str
        The command's words after ``imagenet-cog``.
    """

    def __init__(self, command):
        self.command = list(command)
        self._child = None
        self._state = None

    def __getstate__(self):  # pickled by submitit: the command only
        return {"command": self.command}

    def __setstate__(self, state):
        self.__init__(state["command"])

    def _write_state(self, **fields):
        if self._state is None:
            return
        try:
            state = json.loads(self._state.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            state = {}
        state.update(fields, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
        with contextlib.suppress(OSError):
            atomic_write_text(self._state, json.dumps(state, indent=1, sort_keys=True) + "\n")

    def __call__(self):
        import submitit

        job = submitit.JobEnvironment()
        env = dict(os.environ)
        if job.num_tasks > 1:
            dist = submitit.helpers.TorchDistributedEnvironment()
            env.update(
                MASTER_ADDR=str(dist.master_addr),
                MASTER_PORT=str(dist.master_port),
                RANK=str(dist.rank),
                WORLD_SIZE=str(dist.world_size),
                LOCAL_RANK=str(dist.local_rank),
                LOCAL_WORLD_SIZE=str(dist.local_world_size),
            )
        if job.global_rank == 0:
            self._state = Path(job.paths.folder) / STATE
            try:
                attempt = json.loads(self._state.read_text(encoding="utf-8")).get("attempts", 0)
            except (OSError, ValueError):
                attempt = 0
            self._write_state(
                state="running",
                attempts=attempt + 1,
                job_id=str(job.job_id),
                host=socket.gethostname(),
                pid=os.getpid(),
                command=self.command,
            )
        self._child = subprocess.Popen(
            [sys.executable, "-m", "imagenet_cog", *self.command],
            env=env,
            # The task runs no thread of its own: the hook runs safely before the exec.
            preexec_fn=_before_the_command if os.name == "posix" else None,  # noqa: PLW1509
        )
        try:
            # Polled, not waited for: submitit's signal handler (checkpoint) runs in this
            # thread, and Popen.wait would hold the lock its own poll needs.
            while (code := self._child.poll()) is None:
                time.sleep(0.2)
        finally:
            self._stop()
        if code != 0:
            self._write_state(state="failed", exit_code=code)
            raise RuntimeError(
                f"imagenet-cog {self.command[0]} ended with exit code {code} (its error is "
                "above in this log); fix it, then submit it again: it resumes"
            )
        self._write_state(state="finished", exit_code=0)
        return code

    def _stop(self):
        """End the command, if it still runs: Ctrl-C, then a kill after :data:`STOP_S`."""
        child = self._child
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_S
        while child.poll() is None:
            if time.monotonic() > deadline:
                child.kill()
                return
            time.sleep(0.1)

    def checkpoint(self, *args, **kwargs):
        """Stop the command and return the same one, which submitit requeues (it resumes)."""
        from submitit.helpers import DelayedSubmission

        self._stop()
        self._write_state(state="requeued")
        return DelayedSubmission(CommandJob(self.command), *args, **kwargs)


# ------------------------------------------------------------------ status
def _scheduler_state(entry):
    """SLURM's (or the local executor's) state of a job, or ``""`` when none answers."""
    if entry.get("cluster") == "local":
        try:
            os.kill(int(entry["job_id"]), 0)  # the local job's id is its controller's PID
        except (OSError, ValueError):
            return "ENDED"
        return "RUNNING"
    try:
        import submitit

        job = submitit.SlurmJob(folder=entry["folder"], job_id=entry["job_id"])
        return str(job.state)
    except Exception:  # noqa: BLE001 - no sacct here, or no submitit: our own state only
        return ""


def status_table(folder):
    """The jobs of the jobs folder ``folder`` as a table, newest last."""
    index = Path(folder) / INDEX
    entries = []
    with contextlib.suppress(OSError):
        for line in index.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                entries.append(json.loads(line))
    if not entries:
        return f"no job submitted from {folder} (imagenet-cog submit ... -- COMMAND submits one)"
    rows = [("job", "scheduler", "command", "attempts", "state", "log")]
    for entry in entries:
        try:
            state = json.loads((Path(entry["folder"]) / STATE).read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError):
            state = {}
        run = state.get("state", "not started")
        if "exit_code" in state and state.get("state") == "failed":
            run += f" (exit {state['exit_code']})"
        command = " ".join(entry.get("command", []))
        rows.append(
            (
                str(entry.get("job_id", "?")),
                _scheduler_state(entry) or "-",
                command if len(command) <= 48 else command[:45] + "...",
                str(state.get("attempts", 0)),
                run,
                str(entry.get("stdout", "")),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    return "\n".join(re.sub(r"\s+$", "", line) for line in lines)
