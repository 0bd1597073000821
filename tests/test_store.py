import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from imagefiles import official_concepts, plain_concepts, write_concepts, write_in1k

from imagenet_cog import FeatureExtractor, Levels, extract, load_levels
from imagenet_cog.cli import main
from imagenet_cog.datasets import make_split
from imagenet_cog.store import (
    ShardedArray,
    StoreCorruptError,
    StoreMismatchError,
    build_store,
    list_domains,
    load_domain,
    open_store,
)

A, B = load_levels("official")["L1"][:2]
SRC = str(Path(__file__).resolve().parents[1] / "src")
SMALL = {"size": 32}
FAST = {"preprocessing": SMALL, "batch_size": 4, "progress": False}


@pytest.fixture(scope="module")
def in21k(tmp_path_factory):
    """Official L1 concepts A and B, with bad files among the train images."""
    base = tmp_path_factory.mktemp("in21k")
    concepts = official_concepts()
    kinds = write_concepts(base / "folders", concepts, "folders")
    write_concepts(base / "tars", concepts, "tars")
    return base / "folders", base / "tars", kinds


def _files(path):
    """Every file of a store but the manifest (and the lock and check cache), by name, as bytes."""
    return {
        p.name: p.read_bytes()
        for p in sorted(Path(path).iterdir())
        if p.name != "manifest.json" and not p.name.startswith(".")
    }


def _manifest(path, drop=("execution",)):
    m = json.loads((Path(path) / "manifest.json").read_text())
    return {k: v for k, v in m.items() if k not in drop}


# ------------------------------------------------------------- the contents
def test_store_holds_the_decodable_images_in_split_order(in21k, tmp_path):
    folders, _, kinds = in21k
    path = extract(
        "torchvision:resnet18",
        folders,
        "L1",
        "train",
        tmp_path,
        wnids=[A, B],
        shard_size=5,
        truncated_images="skip",
        **FAST,
    )
    assert path == tmp_path / "L1" / "train"
    store = open_store(path, verify="sha256")
    split = make_split(folders, "L1", "train", wnids=[A, B])
    bad = {i for i in split.ids if kinds[i] in ("truncated", "random", "empty")}
    good = [i for i in split.ids if i not in bad]
    assert store.ids.tolist() == good
    assert store.labels.tolist() == [i.split("/")[0] for i in good]
    assert {s["id"] for s in store.skipped} == bad
    assert all(s["reason"] and s["wnid"] == s["id"][:9] for s in store.skipped)
    # CMYK, grayscale and palette files are decoded, not skipped.
    assert {kinds[i] for i in good} == {"jpeg", "cmyk", "gray", "palette"}
    # The features are those of FeatureExtractor.transform, row for row.
    ext = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL, batch_size=4)
    expected = ext.transform([str(folders / i) for i in good])
    np.testing.assert_allclose(np.asarray(store.features), expected, rtol=1e-5, atol=1e-6)
    m = store.manifest
    assert m["key"]["split_sha256"] == split.checksum == m["split"]["sha256"]
    assert m["key"]["weights_sha256"] == ext.fingerprint()["weights_sha256"]
    assert m["n_images"] == len(split) and m["n_rows"] == len(good)
    assert {"torch", "torchvision", "imagenet_cog", "numpy"} <= set(m["versions"])
    assert len(m["shards"]) == 4 and sum(s["rows"] for s in m["shards"]) == len(good)
    assert (path / "split.tsv").read_text() == split.to_tsv()
    assert not (path / "run.json").exists()
    assert not [p for p in path.iterdir() if ".tmp-" in p.name]
    # A single process never starts torch.distributed.
    import torch.distributed

    assert not torch.distributed.is_initialized()


def test_tars_give_the_same_features_as_folders(in21k, tmp_path):
    folders, tars, _ = in21k
    a = extract("torchvision:resnet18", folders, "L1", "test", tmp_path / "a", wnids=[A, B], **FAST)
    b = extract("torchvision:resnet18", tars, "L1", "test", tmp_path / "b", wnids=[A, B], **FAST)
    assert _files(a) == _files(b)
    assert open_store(b).manifest["split"]["layout"] == "tar per wnid"


def test_reuse_mismatch_and_overwrite(in21k, tmp_path):
    folders = in21k[0]
    path = extract("torchvision:resnet18", folders, "L1", "test", tmp_path, wnids=[A], **FAST)
    stamp = (path / "manifest.json").stat().st_mtime_ns
    # Same request: reused as is.
    extract("torchvision:resnet18", folders, "L1", "test", tmp_path, wnids=[A], **FAST)
    assert (path / "manifest.json").stat().st_mtime_ns == stamp
    # Anything that shapes the features differs: never reused silently.
    other = {**FAST, "preprocessing": {"size": 40}}
    with pytest.raises(StoreMismatchError, match=r"(?s)other settings.*preprocessing"):
        extract("torchvision:resnet18", folders, "L1", "test", tmp_path, wnids=[A], **other)
    with pytest.raises(StoreMismatchError, match="normalize"):
        extract(
            "torchvision:resnet18",
            folders,
            "L1",
            "test",
            tmp_path,
            wnids=[A],
            normalize=False,
            **FAST,
        )
    with pytest.raises(StoreMismatchError, match="split_sha256"):
        extract("torchvision:resnet18", folders, "L1", "test", tmp_path, wnids=[A, B], **FAST)
    with pytest.raises(StoreMismatchError, match="weights_sha256"):
        extract("torchvision:resnet34", folders, "L1", "test", tmp_path, wnids=[A], **FAST)
    path = extract(
        "torchvision:resnet18", folders, "L1", "test", tmp_path, wnids=[A], overwrite=True, **other
    )
    assert open_store(path).key["preprocessing"]["crop"] == 40


def test_integrity_checks(in21k, tmp_path):
    path = extract(
        "torchvision:resnet18", in21k[0], "L1", "test", tmp_path, wnids=[A], shard_size=20, **FAST
    )
    shard = path / "shard-00001.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    shard.write_bytes(bytes(data))
    open_store(path, verify="size")  # sizes still match
    with pytest.raises(ValueError, match=r"shard-00001\.npy: its sha256"):
        open_store(path, verify="sha256")
    with pytest.raises(StoreCorruptError, match=r"shard-00001\.npy: its sha256"):
        open_store(path)  # the default checks the bytes too
    shard.write_bytes(bytes(data[:-8]))
    with pytest.raises(ValueError, match=r"shard-00001\.npy: \d+ bytes, the manifest says"):
        open_store(path)
    # A damaged store is not reused either.
    with pytest.raises(ValueError, match="bytes, the manifest says"):
        extract(
            "torchvision:resnet18",
            in21k[0],
            "L1",
            "test",
            tmp_path,
            wnids=[A],
            shard_size=20,
            **FAST,
        )
    with pytest.raises(FileNotFoundError, match="no feature store"):
        open_store(tmp_path / "L2" / "test")


def test_a_damaged_unfinished_run_record_is_named(in21k, tmp_path):
    path = extract(
        "torchvision:resnet18", in21k[0], "L1", "test", tmp_path, wnids=[A], shard_size=20, **FAST
    )
    (path / "manifest.json").unlink()
    for text in ('{"key": {"model"', "[1, 2]"):
        (path / "run.json").write_text(text)
        with pytest.raises(StoreCorruptError, match=r"run\.json: .*overwrite=True"):
            extract(
                "torchvision:resnet18",
                in21k[0],
                "L1",
                "test",
                tmp_path,
                wnids=[A],
                shard_size=20,
                **FAST,
            )


def test_an_unfinished_run_with_other_settings_is_not_resumed(in21k, tmp_path):
    path = extract(
        "torchvision:resnet18", in21k[0], "L1", "test", tmp_path, wnids=[A], shard_size=20, **FAST
    )
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").unlink()
    layout = {"shard_size": 7, "n_images": 50, "n_shards": 8}
    (path / "run.json").write_text(json.dumps({"key": manifest["key"], "layout": layout}))
    with pytest.raises(FileNotFoundError, match="unfinished"):
        open_store(path)
    with pytest.raises(StoreMismatchError, match="shards of 7 images, not 20"):
        extract(
            "torchvision:resnet18",
            in21k[0],
            "L1",
            "test",
            tmp_path,
            wnids=[A],
            shard_size=20,
            **FAST,
        )
    with pytest.raises(StoreMismatchError, match="unfinished run with other settings"):
        extract(
            "torchvision:resnet18",
            in21k[0],
            "L1",
            "test",
            tmp_path,
            wnids=[A],
            shard_size=20,
            **{**FAST, "preprocessing": {"size": 24}},
        )


def test_a_shard_of_only_bad_images(tmp_path):
    wnids = ["n00000001", "n00000002"]
    kinds = {"n00000001": {0: "random", 1: "empty", 2: "random"}}
    write_concepts(tmp_path / "data", plain_concepts(wnids, 3, kinds))
    levels = Levels([wnids])
    path = extract(
        "torchvision:resnet18",
        tmp_path / "data",
        "L1",
        "train",
        tmp_path / "out",
        levels,
        n_test=1,
        shard_size=2,
        **FAST,
    )
    store = open_store(path)
    assert store.manifest["shards"][0]["rows"] == 0
    assert len(store) == 2 and store.features.shape == (2, 512)
    assert [s["reason"].split(":")[0] for s in store.skipped] == ["UnidentifiedImageError"] * 2


def test_load_domain_and_list_domains(tmp_path):
    wnids, _ = write_in1k(tmp_path / "in1k", val_layout="flat")
    out = tmp_path / "features"
    for split in ("train", "test"):
        extract(
            "torchvision:resnet18",
            tmp_path / "in1k",
            "in1k",
            split,
            out,
            wnids=wnids,
            shard_size=5,
            **FAST,
        )
    assert list_domains(out) == ["in1k"]
    X, y, Xt, yt = load_domain(out, "in1k")
    assert X.shape == (12, 512) and Xt.shape == (6, 512) and X.dtype == np.float32
    assert type(X) is np.ndarray and y.tolist() == sorted(y.tolist())
    assert set(yt) == set(wnids)
    lazy = load_domain(out, "in1k", mmap=True)[0]
    assert isinstance(lazy, ShardedArray) and len(lazy.shards) == 3
    np.testing.assert_array_equal(np.asarray(lazy), X)
    # A test store from another model does not pair with this train store.
    extract(
        "torchvision:resnet18",
        tmp_path / "in1k",
        "in1k",
        "test",
        out,
        wnids=wnids,
        overwrite=True,
        **{**FAST, "normalize": False},
    )
    with pytest.raises(ValueError, match="made differently: normalize"):
        load_domain(out, "in1k")


def test_sharded_array_indexing():
    rng = np.random.default_rng(0)
    full = rng.standard_normal((10, 3)).astype(np.float32)
    a = ShardedArray([full[:4], full[4:4], full[4:9], full[9:]], 3)
    assert a.shape == (10, 3) and len(a) == 10 and a.ndim == 2
    np.testing.assert_array_equal(np.asarray(a), full)
    runs = [slice(2, 7), slice(0, 10), slice(3, 4), slice(4, 9), slice(8, 20), slice(5, 5)]
    runs += [slice(-3, None), slice(9, 3), slice(None, None, 2), slice(None, None, -3)]
    for index in [0, 9, -1, *runs, [8, 1, 1], np.arange(10) % 2 == 0]:
        np.testing.assert_array_equal(a[index], full[index])
    np.testing.assert_array_equal(a[3:6, 1], full[3:6, 1])
    np.testing.assert_array_equal(a[5, 1:], full[5, 1:])
    with pytest.raises(IndexError):
        a[10]
    with pytest.raises(IndexError):
        a[[0, 11]]


def test_cli_extract(in21k, tmp_path, capsys):
    code = main(
        [
            "extract",
            "--model",
            "torchvision:resnet18",
            "--data",
            str(in21k[0]),
            "--domain",
            "L1",
            "--out",
            str(tmp_path),
            "--wnids",
            f"{A},{B}",
            "--preprocessing",
            '{"size": 32}',
            "--batch-size",
            "8",
            "--quiet",
            "--truncated-images",
            "skip",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert f"{tmp_path / 'L1' / 'train'}: 12 images x 512 features, 6 skipped" in out
    assert f"{tmp_path / 'L1' / 'test'}: 100 images x 512 features, 0 skipped" in out
    assert list_domains(tmp_path) == ["L1"]
    code = main(
        [
            "extract",
            "--model",
            "torchvision:resnet18",
            "--data",
            str(in21k[0]),
            "--domain",
            "L1",
            "--split",
            "test",
            "--out",
            str(tmp_path / "x"),
            "--quiet",
        ]
    )
    assert code == 2
    assert "998 concept(s) missing" in capsys.readouterr().err


# -------------------------------------------------- kill, resume, torchrun
def _cli(root, out, *extra):
    return [
        sys.executable,
        "-m",
        "imagenet_cog",
        "extract",
        "--model",
        "torchvision:resnet18",
        "--data",
        str(root),
        "--domain",
        "L1",
        "--split",
        "test",
        "--out",
        str(out),
        "--wnids",
        f"{A},{B}",
        "--shard-size",
        "10",
        "--batch-size",
        "5",
        "--device",
        "cpu",
        "--preprocessing",
        '{"size": 128}',
        "--quiet",
        *extra,
    ]


def _env():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    # torchrun gives each process one thread; the CPU's float sums depend on the
    # thread count, so every run here uses one to compare bytes.
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="module")
def reference(in21k, tmp_path_factory):
    """An uninterrupted single-process run, in a subprocess."""
    out = tmp_path_factory.mktemp("reference")
    subprocess.run(_cli(in21k[0], out), env=_env(), check=True, timeout=300)
    return out / "L1" / "test"


@pytest.mark.slow
def test_killed_run_resumes_to_identical_files(in21k, reference, tmp_path):
    proc = subprocess.Popen(_cli(in21k[0], tmp_path), env=_env(), stderr=subprocess.PIPE)
    path = tmp_path / "L1" / "test"
    deadline = time.monotonic() + 240
    while not (path / "shard-00002.json").exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert not (path / "manifest.json").exists()
    assert (path / "run.json").exists()
    finished = {p.name for p in path.glob("shard-*.json")}
    assert 3 <= len(finished) < 10
    subprocess.run(_cli(in21k[0], tmp_path), env=_env(), check=True, timeout=300)
    assert _files(path) == _files(reference)
    assert _manifest(path) == _manifest(reference)
    assert json.loads((path / "manifest.json").read_text())["execution"]["shards_resumed"] >= 3


@pytest.mark.slow
def test_torchrun_two_processes_equal_one(in21k, reference, tmp_path):
    cmd = _cli(in21k[0], tmp_path)
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    subprocess.run([*launcher, *cmd[1:]], env=_env(), check=True, timeout=300, capture_output=True)
    path = tmp_path / "L1" / "test"
    assert _files(path) == _files(reference)
    assert _manifest(path) == _manifest(reference)
    execution = json.loads((path / "manifest.json").read_text())["execution"]
    assert execution["world_size"] == 2


def test_build_store_rejects_bad_arguments(in21k, tmp_path):
    split = make_split(in21k[0], "L1", "test", wnids=[A])
    ext = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL)
    with pytest.raises(ValueError, match="shard_size"):
        build_store(tmp_path, ext, split, shard_size=0)
    with pytest.raises(ValueError, match="bad domain"):
        extract(ext, in21k[0], "../x", "test", tmp_path)


# ------------------------------------------------------- integrity of a store
@pytest.fixture(scope="module")
def small_store(in21k, tmp_path_factory):
    """A finished L1 test store of concept A in 3 shards, pristine; copy it before damaging it."""
    out = tmp_path_factory.mktemp("small")
    return extract(
        "torchvision:resnet18", in21k[0], "L1", "test", out, wnids=[A], shard_size=20, **FAST
    )


def _copy(path, tmp_path):
    import shutil

    target = tmp_path / "L1" / "test"
    shutil.copytree(path, target, ignore=shutil.ignore_patterns(".*"))
    return target


def _flip(file, at=-1):
    data = bytearray(file.read_bytes())
    data[at] ^= 0x01
    file.write_bytes(bytes(data))


def test_the_default_check_catches_changed_bytes_once_and_caches_the_good(
    small_store, tmp_path, monkeypatch
):
    from imagenet_cog import _storecheck

    path = _copy(small_store, tmp_path)
    before = np.asarray(open_store(path).features)
    assert (path / ".verified.json").is_file()
    # A second open hashes nothing: the cache vouches for the unchanged files.
    hashed = []
    real = _storecheck.file_sha256
    monkeypatch.setattr(_storecheck, "file_sha256", lambda f: hashed.append(f.name) or real(f))
    open_store(path)
    load_domain_like = open_store(path, verify="cached")
    assert hashed == [] and len(load_domain_like) == len(before)
    open_store(path, verify="sha256")  # ignores the cache
    assert sorted(hashed) == sorted(
        ["rows.tsv", "split.tsv"] + [f"shard-0000{k}.npy" for k in range(3)]
    )
    # A flipped byte, even with the old mtime put back, is caught by the default check.
    shard = path / "shard-00001.npy"
    stat = shard.stat()
    _flip(shard)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    hashed.clear()
    with pytest.raises(StoreCorruptError, match=r"shard-00001\.npy: its sha256 does not match"):
        open_store(path)
    assert hashed == ["shard-00001.npy"]
    open_store(path, verify="size")
    open_store(path, verify=None)
    _flip(shard)  # back to the original bytes
    np.testing.assert_array_equal(np.asarray(open_store(path).features), before)


def test_swapped_labels_in_rows_tsv_are_caught(small_store, tmp_path):
    path = _copy(small_store, tmp_path)
    lines = (path / "rows.tsv").read_text().splitlines(keepends=True)
    lines[1], lines[2] = lines[2], lines[1]  # same bytes, other order
    (path / "rows.tsv").write_text("".join(lines))
    with pytest.raises(StoreCorruptError, match=r"rows\.tsv: its sha256 does not match"):
        open_store(path)
    test_path = path.parent / "test"
    train_path = path.parent / "train"
    import shutil

    shutil.copytree(small_store, train_path, ignore=shutil.ignore_patterns(".*"))
    with pytest.raises(StoreCorruptError, match=r"test/rows\.tsv"):
        load_domain(tmp_path, "L1")
    assert open_store(test_path, verify="size").ids[0] == lines[1].split("\t")[0]


def _edit_manifest(path, edit):
    file = path / "manifest.json"
    m = json.loads(file.read_text())
    edit(m)
    file.write_text(json.dumps(m))


def test_shard_records_must_be_in_order_and_inside_the_store(small_store, tmp_path):
    path = _copy(small_store, tmp_path)
    good = (path / "manifest.json").read_text()

    def swap(m):
        m["shards"][0], m["shards"][1] = m["shards"][1], m["shards"][0]

    _edit_manifest(path, swap)
    for level in ("sha256", "cached", "size", None):
        with pytest.raises(
            StoreCorruptError, match=r"shard record 0 names 'shard-00001\.npy', not"
        ):
            open_store(path, verify=level)
    outside = tmp_path / "elsewhere.npy"
    outside.write_bytes((path / "shard-00000.npy").read_bytes())
    for name in (str(outside), "../../elsewhere.npy"):
        (path / "manifest.json").write_text(good)
        _edit_manifest(path, lambda m, name=name: m["shards"][0].update(file=name))
        with pytest.raises(StoreCorruptError, match=r"shard record 0 names .*outside the store"):
            open_store(path, verify=None)
    (path / "manifest.json").write_text(good)
    _edit_manifest(path, lambda m: m["rows"].update(file="../rows.tsv"))
    with pytest.raises(StoreCorruptError, match=r"manifest\.json: rows\.file must be 'rows\.tsv'"):
        open_store(path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda t: t[: len(t) // 2], r"not valid JSON \(.* at line \d+, column \d+\)"),
        (lambda t: "[1, 2]", "not a JSON object"),
        (lambda t: t.replace('"shards"', '"shardz"'), "no 'shards' field"),
        (lambda t: t.replace('"n_rows": ', '"n_rows": "many", "x": '), "'n_rows' is not a count"),
        (lambda t: t.replace('"format_version": 2', '"format_version": 9'), "not a .* v2 manifest"),
    ],
)
def test_a_damaged_manifest_gives_one_clear_error(in21k, small_store, tmp_path, damage, message):
    path = _copy(small_store, tmp_path)
    file = path / "manifest.json"
    file.write_text(damage(json.dumps(json.loads(file.read_text()))))
    with pytest.raises(StoreCorruptError, match=rf"{re.escape(str(file))}: {message}"):
        open_store(path)
    with pytest.raises(StoreCorruptError, match=re.escape(str(file))):
        # Reusing it for the same request names the file too.
        extract(
            "torchvision:resnet18",
            in21k[0],
            "L1",
            "test",
            tmp_path,
            wnids=[A],
            shard_size=20,
            **FAST,
        )


def test_a_store_of_another_format_version_is_refused_in_one_line(in21k, small_store, tmp_path):
    from imagenet_cog.store import FORMAT_VERSION

    assert json.loads((small_store / "manifest.json").read_text())["format_version"] == 2
    path = _copy(small_store, tmp_path)
    _edit_manifest(path, lambda m: m.__setitem__("format_version", 1))
    expect = (
        f"{path / 'manifest.json'}: not a imagenet_cog.features v{FORMAT_VERSION} manifest (a "
        "store of format version 1, which this version of imagenet_cog does not read); extract "
        "these features again, into a new folder or with overwrite=True (--overwrite)"
    )
    with pytest.raises(StoreCorruptError) as err:
        open_store(path)
    assert str(err.value) == expect
    request = ("torchvision:resnet18", in21k[0], "L1", "test", tmp_path)
    with pytest.raises(StoreCorruptError, match=re.escape(expect)):
        extract(*request, wnids=[A], shard_size=20, **FAST)
    # As it says: overwrite=True extracts them again, in the current format.
    extract(*request, wnids=[A], shard_size=20, overwrite=True, **FAST)
    assert len(open_store(path)) == len(open_store(small_store))


def test_a_shard_record_that_is_not_an_object(small_store, tmp_path):
    path = _copy(small_store, tmp_path)
    _edit_manifest(path, lambda m: m["shards"].__setitem__(2, "shard-00002.npy"))
    with pytest.raises(StoreCorruptError, match="shard record 2: not an object"):
        open_store(path)


# ----------------------------------------------------------- one run per store
def test_a_store_being_built_by_another_process_is_refused(in21k, tmp_path):
    from imagenet_cog._fileio import FolderLockedError

    path = tmp_path / "L1" / "test"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from imagenet_cog._fileio import FolderLock; "
                f"lock = FolderLock({str(path)!r}).acquire(); print('held', flush=True); time.sleep(60)"
            ),
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            FolderLockedError,
            match=rf"{re.escape(str(path))} is in use by "
            rf"another process \(PID {holder.pid}\)",
        ):
            extract("torchvision:resnet18", in21k[0], "L1", "test", tmp_path, wnids=[A], **FAST)
        assert not (path / "run.json").exists() and not (path / "split.tsv").exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # The kernel released the killed holder's lock: the build goes ahead.
    extract("torchvision:resnet18", in21k[0], "L1", "test", tmp_path, wnids=[A], **FAST)
    assert len(open_store(path)) == 50


@pytest.mark.slow
def test_two_runs_with_other_settings_started_together(in21k, tmp_path):
    """One finishes its store; the other is refused clearly; the store is never left unfinished."""
    runs = [
        subprocess.Popen(
            _cli(in21k[0], tmp_path, "--preprocessing", f'{{"size": {size}}}'),
            env=_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for size in (96, 128)
    ]
    errors = [run.communicate(timeout=300)[1] for run in runs]
    codes = [run.returncode for run in runs]
    assert codes.count(0) == 1, errors
    loser = errors[1 - codes.index(0)]
    assert "is in use by another process" in loser or "holds features made with other" in loser
    store = open_store(tmp_path / "L1" / "test", verify="sha256")
    size = (96, 128)[codes.index(0)]
    assert store.key["preprocessing"]["crop"] == size and len(store) == 100


def test_evaluate_and_its_command_check_the_stores(tmp_path, capsys, tiny_in1k_store):
    from imagenet_cog import evaluate

    store = tiny_in1k_store(n_train=6, batch_size=4, shard_size=5).store
    _flip(store / "in1k" / "train" / "shard-00002.npy")
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
    with pytest.raises(StoreCorruptError, match=r"in1k/train/shard-00002\.npy: its sha256"):
        evaluate(store, **fast)
    assert len(evaluate(store, verify="size", **fast).records) == 1
    cmd = [
        "evaluate",
        str(store),
        "--domains",
        "in1k",
        "--shots",
        "all",
        "--seeds",
        "22",
        "--trials",
        "2",
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--quiet",
    ]
    assert main([*cmd, "--out", str(tmp_path / "a")]) == 2
    assert "shard-00002.npy: its sha256 does not match" in capsys.readouterr().err
    assert main([*cmd, "--out", str(tmp_path / "b"), "--verify", "none"]) == 0
