"""The worker path (decoder="pil"): the workers decode, resize and crop; uint8 batches travel;
the resize and TF32 are options recorded in a store's key."""

import io
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import imagenet_cog
from imagenet_cog import FeatureExtractor, Levels, extract
from imagenet_cog._comparability import RESIZE_CAVEAT
from imagenet_cog._data import worker_images
from imagenet_cog._data.network_inputs import NetworkInputs
from imagenet_cog._features.settings import network_precision
from imagenet_cog.datasets import ImageDataset, decode_image, make_split
from imagenet_cog.store import StoreMismatchError, build_store, open_store

SHIPPED = Path(imagenet_cog.__file__).parent / "data" / "photos"


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """JPEGs cut from the shipped photos at ImageNet's sizes (baseline, progressive, 4:4:4,
    grayscale), a CMYK JPEG and a PNG named .JPEG, in one concept folder."""
    root = tmp_path_factory.mktemp("worker") / "n00000001"
    root.mkdir()
    rng = np.random.default_rng(0)
    sources = [Image.open(p).convert("RGB") for p in sorted(SHIPPED.glob("*.jpg"))]
    paths = []
    for k in range(12):
        source = sources[k % len(sources)]
        w, h = [(500, 375), (375, 500), (333, 500), (500, 333)][k % 4]
        scale = rng.uniform(1.0, 1.4)
        image = source.resize((int(source.width * scale), int(source.height * scale)))
        image = image.crop((0, 0, min(w, image.width), min(h, image.height))).resize((w, h))
        if k == 5:
            image = image.convert("L")
        paths.append(root / f"n00000001_{k}.JPEG")
        options = {"progressive": k % 3 == 1, "subsampling": 0 if k % 4 == 2 else 2}
        image.save(paths[-1], quality=int(rng.integers(75, 96)), **options)
    sources[0].convert("CMYK").save(root / "n00000001_cmyk.JPEG")
    buf = io.BytesIO()
    sources[1].save(buf, "PNG")
    (root / "n00000001_png.JPEG").write_bytes(buf.getvalue())
    paths += [root / "n00000001_cmyk.JPEG", root / "n00000001_png.JPEG"]
    return root, [str(p) for p in paths]


def _inputs(paths, resize, preprocessing=None, batch=5):
    """Every image's network input through the worker path, and the uint8 batches."""
    p = FeatureExtractor("torchvision:resnet18:none", preprocessing=preprocessing)
    inputs = NetworkInputs(
        ImageDataset(paths),
        p.get_preprocessing(),
        decoder="pil",
        resize=resize,
        truncated="keep",
        device=torch.device("cpu"),
        workers=0,
        reference_transform=p.make_transform(),
    )
    batches = [list(range(i, min(i + batch, len(paths)))) for i in range(0, len(paths), batch)]
    raw = [b[1] for b in inputs._loader(batches, by_file=False)]
    x = torch.cat([x for _, x, *_ in inputs.batches(batches)])
    return x, raw, p


def test_pillows_resize_gives_the_pillow_transforms_input_bit_for_bit(photos):
    _, paths = photos
    x, raw, p = _inputs(paths, "pil")
    transform = p.make_transform()  # the Pillow path: float32 crops from the workers
    expected = torch.stack([transform(decode_image(Path(q).read_bytes())) for q in paths])
    assert torch.equal(x, expected)
    # What travels from the workers: one uint8 tensor per batch, a quarter of float32's bytes.
    assert all(b.dtype == torch.uint8 and b.shape[1:] == (3, 224, 224) for b in raw)


def test_torchs_resize_is_within_two_levels_of_pillows(photos):
    _, paths = photos
    pil, _, _ = _inputs(paths, "pil", {"size": 224, "mean": None, "std": None})
    fast, raw, _ = _inputs(paths, "torch", {"size": 224, "mean": None, "std": None})
    levels = (255 * (pil - fast)).abs()
    assert levels.max() <= 2 and levels.mean() < 0.02
    assert levels.max() > 0  # another resize, not Pillow's
    assert all(b.dtype == torch.uint8 for b in raw)


def test_the_resize_is_an_option_recorded_in_the_key(monkeypatch):
    base = FeatureExtractor("torchvision:resnet18")
    # The default on the CPU: Pillow's resize, and the key of every store made before.
    assert base._resize_name(torch.device("cpu")) == "pil"
    assert "resize" not in base.fingerprint() and "tf32" not in base.fingerprint()
    assert FeatureExtractor("torchvision:resnet18", resize="torch").fingerprint()["resize"] == (
        "torch"
    )
    assert base._resize_name(torch.device("cuda")) == "torch"  # where the workers limit
    assert FeatureExtractor("torchvision:resnet18", decoder="torchvision")._resize_name(
        torch.device("cuda")
    ) == ("pil")  # the tensor path resizes as Pillow
    with pytest.raises(ValueError, match="resize must be one of"):
        FeatureExtractor("torchvision:resnet18", resize="lanczos").fingerprint()
    with pytest.raises(ValueError, match="resize='torch' is the worker path's"):
        FeatureExtractor(
            "torchvision:resnet18", decoder="torchvision", resize="torch"
        ).fingerprint()


def test_a_jpeg_decoder_that_differs_from_pillow_leaves_the_jpegs_to_pillow(photos, monkeypatch):
    _, paths = photos
    expected = FeatureExtractor("torchvision:resnet18:none", resize="pil").transform(paths)
    real = worker_images.decode_jpeg_cpu
    monkeypatch.setattr(worker_images, "decode_jpeg_cpu", lambda data: real(data) // 2 * 2)
    ext = FeatureExtractor("torchvision:resnet18:none", resize="pil")
    with pytest.warns(UserWarning, match=r"decode_jpeg gives other pixels than Pillow here"):
        got = ext.transform(paths)
    np.testing.assert_array_equal(got, expected)
    assert ext.jpeg_check_["workers_decode_jpegs_with"] == "Pillow"
    assert ext.jpeg_check_["images"] == 8 and ext.jpeg_check_["max_abs_diff"] == 1


def test_the_workers_default_to_the_cores_less_one_on_a_gpu(monkeypatch):
    ext = FeatureExtractor("torchvision:resnet18")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert ext._workers(torch.device("cuda")) == 15
    assert ext._workers(torch.device("cpu")) == 0  # the network takes the cores there
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 processes share 16 cores
    assert ext._workers(torch.device("cuda")) == 3
    assert (
        FeatureExtractor("torchvision:resnet18", num_workers=2)._workers(torch.device("cuda")) == 2
    )


# --------------------------------------------------------------- with real weights
@pytest.mark.slow
def test_with_real_weights_torchs_resize_keeps_the_features_and_the_classes(photos):
    from real_weights import efficientnet_lite0, mobilenet_v2

    _, paths = photos
    imagenet = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    for build, norm, head in (
        (mobilenet_v2, imagenet, lambda net: net.classifier[1]),
        (efficientnet_lite0, {"mean": [0.5] * 3, "std": [0.5] * 3}, lambda net: net.classifier),
    ):
        net = build()
        ext = FeatureExtractor(net, preprocessing={"size": 224, **norm}, normalize=False)
        pil = ext.set_params(resize="pil").transform(paths)
        fast = ext.set_params(resize="torch").transform(paths)
        cosine = (
            np.sum(pil * fast, axis=1) / np.linalg.norm(pil, axis=1) / np.linalg.norm(fast, axis=1)
        )
        assert cosine.min() >= 0.9999, (build.__name__, cosine.min())
        with torch.inference_mode():
            classes = [head(net)(torch.from_numpy(f)).argmax(1) for f in (pil, fast)]
        assert torch.equal(*classes), build.__name__


# ------------------------------------------------------------------------- stores
def _store(root, out, **params):
    split = make_split(root, "L1", "train", Levels([["n00000001"]]), n_test=1)
    extractor = FeatureExtractor(
        "torchvision:resnet18:none",
        device="cpu",
        preprocessing={"size": 32},
        batch_size=4,
        progress=False,
        **params,
    )
    return open_store(build_store(out, extractor, split, shard_size=4, progress=False))


def test_a_store_records_its_resize_and_goes_on_with_it(photos, tmp_path, monkeypatch):
    root = photos[0].parent
    exact = _store(root, tmp_path / "exact")  # "auto" on the CPU: Pillow's resize
    assert "resize" not in exact.key
    assert exact.manifest["execution"]["resize"] == "pil"
    assert exact.manifest["execution"]["jpeg_decoder_check"]["workers_decode_jpegs_with"] == (
        "torchvision.io"
    )
    fast = _store(root, tmp_path / "fast", resize="torch")
    assert fast.key["resize"] == "torch" and fast.manifest["execution"]["resize"] == "torch"
    # On a GPU "auto" picks torch's resize: a store started with Pillow's goes on with it,
    # and an explicit other resize is refused.
    real = FeatureExtractor._resize_name
    monkeypatch.setattr(
        FeatureExtractor,
        "_resize_name",
        lambda self, device: real(self, torch.device("cuda")),
    )
    with pytest.warns(UserWarning, match=r"started with the 'pil' resize: going on with it"):
        again = _store(root, tmp_path / "exact")
    assert again.key == exact.key
    with pytest.raises(StoreMismatchError, match="resize"):
        _store(root, tmp_path / "exact", resize="torch")


def test_extract_all_reuses_a_store_made_with_either_resize_under_auto(photos, tmp_path):
    from imagenet_cog import extract_all

    root = photos[0].parent
    kwargs = {
        "levels": Levels([["n00000001"]]),
        "domains": ["L1"],
        "splits": ["train"],
        "n_test": 1,
        "progress": False,
        "device": "cpu",
        "preprocessing": {"size": 32},
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*decoded with Pillow")
        extract_all(
            "torchvision:resnet18:none", {"in21k": root}, tmp_path, resize="torch", **kwargs
        )
        manifest = (tmp_path / "L1" / "train" / "manifest.json").read_bytes()
        extract_all("torchvision:resnet18:none", {"in21k": root}, tmp_path, **kwargs)
        assert (tmp_path / "L1" / "train" / "manifest.json").read_bytes() == manifest  # reused
        with pytest.raises(StoreMismatchError, match="resize"):
            extract_all(
                "torchvision:resnet18:none",
                {"in21k": root},
                tmp_path,
                resize="pil",
                **kwargs,
            )


# --------------------------------------------------------------------------- TF32
def test_tf32_is_off_unless_asked_and_is_recorded():
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    before = (conv.fp32_precision, matmul.fp32_precision)
    cuda = torch.device("cuda")  # the settings are the host's: no GPU needed to see them
    with network_precision(cuda, False):
        assert (conv.fp32_precision, matmul.fp32_precision) == ("ieee", "ieee")
    with network_precision(cuda, True):
        assert (conv.fp32_precision, matmul.fp32_precision) == ("tf32", "tf32")
    assert (conv.fp32_precision, matmul.fp32_precision) == before
    with network_precision(torch.device("cpu"), True):  # nothing to set on the CPU
        assert (conv.fp32_precision, matmul.fp32_precision) == before
    assert FeatureExtractor("torchvision:resnet18", tf32=True).fingerprint()["tf32"] is True
    with pytest.raises(ValueError, match="tf32 must be True or False"):
        FeatureExtractor("torchvision:resnet18", tf32="yes").fingerprint()


def test_the_cli_passes_the_resize_and_tf32(monkeypatch, tmp_path):
    from imagenet_cog import cli

    seen = {}

    def fake_extract_all(extractor, data, out, levels, **kwargs):
        seen.update(resize=extractor.resize, tf32=extractor.tf32)
        raise SystemExit(0)

    monkeypatch.setattr("imagenet_cog._extract_all.extract_all", fake_extract_all)
    monkeypatch.setattr(FeatureExtractor, "fingerprint", lambda self: {})
    with pytest.raises(SystemExit):
        cli.main(
            [
                "extract",
                "torchvision:resnet18",
                "--in1k",
                str(tmp_path),
                "--out",
                str(tmp_path / "f"),
                "--resize",
                "torch",
                "--tf32",
            ]
        )
    assert seen == {"resize": "torch", "tf32": True}


# ------------------------------------------------------------------- comparability
def test_the_verdict_notes_torchs_resize_and_refuses_tf32():
    from official_run import paper_like

    from imagenet_cog.results import comparability

    found = comparability(paper_like(ext_resize="torch"), by_model=True)["mine"]
    assert found["deviations"] == [] and RESIZE_CAVEAT in found["caveats"]
    assert "measured" in RESIZE_CAVEAT
    found = comparability(paper_like(ext_tf32=True), by_model=True)["mine"]
    assert found["deviations"] == [
        "extracted with TF32 convolutions and products (tf32=True) instead of float32"
    ]


def test_extract_takes_the_new_options(photos, tmp_path):
    path = extract(
        "torchvision:resnet18:none",
        photos[0].parent,
        "L1",
        "test",
        tmp_path,
        Levels([["n00000001"]]),
        n_test=2,
        progress=False,
        device="cpu",
        preprocessing={"size": 32},
        resize="torch",
        tf32=True,
    )
    key = open_store(path).key
    assert key["resize"] == "torch" and key["tf32"] is True
