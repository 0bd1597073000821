"""Is a network untrained? The check every extraction makes, whatever the network's source.

Stage "features". A network whose weights never loaded (a checkpoint for another model read
with ``strict=False``, a plug-in that forgot to load them, a module built and never trained)
gives features that look like features. Three statistics tell it:

* **from the weight tensors**, :func:`weights_at_init`, whatever the family: every
  initialisation draws the entries of a weight matrix or kernel independently from one
  distribution (uniform, normal, truncated normal, of any scale), so the sum of the squared
  entries of each row (output channel) and of each column (input channel) spreads as such a
  draw makes it spread: its variance is ``n`` times the variance of one squared entry. A
  trained network's rows and columns carry different weight (some channels matter more):
  their spread is many times that. A tensor whose rows and columns both stay within
  :data:`IID_SIGMAS` standard errors of the draw's spread is as initialised; more than half
  of the tensors tested so is an untrained network. It reads any network with weight
  matrices (convolutions, linear layers, embeddings, attention), with or without
  normalization layers, BatchNorm folded into its convolutions, timm's NF-nets and ResMLP
  included, and a network after a few steps of training as much as one never trained.
* **from the normalization layers**, :func:`normalization_at_init`: the normalization layers
  (BatchNorm, LayerNorm, GroupNorm, RMSNorm and the libraries' own ``...Norm`` modules) of a
  network built and not trained hold the values they were built with: every scale the same
  number (1, or 0 where a library zero-initialises a block's last one) and every shift 0; a
  layer without a scale or shift has its running mean 0 and variance 1. More than half of
  them at those values is an untrained network (or one whose normalization layers were not
  loaded).
* **from the features**, :class:`FeatureCheck`: features that are all zero; and, for a
  network with no weight tensor to test only, the mean cosine between the features of
  different images (up to :data:`CHECKED_FEATURES`, over as many batches as it takes) above
  :data:`NEAR_IDENTICAL_COSINE`, as random convolutional networks with ReLUs give them. A
  trained network's features of near-identical images (crops of one photo) are alike too, so
  the cosine never judges a network whose weights were read.

Non-finite features are checked in every batch by the extractor itself (they stop the run).
Measured on real photos in the features guide ("Checks of the features").
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = [
    "CHECKED_FEATURES",
    "IID_SIGMAS",
    "NEAR_IDENTICAL_COSINE",
    "FeatureCheck",
    "normalization_at_init",
    "untrained_reasons",
    "weights_at_init",
]

#: Mean cosine between the features of different images above which they are nearly
#: identical, as a random ReLU network's are (measured in the features guide).
NEAR_IDENTICAL_COSINE = 0.9
#: The first different images of an extraction whose features are checked.
CHECKED_FEATURES = 64
#: Standard errors of an independent draw's spread within which the spread of a weight
#: tensor's rows and columns is taken as drawn at initialisation (measured in the features
#: guide: random networks of every family sit within 1.5, trained ones far beyond).
IID_SIGMAS = 5.0
#: Rows (and columns) a weight tensor needs for its spread to be read.
MIN_CHANNELS = 8


def _spread_ratios(weight):
    """The variance of the row sums and of the column sums of a tensor's squared entries,
    each over what an independent draw of its entries gives, with its standard error:
    ``[(ratio, standard error), ...]``; ``[]`` when the tensor cannot be read so (fewer than
    :data:`MIN_CHANNELS` rows, one value throughout, not finite)."""
    import torch

    w = weight.detach()
    while w.dim() > 2 and w.shape[0] == 1:  # (1, tokens, width) position embeddings
        w = w[0]
    if w.dim() < 2 or w.shape[0] < MIN_CHANNELS or w.is_meta:
        return []
    q = w.reshape(w.shape[0], -1).to(torch.float64).square()
    m, n = q.shape
    var = q.var()
    if not bool(torch.isfinite(var)) or float(var) == 0:
        return []
    out = [(float(q.sum(1).var() / (n * var)), (2 / (m - 1)) ** 0.5)]
    if n >= MIN_CHANNELS:
        out.append((float(q.sum(0).var() / (m * var)), (2 / (n - 1)) ** 0.5))
    return out


def weights_at_init(module):
    """How many of a network's weight tensors look as drawn at initialisation.

    Each parameter of two or more dimensions with at least :data:`MIN_CHANNELS` rows (a
    leading dimension of 1 dropped) is read as a matrix, one row per output channel. If its
    entries were drawn independently from one distribution, the variance of the row sums of
    their squares is ``n`` times the variance of one square (``n`` entries a row), and so for
    the columns: the ratio of the observed variance to that is 1, within a standard error of
    about ``sqrt(2 / (rows - 1))``. A tensor whose ratios, for its rows and for its columns,
    stay under ``1 +`` :data:`IID_SIGMAS` standard errors is as initialised.

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    dict
        ``tensors``: the weight tensors read; ``at_init``: those as initialised;
        ``median_ratio``: the median over the tensors of their larger ratio (about 1 for a
        random network), ``None`` when none was read.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 10))
    >>> weights_at_init(net)["tensors"], weights_at_init(net)["at_init"]
    (2, 2)
    >>> with torch.no_grad():  # channels of unequal weight, as training leaves them
    ...     _ = net[0].weight.mul_(torch.linspace(0.2, 3.0, 32)[:, None])
    >>> weights_at_init(net)["at_init"]
    1
    """
    tested, at_init, largest = 0, 0, []
    for param in module.parameters():
        ratios = _spread_ratios(param)
        if not ratios:
            continue
        tested += 1
        at_init += all(ratio < 1 + IID_SIGMAS * se for ratio, se in ratios)
        largest.append(max(ratio for ratio, _ in ratios))
    median = round(float(np.median(largest)), 2) if largest else None
    return {"tensors": tested, "at_init": at_init, "median_ratio": median}


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
    weights : dict, optional
        :func:`weights_at_init` of the network; without it (or with no tensor read) the mean
        cosine of the features is a sign too.

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

    def __init__(self, normalization, weights=None):
        self.normalization = dict(normalization)
        self.weights = dict(weights or {"tensors": 0, "at_init": 0, "median_ratio": None})
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
            :func:`normalization_at_init`), ``weight_tensors``, ``weight_tensors_at_init``
            and ``weight_spread_ratio`` (see :func:`weights_at_init`) and ``untrained``: any
            of the signs :func:`untrained_reasons` reads.
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
            "weight_tensors": self.weights["tensors"],
            "weight_tensors_at_init": self.weights["at_init"],
            "weight_spread_ratio": self.weights["median_ratio"],
        }
        found["untrained"] = bool(untrained_reasons(found))
        return found


def untrained_reasons(check):
    """What in a recorded check (:meth:`FeatureCheck.result`) says the network is untrained,
    one phrase per sign; ``[]`` when nothing does. Checks recorded before a statistic
    existed are read for what they hold (there, nearly identical features are a sign).

    Examples
    --------
    >>> untrained_reasons({"images": 6, "mean_cosine": 0.31, "nearly_identical": False,
    ...                    "zero_features": 0, "normalization_layers": 25,
    ...                    "normalization_at_init": 25, "weight_tensors": 51,
    ...                    "weight_tensors_at_init": 51, "weight_spread_ratio": 1.02})
    ["51 of the network's 51 weight tensors are spread as drawn at initialisation (median spread ratio 1.02; a trained network's is many times 1)", "25 of the network's 25 normalization layers hold the values they were built with (scale constant, shift zero)"]
    """
    reasons = []
    tensors, at = check.get("weight_tensors") or 0, check.get("weight_tensors_at_init") or 0
    if tensors and 2 * at > tensors:
        reasons.append(
            f"{at} of the network's {tensors} weight tensors are spread as drawn at "
            f"initialisation (median spread ratio {check.get('weight_spread_ratio')}; a trained "
            "network's is many times 1)"
        )
    layers, at_init = check.get("normalization_layers") or 0, check.get("normalization_at_init")
    if layers and 2 * (at_init or 0) > layers:
        reasons.append(
            f"{at_init} of the network's {layers} normalization layers hold the values they "
            "were built with (scale constant, shift zero)"
        )
    if check.get("zero_features") and check["zero_features"] == check.get("images"):
        reasons.append(f"the features of the {check['images']} images checked are all zero")
    # Only where no weight tensor was read: a trained network's features of near-identical
    # images (crops of one photo) are alike too.
    if check.get("nearly_identical") and not tensors:
        reasons.append(
            f"the features of {check['images']} different images are nearly identical "
            f"(mean cosine {check['mean_cosine']:.3f})"
        )
    return reasons
