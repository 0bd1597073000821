"""Image files whose data stops early: kept as the official code's loader keeps them, listed."""

import io
import warnings
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
import torch
from imagefiles import DECODABLE, UNDECODABLE, image_bytes
from PIL import Image, ImageFile

import imagenet_cog
from imagenet_cog import FeatureExtractor, Levels, extract
from imagenet_cog._data import tensor_decode as _decode
from imagenet_cog._data.pillow_decode import CUT_SHORT
from imagenet_cog.datasets import ImageDataset, decode_image
from imagenet_cog.store import open_store

PHOTO = Path(imagenet_cog.__file__).parent / "data" / "photos" / "grace_hopper.jpg"


def _jpegs():
    """A real photo's JPEG as shipped (baseline) and re-encoded as a progressive JPEG."""
    shipped = PHOTO.read_bytes()
    buf = io.BytesIO()
    Image.open(io.BytesIO(shipped)).save(buf, "JPEG", quality=80, progressive=True)
    return {"baseline": shipped, "progressive": buf.getvalue()}


def _zeroed(data, fraction):
    """``data`` with the entropy-coded data of its first scan zeroed from ``fraction`` on."""
    start = data.find(b"\xff\xda")
    start += 2 + int.from_bytes(data[start + 2 : start + 4], "big")
    out = bytearray(data)
    out[start + int((len(data) - start) * fraction) : -2] = bytes(
        len(out[start + int((len(data) - start) * fraction) : -2])
    )
    return bytes(out)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """One concept with whole, undecodable and cut files: ``(root, {name: bytes})``."""
    root = tmp_path_factory.mktemp("cut")
    files = {
        f"{kind}_{k}.JPEG": image_bytes(kind, seed=k)
        for k, kind in enumerate(DECODABLE + UNDECODABLE)
    }
    for name, data in _jpegs().items():
        n = len(data)
        files[f"{name}_whole.JPEG"] = data
        for cut in (4, 200, n // 4, n // 2, n - 100, n - 2):
            files[f"{name}_cut{cut}.JPEG"] = data[:cut]
        files[f"{name}_closed.JPEG"] = data[: n // 2] + b"\xff\xd9"
    files["baseline_zeroed.JPEG"] = _zeroed(_jpegs()["baseline"], 0.5)
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (128, 128, 128)).save(buf, "JPEG")
    files["grey_photo.JPEG"] = buf.getvalue()  # whole, and mid-grey to its last pixel
    (root / "n00000001").mkdir()
    for name, data in files.items():
        (root / "n00000001" / name).write_bytes(data)
    return root, files


def _official_loader(path):
    """The official code's image loading: torchvision's ImageFolder loader (PIL open, then
    ``convert("RGB")``) with ``ImageFile.LOAD_TRUNCATED_IMAGES = True``; None when it raises."""
    with patch.object(ImageFile, "LOAD_TRUNCATED_IMAGES", True):
        try:
            with open(path, "rb") as f:
                return Image.open(f).convert("RGB")
        except Exception:  # noqa: BLE001 - the official DataLoader would stop; we count it
            return None


def test_the_library_keeps_what_the_official_loader_keeps_with_the_same_pixels(tree):
    root, files = tree
    paths = [root / "n00000001" / name for name in sorted(files)]
    official = {p.name: _official_loader(p) for p in paths}
    kept_officially = {name for name, image in official.items() if image is not None}
    # Of 26 files: all but random bytes, an empty file and the four cut inside their header.
    assert len(files) == 26 and len(kept_officially) == 20
    assert set(files) - kept_officially == {"random_6.JPEG", "empty_7.JPEG"} | {
        f"{kind}_cut{n}.JPEG" for kind in ("baseline", "progressive") for n in (4, 200)
    }
    ds = ImageDataset([str(p) for p in paths], truncated="keep")
    kept, notes = set(), {}
    for i, path in enumerate(paths):
        _, image, note = ds[i]
        if image is None:
            continue
        kept.add(path.name)
        if note is not None:
            notes[path.name] = note
        np.testing.assert_array_equal(np.asarray(image), np.asarray(official[path.name]))
    assert kept == kept_officially
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False  # set for our decodes only
    # A baseline JPEG that lacks only its end-of-image marker holds every block: Pillow
    # decodes it whole (a progressive one, whose last scan is not closed, is truncated).
    whole = {f"baseline_cut{len(_jpegs()['baseline']) - 2}.JPEG"}
    cut = {n for n in kept if "_cut" in n or n.startswith("truncated")} - whole
    closed = {"baseline_closed.JPEG", "baseline_zeroed.JPEG"}
    assert set(notes) == cut | closed  # the grey photo and the progressive closed are not
    assert all(notes[n].startswith("OSError: image file is truncated") for n in cut)
    assert all(notes[n] == CUT_SHORT for n in closed)


def test_decode_image_raises_on_a_truncated_file_and_marks_a_closed_one(tree):
    _, files = tree
    cut = files["truncated_5.JPEG"]
    with pytest.raises(OSError, match="image file is truncated"):
        decode_image(cut)
    kept = decode_image(cut, truncated="keep")
    assert kept.mode == "RGB" and kept.info["truncated"].startswith("OSError: image file is")
    assert decode_image(files["baseline_closed.JPEG"]).info["truncated"] == CUT_SHORT
    assert "truncated" not in decode_image(files["grey_photo.JPEG"]).info
    assert "truncated" not in decode_image(files["baseline_whole.JPEG"]).info
    with pytest.raises(OSError, match="cannot identify"):
        decode_image(files["baseline_cut4.JPEG"], truncated="keep")
    with pytest.raises(ValueError, match="truncated must be one of"):
        decode_image(cut, truncated="yes")


def _lenient_decode(datas, device):
    """Decode as nvJPEG does, trusting the header: a cut file gives a partly grey image."""
    out = []
    for data in datas:
        with patch.object(ImageFile, "LOAD_TRUNCATED_IMAGES", True):
            image = Image.open(io.BytesIO(data.numpy().tobytes())).convert("RGB")
        out.append(torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).to(device))
    return out


def _store(root, out, **params):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*decoded with Pillow")
        path = extract(
            "torchvision:resnet18",
            root,
            "L1",
            "train",
            out,
            Levels([["n00000001"]]),
            n_test=1,
            progress=False,
            device="cpu",
            preprocessing={"size": 32},
            batch_size=8,
            **params,
        )
    return open_store(path)


def test_a_store_keeps_and_lists_cut_files_with_either_decoder(tree, tmp_path, monkeypatch):
    root, _ = tree
    store = _store(root, tmp_path / "pil")
    listed = {t["id"].split("/")[1]: t["note"] for t in store.manifest["truncated"]}
    assert "truncated_5.JPEG" in listed and listed["baseline_closed.JPEG"] == CUT_SHORT
    assert "truncated_5.JPEG" in {i.split("/")[1] for i in store.ids}
    assert {s["id"].split("/")[1] for s in store.skipped} <= {
        "random_6.JPEG",
        "empty_7.JPEG",
        "baseline_cut4.JPEG",
        "progressive_cut4.JPEG",
        "baseline_cut200.JPEG",
        "progressive_cut200.JPEG",
    }
    assert "truncated_images" not in store.key
    rows = (store.path / "rows.tsv").read_text()
    # The tensor decoder, on the CPU and as nvJPEG would (trusting the header), agrees.
    for name, lenient in (("cpu", False), ("gpu", True)):
        with monkeypatch.context() as m:
            if lenient:
                m.setattr(_decode, "_decode", _lenient_decode)
            other = _store(root, tmp_path / name, decoder="torchvision")
        assert (other.path / "rows.tsv").read_text() == rows
        assert other.manifest["truncated"] == store.manifest["truncated"]
        np.testing.assert_array_equal(np.asarray(other.features), np.asarray(store.features))
    # The former way, on demand: such files are skipped, and the key says so.
    strict = _store(root, tmp_path / "skip", truncated_images="skip")
    assert strict.key["truncated_images"] == "skip"
    assert "truncated_5.JPEG" in {s["id"].split("/")[1] for s in strict.skipped}
    assert {t["id"].split("/")[1] for t in strict.manifest["truncated"]} == {
        "baseline_closed.JPEG",
        "baseline_zeroed.JPEG",
    }


def test_bad_truncated_images_setting():
    with pytest.raises(ValueError, match="truncated_images must be one of"):
        FeatureExtractor("torchvision:resnet18", truncated_images="fill").fingerprint()


def test_cli_extract_says_how_many_truncated_files_it_kept(tree, tmp_path, capsys):
    from imagenet_cog.cli import main

    root, _ = tree
    Levels([["n00000001"]]).save(tmp_path / "levels")
    code = main(
        [
            "extract",
            "--model",
            "torchvision:resnet18:none",
            "--data",
            str(root),
            "--domain",
            "L1",
            "--split",
            "train",
            "--out",
            str(tmp_path / "f"),
            "--levels",
            str(tmp_path / "levels"),
            "--n-test",
            "1",
            "--preprocessing",
            '{"size": 32}',
            "--quiet",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    store = open_store(tmp_path / "f" / "L1" / "train")
    n = len(store.manifest["truncated"])
    assert n >= 10
    assert f"  {n} truncated file(s) kept, the missing part grey, as the official code" in out
