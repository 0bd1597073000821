"""Atomic writes and folder locks (imagenet_cog._fileio)."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from imagenet_cog._fileio import (
    FolderLock,
    FolderLockedError,
    atomic_write_bytes,
    atomic_write_text,
    locked_append,
)

HOLD = """
import sys, time
from imagenet_cog._fileio import FolderLock
lock = FolderLock(sys.argv[1], what="run folder").acquire()
print("held", flush=True)
time.sleep(60)
"""


def _hold_in_child(folder):
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True
    )
    with child.stdout:
        assert child.stdout.readline().strip() == "held"
    return child


def test_atomic_write_replaces_whole_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "old")
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


STOPPED_WRITER = """
import os, signal, sys, time
from imagenet_cog import _fileio
how = sys.argv[2]
def stop(tmp, path):  # between the temporary file's last byte and its rename
    print("written", flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
_fileio.os.replace = stop
_fileio.atomic_write_bytes(sys.argv[1], b"x" * 1000)
"""


def _stopped_writer(path, how):
    """A process writing ``path`` stopped between its temporary file and the rename: killed
    (``"kill"``) or alive, waiting (``"wait"``)."""
    child = subprocess.Popen(
        [sys.executable, "-c", STOPPED_WRITER, str(path), how], stdout=subprocess.PIPE, text=True
    )
    with child.stdout:
        assert child.stdout.readline().strip() == "written"
    if how == "kill":
        child.wait()
        assert child.returncode == -signal.SIGKILL
    return child


def test_a_killed_writers_temporary_file_is_removed_by_the_next_writer_not_a_live_ones(tmp_path):
    # Before: a writer killed between its temporary file and the rename left
    # ".NAME.tmp-PID" for good; nothing removed it later.
    live = _stopped_writer(tmp_path / "page.html", "wait")
    dead = _stopped_writer(tmp_path / "figure.png", "kill")
    try:
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == [f".figure.png.tmp-{dead.pid}", f".page.html.tmp-{live.pid}"]
        atomic_write_bytes(tmp_path / "other.json", b"{}")  # the next writer in the folder
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            f".page.html.tmp-{live.pid}",  # its writer is alive: kept
            "other.json",
        ]
    finally:
        live.kill()
        live.wait()
    # A later writer (another process, as a rerun is): its writer is gone, the file too.
    write = "import sys; from imagenet_cog._fileio import atomic_write_bytes as w; w(sys.argv[1], b'<html>')"
    subprocess.run([sys.executable, "-c", write, str(tmp_path / "page.html")], check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json", "page.html"]


def test_locked_append_adds_whole_lines(tmp_path):
    path = tmp_path / "runs.jsonl"
    locked_append(path, "one\n")
    locked_append(path, b"two\n")
    assert path.read_text() == "one\ntwo\n"


def test_second_holder_is_refused_with_the_pid(tmp_path):
    child = _hold_in_child(tmp_path)
    try:
        with pytest.raises(FolderLockedError, match=rf"run folder .*\(PID {child.pid}\)"):
            FolderLock(tmp_path, what="run folder").acquire()
    finally:
        child.kill()
        child.wait()


def test_a_killed_holder_releases_the_lock(tmp_path):
    child = _hold_in_child(tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with FolderLock(tmp_path) as lock:
        assert lock.path.read_text().strip() == str(os.getpid())


def test_waiting_holder_gets_the_lock_when_the_first_ends(tmp_path):
    child = _hold_in_child(tmp_path)
    start = time.monotonic()
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -9 {child.pid}"])
    with FolderLock(tmp_path, wait=30):
        assert time.monotonic() - start < 30
    child.wait()
    killer.wait()


def test_released_lock_can_be_taken_again_in_process(tmp_path):
    with FolderLock(tmp_path):
        pass
    with FolderLock(tmp_path):
        pass


def _disk_fills_after(monkeypatch, n_bytes):
    """Make ``_fileio``'s writes succeed for ``n_bytes`` bytes, then fail as a full disk does:
    first a short write, then ENOSPC."""
    import errno

    from imagenet_cog import _fileio

    left = {"n": n_bytes}

    def write(fd, data):
        if left["n"] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), left["n"])
        left["n"] -= n
        return os.write(fd, bytes(data[:n]))

    monkeypatch.setattr(_fileio, "_write", write)


def test_locked_append_goes_on_after_a_short_write(tmp_path, monkeypatch):
    from imagenet_cog import _fileio

    calls = []

    def short(fd, data):  # the kernel may write less than asked, without an error
        calls.append(len(data))
        return os.write(fd, bytes(data[:3]))

    monkeypatch.setattr(_fileio, "_write", short)
    path = tmp_path / "runs.jsonl"
    locked_append(path, "0123456789\n")
    assert path.read_text() == "0123456789\n"
    assert len(calls) > 1


def test_full_disk_mid_line_leaves_whole_lines_and_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "runs.jsonl"
    locked_append(path, '{"a": 1}\n')
    _disk_fills_after(monkeypatch, 4)  # 4 bytes of the next line fit, then the disk is full
    with pytest.raises(OSError, match=r"\[Errno 28\] No space left on device: .*runs\.jsonl"):
        locked_append(path, '{"b": 2}\n')
    assert path.read_text() == '{"a": 1}\n'  # cut back to the last complete line
    monkeypatch.undo()
    locked_append(path, '{"c": 3}\n')  # space again: the next line follows a whole one
    assert path.read_text() == '{"a": 1}\n{"c": 3}\n'


def test_full_disk_in_an_atomic_write_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "manifest.json"
    atomic_write_text(path, "old")
    _disk_fills_after(monkeypatch, 2)
    with pytest.raises(OSError, match=r"\[Errno 28\] No space left on device: .*manifest\.json"):
        atomic_write_bytes(path, b"new contents")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0, reason="mounts a tmpfs (root)"
)
def test_a_real_full_disk_names_the_file(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(small)]
    if subprocess.run(mount, check=False, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        path = small / "runs.jsonl"
        locked_append(path, "x" * 100 + "\n")
        for _ in range(100):  # 16 kB hold at most 16 such lines
            try:
                locked_append(path, "y" * 999 + "\n")
            except OSError as exc:
                error = str(exc)
                break
        assert re.fullmatch(r"\[Errno 28\] No space left on device: '.*runs\.jsonl'", error)
        lines = path.read_text().split("\n")
        assert lines[-1] == "" and set(lines[1:-1]) == {"y" * 999} and lines[0] == "x" * 100
        with pytest.raises(OSError, match=r"\[Errno 28\].*big\.npy"):
            atomic_write_bytes(small / "big.npy", b"z" * 100_000)
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_a_writer_refused_by_readers_names_them_not_a_killed_writer(tmp_path):
    (tmp_path / ".lock").write_text("99999999\n")  # the PID a killed writer left behind
    code = (
        "import sys, time; from imagenet_cog._fileio import FolderLock; "
        "FolderLock(sys.argv[1], shared=True, reader='evaluate (PID 7)').acquire(); "
        "print('held', flush=True); time.sleep(60)"
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout.readline().strip() == "held"
        with pytest.raises(FolderLockedError, match=r"is being read by evaluate \(PID 7\)"):
            FolderLock(tmp_path, what="feature store").acquire()
    finally:
        reader.kill()
        reader.wait()
        reader.stdout.close()
