"""Model loading: a spec such as ``"timm:convnext_base.fb_in1k:pretrained"`` in, a network out.

Stage "features". One small interface, one module per source:

* a *source* is a function ``load(name, weights, spec) -> LoadedModel``, registered under
  the spec's first field (``torchvision``, ``timm``, ``open_clip``, ``hf``, ``torchhub``; see
  :func:`register_model_source`); the built-in ones live in ``<name>_source.py`` and are
  imported on first use, so a new source is one new file and one line in ``_SOURCES``;
* :class:`LoadedModel` is what it hands back: the network, how its weights were resolved
  (``"random"``, ``"pretrained"`` or ``"file"``), the preprocessing its library prescribes
  and the layer its features are taken from;
* the helpers every source shares: the seeded random initialization and the one-line error
  for a missing library. The spec's text is taken apart in :mod:`.spec`; weights files are
  found and read in :mod:`.weights`.

torch and the model libraries are imported only when a network is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections import OrderedDict
from typing import Any

from .._plugins import MODEL_SOURCES, PluginError, entry_point, entry_point_names
from .spec import bad_spec, split_spec

__all__ = [
    "LoadedModel",
    "available_model_sources",
    "load_model",
    "load_source_model",
    "parse_spec",
    "register_model_source",
    "seeded",
]

#: The built-in sources: the module whose ``load`` builds their networks.
_SOURCES = OrderedDict(
    [
        ("torchvision", ".torchvision_source"),
        ("timm", ".timm_source"),
        ("open_clip", ".open_clip_source"),
        ("hf", ".hf_source"),
        ("torchhub", ".torchhub_source"),
    ]
)
#: Sources added with :func:`register_model_source`.
_REGISTERED = OrderedDict()


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """What a model source hands back for a spec.

    Parameters
    ----------
    module : torch.nn.Module
        The network, on the CPU; its output (or the input of its classifier, see ``layer``)
        is the feature.
    weights : {"random", "pretrained", "file"}
        How the weights were resolved: the seeded random initialization, the library's
        named weights (from its cache), or a checkpoint file.
    preprocessing : dict or callable, optional
        What the library prescribes for this network: ``resize`` (the shorter side, or
        ``[height, width]`` for a resize that ignores the aspect ratio), ``crop``,
        ``interpolation``, ``mean`` and ``std``; or a function returning it, called only
        when the user gives no preprocessing of their own (so that a configuration the
        extractor cannot follow is an error only then). ``None``: the library has no such
        configuration, and the extractor's default applies.
    layer : str, optional
        ``"feature:<what>"`` when the module's output is the feature and ``<what>`` names
        it for the store's key (``feature:pre_logits:token``, ``feature:image_embedding``...);
        ``None``: the extractor's rule (the input of the classifier, see
        :func:`~.classifier_input.find_feature_layer`).
    source : str
        The spec's source (``"timm"``...).
    head_not_loaded : tuple of str
        The classifier weights a checkpoint file did not set (see
        :func:`~imagenet_cog._models.weights.load_weights_file`): the feature layer must
        come before them.
    loader : str
        Set by :func:`load_source_model`: the code that loaded the network, as
        ``package.module:function``.
    replaces_builtin : bool
        Set by :func:`load_source_model`: the loader is a plug-in registered under the name
        of a built-in source (``--source torchvision=pkg:fn``), not the library's own.

    Examples
    --------
    >>> import torch
    >>> loaded = LoadedModel(torch.nn.Identity(), "random", layer="feature:identity")
    >>> loaded.weights, loaded.get_preprocessing()
    ('random', None)
    """

    module: Any
    weights: str
    preprocessing: Any = None
    layer: str | None = None
    source: str = ""
    head_not_loaded: tuple = ()
    loader: str = ""
    replaces_builtin: bool = False

    def __post_init__(self):
        if self.weights not in ("random", "pretrained", "file"):
            raise ValueError(
                f"weights must be 'random', 'pretrained' or 'file', got {self.weights!r}"
            )
        if self.layer is not None and not str(self.layer).startswith("feature:"):
            raise ValueError(f"a source's layer is 'feature:<what>' or None, got {self.layer!r}")

    def get_preprocessing(self):
        """The library's preprocessing as a dict (``preprocessing``, called if a function)."""
        p = self.preprocessing
        return p() if callable(p) else p


# ------------------------------------------------------------------ registry
def register_model_source(name, loader, *, overwrite=False):
    """Make ``"NAME:..."`` specs load with ``loader``, everywhere a model spec is accepted.

    Parameters
    ----------
    name : str
        The spec's first field; no ``:``.
    loader : callable
        ``loader(name, weights, spec) -> LoadedModel``: ``name`` is the spec's second field,
        ``weights`` the rest (``""`` when absent), ``spec`` the whole spec, for messages.
        It builds the network on the CPU, its random initialization seeded
        (``torch.manual_seed(0)`` inside ``torch.random.fork_rng``) so that every process
        builds the same one. A loader that also
        takes ``load_weights=False`` builds the spec's network, preprocessing and layer
        with random weights instead of its named or file weights.
    overwrite : bool
        Replace a source of that name.

    Returns
    -------
    callable
        ``loader``.

    Examples
    --------
    >>> import torch
    >>> from imagenet_cog import FeatureExtractor, LoadedModel, register_model_source
    >>> def tiny(name, weights, spec):
    ...     net = torch.nn.Sequential(torch.nn.Conv2d(3, int(name), 3), torch.nn.Flatten(1))
    ...     return LoadedModel(net, "random", {"size": 4}, "feature:flat")
    >>> _ = register_model_source("tiny", tiny, overwrite=True)
    >>> ext = FeatureExtractor("tiny:2")
    >>> ext.fingerprint()["layer"], ext.get_preprocessing()["crop"]
    ('feature:flat', 4)
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"a model source needs a non-empty name without ':', got {name!r}")
    if not callable(loader):
        raise PluginError(f"the loader of model source {name!r} is not callable")
    if (name in _SOURCES or name in _REGISTERED) and not overwrite:
        raise ValueError(f"a model source named {name!r} exists; pass overwrite=True to replace it")
    _REGISTERED[name] = loader
    return loader


def available_model_sources():
    """Names of the model sources: the built-in ones, the registered ones, then those that
    installed packages offer (entry-point group ``imagenet_cog.model_sources``).

    Returns
    -------
    list of str

    Examples
    --------
    >>> available_model_sources()[:5]
    ['torchvision', 'timm', 'open_clip', 'hf', 'torchhub']
    """
    names = list(_SOURCES) + [s for s in _REGISTERED if s not in _SOURCES]
    return names + [s for s in entry_point_names(MODEL_SOURCES) if s not in names]


def _loader(source):
    if source in _REGISTERED:
        return _REGISTERED[source]
    if source in _SOURCES:
        return importlib.import_module(_SOURCES[source], __package__).load
    loader = entry_point(MODEL_SOURCES, source, "model source")  # an installed package's
    if loader is None or not callable(loader):
        raise ValueError(f"model source {source!r} is not callable or not installed")
    _REGISTERED[source] = loader
    return loader


def parse_spec(spec):
    """``(source, name, weights)`` of a spec: ``weights`` is the rest after ``NAME:``, or ``""``.

    The text's rules are :func:`~imagenet_cog._models.spec.split_spec`'s; the source must be
    a built-in or registered one.

    Examples
    --------
    >>> parse_spec("timm:convnext_base.fb_in1k:pretrained")
    ('timm', 'convnext_base.fb_in1k', 'pretrained')
    >>> parse_spec("torchvision:resnet50")
    ('torchvision', 'resnet50', '')
    """
    source, name, weights = split_spec(spec)
    if source not in available_model_sources():
        raise bad_spec(spec)
    return source, name, weights


def load_source_model(spec, *, load_weights=True):
    """The :class:`LoadedModel` of a spec, its network in eval mode on the CPU.

    Parameters
    ----------
    spec : str
        See :func:`load_model`.
    load_weights : bool
        ``False``: everything the spec resolves to (architecture, preprocessing, feature
        layer) from the library's configuration, with random weights instead of the named
        or file weights, which need not exist. Built under ``torch.device("meta")``, a
        network takes no memory, and its width shows in a forward pass of a meta tensor.

    Returns
    -------
    LoadedModel

    Examples
    --------
    >>> loaded = load_source_model("torchvision:resnet18")
    >>> loaded.weights, loaded.source, loaded.module.training
    ('random', 'torchvision', False)
    """
    source, name, weights = parse_spec(spec)
    loader = _loader(source)
    if load_weights:
        loaded = loader(name, weights, spec)
    else:
        loaded = loader(name, weights, spec, load_weights=False)
    if not isinstance(loaded, LoadedModel):
        raise PluginError(
            f"the {source!r} model source returned a {type(loaded).__name__}, not a "
            "LoadedModel (imagenet_cog.LoadedModel(module, weights, ...))"
        )
    loaded.module.eval()
    # Which code made the network: a spec names a source, and a plug-in may take a built-in
    # source's name.
    qualname = getattr(loader, "__qualname__", type(loader).__qualname__)
    code = f"{getattr(loader, '__module__', '?')}:{qualname}"
    replaced = source in _SOURCES and source in _REGISTERED
    return dataclasses.replace(loaded, source=source, loader=code, replaces_builtin=replaced)


def load_model(spec):
    """Build the network named by a spec, in eval mode, on the CPU.

    Weights never come from the network: named weights are read from their library's own
    cache, or from a local file given in the spec.

    Parameters
    ----------
    spec : str
        One of

        * ``"torchvision:NAME[:WEIGHTS]"``: ``WEIGHTS`` is a torchvision weights name
          (``IMAGENET1K_V1``, ``DEFAULT``...), a checkpoint file, or ``none``;
        * ``"timm:NAME[:WEIGHTS]"`` (``pip install 'imagenet_cog[timm]'``): ``NAME`` may
          carry timm's pretrained tag (``vit_base_patch16_224.mae``); ``WEIGHTS`` is
          ``pretrained``, a checkpoint file, or ``none``; the network comes without its
          classifier (``num_classes=0``);
        * ``"open_clip:ARCH[:WEIGHTS]"`` (``[openclip]``): ``WEIGHTS`` is an OpenCLIP
          pretrained tag (``openai``, ``laion2b_s34b_b88k``...), a checkpoint of the whole
          CLIP model, or ``none``; the network is the image encoder;
        * ``"hf:REPO_ID_OR_DIR[:none]"`` (``[hf]``): a ``transformers`` vision backbone
          from the Hugging Face cache or a local folder, with its weights (``none``: the
          configuration only, random weights);
        * ``"torchhub:REPO_DIR:ENTRYPOINT[:WEIGHTS]"``: ``torch.hub.load(REPO_DIR,
          ENTRYPOINT, source="local")`` on a local clone; ``WEIGHTS`` is ``none`` (the
          entrypoint called with ``pretrained=False``) or a checkpoint file.

        Without ``WEIGHTS`` (or with ``none``), torchvision, timm and OpenCLIP networks keep
        their random initialization, drawn with seed 0 so that every process builds the
        same network. A checkpoint file is read without unpickling: ``.safetensors`` with
        safetensors, anything else with ``torch.load(weights_only=True)``; its keys may
        carry a prefix such as ``module.`` or ``backbone.``; it must fit the network
        exactly: every weight of the network in it and every weight of it used, but for the
        classifier, which may be missing or differ when the feature layer comes before it.

    Returns
    -------
    torch.nn.Module

    Raises
    ------
    WeightsUnavailableError
        When named weights are in none of their library's caches; the message names
        the file, the cache folder and how to pass a local file.
    CheckpointError
        When a weights file cannot be read as tensors or does not fit the network; the
        message names the file and the keys.
    ImportError
        When the spec's library is not installed; the message names the extra to install.

    Examples
    --------
    >>> import torch
    >>> net = load_model("torchvision:resnet18")
    >>> type(net).__name__, net.training
    ('ResNet', False)
    >>> same = load_model("torchvision:resnet18:none").state_dict()
    >>> all(torch.equal(t, same[k]) for k, t in net.state_dict().items())
    True
    """
    return load_source_model(spec).module


# ------------------------------------------------------------------ helpers
@contextlib.contextmanager
def seeded(seed=0):
    """Draw random initializations from ``seed`` inside, leaving torch's CPU RNG as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
