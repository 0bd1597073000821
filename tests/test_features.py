import pickle

import numpy as np
import pytest
import torch
from imagefiles import image_bytes
from PIL import Image
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from imagenet_cog import FeatureExtractor, load_model
from imagenet_cog._models.presets import CLIP_MEAN
from imagenet_cog.datasets import ImageDataset, Split
from imagenet_cog.features import MODEL_ZOO, weights_sha256

SMALL = {"size": 32}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Twelve small files: JPEG, PNG, CMYK JPEG, grayscale and palette PNG."""
    root = tmp_path_factory.mktemp("images")
    kinds = ["jpeg", "png", "cmyk", "gray", "palette", "jpeg"] * 2
    paths = []
    for i, kind in enumerate(kinds):
        path = root / f"img_{i}.{'JPEG' if kind in ('jpeg', 'cmyk') else 'png'}"
        path.write_bytes(image_bytes(kind, 200 + i))
        paths.append(str(path))
    return paths


def _direct(module, tensors, normalize=True):
    """The reference: a plain forward pass over the same preprocessed tensors."""
    with torch.no_grad():
        out = module(torch.stack(tensors)).flatten(1)
    if normalize:
        out = torch.nn.functional.normalize(out, dim=1)
    return out.numpy()


class Net(torch.nn.Module):
    """A small custom network with a classifier head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.trunk = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(),
        )
        self.head = torch.nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.trunk(x))


class OOMNet(torch.nn.Module):
    """Raises CUDA's out-of-memory error for batches above ``limit``, like a full GPU."""

    def __init__(self, limit=2):
        super().__init__()
        self.limit = limit
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.calls = []

    def forward(self, x):
        self.calls.append(len(x))
        if len(x) > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated: batch too large)")
        return self.conv(x).mean(dim=(2, 3))


# ---------------------------------------------------------- equal to direct
def test_resnet18_features_equal_a_direct_forward_pass(images):
    ext = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL, batch_size=5)
    X = ext.fit_transform(images)
    assert X.shape == (12, 512) and X.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1, rtol=1e-5)
    net = load_model("torchvision:resnet18")
    net.fc = torch.nn.Identity()
    t = ext.make_transform()
    tensors = [t(Image.open(p).convert("RGB")) for p in images]
    expected = np.concatenate([_direct(net, tensors[i : i + 5]) for i in range(0, 12, 5)])
    np.testing.assert_allclose(X, expected, rtol=1e-5, atol=1e-6)
    # avgpool's output is the classifier's input.
    avg = FeatureExtractor(
        "torchvision:resnet18", preprocessing=SMALL, layer="avgpool", batch_size=5
    )
    np.testing.assert_array_equal(avg.transform(images), X)
    assert avg.fingerprint()["layer"] == "output:avgpool"


def test_custom_module_features_equal_a_direct_forward_pass(images):
    net = Net()
    ext = FeatureExtractor(net, preprocessing={"size": 20, "mean": None, "std": None})
    X = ext.transform(images)
    assert ext.fingerprint()["layer"] == "input:head"
    assert ext.fingerprint()["model"] == f"module:{Net.__module__}.Net"
    t = ext.make_transform()
    tensors = [t(decode(p)) for p in images]
    np.testing.assert_allclose(X, _direct(net.trunk, tensors), rtol=1e-5, atol=1e-6)
    # The raw output, unnormalized.
    out = FeatureExtractor(net, preprocessing={"size": 20}, layer="output", normalize=False)
    t = out.make_transform()
    expected = _direct(net, [t(decode(p)) for p in images], normalize=False)
    np.testing.assert_allclose(out.transform(images), expected, rtol=1e-5, atol=1e-6)
    # The user's module is left without hooks.
    assert not net.head._forward_pre_hooks and not net._forward_hooks


def decode(path):
    from imagenet_cog.datasets import decode_image

    with open(path, "rb") as f:
        return decode_image(f.read())


def test_inputs_paths_pil_arrays_datasets_and_splits(images):
    ext = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL, batch_size=4)
    X = ext.transform(images)
    pil = [decode(p) for p in images]
    np.testing.assert_array_equal(ext.transform(pil), X)
    np.testing.assert_array_equal(ext.transform(np.array(images)), X)
    np.testing.assert_array_equal(ext.transform(ImageDataset(images)), X)

    class Foreign(torch.utils.data.Dataset):  # like torchvision's ImageFolder
        def __len__(self):
            return len(pil)

        def __getitem__(self, i):
            return pil[i], 0

    np.testing.assert_array_equal(ext.transform(Foreign()), X)
    split = Split([f"n1/{i}" for i in range(12)], ["n1"] * 12, sources=images)
    np.testing.assert_array_equal(ext.transform(split), X)
    # DataLoader workers give the same numbers.
    np.testing.assert_array_equal(clone(ext).set_params(num_workers=2).transform(images), X)
    with pytest.raises(TypeError, match="collection of images"):
        ext.transform(images[0])
    with pytest.raises(ValueError, match="no images"):
        ext.transform([])


def test_unreadable_images_raise_a_listing_error(images, tmp_path):
    bad = tmp_path / "bad.JPEG"
    bad.write_bytes(image_bytes("truncated", 0))
    ext = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL, truncated_images="skip")
    with pytest.raises(ValueError, match=r"1 image\(s\) could not be read: .*bad\.JPEG: OSError"):
        ext.transform([*images[:2], str(bad)])


# ----------------------------------------------------------- out of memory
def test_out_of_memory_halves_the_batch_and_goes_on(images):
    net = OOMNet(limit=2)
    ext = FeatureExtractor(net, preprocessing={"size": 16}, batch_size=8, layer="output")
    with pytest.warns(UserWarning, match="out of memory") as record:
        X = ext.transform(images)
    assert [str(w.message) for w in record] == [
        "out of memory with 8 images per forward pass; going on with 4",
        "out of memory with 4 images per forward pass; going on with 2",
    ]
    assert X.shape == (12, 4)
    assert net.calls[:3] == [8, 4, 2]  # 8 fails, 4 fails, then 2 at a time
    assert set(net.calls[3:]) == {2}
    ref = FeatureExtractor(
        OOMNet(limit=100), preprocessing={"size": 16}, batch_size=2, layer="output"
    )
    ref._load()["module"].load_state_dict(net.state_dict())
    np.testing.assert_allclose(X, ref.transform(images), rtol=1e-6)


def test_out_of_memory_with_one_image_is_raised(images):
    ext = FeatureExtractor(
        OOMNet(limit=0), preprocessing={"size": 16}, batch_size=2, layer="output"
    )
    with (
        pytest.warns(UserWarning, match="going on with 1"),
        pytest.raises(torch.cuda.OutOfMemoryError),
    ):
        ext.transform(images[:2])


# ------------------------------------------------- scikit-learn behaviour
def test_pickle_drops_the_network_and_clone_works(images):
    ext = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL)
    X = ext.transform(images[:3])
    blob = pickle.dumps(ext)
    assert len(blob) < 10_000  # resnet18 alone is 45 MB
    back = pickle.loads(blob)
    assert not hasattr(back, "_loaded")
    np.testing.assert_array_equal(back.transform(images[:3]), X)
    twin = clone(ext)
    assert twin.get_params() == ext.get_params() and not hasattr(twin, "_loaded")
    assert ext.fit(images) is ext
    assert ext.__sklearn_tags__().requires_fit is False


def test_pipeline_with_a_probe(images):
    y = np.array([0, 1] * 6)
    pipe = make_pipeline(
        FeatureExtractor("torchvision:resnet18", preprocessing=SMALL),
        LogisticRegression(C=100, max_iter=500),
    )
    pipe.fit(images, y)
    assert pipe.score(images, y) == 1.0


def test_set_params_reloads(images):
    ext = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL)
    a = ext.fingerprint()
    ext.set_params(preprocessing={"size": 24}, normalize=False)
    b = ext.fingerprint()
    assert b["preprocessing"]["crop"] == 24 and not b["normalize"]
    assert a["weights_sha256"] == b["weights_sha256"]
    assert ext.transform(images[:2]).shape == (2, 512)


# ------------------------------------------------------ options and errors
def test_amp_and_channels_last_on_cpu(images):
    base = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL)
    X = base.transform(images)
    bf16 = clone(base).set_params(amp=True)
    assert bf16.fingerprint()["amp"] == "bf16"
    Xb = bf16.transform(images)
    assert Xb.dtype == np.float32
    assert np.min(np.sum(X * Xb, axis=1)) > 0.95  # cosine similarity
    cl = clone(base).set_params(channels_last=True)
    np.testing.assert_allclose(cl.transform(images), X, rtol=1e-4, atol=1e-5)
    assert "channels_last" not in cl.fingerprint()


def test_fingerprint_tracks_what_shapes_features():
    base = FeatureExtractor("torchvision:resnet18").fingerprint()
    assert base == {
        "model": "torchvision:resnet18",
        "weights_sha256": weights_sha256(load_model("torchvision:resnet18")),
        "layer": "input:fc",
        "preprocessing": {
            "resize": 224,
            "crop": 224,
            "interpolation": "bicubic",
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
        },
        "normalize": True,
        "amp": "off",
        "dtype": "float32",
    }
    clip = FeatureExtractor("torchvision:resnet50", preprocessing="clip").fingerprint()
    assert clip["preprocessing"]["mean"] == list(CLIP_MEAN)
    simclr = FeatureExtractor("torchvision:resnet50", preprocessing="simclr_v2").fingerprint()
    assert simclr["preprocessing"]["mean"] is None and simclr["preprocessing"]["std"] is None
    assert clip["weights_sha256"] == simclr["weights_sha256"]


@pytest.mark.parametrize(
    ("key", "size"),
    [
        ("resnet50", 224),
        ("inception_v3", 299),
        ("efficientnet_b1", 240),
        ("efficientnet_b4", 380),
        ("deit_b_distilled_384", 384),
        ("vgg19", 224),
    ],
)
def test_presets_follow_the_paper(key, size):
    row = MODEL_ZOO[key]
    assert row["size"] == size
    if row["spec"].startswith("torchvision:"):
        spec = row["spec"].rsplit(":", 1)[0]  # the architecture, random weights
        p = FeatureExtractor(spec).get_preprocessing()
        assert (p["resize"], p["crop"], p["interpolation"]) == (size, size, "bicubic")


@pytest.mark.parametrize(
    ("arch", "dim"),
    [
        ("resnet50", 2048),
        ("resnet152", 2048),
        ("vgg19", 4096),
        ("inception_v3", 2048),
        ("efficientnet_b1", 1280),
        ("efficientnet_b4", 1792),
    ],
)
def test_penultimate_widths_match_the_paper(arch, dim):
    assert MODEL_ZOO[arch]["dim"] == dim
    ext = FeatureExtractor(f"torchvision:{arch}", preprocessing={"size": 80})
    X = ext.transform([Image.new("RGB", (90, 80), "blue")])
    assert X.shape == (1, dim)


def test_weights_files_with_prefixes(tmp_path):
    net = load_model("torchvision:resnet18")
    state = {f"module.backbone.{k}": v for k, v in net.state_dict().items() if "fc." not in k}
    state["module.projector.weight"] = torch.zeros(3)  # extra keys are ignored
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "ssl.pth")
    with torch.no_grad():
        for p in net.fc.parameters():
            p.zero_()
    loaded = load_model(f"torchvision:resnet18:{tmp_path / 'ssl.pth'}")
    for k, v in net.state_dict().items():
        if not k.startswith("fc."):
            torch.testing.assert_close(loaded.state_dict()[k], v)
    del state["module.backbone.layer4.1.bn2.weight"]
    torch.save(state, tmp_path / "partial.pth")
    with pytest.raises(ValueError, match=r"1 weights of the network are missing.*layer4\.1\.bn2"):
        load_model(f"torchvision:resnet18:{tmp_path / 'partial.pth'}")
    with pytest.raises(FileNotFoundError, match="no weights file"):
        load_model(f"torchvision:resnet18:{tmp_path / 'none.pth'}")


def test_bad_specs_and_parameters():
    with pytest.raises(ValueError, match="bad model spec"):
        load_model("resnet50")
    with pytest.raises(ValueError, match="torchvision has no model 'resnet51'"):
        load_model("torchvision:resnet51")
    with pytest.raises(ValueError, match=r"unknown weights 'IMAGENET' .*IMAGENET1K_V1"):
        load_model("torchvision:resnet18:IMAGENET")
    with pytest.raises(ValueError, match="no module named 'layer9'"):
        FeatureExtractor("torchvision:resnet18", layer="layer9").fingerprint()
    with pytest.raises(ValueError, match="batch_size"):
        FeatureExtractor("torchvision:resnet18", batch_size=0).fingerprint()
    with pytest.raises(ValueError, match="amp"):
        FeatureExtractor("torchvision:resnet18", amp="fp8").fingerprint()
    with pytest.raises(ValueError, match="unknown preprocessing 'foo'"):
        FeatureExtractor("torchvision:resnet18", preprocessing="foo").fingerprint()
    with pytest.raises(ValueError, match="unknown preprocessing keys"):
        FeatureExtractor("torchvision:resnet18", preprocessing={"scale": 2}).fingerprint()
    with pytest.raises(TypeError, match=r"spec string or an nn\.Module"):
        FeatureExtractor(42).fingerprint()


def test_layer_maps_of_intermediate_modules(images):
    ext = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL, layer="layer3")
    assert ext.transform(images[:2]).shape == (2, 256 * 2 * 2)
    vgg = FeatureExtractor("torchvision:vgg11", preprocessing=SMALL)
    assert vgg.fingerprint()["layer"] == "input:classifier.6"


# ---------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(images):
    cpu = FeatureExtractor("torchvision:resnet18", preprocessing=SMALL, device="cpu")
    # Pillow on both sides: the network on CUDA against the CPU's, from the same pixels (these
    # tiny noise JPEGs are where nvJPEG's upsampling differs most; the tensor decoder has its
    # own test on real photos, test_data_decode's test_gpu_decoder_agrees_with_pillow).
    gpu = clone(cpu).set_params(
        device="cuda", num_workers=2, channels_last=True, decoder="pil", resize="pil"
    )
    np.testing.assert_allclose(gpu.transform(images), cpu.transform(images), atol=1e-3)
    half = clone(gpu).set_params(amp=True)
    assert half.fingerprint()["amp"] == "fp16"
    assert np.min(np.sum(half.transform(images) * cpu.transform(images), axis=1)) > 0.99


# ------------------------------------------------------------ offline weights
@pytest.fixture
def offline(monkeypatch, tmp_path):
    """An empty torch cache and a download that fails like one without internet."""
    import urllib.error

    import torch.hub

    def no_network(url, *args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    return tmp_path / "torch_home" / "hub" / "checkpoints"


def test_offline_weights_raise_one_clear_error(offline, tmp_path):
    from imagenet_cog import WeightsUnavailableError

    with pytest.raises(WeightsUnavailableError) as caught:
        load_model("torchvision:resnet18:IMAGENET1K_V1")
    message = str(caught.value)
    assert isinstance(caught.value, OSError)
    assert "could not be downloaded" in message and "URLError" in message
    assert str(offline) in message and "resnet18-f37072fd.pth" in message
    assert "torchvision:resnet18:/path/to/resnet18-f37072fd.pth" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    # The file the message names, put where it says, is used without a download.
    state = load_model("torchvision:resnet18").state_dict()
    offline.mkdir(parents=True, exist_ok=True)
    torch.save(state, offline / "resnet18-f37072fd.pth")
    cached = load_model("torchvision:resnet18:IMAGENET1K_V1")
    assert weights_sha256(cached) == weights_sha256(load_model("torchvision:resnet18"))
    # And as a local checkpoint in the spec, as the message suggests.
    torch.save(state, tmp_path / "resnet18-f37072fd.pth")
    local = load_model(f"torchvision:resnet18:{tmp_path / 'resnet18-f37072fd.pth'}")
    assert weights_sha256(local) == weights_sha256(load_model("torchvision:resnet18"))


def test_cli_extract_offline_prints_one_line(offline, tmp_path, capsys):
    from imagenet_cog.cli import main

    code = main(
        [
            "extract",
            "--model",
            "torchvision:resnet18:IMAGENET1K_V1",
            "--data",
            str(tmp_path / "no_data"),
            "--domain",
            "L1",
            "--out",
            str(tmp_path / "f"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "could not be downloaded" in err and "resnet18-f37072fd.pth" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_without_cuda_is_a_clear_error(images):
    ext = FeatureExtractor(Net(), preprocessing={"size": 20}, device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        ext.transform(images[:1])
