"""The ``open_clip:ARCH[:PRETRAINED_TAG|none|FILE]`` source: OpenCLIP's image encoders.

Stage "features". The network is the CLIP model's image tower (``model.visual``) and the
feature its output, the image embedding that zero-shot classification compares with text
embeddings (after the projection for CLIP ViTs and ResNets, after the attention-pooling head
for SigLIP), recorded as ``feature:image_embedding``. The preprocessing is OpenCLIP's own:
the tag's mean, std, interpolation and resize mode (``shortest``: the shorter side, then a
center crop; ``squash``: both sides, as SigLIP does) at the tower's input size, the values
``open_clip.create_model(ARCH, pretrained=TAG)`` puts in ``model.visual.preprocess_cfg``.
A tag trained with QuickGELU (OpenAI's) builds the tower with QuickGELU, as its weights need.

Named weights are found in OpenCLIP's caches only (the Hugging Face cache, then
``~/.cache/clip``; never downloaded); every checkpoint is read with
:func:`~.weights.read_checkpoint` and converted and loaded strictly by OpenCLIP's
``load_checkpoint``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

from .._optional_dependencies import require_for_spec
from .registry import LoadedModel, seeded
from .spec import is_file_weights, named_weights
from .weights import (
    HF_WEIGHT_FILES,
    CheckpointError,
    check_weights_file,
    find_weights,
    read_checkpoint,
    routed,
    safe_first,
)

#: OpenCLIP's download folder for weights named by a URL.
_URL_CACHE = os.path.join("~", ".cache", "clip")


def load(name, weights, spec, load_weights=True):
    """The image encoder of ``open_clip:ARCH[:WEIGHTS]``, its preprocessing and feature layer."""
    model, kind = build_clip(name, weights, spec, load_weights)
    visual = model.visual
    return LoadedModel(
        visual, kind, functools.partial(preprocessing, visual), "feature:image_embedding"
    )


def build_clip(name, weights, spec, load_weights=True):
    """The whole model of ``open_clip:ARCH[:WEIGHTS]`` (image and text towers), and how its
    weights were set (``"random"``, ``"pretrained"`` or ``"file"``)."""
    open_clip = require_for_spec("open_clip", spec)
    merge_preprocess_dict = require_for_spec("open_clip.transform", spec).merge_preprocess_dict
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
        _load_checkpoint(open_clip, model, file, spec)
    return model, "random" if not file else "pretrained" if tag else "file"


def _load_checkpoint(open_clip, model, file, spec):
    """OpenCLIP's ``load_checkpoint`` (its conversions of older and third-party layouts, a
    strict load), its file read with :func:`read_checkpoint`."""
    from open_clip import factory

    def read(path, device="cpu", weights_only=True):
        state = read_checkpoint(path, unwrap=False)
        if isinstance(state, dict) and "state_dict" in state:  # as OpenCLIP's own reader does
            state = state["state_dict"]
        if not isinstance(state, dict) or not state:
            raise CheckpointError(f"{path}: not a state dict but a {type(state).__name__}")
        if next(iter(state)).startswith("module"):
            state = {k[7:]: v for k, v in state.items()}
        return state

    if str(file).endswith((".npz", ".npy")):
        raise CheckpointError(
            f"{file}: numpy (big_vision) weights are not read; convert them to .safetensors"
        )
    with routed(factory, "load_state_dict", read):
        try:
            open_clip.load_checkpoint(model, file, strict=True, weights_only=True)
        except (RuntimeError, KeyError, ValueError) as exc:
            if isinstance(exc, CheckpointError):
                raise
            text = " ".join(str(exc).split())
            raise CheckpointError(
                f"{file}: its weights do not fit OpenCLIP's {spec.split(':')[1]} "
                f"({text[:400]}{' ...' if len(text) > 400 else ''})"
            ) from None


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
    places = [("file", tag["file"])] if tag.get("file") else []
    if tag.get("hf_hub"):
        repo, filename = os.path.split(tag["hf_hub"])
        places.append(
            ("hf", repo, safe_first(filename or HF_WEIGHT_FILES["open_clip"][1], "open_clip"))
        )
    if tag.get("url"):
        url_file = os.path.basename(tag["url"])
        places.append(("file", os.path.join(os.path.expanduser(_URL_CACHE), url_file)))
    return find_weights(
        places,
        f"the weights of {spec!r} are not in OpenCLIP's caches (looked for {{looked}}); "
        f"nothing is downloaded: run open_clip.create_model({name!r}, pretrained={tag_name!r}) "
        f"once where there is internet, or pass a local file instead, as in "
        f"'open_clip:{name}:/path/to/open_clip_model.safetensors'",
    )
