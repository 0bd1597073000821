"""Copies as researchers hold them: webdataset shards and Parquet files read like folders."""

import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
from copyfiles import folder_images, resize_short, write_parquet, write_shards
from helpers import needs
from imagefiles import official_concepts, write_concepts, write_in1k

from imagenet_cog import _copies
from imagenet_cog.datasets import ImageDataset, make_split
from imagenet_cog.features import FeatureExtractor
from imagenet_cog.taxonomy import imagenet1k_wnids

needs("pyarrow", module_level=True)

MODEL = {"model": "torchvision:resnet18:none", "preprocessing": {"size": 16}, "batch_size": 8}


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGENET_COG_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def in21k(tmp_path_factory):
    """Two official L1 concepts (their 50 official test images and 9 more) as folders, as
    shards (shuffled across classes, the train and validation shards together), as Parquet."""
    root = tmp_path_factory.mktemp("copies")
    concepts = official_concepts(n_concepts=2, n_train=9, bad=False)
    write_concepts(root / "folders", concepts)
    images = folder_images(root / "folders")
    ids = sorted(images)
    val_ids = set(ids[::10])
    write_shards(root / "wds", {i: images[i] for i in ids if i not in val_ids}, n_shards=3)
    write_shards(root / "wds", {i: images[i] for i in val_ids}, split="validation", n_shards=2)
    write_parquet(root / "parquet", images, n_files=2)
    return root, sorted(concepts), images


def _features(split):
    return FeatureExtractor(**MODEL).transform(split.dataset())


@pytest.mark.parametrize("layout", ["wds", "parquet"])
def test_a_copy_gives_the_folder_split_and_features(in21k, layout):
    root, wnids, _ = in21k
    for split in ("test", "train"):
        folders = make_split(root / "folders", "L1", split, wnids=wnids)
        copy = make_split(root / layout, "L1", split, wnids=wnids)
        assert copy.ids == folders.ids and copy.checksum == folders.checksum
        assert copy.info["layout"] == {"wds": "webdataset shards", "parquet": "parquet"}[layout]
        assert copy.info["copy"]["processed"] is False
    np.testing.assert_array_equal(_features(copy), _features(folders))


def test_layout_is_detected_by_content_and_a_mix_is_refused(in21k, tmp_path):
    root, _, _ = in21k
    assert _copies.detect_layout(root / "folders") == _copies.FOLDERS
    assert _copies.detect_layout(root / "wds") == _copies.WEBDATASET
    assert _copies.detect_layout(root / "parquet") == _copies.PARQUET
    mixed = tmp_path / "mixed"
    (mixed / "n01440764").mkdir(parents=True)
    (mixed / "imagenet22k-train-0000.tar").write_bytes(b"")
    with pytest.raises(ValueError, match=r"mixes webdataset shards .* and folder or tar per wnid"):
        make_split(mixed, "L1", "test", wnids=[in21k[1][0]])
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "winter21_whole.tar").write_bytes(b"")
    with pytest.raises(ValueError, match=r"tar of per-wnid tars must be unpacked first"):
        _copies.detect_layout(packed)


def test_resized_and_webp_copies_record_their_processing(in21k, tmp_path):
    _root, wnids, images = in21k
    big = {i: resize_short(d, 10_000, "PNG")[0] for i, d in images.items()}  # lossless
    n_big = sum(min(_size(d)) > 20 for d in big.values())
    assert n_big > 0
    write_shards(tmp_path / "wds", big, process=lambda d: resize_short(d, 20))
    split = make_split(tmp_path / "wds", "L1", "test", wnids=wnids)
    assert split.info["copy"]["resized"] == n_big and split.info["copy"]["processed"]
    assert split.info["copy"]["name"] == "imagenet22k"
    assert "600 px" in split.info["copy"]["processing"]
    # A WebP copy: the same bytes as a folder give the same features (Pillow decodes WebP).
    webp = {i: resize_short(d, 10_000, "WEBP")[0] for i, d in images.items()}
    write_shards(tmp_path / "webp", webp, name="imagenet-w21-webp", ext="webp")
    for image_id, data in webp.items():
        (tmp_path / "webp_folders" / image_id).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "webp_folders" / image_id).write_bytes(data)
    a = make_split(tmp_path / "webp", "L1", "test", wnids=wnids)
    b = make_split(tmp_path / "webp_folders", "L1", "test", wnids=wnids)
    assert a.checksum == b.checksum and a.info["copy"]["formats"] == {"webp": len(webp)}
    np.testing.assert_array_equal(_features(a), _features(b))


def _size(data):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data)).size


@pytest.mark.parametrize("layout", ["wds", "parquet"])
def test_in1k_copies_match_the_folder_layout(tmp_path, layout):
    wnids, _ = write_in1k(tmp_path / "folders", n_classes=3, n_train=4, n_val=2)
    train = folder_images(tmp_path / "folders" / "train")
    val = {
        f"{w}/{n}": (tmp_path / "folders" / "val" / n).read_bytes()
        for w in wnids
        for n in os.listdir(tmp_path / "folders" / "val")
        if _val_label(n) == w
    }
    classes = list(imagenet1k_wnids())
    if layout == "wds":
        write_shards(tmp_path / "copy", train, name="imagenet1k", classes=classes, filename=True)
        write_shards(
            tmp_path / "copy",
            val,
            name="imagenet1k",
            split="validation",
            classes=classes,
            filename=True,
            n_shards=2,
        )
    else:
        names = [f"class name {i}" for i in range(1000)]  # human names, in the wnid order
        write_parquet(tmp_path / "copy", train, names=names, path_style="hf1k", classes=classes)
        write_parquet(
            tmp_path / "copy",
            val,
            split="validation",
            names=names,
            path_style="hf1k",
            classes=classes,
        )
    for split in ("train", "test"):
        a = make_split(tmp_path / "folders", "in1k", split, wnids=wnids)
        b = make_split(tmp_path / "copy", "in1k", split, wnids=wnids)
        assert b.ids == a.ids and b.checksum == a.checksum


def _val_label(name):
    from imagenet_cog.datasets import read_val_labels

    return read_val_labels().get(name)


def test_refusals_name_the_problem(in21k, tmp_path):
    _root, _wnids, images = in21k
    few = {i: images[i] for i in sorted(images)[:6]}
    # A cut-short shard.
    (shard,) = write_shards(tmp_path / "cut", few, n_shards=1)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut short"):
        _copies.list_copy(tmp_path / "cut")
    # A duplicate key across shards.
    write_shards(tmp_path / "dup", few, n_shards=1)
    write_shards(tmp_path / "dup", dict(list(few.items())[:1]), split="validation", n_shards=1)
    with pytest.raises(ValueError, match=r"duplicate key: .* is in both"):
        _copies.list_copy(tmp_path / "dup")
    # A sample without an image.
    write_shards(tmp_path / "noimg", few, n_shards=1, ext="txt")
    with pytest.raises(ValueError, match=r"sample '.*' has no image \(only .cls, .json"):
        _copies.list_copy(tmp_path / "noimg")
    # An unknown class order: keys that name no wnid, integer labels only.
    odd = {f"{i.split('/')[0]}/img_{k}.JPEG": d for k, (i, d) in enumerate(few.items())}
    write_shards(tmp_path / "odd", odd, name="somecopy", n_shards=1)
    with pytest.raises(ValueError, match=r"class order is unknown"):
        _copies.list_copy(tmp_path / "odd")
    # A 1K copy whose labels are not in the sorted-wnid order.
    one_k = {
        f"{w}/{w}_{k}.JPEG": next(iter(few.values()))
        for k, w in enumerate(list(imagenet1k_wnids())[:2])
    }
    write_shards(
        tmp_path / "order",
        one_k,
        name="imagenet1k",
        classes=list(imagenet1k_wnids()),
        cls_offset=1,
        n_shards=1,
    )
    with pytest.raises(ValueError, match=r"unknown class order"):
        make_split(tmp_path / "order", "in1k", "train", wnids=list(imagenet1k_wnids())[:2])


def test_parquet_sample_without_image_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "image": pa.array(
                [
                    {"bytes": b"x", "path": "n01440764_1.JPEG"},
                    {"bytes": None, "path": "n01440764_2.JPEG"},
                ],
                type=image_type,
            ),
            "label": pa.array([0, 0], pa.int64()),
        }
    )
    pq.write_table(table, tmp_path / "data" / "train-00000-of-00001.parquet")
    with pytest.raises(ValueError, match=r"without an image"):
        _copies.list_copy(tmp_path)


def test_listing_reads_headers_once_and_is_cached_by_size_and_mtime(
    in21k, tmp_path, monkeypatch, cache_home
):
    _root, _wnids, images = in21k
    paths = write_shards(tmp_path / "wds", images, n_shards=2)
    first, _ = _copies.list_copy(tmp_path / "wds")
    assert len(list(cache_home.glob("listings/*.json"))) == 2
    calls = []
    real = _copies._list_shard
    monkeypatch.setattr(_copies, "_list_shard", lambda p: calls.append(p) or real(p))
    again, _ = _copies.list_copy(tmp_path / "wds")
    assert again == first and calls == []
    os.utime(paths[0], ns=(1, 1))  # another modification time: listed again
    _copies.list_copy(tmp_path / "wds")
    assert [os.path.basename(p) for p in calls] == [paths[0].name]
    cached = json.loads(next(cache_home.glob("listings/*.json")).read_text())
    assert set(cached["stamp"]) >= {"size", "mtime_ns", "path"}


def test_image_dataset_reads_parquet_images(in21k):
    root, wnids, images = in21k
    split = make_split(root / "parquet", "L1", "test", wnids=wnids)
    ds = ImageDataset(split.sources, split.ids)
    assert ds.read_bytes(0) == images[split.ids[0]]
    assert isinstance(split.sources[0], _copies.ParquetImage)


def test_comparability_names_a_processed_copy_with_its_measured_effect():
    from official_run import paper_like

    from imagenet_cog.results import comparability

    copy = {
        "layout": "webdataset shards",
        "name": "imagenet22k",
        "processing": "...",
        "samples": 1000,
        "resized": 120,
        "formats": {"jpg": 1000},
        "processed": True,
    }
    found = comparability(
        paper_like(data_split={"seed": 0, "cap": 1300, "copy": copy}), by_model=True
    )["mine"]
    assert found["deviations"] == []
    (caveat,) = [c for c in found["caveats"] if "copy" in c]
    assert caveat.startswith("L2: images from the imagenet22k copy (webdataset shards)")
    assert "120 of 1,000 images resized" in caveat and "mean feature cosine of 0.9994" in caveat
    unprocessed = dict(copy, resized=0, processed=False)
    found = comparability(
        paper_like(data_split={"seed": 0, "cap": 1300, "copy": unprocessed}), by_model=True
    )["mine"]
    assert not [c for c in found["caveats"] if "copy" in c]


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


def test_the_data_command_reports_each_domain_from_listings(in21k, tmp_path, capsys):
    from imagenet_cog.cli import main

    root, wnids, _ = in21k
    missing = tmp_path / "missing.tsv"
    code = main(["data", str(root / "wds"), "--missing", str(missing)])
    out = capsys.readouterr().out
    assert code == 1  # two concepts of L1 only: the levels cannot be built
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["domain", "copy"]
    l1 = next(line for line in lines if line.startswith("L1 "))
    assert "webdataset shards (imagenet22k)" in l1 and "2/1,000" in l1 and "100/50,000" in l1
    assert "cannot be built" in l1 and "cannot be built: L1, L2, L3, L4, L5" in out
    text = missing.read_text().splitlines()
    assert "L1\tconcept\tn01440764" not in text and f"L1\tconcept\t{wnids[0]}" not in text
    assert sum(line.startswith("L1\tconcept") for line in text) == 998
    assert sum(line.startswith("L1\ttest image") for line in text) == 49_900


def test_the_data_command_on_in1k_copies(tmp_path, capsys):
    from imagenet_cog._coverage import check_coverage

    write_in1k(tmp_path / "folders", n_classes=3, n_train=4, n_val=2)
    train = folder_images(tmp_path / "folders" / "train")
    write_shards(
        tmp_path / "wds", train, name="imagenet1k", classes=list(imagenet1k_wnids()), filename=True
    )
    (row,) = check_coverage([tmp_path / "folders"])
    assert (row["domain"], row["concepts"], row["train_images"], row["test_images"]) == (
        "in1k",
        3,
        12,
        6,
    )
    (row,) = check_coverage([tmp_path / "wds"])
    assert row["layout"] == "webdataset shards (imagenet1k)" and row["train_images"] == 12
    assert row["test_images"] == 0 and row["verdict"] == "cannot be built"


@pytest.mark.parametrize("fmt", ["USTAR_FORMAT", "GNU_FORMAT", "PAX_FORMAT"])
def test_the_header_reader_agrees_with_tarfile(tmp_path, fmt):
    import io
    import tarfile

    path = tmp_path / "imagenet22k-train-0000.tar"
    names = ["n01440764_1.jpg", "d" * 120 + "/n01440764_2.jpg", "é/n01440764_3.json", "sub/x"]
    with tarfile.open(path, "w", format=getattr(tarfile, fmt)) as tar:
        for k, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = 700 * k + 3
            tar.addfile(info, io.BytesIO(bytes(info.size)))
        folder = tarfile.TarInfo("folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)  # not a regular file
    with tarfile.open(path) as tar:
        expect = [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
    with open(path, "rb") as f:
        got = list(_copies._tar_members(f.fileno(), path.stat().st_size, path))
    assert got == expect and len(got) == 4


def test_webp_goes_to_pillow_on_the_tensor_decoder_path(in21k, tmp_path):
    _root, _wnids, images = in21k
    webp = {i: resize_short(d, 10_000, "WEBP")[0] for i, d in sorted(images.items())[:12]}
    write_shards(tmp_path / "webp", webp, name="imagenet-w21-webp", ext="webp", n_shards=2)
    listing, _copy = _copies.list_copy(tmp_path / "webp")
    sources = [s for w in sorted(listing) for _, s in sorted(listing[w].items())]
    from imagenet_cog.datasets import TarMember

    dataset = ImageDataset([TarMember(*s) for s in sources])
    pil = FeatureExtractor(**MODEL, decoder="pil").transform(dataset)
    tensor = FeatureExtractor(**MODEL, decoder="torchvision")
    with pytest.warns(UserWarning, match=r"12 image\(s\) were decoded with Pillow.*not a JPEG"):
        np.testing.assert_array_equal(tensor.transform(dataset), pil)
    assert len(tensor.pillow_fallbacks_) == len(webp)


def test_parquet_copy_records_its_encoding_and_published_processing(in21k, tmp_path):
    _root, wnids, images = in21k
    webp = {i: resize_short(d, 10_000, "WEBP")[0] for i, d in images.items()}
    write_parquet(tmp_path / "imagenet-w21-p", webp)
    split = make_split(tmp_path / "imagenet-w21-p", "L1", "test", wnids=wnids)
    copy = split.info["copy"]
    assert copy["formats"] == {"webp": len(webp)} and copy["processed"]
    assert "224 px" in copy["processing"]


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
    import imagenet_cog.datasets as datasets_module

    def opening(path, mode="r", *args, **kwargs):
        note(str(path))
        return open(path, mode, *args, **kwargs)

    real = _copies._row_group_images

    def reading(path, row_group):
        note(f"{path}#{row_group}")
        return real(path, row_group)

    monkeypatch.setattr(datasets_module, "open", opening, raising=False)
    monkeypatch.setattr(_copies, "_row_group_images", reading)
    _copies._ROW_GROUPS.clear()


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
    _copies._ROW_GROUPS.clear()
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
    from imagenet_cog._file_split import data_file

    if isinstance(source, _copies.ParquetImage):
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

import imagenet_cog.datasets as datasets_module
from imagenet_cog import Levels, extract_all

root, out, log, a, b = sys.argv[1:6]


def opening(path, mode="r", *args, **kwargs):
    with open(log, "a", encoding="utf-8") as f:
        f.write(os.environ.get("RANK", "alone") + "\\t" + str(path) + "\\n")
    return open(path, mode, *args, **kwargs)


datasets_module.open = opening
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


def test_split_runs_cuts_where_a_data_file_ends():
    from imagenet_cog._file_split import split_runs
    from imagenet_cog.datasets import TarMember

    # Six tars of 10 images, read in batches of 4 that straddle the tars.
    sources = [TarMember(f"s{k}.tar", 512 * i, 10) for k in range(6) for i in range(10)]
    batches = [list(range(a, min(a + 4, 60))) for a in range(0, 60, 4)]
    runs = split_runs(batches, sources, 3)
    assert [b for run in runs for b in run] == batches  # contiguous, in order, all
    assert [sum(map(len, run)) for run in runs] == [20, 20, 20]
    # 20 images a run: the cuts fall after images 20 and 40, where tars s1 and s3 end.
    assert [sources[run[-1][-1]].tar for run in runs] == ["s1.tar", "s3.tar", "s5.tar"]
    # Batches of 3 or 7 do not end where a tar ends: each cut goes to the batch boundary
    # nearest to a tar's end (one or two images off), not to the middle of a tar.
    for size, last in ((3, [20, 38, 59]), (7, [20, 41, 59])):
        batches = [list(range(a, min(a + size, 60))) for a in range(0, 60, size)]
        runs = split_runs(batches, sources, 3)
        assert [b for run in runs for b in run] == batches
        assert [run[-1][-1] for run in runs] == last, size
    assert split_runs([], [], 2) == [[], []]


def test_a_planned_reader_reads_each_row_group_once(in21k, monkeypatch):
    root = in21k[0]
    listing, _ = _copies.list_copy(root / "parquet")
    sources = sorted(
        (s for per in listing.values() for s in per.values()),
        key=lambda s: (s.row, s.path, s.row_group),  # row 0 of every group, then row 1...
    )
    groups = {(s.path, s.row_group) for s in sources}
    assert len(groups) > 4  # more than the 4 row groups an unplanned reader keeps
    reads = []
    real = _copies._row_group_images
    monkeypatch.setattr(_copies, "_row_group_images", lambda *g: reads.append(g) or real(*g))
    _copies._ROW_GROUPS.clear()
    unplanned = [_copies.read_parquet_image(s) for s in sources]
    assert len(reads) > len(groups)
    reads.clear()
    with _copies.planned_parquet_reads(sources):
        planned = [_copies.read_parquet_image(s) for s in sources]
        assert _copies._PINNED == {}  # each row group dropped after its last image
    assert sorted(reads) == sorted(groups)
    assert planned == unplanned


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
def _miil_copy(images, root):
    """ImageNet-21K-P as its authors publish it (Alibaba-MIIL/ImageNet21K,
    ``dataset_preprocessing/processing_script.sh`` and ``resize.py``): ``imagenet21k_train/``
    and ``imagenet21k_val/`` of wnid folders, the first 50 files of each class (``ls`` order)
    moved to the second, every image whose longer side is 224 px or more squeezed to
    224 x 224 and written as JPEG quality 95. Here the small test images are squeezed too
    (Pillow's bilinear resize), so that the copy looks as it does at full size."""
    import io

    from PIL import Image

    by_wnid = {}
    for image_id, data in images.items():
        wnid, name = image_id.split("/", 1)
        by_wnid.setdefault(wnid, {})[name] = data
    for wnid, files in by_wnid.items():
        for k, name in enumerate(sorted(files)):
            folder = root / ("imagenet21k_val" if k < 50 else "imagenet21k_train") / wnid
            folder.mkdir(parents=True, exist_ok=True)
            img = Image.open(io.BytesIO(files[name])).convert("RGB").resize((224, 224))
            img.save(folder / name, "JPEG", quality=95)
    return root


def test_imagenet_21k_p_folders_are_merged_by_the_line_given_then_recognised(in21k, tmp_path):
    import subprocess

    from imagenet_cog._comparability import copy_caveat
    from imagenet_cog._coverage import check_coverage

    root, wnids, images = in21k
    miil = _miil_copy(images, tmp_path / "imagenet21k_resized")
    with pytest.raises(ValueError, match=r"imagenet21k_train/ and imagenet21k_val/") as err:
        make_split(miil, "L1", "test", wnids=wnids)
    command = str(err.value).split("(mkdir", 1)[1].split("), and give", 1)[0]
    subprocess.run("mkdir" + command, shell=True, check=True)  # the line the error gives
    merged = miil / "merged"
    for part in ("test", "train"):
        split = make_split(merged, "L1", part, wnids=wnids)
        folders = make_split(root / "folders", "L1", part, wnids=wnids)
        assert split.ids == folders.ids and split.checksum == folders.checksum
        copy = split.info["copy"]
        assert (copy["name"], copy["layout"], copy["processed"]) == (
            "imagenet21k-p",
            "folder per wnid",
            True,
        )
        assert copy["seen"] == "2 of 2 sampled images are 224 x 224"
    caveat = copy_caveat("L1", copy)
    assert "squeezing each image to 224 x 224 px" in caveat and "cosine of 0.9247" in caveat
    row = next(r for r in check_coverage([merged]) if r["domain"] == "L1")
    assert row["layout"] == "folder per wnid (imagenet21k-p)"
    assert row["changed"] == "2 of 2 sampled images are 224 x 224"
    assert row["published_processing"].startswith("ImageNet-21K-P's processing")


def test_a_folder_copy_of_the_original_files_has_no_copy_record(in21k):
    root, wnids, _ = in21k
    assert "copy" not in make_split(root / "folders", "L1", "test", wnids=wnids).info
    assert _copies.folder_copy({}) is None


def test_the_caveats_quote_the_measured_effects_of_each_processing():
    from imagenet_cog._comparability import COPY_EFFECTS, copy_caveat

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    rows = json.loads((bench / "copy_processing_cpu.json").read_text())["processing"]
    for effect in COPY_EFFECTS.values():
        measured = rows[effect["row"]]
        assert effect["cosine"] == round(measured["cosine_mean"], 4), effect["row"]
        assert effect["top1"] == round(100 * measured["top1_agreement"], 1), effect["row"]
    # Each published copy's caveat quotes the row of its own processing.
    for name, layout, row in (
        ("imagenet22k", "webdataset shards", "600"),
        ("imagenet-w21-webp", "webdataset shards", "768"),
        ("imagenet-w21-p", "parquet", "224-webp"),
        ("imagenet21k-p", "folder per wnid", "224"),
    ):
        caveat = copy_caveat("L1", {"name": name, "layout": layout, "processing": "x"})
        assert f"cosine of {COPY_EFFECTS[row]['cosine']} " in caveat, name
    assert "measured" not in copy_caveat("L1", {"name": "my-copy", "layout": "parquet"})


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
