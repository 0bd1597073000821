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
