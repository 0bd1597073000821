"""Faults around a feature store: shards damaged between runs, stores rewritten while read."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from imagefiles import official_concepts, write_concepts

from imagenet_cog import evaluate, extract, load_levels
from imagenet_cog._fileio import FolderLock, FolderLockedError
from imagenet_cog.cli import main
from imagenet_cog.store import StoreCorruptError, open_store

SRC = str(Path(__file__).resolve().parents[1] / "src")
FAST = {"preprocessing": {"size": 32}, "batch_size": 4, "progress": False}
A = load_levels("official")["L1"][0]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    base = tmp_path_factory.mktemp("in21k")
    write_concepts(base, official_concepts(), "folders")
    return base


@pytest.fixture(scope="module")
def pristine(images, tmp_path_factory):
    """A finished L1 test store of one concept in 3 shards; copy it before damaging it."""
    out = tmp_path_factory.mktemp("pristine")
    return extract(
        "torchvision:resnet18", images, "L1", "test", out, wnids=[A], shard_size=20, **FAST
    )


def _copy(path, out):
    target = out / "L1" / "test"
    shutil.copytree(path, target, ignore=shutil.ignore_patterns(".*"))
    return target


def _files(path):
    return {
        p.name: p.read_bytes()
        for p in sorted(Path(path).iterdir())
        if p.name != "manifest.json" and not p.name.startswith(".")
    }


def _manifest(path):
    m = json.loads((Path(path) / "manifest.json").read_text())
    return {k: v for k, v in m.items() if k != "execution"}


def _flip(file):
    data = bytearray(file.read_bytes())
    data[-1] ^= 0x01  # the same size, other bytes
    file.write_bytes(bytes(data))


def _extract(images, out):
    return extract(
        "torchvision:resnet18", images, "L1", "test", out, wnids=[A], shard_size=20, **FAST
    )


def test_a_shard_damaged_before_the_resume_is_computed_again(images, pristine, tmp_path):
    path = _copy(pristine, tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    # What a run killed after its last shard leaves: the shards and run.json, no manifest.
    (path / "manifest.json").unlink()
    (path / "rows.tsv").unlink()
    layout = {"shard_size": 20, "n_images": 50, "n_shards": 3}
    (path / "run.json").write_text(json.dumps({"key": manifest["key"], "layout": layout}))
    _flip(path / "shard-00001.npy")  # damaged between the kill and the resume
    _extract(images, tmp_path)
    open_store(path, verify="sha256")
    assert _files(path) == _files(pristine)
    assert _manifest(path) == _manifest(pristine)
    assert json.loads((path / "manifest.json").read_text())["execution"]["shards_resumed"] == 2


def test_a_damaged_store_is_repaired_by_extracting_again(images, pristine, tmp_path):
    path = _copy(pristine, tmp_path)
    _flip(path / "shard-00002.npy")
    with pytest.raises(
        StoreCorruptError,
        match=r"shard-00002\.npy: its sha256 .*run the same "
        r"extraction again to recompute",
    ):
        _extract(images, tmp_path)
    _extract(images, tmp_path)
    open_store(path, verify="sha256")
    assert _files(path) == _files(pristine)
    assert _manifest(path) == _manifest(pristine)
    execution = json.loads((path / "manifest.json").read_text())["execution"]
    assert execution["shards_resumed"] == 2


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


def _hold(folder, shared=False, reader=None):
    code = (
        "import sys, time; from imagenet_cog._fileio import FolderLock; "
        f"lock = FolderLock({str(folder)!r}, 'feature store', shared={shared}, "
        f"reader={reader!r}).acquire(); print('held', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "held"
    return child


def _stop(child):
    child.kill()
    child.wait()
    child.stdout.close()


def test_an_unfinished_store_still_being_written_says_so(pristine, tmp_path):
    path = _copy(pristine, tmp_path)
    (path / "manifest.json").rename(path / "run.json")
    child = _hold(path)
    try:
        with pytest.raises(
            FileNotFoundError,
            match=rf"an extraction is still writing it "
            rf"\(PID {child.pid}\); wait for it to end",
        ):
            open_store(path)
    finally:
        _stop(child)
    with pytest.raises(FileNotFoundError, match=r"a run was interrupted.* run the same extraction"):
        open_store(path)


def test_a_store_being_read_is_not_rewritten(images, pristine, tmp_path, capsys):
    path = _copy(pristine, tmp_path)
    before = _files(path)
    reader = "evaluate (PID 4242, run folder results/x)"
    child = _hold(path, shared=True, reader=reader)
    try:
        with pytest.raises(
            FolderLockedError,
            match=rf"{re.escape(str(path))} is being read by "
            rf"{re.escape(reader)}; wait for it to finish",
        ):
            extract(
                "torchvision:resnet18",
                images,
                "L1",
                "test",
                tmp_path,
                wnids=[A],
                shard_size=20,
                overwrite=True,
                **FAST,
            )
        cmd = [
            "extract",
            "--model",
            "torchvision:resnet18",
            "--data",
            str(images),
            "--domain",
            "L1",
            "--split",
            "test",
            "--out",
            str(tmp_path),
            "--wnids",
            A,
            "--shard-size",
            "20",
            "--preprocessing",
            '{"size": 24}',
            "--overwrite",
            "--quiet",
        ]
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"is being read by {reader}" in err
        # Several readers together are fine.
        with FolderLock(path, "feature store", shared=True):
            pass
    finally:
        _stop(child)
    assert _files(path) == before
    # The killed reader's lock went with it, and its file is cleared by the next writer.
    extract(
        "torchvision:resnet18",
        images,
        "L1",
        "test",
        tmp_path,
        wnids=[A],
        shard_size=20,
        overwrite=True,
        **{**FAST, "preprocessing": {"size": 24}},
    )
    assert not [p for p in path.iterdir() if p.name.startswith(".reader-")]


def test_a_writer_is_refused_by_a_reader_and_the_other_way(tmp_path):
    child = _hold(tmp_path, shared=True, reader="evaluate (PID 1)")
    try:
        with pytest.raises(FolderLockedError, match=r"being read by evaluate \(PID 1\)"):
            FolderLock(tmp_path, "feature store").acquire()
    finally:
        _stop(child)
    child = _hold(tmp_path)
    try:
        with pytest.raises(
            FolderLockedError,
            match=rf"being written by another process "
            rf"\(PID {child.pid}\); wait for it to finish",
        ):
            FolderLock(tmp_path, "feature store", shared=True).acquire()
    finally:
        _stop(child)


def test_evaluate_holds_its_stores_for_the_whole_run(tmp_path, monkeypatch, tiny_in1k_store):
    from imagenet_cog import protocol

    store, wnids = tiny_in1k_store(n_train=6, batch_size=4, shard_size=5)
    seen = []
    run_units = protocol._run_units

    def overwrite_midway(*args, **kwargs):
        # Another extraction of the same store, in the middle of the run.
        try:
            extract(
                "torchvision:resnet18",
                tmp_path / "in1k",
                "in1k",
                "train",
                store,
                wnids=wnids,
                shard_size=5,
                overwrite=True,
                **{**FAST, "preprocessing": {"size": 24}},
            )
        except FolderLockedError as exc:
            seen.append(str(exc))
        return run_units(*args, **kwargs)

    monkeypatch.setattr(protocol, "_run_units", overwrite_midway)
    out = tmp_path / "run"
    fast = {
        "domains": ("in1k",),
        "shots": ("all",),
        "seeds": (22,),
        "n_trials": 2,
        "n_startup_trials": 1,
        "epochs": 2,
        "device": "cpu",
        "progress": False,
    }
    evaluate(store, out=out, **fast)
    assert len(seen) == 1, seen
    assert re.search(
        rf"in1k/train is being read by evaluate \(PID {os.getpid()}, run folder "
        rf"{re.escape(str(out))}\)",
        seen[0],
    )
    assert open_store(store / "in1k" / "train").key["preprocessing"]["crop"] == 32
    # The run is over: the store is free again.
    extract(
        "torchvision:resnet18",
        tmp_path / "in1k",
        "in1k",
        "train",
        store,
        wnids=wnids,
        shard_size=5,
        overwrite=True,
        **{**FAST, "preprocessing": {"size": 24}},
    )


def test_a_bad_preprocessing_json_names_the_option(images, tmp_path, capsys):
    cmd = [
        "extract",
        "--model",
        "torchvision:resnet18",
        "--data",
        str(images),
        "--domain",
        "L1",
        "--split",
        "test",
        "--out",
        str(tmp_path),
        "--wnids",
        A,
        "--quiet",
        "--preprocessing",
        '{"size": 16,}',
    ]
    assert main(cmd) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(
        "imagenet-cog: error: --preprocessing '{\"size\": 16,}' is not valid JSON"
    )


def test_evaluate_says_an_extraction_is_still_running_rather_than_to_run_it_again(tmp_path):
    partial = tmp_path / "partial"
    (partial / "L1" / "train").mkdir(parents=True)
    (partial / "L1" / "train" / "run.json").write_text("{}")
    child = _hold(partial / "L1" / "train")
    try:
        with pytest.raises(
            FileNotFoundError,
            match=r"stores an extraction is still writing "
            r"\(L1/train\): wait for it to end",
        ):
            evaluate(partial, domains=("L1",))
    finally:
        _stop(child)
    with pytest.raises(FileNotFoundError, match=r"unfinished stores \(L1/train\): run the same"):
        evaluate(partial, domains=("L1",))
