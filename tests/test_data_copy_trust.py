"""A copy is what its content says, a stale listing is caught, and bad copies get one line.

- ImageNet-21K-P's processings are classified by their measured effect (a processing that
  changes the top-1 class of a quarter of the images is a deviation), and its variants are
  recognised by content: the squeeze as folders, Parquet or shards of JPEGs, the short edge
  of 256 px;
- a data file rewritten after it was listed, its size and time kept, stops the extraction
  instead of storing each image under another's label;
- copy metadata of the wrong type, a damaged Parquet file or pax header, and a 1,000-class
  copy whose readable names are in another order are refused with one line naming the file.
"""

import io
import json
import os
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from copyfiles import folder_images, write_shards
from hfcopies import hf_parquet
from imagefiles import official_concepts, write_concepts
from PIL import Image

from imagenet_cog import cli
from imagenet_cog.datasets import make_split

pytest.importorskip("pyarrow")
TINY = ["--preprocessing", '{"size": 16}', "--batch-size", "8", "--quiet", "--device", "cpu"]


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGENET_COG_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # the files imagenet-cog data writes by default go there


@pytest.fixture(scope="module")
def l1(tmp_path_factory):
    """``(folder root, wnids, {image id: bytes})``: two official L1 concepts as folders."""
    root = tmp_path_factory.mktemp("trust") / "folders"
    write_concepts(root, official_concepts(n_concepts=2, n_train=9, bad=False))
    images = folder_images(root)
    return root, sorted({i.split("/", 1)[0] for i in images}), images


def _one_line(capsys, *args):
    """Run ``imagenet-cog ARGS``; it must fail with one line on stderr, returned."""
    assert cli.main([str(a) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _squeezed(images, side=224, short=False, fmt="JPEG"):
    """ImageNet-21K-P's processings of small test images: squeezed to ``side`` x ``side``, or
    (``short``) resized to a shorter side of ``side`` px."""
    out = {}
    for image_id, data in images.items():
        img = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = img.size
        size = (round(w * side / min(w, h)), round(h * side / min(w, h))) if short else (side,) * 2
        buf = io.BytesIO()
        img.resize(size).save(buf, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        out[image_id] = buf.getvalue()
    return out


# ------------------------------------------------------------------ ImageNet-21K-P
def test_imagenet_21k_p_is_a_deviation_and_its_variants_are_recognised(l1, tmp_path):
    from test_comparability import paper_like

    from imagenet_cog import comparability
    from imagenet_cog._data.copies import COPY_EFFECTS, DEVIATION_TOP1

    _, wnids, images = l1
    # The squeezed JPEGs as a Parquet copy and as shards (no name says what they are), and
    # the short-edge variant as folders.
    hf_parquet(tmp_path / "parquet", _squeezed(images))
    write_shards(tmp_path / "wds", _squeezed(images), name="my-copy")
    for image_id, data in _squeezed(images, 256, short=True).items():
        (tmp_path / "short" / image_id).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "short" / image_id).write_bytes(data)
    records = {
        name: make_split(tmp_path / name, "L1", "test", wnids=wnids).info["copy"]
        for name in ("parquet", "wds", "short")
    }
    assert {n: (c["published"], c["processed"]) for n, c in records.items()} == {
        "parquet": ("imagenet21k-p", True),
        "wds": ("imagenet21k-p", True),
        "short": ("imagenet21k-p-256", True),
    }
    # The squeeze changes the top-1 class of more than a quarter of the images: a deviation;
    # the short edge keeps more: a caveat. Each figure rests on 17 scenes, its spread quoted.
    assert COPY_EFFECTS["224"]["top1"] < DEVIATION_TOP1 <= COPY_EFFECTS["256"]["top1"]
    for name, bad in (("parquet", True), ("wds", True), ("short", False)):
        copy = records[name]
        found = comparability(
            paper_like(data_split={"seed": 0, "cap": 1300, "copy": copy}), by_model=True
        )["mine"]
        where = found["deviations"] if bad else found["caveats"]
        (text,) = [t for t in where if "copy" in t]
        effect = COPY_EFFECTS["224" if bad else "256"]
        low, high = effect["top1_scenes"]
        assert f"keeps {effect['top1']}% of the top-1 classes ({low}% to {high}% over 17" in text
        assert ("changes too many of the network's predictions" in text) == bad


def test_the_data_command_calls_a_squeezed_copy_not_comparable(l1, tmp_path, capsys):
    _, _, images = l1
    hf_parquet(tmp_path / "parquet", _squeezed(images))
    cli.main(["data", str(tmp_path / "parquet"), "--missing", str(tmp_path / "m.tsv")])
    out = capsys.readouterr().out
    assert "1: parquet (parquet)" in out and f"copy 1 = {tmp_path / 'parquet'}: published" in out
    assert "images whose size was read are 224 x 224" in out


def test_the_effects_quoted_are_the_measured_ones_with_their_spread():
    from imagenet_cog._data.copies import COPY_EFFECTS

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    measured = json.loads((bench / "copy_processing_cpu.json").read_text())
    assert measured["scenes"] == 17
    # At ImageNet's sizes, not on larger photos, which hide what a processing changes.
    assert measured["sizes"] == "ImageNet's: longer side 500 px, shorter side 333-500 px"
    shown = [k for k in COPY_EFFECTS if k.startswith(("squeeze-", "short-"))]
    assert {"squeeze-224", "squeeze-256", "short-224", "short-256"} <= set(shown)
    for effect in COPY_EFFECTS.values():
        row = measured["processing"][effect["row"]]
        assert effect["side"] == row["side"]
        assert effect["top1"] == round(100 * row["top1_agreement"], 1)
        assert effect["top1_scenes"] == [
            round(100 * row["top1_bootstrap_p5_p95"][0], 1),
            round(100 * row["top1_bootstrap_p5_p95"][1], 1),
        ]
        assert effect["scenes"] == 17


# ------------------------------------------------------------ what a copy shows
def _plain_shards(root, images, name="converted"):
    """A plain conversion: ``<key>.jpg`` and ``<key>.cls`` per sample, no ``.json`` record,
    written by webdataset's ``TarWriter``; the labels in the sorted wnid order."""
    wds = pytest.importorskip("webdataset")
    root.mkdir(parents=True, exist_ok=True)
    classes = sorted({i.split("/", 1)[0] for i in images})
    with wds.TarWriter(str(root / f"{name}-train-0000.tar")) as sink:
        for image_id, data in sorted(images.items()):
            wnid, file_name = image_id.split("/", 1)
            sink.write(
                {"__key__": file_name.rsplit(".", 1)[0], "jpg": data, "cls": classes.index(wnid)}
            )
    return root


def _judged(copy):
    """``(deviations, caveats)`` of a run on images of ``copy`` (a split's copy record)."""
    from test_comparability import paper_like

    from imagenet_cog import comparability

    found = comparability(
        paper_like(data_split={"seed": 0, "cap": 1300, "copy": copy}), by_model=True
    )["mine"]
    return [t for t in found["deviations"] if "copy" in t], [
        t for t in found["caveats"] if "copy" in t
    ]


def test_squeezed_jpegs_in_shards_without_records_are_read_by_their_headers(l1, tmp_path):
    _, wnids, images = l1
    _plain_shards(tmp_path / "wds", _squeezed(images))
    copy = make_split(tmp_path / "wds", "L1", "test", wnids=wnids).info["copy"]
    assert (copy["published"], copy["processed"]) == ("imagenet21k-p", True)
    n = len(images)
    assert copy["seen"] == f"{min(n, 32)} of {min(n, 32)} images whose size was read are 224 x 224"
    deviations, caveats = _judged(copy)
    assert len(deviations) == 1 and not caveats
    assert "squeezing each image to 224 x 224 px" in deviations[0]


def test_a_copy_is_judged_by_the_processing_its_images_show(l1, tmp_path):
    from imagenet_cog._data.copies import COPY_EFFECTS, effect_deviates

    _, wnids, images = l1
    # Squeezed to 256 x 256: a squeeze (no published copy), not the short-edge copy.
    for image_id, data in _squeezed(images, 256).items():
        (tmp_path / "sq256" / image_id).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sq256" / image_id).write_bytes(data)
    write_shards(tmp_path / "wds256", _squeezed(images, 256), name="my-copy")
    # Resized to a shorter side of 224.
    for image_id, data in _squeezed(images, 224, short=True).items():
        (tmp_path / "short224" / image_id).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "short224" / image_id).write_bytes(data)
    shown = {}
    for name in ("sq256", "wds256", "short224"):
        copy = make_split(tmp_path / name, "L1", "test", wnids=wnids).info["copy"]
        assert copy is not None and copy["processed"] and copy["published"] is None, name
        shown[name] = copy
    assert shown["sq256"]["shown"] == shown["wds256"]["shown"] == {"kind": "squeeze", "side": 256}
    assert shown["short224"]["shown"] == {"kind": "short", "side": 224}
    assert "squeezed to 256 x 256 px" in shown["sq256"]["processing"]
    for name, key in (
        ("sq256", "squeeze-256"),
        ("wds256", "squeeze-256"),
        ("short224", "short-224"),
    ):
        effect = COPY_EFFECTS[key]
        deviations, caveats = _judged(shown[name])
        (text,) = deviations if effect_deviates(effect) else caveats
        low, high = effect["top1_scenes"]
        assert f"keeps {effect['top1']}% of the top-1 classes ({low}% to {high}% over" in text
    # The squeeze of 256 px keeps too few: a deviation, as ImageNet-21K-P's.
    assert effect_deviates(COPY_EFFECTS["squeeze-256"])


def test_a_processing_whose_spread_crosses_the_line_is_a_deviation():
    from imagenet_cog._data.copies import DEVIATION_TOP1, effect_deviates

    assert DEVIATION_TOP1 == 75.0
    assert effect_deviates({"top1": 79.4, "top1_scenes": [69.4, 88.8]})  # mean above, spread not
    assert not effect_deviates({"top1": 84.0, "top1_scenes": [78.2, 89.0]})
    assert effect_deviates({"top1": 60.0, "top1_scenes": [50.1, 70.0]})
    assert effect_deviates({"top1": 74.0}) and not effect_deviates(None)


# ------------------------------------------------------------------ a stale listing
def _swap_two_samples(shard):
    """Rewrite ``shard`` with its first two samples swapped, as a regenerated copy would be,
    and restore its size and modification time (``tar -x``, ``cp -p``, ``rsync -t``)."""
    st = shard.stat()
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar if m.isreg()]
    keys = list(dict.fromkeys(m.name.split(".", 1)[0] for m, _ in members))
    order = [keys[1], keys[0], *keys[2:]]
    by_key = {k: [(m, d) for m, d in members if m.name.split(".", 1)[0] == k] for k in keys}
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in order:
            for member, data in by_key[key]:
                tar.addfile(member, io.BytesIO(data))
    assert shard.stat().st_size == st.st_size
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_shard_rewritten_with_its_time_kept_stops_the_extraction(l1, tmp_path, capsys):
    folders, wnids, images = l1
    shards = write_shards(tmp_path / "wds", images, n_shards=2)
    assert cli.main(["data", str(tmp_path / "wds"), "--missing", str(tmp_path / "m.tsv")]) == 1
    capsys.readouterr()  # the listing is cached
    _swap_two_samples(shards[0])
    time.sleep(0.01)
    args = ["extract", "torchvision:resnet18:none", "--data", tmp_path / "wds", "--domain", "L1"]
    args += ["--wnids", ",".join(wnids), "--out", tmp_path / "features", "--split", "test"]
    line = _one_line(capsys, *args, *TINY)
    assert line.startswith(f"imagenet-cog: error: {shards[0]} changed since it was listed: byte ")
    assert line.endswith(
        "(the file was rewritten and its size and modification time kept); its cached listing "
        "is removed: run the same command again to list it anew"
    )
    # Run again: listed anew, every image under its own label, as the folders give them.
    assert cli.main([str(a) for a in args] + TINY) == 0
    ref = ["extract", "torchvision:resnet18:none", "--data", str(folders), "--domain", "L1"]
    ref += ["--wnids", ",".join(wnids), "--split", "test", "--out", str(tmp_path / "ref")]
    assert cli.main(ref + TINY) == 0
    capsys.readouterr()
    for name in ("rows.tsv", "shard-00000.npy"):
        got = (tmp_path / "features" / "L1" / "test" / name).read_bytes()
        assert got == (tmp_path / "ref" / "L1" / "test" / name).read_bytes(), name


def test_a_parquet_file_rewritten_with_its_time_kept_is_caught(l1, tmp_path):
    import pyarrow.parquet as pq

    from imagenet_cog._data import sources
    from imagenet_cog._data.listing import list_copy

    _, _, images = l1
    path = hf_parquet(tmp_path / "parquet", images)
    listing, _ = list_copy(tmp_path / "parquet")
    st = path.stat()
    table = pq.read_table(path)
    order = [1, 0, *range(2, table.num_rows)]
    pq.write_table(table.take(order), path)  # two rows swapped
    os.truncate(path, min(st.st_size, path.stat().st_size))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    first = [s for per in listing.values() for s in per.values() if s.row in (0, 1)]
    sources._ROW_GROUPS.clear()  # as a new process: nothing read before
    with pytest.raises(sources.StaleListingError, match=r"changed since it was listed: row [01] "):
        [sources.read_bytes(source) for source in first]


def _swap_in_place(shard, a, b):
    """Swap the data of the members ``a`` and ``b`` (of one size) of ``shard`` in place, its
    size and modification time kept: no header changes."""
    st = shard.stat()
    with tarfile.open(shard) as tar:
        ma, mb = tar.getmember(a), tar.getmember(b)
    assert ma.size == mb.size
    with open(shard, "r+b") as f:
        da, db = (
            os.pread(f.fileno(), ma.size, ma.offset_data),
            os.pread(f.fileno(), mb.size, mb.offset_data),
        )
        assert da != db
        os.pwrite(f.fileno(), db, ma.offset_data)
        os.pwrite(f.fileno(), da, mb.offset_data)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("member", ["cls", "json"])
def test_labels_swapped_in_place_are_caught_when_the_images_are_read(l1, tmp_path, member):
    # Before: the image members were checked against the cached listing, not the .cls (or
    # .json) members their labels come from: two labels swapped in place put each image
    # under the other's label, and every store check passed.
    from imagenet_cog._data.sources import StaleListingError
    from imagenet_cog.datasets import ImageDataset
    from imagenet_cog.taxonomy import imagenet1k_wnids

    _, _, images = l1
    pictures = [images[i] for i in sorted(images)[:4]]
    classes = list(imagenet1k_wnids())
    wnids = classes[3:5]
    # An ImageNet-1K-named copy whose keys carry no wnid: each label from the sample's .cls
    # in the sorted wnid order (or from its .json when it has no .cls).
    samples = []
    for k, data in enumerate(pictures):
        record = json.dumps({"label": 3 + k % 2}).encode()
        one = {"jpg": data, "json": record}
        if member == "cls":
            one["cls"] = str(3 + k % 2).encode()
        samples.append((f"img_{k}", one))
    shard = _shard(tmp_path / "wds", samples, name="imagenet1k-train-0000.tar")
    split = make_split(tmp_path / "wds", "in1k", "train", wnids=wnids, n_test=0)
    truth = dict(zip(split.ids, split.labels))
    assert truth == {f"{wnids[k % 2]}/img_{k}.JPEG": wnids[k % 2] for k in range(4)}
    _swap_in_place(shard, f"img_0.{member}", f"img_1.{member}")
    stale = make_split(tmp_path / "wds", "in1k", "train", wnids=wnids, n_test=0)
    assert stale.ids == split.ids  # the cached listing: the swap is not seen by listing
    dataset = ImageDataset(stale.sources, stale.ids)
    with pytest.raises(StaleListingError, match=rf"{shard} changed since it was listed: byte "):
        [dataset.read_bytes(i) for i in range(len(dataset))]
    # Listed anew: each image under the label its sample now holds, nothing read stale.
    again = make_split(tmp_path / "wds", "in1k", "train", wnids=wnids, n_test=0)
    dataset = ImageDataset(again.sources, again.ids)
    got = {i: dataset.read_bytes(k) for k, i in enumerate(again.ids)}
    assert got == {
        f"{wnids[(k + (k < 2)) % 2]}/img_{k}.JPEG": data for k, data in enumerate(pictures)
    }


def _png_declaring(width, height):
    """A PNG whose header declares ``width`` x ``height`` pixels (its data holds one row)."""
    import struct
    import zlib

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 7))
        + chunk(b"IEND", b"")
    )


def test_an_image_declaring_30000_by_30000_pixels_is_skipped_and_listed_in_a_parquet_copy(
    l1, tmp_path, capsys
):
    # Before: Pillow's DecompressionBombError escaped the Parquet listing (which reads the
    # sizes of the first row group's images), ending `data` and `extract` in a traceback.
    from imagenet_cog._data.listing import list_copy
    from imagenet_cog.datasets import ImageDataset

    _, _, images = l1
    some = dict(sorted(images.items())[:6])
    bomb = min(some)
    some[bomb] = _png_declaring(30_000, 30_000)
    hf_parquet(tmp_path / "parquet", some)
    assert cli.main(["data", str(tmp_path / "parquet")]) in (0, 1)  # a report, no traceback
    capsys.readouterr()
    listing, copy = list_copy(tmp_path / "parquet")
    assert copy["samples"] == 6
    sources = [listing[i.split("/")[0]][i] for i in sorted(some)]
    dataset = ImageDataset(sources, sorted(some))
    _, image, reason = dataset[0]  # skipped and listed, as the shard copies do
    assert image is None and "decompression bomb" in reason.lower()
    assert all(dataset[k][1] is not None for k in range(1, 6))


# ------------------------------------------------------------------ wrong metadata, one line
def _shard(root, samples, name="imagenet22k-train-0000.tar"):
    """A shard of ``[(key, {ext: bytes})]``."""
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / name, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples:
            for ext, data in sorted(members.items()):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return root / name


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        (b"[1, 2]", "has a .json that holds a list, not an object"),
        (b'{"label": "3"}', "has the label '3', a str, not an integer class index"),
        (b'{"label": 0, "filename": 7}', "has the file name 7, a int, not a string"),
        (b"[" * 30_000 + b"]" * 30_000, "has an unreadable .cls or .json"),
    ],
)
def test_shard_metadata_of_the_wrong_type_is_one_line(l1, tmp_path, capsys, meta, says):
    _, _, images = l1
    image = images[min(images)]
    shard = _shard(tmp_path / "wds", [("sample0", {"jpg": image, "json": meta})])
    line = _one_line(capsys, "data", tmp_path / "wds")
    assert line.startswith(f"imagenet-cog: error: {shard}: sample 'sample0' ")
    assert line.endswith(says) or says in line


def test_a_damaged_pax_header_names_its_shard(tmp_path, capsys):
    record = b"9" * 5000 + b" path=x.jpg\n"  # a length Python will not read as an integer
    header = tarfile.TarInfo("PaxHeaders/x")
    header.type = tarfile.XHDTYPE
    header.size = len(record)
    (tmp_path / "wds").mkdir()
    shard = tmp_path / "wds" / "imagenet22k-train-0000.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(header, io.BytesIO(record))
        info = tarfile.TarInfo("x.jpg")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    line = _one_line(capsys, "data", tmp_path / "wds")
    assert line == (
        f"imagenet-cog: error: {shard}: damaged pax header at byte 0; download it again"
    )


def _parquet_table(images, label_type="int64", names=None):
    import pyarrow as pa

    ids = sorted(images)
    wnids = sorted({i.split("/", 1)[0] for i in ids})
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [{"bytes": images[i], "path": i.split("/", 1)[1]} for i in ids]
    labels = [wnids.index(i.split("/", 1)[0]) for i in ids]
    if label_type == "string":
        labels = [str(x) for x in labels]
    features = {
        "image": {"_type": "Image"},
        "label": {"names": names or wnids, "_type": "ClassLabel"},
    }
    table = pa.table({"image": pa.array(rows, image), "label": pa.array(labels, label_type)})
    return table.replace_schema_metadata(
        {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    )


def _write(table, root):
    import pyarrow.parquet as pq

    path = root / "data" / "train-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def test_parquet_files_of_the_wrong_shape_are_one_line_naming_the_file(l1, tmp_path, capsys):
    import pyarrow as pa

    _, _, images = l1
    some = dict(sorted(images.items())[:6])
    cases = {}
    path = _write(_parquet_table(some, "string"), tmp_path / "strings")
    cases[path] = "its label column 'label' holds string, not integer class indices"
    path = _write(_parquet_table(some, names=[1, 2]), tmp_path / "names")
    cases[path] = "the class names of its 'label' column are not a list of strings"
    table = _parquet_table(some)
    garbled = table.replace_schema_metadata({b"huggingface": b'{"info": {"feat'})
    path = _write(garbled, tmp_path / "garbled")
    cases[path] = "its 'huggingface' metadata is not the datasets library's JSON"
    other = pa.table({"image": pa.array([b"x"]), "label": pa.array([0])})
    path = _write(other, tmp_path / "schema")
    cases[path] = "its image column 'image' is binary, not the datasets library's struct<"
    path = _write(table, tmp_path / "cut")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    cases[path] = "not a readable Parquet file ("
    path = _write(table, tmp_path / "empty")
    path.write_bytes(b"")
    cases[path] = "not a readable Parquet file ("
    for path, says in cases.items():
        line = _one_line(capsys, "data", path.parents[1])
        assert line.startswith(f"imagenet-cog: error: {path}: "), line
        assert says in line, line


def test_a_1000_class_copy_in_another_order_without_wnids_is_refused(tmp_path, capsys):
    from imagenet_cog.taxonomy import imagenet1k_wnids, load_taxonomy

    tax = load_taxonomy()
    wnids = list(imagenet1k_wnids())
    names = [", ".join(x.replace("_", " ") for x in tax.lemma_names(w)) for w in wnids]
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.new("RGB", (20, 20)).save(buf, "JPEG")
    images = {f"{wnids[k]}/img_{k}.jpg": buf.getvalue() for k in range(3)}
    table = _parquet_table(images, names=names)
    # The labels index the sorted 1,000 wnids; the names are readable. In the wnid order the
    # copy is read (labels mapped to wnids); shuffled, it is refused.
    path = _write(table, tmp_path / "in-order")
    listing = make_split(tmp_path / "in-order", "in1k", "train", wnids=wnids[:3])
    assert listing.labels == wnids[:3]
    shuffled = [names[k] for k in rng.permutation(1000)]
    path = _write(_parquet_table(images, names=shuffled), tmp_path / "shuffled")
    line = _one_line(capsys, "data", tmp_path / "shuffled")
    assert line == (
        f"imagenet-cog: error: {path}: no image can be given a wnid: its file names "
        "('img_0.jpg'...) name no wnid and its 1,000 class names are not ImageNet-1K's in the "
        "sorted wnid order; write the copy with the wnids as class names "
        "(ClassLabel(names=[...])) or with the original file names"
    )
