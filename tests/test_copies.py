"""Stores of a copy as researchers hold it: each shard read forward, one pass for several stores.

The stores of a webdataset or Parquet copy are those of the same images as folders, built
store after store or in one pass over the copy's data files (each read once, by one
DataLoader worker or one torchrun rank), and a killed pass resumes identical. How a copy is
listed and read is the data wing's (``test_data_*.py``).
"""

import json
import multiprocessing
import os

import numpy as np
import pytest
from copyfiles import write_copy_layouts, write_shards
from helpers import needs

from imagenet_cog._data import sources as image_sources
from imagenet_cog.datasets import ImageDataset, make_split
from imagenet_cog.features import FeatureExtractor

needs("pyarrow", module_level=True)

MODEL = {"model": "torchvision:resnet18:none", "preprocessing": {"size": 16}, "batch_size": 8}


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGENET_COG_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def in21k(tmp_path_factory):
    """Two official L1 concepts as folders, as shards and as Parquet (``write_copy_layouts``)."""
    return write_copy_layouts(tmp_path_factory.mktemp("copies"))


def test_the_store_manifest_records_the_copy(in21k, tmp_path):
    from imagenet_cog import extract
    from imagenet_cog.store import open_store

    root, wnids, _ = in21k
    extract(
        MODEL["model"],
        root / "wds",
        "L1",
        "test",
        tmp_path / "out",
        wnids=wnids[:1],
        preprocessing={"size": 16},
        progress=False,
    )
    store = open_store(tmp_path / "out" / "L1" / "test")
    assert store.manifest["split"]["copy"]["layout"] == "webdataset shards"
    assert store.manifest["split"]["copy"]["name"] == "imagenet22k"


def test_a_store_reads_each_shard_forward_and_keeps_the_split_order(in21k, tmp_path, monkeypatch):
    from imagenet_cog.store import build_store, open_store

    root, wnids, _ = in21k
    folders = make_split(root / "folders", "L1", "train", wnids=wnids)
    shards = make_split(root / "wds", "L1", "train", wnids=wnids)
    reads = []
    real = ImageDataset.read_bytes
    monkeypatch.setattr(
        ImageDataset, "read_bytes", lambda self, i: reads.append(self.sources[i]) or real(self, i)
    )
    kwargs = {"shard_size": 10, "progress": False}
    build_store(tmp_path / "a", FeatureExtractor(**MODEL, num_workers=0), shards, **kwargs)
    build_store(tmp_path / "b", FeatureExtractor(**MODEL, num_workers=0), folders, **kwargs)
    tar_reads = [(s.tar, s.offset) for s in reads if not isinstance(s, str)]
    assert len(tar_reads) == len(shards)
    for k in range(0, len(tar_reads), 10):  # each store shard: files in order, offsets forward
        chunk = tar_reads[k : k + 10]
        assert chunk == sorted(chunk)
    assert tar_reads != [(s.tar, s.offset) for s in shards.sources]  # not the split's order
    a, b = open_store(tmp_path / "a"), open_store(tmp_path / "b")
    assert list(a.ids) == list(b.ids)
    np.testing.assert_array_equal(np.asarray(a.features), np.asarray(b.features))


def test_extract_all_reads_a_shard_copy_and_skips_finished_stores(in21k, tmp_path):
    from imagenet_cog import Levels, extract_all
    from imagenet_cog.store import list_domains, open_store

    root, wnids, _ = in21k
    levels = Levels([[wnids[0]], [wnids[1]]])
    kwargs = {"n_test": 5, "preprocessing": {"size": 16}, "progress": False}
    out = extract_all(MODEL["model"], {"in21k": root / "wds"}, tmp_path / "f", levels, **kwargs)
    assert list_domains(out) == ["L1", "L2"]
    store = open_store(out / "L2" / "train")
    assert store.manifest["split"]["layout"] == "webdataset shards"
    before = (out / "L2" / "train" / "manifest.json").stat().st_mtime_ns
    extract_all(MODEL["model"], {"in21k": root / "wds"}, tmp_path / "f", levels, **kwargs)
    assert (out / "L2" / "train" / "manifest.json").stat().st_mtime_ns == before


# ---------------------------------------------------------------- one pass over a copy
def _store_jobs(root, wnids, out):
    from imagenet_cog import Levels

    levels = Levels([[wnids[0]], [wnids[1]]])
    return [
        (out / d / s, make_split(root, d, s, levels, n_test=5))
        for d in ("L1", "L2")
        for s in ("train", "test")
    ]


def _store_files(path):
    """``{file name: bytes}`` of a store, the manifest without its ``execution`` section
    (and without the cache of verified hashes that reading a store leaves)."""
    out = {}
    for f in sorted(path.iterdir()):
        if f.name == ".verified.json":
            continue
        if f.name == "manifest.json":
            manifest = json.loads(f.read_bytes())
            manifest.pop("execution")
            out[f.name] = manifest
        elif f.is_file():
            out[f.name] = f.read_bytes()
        else:
            out[f.name + "/"] = sorted(x.name for x in f.iterdir())
    return out


def _watch_reads(monkeypatch, note):
    """Call ``note(what)`` on every data file the image readers read: a tar opened (by path), a
    Parquet row group read (``path#group``)."""

    def opening(path, mode="r", *args, **kwargs):
        note(str(path))
        return open(path, mode, *args, **kwargs)

    real = image_sources._row_group_images

    def reading(path, row_group, *column):
        note(f"{path}#{row_group}")
        return real(path, row_group, *column)

    monkeypatch.setattr(image_sources, "open", opening, raising=False)
    monkeypatch.setattr(image_sources, "_row_group_images", reading)
    image_sources._ROW_GROUPS.clear()


def _count_opens(monkeypatch):
    """The data files read in this process, as :func:`_watch_reads` names them."""
    opened = []
    _watch_reads(monkeypatch, opened.append)
    return opened


@pytest.mark.parametrize("layout", ["wds", "parquet"])
def test_one_pass_reads_each_data_file_once_and_builds_the_stores_built_alone(
    in21k, tmp_path, monkeypatch, layout
):
    from imagenet_cog.store import build_store, build_stores

    root, wnids, _ = in21k
    kwargs = {"shard_size": 20, "progress": False}
    alone = _store_jobs(root / layout, wnids, tmp_path / "alone")
    opened = _count_opens(monkeypatch)
    for path, split in alone:
        build_store(path, FeatureExtractor(**MODEL, num_workers=0), split, **kwargs)
    # Store after store: the data files are opened again for every store that needs them.
    assert len(opened) > len(set(opened))
    n_alone = len(opened)
    together = _store_jobs(root / layout, wnids, tmp_path / "together")
    opened.clear()
    image_sources._ROW_GROUPS.clear()
    build_stores(together, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    # Each shard opened, each row group read, once for the four stores.
    assert sorted(opened) == sorted({_onepass_file(s) for _, sp in together for s in sp.sources})
    assert len(opened) < n_alone
    for (a, _), (b, _) in zip(alone, together):
        assert not (b / ".pass").exists()
        files_a, files_b = _store_files(a), _store_files(b)
        assert sorted(files_a) == sorted(files_b)
        for name in files_a:
            assert files_a[name] == files_b[name], f"{b.name}/{name}"


def _onepass_file(source):
    from imagenet_cog._data.sources import data_file

    if isinstance(source, image_sources.ParquetImage):
        return f"{source.path}#{source.row_group}"
    return data_file(source)


def _log_reads(monkeypatch, log):
    """Log every data file read, with the reading process, to a file: DataLoader workers are
    forked processes."""
    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the read log reaches the workers only when they are forked")

    def note(what):
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\t{what}\n")

    _watch_reads(monkeypatch, note)


@pytest.mark.parametrize("layout", ["wds", "parquet"])
def test_dataloader_workers_split_the_data_files_and_build_the_same_stores(
    in21k, tmp_path, monkeypatch, layout
):
    from imagenet_cog.store import build_store, build_stores

    root, wnids, _ = in21k
    kwargs = {"shard_size": 20, "progress": False}
    alone = _store_jobs(root / layout, wnids, tmp_path / "in_process")
    for path, split in alone:
        build_store(path, FeatureExtractor(**MODEL, num_workers=0), split, **kwargs)
    log = tmp_path / "reads.tsv"
    _log_reads(monkeypatch, log)
    jobs = _store_jobs(root / layout, wnids, tmp_path / "two_workers")
    build_stores(jobs, FeatureExtractor(**MODEL, num_workers=2), **kwargs)
    readers = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        pid, what = line.split("\t")
        readers.setdefault(what, []).append(pid)
    assert set(readers) == {_onepass_file(s) for _, sp in jobs for s in sp.sources}
    assert len({pid for pids in readers.values() for pid in pids}) == 2  # both workers read
    # No worker reads a data file (a tar, a row group) twice, and two workers share at most
    # the file where the batches are cut in two runs.
    assert all(len(pids) == len(set(pids)) for pids in readers.values())
    assert sum(len(pids) > 1 for pids in readers.values()) <= 1
    for (a, _), (b, _) in zip(alone, jobs):
        assert _store_files(a) == _store_files(b)


_RANK_SCRIPT = """
import os, sys
from pathlib import Path

import imagenet_cog._data.sources as sources_module
from imagenet_cog import Levels, extract_all

root, out, log, a, b = sys.argv[1:6]


def opening(path, mode="r", *args, **kwargs):
    with open(log, "a", encoding="utf-8") as f:
        f.write(os.environ.get("RANK", "alone") + "\\t" + str(path) + "\\n")
    return open(path, mode, *args, **kwargs)


sources_module.open = opening
if sys.argv[6:] == ["fail"] and os.environ.get("RANK") == "1":
    from imagenet_cog import _onepass

    def failing(*args):
        raise OSError("the disk of rank 1 is full")

    _onepass._write_record = failing
extract_all(
    "torchvision:resnet18:none", {"in21k": Path(root)}, Path(out), Levels([[a], [b]]),
    n_test=5, preprocessing={"size": 16}, batch_size=8, progress=False, num_workers=0,
)
"""


@pytest.mark.slow
def test_torchrun_ranks_split_the_data_files_of_one_pass(in21k, tmp_path):
    import subprocess
    import sys

    from helpers import subprocess_env, two_ranks

    root, wnids, _ = in21k
    script = tmp_path / "one_pass.py"
    script.write_text(_RANK_SCRIPT, encoding="utf-8")
    # One thread in both runs: the CPU's float sums depend on the thread count.
    alone = [script, root / "wds", tmp_path / "alone", tmp_path / "alone.log", *wnids]
    subprocess.run(
        [sys.executable, *map(str, alone)], env=subprocess_env(OMP_NUM_THREADS="1"), check=True
    )
    codes, errors = two_ranks(
        script, root / "wds", tmp_path / "ranks", tmp_path / "ranks.log", *wnids
    )
    assert codes == [0, 0], errors
    readers = {}
    for line in (tmp_path / "ranks.log").read_text(encoding="utf-8").splitlines():
        rank, path = line.split("\t")
        readers.setdefault(path, set()).add(rank)
    shards = {str(p) for p in (root / "wds").glob("*.tar")}
    assert set(readers) == shards
    assert all(len(ranks) == 1 for ranks in readers.values())  # each shard read by one rank
    assert {r for ranks in readers.values() for r in ranks} == {"0", "1"}
    for domain in ("L1", "L2"):
        for split in ("train", "test"):
            a, b = tmp_path / "alone" / domain / split, tmp_path / "ranks" / domain / split
            assert not (b / ".pass").exists()
            assert _store_files(a) == _store_files(b), f"{domain}/{split}"
            assert json.loads((b / "manifest.json").read_text())["execution"]["world_size"] == 2


@pytest.mark.slow
def test_a_rank_that_fails_in_the_one_pass_stops_the_others(in21k, tmp_path):
    from helpers import two_ranks

    root, wnids, _ = in21k
    script = tmp_path / "one_pass.py"
    script.write_text(_RANK_SCRIPT, encoding="utf-8")
    # Before, rank 0 waited at the barrier for rank 1 until the group's two-hour timeout.
    codes, errors = two_ranks(
        script, root / "wds", tmp_path / "out", tmp_path / "log", *wnids, "fail"
    )
    assert codes[0] != 0 and codes[1] != 0
    assert "the disk of rank 1 is full" in errors[1]
    assert "another process failed while computing the features of" in errors[0]
    assert "run the same command again to resume" in errors[0]
    assert not (tmp_path / "out" / "L1" / "train" / "manifest.json").exists()


def test_a_killed_one_pass_resumes_per_data_file_and_ends_identical(in21k, tmp_path, monkeypatch):
    from imagenet_cog import _onepass
    from imagenet_cog.store import build_store, build_stores

    root, wnids, _ = in21k
    kwargs = {"shard_size": 20, "progress": False}
    alone = _store_jobs(root / "wds", wnids, tmp_path / "alone")
    for path, split in alone:
        build_store(path, FeatureExtractor(**MODEL, num_workers=0), split, **kwargs)
    jobs = _store_jobs(root / "wds", wnids, tmp_path / "together")
    real, written = _onepass._write_record, []

    def dies_after_two_files(store, path, indices, part):
        if len(set(written)) == 2 and path not in written:
            raise KeyboardInterrupt("killed")
        written.append(path)
        return real(store, path, indices, part)

    monkeypatch.setattr(_onepass, "_write_record", dies_after_two_files)
    with pytest.raises(KeyboardInterrupt):
        build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    assert not (jobs[0][0] / "manifest.json").exists()
    assert (jobs[0][0] / "run.json").exists()
    monkeypatch.setattr(_onepass, "_write_record", real)
    opened = _count_opens(monkeypatch)
    build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    every = {_onepass_file(s) for _, sp in jobs for s in sp.sources}
    assert set(opened) == every - set(written)  # the finished data files are not read again
    assert len(opened) == len(every) - 2
    for (a, _), (b, _) in zip(alone, jobs):
        assert _store_files(a) == _store_files(b)


def test_a_record_damaged_between_the_kill_and_the_resume_is_computed_again(
    in21k, tmp_path, monkeypatch
):
    from imagenet_cog import _onepass
    from imagenet_cog.store import build_store, build_stores

    root, wnids, _ = in21k
    kwargs = {"shard_size": 20, "progress": False}
    alone = _store_jobs(root / "wds", wnids, tmp_path / "alone")
    for path, split in alone:
        build_store(path, FeatureExtractor(**MODEL, num_workers=0), split, **kwargs)
    jobs = _store_jobs(root / "wds", wnids, tmp_path / "together")
    real, written = _onepass._write_record, []

    def dies_after_two_files(store, path, indices, part):
        if len(set(written)) == 2 and path not in written:
            raise KeyboardInterrupt("killed")
        written.append(path)
        return real(store, path, indices, part)

    monkeypatch.setattr(_onepass, "_write_record", dies_after_two_files)
    with pytest.raises(KeyboardInterrupt):
        build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    monkeypatch.setattr(_onepass, "_write_record", real)
    # One byte of one kept record flips (a bad disk, a copy): its size stays the same.
    record = next(p for p in sorted((jobs[0][0] / ".pass").glob("*.npy")) if p.stat().st_size > 200)
    data = bytearray(record.read_bytes())
    data[-3] ^= 0x40
    record.write_bytes(bytes(data))
    opened = _count_opens(monkeypatch)
    build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    every = {_onepass_file(s) for _, sp in jobs for s in sp.sources}
    assert len(opened) == len(every) - 1  # the damaged file's data file is read again
    for (a, _), (b, _) in zip(alone, jobs):
        assert _store_files(a) == _store_files(b)


def test_a_pass_killed_after_some_stores_finished_leaves_no_records_behind(
    in21k, tmp_path, monkeypatch
):
    from imagenet_cog import _onepass
    from imagenet_cog import store as store_module
    from imagenet_cog.store import build_stores

    root, wnids, _ = in21k
    kwargs = {"shard_size": 20, "progress": False}
    jobs = _store_jobs(root / "wds", wnids, tmp_path / "together")
    real, finished = store_module._finalize, []

    def dies_at_the_third_store(job, *args):
        if len(finished) == 2:
            raise KeyboardInterrupt("killed")
        finished.append(job.path)
        return real(job, *args)

    monkeypatch.setattr(store_module, "_finalize", dies_at_the_third_store)
    with pytest.raises(KeyboardInterrupt):
        build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    monkeypatch.setattr(store_module, "_finalize", real)
    assert finished == [jobs[0][0], jobs[1][0]]
    for path, _ in jobs[:2]:  # finished: their copy of the features is gone
        assert (path / "manifest.json").is_file() and not (path / ".pass").exists()
    assert (jobs[2][0] / ".pass").is_dir()  # unfinished: what the next run resumes from
    # Killed between a store's manifest and the removal of its records: the next run removes
    # them, though it reuses the store.
    real_remove = _onepass.remove_records

    def dies_removing(done):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(_onepass, "remove_records", dies_removing)
    with pytest.raises(KeyboardInterrupt):
        build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    monkeypatch.setattr(_onepass, "remove_records", real_remove)
    assert (jobs[2][0] / "manifest.json").is_file() and (jobs[2][0] / ".pass").is_dir()
    build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    assert not [path for path, _ in jobs if (path / ".pass").exists()]


def test_a_rerun_of_extract_all_removes_the_records_left_in_stores_it_skips(
    in21k, tmp_path, monkeypatch
):
    # Before: extract_all skips a finished store before any store is prepared, so the
    # records a pass killed before their removal left in it (a copy of its features) stayed.
    from imagenet_cog import Levels, _onepass, extract_all

    root, wnids, _ = in21k
    levels = Levels([[wnids[0]], [wnids[1]]])
    kwargs = {"n_test": 5, "preprocessing": {"size": 16}, "progress": False, "num_workers": 0}
    out = tmp_path / "f"

    def dies_removing(done):  # killed once the first store is finished
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(_onepass, "remove_records", dies_removing)
    with pytest.raises(KeyboardInterrupt):
        extract_all(MODEL["model"], {"in21k": root / "wds"}, out, levels, **kwargs)
    monkeypatch.undo()
    stores = [out / d / s for d in ("L1", "L2") for s in ("train", "test")]
    finished = [p for p in stores if (p / "manifest.json").is_file()]
    assert len(finished) == 1 and all((p / ".pass").is_dir() for p in stores)
    extract_all(MODEL["model"], {"in21k": root / "wds"}, out, levels, **kwargs)
    assert all((p / "manifest.json").is_file() for p in stores)
    assert not [p for p in stores if (p / ".pass").exists()]
    # A finished store that another process holds (here a reader) keeps its records until a
    # run finds it free.
    from imagenet_cog._fileio import FolderLock

    (stores[0] / ".pass").mkdir()
    with FolderLock(stores[0], "feature store", shared=True):
        extract_all(MODEL["model"], {"in21k": root / "wds"}, out, levels, **kwargs)
        assert (stores[0] / ".pass").is_dir()
    extract_all(MODEL["model"], {"in21k": root / "wds"}, out, levels, **kwargs)
    assert not (stores[0] / ".pass").exists()


def test_extract_all_builds_the_stores_of_a_copy_in_one_pass(in21k, tmp_path, monkeypatch):
    from imagenet_cog import Levels, extract_all

    root, wnids, _ = in21k
    levels = Levels([[wnids[0]], [wnids[1]]])
    opened = _count_opens(monkeypatch)
    kwargs = {"n_test": 5, "preprocessing": {"size": 16}, "progress": False, "num_workers": 0}
    extract_all(MODEL["model"], {"in21k": root / "wds"}, tmp_path / "f", levels, **kwargs)
    shards = sorted(str(p) for p in (root / "wds").glob("*.tar"))
    assert sorted(opened) == shards  # five data files, each opened once for four stores


def test_one_pass_keeps_the_store_shards_an_earlier_run_finished(in21k, tmp_path, monkeypatch):
    from imagenet_cog import store as store_module
    from imagenet_cog.store import build_store, build_stores

    root, wnids, _ = in21k
    kwargs = {"shard_size": 20, "progress": False}
    alone = _store_jobs(root / "wds", wnids, tmp_path / "alone")
    for path, split in alone:
        build_store(path, FeatureExtractor(**MODEL, num_workers=0), split, **kwargs)
    jobs = _store_jobs(root / "wds", wnids, tmp_path / "together")
    build_store(jobs[3][0], FeatureExtractor(**MODEL, num_workers=0), jobs[3][1], **kwargs)
    real, calls = store_module._write_shard, []

    def dies_after_one_shard(*args):
        if calls:
            raise KeyboardInterrupt("killed")
        calls.append(args[1])
        return real(*args)

    monkeypatch.setattr(store_module, "_write_shard", dies_after_one_shard)
    with pytest.raises(KeyboardInterrupt):  # L1/test: shard 0 of 3 written, then killed
        build_store(jobs[1][0], FeatureExtractor(**MODEL, num_workers=0), jobs[1][1], **kwargs)
    monkeypatch.setattr(store_module, "_write_shard", real)
    before = (jobs[3][0] / "manifest.json").stat().st_mtime_ns
    build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    assert (jobs[3][0] / "manifest.json").stat().st_mtime_ns == before  # reused, not rebuilt
    assert (
        json.loads((jobs[1][0] / "manifest.json").read_text())["execution"]["shards_resumed"] == 1
    )
    for (a, _), (b, _) in zip(alone, jobs):
        assert _store_files(a) == _store_files(b)


# ------------------------------------------------------- ImageNet-21K-P as folders


def test_an_image_that_cannot_be_decoded_leaves_the_network_the_batch_size_planned(
    in21k, tmp_path, monkeypatch
):
    import io

    from PIL import Image

    from imagenet_cog.store import build_store, build_stores

    _, wnids, images = in21k
    bad = f"{wnids[0]}/{wnids[0]}_990003.JPEG"  # a training image of L1

    def process(data):
        if data == images[bad]:
            return b"not an image", (8, 8), None
        return data, Image.open(io.BytesIO(data)).size, None

    write_shards(tmp_path / "wds", images, n_shards=3, process=process)
    sizes, real = [], FeatureExtractor._forward
    monkeypatch.setattr(
        FeatureExtractor, "_forward", lambda self, x: sizes.append(len(x)) or real(self, x)
    )
    kwargs = {"shard_size": 20, "progress": False}
    alone = _store_jobs(tmp_path / "wds", wnids, tmp_path / "alone")
    for path, split in alone:
        sizes.clear()
        build_store(path, FeatureExtractor(**MODEL, num_workers=0), split, **kwargs)
        planned = []
        for start in range(0, len(split), 20):
            m = min(20, len(split) - start)
            planned += [8] * (m // 8) + [m % 8] * bool(m % 8)
        assert sorted(sizes) == sorted(planned), path
    skipped = json.loads((alone[0][0] / "manifest.json").read_text())["skipped"]
    assert [s["id"] for s in skipped] == [bad]
    jobs = _store_jobs(tmp_path / "wds", wnids, tmp_path / "together")
    build_stores(jobs, FeatureExtractor(**MODEL, num_workers=0), **kwargs)
    for (a, _), (b, _) in zip(alone, jobs):
        assert _store_files(a) == _store_files(b)
