"""The classifier's input of any network: the layer the paper's linear probe reads.

Stage "features". A network given without a layer (a module of the user's, or a spec whose
source names none: torchvision, torch.hub, a plug-in) is read where its classifier reads,
found by the contract of the library that made it, else by its head:

* **timm** (a module of ``timm.models``, or one that keeps timm's whole contract:
  ``forward_features``, ``forward_head(x, pre_logits=True)``, ``get_classifier`` and
  ``reset_classifier``): ``forward_head(forward_features(x), pre_logits=True)``, what the
  classifier would see, pooled and normed as the network's own head does, recorded as
  ``feature:pre_logits:<pool>``, as the ``timm:`` spec of the same network records it;
* **OpenCLIP**: a CLIP model's ``encode_image``, or an image tower's output, the image
  embedding (``feature:image_embedding``);
* **Hugging Face** ``transformers``: a model with a classifier is read at its input (below);
  a backbone without one gives the feature of its family, as the ``hf:`` spec does (the
  class token, ``image_embeds``, ``pooler_output``);
* **any other module**: the input of the last ``nn.Linear`` of its head, the first of
  :data:`~.weights.HEADS` (``fc``, ``classifier``, ``head``, ``heads``) that it has at its
  top, else the shallowest one nested in it (``model.head``, ``backbone.fc``), else its
  last child when that is an ``nn.Linear``. A head that is an ``nn.Identity`` (a classifier
  removed) is read at its input as well.

When none is found, :class:`NoClassifierError` says so in one line naming ``layer=``
(``--layer``): the network's output could be its logits, whose width equals a class count,
and is never taken for its features unasked.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

from torch import nn

from .weights import HEADS

__all__ = ["FeatureLayer", "NoClassifierError", "find_feature_layer"]


class NoClassifierError(ValueError):
    """No classifier, and no library contract, says where a network's features are."""


class FeatureLayer(NamedTuple):
    """Where a network's features are.

    Attributes
    ----------
    layer : str
        ``"input:NAME"`` (the input of the module ``NAME``) or ``"feature:<what>"`` (the
        output of ``run``).
    run : torch.nn.Module
        The module the extractor runs: the network itself, or a wrapper whose output is the
        feature of its library's contract (its ``network`` attribute is the network).
    """

    layer: str
    run: nn.Module


class TimmPreLogits(nn.Module):
    """A timm network read at ``forward_head(forward_features(x), pre_logits=True)``."""

    def __init__(self, network):
        super().__init__()
        self.network = network

    def forward(self, x):
        return self.network.forward_head(self.network.forward_features(x), pre_logits=True)


class ImageEmbedding(nn.Module):
    """A two-tower model read at its image embedding (OpenCLIP's ``encode_image``,
    transformers' ``get_image_features``)."""

    def __init__(self, network, method):
        super().__init__()
        self.network = network
        self.method = method

    def forward(self, x):
        if self.method == "get_image_features":
            out = self.network.get_image_features(pixel_values=x)
            return getattr(out, "pooler_output", out)  # transformers 5 wraps it
        return self.network.encode_image(x)


def _library(module):
    return type(module).__module__.partition(".")[0]


def _keeps_timm_contract(module):
    head = getattr(module, "forward_head", None)
    if not all(
        callable(getattr(module, name, None))
        for name in ("forward_features", "forward_head", "get_classifier", "reset_classifier")
    ):
        return False
    try:
        return "pre_logits" in inspect.signature(head).parameters
    except (TypeError, ValueError):
        return False


def _timm_pool(module):
    """The network's ``global_pool``, as a name (``token``, ``avg``, ``map``...)."""
    pool = getattr(module, "global_pool", None)
    if not pool:
        pool = getattr(getattr(module, "head", None), "global_pool", None)
    pool = getattr(pool, "pool_type", pool)
    return str(pool) if pool else "none"


def _head_input(module, nested=True):
    """``"input:NAME"`` of the last ``nn.Linear`` of the network's head (``nested``: also a
    head nested in it, or its last child), or ``None``."""
    named = dict(module.named_modules())
    heads = [h for h in HEADS if isinstance(getattr(module, h, None), nn.Module)]
    if nested:
        heads += sorted(
            (n for n in named if "." in n and n.rpartition(".")[2] in HEADS),
            key=lambda n: n.count("."),
        )
    for name in heads:
        head = named[name]
        if isinstance(head, (nn.Linear, nn.Identity)):
            return f"input:{name}"
        linears = [n for n, m in head.named_modules() if n and isinstance(m, nn.Linear)]
        if linears:
            return f"input:{name}.{linears[-1]}"
    children = list(module.named_children())
    if nested and children and isinstance(children[-1][1], nn.Linear):
        return f"input:{children[-1][0]}"
    return None


def _hugging_face(module):
    """Where a transformers model's features are: the input of the classifier it has at its
    top, else its image embedding (a two-tower model), else the feature its family has in
    the ``hf:`` source; ``None`` without a configuration."""
    from .hf_source import HFImageFeatures, _family

    # Their classifiers are ``classifier``; a ``head`` may be a pooling head (SigLIP's).
    classifier = getattr(module, "classifier", None)
    if isinstance(classifier, nn.Module) or isinstance(getattr(module, "head", None), nn.Linear):
        head = _head_input(module, nested=False)
        if head is not None:
            return FeatureLayer(head, module)
    config = getattr(module, "config", None)
    if config is None:
        return None
    if callable(getattr(module, "get_image_features", None)):  # CLIP, SigLIP: two towers
        return FeatureLayer("feature:image_embeds", ImageEmbedding(module, "get_image_features"))
    feature = _family(config)[1]
    if hasattr(module, "visual_projection"):  # CLIPVisionModelWithProjection
        feature = "image_embeds"
    elif feature == "image_embeds":  # a vision tower without its projection
        feature = "pooler_output"
    return FeatureLayer(f"feature:{feature}", HFImageFeatures(module, feature))


def find_feature_layer(module):
    """Where the features of ``module`` are: the input of its classifier.

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    FeatureLayer

    Raises
    ------
    NoClassifierError
        When neither a library's contract nor a head says where the classifier is.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5))
    >>> find_feature_layer(net).layer
    'input:1'
    >>> find_feature_layer(torch.nn.Conv2d(3, 8, 3))
    Traceback (most recent call last):
    ...
    imagenet_cog._models.classifier_input.NoClassifierError: cannot tell where the features of Conv2d are: it has no classifier (no nn.Linear in an fc, classifier, head or heads, nor last) and follows no model library's feature contract (timm, OpenCLIP, Hugging Face); pass layer= (--layer) the module whose output is the feature, such as 'avgpool', or 'output' for the network's output
    """
    library = _library(module)
    found = None
    if _keeps_timm_contract(module):
        found = FeatureLayer(f"feature:pre_logits:{_timm_pool(module)}", TimmPreLogits(module))
    elif library == "open_clip":
        if callable(getattr(module, "encode_image", None)):
            found = FeatureLayer("feature:image_embedding", ImageEmbedding(module, "encode_image"))
        else:  # an image tower: its output is the embedding
            found = FeatureLayer("feature:image_embedding", module)
    elif library == "transformers":
        found = _hugging_face(module)
    else:
        head = _head_input(module)
        found = None if head is None else FeatureLayer(head, module)
    if found is not None:
        return found
    raise NoClassifierError(
        f"cannot tell where the features of {type(module).__name__} are: it has no classifier "
        f"(no nn.Linear in an {', '.join(HEADS[:-1])} or {HEADS[-1]}, nor last) and follows no "
        "model library's feature contract (timm, OpenCLIP, Hugging Face); pass layer= "
        "(--layer) the module whose output is the feature, such as 'avgpool', or 'output' for "
        "the network's output"
    )
