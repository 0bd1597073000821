"""imagenet_cog: the ImageNet-CoG concept generalization benchmark."""

from ._version import __version__
from .levels import Levels, build_levels, load_levels
from .results import Results, reference_results
from .similarity import available_measures, register_measure, similarity
from .taxonomy import (
    Taxonomy,
    imagenet1k_wnids,
    imagenet21k_wnids,
    load_taxonomy,
)

__all__ = [
    "Levels",
    "Results",
    "Taxonomy",
    "__version__",
    "available_measures",
    "build_levels",
    "imagenet1k_wnids",
    "imagenet21k_wnids",
    "load_levels",
    "load_taxonomy",
    "reference_results",
    "register_measure",
    "similarity",
]

# torch, torchvision and scikit-learn load slowly: the feature extraction API is
# imported on first use.
_LAZY = {"FeatureExtractor": ".features", "extract": ".store"}
__all__ += ["FeatureExtractor", "extract"]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
