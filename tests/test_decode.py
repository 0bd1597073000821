"""The tensor JPEG decoder (decoder="torchvision") against the Pillow path."""

import warnings

import numpy as np
import pytest
import torch
from imagefiles import image_bytes
from PIL import Image

from imagenet_cog import FeatureExtractor, Levels, extract
from imagenet_cog.store import open_store


def _photo(w, h, seed):
    """Smooth gradients plus noise: compresses like a photograph."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (w + h) + 60], axis=-1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """JPEGs at several sizes and aspect ratios (baseline and progressive), a
    grayscale JPEG, a CMYK JPEG, a PNG named .JPEG and two undecodable files."""
    root = tmp_path_factory.mktemp("photos") / "n00000001"
    root.mkdir()
    names = []
    sizes = [(500, 375), (375, 500), (640, 480), (300, 300), (800, 200), (227, 341)]
    for k, (w, h) in enumerate(sizes):
        name = f"n00000001_{k}.JPEG"
        Image.fromarray(_photo(w, h, k)).save(root / name, quality=85, progressive=k % 2 == 1)
        names.append(name)
    pixels = _photo(420, 310, 9)
    Image.fromarray(pixels[..., 1]).save(root / "n00000001_gray.JPEG", quality=90)
    Image.fromarray(pixels).convert("CMYK").save(root / "n00000001_cmyk.JPEG", quality=90)
    Image.fromarray(pixels).save(root / "n00000001_png.JPEG", "PNG")
    (root / "n00000001_trunc.JPEG").write_bytes(image_bytes("truncated", 1))
    (root / "n00000001_random.JPEG").write_bytes(image_bytes("random", 2))
    names += ["n00000001_gray.JPEG", "n00000001_cmyk.JPEG", "n00000001_png.JPEG"]
    return root, [str(root / n) for n in names]


def _features(decoder, paths, **params):
    ext = FeatureExtractor("torchvision:resnet18", decoder=decoder, batch_size=4, **params)
    return ext, ext.transform(paths)


def test_tensor_decoder_agrees_with_pillow_and_lists_its_fallbacks(photos):
    _, paths = photos
    _, expected = _features("pil", paths, device="cpu")
    with pytest.warns(UserWarning, match=r"2 image\(s\) were decoded with Pillow") as caught:
        ext, got = _features("torchvision", paths, device="cpu")
    assert "cmyk.JPEG (JPEG with 4 components" in str(caught[0].message)
    cosine = np.sum(expected * got, axis=1)
    assert cosine.min() >= 0.999, cosine
    fallbacks = {paths[i].rsplit("_", 1)[1]: why for i, why in ext.pillow_fallbacks_}
    assert fallbacks == {
        "cmyk.JPEG": "JPEG with 4 components (CMYK or YCCK)",
        "png.JPEG": "not a JPEG file",
    }
    assert ext.fingerprint()["decoder"] == "torchvision"
    assert "decoder" not in FeatureExtractor("torchvision:resnet18").fingerprint()  # auto on CPU


def test_tensor_decoder_skips_what_pillow_skips(photos):
    root, paths = photos
    bad = [str(root / "n00000001_trunc.JPEG"), str(root / "n00000001_random.JPEG")]
    mixed = paths[:3] + bad
    for decoder in ("pil", "torchvision"):
        with pytest.raises(ValueError, match=r"2 image\(s\) could not be read.*trunc"):
            _features(decoder, mixed, device="cpu", preprocessing={"size": 32})


def test_a_store_records_the_decoder_and_its_fallbacks(photos, tmp_path):
    root, _ = photos
    fallbacks, skipped = set(), set()
    for split in ("train", "test"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*decoded with Pillow")
            path = extract("torchvision:resnet18", root.parent, "L1", split, tmp_path,
                           Levels([["n00000001"]]), n_test=1, progress=False, device="cpu",
                           decoder="torchvision", preprocessing={"size": 32})  # fmt: skip
        store = open_store(path)
        assert store.key["decoder"] == "torchvision"
        assert store.manifest["execution"]["decoder"] == "torchvision"
        fallbacks |= {f["id"] for f in store.manifest["execution"]["pillow_fallbacks"]}
        skipped |= {s["id"] for s in store.skipped}
    assert fallbacks == {"n00000001/n00000001_cmyk.JPEG", "n00000001/n00000001_png.JPEG"}
    assert skipped == {"n00000001/n00000001_trunc.JPEG", "n00000001/n00000001_random.JPEG"}


def test_bad_decoder():
    with pytest.raises(ValueError, match="decoder must be one of"):
        FeatureExtractor("torchvision:resnet18", decoder="nvjpeg").fingerprint()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_decoder_agrees_with_pillow(photos):
    _, paths = photos
    _, expected = _features("pil", paths, device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*decoded with Pillow")
        ext, got = _features("auto", paths, device="cuda", num_workers=2)
    assert ext.fingerprint()["decoder"] == "torchvision"
    assert np.sum(expected * got, axis=1).min() >= 0.999
    assert {paths[i].rsplit("_", 1)[1] for i, _ in ext.pillow_fallbacks_} >= {
        "cmyk.JPEG",
        "png.JPEG",
    }
