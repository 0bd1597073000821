"""imagenet_cog: the ImageNet-CoG concept generalization benchmark."""

from ._version import __version__
from .probe import (
    LinearProbe,
    LinearProbeCV,
    SearchResult,
    SearchSpec,
    make_search_spec,
    run_searches,
)
from .taxonomy import (
    Taxonomy,
    imagenet1k_wnids,
    imagenet21k_wnids,
    load_taxonomy,
)

__all__ = [
    "LinearProbe",
    "LinearProbeCV",
    "SearchResult",
    "SearchSpec",
    "Taxonomy",
    "__version__",
    "imagenet1k_wnids",
    "imagenet21k_wnids",
    "load_taxonomy",
    "make_search_spec",
    "run_searches",
]
