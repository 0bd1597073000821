"""Checks of the features themselves, whatever the network's source: finite, not alike; the
record of a network given as a module; inputs outside the paper's sizes."""

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from altered_networks import crops_of_one_photo, fold_batchnorm, norm_init_altered, one_sgd_step
from helpers import needs
from imagefiles import plain_concepts, write_concepts
from official_run import paper_like
from real_weights import efficientnet_lite0, mobilenet_v2

import imagenet_cog
from imagenet_cog import FeatureExtractor, Levels, comparability, extract
from imagenet_cog.features import NEAR_IDENTICAL_COSINE, weights_sha256
from imagenet_cog.store import open_store

PHOTOS = sorted(str(p) for p in (Path(imagenet_cog.__file__).parent / "data" / "photos").glob("*"))
WNIDS = ["n00000001", "n00000002"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_concepts(root, plain_concepts(WNIDS, 4))
    return root


def _extract(model, data, out, **params):
    return extract(
        model,
        data,
        "L1",
        "train",
        out,
        Levels([WNIDS]),
        n_test=1,
        progress=False,
        device="cpu",
        **{"preprocessing": {"size": 32}, **params},
    )


def _nan_resnet():
    torch.manual_seed(0)
    net = torchvision.models.resnet18()
    with torch.no_grad():
        net.conv1.weight[0, 0, 0, 0] = float("nan")
    return net


# -------------------------------------------------------------- non-finite
def test_nan_weights_stop_the_extraction_in_one_line_naming_the_model(data, tmp_path):
    with pytest.raises(ValueError) as caught:
        _extract(_nan_resnet(), data, tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "module:torchvision.models.resnet.ResNet gives non-finite features "
        "(NaN or infinity) for 6 of the first 6 images"
    )
    assert not (tmp_path / "L1" / "train" / "manifest.json").exists()
    file = tmp_path / "nan.pth"
    torch.save(_nan_resnet().state_dict(), file)
    spec = f"torchvision:resnet18:{file}"
    with pytest.raises(ValueError, match=rf"^{spec} gives non-finite features"):
        FeatureExtractor(spec, preprocessing={"size": 32}).transform(PHOTOS)


def test_cli_extract_with_nan_weights_fails_in_one_line(data, tmp_path, capsys):
    from imagenet_cog.cli import main

    file = tmp_path / "nan.pth"
    torch.save(_nan_resnet().state_dict(), file)
    Levels([WNIDS]).save(tmp_path / "levels")
    code = main(
        [
            "extract",
            "--model",
            f"torchvision:resnet18:{file}",
            "--data",
            str(data),
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
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("imagenet-cog: error: torchvision:resnet18:")
    assert "gives non-finite features" in err[0]


# -------------------------------------------------------------- non-finite, later
class _NanForBright(torch.nn.Module):
    """A network whose features are NaN for bright images only: the first batch passes."""

    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(2)

    def forward(self, x):
        out = self.pool(x).flatten(1)
        bright = x.mean(dim=(1, 2, 3)) > 0.5
        return torch.where(bright[:, None], torch.full_like(out, float("nan")), out)


def test_a_nan_for_an_image_of_a_later_batch_stops_the_extraction_naming_it(tmp_path):
    from PIL import Image

    root = tmp_path / "data"
    for wnid in WNIDS:  # the first concept's images dark, the second's bright
        (root / wnid).mkdir(parents=True)
        for i in range(4):
            grey = 250 if wnid == WNIDS[1] else 10 + 5 * i
            Image.new("RGB", (24, 24), (grey, grey, grey)).save(root / wnid / f"x{i}.JPEG")
    # Three training images per concept, two per batch: the first batch is dark, the second
    # holds the first bright image.
    with pytest.raises(ValueError) as caught:
        _extract(
            _NanForBright(), root, tmp_path / "f", batch_size=2, preprocessing=None, layer="output"
        )
    assert re.fullmatch(
        r"module:\S+\._NanForBright gives non-finite features \(NaN or infinity\) for 1 of "
        r"the 2 images of a batch \(the first: n00000002/x\d\.JPEG\): its weights are broken "
        r"\(or overflow in this precision\); nothing of the batch is stored",
        str(caught.value),
    )
    assert not (tmp_path / "f" / "L1" / "train" / "manifest.json").exists()


# ------------------------------------------------------- untrained networks
def test_a_random_module_is_said_untrained_and_recorded(data, tmp_path, caplog):
    torch.manual_seed(0)
    net = torchvision.models.resnet18()
    with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
        path = _extract(net, data, tmp_path, preprocessing={"size": 224})
    said = [r.getMessage() for r in caplog.records if r.name == "imagenet_cog"]
    assert len(said) == 1
    assert re.fullmatch(
        r"imagenet_cog: module:torchvision\.models\.resnet\.ResNet looks untrained, as a "
        r"randomly initialised network does: 21 of the network's 21 weight tensors are spread "
        r"as drawn at initialisation \(median spread ratio 1\.\d\d; a trained network's is "
        r"many times 1\); 20 of the network's 20 normalization layers hold the values they "
        r"were built with \(scale constant, shift zero\)\. Check its weights: its results "
        r"are not comparable with the paper's",
        said[0],
    )
    store = open_store(path)
    check = store.manifest["execution"]["feature_check"]
    assert check["images"] == 6 and check["nearly_identical"] is True and check["untrained"]
    assert check["mean_cosine"] > NEAR_IDENTICAL_COSINE
    assert (check["normalization_layers"], check["normalization_at_init"]) == (20, 20)
    # The module is recorded by its class and the checksum of its state dict.
    assert store.key["model"] == "module:torchvision.models.resnet.ResNet"
    assert store.key["weights_sha256"] == weights_sha256(net)


def _timm(name):
    timm = needs("timm")
    return timm.create_model(name, num_classes=0)


def _open_clip_visual():
    open_clip = needs("open_clip")
    return open_clip.create_model("ViT-B-32").visual


def _hf_dinov2(folder):
    """An ``hf:`` folder whose weights were saved as built: random, read as trained."""
    transformers = needs("transformers")
    config = transformers.Dinov2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=16
    )
    transformers.Dinov2Model(config).save_pretrained(folder)
    processor = {
        "image_processor_type": "BitImageProcessor",
        "size": {"shortest_edge": 224},
        "crop_size": {"height": 224, "width": 224},
        "do_center_crop": True,
        "resample": 3,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return f"hf:{folder}"


#: Random networks of every family of the model zoo whose features a LayerNorm centres (or
#: whose random features differ anyway): the mean cosine does not see them.
RANDOM = {
    "torchvision ViT-B/16": lambda _: torchvision.models.vit_b_16(),
    "torchvision Swin-T": lambda _: torchvision.models.swin_t(),
    "torchvision ConvNeXt-T": lambda _: torchvision.models.convnext_tiny(),
    "torchvision EfficientNet-B0": lambda _: torchvision.models.efficientnet_b0(),
    "timm ViT-Ti/16": lambda _: _timm("vit_tiny_patch16_224"),
    "timm ConvNeXt-atto": lambda _: _timm("convnext_atto"),
    "OpenCLIP ViT-B-32": lambda _: _open_clip_visual(),
    "Hugging Face DINOv2": _hf_dinov2,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RANDOM))
def test_random_networks_of_every_family_are_caught_whatever_the_batch_size(name, tmp_path):
    torch.manual_seed(0)
    net = RANDOM[name](tmp_path / "model")
    for batch_size in (1, 4):
        ext = FeatureExtractor(net, batch_size=batch_size, device="cpu")
        ext.transform(PHOTOS)
        check = ext.feature_check_
        assert check["images"] == 4 and check["untrained"], (name, batch_size, check)
        assert check["normalization_at_init"] == check["normalization_layers"] > 0
        assert check["weight_tensors_at_init"] == check["weight_tensors"] > 0


def test_a_random_network_is_said_untrained_by_the_command_line(data, tmp_path, caplog):
    """Through extract, one image per batch: a random ViT's checkpoint, taken for trained."""
    from imagenet_cog.cli import main

    torch.manual_seed(0)
    file = tmp_path / "vit.pth"
    torch.save(_timm("vit_tiny_patch16_224").state_dict(), file)
    Levels([WNIDS]).save(tmp_path / "levels")
    args = ["extract", "--model", f"timm:vit_tiny_patch16_224:{file}", "--data", str(data)]
    args += ["--domain", "L1", "--split", "train", "--out", str(tmp_path / "f")]
    args += ["--levels", str(tmp_path / "levels"), "--n-test", "1", "--batch-size", "1"]
    with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
        assert main([*args, "--quiet"]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "imagenet_cog"]
    assert len(said) == 1
    assert re.fullmatch(
        f"imagenet_cog: timm:vit_tiny_patch16_224:{re.escape(str(file))} looks untrained, as a "
        r"randomly initialised network does: (\d+) of the network's \1 weight tensors are "
        r"spread as drawn at initialisation \(median spread ratio 1\.\d\d; a trained "
        r"network's is many times 1\); 25 of the network's 25 normalization layers hold the "
        r"values they were built with \(scale constant, shift zero\)\. Check its weights: its "
        r"results are not comparable with the paper's",
        said[0],
    )


@pytest.mark.parametrize("network", ["MobileNetV2", "EfficientNet-Lite0"])
def test_trained_networks_are_not_flagged_whatever_the_batch_size(network, caplog):
    net = {"MobileNetV2": mobilenet_v2, "EfficientNet-Lite0": efficientnet_lite0}[network]()
    for batch_size in (1, 4):
        ext = FeatureExtractor(net, device="cpu", batch_size=batch_size)
        with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
            ext.transform(PHOTOS)
        assert not [r for r in caplog.records if r.name == "imagenet_cog"]
        check = ext.feature_check_
        # Four photos, one the grayscale copy of another; measured on 17 photos in the guide.
        assert check["images"] == 4 and not check["untrained"], check
        assert check["normalization_at_init"] == 0 and check["mean_cosine"] < 0.7
        assert check["weight_tensors_at_init"] < 0.1 * check["weight_tensors"], check


def _random_timm(name):
    torch.manual_seed(0)
    return needs("timm").create_model(name)


#: Random networks the weights statistic alone sees: no normalization layer the check reads
#: at its built values, and features whose mean cosine is low.
HOLES = {
    "timm NF-ResNet-50": lambda: _random_timm("nf_resnet50"),
    "timm ResMLP-12": lambda: _random_timm("resmlp_12_224"),
    "torchvision EfficientNet-B0, BN folded": lambda: fold_batchnorm(
        torchvision.models.efficientnet_b0()
    ),
    "timm ViT-S/16, norm init altered": lambda: norm_init_altered(
        _random_timm("vit_small_patch16_224")
    ),
    "timm ConvNeXt-T, norm init altered": lambda: norm_init_altered(_random_timm("convnext_tiny")),
    "timm ConvNeXt-T after one SGD step": lambda: one_sgd_step(
        _random_timm("convnext_tiny"), PHOTOS
    ),
}


@pytest.mark.parametrize("name", list(HOLES))
def test_random_and_barely_trained_networks_are_caught_by_their_weight_tensors(name):
    torch.manual_seed(0)
    ext = FeatureExtractor(HOLES[name](), batch_size=2, device="cpu")
    ext.transform(PHOTOS)
    check = ext.feature_check_
    # What the check read before: normalization layers moved (or none), features apart.
    assert 2 * check["normalization_at_init"] <= check["normalization_layers"], check
    assert not check["nearly_identical"], check
    # Their weight tensors are spread as an initialisation draws them (after one step of SGD,
    # all but one).
    assert check["untrained"], (name, check)
    assert check["weight_tensors_at_init"] >= check["weight_tensors"] - 1 > 0, check
    assert check["weight_spread_ratio"] < 1.5


def test_a_trained_network_is_not_flagged_for_crops_of_one_photo(caplog):
    from PIL import Image

    crops = crops_of_one_photo(Image.open(PHOTOS[2]).convert("RGB"))  # grace_hopper.jpg
    ext = FeatureExtractor(mobilenet_v2(), device="cpu", batch_size=16)
    with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
        ext.transform(crops)
    check = ext.feature_check_
    # Near-identical images give near-identical features, as they should...
    assert check["images"] == 64 and check["nearly_identical"], check
    # ...and the trained weights say what the network is.
    assert not check["untrained"], check
    assert not [r for r in caplog.records if r.name == "imagenet_cog"]
    assert check["weight_tensors_at_init"] < 0.1 * check["weight_tensors"]
    assert check["weight_spread_ratio"] > 3


def test_one_image_per_batch_still_checks_the_features():
    torch.manual_seed(0)
    ext = FeatureExtractor(torchvision.models.resnet18(), batch_size=1, device="cpu")
    ext.transform(PHOTOS)
    assert ext.feature_check_["images"] == 4 and ext.feature_check_["nearly_identical"]


def test_the_same_image_twice_is_not_two_different_images():
    from PIL import Image

    ext = FeatureExtractor("torchvision:resnet18", preprocessing={"size": 32})
    ext.transform([Image.new("RGB", (40, 30), "red")] * 3)
    check = ext.feature_check_  # one different image: no cosine to take
    assert check["images"] == 1 and check["mean_cosine"] is None
    ext.transform(PHOTOS[:2] * 2)
    assert ext.feature_check_["images"] == 2


class _Zeros(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3, 4)  # too few rows for the weights statistic

    def forward(self, x):
        return torch.relu(self.proj(x.mean(dim=(2, 3))) - 1e6)  # always 0


def test_all_zero_features_are_said_recorded_and_a_deviation(data, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
        path = _extract(_Zeros(), data, tmp_path, layer="output")
    said = [r.getMessage() for r in caplog.records if r.name == "imagenet_cog"]
    assert len(said) == 1 and "the features of the 6 images checked are all zero" in said[0]
    check = open_store(path).manifest["execution"]["feature_check"]
    assert check["zero_features"] == check["images"] == 6 and check["untrained"]
    run = paper_like(ext_weights="module", ext_differs_from_preset=None, data_feature_check=check)
    assert comparability(run, by_model=True)["mine"]["deviations"] == [
        "L2: the network looks untrained: the features of the 6 images checked are all zero"
    ]


# ------------------------------------------------------------- comparability
def test_a_module_with_a_small_input_is_a_deviation():
    run = paper_like(
        ext_weights="module",
        ext_differs_from_preset=None,
        ext_model="module:torchvision.models.resnet.ResNet",
        ext_preprocessing={
            "resize": 16,
            "crop": 16,
            "interpolation": "bicubic",
            "mean": None,
            "std": None,
        },
    )
    found = comparability(run, by_model=True)["mine"]
    assert found["deviations"] == [
        "an input of 16 px, outside the 224 to 384 px of the paper's models"
    ]
    for size in (224, 299, 384):
        run = paper_like(
            ext_weights="module",
            ext_differs_from_preset=None,
            ext_preprocessing={"resize": size, "crop": size},
        )
        assert comparability(run, by_model=True)["mine"]["deviations"] == []


def test_the_input_size_check_reads_the_resize_too():
    for resize, crop, found in [
        (
            16,
            224,
            "a resize to 16 px (shorter side), outside the 224 to 384 px of the paper's models",
        ),
        (
            [1000, 1000],
            224,
            "a resize to 1000 × 1000 px, outside the 224 to 384 px of the paper's models",
        ),
    ]:
        run = paper_like(
            ext_weights="module",
            ext_differs_from_preset=None,
            ext_preprocessing={"resize": resize, "crop": crop, "mean": None, "std": None},
        )
        assert comparability(run, by_model=True)["mine"]["deviations"] == [found]
    run = paper_like(
        ext_weights="module",
        ext_differs_from_preset=None,
        ext_preprocessing={"resize": 256, "crop": 224, "mean": None, "std": None},
    )
    assert comparability(run, by_model=True)["mine"]["deviations"] == []


def test_skipped_truncated_images_are_named():
    found = comparability(paper_like(ext_truncated_images="skip"), by_model=True)["mine"]
    assert found["deviations"] == []
    assert found["caveats"] == [
        (
            "image files cut short were skipped (truncated_images='skip'), where the official code "
            "decodes them with their missing part grey: those images are missing from its features"
        )
    ]


def test_nearly_identical_features_are_a_deviation():
    check = {"images": 64, "mean_cosine": 0.991, "nearly_identical": True}
    run = paper_like(ext_weights="module", ext_differs_from_preset=None, data_feature_check=check)
    assert comparability(run, by_model=True)["mine"]["deviations"] == [
        "L2: the network looks untrained: the features of 64 different images are nearly "
        + "identical (mean cosine 0.991)"
    ]
    at_init = {
        **check,
        "mean_cosine": 0.31,
        "nearly_identical": False,
        "normalization_layers": 25,
        "normalization_at_init": 25,
    }
    run = paper_like(ext_weights="module", ext_differs_from_preset=None, data_feature_check=at_init)
    assert comparability(run, by_model=True)["mine"]["deviations"] == [
        "L2: the network looks untrained: 25 of the network's 25 normalization layers hold the "
        + "values they were built with (scale constant, shift zero)"
    ]
    fine = {**check, "mean_cosine": 0.49, "nearly_identical": False}
    assert comparability(paper_like(data_feature_check=fine), by_model=True)["mine"] == {
        "deviations": [],
        "caveats": [],
    }
    assert np.isclose(NEAR_IDENTICAL_COSINE, 0.9)
