"""imagenet_cog: the ImageNet-CoG concept generalization benchmark.

The pipeline, one public module per stage: :mod:`~imagenet_cog.taxonomy` →
:mod:`~imagenet_cog.similarity` → :mod:`~imagenet_cog.levels` →
:mod:`~imagenet_cog.datasets` → :mod:`~imagenet_cog.features` (and its
:mod:`~imagenet_cog.store`) → :mod:`~imagenet_cog.probe` →
:mod:`~imagenet_cog.results` → :mod:`~imagenet_cog.protocol` →
:mod:`~imagenet_cog.analysis`, with the command line on top. A module imports
only its own stage and earlier ones, so there is no import circle
(``tests/test_architecture.py`` checks it). ``results`` comes before
``protocol`` because it defines what the protocol hands back: the
:class:`~imagenet_cog.Results` container, its tables and the paper's numbers.
Private modules hold what several stages share (``_grid``: the benchmark grid;
``_validation``; ``_fileio``: atomic writes and locks; ``_runfolder``: the
files of an ``evaluate`` folder; ``_train``: the SGD engine and the searches; ``_models``: the model sources) and import
nothing from later stages.
"""

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

# torch, torchvision and scikit-learn load slowly: the feature, probe and
# protocol APIs are imported on first use.
_LAZY = {
    "FeatureExtractor": ".features",
    "extract": ".store",
    "extract_all": "._extract_all",
    "LinearProbe": ".probe",
    "LinearProbeCV": ".probe",
    "SearchResult": "._train.search",
    "SearchSpec": "._train.search",
    "make_search_spec": "._train.search",
    "run_searches": "._train.search",
    "evaluate": ".protocol",
}

__all__ = [
    "FeatureExtractor",
    "Levels",
    "LinearProbe",
    "LinearProbeCV",
    "Results",
    "SearchResult",
    "SearchSpec",
    "Taxonomy",
    "__version__",
    "available_measures",
    "build_levels",
    "evaluate",
    "extract",
    "extract_all",
    "imagenet1k_wnids",
    "imagenet21k_wnids",
    "load_levels",
    "load_taxonomy",
    "make_search_spec",
    "reference_results",
    "register_measure",
    "run_searches",
    "similarity",
]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
