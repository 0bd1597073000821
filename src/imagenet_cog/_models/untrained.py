"""Is a network untrained? The check every extraction makes, whatever the network's source.

Stage "features". A network whose weights never loaded (a checkpoint for another model read
with ``strict=False``, a plug-in that forgot to load them, a module built and never trained)
gives features that look like features. Two statistics tell it, and either suffices:

* **from the weights**, :func:`normalization_at_init`: the normalization layers (BatchNorm,
  LayerNorm, GroupNorm, RMSNorm and the libraries' own ``...Norm`` modules) of a network
  built and not trained hold the values they were built with: every scale the same number
  (1, or 0 where a library zero-initialises a block's last one) and every shift 0; a layer
  without a scale or shift has its running mean 0 and variance 1. Training moves every one
  of them. More than half of them at those values is an untrained network. This sees every
  family of the model zoo (torchvision, timm, OpenCLIP, Hugging Face), whatever the batch
  size, before any image is read; it sees nothing in a network without normalization layers
  (VGG without BN, AlexNet).
* **from the features**, :class:`FeatureCheck`: the mean cosine between the features of
  different images (up to :data:`CHECKED_FEATURES`, over as many batches as it takes) above
  :data:`NEAR_IDENTICAL_COSINE`, as random convolutional networks with ReLUs give them, and
  features that are all zero. A random transformer or ConvNeXt ends in a LayerNorm, which
  centres its features: their cosine is low, and only the weights statistic sees them.

Non-finite features are checked in every batch by the extractor itself (they stop the run).
Measured on real photos in the features guide ("Checks of the features").
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = [
    "CHECKED_FEATURES",
    "NEAR_IDENTICAL_COSINE",
    "FeatureCheck",
    "normalization_at_init",
    "untrained_reasons",
]

#: Mean cosine between the features of different images above which they are nearly
#: identical, as a random ReLU network's are (measured in the features guide).
NEAR_IDENTICAL_COSINE = 0.9
#: The first different images of an extraction whose features are checked.
CHECKED_FEATURES = 64


def _is_normalization(module):
    import torch

    kinds = (
        torch.nn.modules.batchnorm._NormBase,
        torch.nn.LayerNorm,
        torch.nn.GroupNorm,
        *((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ()),
    )
    # The libraries' own: timm's LayerNorm2d and BatchNormAct2d, Hugging Face's
    # ConvNextLayerNorm, torchvision's FrozenBatchNorm2d...
    return isinstance(module, kinds) or "Norm" in type(module).__name__


def _own(module, name):
    """A tensor the module holds itself (a parameter or a buffer), not one of its children's."""
    found = module._parameters.get(name)
    if found is None:
        found = module._buffers.get(name)
    return None if found is None or found.is_meta else found.detach()


def _layer_at_init(module):
    """True or False for a normalization layer; None when it holds nothing to judge by."""
    weight, bias = _own(module, "weight"), _own(module, "bias")
    if weight is not None or bias is not None:
        constant = (
            weight is None or weight.numel() == 0 or bool((weight == weight.flatten()[0]).all())
        )
        return constant and (bias is None or not bool(bias.any()))
    mean, var = _own(module, "running_mean"), _own(module, "running_var")
    if mean is not None and var is not None:
        return not bool(mean.any()) and bool((var == 1).all())
    return None


def normalization_at_init(module):
    """How many of a network's normalization layers hold the values they were built with.

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    dict
        ``layers``: the normalization layers that hold a scale, a shift or running
        statistics; ``at_init``: those among them whose scale is one number throughout and
        whose shift is zero (without either: running mean 0 and variance 1).

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    >>> normalization_at_init(net)
    {'layers': 1, 'at_init': 1}
    >>> with torch.no_grad():
    ...     _ = net[1].weight.mul_(torch.tensor([1.0, 0.5, 2.0, 1.5]))
    >>> normalization_at_init(net)
    {'layers': 1, 'at_init': 0}
    """
    found = [_layer_at_init(m) for m in module.modules() if _is_normalization(m)]
    found = [f for f in found if f is not None]
    return {"layers": len(found), "at_init": sum(found)}


class FeatureCheck:
    """The features of the first different images of an extraction, gathered over batches.

    Parameters
    ----------
    normalization : dict
        :func:`normalization_at_init` of the network.

    Examples
    --------
    >>> import numpy as np
    >>> check = FeatureCheck({"layers": 0, "at_init": 0})
    >>> x = np.eye(3, dtype=np.float32)  # three different images
    >>> check.add(x[:1], np.ones((1, 2), np.float32))  # a batch of one image...
    >>> check.add(x[1:], np.ones((2, 2), np.float32))  # ...then two more
    >>> found = check.result()
    >>> found["images"], found["mean_cosine"], found["nearly_identical"], found["untrained"]
    (3, 1.0, True, True)
    """

    def __init__(self, normalization):
        self.normalization = dict(normalization)
        self._seen = set()
        self._rows = []

    @property
    def full(self):
        """Whether :data:`CHECKED_FEATURES` different images are in hand."""
        return len(self._rows) >= CHECKED_FEATURES

    def add(self, x, features):
        """Keep the features of the batch's images not seen before (the same input twice
        gives the same features), until :data:`CHECKED_FEATURES` are kept.

        ``x`` holds the batch's network inputs (a tensor or an array), ``features`` their
        features, row for row.
        """
        if self.full:
            return
        inputs = x.detach().to("cpu").flatten(1).contiguous().numpy() if hasattr(x, "detach") else x
        inputs = np.asarray(inputs).reshape(len(inputs), -1)
        for row, feature in zip(inputs, features):
            digest = hashlib.sha256(np.ascontiguousarray(row).tobytes()).digest()
            if digest in self._seen:
                continue
            self._seen.add(digest)
            self._rows.append(np.asarray(feature, dtype=np.float64))
            if self.full:
                return

    def result(self):
        """The check, as the manifest records it (``None`` before any feature came).

        Returns
        -------
        dict or None
            ``images`` (different images checked), ``mean_cosine`` between their features
            (``None`` for one image), ``nearly_identical`` (over
            :data:`NEAR_IDENTICAL_COSINE`), ``zero_features`` (images whose features are all
            zero), ``normalization_layers`` and ``normalization_at_init`` (see
            :func:`normalization_at_init`) and ``untrained``: any of the three signs.
        """
        if not self._rows:
            return None
        f = np.stack(self._rows)
        norms = np.linalg.norm(f, axis=1)
        zero = int((norms == 0).sum())
        m, mean = len(f), None
        if m >= 2:
            f = f / np.maximum(norms, np.finfo(np.float64).tiny)[:, None]
            gram = f @ f.T
            mean = round(float((gram.sum() - np.trace(gram)) / (m * (m - 1))), 4)
        found = {
            "images": m,
            "mean_cosine": mean,
            "nearly_identical": mean is not None and mean > NEAR_IDENTICAL_COSINE,
            "zero_features": zero,
            "normalization_layers": self.normalization["layers"],
            "normalization_at_init": self.normalization["at_init"],
        }
        found["untrained"] = bool(untrained_reasons(found))
        return found


def untrained_reasons(check):
    """What in a recorded check (:meth:`FeatureCheck.result`) says the network is untrained,
    one phrase per sign; ``[]`` when nothing does. Checks recorded before the weights
    statistic and the zero count existed are read for what they hold.

    Examples
    --------
    >>> untrained_reasons({"images": 6, "mean_cosine": 0.31, "nearly_identical": False,
    ...                    "zero_features": 0, "normalization_layers": 25,
    ...                    "normalization_at_init": 25})
    ["25 of the network's 25 normalization layers hold the values they were built with (scale constant, shift zero)"]
    """
    reasons = []
    if check.get("nearly_identical"):
        reasons.append(
            f"the features of {check['images']} different images are nearly identical "
            f"(mean cosine {check['mean_cosine']:.3f})"
        )
    if check.get("zero_features") and check["zero_features"] == check.get("images"):
        reasons.append(f"the features of the {check['images']} images checked are all zero")
    layers, at_init = check.get("normalization_layers") or 0, check.get("normalization_at_init")
    if layers and 2 * (at_init or 0) > layers:
        reasons.append(
            f"{at_init} of the network's {layers} normalization layers hold the values they "
            "were built with (scale constant, shift zero)"
        )
    return reasons
