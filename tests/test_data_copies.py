"""The data wing on copies as researchers hold them: webdataset shards and Parquet files.

A copy is listed like the same images as folders (the same split, the same features), its
layout is recognised by content, a damaged or ambiguous copy is refused naming the problem,
its listing is cached, its processing is recorded with its measured effect, and its data
files are read by row group and shared among DataLoader workers by file.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from copyfiles import folder_images, resize_short, write_copy_layouts, write_parquet, write_shards
from imagefiles import write_in1k

from imagenet_cog._data import copies
from imagenet_cog._data import shards as shard_reader
from imagenet_cog._data import sources as image_sources
from imagenet_cog._data.listing import list_copy
from imagenet_cog.datasets import ImageDataset, make_split
from imagenet_cog.features import FeatureExtractor
from imagenet_cog.taxonomy import imagenet1k_wnids

pytest.importorskip("pyarrow")

MODEL = {"model": "torchvision:resnet18:none", "preprocessing": {"size": 16}, "batch_size": 8}


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGENET_COG_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # the files imagenet-cog data writes by default go there
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def in21k(tmp_path_factory):
    """Two official L1 concepts as folders, as shards and as Parquet (``write_copy_layouts``)."""
    return write_copy_layouts(tmp_path_factory.mktemp("copies"))


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
    assert copies.detect_layout(root / "folders") == copies.FOLDERS
    assert copies.detect_layout(root / "wds") == copies.WEBDATASET
    assert copies.detect_layout(root / "parquet") == copies.PARQUET
    mixed = tmp_path / "mixed"
    (mixed / "n01440764").mkdir(parents=True)
    (mixed / "imagenet22k-train-0000.tar").write_bytes(b"")
    with pytest.raises(ValueError, match=r"mixes webdataset shards .* and folder or tar per wnid"):
        make_split(mixed, "L1", "test", wnids=[in21k[1][0]])
    packed = tmp_path / "packed"
    packed.mkdir()
    import tarfile

    (tmp_path / "n01440764.tar").write_bytes(bytes(10240))
    with tarfile.open(packed / "winter21_whole.tar", "w") as tar:  # the release as one file
        tar.add(tmp_path / "n01440764.tar", "n01440764.tar")
    with pytest.raises(ValueError, match=r"a tar of tars .*: unpack it first"):
        copies.detect_layout(packed)
    (packed / "winter21_whole.tar").write_bytes(b"")  # neither: named, never unpacked
    with pytest.raises(ValueError, match=r"neither a tar per wnid .* nor a webdataset shard"):
        copies.detect_layout(packed)


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
    from imagenet_cog._data.labels import read_val_labels

    return read_val_labels().get(name)


def test_refusals_name_the_problem(in21k, tmp_path):
    _root, _wnids, images = in21k
    few = {i: images[i] for i in sorted(images)[:6]}
    # A cut-short shard.
    (shard,) = write_shards(tmp_path / "cut", few, n_shards=1)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut short"):
        list_copy(tmp_path / "cut")
    # A duplicate key across shards.
    write_shards(tmp_path / "dup", few, n_shards=1)
    write_shards(tmp_path / "dup", dict(list(few.items())[:1]), split="validation", n_shards=1)
    with pytest.raises(ValueError, match=r"duplicate key: .* is in both"):
        list_copy(tmp_path / "dup")
    # A sample without an image.
    write_shards(tmp_path / "noimg", few, n_shards=1, ext="txt")
    with pytest.raises(ValueError, match=r"sample '.*' has no image \(only .cls, .json"):
        list_copy(tmp_path / "noimg")
    # An unknown class order: keys that name no wnid, integer labels only.
    odd = {f"{i.split('/')[0]}/img_{k}.JPEG": d for k, (i, d) in enumerate(few.items())}
    write_shards(tmp_path / "odd", odd, name="somecopy", n_shards=1)
    with pytest.raises(ValueError, match=r"class order is unknown"):
        list_copy(tmp_path / "odd")
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
        list_copy(tmp_path)


def test_listing_reads_headers_once_and_is_cached_by_size_and_mtime(
    in21k, tmp_path, monkeypatch, cache_home
):
    _root, _wnids, images = in21k
    paths = write_shards(tmp_path / "wds", images, n_shards=2)
    first, _ = list_copy(tmp_path / "wds")
    assert len(list(cache_home.glob("listings/*.json"))) == 2
    calls = []
    real = shard_reader._list_shard
    monkeypatch.setattr(shard_reader, "_list_shard", lambda p: calls.append(p) or real(p))
    again, _ = list_copy(tmp_path / "wds")
    assert again == first and calls == []
    os.utime(paths[0], ns=(1, 1))  # another modification time: listed again
    list_copy(tmp_path / "wds")
    assert [os.path.basename(p) for p in calls] == [paths[0].name]
    cached = json.loads(next(cache_home.glob("listings/*.json")).read_text())
    assert set(cached["stamp"]) >= {"size", "mtime_ns", "path"}


def test_image_dataset_reads_parquet_images(in21k):
    root, wnids, images = in21k
    split = make_split(root / "parquet", "L1", "test", wnids=wnids)
    ds = ImageDataset(split.sources, split.ids)
    assert ds.read_bytes(0) == images[split.ids[0]]
    assert isinstance(split.sources[0], image_sources.ParquetImage)


def test_comparability_names_a_processed_copy_with_its_measured_effect():
    from official_run import paper_like

    from imagenet_cog import comparability

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
    cosine = copies.COPY_EFFECTS["600"]["cosine"]
    assert "120 of 1,000 images resized" in caveat and f"mean feature cosine of {cosine}" in caveat
    unprocessed = dict(copy, resized=0, processed=False)
    found = comparability(
        paper_like(data_split={"seed": 0, "cap": 1300, "copy": unprocessed}), by_model=True
    )["mine"]
    assert not [c for c in found["caveats"] if "copy" in c]


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


def test_webp_goes_to_pillow_on_the_tensor_decoder_path(in21k, tmp_path):
    _root, _wnids, images = in21k
    webp = {i: resize_short(d, 10_000, "WEBP")[0] for i, d in sorted(images.items())[:12]}
    write_shards(tmp_path / "webp", webp, name="imagenet-w21-webp", ext="webp", n_shards=2)
    listing, _copy = list_copy(tmp_path / "webp")
    sources = [s for w in sorted(listing) for _, s in sorted(listing[w].items())]
    from imagenet_cog._data.sources import TarMember

    dataset = ImageDataset([TarMember(*s) for s in sources])
    pil = FeatureExtractor(**MODEL, decoder="pil").transform(dataset)
    tensor = FeatureExtractor(**MODEL, decoder="torchvision")
    with pytest.warns(UserWarning, match=r"12 image\(s\) were decoded with Pillow.*not a JPEG"):
        np.testing.assert_array_equal(tensor.transform(dataset), pil)
    assert len(tensor.pillow_fallbacks_) == len(webp)


def test_parquet_copy_records_its_encoding_and_published_processing(in21k, tmp_path):
    import io

    from PIL import Image

    _root, wnids, images = in21k
    webp = {i: resize_short(d, 10_000, "WEBP")[0] for i, d in images.items()}
    # Named as timm's ImageNet-21K-P copy, but its images are not 224 x 224: a name is not
    # what the copy is.
    write_parquet(tmp_path / "imagenet-w21-p", webp)
    copy = make_split(tmp_path / "imagenet-w21-p", "L1", "test", wnids=wnids).info["copy"]
    assert copy["formats"] == {"webp": len(webp)} and copy["processed"]
    assert copy["published"] is None and copy["processing"].startswith("unknown")
    squeezed = {}
    for image_id, data in images.items():
        buf = io.BytesIO()
        Image.open(io.BytesIO(data)).convert("RGB").resize((224, 224)).save(buf, "WEBP")
        squeezed[image_id] = buf.getvalue()
    write_parquet(tmp_path / "my-copy", squeezed)
    copy = make_split(tmp_path / "my-copy", "L1", "test", wnids=wnids).info["copy"]
    assert copy["published"] == "imagenet-w21-p" and copy["processed"]
    assert "224 x 224" in copy["processing"] and "224 x 224" in copy["seen"]


def test_split_runs_cuts_where_a_data_file_ends():
    from imagenet_cog._data.file_split import split_runs
    from imagenet_cog._data.sources import TarMember

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
    listing, _ = list_copy(root / "parquet")
    sources = sorted(
        (s for per in listing.values() for s in per.values()),
        key=lambda s: (s.row, s.path, s.row_group),  # row 0 of every group, then row 1...
    )
    groups = {(s.path, s.row_group) for s in sources}
    assert len(groups) > 4  # more than the 4 row groups an unplanned reader keeps
    reads = []
    real = image_sources._row_group_images
    monkeypatch.setattr(
        image_sources, "_row_group_images", lambda *g: reads.append(g[:2]) or real(*g)
    )
    image_sources._ROW_GROUPS.clear()
    unplanned = [image_sources.read_parquet_image(s) for s in sources]
    assert len(reads) > len(groups)
    reads.clear()
    with image_sources.planned_parquet_reads(sources):
        planned = [image_sources.read_parquet_image(s) for s in sources]
        assert image_sources._PINNED == {}  # each row group dropped after its last image
    assert sorted(reads) == sorted(groups)
    assert planned == unplanned


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
    cosine = copies.COPY_EFFECTS["224"]["cosine"]
    assert "squeezing each image to 224 x 224 px" in caveat and f"cosine of {cosine}" in caveat
    row = next(r for r in check_coverage([merged]) if r["domain"] == "L1")
    assert row["layout"] == "folder per wnid (imagenet21k-p)"
    assert row["changed"] == "2 of 2 sampled images are 224 x 224"
    assert row["published_processing"].startswith("ImageNet-21K-P's processing")


def test_a_folder_copy_of_the_original_files_has_no_copy_record(in21k):
    root, wnids, _ = in21k
    assert "copy" not in make_split(root / "folders", "L1", "test", wnids=wnids).info
    assert copies.folder_copy({}) is None


def test_the_caveats_quote_the_measured_effects_of_each_processing():
    from imagenet_cog._comparability import copy_caveat
    from imagenet_cog._data.copies import COPY_EFFECTS

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


def test_the_data_command_shows_a_copys_names_never_sends_them_to_the_terminal(
    in21k, tmp_path, capsys
):
    # Before: a received copy's shard names were printed raw: "\x1b]0;...\x07" set the
    # window's title, "\x1b[31m" coloured the text.
    from imagenet_cog.cli import main

    _root, _wnids, images = in21k
    evil = "copy\x1b]0;owned\x07\x1b[31m"
    write_shards(tmp_path / "wds", images, name=evil, n_shards=2)
    main(["data", str(tmp_path / "wds"), "--missing", str(tmp_path / "missing.tsv")])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "webdataset shards (copy\\x1b]0;owned\\x07\\x1b[31m)" in out
