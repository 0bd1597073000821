import io
import pickle

import numpy as np
import pytest
import torch
from imagefiles import (
    image_bytes,
    official_concepts,
    plain_concepts,
    write_concepts,
    write_in1k,
)
from PIL import Image

from imagenet_cog import Levels, load_levels
from imagenet_cog._data.folders import list_images
from imagenet_cog._data.labels import read_val_labels
from imagenet_cog._data.sources import TarMember
from imagenet_cog.datasets import (
    ImageDataset,
    Split,
    collate_images,
    decode_image,
    make_split,
)

OFFICIAL = load_levels("official")
A, B = OFFICIAL["L1"][:2]


@pytest.fixture(scope="module")
def in21k(tmp_path_factory):
    """The same mini ImageNet-21K as wnid folders and as wnid tars."""
    base = tmp_path_factory.mktemp("in21k")
    concepts = official_concepts()
    kinds = write_concepts(base / "folders", concepts, "folders")
    write_concepts(base / "tars", concepts, "tars")
    return base / "folders", base / "tars", kinds


# ------------------------------------------------------------------ listing
def test_folders_and_tars_list_the_same_images(in21k):
    folders, tars, kinds = in21k
    a = list_images(folders, [A, B])
    b = list_images(tars, [A, B])
    assert list(a[A]) == list(b[A]) == sorted(i for i in kinds if i.startswith(A))
    assert all(isinstance(s, str) for s in a[A].values())
    assert all(isinstance(s, TarMember) for s in b[A].values())
    # Tar members are read at their recorded offsets, never extracted.
    image_id = next(iter(b[B]))
    member = b[B][image_id]
    with open(member.tar, "rb") as f:
        f.seek(member.offset)
        assert f.read(member.size) == (folders / image_id).read_bytes()
    assert not any(p.is_dir() for p in tars.iterdir())


def test_missing_and_empty_concepts_are_named(tmp_path):
    write_concepts(tmp_path, plain_concepts(["n00000001"], 2))
    with pytest.raises(FileNotFoundError, match="n00000002"):
        list_images(tmp_path, ["n00000001", "n00000002"])
    (tmp_path / "n00000003").mkdir()
    with pytest.raises(ValueError, match=r"n00000003: no images .*empty concept"):
        list_images(tmp_path, ["n00000003"])
    with pytest.raises(FileNotFoundError, match="no data folder"):
        list_images(tmp_path / "nope", ["n00000001"])


# ------------------------------------------------------------------- splits
def test_official_test_lists_and_train_rest(in21k):
    folders, tars, kinds = in21k
    test = make_split(folders, "L1", "test", wnids=[B, A])
    assert test.ids == sorted(OFFICIAL.test_images[A]) + sorted(OFFICIAL.test_images[B])
    assert test.labels == [A] * 50 + [B] * 50
    assert test.info["official_test_lists"] == 2
    train = make_split(folders, "L1", "train", wnids=[A, B])
    assert len(train) == 18
    assert not set(train.ids) & set(test.ids)
    assert set(train.ids) | set(test.ids) == set(kinds)
    # The same images whatever the layout: same checksum.
    from_tars = make_split(tars, "L1", "train", wnids=[A, B])
    assert from_tars.checksum == train.checksum
    assert (train.info["layout"], from_tars.info["layout"]) == ("folder per wnid", "tar per wnid")
    assert make_split(tars, "L1", "test", wnids=[A, B]).checksum == test.checksum


def test_train_cap_is_a_seeded_pure_choice(in21k):
    folders, tars, _ = in21k
    a = make_split(folders, "L1", "train", wnids=[A, B], cap=3)
    assert len(a) == 6 and a.ids == sorted(a.ids)
    assert make_split(tars, "L1", "train", wnids=[A, B], cap=3).ids == a.ids
    other = [make_split(folders, "L1", "train", wnids=[A, B], cap=3, seed=s).ids for s in (1, 2)]
    assert any(ids != a.ids for ids in other)
    assert make_split(folders, "L1", "train", wnids=[A, B], cap=3, seed=0).checksum == a.checksum
    assert a.info["seed"] == 0 and a.info["cap"] == 3


def test_seeded_test_images_for_custom_levels(tmp_path):
    wnids = ["n00000001", "n00000002"]
    write_concepts(tmp_path, plain_concepts(wnids, 5))
    levels = Levels([wnids])
    test = make_split(tmp_path, "L1", "test", levels, n_test=2)
    train = make_split(tmp_path, "L1", "train", levels, n_test=2)
    assert len(test) == 4 and len(train) == 6
    assert not set(test.ids) & set(train.ids)
    assert make_split(tmp_path, "L1", "test", levels, n_test=2, seed=0).ids == test.ids
    with pytest.raises(ValueError, match=r"n00000001: 5 images, fewer than the split needs"):
        make_split(tmp_path, "L1", "test", levels, n_test=5)
    with pytest.raises(ValueError, match="unknown domain 'L2'"):
        make_split(tmp_path, "L2", "test", levels)
    with pytest.raises(ValueError, match="not concepts of L1"):
        make_split(tmp_path, "L1", "test", levels, wnids=["n00000009"])
    with pytest.raises(ValueError, match="split must be"):
        make_split(tmp_path, "L1", "val", levels)


def test_missing_official_test_image_names_the_wnid(tmp_path):
    concepts = official_concepts(n_concepts=1, bad=False)
    files = concepts[A]
    concepts[A] = files[1:]  # drop one official test image
    write_concepts(tmp_path, concepts)
    with pytest.raises(ValueError, match=rf"{A}: 1 of its 50 listed test images are missing"):
        make_split(tmp_path, "L1", "test", wnids=[A])
    with pytest.raises(FileNotFoundError, match=B):
        make_split(tmp_path, "L1", "test", wnids=[A, B])


def test_in1k_flat_val_and_folder_val_agree(tmp_path):
    wnids, val = write_in1k(tmp_path / "flat", val_layout="flat")
    write_in1k(tmp_path / "folders", val_layout="folders")
    flat = make_split(tmp_path / "flat", "in1k", "test", wnids=wnids)
    folders = make_split(tmp_path / "folders", "in1k", "test", wnids=wnids)
    assert flat.ids == folders.ids == [f"{w}/{n}" for w in wnids for n in val[w]]
    assert flat.checksum == folders.checksum
    assert flat.info["layout"] == "val/ flat with labels"
    train = make_split(tmp_path / "flat", "in1k", "train", wnids=wnids)
    assert len(train) == 12 and train.wnids == wnids
    # A file that the label file does not know is an error that names it.
    (tmp_path / "flat" / "val" / "stray.JPEG").write_bytes(image_bytes("jpeg", 1))
    with pytest.raises(ValueError, match=r"stray\.JPEG: no label"):
        make_split(tmp_path / "flat", "in1k", "test", wnids=wnids)
    # The whole IN-1K needs all 1000 class folders.
    with pytest.raises(FileNotFoundError, match="997 concept"):
        make_split(tmp_path / "folders", "in1k", "train")


def test_custom_val_label_file(tmp_path):
    wnids, val = write_in1k(tmp_path, n_classes=2, val_layout="flat")
    labels = tmp_path / "labels.csv"
    rows = [f"{n},{w}" for w in wnids for n in val[w]]
    labels.write_text("file,wnid\n" + "\n".join(rows) + "\n# end\n")
    assert read_val_labels(labels) == {n: w for w in wnids for n in val[w]}
    split = make_split(tmp_path, "in1k", "test", wnids=wnids, val_labels=labels)
    assert len(split) == 4
    bad = tmp_path / "bad.txt"
    bad.write_text("a.JPEG n00000001\nb.JPEG\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: expected 'file wnid'"):
        read_val_labels(bad)
    assert len(read_val_labels()) == 50_000


def test_split_manifest_round_trip(tmp_path, in21k):
    split = make_split(in21k[0], "L1", "test", wnids=[A])
    path = split.save(tmp_path / "split.tsv")
    back = Split.read(path, checksum=split.checksum)
    assert (back.ids, back.labels, back.checksum) == (split.ids, split.labels, split.checksum)
    assert path.read_text().splitlines()[0] == "image_id\twnid"
    path.write_text(path.read_text().replace(".JPEG", ".jpeg", 1))
    with pytest.raises(ValueError, match="sha256"):
        Split.read(path, checksum=split.checksum)
    with pytest.raises(ValueError, match="does not start with its wnid"):
        Split(["n1/a.JPEG"], ["n2"])
    with pytest.raises(ValueError, match="no image sources"):
        back.dataset()


# ----------------------------------------------------------- reading images
@pytest.mark.parametrize("kind", ["jpeg", "png", "cmyk", "gray", "palette"])
def test_decodable_kinds_become_rgb(kind):
    image = decode_image(image_bytes(kind, 3))
    assert image.mode == "RGB" and min(image.size) >= 8


def test_cmyk_and_gray_decode_to_the_expected_pixels():
    cmyk = Image.new("CMYK", (4, 4), (0, 255, 255, 0))  # pure red in CMYK
    buf = io.BytesIO()
    cmyk.save(buf, "TIFF")
    r, g, b = decode_image(buf.getvalue()).getpixel((1, 1))
    assert r > 200 and g < 50 and b < 50
    buf = io.BytesIO()
    Image.new("L", (3, 3), 77).save(buf, "PNG")
    assert decode_image(buf.getvalue()).getpixel((0, 0)) == (77, 77, 77)


@pytest.mark.parametrize("kind", ["truncated", "random", "empty"])
def test_undecodable_files_are_reported_not_raised(tmp_path, kind):
    path = tmp_path / "bad.JPEG"
    path.write_bytes(image_bytes(kind, 4))
    ds = ImageDataset([str(path), str(tmp_path / "missing.JPEG")])
    index, image, reason = ds[0]
    assert (index, image) == (0, None)
    assert reason and " at 0x" not in reason and str(tmp_path) not in reason
    _, _, missing = ds[1]
    assert missing == "FileNotFoundError: No such file or directory"
    idx, batch, failed = collate_images([ds[0], ds[1]])
    assert idx.tolist() == [] and batch is None and [f[0] for f in failed] == [0, 1]


def test_tar_dataset_reads_in_dataloader_workers(in21k):
    folders, tars, kinds = in21k
    split = make_split(tars, "L1", "train", wnids=[A, B])
    ds = split.dataset(transform=lambda im: torch.tensor(np.asarray(im).sum(), dtype=torch.int64))
    _ = ds[0]  # the parent opens a tar file before the workers fork
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_images)
    got, bad = {}, {}
    for idx, batch, failed in loader:
        got.update(zip(idx.tolist(), batch.tolist()))
        bad.update(failed)
    expected_bad = {
        i for i, x in enumerate(split.ids) if kinds[x] in ("truncated", "random", "empty")
    }
    assert set(bad) == expected_bad
    for i, value in got.items():
        image = decode_image((folders / split.ids[i]).read_bytes())
        assert value == int(np.asarray(image).sum())
    # An open dataset pickles (for spawned workers) without its file handles.
    clone = pickle.loads(pickle.dumps(ds.with_transform(None)))
    assert clone[1][1].size == decode_image((folders / split.ids[1]).read_bytes()).size


def test_pil_sources_and_foreign_ids():
    ds = ImageDataset([Image.new("LA", (6, 5)), Image.new("RGB", (2, 2))], labels=["x", "y"])
    assert ds.ids == ["<image 0>", "<image 1>"]
    assert ds[0][1].mode == "RGB"
    with pytest.raises(ValueError, match="2 sources but 1 ids"):
        ImageDataset(["a", "b"], ids=["a"])


# ------------------------------------------------------------ deep images
def _encoded(array, fmt):
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt)
    return buf.getvalue()


def test_16_bit_and_float_images_are_scaled_not_clipped():
    gray16 = np.array([[0, 257 * 100, 32896, 65535]], dtype=np.uint16)
    image = decode_image(_encoded(gray16, "PNG"))
    assert np.asarray(image)[0, :, 0].tolist() == [0, 100, 128, 255]
    assert np.asarray(image)[0].tolist() == [[v] * 3 for v in (0, 100, 128, 255)]
    floats = np.array([[0.0, 0.25, 0.5, 1.0]], dtype=np.float32)
    assert np.asarray(decode_image(_encoded(floats, "TIFF")))[0, :, 1].tolist() == [0, 64, 128, 255]
    # Outside [0, 1] (or [0, 65535] for 32-bit integers): the image's own range.
    wide = np.array([[-2.0, 0.0, 2.0]], dtype=np.float32)
    assert np.asarray(decode_image(_encoded(wide, "TIFF")))[0, :, 0].tolist() == [0, 128, 255]
    int32 = np.array([[0, 257 * 7, 65535]], dtype=np.int32)
    assert np.asarray(decode_image(_encoded(int32, "TIFF")))[0, :, 2].tolist() == [0, 7, 255]
    big = np.array([[-100, 50, 200]], dtype=np.int32)
    assert np.asarray(decode_image(_encoded(big, "TIFF")))[0, :, 0].tolist() == [0, 128, 255]
    nan = np.array([[0.0, np.nan]], dtype=np.float32)
    with pytest.raises(ValueError, match="non-finite"):
        decode_image(_encoded(nan, "TIFF"))
