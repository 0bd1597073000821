"""The first day with a copy of one's own, on the command line as a user meets it.

The copies are written by the real ``webdataset`` and ``datasets`` libraries (``hfcopies``):
``imagenet-cog data`` counts what a partial copy holds, reads or names every layout a user
plausibly holds, says which copy is which, writes what a copy can build with the command
that extracts it, and an extraction from a second copy of the same images says it reused
the stores. Warnings and the plan say what they mean in one line, and README's first
command gives something to keep.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from copyfiles import folder_images, write_shards
from hfcopies import hf_parquet, hf_save_to_disk, image_folders, wds_shards
from imagefiles import official_concepts, write_concepts, write_in1k

from imagenet_cog import cli
from imagenet_cog.datasets import make_split

pytest.importorskip("pyarrow")
REPO = Path(__file__).resolve().parents[1]
TINY = ["--preprocessing", '{"size": 16}', "--batch-size", "8", "--quiet", "--device", "cpu"]


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGENET_COG_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # the files imagenet-cog data writes by default go there


@pytest.fixture(scope="module")
def l1(tmp_path_factory):
    """``(folder root, wnids, {image id: bytes})``: two official L1 concepts, their 50
    official test images and 9 more each, as folders."""
    root = tmp_path_factory.mktemp("l1") / "folders"
    write_concepts(root, official_concepts(n_concepts=2, n_train=9, bad=False))
    images = folder_images(root)
    return root, sorted({i.split("/", 1)[0] for i in images}), images


def _data(tmp_path, capsys, *roots, code=None):
    """``imagenet-cog data ROOTS``: ``(exit code, stdout lines, stderr lines)``."""
    # The concepts a partial copy can build go to ./imagenet-cog-present.txt: tmp_path.
    got = cli.main(["data", *map(str, roots), "--missing", str(tmp_path / "missing.tsv")])
    out, err = capsys.readouterr()
    if code is not None:
        assert got == code, out + err
    return got, out.splitlines(), err.strip().splitlines()


def _row(lines, domain, copy=None):
    """The table line of ``domain`` (of copy number ``copy``)."""
    rows = [line for line in lines if line.startswith(f"{domain} ")]
    if copy is not None:
        rows = [line for line in rows if f" {copy}: " in line]
    (row,) = rows
    return row


def _is_train(image_id):
    """The images ``official_concepts`` adds beside the official test images."""
    return re.search(r"_9900\d\d\.JPEG$", image_id) is not None


def _split(images, every=10):
    """``(train, validation)``: every ``every``-th official test image set aside."""
    tests = sorted(i for i in images if not _is_train(i))
    val = set(tests[::every])
    return {i: d for i, d in images.items() if i not in val}, {i: images[i] for i in val}


# ------------------------------------------------------------------ what data counts
def test_data_counts_the_training_images_beside_the_test_images_present(l1, tmp_path, capsys):
    _, _, images = l1
    train, _val = _split(images)  # a train-only copy: some official test images are absent
    hf_parquet(tmp_path / "train-only", train)
    _, lines, _ = _data(tmp_path, capsys, tmp_path / "train-only", code=1)
    row = _row(lines, "L1")
    # 9 training images per concept, whatever official test images the copy lacks.
    assert "18 (1,118,804)" in row and "2/1,000" in row
    assert f"{100 - len(images) + len(train)}/50,000" in row


# ------------------------------------------------------------------ the layouts users hold
def test_a_save_to_disk_folder_is_named_with_the_line_that_writes_it_as_parquet(
    l1, tmp_path, capsys
):
    _, _, images = l1
    train, val = _split(images)
    saved = hf_save_to_disk(tmp_path / "saved", {"train": train, "validation": val})
    _, _, err = _data(tmp_path, capsys, saved, code=2)
    (line,) = err
    assert line.startswith(f"imagenet-cog: error: {saved} is a folder the datasets library's ")
    assert "save_to_disk wrote (Arrow files), which is not read here" in line
    command = line.split('(python -c "', 1)[1].split('"), and give ', 1)[0]
    subprocess.run([sys.executable, "-c", command], check=True)  # the line it gives
    _, lines, _ = _data(tmp_path, capsys, tmp_path / "saved-parquet", code=1)
    row = _row(lines, "L1")
    assert "2/1,000" in row and "18 (1,118,804)" in row and "100/50,000" in row


def test_the_hubs_image_folders_are_read(l1, tmp_path, capsys):
    folders, wnids, images = l1
    train, val = _split(images)
    hub = image_folders(tmp_path / "hub", {"train": train, "validation": val})
    _, lines, _ = _data(tmp_path, capsys, hub, code=1)
    row = _row(lines, "L1")
    assert "folder per wnid (train/, validation/)" in row
    assert "2/1,000" in row and "18 (1,118,804)" in row and "100/50,000" in row
    for split in ("train", "test"):  # extract reads it as one folder per wnid
        assert make_split(hub, "L1", split, wnids=wnids).ids == (
            make_split(folders, "L1", split, wnids=wnids).ids
        )
    # ImageNet-1K in the same layout, its validation folder per wnid.
    write_in1k(tmp_path / "in1k", n_classes=3, n_train=4, n_val=2, val_layout="folders")
    (tmp_path / "in1k" / "val").rename(tmp_path / "in1k" / "validation")
    _, lines, _ = _data(tmp_path, capsys, tmp_path / "in1k", code=1)
    row = _row(lines, "IN-1K")
    assert "3/1,000" in row and "12 (1,281,167)" in row and "6/50,000" in row


def test_shards_are_recognised_by_their_content_whatever_their_name(l1, tmp_path, capsys):
    folders, wnids, images = l1
    shards = wds_shards(tmp_path / "wds", images)  # shard-000000.tar, as webdataset names them
    assert shards[0].name == "shard-000000.tar" and len(shards) > 1
    _, lines, _ = _data(tmp_path, capsys, tmp_path / "wds", code=1)
    row = _row(lines, "L1")
    assert "webdataset shards (shard)" in row and "2/1,000" in row and "100/50,000" in row
    for split in ("train", "test"):
        assert make_split(tmp_path / "wds", "L1", split, wnids=wnids).checksum == (
            make_split(folders, "L1", split, wnids=wnids).checksum
        )


def test_a_parquet_copy_without_names_says_what_is_missing(l1, tmp_path, capsys):
    _, _, images = l1
    # Made from PIL images (no file names), its classes ClassLabel(num_classes=15).
    path = hf_parquet(tmp_path / "pil", images, with_paths=False, num_classes=15)
    _, _, err = _data(tmp_path, capsys, tmp_path / "pil", code=2)
    assert err == [
        (
            f"imagenet-cog: error: {path}: no image can be given a wnid: no row has a file name "
            "(the image column's path is empty in every row) and its class names ('0'...) are "
            "not wnids; write the copy with the wnids as class names (ClassLabel(names=[...])) "
            "or with the original file names"
        )
    ]
    # The same images with the wnids as class names are read (named by their place), and an
    # image column named otherwise is found by its type.
    hf_parquet(tmp_path / "pil-wnids", images, with_paths=False)
    hf_parquet(tmp_path / "jpg", images, image_column="jpg")
    _, lines, _ = _data(tmp_path, capsys, tmp_path / "pil-wnids", code=1)
    assert "2/1,000" in _row(lines, "L1") and "0/50,000" in _row(lines, "L1")
    _, lines, _ = _data(tmp_path, capsys, tmp_path / "jpg", code=1)
    assert "2/1,000" in _row(lines, "L1") and "100/50,000" in _row(lines, "L1")


def test_a_parquet_copy_of_wnid_classes_without_file_names_says_why_no_test_image_is_found(
    l1, tmp_path, capsys
):
    _, wnids, images = l1
    # Made from PIL images (no file names), its classes ClassLabel(names=wnids): each image has
    # its wnid, but the official test images, known by their file names, cannot be found.
    path = hf_parquet(tmp_path / "pil-wnids", images, with_paths=False)
    _, lines, err = _data(tmp_path, capsys, tmp_path / "pil-wnids", code=1)
    row = _row(lines, "L1")
    # None of its 118 images is counted as a training image: the test images are among them.
    assert "2/1,000" in row and " 0 (1,118,804)" in row and "0/50,000" in row
    text = "\n".join(lines + err)
    assert "validation part" not in text
    (note,) = [line for line in lines if line.startswith("nothing can be extracted")]
    assert note == (
        "nothing can be extracted from these roots: 2 concept(s) present have only images "
        "without file names (118 images: a Parquet copy written from decoded images), so their "
        "official test images, known by their file names, cannot be found among them; write "
        "the copy again with each image's file name (the path of its image column), or, in "
        "Python, extract with official_test=False, which draws each concept's test images with "
        "a seed (a run not comparable with the paper)"
    )
    # extract says the same in one line, not that 50 test images are missing.
    code = cli.main(
        ["extract", "torchvision:resnet18:none", "--in21k", str(tmp_path / "pil-wnids"),
         "--wnids", ",".join(wnids), "--domain", "L1", "--out", str(tmp_path / "f"), *TINY]
    )  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert line == (
        f"imagenet-cog: error: {wnids[0]}: its 59 images in {tmp_path / 'pil-wnids'} have no file "
        f"names (a Parquet copy written from decoded images, {path.name}), so its 50 official "
        "test images, known by their file names, cannot be found among them; write the copy "
        "again with each image's file name (the path of its image column), or, in Python, "
        "extract with official_test=False, which draws each concept's test images with a seed "
        "(a run not comparable with the paper)"
    )


# ------------------------------------------------------------------ which copy is which
def _in1k_parquet(tmp_path, folder):
    write_in1k(tmp_path / "in1k-folders", n_classes=3, n_train=4, n_val=2)
    train = folder_images(tmp_path / "in1k-folders" / "train")
    hf_parquet(tmp_path / folder, train)
    return tmp_path / folder


@pytest.mark.parametrize("folder", ["ILSVRC-imagenet-1k", "imagenet-1k"])
def test_two_copies_are_each_named_and_a_copy_is_what_its_content_says(
    l1, tmp_path, capsys, folder
):
    _, _, images = l1
    write_shards(tmp_path / "wds", images, name="imagenet22k")
    in1k = _in1k_parquet(tmp_path, folder)
    _, lines, _ = _data(tmp_path, capsys, tmp_path / "wds", in1k, code=1)
    assert "1: webdataset shards (imagenet22k)" in _row(lines, "L1")
    assert f"2: parquet ({folder})" in _row(lines, "IN-1K")
    assert f"copy 1 = {tmp_path / 'wds'}: published processing: shorter side above 600 px" in (
        "\n".join(lines)
    )
    assert f"copy 2 = {in1k}: published processing: none (the ILSVRC-2012 JPEG files)" in lines


def test_two_roots_of_one_kind_get_a_row_each(l1, tmp_path, capsys):
    folders, _, images = l1
    write_shards(tmp_path / "wds", images, name="imagenet22k")
    in1k = _in1k_parquet(tmp_path, "in1k-parquet")
    _, lines, _ = _data(tmp_path, capsys, tmp_path / "in1k-folders", in1k, code=1)
    assert "3/1,000" in _row(lines, "IN-1K", 1) and "3/1,000" in _row(lines, "IN-1K", 2)
    _, lines, _ = _data(tmp_path, capsys, folders, tmp_path / "wds", code=1)
    assert "1: folder per wnid" in _row(lines, "L1", 1)
    assert "2: webdataset shards (imagenet22k)" in _row(lines, "L1", 2)


# ------------------------------------------------------------------ what a copy can build
def test_data_writes_what_a_partial_copy_can_build_and_the_command_that_extracts_it(
    l1, tmp_path, capsys
):
    folders, wnids, _ = l1
    _, lines, _ = _data(tmp_path, capsys, folders, code=1)
    present = Path("imagenet-cog-present.txt")  # in tmp_path, the current folder
    assert present.read_text().split() == wnids
    last = lines[-1]
    command = (
        f"imagenet-cog extract MODEL --in21k {folders} --wnids {present} --domain L1 "
        "--out features/MODEL"
    )
    assert last.endswith(command) and "2 concepts that can be built" in last
    args = command.split()[1:]
    args[args.index("MODEL")] = "torchvision:resnet18:none"
    args[-1] = str(tmp_path / "features")
    assert cli.main([*args, *TINY]) == 0  # the command it gives extracts them
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "features" / "L1").iterdir()) == ["test", "train"]


def test_data_refuses_a_domain_whose_concepts_are_too_small_to_split(l1, tmp_path, capsys):
    from imagenet_cog import Levels

    _, wnids, images = l1
    # The second concept holds its 50 official test images and nothing to train on.
    held = {i: d for i, d in images.items() if i.startswith(wnids[0]) or not _is_train(i)}
    copy = tmp_path / "copy"
    for image_id, data in held.items():
        (copy / image_id).parent.mkdir(parents=True, exist_ok=True)
        (copy / image_id).write_bytes(data)
    Levels([wnids]).save(tmp_path / "levels")
    args = ["--levels", str(tmp_path / "levels")]
    got = cli.main(["data", str(copy), *args, "--missing", str(tmp_path / "m.tsv")])
    out = capsys.readouterr().out
    assert got == 1 and "cannot be built: L1" in out
    assert f"L1\tconcept too small to split\t{wnids[1]}" in (tmp_path / "m.tsv").read_text()
    with pytest.raises(ValueError, match=rf"{wnids[1]}: no train image left"):
        make_split(copy, "L1", "train", tmp_path / "levels")


# ------------------------------------------------------------------ reuse said plainly
def test_an_extraction_from_a_second_copy_of_the_same_images_says_it_reused_the_stores(
    l1, tmp_path, capsys
):
    folders, wnids, images = l1
    wds_shards(tmp_path / "wds", images)
    out = tmp_path / "features"
    common = ["--domain", "L1", "--split", "test", "--out", str(out), *TINY]
    model = "torchvision:resnet18:none"
    wnid_args = ["--wnids", ",".join(wnids)]
    assert cli.main(["extract", model, "--data", str(folders), *wnid_args, *common]) == 0
    first = capsys.readouterr().out
    assert "reused" not in first
    assert cli.main(["extract", model, "--data", str(tmp_path / "wds"), *wnid_args, *common]) == 0
    line = capsys.readouterr().out.strip().splitlines()[0]
    assert line == (
        f"{out / 'L1' / 'test'}: reused (same images as {folders.resolve()}, folder per wnid): "
        "100 images x 512 features, 0 skipped"
    )
    manifest = json.loads((out / "L1" / "test" / "manifest.json").read_text())
    assert manifest["split"]["data_root"] == str(folders.resolve())
    (again,) = manifest["reused_for"]
    assert again["data_root"] == str((tmp_path / "wds").resolve())
    assert again["layout"] == "webdataset shards" and again["copy"]["name"] == "shard"


def test_a_processed_copy_is_not_taken_for_the_same_images(l1, tmp_path, capsys):
    from copyfiles import resize_short

    folders, wnids, images = l1
    write_shards(tmp_path / "wds", images, process=lambda d: resize_short(d, 20))
    out = tmp_path / "features"
    common = ["--domain", "L1", "--split", "test", "--out", str(out), *TINY]
    model, wnid_args = "torchvision:resnet18:none", ["--wnids", ",".join(wnids)]
    assert cli.main(["extract", model, "--data", str(folders), *wnid_args, *common]) == 0
    capsys.readouterr()
    assert cli.main(["extract", model, "--data", str(tmp_path / "wds"), *wnid_args, *common]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "were read from" in line and "--overwrite" in line


# ------------------------------------------------------------------ messages and output
@pytest.mark.slow
def test_a_warning_is_one_line_and_the_plan_says_what_its_gb_count(tiny_in1k_store):
    store = tiny_in1k_store()
    args = ["evaluate", str(store.store), "--plan", "--trials", "2", "--startup-trials", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "imagenet_cog", *args, "--epochs", "1", "--shots", "all"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])},  # the code tested
    )
    warning = [line for line in done.stderr.splitlines() if "n_trials=2" in line]
    assert warning == [
        (
            "imagenet-cog: warning: n_trials=2 does not exceed n_startup_trials=5: every trial "
            "is a random startup trial and TPE never runs (the paper: 30 trials, 10 of them "
            "startup; lower --startup-trials for a short search)"
        )
    ]
    assert "UserWarning" not in done.stderr and ".py:" not in done.stderr
    assert "GB: the most host memory the unit holds at once, as planned" in done.stdout


@pytest.mark.slow
def test_the_levels_filter_table_names_the_subtree_it_removes(tmp_path, capsys):
    assert cli.main(["levels", "--out", str(tmp_path / "levels")]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("exclude ")]
    assert line.endswith("subtrees of person.n.01")


# ------------------------------------------------------------------ README's first command
def test_readmes_first_command_prints_the_official_levels(capsys):
    readme = (REPO / "README.rst").read_text()
    first = next(
        line.strip() for line in readme.splitlines() if "imagenet-cog " in line and "pip " in line
    )
    command = first.split("&&", 1)[1].split()
    assert command[0] == "imagenet-cog"
    assert cli.main(command[1:]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "These are the official ImageNet-CoG levels."
    levels = [line for line in out if re.match(r"L[1-5] +1000 ", line)]
    assert len(levels) == 5
    assert any("50 official test images" in line for line in out)


@pytest.mark.slow
def test_the_documented_test_count_is_the_suites():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])},
    )
    collected = int(re.search(r"(\d+) tests? collected", done.stdout)[1])
    for page in (REPO / "docs" / "guide" / "install.rst", REPO / "README.rst"):
        text = " ".join(page.read_text().split())
        documented = int(re.search(r"about ([\d,]+) tests", text)[1].replace(",", ""))
        # "about": the count as the suite gave it when measured, within a tenth of today's.
        assert abs(documented - collected) <= 0.1 * collected, (page.name, documented, collected)
