"""The one tar reader of the data wing: tars per wnid and webdataset shards read alike.

Python's ``tarfile`` is the reference: the reader gives the members it gives, on tars
written by ``tarfile`` and by GNU tar in every format. A damaged or unsafe tar is refused
with the same reason whether it is read as a tar per wnid or as a webdataset shard.
"""

import gzip
import io
import os
import re
import shutil
import subprocess
import tarfile

import pytest
from imagefiles import image_bytes

from imagenet_cog._data import sources
from imagenet_cog._data.folders import list_images
from imagenet_cog._data.listing import list_copy
from imagenet_cog._data.tar import read_members
from imagenet_cog.datasets import ImageDataset


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGENET_COG_CACHE", str(tmp_path / "cache"))


# ------------------------------------------------------------ tarfile as the reference
@pytest.mark.parametrize("fmt", ["USTAR_FORMAT", "GNU_FORMAT", "PAX_FORMAT"])
def test_the_header_reader_agrees_with_tarfile(tmp_path, fmt):
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
        got = [m[:3] for m in read_members(f, path)]
    assert got == expect and len(got) == 4


@pytest.fixture(scope="module")
def gnu_tree(tmp_path_factory):
    """A tree of every kind of member: images, a long path, a non-ASCII name, a folder, a
    symbolic and a hard link, a sparse file with more holes than one header holds."""
    root = tmp_path_factory.mktemp("gnu") / "tree"
    (root / "n00000001" / ("d" * 120)).mkdir(parents=True)
    (root / "sub").mkdir()
    for i in range(3):
        (root / "n00000001" / f"n00000001_{i}.JPEG").write_bytes(image_bytes("jpeg", i))
    (root / "n00000001" / ("d" * 120) / "n00000001_long.JPEG").write_bytes(b"x" * 3000)
    (root / "sub" / "é.txt").write_bytes(b"e")
    (root / "sub" / "link.JPEG").symlink_to("../n00000001/n00000001_0.JPEG")
    (root / "sub" / "hard.JPEG").hardlink_to(root / "n00000001" / "n00000001_1.JPEG")
    with open(root / "sub" / "holes.bin", "wb") as f:
        for k in range(30):
            f.seek(k * 100_000)
            f.write(b"data")
    (root / "sub" / "after.JPEG").write_bytes(image_bytes("png", 1))
    return root


@pytest.mark.parametrize(
    ("fmt", "sparse"),  # ustar and v7 hold no sparse member: GNU tar writes none
    [(f, s) for f in ("gnu", "oldgnu", "pax") for s in (False, True)] + [("ustar", 0), ("v7", 0)],
)
def test_the_reader_agrees_with_tarfile_on_gnu_tar_archives(gnu_tree, tmp_path, fmt, sparse):
    if shutil.which("tar") is None:
        pytest.skip("no tar command")
    path = tmp_path / f"{fmt}.tar"
    # ustar and v7 cannot hold the long path: GNU tar leaves it out and says so.
    subprocess.run(
        ["tar", f"--format={fmt}", *(["-S"] * sparse), "-cf", str(path), "-C", str(gnu_tree), "."],
        check=False,
        capture_output=True,
    )
    with tarfile.open(path) as tar:
        expect = [(m.name, m.offset_data, m.size) for m in tar if m.isreg() and not m.issparse()]
        holes = [m.name for m in tar if m.issparse()]
    with open(path, "rb") as f:
        got = [m[:3] for m in read_members(f, path)]
    assert got == expect and len(got) >= 6
    assert holes == (["./sub/holes.bin"] if sparse else [])


def test_the_reader_applies_pax_records_as_tarfile_does(tmp_path):
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "all"}) as tar:
        for name in ("n00000001_1.JPEG", "n00000001_2.JPEG", "é" * 60 + ".JPEG"):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 5, 1.5  # a float mtime: a pax record per member
            tar.addfile(info, io.BytesIO(b"12345"))
    with tarfile.open(path) as tar:
        expect = [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
    with open(path, "rb") as f:
        assert [m[:3] for m in read_members(f, path)] == expect


# ------------------------------------------------------- one tar, two layouts, one verdict
WNID = "n00000001"


def _members(n=4):
    """Image members named so that one tar is both a tar per wnid and a webdataset shard."""
    return [(f"{WNID}_{i}.JPEG", image_bytes("jpeg", i)) for i in range(n)]


def _write_tar(path, members, fmt=tarfile.USTAR_FORMAT, sparse=()):
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if name in sparse:
                info.type = tarfile.GNUTYPE_SPARSE
            tar.addfile(info, io.BytesIO(data))


def _damaged(kind, path, monkeypatch):
    """Write at ``path`` a tar damaged in one way; returns the reason it must be refused for."""
    members = _members()
    if kind == "absolute name":
        _write_tar(path, [*members, ("/etc/n00000001_9.JPEG", b"x")])
        return r"refusing tar member '/etc/n00000001_9\.JPEG' \(absolute path or '\.\.'\)"
    if kind == "'..' in a name":
        _write_tar(path, [*members, ("../n00000001_9.JPEG", b"x")])
        return r"refusing tar member '\.\./n00000001_9\.JPEG'"
    if kind == "two members of one name":
        _write_tar(path, [*members, members[1]])
        return r"two tar members are named 'n00000001_1\.JPEG'"
    if kind == "sparse image":
        _write_tar(path, members, fmt=tarfile.GNU_FORMAT, sparse={members[2][0]})
        return r"refusing GNU sparse tar member 'n00000001_2\.JPEG'"
    if kind == "image over the size limit":
        _write_tar(path, members)
        monkeypatch.setattr(sources, "MAX_IMAGE_BYTES", max(len(d) for _, d in members) - 1)
        return r"tar member 'n00000001_\d\.JPEG' is \d+ bytes, over the limit of \d+ bytes"
    _write_tar(path, members)
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        third = tar.getmembers()[2]
        last = tar.getmembers()[-1]
    if kind == "cut at a header":
        path.write_bytes(data[: third.offset])
        return rf"no end-of-archive block at byte {third.offset} .*cut short or damaged"
    if kind == "damaged header":
        path.write_bytes(data[: third.offset] + b"\x07" * 512 + data[third.offset + 512 :])
        return rf"no end-of-archive block at byte {third.offset} .*cut short or damaged"
    if kind == "cut inside a member":
        path.write_bytes(data[: last.offset_data + last.size - 10])
        return r"tar member 'n00000001_3\.JPEG' runs past the end of the file .*cut short"
    if kind == "compressed":
        path.write_bytes(gzip.compress(data))
        return r"unreadable tar file .* only uncompressed tar files can be read"
    raise ValueError(kind)


def test_one_tar_is_both_a_tar_per_wnid_and_a_shard(tmp_path):
    (tmp_path / "wnid").mkdir()
    (tmp_path / "shards").mkdir()
    _write_tar(tmp_path / "wnid" / f"{WNID}.tar", _members())
    shard = tmp_path / "shards" / "imagenet22k-train-0000.tar"
    shutil.copy(tmp_path / "wnid" / f"{WNID}.tar", shard)
    as_wnid = list_images(tmp_path / "wnid", [WNID])[WNID]
    as_shard, _ = list_copy(tmp_path / "shards")
    assert list(as_wnid) == list(as_shard[WNID]) == [f"{WNID}/{n}" for n, _ in _members()]
    assert [(s.offset, s.size) for s in as_wnid.values()] == [
        (s.offset, s.size) for s in as_shard[WNID].values()
    ]


@pytest.mark.parametrize(
    "kind",
    [
        "absolute name",
        "'..' in a name",
        "two members of one name",
        "sparse image",
        "image over the size limit",
        "cut at a header",
        "damaged header",
        "cut inside a member",
        "compressed",
    ],
)
def test_a_malformed_tar_is_refused_alike_as_a_tar_per_wnid_and_as_a_shard(
    tmp_path, monkeypatch, kind
):
    (tmp_path / "wnid").mkdir()
    (tmp_path / "shards").mkdir()
    tar = tmp_path / "wnid" / f"{WNID}.tar"
    reason = _damaged(kind, tar, monkeypatch)
    shard = tmp_path / "shards" / "imagenet22k-train-0000.tar"
    shutil.copy(tar, shard)
    with pytest.raises(ValueError, match=reason) as as_wnid:
        list_images(tmp_path / "wnid", [WNID])
    with pytest.raises(ValueError, match=reason) as as_shard:
        list_copy(tmp_path / "shards")
    # The same words, but for the file's name (and the wnid a tar per wnid is named by).
    said = [
        str(err.value).replace(str(path), "<tar>").removeprefix(f"{WNID}: ")
        for err, path in ((as_wnid, tar), (as_shard, shard))
    ]
    assert said[0] == said[1]
    assert re.search(reason, said[0])


# ------------------------------------------------------------ tars per wnid
@pytest.mark.parametrize("name", ["../evil.JPEG", "/abs/evil.JPEG", "n00000001/../../x.JPEG"])
def test_tar_members_with_unsafe_names_are_refused(tmp_path, name):
    with tarfile.open(tmp_path / "n00000001.tar", "w") as tar:
        info = tarfile.TarInfo(name)
        data = image_bytes("jpeg", 0)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="refusing tar member"):
        list_images(tmp_path, ["n00000001"])


def test_tar_with_wnid_prefix_and_compressed_tar(tmp_path):
    with tarfile.open(tmp_path / "n00000001.tar", "w") as tar:
        data = image_bytes("jpeg", 0)
        info = tarfile.TarInfo("n00000001/n00000001_5.JPEG")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert list(list_images(tmp_path, ["n00000001"])["n00000001"]) == ["n00000001/n00000001_5.JPEG"]
    with tarfile.open(tmp_path / "n00000002.tar", "w:gz") as tar:
        info = tarfile.TarInfo("n00000002_1.JPEG")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match=r"n00000002: unreadable tar file .*uncompressed"):
        list_images(tmp_path, ["n00000002"])


# ---------------------------------------------------------- damaged tar files
def _tar_of(path, members, **kw):
    """A tar of ``[(name, bytes)]``; returns the TarInfo objects as written."""
    infos = []
    with tarfile.open(path, "w", **kw) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            infos.append(info)
    return infos


def _five(wnid):
    return [(f"{wnid}_{i}.JPEG", image_bytes("jpeg", i)) for i in range(5)]


def test_a_tar_cut_at_a_header_is_refused_not_shortened(tmp_path):
    path = tmp_path / "n00000001.tar"
    _tar_of(path, _five("n00000001"))
    assert len(list_images(tmp_path, ["n00000001"])["n00000001"]) == 5
    with tarfile.open(path) as tar:
        cut = tar.getmembers()[3].offset
    data = path.read_bytes()
    # Cut exactly at a header, half-way through a header, and garbage in place of one.
    for damaged in (data[:cut], data[: cut + 200], data[:cut] + b"\x07" * 512 + data[cut + 512 :]):
        path.write_bytes(damaged)
        with pytest.raises(
            ValueError, match=r"n00000001\.tar: no end-of-archive block .*cut short"
        ):
            list_images(tmp_path, ["n00000001"])


def test_a_tar_cut_inside_the_last_member_is_refused(tmp_path):
    path = tmp_path / "n00000001.tar"
    infos = _tar_of(path, _five("n00000001"))
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    path.write_bytes(path.read_bytes()[: last.offset_data + infos[-1].size - 10])
    with pytest.raises(ValueError, match=r"n00000001_4\.JPEG' runs past the end of the file"):
        list_images(tmp_path, ["n00000001"])


def test_tar_members_giving_the_same_image_id_are_refused(tmp_path):
    data = image_bytes("jpeg", 0)
    _tar_of(tmp_path / "n00000001.tar", [("x.JPEG", data), ("n00000001/x.JPEG", data[:-1])])
    with pytest.raises(ValueError, match=r"'x\.JPEG' and 'n00000001/x\.JPEG' both give the image"):
        list_images(tmp_path, ["n00000001"])
    # Files under another folder keep it in their id: no clash.
    _tar_of(tmp_path / "n00000002.tar", [("x.JPEG", data), ("other/x.JPEG", data)])
    assert list(list_images(tmp_path, ["n00000002"])["n00000002"]) == [
        "n00000002/other/x.JPEG",
        "n00000002/x.JPEG",
    ]


def test_sparse_and_oversized_tar_members_are_refused(tmp_path, monkeypatch):
    with tarfile.open(tmp_path / "n00000001.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("n00000001_1.JPEG")
        info.type = tarfile.GNUTYPE_SPARSE
        info.size = 10
        tar.addfile(info, io.BytesIO(b"0123456789"))
    with pytest.raises(ValueError, match=r"n00000001\.tar: refusing GNU sparse tar member"):
        list_images(tmp_path, ["n00000001"])
    _tar_of(tmp_path / "n00000002.tar", _five("n00000002"))
    biggest = max(len(d) for _, d in _five("n00000002"))
    monkeypatch.setattr(sources, "MAX_IMAGE_BYTES", biggest - 1)
    with pytest.raises(
        ValueError,
        match=r"n00000002\.tar: tar member 'n00000002_\d\.JPEG' is \d+ "
        r"bytes, over the limit of",
    ):
        list_images(tmp_path, ["n00000002"])
    # A file in a folder over the limit is skipped and listed, not read.
    path = tmp_path / "big.JPEG"
    path.write_bytes(image_bytes("jpeg", 0))
    monkeypatch.setattr(sources, "MAX_IMAGE_BYTES", 10)
    _, image, reason = ImageDataset([str(path)])[0]
    assert image is None and "over the limit of 10 bytes" in reason


def test_tar_members_are_read_in_bounded_chunks(tmp_path, monkeypatch):
    files = _five("n00000001")
    _tar_of(tmp_path / "n00000001.tar", files)
    listing = list_images(tmp_path, ["n00000001"])["n00000001"]
    real_pread = os.pread
    # Linux returns at most 2 GiB - 4 KiB per pread: a short read is not an end of file.
    monkeypatch.setattr(sources.os, "pread", lambda fd, n, off: real_pread(fd, min(n, 100), off))
    ds = ImageDataset(list(listing.values()))
    for i, (_, data) in enumerate(files):
        assert ds.read_bytes(i) == data


# ------------------------------------------------------------ header data bounded
def _declaring(path, kind, size):
    """A sparse tar whose first header declares ``size`` bytes of ``kind`` data (holes on
    disk), then one image member and the end-of-archive blocks."""
    info = tarfile.TarInfo({"long name": "././@LongLink"}.get(kind, "PaxHeaders/x"))
    info.type = {
        "long name": tarfile.GNUTYPE_LONGNAME,
        "pax": tarfile.XHDTYPE,
        "global pax": tarfile.XGLTYPE,
    }[kind]
    info.size = size
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    image = tarfile.TarInfo(f"{WNID}_0.JPEG")
    data = image_bytes("jpeg", 0)
    image.size = len(data)
    after = image.tobuf(format=tarfile.USTAR_FORMAT) + data.ljust(-(-len(data) // 512) * 512, b"\0")
    with open(path, "wb") as f:
        f.write(header)
        f.seek(512 + -(-size // 512) * 512)
        f.write(after + bytes(1024))


@pytest.mark.parametrize("kind", ["long name", "pax", "global pax"])
def test_header_data_is_bounded_and_refused_in_one_line(tmp_path, capsys, kind):
    # Before: the declared data was read whole (a 6 GB name: a MemoryError traceback).
    from imagenet_cog import cli

    (tmp_path / "wds").mkdir()
    shard = tmp_path / "wds" / "imagenet22k-train-0000.tar"
    declared = 64 * 2**20
    _declaring(shard, kind, declared)
    assert cli.main(["data", str(tmp_path / "wds")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{shard}: a tar header at byte 0 declares {declared} bytes of {kind} data" in line
    from imagenet_cog._data.tar import MAX_HEADER_BYTES

    assert declared > MAX_HEADER_BYTES
    assert line == (
        f"imagenet-cog: error: {shard}: a tar header at byte 0 declares {declared} bytes of "
        f"{kind} data, over the limit of {MAX_HEADER_BYTES} bytes: the tar is damaged or not "
        "a copy of ImageNet"
    )
    # Within the limit it is read (here as tarfile reads it).
    _declaring(shard, kind, 4096)
    with tarfile.open(shard) as tar:
        expect = [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
    with open(shard, "rb") as f:
        assert [m[:3] for m in read_members(f, shard)] == expect
