"""The processes of a job, for the extraction and for ``evaluate``; or one process.

- :func:`launch_env` and :func:`join_group`: whether ``torchrun`` (on one machine or several)
  or SLURM's ``srun`` started several processes, and joining their group (NCCL on CUDA, each
  process on the GPU its local rank names; else Gloo). Where torchrun's variables and SLURM's
  are both set, torchrun's win;
- :func:`expand_nodelist`: the hosts of a SLURM node list (``node[01-03,7]``), without
  ``scontrol``;
- :func:`process_group`: an extraction's estimator set up for this process;
- :func:`check_shared_folder`: every process of a job on several machines sees the files the
  others write in a folder, and their file locks; :func:`lock_problem`: what a folder's
  filesystem, as this machine mounts it, cannot guarantee of file locks across machines;
- :class:`Part`: one part of a run split into independent jobs (``--part i/n``, a SLURM job
  array);
- :class:`Ranks`: the processes as one run sees them, with the collectives every rank calls
  at the same moment (:meth:`~Ranks.all_ok`, :meth:`~Ranks.least`, :meth:`~Ranks.broadcast`,
  :meth:`~Ranks.check_all`) and, for ``evaluate``, a wait for the others' remaining work that
  no timeout cuts short (:meth:`~Ranks.wait_for_all`). The feature stores take the group
  already initialised (:meth:`Ranks.current`); ``evaluate`` joins its job's
  (:meth:`Ranks.start`).

Imports nothing from the package but the base modules of devices and files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import random
import re
import secrets
import socket
import threading
import time
import warnings
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

__all__ = [
    "BEAT_S",
    "SHARED_FS_WAIT_S",
    "SILENCE_S",
    "SLURM_PORTS",
    "Launch",
    "Part",
    "Ranks",
    "check_shared_folder",
    "expand_nodelist",
    "join_group",
    "launch_env",
    "lock_problem",
    "process_group",
    "torchrun_env",
    "wait_until_seen",
]

#: The ports a SLURM job's rendezvous is picked from when ``MASTER_PORT`` is not set, seeded
#: by the job's id so that every task of the job picks the same one (as DINOv2 does).
SLURM_PORTS = (20_000, 60_000)


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process was started among the processes of its job.

    Attributes
    ----------
    rank, world, local_rank : int
        This process, the number of processes, and this process among those of its machine.
    source : {"torchrun", "srun"}
        Who said so: torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) or SLURM's
        (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``).
    master_addr, master_port : str and int, or None
        Where rank 0 holds the group's store: for ``srun``, ``MASTER_ADDR`` or else the first
        host of the step's node list, and ``MASTER_PORT`` or else a port drawn from
        :data:`SLURM_PORTS` with the job id as seed; torchrun's are read by torch itself.
    """

    rank: int
    world: int
    local_rank: int
    source: str
    master_addr: str | None = None
    master_port: int | None = None


def expand_nodelist(text):
    """The host names of a SLURM node list, in its order, without calling ``scontrol``.

    Examples
    --------
    >>> expand_nodelist("node[01-03,7],gpu-a[1-2]-x,login")
    ['node01', 'node02', 'node03', 'node7', 'gpu-a1-x', 'gpu-a2-x', 'login']
    >>> expand_nodelist("rack[1-2]-n[08-09]")
    ['rack1-n08', 'rack1-n09', 'rack2-n08', 'rack2-n09']
    """
    text = (text or "").strip()
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            break
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    if depth != 0 or not text or not all(items):
        raise ValueError(f"cannot read the SLURM node list {text!r}: expected host[01-03,7],...")
    hosts = []
    for item in items:
        names = [""]
        for part in re.split(r"(\[[^\]]*\])", item):
            if not part.startswith("["):
                names = [n + part for n in names]
                continue
            numbers = []
            for span in part[1:-1].split(","):
                first, _, last = span.partition("-")
                if not first.isdigit() or (last and not last.isdigit()):
                    raise ValueError(f"cannot read the SLURM node list {text!r}: range {span!r}")
                width = len(first)
                numbers += [f"{k:0{width}d}" for k in range(int(first), int(last or first) + 1)]
            names = [n + k for n in names for k in numbers]
        hosts += names
    return hosts


def _int_of(environ, name, default=None):
    value = environ.get(name)
    if value is None:
        if default is None:
            raise KeyError(name)
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number") from None


_srun_hint_given = False


def launch_env(environ=None):
    """The :class:`Launch` of this process when it is one of several; ``None`` alone.

    torchrun's variables first (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``: set, they decide, a
    ``WORLD_SIZE`` of 1 included); else SLURM's, in a task started by ``srun`` (one with a
    ``SLURM_STEP_ID``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, and the first
    host of ``SLURM_STEP_NODELIST`` (or ``SLURM_JOB_NODELIST``) for rank 0's address. A batch
    script that runs the command itself, without ``srun``, is one process, whatever
    ``SLURM_NTASKS`` says (a warning says so).
    """
    global _srun_hint_given
    environ = os.environ if environ is None else environ
    if "RANK" in environ and "WORLD_SIZE" in environ:
        world = _int_of(environ, "WORLD_SIZE")
        if world <= 1:
            return None
        return Launch(
            _int_of(environ, "RANK"), world, _int_of(environ, "LOCAL_RANK", 0), "torchrun"
        )
    if "SLURM_PROCID" not in environ or "SLURM_NTASKS" not in environ:
        return None
    world = _int_of(environ, "SLURM_NTASKS")
    if world <= 1:
        return None
    if "SLURM_STEP_ID" not in environ and "SLURM_STEPID" not in environ:
        if not _srun_hint_given:
            _srun_hint_given = True
            warnings.warn(
                f"SLURM_NTASKS is {world} but this process was not started by srun: it runs "
                "as one process; start the command with srun (one task per GPU) to use the "
                "job's tasks",
                UserWarning,
                stacklevel=3,
            )
        return None
    nodes = next(
        (
            environ[k]
            for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
            if environ.get(k)
        ),
        None,
    )
    addr = environ.get("MASTER_ADDR")
    if not addr:
        if nodes is None:
            raise ValueError(
                "started by srun without SLURM_JOB_NODELIST: set MASTER_ADDR to the host of task 0"
            )
        addr = expand_nodelist(nodes)[0]
    if environ.get("MASTER_PORT"):
        port = _int_of(environ, "MASTER_PORT")
    else:
        seed = environ.get("SLURM_JOB_ID", "0")
        port = random.Random(int(seed) if seed.isdigit() else seed).randint(*SLURM_PORTS)
    return Launch(
        _int_of(environ, "SLURM_PROCID"),
        world,
        _int_of(environ, "SLURM_LOCALID", 0),
        "srun",
        addr,
        port,
    )


def torchrun_env():
    """``(rank, world size, local rank)`` when torchrun or srun started several processes."""
    launch = launch_env()
    return None if launch is None else (launch.rank, launch.world, launch.local_rank)


def _gpu_of(local_rank):
    """The index of this process's GPU: its local rank, or 0 where it sees one GPU only (a
    task given its own GPU, ``srun --gpus-per-task 1``)."""
    import torch

    count = torch.cuda.device_count()
    if local_rank < count:
        return local_rank
    if count == 1:
        return 0
    raise ValueError(
        f"this process is number {local_rank} of its machine ({socket.gethostname()}) but "
        f"sees {count} GPU(s): start one process per GPU (torchrun --nproc-per-node, srun "
        "--ntasks-per-node)"
    )


def _tcp(host, port):
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def join_group(device, timeout):
    """Join the process group of the job: ``(rank, world, device, created)``.

    On CUDA (``device``, or the default device when ``None``) each process takes the GPU that
    its local rank names and the group uses NCCL, else Gloo. ``created`` says whether the
    group was initialised here (and so is to be destroyed by the caller). Started by neither
    torchrun nor srun: ``(0, 1, device, False)``.
    """
    launch = launch_env()
    if launch is None:
        return 0, 1, device, False
    import torch
    import torch.distributed as dist

    from ._device import device_type

    cuda = device_type(device).startswith("cuda")
    if cuda:  # one GPU per process
        index = _gpu_of(launch.local_rank)
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
    created = not dist.is_initialized()
    if created:
        backend = "nccl" if cuda else "gloo"
        if launch.source == "torchrun":
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            dist.init_process_group(
                backend=backend,
                init_method=_tcp(launch.master_addr, launch.master_port),
                rank=launch.rank,
                world_size=launch.world,
                timeout=timeout,
            )
    return launch.rank, launch.world, device, created


@contextmanager
def process_group(extractor, progress, folder=None):
    """Yield ``(extractor, progress)`` set up for this process.

    Alone: unchanged. One of several processes (torchrun, srun): the group is initialized
    (NCCL on CUDA, Gloo on the CPU) unless it already is, and closed at the end if it was
    opened here; on CUDA the extractor runs on the GPU that its local rank names; only rank 0
    shows progress. With ``folder`` (where the processes write), every process checks that it
    shares the folder and its file locks with the others (:func:`check_shared_folder`).
    """
    rank, world, device, created = join_group(extractor.device, timedelta(hours=2))
    if device != extractor.device:
        from sklearn.base import clone

        extractor = clone(extractor).set_params(device=device)
    progress = progress if rank == 0 else False
    try:
        if folder is not None and world > 1:
            check_shared_folder(folder, Ranks.current(), "the feature store root")
        yield extractor, progress
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()


# ------------------------------------------------------------------ a shared filesystem
#: Where this machine lists its mounts (a test points it at a file of its own).
MOUNTINFO = "/proc/self/mountinfo"


def _unescaped(field):
    """A path of mountinfo, its spaces and tabs written as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(folder):
    """``(mount point, filesystem type, options)`` of the mount holding ``folder`` (or its
    nearest existing parent) on this machine; ``None`` when the mounts cannot be read."""
    path = Path(os.path.abspath(folder))
    while not path.exists() and path != path.parent:
        path = path.parent
    path = os.path.realpath(path)
    try:
        lines = Path(MOUNTINFO).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or not tail:
            continue
        point = _unescaped(fields[4])
        if path == point or path.startswith(point.rstrip("/") + "/"):
            options = set(fields[5].split(","))
            if len(tail) > 2:
                options |= set(tail[2].split(","))
            if best is None or len(point) >= len(best[0]):  # the last of stacked mounts wins
                best = (point, tail[0], options)
    return best


def lock_problem(folder):
    """What the filesystem of ``folder``, as this machine mounts it, cannot guarantee of the
    file locks (``flock``) that processes on other machines take there, in one line; ``None``
    when its type and options show nothing wrong.

    Lustre honours ``flock`` across machines only when mounted with ``-o flock``
    (``localflock`` keeps each lock on its machine, and without either ``flock`` fails); NFS
    emulates it with byte-range locks its server shares, unless mounted with ``nolock`` or
    ``local_lock=flock`` or ``all``.
    """
    found = mount_of(folder)
    if found is None:
        return None
    point, kind, options = found
    where = f"{folder} is on {kind} (mounted at {point})"
    if kind == "lustre" and "flock" not in options:
        if "localflock" in options:
            return (
                f"{where} with localflock: its file locks are seen on this machine only; mount "
                "it with -o flock to run on several machines"
            )
        return f"{where} without flock: file locks fail there; mount it with -o flock"
    if kind.startswith("nfs"):
        local = next((o.split("=", 1)[1] for o in options if o.startswith("local_lock=")), None)
        how = "nolock" if "nolock" in options else f"local_lock={local}"
        if "nolock" in options or local in ("flock", "all"):
            return (
                f"{where} with {how}: its file locks are seen on this machine only; mount it "
                "without (local_lock=none, the default) to run on several machines"
            )
    return None


def check_shared_folder(folder, ranks, what="the folder"):
    """Refuse, on every process at once, a ``folder`` the processes of a job cannot share.

    A collective: every rank calls it. Rank 0 writes a file there and holds an exclusive
    ``flock`` on it; every other rank must see the file and be refused the lock, as a process
    of another job would be. Where the ranks run on several machines, each also reads how its
    machine mounts the folder (:func:`lock_problem`).

    Raises
    ------
    RuntimeError
        On every rank, naming the first rank (and its host) that found a problem and the
        problem: the folder is not shared, or its locks are not seen from that machine.
    """
    import fcntl

    if ranks.world == 1 or ranks._dist is None:  # alone, or no group to ask the others
        return
    folder = Path(folder)
    hosts = ranks.gather_text(socket.gethostname())
    nonce = ranks.broadcast([secrets.randbits(62)])[0]
    probe = folder / f".shared-check-{nonce:016x}.tmp-0"  # a temporary name the stores clear
    fd, error = None, None
    if ranks.rank == 0:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, f"{nonce:016x}\n".encode("ascii"))
            os.fsync(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            error = exc
    try:
        ranks.check_all(error, f"checking {folder}")
        problem = ""
        if ranks.rank != 0:
            problem = _probe_problem(probe, nonce, hosts)
        if not problem and len(set(hosts)) > 1:
            problem = lock_problem(folder) or ""
        problems = ranks.gather_text(problem)
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(probe)
            os.close(fd)  # the lock goes with it
    for rank, text in enumerate(problems):
        if text:
            raise RuntimeError(
                f"{what} {folder} cannot be shared by the processes of this job: rank {rank} on "
                f"{hosts[rank]} {text}"
            )


def _probe_problem(probe, nonce, hosts):
    """What this rank finds wrong with rank 0's probe file (``""``: nothing)."""
    import fcntl

    try:
        fd = os.open(probe, os.O_RDWR)  # NFS grants an exclusive lock to writers only
    except FileNotFoundError:
        return (
            f"does not see the file rank 0 on {hosts[0]} wrote there: put it on a filesystem "
            "every machine of the job mounts (NFS, Lustre, GPFS...)"
        )
    except OSError as exc:
        return f"cannot open the file rank 0 wrote there ({exc.strerror})"
    try:
        if os.pread(fd, 64, 0).decode("ascii", "replace").strip() != f"{nonce:016x}":
            return f"reads another file than the one rank 0 on {hosts[0]} wrote there"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return ""
        except OSError as exc:
            return (
                f"cannot take a file lock there ({exc.strerror}): mount it with locks (Lustre: "
                "-o flock; NFS: without nolock)"
            )
        fcntl.flock(fd, fcntl.LOCK_UN)
        return (
            f"took a file lock that rank 0 on {hosts[0]} holds: the locks of that filesystem are "
            "not shared by the machines (Lustre mounted with localflock? NFS with local_lock or "
            "nolock?); mount it with locks every machine sees (Lustre: -o flock)"
        )
    finally:
        os.close(fd)


#: Seconds rank 0 waits for the files other machines wrote to show up: NFS may answer from
#: its cache, for up to a minute, that a name it looked up before the file was made is missing.
SHARED_FS_WAIT_S = 120.0


def wait_until_seen(missing, world, wait=None):
    """``missing()`` (what is not there yet, a list) once, or, with several processes (``world``),
    again every second until it is empty or ``wait`` seconds (:data:`SHARED_FS_WAIT_S`) have
    passed; returns its last answer.

    Examples
    --------
    >>> answers = iter([["shard 3"], ["shard 3"], []])
    >>> wait_until_seen(lambda: next(answers), world=2, wait=10)
    []
    """
    left = missing()
    deadline = time.monotonic() + (SHARED_FS_WAIT_S if wait is None else wait)
    while left and world > 1 and time.monotonic() < deadline:
        time.sleep(1.0)
        left = missing()
    return left


# ------------------------------------------------------------------ parts of a run
@dataclasses.dataclass(frozen=True)
class Part:
    """Part ``number`` of ``count`` of a run split into independent jobs, numbered from 1.

    Examples
    --------
    >>> Part.parse("2/3"), Part.parse("2/3").index
    (Part(number=2, count=3), 1)
    >>> env = {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "3",
    ...        "SLURM_ARRAY_TASK_MIN": "0"}
    >>> Part.parse("0/3", env)  # a SLURM job array of ids 0, 1, 2
    Part(number=1, count=3)
    """

    number: int
    count: int

    @property
    def index(self):
        """The part counted from 0."""
        return self.number - 1

    def __str__(self):
        return f"{self.number}/{self.count}"

    @classmethod
    def parse(cls, text, environ=None):
        """``"i/n"``: part ``i`` of ``n``, from 1 to ``n``.

        In a task of a SLURM job array, ``$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`` is
        read as the array numbers its tasks, from ``SLURM_ARRAY_TASK_MIN`` by
        ``SLURM_ARRAY_TASK_STEP`` (``--array=0-2`` and ``--array=1-3`` both make parts 1, 2
        and 3).

        Raises
        ------
        ValueError
            Naming ``--part`` and what is wrong.
        """
        environ = os.environ if environ is None else environ
        number, sep, count = str(text).strip().partition("/")
        if not sep or not number.isdigit() or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--part {text!r}: give i/n, part i of n (2/3, or 1/1 for all)")
        number, count = int(number), int(count)
        task = environ.get("SLURM_ARRAY_TASK_ID")
        in_array = task is not None and task.isdigit() and int(task) == number
        if in_array and environ.get("SLURM_ARRAY_TASK_COUNT", str(count)) == str(count):
            first = int(environ.get("SLURM_ARRAY_TASK_MIN", "1") or 1)
            step = int(environ.get("SLURM_ARRAY_TASK_STEP", "1") or 1)
            number = (number - first) // max(step, 1) + 1
        if not 1 <= number <= count:
            raise ValueError(
                f"--part {text}: parts are numbered 1 to {count} (in a SLURM job array, "
                "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT of an array --array=0-"
                f"{count - 1} or 1-{count})"
            )
        return cls(number, count)


#: Seconds between two signs of life of a rank of ``evaluate`` (a counter in the group's store).
BEAT_S = 5.0
#: Seconds without a sign of life after which a waiting rank gives up on another: a rank killed
#: by something other than torchrun's agent (``srun``, a script) never says it failed.
SILENCE_S = 300.0


class Ranks:
    """The processes of one run (one process when neither torchrun nor srun started several).

    Two ways in: :meth:`current` takes the torch.distributed group already initialised in
    this process, if any (a feature store built inside an extraction's group); ``Ranks(device)``
    then :meth:`start` joins the job's group (NCCL on CUDA, Gloo on the CPU), which the context
    manager leaves when it started it (``evaluate``). Until then, or alone, every collective
    answers for this process alone.

    The collectives (:meth:`barrier`, :meth:`all_ok`, :meth:`least`, :meth:`broadcast`,
    :meth:`check_all`) are for moments when every rank gets there at about the same time;
    :meth:`wait_for_all` waits for the others' remaining work, however long it takes, as long
    as they are alive: each rank adds to its own counter in the group's store every
    :data:`BEAT_S` seconds from a thread, and a rank silent for :data:`SILENCE_S` seconds is
    taken for dead.
    """

    _calls = itertools.count(1)  # evaluate calls in this process (the same on every rank)

    def __init__(self, device=None):
        self.rank, self.world, self.device = 0, 1, device
        self._dist = None  # torch.distributed, once this process is in a group
        self._created, self._call, self._beating = False, 0, None

    @classmethod
    def current(cls):
        """The group already initialised in this process, if one is; else one process."""
        ranks = cls()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            ranks._dist = dist
            ranks.rank, ranks.world = dist.get_rank(), dist.get_world_size()
        return ranks

    def start(self):
        """Join the job's group when torchrun or srun started several processes; returns
        ``self``."""
        if torchrun_env() is None:
            return self
        import torch.distributed as dist

        self.rank, self.world, self.device, self._created = join_group(
            self.device, timedelta(hours=6)
        )
        self._dist = dist
        self._call = next(Ranks._calls)
        self._start_beating()
        return self

    def _start_beating(self):
        """Add to this rank's counter every :data:`BEAT_S` seconds until stopped."""
        stop = threading.Event()
        store, key, beat = self._store(), self._key(f"alive/{self.rank}"), BEAT_S

        def beating():
            # The store may be gone (rank 0, which holds it, ended): nothing left to tell.
            with contextlib.suppress(Exception):
                while True:
                    store.add(key, 1)
                    if stop.wait(beat):
                        return

        threading.Thread(target=beating, name="imagenet_cog-heartbeat", daemon=True).start()
        self._beating = stop

    def _stop_beating(self):
        if self._beating is not None:
            self._beating.set()
            self._beating = None

    def barrier(self):
        if self._dist is not None:
            self._dist.barrier()

    def _tensor(self, values):
        """``values`` as int64 on the device the group's backend reduces on."""
        import torch

        device = "cpu"
        if self._dist.get_backend() == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        return torch.tensor(values, dtype=torch.int64, device=device)

    def _reduce_min(self, value):
        flag = self._tensor([int(value)])
        self._dist.all_reduce(flag, op=self._dist.ReduceOp.MIN)
        return int(flag.item())

    def all_ok(self, ok):
        """Whether ``ok`` holds on every rank (a collective: every rank must call it)."""
        if self._dist is None:
            return bool(ok)
        return bool(self._reduce_min(bool(ok)))

    def least(self, value):
        """The smallest ``value`` (an int, or None on every rank) over the ranks."""
        if self._dist is None or value is None:
            return value
        return self._reduce_min(value)

    def broadcast(self, values):
        """Rank 0's list of ints, on every process."""
        if self._dist is None:
            return list(values)
        t = self._tensor(list(values))
        self._dist.broadcast(t, src=0)
        return t.tolist()

    def gather(self, values):
        """Every rank's list of ints (each of the same length), in rank order."""
        if self._dist is None:
            return [list(values)]
        t = self._tensor(list(values))
        out = [t.clone() for _ in range(self.world)]
        self._dist.all_gather(out, t)
        return [x.tolist() for x in out]

    def gather_text(self, text, limit=1024):
        """Every rank's ``text`` (its first ``limit`` bytes of UTF-8), in rank order."""
        data = text.encode("utf-8")[:limit]
        rows = self.gather([len(data), *data, *[0] * (limit - len(data))])
        return [bytes(row[1 : 1 + row[0]]).decode("utf-8", "replace") for row in rows]

    def check_all(self, error, what):
        """Raise ``error`` on this process, and an error on every other one, if any failed.

        Called by every process where it would wait at a barrier: a process whose work raised
        tells the others, which stop at once instead of waiting for it until the group's
        timeout.
        """
        if self.all_ok(error is None):
            return
        if error is not None:
            raise error
        raise RuntimeError(
            f"another process failed while {what} (its error is in its output); run the "
            "same command again to resume"
        )

    def run(self, work, what):
        """``work()`` on every process, then :meth:`check_all` of what it raised."""
        error = result = None
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 - raised by check_all, after telling the others
            error = exc
        self.check_all(error, what)
        return result

    def wait_for_all(self, progress=False, poll=2.0):
        """Return once every rank has called this, without a collective.

        A rank that is done early (after a resume it may have no cells left) waits here for
        the others' whole remaining work, which can take longer than the group's timeout: a
        barrier would then abort the job, and under NCCL hold the GPU meanwhile. So each
        rank adds itself to a counter in torchrun's rendezvous store and polls it, with
        its device memory handed back first; rank 0 shows how many are done.
        """
        if self._dist is None:
            return
        import torch
        from tqdm.auto import tqdm

        from ._device import device_type

        if device_type(self.device).startswith("cuda"):
            torch.cuda.empty_cache()
        store = self._store()
        store.add(self._key(f"finished/{self.rank}"), 1)
        self._stop_beating()  # the others look for the signs of life of unfinished ranks only
        done = int(store.add(self._key("finished"), 1))
        delay = 0.05
        heard = {}  # rank: (its counter, when it last moved)
        with tqdm(
            total=self.world,
            initial=done,
            desc="processes finished",
            unit="process",
            disable=not progress,
            leave=False,
        ) as bar:
            while done < self.world:
                try:
                    failed = int(store.add(self._key("failed"), 0))
                    silent = self._silent(store, heard)
                    done = int(store.add(self._key("finished"), 0))
                except Exception as exc:  # noqa: BLE001 - the store went with the rank holding it
                    raise RuntimeError(
                        f"rank {self.rank} lost the group's store, held by rank 0 ({exc}): rank 0 "
                        "stopped or was killed; the cells it had not finished are missing from "
                        "runs.jsonl: run again to resume"
                    ) from None
                if failed:
                    raise RuntimeError(
                        "another process of this run failed (its error says why); the cells "
                        "it had not finished are missing from runs.jsonl: run again to resume"
                    )
                if silent is not None:
                    raise RuntimeError(
                        f"rank {silent} did not report for {SILENCE_S:g} s (killed, or its "
                        "machine lost?); the cells it had not finished are missing from "
                        "runs.jsonl: run again to resume"
                    )
                time.sleep(delay)
                delay = min(poll, 2 * delay)
                bar.update(done - bar.n)
        # Every rank is done: one barrier, which they all reach within a poll, before any
        # leaves. Without it rank 0 could end first, and with it the store the others still
        # poll, where no torchrun agent holds the store (srun, a script).
        self._dist.barrier()

    def _silent(self, store, heard):
        """The first unfinished rank whose counter has not moved for :data:`SILENCE_S` s."""
        now = time.monotonic()
        for rank in range(self.world):
            if rank == self.rank or int(store.add(self._key(f"finished/{rank}"), 0)):
                continue
            beats = int(store.add(self._key(f"alive/{rank}"), 0))
            last = heard.get(rank)
            if last is None or last[0] != beats:
                heard[rank] = (beats, now)
            elif now - last[1] > SILENCE_S:
                return rank
        return None

    def failed(self):
        """Tell the ranks in :meth:`wait_for_all` that this one will not get there."""
        if self._dist is None:
            return
        self._stop_beating()
        # The store may be gone too; the error that matters is this rank's own.
        with contextlib.suppress(Exception):
            self._store().add(self._key("failed"), 1)

    def _store(self):
        import torch.distributed as dist

        return dist.distributed_c10d._get_default_store()

    def _key(self, what):
        return f"imagenet_cog/evaluate/{self._call}/{what}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stop_beating()
        if self._created:
            import torch.distributed as dist

            dist.destroy_process_group()
