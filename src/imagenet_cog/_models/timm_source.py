"""The ``timm:NAME[:pretrained|none|FILE]`` source: timm's networks, without their classifier.

Stage "features". ``NAME`` may carry timm's pretrained tag (``vit_base_patch16_224.mae``):
the tag picks the weights and, with them, the data configuration. The preprocessing is timm's
own (:func:`timm.data.resolve_data_config`): input size, ``crop_pct``, ``crop_mode``,
interpolation, mean and std, turned into the extractor's resize and crop exactly as timm's
eval transform does. The feature is timm's ``forward_head(pre_logits=True)``: what the
classifier would see, pooled by the network's own ``global_pool`` (``token``: the class
token after the final norm; ``avg``: the mean of the tokens or of the last feature map;
``map``: attention pooling), recorded as ``feature:pre_logits:<pool>``.

Named weights are read from timm's caches only (the Hugging Face cache, then torch's
``hub/checkpoints``): never downloaded.
"""

from __future__ import annotations

import functools
import math
import os

from .registry import (
    LoadedModel,
    WeightsUnavailableError,
    cached_hf_file,
    check_weights_file,
    hf_cache_dir,
    is_file_weights,
    load_weights_file,
    missing_library,
    named_weights,
    seeded,
)

#: timm's Hugging Face file names (``timm.models._hub``): the pickled default and its safe twin.
_HF_WEIGHTS = "pytorch_model.bin"
_HF_SAFE_WEIGHTS = "model.safetensors"


def load(name, weights, spec, load_weights=True):
    """The network of ``timm:NAME[:WEIGHTS]``, its preprocessing and feature layer."""
    try:
        import timm
    except ImportError:
        raise missing_library(spec, "timm", "timm") from None
    weights = named_weights(weights)
    file = weights if weights and is_file_weights(weights) else None
    if weights and not file and weights != "pretrained":
        raise ValueError(f"timm weights must be 'pretrained', 'none' or a file, got {weights!r}")
    if not timm.is_model(name):
        raise ValueError(f"timm has no model {name!r} (see timm.list_models())")
    if not load_weights:  # the tag's configuration, random weights
        weights = file = None
    check_weights_file(file)
    kwargs = {}
    if weights == "pretrained":
        kwargs = {"pretrained": True, "pretrained_cfg_overlay": {"file": _cached(name, spec)}}
    with seeded():
        try:
            module = timm.create_model(name, num_classes=0, **kwargs)
        except RuntimeError as exc:  # an unknown pretrained tag
            raise ValueError(f"{spec!r}: {exc}") from None
    if file:
        load_weights_file(module, file)
    kind = "file" if file else "pretrained" if weights else "random"
    return LoadedModel(
        module,
        kind,
        functools.partial(preprocessing, module),
        f"feature:pre_logits:{_pool(module)}",
    )


def preprocessing(module):
    """The extractor's preprocessing for a timm network, from timm's own data configuration.

    timm's eval transform (``transforms_imagenet_eval``) resizes to ``floor(size /
    crop_pct)`` (the shorter side for ``crop_mode="center"``, both sides for ``"squash"``),
    then center-crops ``size``.
    """
    from timm.data import resolve_data_config

    cfg = resolve_data_config(model=module)
    height, width = cfg["input_size"][-2:]
    if height != width:
        raise ValueError(
            f"timm's input size {height}x{width} is not square; pass preprocessing= yourself"
        )
    crop_pct = cfg.get("crop_pct") or 0.875  # timm's DEFAULT_CROP_PCT
    mode = cfg.get("crop_mode") or "center"
    scale = math.floor(height / crop_pct)
    if mode not in ("center", "squash"):
        raise ValueError(
            f"timm's crop_mode {mode!r} (resize and pad) is not supported; pass preprocessing="
        )
    return {
        "resize": [scale, scale] if mode == "squash" else scale,
        "crop": int(height),
        "interpolation": cfg.get("interpolation", "bicubic"),
        "mean": [float(x) for x in cfg["mean"]],
        "std": [float(x) for x in cfg["std"]],
    }


def _pool(module):
    """The network's ``global_pool``, as a name (``token``, ``avg``, ``map``...)."""
    pool = getattr(module, "global_pool", None)
    if not pool:
        pool = getattr(getattr(module, "head", None), "global_pool", None)
    pool = getattr(pool, "pool_type", pool)
    return str(pool) if pool else "none"


def _cached(name, spec):
    """The local file of a timm network's pretrained weights, from timm's caches."""
    import torch.hub
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is None:
        raise ValueError(f"timm has no pretrained weights for {name!r}")
    if cfg.file and os.path.isfile(cfg.file):
        return cfg.file
    looked = []
    if cfg.hf_hub_id:
        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else [_HF_SAFE_WEIGHTS, _HF_WEIGHTS]
        path = cached_hf_file(cfg.hf_hub_id, names)
        if path:
            return path
        looked.append(f"{cfg.hf_hub_id}/{names[0]} in the Hugging Face cache {hf_cache_dir()}")
    if cfg.url:
        file = os.path.basename(cfg.url.split("?", 1)[0])
        path = os.path.join(torch.hub.get_dir(), "checkpoints", file)
        if os.path.isfile(path):
            return path
        looked.append(path)
    raise WeightsUnavailableError(
        f"the pretrained weights of {spec!r} are not in timm's caches (looked for "
        f"{' and '.join(looked) or 'nothing: the tag names no file'}); nothing is downloaded: "
        f"run timm.create_model({name!r}, pretrained=True) once where there is internet, or "
        f"pass a local file instead, as in 'timm:{name}:/path/to/model.safetensors'"
    )
