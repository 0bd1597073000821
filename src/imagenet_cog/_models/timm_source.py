"""The ``timm:NAME[:pretrained|none|FILE]`` source: timm's networks, without their classifier.

Stage "features". ``NAME`` may carry timm's pretrained tag (``vit_base_patch16_224.mae``):
the tag picks the weights and, with them, the data configuration. The preprocessing is timm's
own (:func:`timm.data.resolve_data_config`): input size, ``crop_pct``, ``crop_mode``,
interpolation, mean and std, turned into the extractor's resize and crop exactly as timm's
eval transform does. The feature is timm's ``forward_head(pre_logits=True)``: what the
classifier would see, pooled by the network's own ``global_pool`` (``token``: the class
token after the final norm; ``avg``: the mean of the tokens or of the last feature map;
``map``: attention pooling), recorded as ``feature:pre_logits:<pool>``.

Named weights are found in timm's caches only (the Hugging Face cache, then torch's
``hub/checkpoints``; never downloaded), read with :func:`~.weights.read_checkpoint` and
handed to timm, which converts them and loads them strictly.
"""

from __future__ import annotations

import functools
import math
import os

from .._optional_dependencies import require_for_spec
from .registry import LoadedModel, seeded
from .spec import is_file_weights, named_weights
from .weights import (
    HF_WEIGHT_FILES,
    CheckpointError,
    check_head_unused,
    check_weights_file,
    find_weights,
    load_weights_file,
    read_checkpoint,
    torch_checkpoints_dir,
)


def load(name, weights, spec, load_weights=True):
    """The network of ``timm:NAME[:WEIGHTS]``, its preprocessing and feature layer."""
    timm = require_for_spec("timm", spec)
    weights = named_weights(weights)
    file = weights if weights and is_file_weights(weights) else None
    if weights and not file and weights != "pretrained":
        raise ValueError(f"timm weights must be 'pretrained', 'none' or a file, got {weights!r}")
    if not timm.is_model(name):
        raise ValueError(f"timm has no model {name!r} (see timm.list_models())")
    _check_tag(timm, name)
    if not load_weights:  # the tag's configuration, random weights
        weights = file = None
    check_weights_file(file)
    kwargs = {}
    if weights == "pretrained":
        kwargs = {"pretrained": True, "pretrained_cfg_overlay": _pretrained(name, spec)}
    with seeded():
        try:
            module = timm.create_model(name, num_classes=0, **kwargs)
        except RuntimeError as exc:  # an unknown pretrained tag; weights that do not fit
            raise CheckpointError(f"{spec!r}: {_one_line(exc)}") from None
    layer = f"feature:pre_logits:{_pool(module)}"
    if file:  # what is left of timm's head (ConvNeXt's norm...) is part of the feature
        check_head_unused(module, layer, load_weights_file(module, file), file)
    kind = "file" if file else "pretrained" if weights else "random"
    return LoadedModel(module, kind, functools.partial(preprocessing, module), layer)


def _check_tag(timm, name):
    """The one-line error for a pretrained tag timm does not know (``resnet18.nosuch``)."""
    arch, _, tag = name.partition(".")
    if not tag:
        return
    tags = [n.partition(".")[2] for n in timm.list_pretrained(f"{arch}.*")]
    if tag not in tags:
        raise ValueError(
            f"timm has no pretrained tag {tag!r} for {arch}; choose from "
            f"{', '.join(tags[:12]) or 'none'}{' ...' if len(tags) > 12 else ''}"
        )


def _one_line(exc):
    """timm's and torch's error text in one line, its per-key list cut short."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:400] + " ..."


def _pretrained(name, spec):
    """timm's ``pretrained_cfg_overlay``: the cached weights, read here, as a state dict.

    timm converts them (``filter_fn``), drops the classifier the network is built without,
    and loads them strictly. The entry timm's own file reader would take is taken (the
    EMA weights first), and its ``module.`` prefix removed. numpy files (``.npz``, read by
    the network's own ``load_pretrained`` without pickle) are passed as a file.
    """
    from timm.models import clean_state_dict

    path = _cached(name, spec)
    if path.endswith(".npz"):
        return {"file": path}
    state = read_checkpoint(path, unwrap=False)
    if isinstance(state, dict):
        for key in ("state_dict_ema", "model_ema", "state_dict", "model"):
            if state.get(key) is not None:
                state = state[key]
                break
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a state dict but a {type(state).__name__}")
    return {"state_dict": clean_state_dict(state)}


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
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is None:
        raise ValueError(f"timm has no pretrained weights for {name!r}")
    places = [("file", cfg.file)] if cfg.file else []
    if cfg.hf_hub_id:
        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else list(HF_WEIGHT_FILES["timm"])
        places.append(("hf", cfg.hf_hub_id, names))
    if cfg.url:
        file = os.path.basename(cfg.url.split("?", 1)[0])
        places.append(("file", os.path.join(torch_checkpoints_dir(), file)))
    return find_weights(
        places,
        f"the pretrained weights of {spec!r} are not in timm's caches (looked for {{looked}}); "
        f"nothing is downloaded: run timm.create_model({name!r}, pretrained=True) once where "
        f"there is internet, or pass a local file instead, as in "
        f"'timm:{name}:/path/to/model.safetensors'",
    )
