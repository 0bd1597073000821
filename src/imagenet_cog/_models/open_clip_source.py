"""The ``open_clip:ARCH[:PRETRAINED_TAG|none|FILE]`` source: OpenCLIP's image encoders.

Stage "features". The network is the CLIP model's image tower (``model.visual``) and the
feature its output, the image embedding that zero-shot classification compares with text
embeddings (after the projection for CLIP ViTs and ResNets, after the attention-pooling head
for SigLIP), recorded as ``feature:image_embedding``. The preprocessing is OpenCLIP's own:
the tag's mean, std, interpolation and resize mode (``shortest``: the shorter side, then a
center crop; ``squash``: both sides, as SigLIP does) at the tower's input size, the values
``open_clip.create_model(ARCH, pretrained=TAG)`` puts in ``model.visual.preprocess_cfg``.
A tag trained with QuickGELU (OpenAI's) builds the tower with QuickGELU, as its weights need.

Named weights are read from OpenCLIP's caches only (the Hugging Face cache, then
``~/.cache/clip``): never downloaded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

from .registry import (
    LoadedModel,
    WeightsUnavailableError,
    cached_hf_file,
    check_weights_file,
    hf_cache_dir,
    is_file_weights,
    missing_library,
    named_weights,
    seeded,
)

#: OpenCLIP's Hugging Face file names (``open_clip.constants``) and its download folder.
_HF_WEIGHTS = "open_clip_pytorch_model.bin"
_HF_SAFE_WEIGHTS = "open_clip_model.safetensors"
_URL_CACHE = os.path.join("~", ".cache", "clip")


def load(name, weights, spec, load_weights=True):
    """The image encoder of ``open_clip:ARCH[:WEIGHTS]``, its preprocessing and feature layer."""
    try:
        import open_clip
        from open_clip.transform import merge_preprocess_dict
    except ImportError:
        raise missing_library(spec, "open_clip_torch", "openclip") from None
    import torch

    weights = named_weights(weights)
    if open_clip.get_model_config(name) is None:
        raise ValueError(f"OpenCLIP has no architecture {name!r} (see open_clip.list_models())")
    file = weights if weights and is_file_weights(weights) else None
    tag = {}
    if weights and not file:
        tag = open_clip.get_pretrained_cfg(name, weights)
        if not tag:
            tags = ", ".join(open_clip.list_pretrained_tags_by_model(name)) or "none"
            raise ValueError(
                f"OpenCLIP has no pretrained tag {weights!r} for {name}; choose from {tags}, "
                "'none' or a file"
            )
        file = _cached(name, weights, tag, spec) if load_weights else None
    elif not load_weights:
        file = None
    check_weights_file(file)
    with seeded(), _quiet():
        model = open_clip.create_model(
            name,
            pretrained=None,
            device=_default_device(torch),
            force_quick_gelu=bool(tag.get("quick_gelu")),
            force_preprocess_cfg=merge_preprocess_dict({}, tag),
        )
    if file:
        # OpenCLIP's own loader: safetensors, or torch.load(weights_only=True), with its
        # conversions of older and third-party layouts; every weight must be there.
        open_clip.load_checkpoint(model, file, strict=True, weights_only=True)
    kind = "random" if not file else "pretrained" if tag else "file"
    visual = model.visual
    return LoadedModel(
        visual, kind, functools.partial(preprocessing, visual), "feature:image_embedding"
    )


def preprocessing(visual):
    """The extractor's preprocessing for an OpenCLIP image tower, from its ``preprocess_cfg``."""
    from open_clip import get_model_preprocess_cfg

    cfg = get_model_preprocess_cfg(visual)
    size = cfg.get("size", 224)
    height, width = (size, size) if isinstance(size, int) else tuple(size)[-2:]
    if height != width:
        raise ValueError(f"OpenCLIP's input size {size} is not square; pass preprocessing=")
    mode = cfg.get("resize_mode") or "shortest"
    if mode not in ("shortest", "squash"):
        raise ValueError(
            f"OpenCLIP's resize_mode {mode!r} (resize and pad) is not supported; pass preprocessing="
        )
    # OpenCLIP's eval transform maps any interpolation but 'bilinear' to bicubic.
    interpolation = "bilinear" if cfg.get("interpolation") == "bilinear" else "bicubic"
    return {
        "resize": [int(height), int(height)] if mode == "squash" else int(height),
        "crop": int(height),
        "interpolation": interpolation,
        "mean": [float(x) for x in cfg["mean"]],
        "std": [float(x) for x in cfg["std"]],
    }


def _default_device(torch):
    """The CPU, unless the network is built under ``torch.device("meta")`` (torch >= 2.3)."""
    get = getattr(torch, "get_default_device", None)
    return get() if get else torch.device("cpu")


@contextlib.contextmanager
def _quiet():
    """Silence OpenCLIP's log lines ("initialized randomly") while the model is built."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def _cached(name, tag_name, tag, spec):
    """The local file of an OpenCLIP tag's weights, from OpenCLIP's caches."""
    if tag.get("file") and os.path.isfile(tag["file"]):
        return tag["file"]
    looked = []
    if tag.get("hf_hub"):
        repo, filename = os.path.split(tag["hf_hub"])
        filename = filename or _HF_WEIGHTS
        names = [filename]
        if filename == _HF_WEIGHTS:
            names.insert(0, _HF_SAFE_WEIGHTS)
        elif filename.endswith((".bin", ".pth")):
            names.insert(0, filename[:-4] + ".safetensors")
        path = cached_hf_file(repo, names)
        if path:
            return path
        looked.append(f"{repo}/{names[0]} in the Hugging Face cache {hf_cache_dir()}")
    if tag.get("url"):
        path = os.path.join(os.path.expanduser(_URL_CACHE), os.path.basename(tag["url"]))
        if os.path.isfile(path):
            return path
        looked.append(path)
    raise WeightsUnavailableError(
        f"the weights of {spec!r} are not in OpenCLIP's caches (looked for "
        f"{' and '.join(looked) or 'nothing: the tag names no file'}); nothing is downloaded: "
        f"run open_clip.create_model({name!r}, pretrained={tag_name!r}) once where there is "
        f"internet, or pass a local file instead, as in "
        f"'open_clip:{name}:/path/to/open_clip_model.safetensors'"
    )
