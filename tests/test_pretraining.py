"""The pretraining-data caveat: models known to have seen ImageNet-21K images are named as such
in the comparability verdict, from one table with its sources."""

import re

import pytest
from official_run import paper_like

from imagenet_cog import comparability
from imagenet_cog._base import data_path
from imagenet_cog._models.pretraining import (
    PRETRAINING_FILE,
    imagenet21k_pretraining,
    pretraining_table,
)
from imagenet_cog._provenance import RANDOM_WEIGHTS

DINOV2 = (
    "timm:vit_base_patch14_dinov2.lvd142m:pretrained",
    "timm:vit_large_patch14_reg4_dinov2.lvd142m:/weights/model.safetensors",
    "hf:facebook/dinov2-base",
    "torchhub:/repos/dinov2:dinov2_vitb14",
)
EVA02 = (
    "timm:eva02_base_patch14_224.mim_in22k:pretrained",
    "timm:eva02_base_patch14_448.mim_in22k_ft_in22k_in1k:pretrained",
)


def _caveats(spec, weights="pretrained"):
    run = paper_like(ext_model=spec, ext_weights=weights, ext_differs_from_preset={})
    return comparability(run, by_model=True)["mine"]


@pytest.mark.parametrize("spec", DINOV2 + EVA02)
def test_a_model_pretrained_on_imagenet21k_images_gets_the_caveat(spec):
    found = _caveats(spec)
    seen = [c for c in found["caveats"] if c.startswith("pretrained on ImageNet-21K images")]
    assert len(seen) == 1, found
    assert "as the paper says of d-CLIP" in seen[0]
    if "dinov2" in spec:
        assert "LVD-142M, which holds ImageNet-22K as is" in seen[0] and "Table 15" in seen[0]
    else:
        assert "'mim_in22k'" in seen[0] and "arXiv:2303.11331" in seen[0]
    assert not any("ImageNet-21K" in d for d in found["deviations"])  # a caveat only


def test_the_papers_supervised_resnet50_gets_none():
    assert comparability(paper_like()) == []
    assert imagenet21k_pretraining("torchvision:resnet50:IMAGENET1K_V1") is None


@pytest.mark.parametrize(
    ("spec", "matched"),
    [
        ("timm:vit_base_patch16_224.augreg_in21k:pretrained", "in21k"),
        ("timm:convnext_base.fb_in22k_ft_in1k:pretrained", "in22k"),
        ("timm:vit_base_patch16_clip_224.openai_ft_in12k_in1k:pretrained", "in12k"),
        ("timm:eva_giant_patch14_336.m30m_ft_in22k_in1k:pretrained", "m30m"),
        ("timm:eva02_large_patch14_224.mim_m38m:pretrained", "mim_m38m"),
        ("timm:mvitv2_base_cls.fb_inw21k:pretrained", "inw21k"),
        ("hf:google/vit-base-patch16-224-in21k", "in21k"),
        ("hf:microsoft/beit-base-patch16-224-pt22k", "pt22k"),
        ("hf:facebook/convnext-base-224-22k", "22k"),
        # timm's default tag of a name without one: augreg2_in21k_ft_in1k.
        ("timm:vit_base_patch16_224:pretrained", "in21k"),
    ],
)
def test_the_table_matches_the_tags_it_names(spec, matched):
    pytest.importorskip("timm")
    assert imagenet21k_pretraining(spec)["matched"] == matched


@pytest.mark.parametrize(
    "spec",
    [
        "timm:resnet50:pretrained",  # timm's default tag: a1_in1k
        "timm:vit_base_patch16_224.augreg_in1k:pretrained",
        "open_clip:ViT-B-32:laion2b_s34b_b79k",
        "timm:vit_base_patch14_dinov2.lvd142m:none",  # random weights saw nothing
        "torchhub:/repos/dinov2:dinov2_vitb14:none",
        "hf:/data/in22k_runs/my-resnet",  # a folder's parents say nothing of its weights
        "module:torch.nn.Linear",
    ],
)
def test_other_weights_get_none(spec):
    pytest.importorskip("timm")
    assert imagenet21k_pretraining(spec) is None


def test_random_weights_are_a_deviation_and_not_this_caveat():
    found = _caveats(DINOV2[0], weights=RANDOM_WEIGHTS)
    assert any(d.startswith("random-initialised weights") for d in found["deviations"])
    assert not any("ImageNet-21K images" in c for c in found["caveats"])


def test_the_table_is_data_with_a_source_for_every_row():
    text = data_path(PRETRAINING_FILE).read_text(encoding="utf-8")
    assert "pattern\tdata\tsource" in text.splitlines()
    rows = pretraining_table()
    assert len(rows) >= 6
    for compiled, pattern, data, source in rows:
        assert isinstance(compiled, re.Pattern) and data and source
        assert re.search(r"\d{4}|timm", source), f"{pattern}: no publication or library named"
    # The specific rows come before the general one they contain.
    order = [pattern for _, pattern, _, _ in rows]
    assert order.index("mim_in22k") < next(i for i, p in enumerate(order) if "in22k|" in p)
