"""The ``timm:NAME[:WEIGHTS]`` source: timm's model builders, without their classifier.

Stage "features".
"""

from __future__ import annotations

from ._model_sources import WeightsUnavailableError


def load(spec, name, weights, file):
    """The network of ``timm:NAME[:WEIGHTS]``, before any weights file is loaded."""
    import torch

    try:
        import timm
    except ImportError:
        raise ImportError(
            f"the model spec {spec!r} needs timm, which is not installed: pip install timm"
        ) from None
    if weights and not file and weights != "pretrained":
        raise ValueError(f"timm weights must be 'pretrained', 'none' or a file, got {weights!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            module = timm.create_model(name, pretrained=weights == "pretrained", num_classes=0)
        except OSError as exc:  # pragma: no cover - needs timm offline
            if weights != "pretrained":
                raise
            raise WeightsUnavailableError(
                f"the pretrained weights of {spec!r} could not be downloaded "
                f"({type(exc).__name__}: {exc}); timm reads them from the Hugging Face "
                "cache (HF_HOME); or pass a local checkpoint instead, as in "
                f"'timm:{name}:/path/to/checkpoint.pth'"
            ) from None
    return module
