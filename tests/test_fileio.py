"""Atomic writes and folder locks (imagenet_cog._fileio)."""

import os
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
