"""The ``hf:REPO_ID_OR_DIR[:none]`` source: Hugging Face ``transformers`` vision backbones.

Stage "features". The folder or the cached repository holds the model's ``config.json``, its
weights and its image processor's ``preprocessor_config.json``; ``:none`` builds the model from
the configuration alone, with random weights. The feature depends on the family
(``model_type``), following the rule of the layer before the classifier:

* ViTs with a class token (``vit``, ``deit``, ``vit_msn``, ``vit_mae``, ``dinov2``,
  ``dinov2_with_registers``): the class token of the last hidden state, after the final
  LayerNorm, recorded as ``feature:cls_token`` (what ``*ForImageClassification`` of ViT and
  DeiT classify; ``vit_mae`` is built with ``mask_ratio=0``, so that no patch is dropped);
* CLIP: the image embedding (``CLIPVisionModelWithProjection.image_embeds``), recorded as
  ``feature:image_embeds``; SigLIP: the attention-pooled embedding (``SiglipVisionModel``'s
  ``pooler_output``); only the vision tower is loaded;
* every other family (ConvNeXt, Swin, BEiT, ResNet...): the model's ``pooler_output``,
  flattened, recorded as ``feature:pooler_output``.

The preprocessing is the image processor's: ``size`` (``shortest_edge``: the shorter side;
``height`` and ``width``: both sides, ignoring the aspect ratio), ``crop_size``, ``resample``,
``image_mean`` and ``image_std``; ConvNeXt's ``crop_pct`` as its processor applies it.
Nothing is downloaded: ``local_files_only=True`` throughout. The weights files (``model.safetensors``,
``pytorch_model.bin`` or their shards) are read with :func:`~.weights.read_checkpoint` and handed
to ``from_pretrained``; every weight of the backbone must be in them, with its shape. A
``REPO_ID_OR_DIR`` that looks like a path (``/``, ``./``, ``~``...) is a folder, never a
repository id.
"""

from __future__ import annotations

import functools
import json
import os

from torch import nn

from .._optional_dependencies import require_for_spec
from .registry import LoadedModel, seeded
from .spec import looks_like_path
from .weights import (
    HF_WEIGHT_FILES,
    CheckpointError,
    WeightsUnavailableError,
    cached_hf_file,
    hf_cache_dir,
    read_checkpoint,
)

#: ``model_type`` -> (the class that loads it, the feature of its output).
_FAMILIES = {
    "clip": ("CLIPVisionModelWithProjection", "image_embeds"),
    "siglip": ("SiglipVisionModel", "pooler_output"),
    **dict.fromkeys(
        ("vit", "deit", "vit_msn", "vit_mae", "dinov2", "dinov2_with_registers"),
        ("AutoModel", "cls_token"),
    ),
}
#: Families whose model class adds a pooling layer the feature does not use.
_NO_POOLER = ("vit", "deit")
#: PIL's resampling filters, as transformers stores them.
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}


class HFImageFeatures(nn.Module):
    """A transformers vision model whose forward pass returns its feature (see the module)."""

    def __init__(self, model, feature):
        super().__init__()
        self.model = model
        self.feature = feature

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        if self.feature == "image_embeds":
            return out.image_embeds
        if self.feature == "cls_token":
            return out.last_hidden_state[:, 0]
        pooled = getattr(out, "pooler_output", None)
        if pooled is None:
            raise RuntimeError(
                f"{type(self.model).__name__} has no pooler_output; pass layer= the module "
                "whose output is the feature"
            )
        return pooled.flatten(1)


def load(name, weights, spec, load_weights=True):
    """The backbone of ``hf:REPO_ID_OR_DIR[:none]``, its preprocessing and feature layer."""
    transformers = require_for_spec("transformers", spec)
    import torch

    name, random, config = resolve(transformers, name, weights, spec, load_weights)
    if config.model_type == "siglip2":
        raise ValueError(
            f"{spec!r}: SigLIP 2 NaFlex models take variable-size patch sequences; use a "
            "fixed-resolution checkpoint (model_type 'siglip') or open_clip:ViT-B-16-SigLIP2:webli"
        )
    class_name, feature = _family(config)
    model_class = getattr(transformers, class_name)
    model_config = config
    if class_name != "AutoModel":  # the vision tower of a two-tower model
        model_config = getattr(config, "vision_config", config)
        if hasattr(config, "vision_config") and hasattr(config, "projection_dim"):
            model_config.projection_dim = config.projection_dim
    if config.model_type == "vit_mae":
        model_config.mask_ratio = 0.0
    kwargs = {"add_pooling_layer": False} if config.model_type in _NO_POOLER else {}
    with seeded():
        if random:
            model = (
                model_class.from_config(model_config, **kwargs)
                if class_name == "AutoModel"
                else model_class(model_config, **kwargs)
            )
        else:
            model = _pretrained(model_class, name, spec, model_config, torch, kwargs)
    module = HFImageFeatures(model, feature)
    return LoadedModel(
        module,
        "random" if random else "pretrained",
        _processor(transformers, name),
        f"feature:{feature}",
    )


def resolve(transformers, name, weights, spec, load_weights=True):
    """``(folder or repository id, random weights?, configuration)`` of ``hf:NAME[:none]``."""
    if weights.lower() not in ("", "none"):
        raise ValueError(
            f"{spec!r}: a Hugging Face model brings its own weights; add ':none' for random "
            "weights, or save other weights into a folder with save_pretrained"
        )
    random = weights.lower() == "none" or not load_weights
    if looks_like_path(name):
        name = os.path.expanduser(name)
        if not os.path.isdir(name):
            raise FileNotFoundError(
                f"{spec!r}: no folder at {name} (a Hugging Face model is a repository id "
                "such as 'facebook/dinov2-small', or a folder made with save_pretrained)"
            )
    return name, random, _config(transformers, name, spec)


def _weights_files(name, spec):
    """The weights files of a folder or cached repository, as ``from_pretrained`` picks them."""

    def find(filename):
        if os.path.isdir(name):
            path = os.path.join(name, filename)
            return path if os.path.isfile(path) else None
        return cached_hf_file(name, [filename])

    for single in HF_WEIGHT_FILES["transformers"]:
        path = find(single)
        if path:
            return [path]
        index = find(single + ".index.json")
        if index:
            try:
                with open(index) as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise CheckpointError(f"{index}: not a readable shard index ({exc})") from None
            paths = [find(shard) for shard in shards]
            if None in paths:
                missing = shards[paths.index(None)]
                raise _unavailable(name, spec, OSError(f"the shard {missing} is missing"))
            return paths
    raise _unavailable(name, spec, OSError(f"no {' or '.join(HF_WEIGHT_FILES['transformers'])}"))


def _pretrained(model_class, name, spec, config, torch, kwargs):
    """The model with its weights, read here, loaded by ``from_pretrained``, strictly."""
    state = {}
    for path in _weights_files(name, spec):
        part = read_checkpoint(path, unwrap=False)  # transformers' files are flat
        if not isinstance(part, dict):
            raise CheckpointError(f"{path}: not a state dict but a {type(part).__name__}")
        state.update(part)
    if hasattr(model_class, "_model_mapping"):  # an Auto class: the family's own class
        model_class = model_class._model_mapping[type(config)]
    try:
        model, info = model_class.from_pretrained(
            None,
            config=config,
            state_dict=state,
            local_files_only=True,
            dtype=torch.float32,
            output_loading_info=True,
            **kwargs,
        )
    except OSError as exc:
        raise _unavailable(name, spec, exc) from None
    except (RuntimeError, ValueError) as exc:  # weights of another shape
        raise CheckpointError(
            f"{spec!r}: the weights do not fit the model ({_short(exc)})"
        ) from None
    bad = [*info.get("mismatched_keys", ())]
    if bad:
        keys = ", ".join(str(k[0] if isinstance(k, tuple) else k) for k in bad[:5])
        raise CheckpointError(
            f"{spec!r}: the weights do not fit the model: shapes differ for {keys}"
        )
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(
            f"{spec!r}: {len(missing)} weights of the model are missing from its files, e.g. "
            f"{', '.join(missing[:5])}{more}: they were made for another architecture"
        )
    return model


def _short(exc):
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:400] + " ..."


def _family(config):
    """``(model class, feature)`` of a configuration's family."""
    if config.model_type == "clip_vision_model" and "CLIPVisionModelWithProjection" in (
        config.architectures or ()
    ):
        return _FAMILIES["clip"]
    return _FAMILIES.get(config.model_type, ("AutoModel", "pooler_output"))


def _config(transformers, name, spec):
    try:
        return transformers.AutoConfig.from_pretrained(name, local_files_only=True)
    except OSError as exc:
        raise _unavailable(name, spec, exc) from None
    except ValueError as exc:  # a folder without a usable config.json
        if not os.path.isdir(name):
            raise
        raise _unavailable(name, spec, exc) from None


def _unavailable(name, spec, exc):
    if os.path.isdir(name):
        config = os.path.isfile(os.path.join(name, "config.json"))
        return FileNotFoundError(
            f"{name} is not a complete transformers model folder ({' '.join(str(exc).split())})"
            "; make it with save_pretrained"
            + (
                f", or use 'hf:{name}:none' for its configuration with random weights"
                if config
                else ""
            )
        )
    return WeightsUnavailableError(
        f"the weights of {spec!r} (the Hugging Face model {name}, its config.json and weights) "
        f"are not in the Hugging Face cache {hf_cache_dir()}; nothing is downloaded: run "
        f"`hf download {name}` once where there is internet, or pass a local folder "
        f"(save_pretrained) instead, as in 'hf:/path/to/{name.rstrip('/').rsplit('/', 1)[-1]}'"
    )


def _processor(transformers, name):
    """The image processor's preprocessing (a function), or None when the model has none."""
    try:
        proc = transformers.AutoImageProcessor.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        return None
    return functools.partial(preprocessing, proc)


def preprocessing(proc):
    """The extractor's preprocessing for a transformers image processor."""

    def field(mapping, key):
        value = mapping.get(key) if isinstance(mapping, dict) else getattr(mapping, key, None)
        return int(value) if value else None

    what = type(proc).__name__
    if not getattr(proc, "do_resize", True):
        raise ValueError(f"{what} does not resize; pass preprocessing= yourself")
    size = proc.size
    short, height, width = (field(size, k) for k in ("shortest_edge", "height", "width"))
    crop = field(proc.crop_size, "height") if getattr(proc, "do_center_crop", False) else None
    if crop is not None and field(proc.crop_size, "width") != crop:
        raise ValueError(f"{what} crops a non-square {proc.crop_size}; pass preprocessing=")
    crop_pct = getattr(proc, "crop_pct", None)
    if short and crop_pct is not None:  # ConvNeXt: resize to short/crop_pct, crop; else warp
        resize, crop = ([short, short], short) if short >= 384 else (int(short / crop_pct), short)
    elif short:
        resize = short
    elif height and width:
        resize = [height, width]
    else:
        raise ValueError(f"{what} resizes to {size}, which is not supported; pass preprocessing=")
    if crop is None:
        if isinstance(resize, int) or resize[0] != resize[1]:
            raise ValueError(
                f"{what} gives images of varying or non-square size; pass preprocessing="
            )
        crop = resize[0]
    resample = _RESAMPLE.get(int(getattr(proc, "resample", 3)))
    if resample is None:
        raise ValueError(f"{what}'s resample filter {proc.resample!r} is not supported")
    factor = getattr(proc, "rescale_factor", 1 / 255)
    if not getattr(proc, "do_rescale", True) or abs(factor - 1 / 255) > 1e-9:
        raise ValueError(f"{what} does not scale pixels to [0, 1]; pass preprocessing=")
    normalize = getattr(proc, "do_normalize", True)
    return {
        "resize": resize,
        "crop": crop,
        "interpolation": resample,
        "mean": [float(x) for x in proc.image_mean] if normalize else None,
        "std": [float(x) for x in proc.image_std] if normalize else None,
    }
