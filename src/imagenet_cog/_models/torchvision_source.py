"""The ``torchvision:NAME[:WEIGHTS]`` source: torchvision's model builders and weights.

Stage "features". Named weights come from torch's cache (``torch.hub.get_dir()/checkpoints``);
the preprocessing is the paper's preset or the extractor's default (torchvision's weights
carry no eval transform the paper used), and the layer the input of the classifier.
"""

from __future__ import annotations

import os

from .registry import (
    LoadedModel,
    WeightsUnavailableError,
    check_weights_file,
    is_file_weights,
    load_weights_file,
    named_weights,
    seeded,
)


def load(name, weights, spec, load_weights=True):
    """The network of ``torchvision:NAME[:WEIGHTS]``."""
    import torchvision.models

    weights = named_weights(weights)
    file = weights if weights and is_file_weights(weights) else None
    if not load_weights:
        weights = file = None
    check_weights_file(file)
    if name not in torchvision.models.list_models():
        raise ValueError(f"torchvision has no model {name!r}")
    kwargs = {}
    if weights and not file:
        choices = torchvision.models.get_model_weights(name)
        if weights not in choices.__members__:
            raise ValueError(
                f"unknown weights {weights!r} for torchvision's {name}; "
                f"choose from {', '.join(choices.__members__)}, 'none' or a file"
            )
        kwargs["weights"] = choices[weights]
    elif name in ("inception_v3", "googlenet"):
        kwargs["init_weights"] = False  # the scipy-based init is slow and warns
    with seeded():
        try:
            module = torchvision.models.get_model(name, **kwargs)
        except OSError as exc:  # URLError, socket and SSL errors: no download
            if "weights" not in kwargs:
                raise
            raise _weights_unavailable(spec, name, kwargs["weights"].url, exc) from None
    if file:
        load_weights_file(module, file)
    return LoadedModel(module, "file" if file else "pretrained" if weights else "random")


def _weights_unavailable(spec, name, url, exc):
    """The error for a failed download of ``url``, the weights of ``spec``."""
    import torch.hub

    file = os.path.basename(url.split("?", 1)[0])
    cache = os.path.join(torch.hub.get_dir(), "checkpoints")
    return WeightsUnavailableError(
        f"the weights of {spec!r} could not be downloaded from {url} "
        f"({type(exc).__name__}: {exc}). torch looks for them in {cache}: copy "
        f"{file} there (the file name must stay {file}), or pass a local checkpoint "
        f"instead, as in 'torchvision:{name}:/path/to/{file}'"
    )
