"""imagenet_cog: the ImageNet-CoG concept generalization benchmark."""

from ._version import __version__
from .taxonomy import (
    Taxonomy,
    imagenet1k_wnids,
    imagenet21k_wnids,
    load_taxonomy,
)

__all__ = [
    "Taxonomy",
    "__version__",
    "imagenet1k_wnids",
    "imagenet21k_wnids",
    "load_taxonomy",
]
