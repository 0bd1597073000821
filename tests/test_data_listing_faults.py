"""Listing a data root with odd entries: links, FIFOs, empty tars."""

import io
import os
import re
import tarfile

import pytest
from PIL import Image

from imagenet_cog import Levels
from imagenet_cog._data.folders import list_images
from imagenet_cog.datasets import make_split

A, B = "n00000001", "n00000002"


def _jpeg():
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "JPEG")
    return buf.getvalue()


def _concept(root, wnid, n=3):
    (root / wnid).mkdir(parents=True)
    for i in range(n):
        (root / wnid / f"{wnid}_{i}.JPEG").write_bytes(_jpeg())


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and symlinks")
def test_links_that_lead_nowhere_and_fifos_are_skipped_alike_and_counted(tmp_path):
    _concept(tmp_path, A)
    folder = tmp_path / A
    os.symlink("loop.JPEG", folder / "loop.JPEG")  # a link to itself: ELOOP
    os.symlink("nowhere.JPEG", folder / "dangling.JPEG")
    os.mkfifo(folder / "fifo.JPEG")
    (folder / "folder.JPEG").mkdir()
    os.symlink(f"{A}_0.JPEG", folder / "link.JPEG")  # a link to an image is an image
    with pytest.warns(
        UserWarning,
        match=r"skipped 4 entries named like an image but not "
        r"readable files \(a dangling or looping link, a FIFO, a folder\)",
    ) as info:
        images = list_images(tmp_path, [A])
    assert sorted(images[A]) == sorted([f"{A}/{A}_{i}.JPEG" for i in range(3)] + [f"{A}/link.JPEG"])
    assert len(info) == 1 and "dangling.JPEG" in str(info[0].message)
    with pytest.warns(UserWarning, match="skipped 4 entries"):
        assert len(make_split(tmp_path, "L1", "train", Levels([[A]]), n_test=1)) == 3


def test_a_concept_folder_that_links_to_another_concept_is_refused(tmp_path):
    _concept(tmp_path, A)
    os.symlink(A, tmp_path / B)
    with pytest.raises(
        ValueError,
        match=rf"{B}: .*{B} is a link to .*{A}, the images of concept "
        rf"{A}; the same images would be given two labels",
    ):
        list_images(tmp_path, [A, B])
    with pytest.raises(ValueError, match="two labels"):
        list_images(tmp_path, [B])  # the other concept need not be listed with it
    # A concept kept elsewhere through a link is fine.
    elsewhere = tmp_path / "disk2"
    _concept(elsewhere, "n00000003")
    os.symlink(elsewhere / "n00000003", tmp_path / "n00000003")
    assert len(list_images(tmp_path, [A, "n00000003"])["n00000003"]) == 3


def test_a_tar_that_links_to_another_concepts_tar_is_refused(tmp_path):
    with tarfile.open(tmp_path / f"{A}.tar", "w") as tar:
        info = tarfile.TarInfo(f"{A}_0.JPEG")
        data = _jpeg()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    os.symlink(f"{A}.tar", tmp_path / f"{B}.tar")
    with pytest.raises(ValueError, match=rf"{B}\.tar is a link to .*{A}\.tar"):
        list_images(tmp_path, [A, B])


def test_an_empty_tar_is_named_as_such(tmp_path):
    tarfile.open(tmp_path / f"{A}.tar", "w").close()  # a valid archive with no member
    (tmp_path / f"{B}.tar").write_bytes(b"")
    with pytest.raises(
        ValueError,
        match=rf"^{A}: no images in {re.escape(str(tmp_path))}/{A}\.tar "
        r"\(empty concept\)$",
    ):
        list_images(tmp_path, [A])
    with pytest.raises(ValueError, match=rf"^{B}: .*/{B}\.tar is an empty file"):
        list_images(tmp_path, [B])


@pytest.mark.parametrize("layout", ["folder", "tar"])
def test_an_image_whose_name_is_not_utf8_is_named_in_one_line_by_data_and_extract(
    tmp_path, capsys, monkeypatch, layout
):
    # Before: data listed and counted it; extract then stopped with "'utf-8' codec can't
    # encode characters ...", naming no file.
    from imagenet_cog.cli import main

    monkeypatch.chdir(tmp_path)  # the files data writes by default go there
    _concept(tmp_path / "root", A, n=4)
    name = f"{A}_caf\xe9.JPEG".encode("latin-1")  # a Latin-1 name: not UTF-8
    if layout == "folder":
        where = os.path.join(os.fsencode(tmp_path / "root" / A), name)
        with open(where, "wb") as f:
            f.write(_jpeg())
        said = f"imagenet-cog: error: {where!r}: an image whose file name is not UTF-8"
    else:
        tar_path = tmp_path / "root" / f"{A}.tar"
        with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
            for k, data in enumerate([_jpeg()] * 4 + [_jpeg()]):
                info = tarfile.TarInfo(f"{A}_{k}.JPEG" if k < 4 else name.decode("latin-1"))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        for f in (tmp_path / "root" / A).iterdir():
            f.unlink()
        (tmp_path / "root" / A).rmdir()
        said = f"imagenet-cog: error: {tar_path}: tar member {name!r} is an image whose name"
    Levels([[A]]).save(tmp_path / "levels")
    argvs = [
        ["data", tmp_path / "root", "--levels", tmp_path / "levels"],
        ["extract", "torchvision:resnet18:none", "--data", tmp_path / "root", "--domain", "L1"],
    ]
    argvs[1] += ["--levels", tmp_path / "levels", "--split", "train", "--n-test", "1"]
    argvs[1] += ["--out", tmp_path / "out", "--preprocessing", '{"size": 16}', "--quiet"]
    for argv in argvs:
        assert main([str(a) for a in argv]) == 2, argv[0]
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(said), line
        assert "not UTF-8" in line and "rename it" in line
