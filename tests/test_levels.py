import io
import json
import tarfile
import warnings

import numpy as np
import pytest

from imagenet_cog import Levels, build_levels, count_images, load_levels
from imagenet_cog._optional_dependencies import HAS_PANDAS
from imagenet_cog.levels import level_starts, official_test_images, read_counts
from imagenet_cog.taxonomy import Taxonomy


def _quiet_build(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_levels(**kwargs)


# --------------------------------------------------------- the real numbers
def test_filter_counts_match_the_spec_without_image_counts():
    with pytest.warns(UserWarning, match="min-images filter .* is skipped") as caught:
        levels = build_levels()
    # The warning says these are not the official levels, with the overlap counted below.
    assert "not the official ImageNet-CoG levels" in str(caught[0].message)
    assert "1,913 of their 5,000" in str(caught[0].message)
    remaining = {s["step"]: s["remaining"] for s in levels.provenance["filters"]}
    assert remaining["candidates"] == 21841
    assert remaining["exclude"] == 17254  # after steps 1 and 3 (the paper, supplement A.1)
    assert remaining["leaves"] == 14248
    assert remaining["blocklist"] == 14178
    assert levels.provenance["n_eligible"] == 14178
    assert [len(x) for x in levels.levels] == [1000] * 5
    # L1 is the most similar, and scores never rise from one level to the next.
    bounds = [
        (min(levels.scores[w] for w in x), max(levels.scores[w] for w in x)) for x in levels.levels
    ]
    assert all(bounds[k][0] >= bounds[k + 1][1] for k in range(4))
    official = {w for x in load_levels("official").levels for w in x}
    # All 5000 official concepts pass every filter (the paper, supplement A.1).
    scored = set(levels.scores)
    assert official <= scored
    # Without image counts, only 1,913 of the 5,000 concepts built are official ones.
    assert sum(w in official for x in levels.levels for w in x) == 1913


def test_cog_candidates_reproduce_the_official_levels():
    levels = _quiet_build(candidates="cog")
    official = load_levels("official")
    agree = sum(len(set(a) & set(b)) for a, b in zip(levels.levels, official.levels))
    assert agree / 5000 >= 0.995  # 4,992 measured (99.84%)


def test_official_levels_and_test_images():
    official = load_levels("official")
    assert official.names == ["L1", "L2", "L3", "L4", "L5"]
    flat = [w for x in official.levels for w in x]
    assert len(set(flat)) == 5000
    assert all(x == sorted(x) for x in official.levels)  # label = index among sorted wnids
    images = official.test_images
    assert set(images) == set(flat)
    assert {len(v) for v in images.values()} == {50}
    assert images["n01322508"][0] == "n01322508/n01322508_2514.JPEG"
    assert official_test_images() is official_test_images()
    assert official.scores["n01322508"] > official.scores[official["L5"][0]]


# ------------------------------------------------- filters on tiny taxonomies
def _taxonomy(edges):
    """A taxonomy from {wnid: [parents]}; wnids are 'n' + 8 digits."""
    wnids = sorted(edges)
    return Taxonomy(
        wnids=wnids,
        names=[f"c{w[-3:]}.n.01" for w in wnids],
        lemmas=[[w] for w in wnids],
        glosses=[""] * len(wnids),
        hypernyms=[edges[w] for w in wnids],
        instance_hypernyms=[[] for _ in wnids],
        source="test",
    )


#: root 100 ─┬─ 101 (seen) ── 102
#:           ├─ 103 ─┬─ 104 (few images)
#:           │       └─ 105 ── 106 (excluded subtree root) ── 107
#:           └─ 108 ─┬─ 109 (blocklisted)
#:                   └─ 110 ── 111
EDGES = {
    "n00000100": [],
    "n00000101": ["n00000100"],
    "n00000102": ["n00000101"],
    "n00000103": ["n00000100"],
    "n00000104": ["n00000103"],
    "n00000105": ["n00000103"],
    "n00000106": ["n00000105"],
    "n00000107": ["n00000106"],
    "n00000108": ["n00000100"],
    "n00000109": ["n00000108"],
    "n00000110": ["n00000108"],
    "n00000111": ["n00000110"],
}


def _build_tiny(**kwargs):
    args = {
        "measure": "path",
        "seen": ["n00000102"],
        "candidates": sorted(EDGES),
        "taxonomy": _taxonomy(EDGES),
        "image_counts": dict.fromkeys(EDGES, 1000) | {"n00000104": 10},
        "exclude": ("n00000106",),
        "blocklist": ["n00000109"],
        "n_levels": 1,
        "level_size": 1,
    }
    args.update(kwargs)
    levels = _quiet_build(**args)
    return (
        levels,
        set(levels.scores),
        {s["step"]: s["remaining"] for s in levels.provenance["filters"]},
    )


def test_tiny_filters_in_order():
    _levels, eligible, remaining = _build_tiny()
    # Step 1 drops 102 (seen) and its ancestors 101 and 100. Step 2 drops 104.
    # Step 3 drops 106 and 107. Step 4 drops ancestors of the rest: 103 (of 105)
    # and 108 (of 110, and of 109 which is still eligible then). Step 5 drops 109.
    assert eligible == {"n00000105", "n00000110", "n00000111"} - {"n00000110"}
    assert remaining == {
        "candidates": 12,
        "seen": 9,
        "min_images": 8,
        "exclude": 6,
        "leaves": 3,
        "blocklist": 2,
    }


def test_tiny_filter_order_effects():
    # The count filter runs before the leaf filter: when 105's only child is
    # excluded (step 3), 105 becomes a leaf and stays. Without the exclusion,
    # 105 is the parent of an eligible concept and goes.
    _, with_exclusion, _ = _build_tiny()
    _, without_exclusion, _ = _build_tiny(exclude=())
    assert "n00000105" in with_exclusion
    assert "n00000105" not in without_exclusion and "n00000107" in without_exclusion
    # A parent whose only eligible child fails the count filter becomes a leaf.
    counts = dict.fromkeys(EDGES, 1000) | {"n00000111": 5}
    _, eligible, _ = _build_tiny(image_counts=counts)
    assert "n00000110" in eligible and "n00000111" not in eligible
    # The blocklist runs after the leaf filter: 108 is still removed as the
    # parent of 109, even though 109 is blocklisted afterwards.
    _, eligible, _ = _build_tiny(blocklist=["n00000109", "n00000111"])
    assert "n00000108" not in eligible and "n00000110" not in eligible


def test_missing_counts_mean_no_images():
    _, eligible, remaining = _build_tiny(image_counts={"n00000105": 5000})
    assert eligible == {"n00000105"}
    assert remaining["min_images"] == 1


def test_ties_break_by_wnid_and_gaps_are_even():
    assert level_starts(5146, 5, 1000) == [0, 1036, 2073, 3109, 4146]
    assert level_starts(5000, 5, 1000) == [0, 1000, 2000, 3000, 4000]
    starts = level_starts(14178, 5, 1000)
    gaps = [starts[k + 1] - starts[k] - 1000 for k in range(4)]
    assert max(gaps) - min(gaps) <= 1 and starts[-1] + 1000 == 14178
    # 4 leaves under one root, all at the same path distance from the seen leaf.
    edges = {"n00000001": [], "n00000002": ["n00000001"]} | {
        f"n0000001{i}": ["n00000001"] for i in range(4)
    }
    levels = _quiet_build(
        measure="path",
        seen=["n00000002"],
        candidates=sorted(edges),
        taxonomy=_taxonomy(edges),
        exclude=(),
        blocklist=None,
        n_levels=2,
        level_size=2,
    )
    assert levels.levels == [["n00000010", "n00000011"], ["n00000012", "n00000013"]]


def test_bad_input_gives_clear_errors():
    with pytest.raises(ValueError, match="unknown wnid 'n99999999'"):
        _quiet_build(seen=["n99999999"])
    with pytest.raises(ValueError, match="seen set is empty"):
        _quiet_build(seen=[])
    with pytest.raises(ValueError, match="fewer than the 20 levels x 1000"):
        _quiet_build(candidates="cog", n_levels=20)
    with pytest.raises(ValueError, match="unknown candidates"):
        _quiet_build(candidates="imagenet42k")


# ---------------------------------------------------------------- counting
def test_count_images_in_folders_and_tars(tmp_path):
    (tmp_path / "n00000105").mkdir()
    for i in range(3):
        (tmp_path / "n00000105" / f"n00000105_{i}.JPEG").write_bytes(b"x")
    (tmp_path / "n00000105" / "notes.txt").write_text("not an image")
    with tarfile.open(tmp_path / "n00000110.tar", "w") as tar:
        for i in range(4):
            src = tmp_path / f"img{i}.JPEG"
            src.write_bytes(b"y" * 10)
            tar.add(src, arcname=f"n00000110_{i}.JPEG")
    (tmp_path / "README").write_text("ignored")
    assert count_images(tmp_path) == {"n00000105": 3, "n00000110": 4}
    levels = _quiet_build(
        measure="path",
        seen=["n00000102"],
        candidates=sorted(EDGES),
        taxonomy=_taxonomy(EDGES),
        image_counts=tmp_path,
        min_images=3,
        exclude=(),
        blocklist=None,
        n_levels=1,
        level_size=1,
    )
    assert set(levels.scores) == {"n00000105", "n00000110"}


def _tar(path, names, size=500):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(b"x" * size))


def _listed(root):
    from imagenet_cog._data.listing import list_root

    return {w: len(v) for w, v in list_root(root, None).images.items()}


def test_count_images_refuses_a_damaged_tar_as_the_listing_does(tmp_path):
    # A header damaged in the middle of the tar: tarfile stops there and counts the images
    # before it; the listing refuses the tar, and so does the count, naming it.
    tar = tmp_path / "n00000105.tar"
    _tar(tar, [f"n00000105_{i}.JPEG" for i in range(5)])
    data = bytearray(tar.read_bytes())
    data[2 * 1024 + 10] ^= 0xFF  # the third member's header
    tar.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="no end-of-archive block") as listed:
        _listed(tmp_path)
    with pytest.raises(ValueError, match="no end-of-archive block") as counted:
        count_images(tmp_path)
    assert str(tar) in str(counted.value)
    assert str(counted.value) == str(listed.value)


def test_count_images_counts_what_the_listing_finds(tmp_path):
    # A concept with both a folder and a tar: the listing reads the folder (3 images), the
    # count did too and added the tar's (5). Two links named like images that lead nowhere:
    # the listing passes them over with a warning, the count counted them.
    (tmp_path / "n00000105").mkdir()
    for i in range(3):
        (tmp_path / "n00000105" / f"n00000105_{i}.JPEG").write_bytes(b"x")
    _tar(tmp_path / "n00000105.tar", ["a.JPEG", "b.JPEG"])
    (tmp_path / "n00000110").mkdir()
    for i in range(3):
        (tmp_path / "n00000110" / f"n00000110_{i}.JPEG").write_bytes(b"x")
    for i in range(2):
        (tmp_path / "n00000110" / f"gone{i}.JPEG").symlink_to(tmp_path / "nowhere")
    with pytest.warns(UserWarning, match="skipped 2 entries"):
        listed = _listed(tmp_path)
    with pytest.warns(UserWarning, match="skipped 2 entries"):
        counted = count_images(tmp_path)
    assert counted == listed == {"n00000105": 3, "n00000110": 3}


def test_count_images_of_a_root_without_concepts(tmp_path):
    (tmp_path / "README").write_text("no concept here")
    with pytest.raises(ValueError, match="holds neither nXXXXXXXX/ folders nor"):
        count_images(tmp_path)
    with pytest.raises(FileNotFoundError, match="no image folder"):
        count_images(tmp_path / "missing")


def test_counts_file(tmp_path):
    path = tmp_path / "counts.tsv"
    path.write_text("wnid\tcount\n# comment\nn00000105\t900\nn00000110,12\n")
    assert read_counts(path) == {"n00000105": 900, "n00000110": 12}
    path.write_text("n00000105\tmany\nn00000110\t3\n")
    with pytest.raises(ValueError, match="expected 'wnid count'"):
        read_counts(path)


# ------------------------------------------------------------- persistence
def test_save_load_round_trip(tmp_path):
    levels = _quiet_build(candidates="cog")
    tsv = levels.save(tmp_path / "out")
    assert tsv.read_text().splitlines()[0] == "level\twnid\tscore"
    meta = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert meta["measure"] == "lin" and meta["filters"][0]["remaining"] == 5000
    back = Levels.load(tmp_path / "out")
    assert back.levels == levels.levels
    assert back.scores == levels.scores  # repr() round-trips floats exactly
    assert load_levels(tsv).levels == levels.levels
    with pytest.raises(FileNotFoundError):
        load_levels(tmp_path / "nothing")
    (tmp_path / "bad.tsv").write_text("x\ty\n")
    with pytest.raises(ValueError, match="header"):
        Levels.load(tmp_path / "bad.tsv")


@pytest.mark.skipif(not HAS_PANDAS, reason="needs pandas")
def test_levels_to_frame():
    frame = _quiet_build(candidates="cog").to_frame()
    assert list(frame.columns) == ["level", "wnid", "score", "name"]
    assert frame.iloc[0]["level"] == "L1"


def test_levels_access():
    levels = Levels([["n1"], ["n2", "n3"]])
    assert levels["L2"] == ["n2", "n3"] and levels[1] == ["n1"]
    assert levels.level_of("n3") == "L2"
    with pytest.raises(KeyError):
        levels["L3"]
    with pytest.raises(ValueError, match="more than one level"):
        Levels([["n1"], ["n1"]])
    assert np.isnan(levels.rows()[0][2])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"empty file"),
        ("level\twnid\tscore\n1\n", r":2: expected 'level<TAB>wnid"),
        ("level\twnid\tscore\n1\tn01\t0.5\n1\tn02\thigh\n", r":3: bad score 'high' for n02"),
        ("level\twnid\n1\tn01\n2\tn02\n2\tn01\n", r":4: n01 is already listed on line 2"),
        ("level\twnid\n", r"no levels"),
    ],
)
def test_malformed_levels_file_names_the_file_and_line(tmp_path, text, match):
    (tmp_path / "levels.tsv").write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        Levels.load(tmp_path)
    assert str(tmp_path / "levels.tsv") in str(info.value)


def test_malformed_provenance_names_the_file(tmp_path):
    (tmp_path / "levels.tsv").write_text("level\twnid\n1\tn01\n")
    (tmp_path / "provenance.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"provenance\.json: not valid JSON"):
        Levels.load(tmp_path)
