"""imagenet_cog: the ImageNet-CoG concept generalization benchmark."""

from ._version import __version__
from .levels import Levels, build_levels, load_levels
from .similarity import available_measures, register_measure, similarity
from .taxonomy import (
    Taxonomy,
    imagenet1k_wnids,
    imagenet21k_wnids,
    load_taxonomy,
)

__all__ = [
    "Levels",
    "Taxonomy",
    "__version__",
    "available_measures",
    "build_levels",
    "imagenet1k_wnids",
    "imagenet21k_wnids",
    "load_levels",
    "load_taxonomy",
    "register_measure",
    "similarity",
]
