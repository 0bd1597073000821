"""The paper's model presets: how each of its 31 models is loaded and preprocessed.

Stage "features". :data:`MODEL_ZOO` (supplement B.1 of the paper), the normalization
constants, and :func:`paper_preset`, which says whether a spec names one of the paper's
architectures (the comparability checks use it without loading anything heavy).
"""

from __future__ import annotations

from .registry import parse_spec

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MODEL_ZOO",
    "NORMALIZATION",
    "paper_preset",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: CLIP's own constants; the paper prints them rounded.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

NORMALIZATION = {
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
    "clip": (CLIP_MEAN, CLIP_STD),
    "none": (None, None),
}

_RESNET50_FAMILY = (
    "s-MoCo-v2, s-BYOL, s-SwAV, s-DINO, s-BarlowTwins, s-OBoW, s-InfoMin, s-MoChi, "
    "s-CompReSS, r-MixUp, r-Manifold-MixUp, r-CutMix, r-ReLabel, r-Adv-Robust, r-MEAL-v2, "
    "d-Semi-Sup, d-Semi-Weakly-Sup, d-MoPro"
)

#: The paper's model families (Table 1 and supplement B.1, Table 3): how each
#: is loaded, its image size S (resize the shorter side to S, bicubic, then
#: center-crop S×S), its normalization and the width of the layer right
#: before the classifier. ``spec`` is ``None`` where no package ships the
#: network: pass the module and ``preprocessing=<key>``. ``CHECKPOINT`` stands
#: for the path of the authors' weights file.
MODEL_ZOO = {
    "resnet50": {
        "paper": "ResNet50 (reference)",
        "spec": "torchvision:resnet50:IMAGENET1K_V1",
        "size": 224,
        "normalization": "imagenet",
        "dim": 2048,
    },
    "resnet50_checkpoint": {
        "paper": _RESNET50_FAMILY,
        "spec": "torchvision:resnet50:CHECKPOINT",
        "size": 224,
        "normalization": "imagenet",
        "dim": 2048,
    },
    "simclr_v2": {
        "paper": "s-SimCLR-v2",
        "spec": "torchvision:resnet50:CHECKPOINT",
        "size": 224,
        "normalization": "none",
        "dim": 2048,
    },
    "clip": {
        "paper": "d-CLIP (ResNet50)",
        "spec": None,
        "size": 224,
        "normalization": "clip",
        "dim": None,
    },
    "resnet152": {
        "paper": "a-ResNet152",
        "spec": "torchvision:resnet152:IMAGENET1K_V1",
        "size": 224,
        "normalization": "imagenet",
        "dim": 2048,
    },
    "vgg19": {
        "paper": "a-VGG19",
        "spec": "torchvision:vgg19:IMAGENET1K_V1",
        "size": 224,
        "normalization": "imagenet",
        "dim": 4096,
    },
    "inception_v3": {
        "paper": "a-Inception-v3",
        "spec": "torchvision:inception_v3:IMAGENET1K_V1",
        "size": 299,
        "normalization": "imagenet",
        "dim": 2048,
    },
    "efficientnet_b1": {
        "paper": "a-EfficientNet-B1",
        "spec": "torchvision:efficientnet_b1:IMAGENET1K_V1",
        "size": 240,
        "normalization": "imagenet",
        "dim": 1280,
    },
    "efficientnet_b4": {
        "paper": "a-EfficientNet-B4",
        "spec": "torchvision:efficientnet_b4:IMAGENET1K_V1",
        "size": 380,
        "normalization": "imagenet",
        "dim": 1792,
    },
    "deit_s": {
        "paper": "a-DeiT-S",
        "spec": "timm:deit_small_patch16_224:pretrained",
        "size": 224,
        "normalization": "imagenet",
        "dim": 384,
    },
    "deit_s_distilled": {
        "paper": "a-DeiT-S-distilled",
        "spec": "timm:deit_small_distilled_patch16_224:pretrained",
        "size": 224,
        "normalization": "imagenet",
        "dim": 384,
    },
    "deit_b_distilled_384": {
        "paper": "a-DeiT-B-distilled",
        "spec": "timm:deit_base_distilled_patch16_384:pretrained",
        "size": 384,
        "normalization": "imagenet",
        "dim": 768,
    },
    "t2t_vit_t_14": {
        "paper": "a-T2T-ViT-t-14",
        "spec": None,
        "size": 224,
        "normalization": "imagenet",
        "dim": 384,
    },
    "nat_m4": {
        "paper": "a-NAT-M4",
        "spec": None,
        "size": 224,
        "normalization": "imagenet",
        "dim": 1536,
    },
}


def paper_preset(spec):
    """The :data:`MODEL_ZOO` key of a spec's architecture, or None for a model not in the paper.

    A spec names one of the paper's architectures when its source and name are those of a
    row of the zoo (its ImageNet-normalized row); the weights do not matter here, nor a timm
    pretrained tag (``deit_small_patch16_224.fb_in1k`` is the paper's DeiT-S).

    Parameters
    ----------
    spec : str or object
        A model spec; anything else (a module) has no preset.

    Returns
    -------
    str or None

    Examples
    --------
    >>> paper_preset("torchvision:resnet50:/models/dino_resnet50.pth")
    'resnet50'
    >>> paper_preset("timm:deit_small_patch16_224.fb_in1k:pretrained")
    'deit_s'
    >>> paper_preset("open_clip:ViT-B-16:openai") is None
    True
    """
    if not isinstance(spec, str):
        return None
    try:
        source, name, _ = parse_spec(spec)
    except ValueError:
        return None
    if source == "timm":
        name = name.split(".")[0]
    for key, row in MODEL_ZOO.items():
        if row["spec"] and row["normalization"] == "imagenet":
            r_source, r_name, _ = parse_spec(row["spec"])
            if (r_source, r_name) == (source, name):
                return key
    return None


def module_preprocessing(module):
    """The preprocessing a network given as a module carries from its library (a timm
    network's ``pretrained_cfg``), or None."""
    if getattr(module, "pretrained_cfg", None):
        from .timm_source import preprocessing

        return preprocessing(module)
    return None
