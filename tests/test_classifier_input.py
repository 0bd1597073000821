"""A network given as a module is read where its classifier reads, as its spec form is.

timm's networks by timm's own ``forward_head(pre_logits=True)`` contract, OpenCLIP's by the
image embedding, Hugging Face's by the input of their classifier or their family's feature,
any other module by the input of the last ``nn.Linear`` of its head; and a network where none
of these says where the features are is refused in one line naming ``layer=`` (``--layer``),
never read at an output that may be its logits.
"""

import json
import logging

import numpy as np
import pytest
import torch
from helpers import needs
from PIL import Image

from imagenet_cog import FeatureExtractor, load_model
from imagenet_cog._models.classifier_input import NoClassifierError, find_feature_layer

#: timm's families, small variants.
TIMM_FAMILIES = [
    "resnet18",
    "vit_tiny_patch16_224",
    "deit_tiny_distilled_patch16_224",
    "efficientnet_b0",
    "mobilenetv3_small_100",
    "densenet121",
    "regnety_002",
    "convnext_atto",
    "nf_resnet26",
    "swin_tiny_patch4_window7_224",
    "maxvit_nano_rw_256",
    "edgenext_xx_small",
    "levit_128s",
]


def _photos(n=2):
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in range(n)]


def _features(model, preprocessing, **kwargs):
    """``(features of two photos, layer, extractor)``; ``preprocessing``: a size or a dict."""
    if isinstance(preprocessing, int):
        preprocessing = {"size": preprocessing}
    ext = FeatureExtractor(model, preprocessing=preprocessing, device="cpu", **kwargs)
    return ext.transform(_photos()), ext.fingerprint()["layer"], ext


@pytest.mark.parametrize("name", TIMM_FAMILIES)
def test_a_timm_network_given_as_a_module_is_read_as_its_spec_reads_it(name):
    timm = needs("timm")
    want, spec_layer, spec = _features(f"timm:{name}:none", None)
    module = timm.create_model(name, pretrained=False)  # with its ImageNet classifier
    missing, unexpected = module.load_state_dict(spec._load()["module"].state_dict(), strict=False)
    assert not unexpected and all(k.startswith(("head", "fc", "classifier")) for k in missing)
    got, layer, _ = _features(module, spec.get_preprocessing())
    assert layer == spec_layer and layer.startswith("feature:pre_logits:")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The module is left as it was: its classifier's output is still its own.
    size = spec.get_preprocessing()["crop"]
    assert module(torch.zeros(1, 3, size, size)).shape[-1] == 1000


#: torchvision's families: (name, the width of its classifier's input, the layer).
TORCHVISION_FAMILIES = [
    ("resnet18", 512, "input:fc"),
    ("vgg11", 4096, "input:classifier.6"),
    ("alexnet", 4096, "input:classifier.6"),
    ("mobilenet_v2", 1280, "input:classifier.1"),
    ("mobilenet_v3_small", 1024, "input:classifier.3"),
    ("efficientnet_b0", 1280, "input:classifier.1"),
    ("convnext_tiny", 768, "input:classifier.2"),
    ("regnet_y_400mf", 440, "input:fc"),
    ("densenet121", 1024, "input:classifier"),
    ("shufflenet_v2_x0_5", 1024, "input:fc"),
    ("mnasnet0_5", 1280, "input:classifier.1"),
    ("googlenet", 1024, "input:fc"),
    ("swin_t", 768, "input:head"),
    ("maxvit_t", 512, "input:classifier.5"),
    ("vit_b_32", 768, "input:heads.head"),
]


@pytest.mark.parametrize(("name", "width", "layer"), TORCHVISION_FAMILIES)
def test_a_torchvision_network_is_read_at_its_classifier_input(name, width, layer):
    module = load_model(f"torchvision:{name}")
    got, found, _ = _features(module, 224)
    want, spec_layer, _ = _features(f"torchvision:{name}", 224)
    assert found == spec_layer == layer and got.shape == want.shape == (2, width)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_network_with_no_classifier_is_refused_in_one_line():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1))
    with pytest.raises(NoClassifierError) as caught:
        FeatureExtractor(net, preprocessing={"size": 16}).fingerprint()
    line = str(caught.value)
    assert "\n" not in line and "pass layer= (--layer)" in line and "Sequential" in line
    # SqueezeNet classifies with a convolution: neither form guesses.
    for model in ("torchvision:squeezenet1_0", load_model("torchvision:squeezenet1_0")):
        with pytest.raises(NoClassifierError, match="SqueezeNet"):
            FeatureExtractor(model).fingerprint()
    # Asked for, the output is what it is.
    X = FeatureExtractor(net, preprocessing={"size": 16}, layer="output").transform(_photos())
    assert X.shape == (2, 4)


def test_nested_heads_and_removed_classifiers():
    class Nested(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.Flatten())
            self.backbone.head = torch.nn.Sequential(
                torch.nn.Linear(6 * 14 * 14, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
            )

        def forward(self, x):
            return self.backbone(x)

    assert find_feature_layer(Nested()).layer == "input:backbone.head.2"
    X, layer, _ = _features(Nested(), 16)
    assert layer == "input:backbone.head.2" and X.shape == (2, 32)
    headless = load_model("torchvision:resnet18")
    headless.fc = torch.nn.Identity()  # the classifier removed: its input is the feature
    X, layer, _ = _features(headless, 32)
    assert layer == "input:fc" and X.shape == (2, 512)


# ------------------------------------------------------------------ OpenCLIP
@pytest.mark.parametrize("arch", ["RN50", "ViT-S-32", "convnext_tiny"])
def test_an_open_clip_model_or_tower_given_as_a_module_gives_the_image_embedding(arch):
    open_clip = needs("open_clip")
    want, spec_layer, spec = _features(f"open_clip:{arch}:none", None)
    logging.disable(logging.WARNING)
    try:
        model = open_clip.create_model(arch, pretrained=None)
    finally:
        logging.disable(logging.NOTSET)
    model.visual.load_state_dict(spec._load()["module"].state_dict())
    for module in (model, model.visual):
        got, layer, _ = _features(module, spec.get_preprocessing())
        assert layer == spec_layer == "feature:image_embedding"
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------ Hugging Face
def _hf_configs():
    t = needs("transformers")
    vit = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "image_size": 32,
        "patch_size": 8,
    }
    return {
        "vit": t.ViTConfig(**vit),
        "deit": t.DeiTConfig(**vit),
        "dinov2": t.Dinov2Config(**vit),
        "beit": t.BeitConfig(**vit, use_mean_pooling=True),
        "convnext": t.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1]),
        "swin": t.SwinConfig(
            image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=4
        ),
        "resnet": t.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]),
        "clip": t.CLIPVisionConfig(**vit, projection_dim=24),
        "siglip": t.SiglipVisionConfig(**vit),
    }


#: The Hugging Face class of each family's backbone and classification model, and the width
#: of the classifier's input where it is not the spec form's (DINOv2's classifier reads the
#: class token and the mean patch token; CLIP's the mean patch token, before the projection).
HF_CLASSES = {
    "vit": ("ViTModel", "ViTForImageClassification", None),
    "deit": ("DeiTModel", "DeiTForImageClassification", None),
    "dinov2": ("Dinov2Model", "Dinov2ForImageClassification", 64),
    "beit": ("BeitModel", "BeitForImageClassification", None),
    "convnext": ("ConvNextModel", "ConvNextForImageClassification", None),
    "swin": ("SwinModel", "SwinForImageClassification", None),
    "resnet": ("ResNetModel", "ResNetForImageClassification", None),
    "clip": ("CLIPVisionModelWithProjection", "CLIPForImageClassification", 32),
    "siglip": ("SiglipVisionModel", "SiglipForImageClassification", None),
}


@pytest.mark.parametrize("family", sorted(HF_CLASSES))
def test_a_hugging_face_model_given_as_a_module_is_read_as_its_spec_reads_it(family, tmp_path):
    t = needs("transformers")
    config = _hf_configs()[family]
    if family == "clip":
        config.architectures = ["CLIPVisionModelWithProjection"]
    config.save_pretrained(tmp_path)
    processor = {
        "image_processor_type": "ViTImageProcessor",
        "size": {"height": 32, "width": 32},
        "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3,
        "resample": 3,
    }
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    want, spec_layer, spec = _features(f"hf:{tmp_path}:none", 32)
    backbone_class, classifier_class, other_width = HF_CLASSES[family]
    backbone = getattr(t, backbone_class)(config)
    # The spec form leaves out a pooler its feature does not read (ViT's, DeiT's).
    missing, unexpected = backbone.load_state_dict(
        spec._load()["module"].model.state_dict(), strict=False
    )
    assert not unexpected and all(k.startswith("pooler.") for k in missing)
    got, layer, _ = _features(backbone.eval(), 32)
    assert layer == spec_layer and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # A classification model: the input of its classifier.
    if family in ("clip", "siglip"):  # their classification models take both towers' config
        two = t.CLIPConfig if family == "clip" else t.SiglipConfig
        text = {
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
        }
        config = two(vision_config=config.to_dict(), text_config=text)
    config.num_labels = 10
    classifier = getattr(t, classifier_class)(config).eval()
    got, layer, _ = _features(classifier, 32)
    assert layer.startswith("input:classifier")
    assert got.shape == (2, other_width or want.shape[1])
