"""imagenet_cog: the ImageNet-CoG concept generalization benchmark.

Every public name is exported here (``imagenet_cog.__all__``, listed in the API reference),
plus :mod:`imagenet_cog.analysis`, the one sub-namespace. The modules behind them follow the
pipeline, one module per stage: ``taxonomy`` → ``measures`` → ``levels`` → ``datasets`` →
``features`` (and its ``store``) → ``probe`` → ``results`` → ``protocol`` → ``analysis``, with
the command line on top. The stage modules export nothing of their own: a public name has one
documented path, the package's (``imagenet_cog.make_split``), and the docs name no other. A
module imports only its own stage and earlier ones, so there is no import circle
(``tests/test_architecture.py`` checks it). ``results`` comes before ``protocol`` because it
defines what the protocol hands back: the :class:`~imagenet_cog.Results` container, its tables
and the paper's numbers.

Private modules hold what a stage needs beyond its face module, and what several stages
share. Wings group the larger ones: ``_data``, the data wing (reading a copy of ImageNet in any
layout: the image sources, the one tar reader, one reader per layout behind one listing, which
extraction and ``count_images`` both read, the published copies, and the decoders), ``_train``,
the training wing (the SGD engine, the fused step, the feed, the memory plan and the searches),
``_models``, the models wing (the source registry, the model sources and the presets),
``_protocol``, the protocol's (the checks of ``evaluate``'s input), ``_reporting``, what a reader
reads of results (the verdict, the models' names and the runs loaded under them, the answer
first, the HTML report), and ``_analysis``, the analysis wing (one module per analysis, and
``_analysis/table.py``, the table of analyses: one row per analysis, with what it needs, how it
runs on a domain and its measures, which ``analyze``, the analysis tables and the HTML report
loop over; a new analysis is its module and its row; the wing sits with the results stage,
whose readers show its table, and ``analysis`` is its face). The readers of results (the
tables, the exports, the figures, the HTML report) read :class:`~imagenet_cog.Results` through
its documented methods (``cell``, ``score_grid``, ``score_table``, ``runs``), never its private
attributes, and never the run folders again. Flat private modules hold the rest: ``_base``
(what a wnid looks like, image files, the package's data files), ``_grid`` (the paper's
protocol: its grid, each search's holdout, and its settings as one frozen ``Protocol`` whose
defaults are the paper's values, which ``evaluate`` and ``plan_evaluate`` make, the engine and
the memory plan read, ``config.json`` records, and the verdict, the paired test and the report
compare), ``_validation`` (the parameter checks' vocabulary), ``_device`` (where the work runs:
the device, the dtypes and the precision, which the extraction, the probes and the analyses
resolve without entering the training wing), ``_fileio`` (atomic writes and locks),
``_distributed`` (the processes of a torchrun job), ``_runfolder`` (the files of an
``evaluate`` folder) and ``_comparability`` (the paper's results, and the checks of a run
against them and against the paper's protocol). None imports anything from a later stage.

When a module nears the cap of 1,000 lines: a stage that needs more than its face module gets
a private wing, and a piece cut off to stay under the cap goes into its stage's wing, named for
what it is, never into a new flat module.
"""

from ._comparability import NotComparableError, comparability
from ._plugins import PluginError
from ._version import __version__
from .levels import Levels, UnofficialLevelsWarning, build_levels, count_images, load_levels
from .measures import available_measures, max_similarity, register_measure, similarity
from .results import Results, reference_results
from .taxonomy import Taxonomy, imagenet1k_wnids, imagenet21k_wnids, load_taxonomy

# torch, torchvision and scikit-learn load slowly: the feature, probe and
# protocol APIs are imported on first use.
_LAZY = {
    "FeatureExtractor": ".features",
    "LoadedModel": "._models.registry",
    "WeightsUnavailableError": "._models.weights",
    "available_model_sources": "._models.registry",
    "load_model": "._models.registry",
    "register_model_source": "._models.registry",
    "make_split": ".datasets",
    "FeatureStore": ".store",
    "StoreCorruptError": "._storecheck",
    "StoreMismatchError": ".store",
    "extract": "._extract_all",
    "list_domains": ".store",
    "load_domain": ".store",
    "open_store": ".store",
    "extract_all": "._extract_all",
    "LinearProbe": ".probe",
    "LinearProbeCV": ".probe",
    "SearchResult": "._train.search",
    "SearchSpec": "._train.search",
    "make_search_spec": "._train.search",
    "run_searches": "._train.search",
    "evaluate": ".protocol",
    "plan_evaluate": ".protocol",
    "EvaluatePlan": ".protocol",
}

__all__ = [
    "EvaluatePlan",
    "FeatureExtractor",
    "FeatureStore",
    "Levels",
    "LinearProbe",
    "LinearProbeCV",
    "LoadedModel",
    "NotComparableError",
    "PluginError",
    "Results",
    "SearchResult",
    "SearchSpec",
    "StoreCorruptError",
    "StoreMismatchError",
    "Taxonomy",
    "UnofficialLevelsWarning",
    "WeightsUnavailableError",
    "__version__",
    "available_measures",
    "available_model_sources",
    "build_levels",
    "comparability",
    "count_images",
    "evaluate",
    "extract",
    "extract_all",
    "imagenet1k_wnids",
    "imagenet21k_wnids",
    "list_domains",
    "load_domain",
    "load_levels",
    "load_model",
    "load_taxonomy",
    "make_search_spec",
    "make_split",
    "max_similarity",
    "open_store",
    "plan_evaluate",
    "reference_results",
    "register_measure",
    "register_model_source",
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
