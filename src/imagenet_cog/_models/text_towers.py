"""The text tower of a vision-language model: what zero-shot classification embeds class
prompts with.

Stage "features". :func:`load_text_tower` builds it from the same spec as the image
tower the features came from, with the same weights (the whole checkpoint, loaded strictly):

* ``open_clip:ARCH[:TAG|none|FILE]``: OpenCLIP's model (CLIP, SigLIP and the others it
  builds), its ``encode_text`` and its tokenizer (``open_clip.get_tokenizer``);
* ``hf:REPO_ID_OR_DIR[:none]`` of a CLIP-family model (``model_type`` ``clip`` or
  ``siglip``): its ``get_text_features`` and its tokenizer (``AutoTokenizer``, from the
  folder or the cache only). SigLIP's text is padded to its maximum length, as it was trained.

A :class:`TextTower` knows its identity by content, for the cache of class embeddings: the
sha256 of its weights (the text side, the logit scale and bias) and of its tokenizer (its
vocabulary, merges and settings).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from .._optional_dependencies import require_for_spec
from .registry import parse_spec, seeded

__all__ = ["TextTower", "load_text_tower", "tokenizer_sha256"]

#: transformers' two-tower classes, by ``model_type``.
_HF_MODELS = {"clip": "CLIPModel", "siglip": "SiglipModel"}
#: Settings of a tokenizer that change its output, where it has them.
_TOKENIZER_SETTINGS = (
    "context_length",
    "model_max_length",
    "padding_side",
    "truncation_side",
    "do_lower_case",
    "strip_sep_token",
    "reduction_mask",
)


@dataclasses.dataclass
class TextTower:
    """A model's text tower, ready to embed prompts.

    Attributes
    ----------
    spec : str
    kind : {"open_clip", "hf"}
    model : torch.nn.Module
        The model, its image tower dropped, in eval mode.
    tokenizer : callable
    logit_scale : float
        The model's learned scale of the cosine similarities (``exp`` of its parameter).
    logit_bias : float
        SigLIP's learned bias; 0 for CLIP.
    padding : str, bool or None
        How a transformers tokenizer pads (``"max_length"`` for SigLIP); None for OpenCLIP's
        (which pads to its context length).
    weights_sha256 : str
        Of the text side's weights, the scale and the bias.
    tokenizer_sha256 : str or None
        Of the tokenizer's vocabulary and settings; ``None`` for a tokenizer of unknown kind.
    """

    spec: str
    kind: str
    model: Any
    tokenizer: Any
    logit_scale: float
    logit_bias: float
    padding: Any
    weights_sha256: str
    tokenizer_sha256: str | None

    def tokenize(self, texts):
        """Token tensors of ``texts`` (a dict of keyword arguments of the encoder)."""
        if self.kind == "open_clip":
            return {"text": self.tokenizer(list(texts))}
        return dict(
            self.tokenizer(
                list(texts),
                padding=self.padding,
                truncation=True,
                max_length=self.tokenizer.model_max_length,
                return_tensors="pt",
            )
        )

    def encode(self, tokens):
        """Embeddings (not normalised) of the tokens of :meth:`tokenize`, on their device."""
        if self.kind == "open_clip":
            return self.model.encode_text(tokens["text"])
        out = self.model.get_text_features(**tokens)
        return out if hasattr(out, "shape") else out.pooler_output

    def identity(self):
        """What shapes this tower's embeddings, as a dict of content hashes."""
        return {
            "spec": self.spec,
            "weights_sha256": self.weights_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "padding": self.padding,
        }


def tokenizer_sha256(tokenizer):
    """sha256 of a tokenizer's vocabulary, merges and settings, or None for an unknown kind.

    Knows transformers' fast tokenizers (their whole definition), transformers' slow ones
    (their vocabulary), OpenCLIP's BPE tokenizer (its encoder and merges) and OpenCLIP's
    wrappers of a transformers tokenizer.
    """
    h = hashlib.sha256(f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}".encode())
    inner = getattr(tokenizer, "tokenizer", None)
    for part in (tokenizer, inner) if inner is not None else (tokenizer,):
        backend = getattr(part, "backend_tokenizer", None)
        if backend is not None:
            h.update(backend.to_str().encode("utf-8"))
        elif hasattr(part, "encoder") and hasattr(part, "bpe_ranks"):  # OpenCLIP's BPE
            h.update(json.dumps(sorted(part.encoder.items())).encode("utf-8"))
            ranks = sorted((v, list(k)) for k, v in part.bpe_ranks.items())
            h.update(json.dumps(ranks).encode("utf-8"))
        elif hasattr(part, "get_vocab"):
            h.update(json.dumps(sorted(part.get_vocab().items())).encode("utf-8"))
        elif part is tokenizer and inner is not None:
            continue
        else:
            return None
        settings = {
            key: getattr(part, key)
            for key in _TOKENIZER_SETTINGS
            if isinstance(getattr(part, key, None), (str, int, float, bool))
        }
        clean = getattr(part, "clean_fn", None)
        if clean is not None:
            settings["clean_fn"] = getattr(clean, "__qualname__", repr(clean))
        h.update(json.dumps(settings, sort_keys=True).encode("utf-8"))
    return h.hexdigest()


def _open_clip_tower(name, weights, spec):
    from . import open_clip_source

    open_clip = require_for_spec("open_clip", spec)
    import torch

    model, _ = open_clip_source.build_clip(name, weights, spec)
    model.visual = torch.nn.Identity()  # the image tower's weights are the features' business
    try:
        tokenizer = open_clip.get_tokenizer(name)
    except OSError as exc:  # a Hugging Face tokenizer that is not in the cache
        raise OSError(
            f"{spec!r}: OpenCLIP's tokenizer for {name} is not available offline "
            f"({' '.join(str(exc).split())[:300]}); run open_clip.get_tokenizer({name!r}) once "
            "where there is internet"
        ) from None
    return _tower(spec, "open_clip", model, tokenizer, None)


def _hf_tower(name, weights, spec):
    from . import hf_source

    transformers = require_for_spec("transformers", spec)
    import torch

    name, random, config = hf_source.resolve(transformers, name, weights, spec)
    if config.model_type not in _HF_MODELS:
        raise ValueError(
            f"{spec!r} is a {config.model_type!r} model, without a text tower: zero-shot "
            "classification needs a CLIP-family model (model_type 'clip' or 'siglip', saved "
            "whole, not its vision tower alone)"
        )
    model_class = getattr(transformers, _HF_MODELS[config.model_type])
    with seeded():
        if random:
            model = model_class(config)
        else:
            model = hf_source._pretrained(model_class, name, spec, config, torch, {})
    padding = "max_length" if config.model_type == "siglip" else True
    model.vision_model = None  # the image tower's weights are the features' business
    if hasattr(model, "visual_projection"):
        model.visual_projection = None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise OSError(
            f"{spec!r}: no tokenizer in {name} ({' '.join(str(exc).split())[:300]}); save the "
            "model's tokenizer beside it (tokenizer.save_pretrained) or cache it once where "
            "there is internet"
        ) from None
    return _tower(spec, "hf", model, tokenizer, padding)


def _tower(spec, kind, model, tokenizer, padding):
    """The :class:`TextTower` of a built model: its learned logit scale and bias read."""
    bias = getattr(model, "logit_bias", None)
    return TextTower(
        spec=spec,
        kind=kind,
        model=model,
        tokenizer=tokenizer,
        logit_scale=float(model.logit_scale.detach().exp()),
        logit_bias=float(bias.detach().reshape(-1)[0]) if bias is not None else 0.0,
        padding=padding,
        weights_sha256="",
        tokenizer_sha256=tokenizer_sha256(tokenizer),
    )


def load_text_tower(spec):
    """The :class:`TextTower` of a model spec, in eval mode, on the CPU.

    Raises
    ------
    ValueError
        For a spec whose model has no text tower (another source, or a vision-only model).
    """
    from ..features import weights_sha256

    source, name, weights = parse_spec(spec)
    if source == "open_clip":
        tower = _open_clip_tower(name, weights, spec)
    elif source == "hf":
        tower = _hf_tower(name, weights, spec)
    else:
        raise ValueError(
            f"{spec!r}: zero-shot classification needs a model with a text tower, an "
            "'open_clip:ARCH[:TAG]' or an 'hf:REPO_ID_OR_DIR' CLIP-family model"
        )
    tower.model.eval()
    tower.weights_sha256 = weights_sha256(tower.model)
    return tower
