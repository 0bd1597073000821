"""The one listing of the data wing: every layout of one copy listed alike, for every caller.

One copy of two official L1 concepts is written in the four layouts a researcher may hold:
a folder per wnid, a tar per wnid, webdataset shards (written as the ``webdataset`` library
writes them) and Parquet files (as the ``datasets`` library writes them, with pyarrow). The
one listing function gives the same images for all four; the splits, the coverage check and
the choice of one pass over a copy, which all list through it, agree.
"""

import pytest
from copyfiles import folder_images, write_parquet, write_webdataset
from imagefiles import official_concepts, write_concepts, write_in1k

from imagenet_cog._coverage import check_coverage
from imagenet_cog._data.listing import list_root, read_in_one_pass
from imagenet_cog._data.sources import read_bytes
from imagenet_cog.datasets import make_split

pytest.importorskip("pyarrow")

#: Each layout, and how a split records it.
LAYOUTS = {
    "folder": "folder per wnid",
    "tar": "tar per wnid",
    "webdataset": "webdataset shards",
    "parquet": "parquet",
}


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGENET_COG_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def one_copy(tmp_path_factory):
    """``(root, wnids, {image id: bytes})``: the same images in the four layouts."""
    root = tmp_path_factory.mktemp("layouts")
    concepts = official_concepts(n_concepts=2, n_train=9, bad=False)
    write_concepts(root / "folder", concepts, "folders")
    write_concepts(root / "tar", concepts, "tars")
    images = folder_images(root / "folder")
    write_webdataset(root / "webdataset", images, n_shards=3)
    write_parquet(root / "parquet", images, n_files=2)
    return root, sorted(concepts), images


def test_one_listing_gives_the_same_listing_for_every_layout_of_a_copy(one_copy):
    root, wnids, images = one_copy
    expect = {w: sorted(i for i in images if i.startswith(f"{w}/")) for w in wnids}
    for layout, recorded in LAYOUTS.items():
        found = list_root(root / layout, wnids)
        assert found.layout == recorded
        assert {w: list(per) for w, per in found.images.items()} == expect, layout
        for per in found.images.values():  # each source reads its own image's bytes
            assert all(read_bytes(source) == images[i] for i, source in per.items()), layout
        assert (found.copy is None) == (layout in ("folder", "tar"))


def test_the_splits_the_coverage_and_the_one_pass_list_every_layout_alike(one_copy):
    root, wnids, _ = one_copy
    splits = {
        layout: [make_split(root / layout, "L1", s, wnids=wnids) for s in ("train", "test")]
        for layout in LAYOUTS
    }
    for layout, (train, test) in splits.items():
        assert train.ids == splits["folder"][0].ids and test.ids == splits["folder"][1].ids
        assert train.checksum == splits["folder"][0].checksum
        assert train.info["layout"] == LAYOUTS[layout]
        # A shard or Parquet copy is read in one pass for several stores; folders and tars not.
        assert read_in_one_pass(train.info) == (layout in ("webdataset", "parquet"))
    counts = {}
    for layout in LAYOUTS:
        (l1,) = [r for r in check_coverage([root / layout]) if r["domain"] == "L1"]
        counts[layout] = (l1["concepts"], l1["train_images"], l1["test_images"])
    assert len(set(counts.values())) == 1, counts
    assert counts["folder"] == (2, 18, 100)


@pytest.mark.parametrize("val_layout", ["flat", "folders"])
def test_the_coverage_counts_the_validation_images_a_split_holds(tmp_path, val_layout):
    wnids, _ = write_in1k(tmp_path, n_classes=3, n_train=4, n_val=2, val_layout=val_layout)
    val = tmp_path / "val"
    (val / "README.txt").write_text("not an image")  # neither counted nor refused
    (row,) = check_coverage([tmp_path])
    test = make_split(tmp_path, "in1k", "test", wnids=wnids)
    assert row["test_images"] == len(test) == 6
    assert row["train_images"] == len(make_split(tmp_path, "in1k", "train", wnids=wnids)) == 12
