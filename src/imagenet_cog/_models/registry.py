"""Model loading: a spec such as ``"timm:convnext_base.fb_in1k:pretrained"`` in, a network out.

Stage "features". One small interface, one module per source:

* a *source* is a function ``load(name, weights, spec) -> LoadedModel``, registered under
  the spec's first field (``torchvision``, ``timm``, ``open_clip``, ``hf``, ``torchhub``; see
  :func:`register_model_source`); the built-in ones live in ``_source_<name>.py`` and are
  imported on first use, so a new source is one new file and one line in ``_SOURCES``;
* :class:`LoadedModel` is what it hands back: the network, how its weights were resolved
  (``"random"``, ``"pretrained"`` or ``"file"``), the preprocessing its library prescribes
  and the layer its features are taken from;
* the helpers every source shares: checkpoint files (``.safetensors`` without unpickling,
  ``.pth`` with ``torch.load(weights_only=True)``), the seeded random initialization, the
  Hugging Face cache, and the one-line errors for missing weights or libraries.

torch and the model libraries are imported only when a network is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
from collections import OrderedDict
from typing import Any

__all__ = [
    "HEADS",
    "LoadedModel",
    "WeightsUnavailableError",
    "available_model_sources",
    "cached_hf_file",
    "check_weights_file",
    "head_names",
    "hf_cache_dir",
    "is_file_weights",
    "load_model",
    "load_source_model",
    "load_weights_file",
    "missing_library",
    "named_weights",
    "parse_spec",
    "read_state_dict",
    "register_model_source",
    "seeded",
]

HEADS = ("fc", "classifier", "head", "heads")
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
#: Suffixes that make a spec's last field a checkpoint file rather than a weights name.
_WEIGHT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".tar")


class WeightsUnavailableError(FileNotFoundError):
    """Named weights are in none of their library's caches, and nothing is downloaded.

    The message says what is missing, where that library's cache looks for it and how to
    pass a local file instead. A subclass of ``FileNotFoundError`` (an ``OSError``): the
    weights file is missing.

    Examples
    --------
    >>> issubclass(WeightsUnavailableError, OSError)
    True
    """


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
        ``None``: the extractor's rule (the input of the classifier, else the output).
    source : str
        The spec's source (``"timm"``...).

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
        raise TypeError(f"the loader of model source {name!r} is not callable")
    if (name in _SOURCES or name in _REGISTERED) and not overwrite:
        raise ValueError(f"a model source named {name!r} exists; pass overwrite=True to replace it")
    _REGISTERED[name] = loader
    return loader


def available_model_sources():
    """Names of the model sources: the built-in ones, then the registered ones.

    Returns
    -------
    list of str

    Examples
    --------
    >>> available_model_sources()[:5]
    ['torchvision', 'timm', 'open_clip', 'hf', 'torchhub']
    """
    return list(_SOURCES) + [s for s in _REGISTERED if s not in _SOURCES]


def _loader(source):
    if source in _REGISTERED:
        return _REGISTERED[source]
    return importlib.import_module(_SOURCES[source], __package__).load


def parse_spec(spec):
    """``(source, name, weights)`` of a spec: ``weights`` is the rest after ``NAME:``, or ``""``.

    Examples
    --------
    >>> parse_spec("timm:convnext_base.fb_in1k:pretrained")
    ('timm', 'convnext_base.fb_in1k', 'pretrained')
    >>> parse_spec("torchvision:resnet50")
    ('torchvision', 'resnet50', '')
    """
    source, sep, rest = str(spec).partition(":")
    name, _, weights = rest.partition(":")
    if not sep or not name or source not in available_model_sources():
        raise ValueError(
            f"bad model spec {spec!r}: use 'torchvision:NAME[:WEIGHTS]', "
            "'timm:NAME[:pretrained|none|FILE]', 'open_clip:ARCH[:TAG|none|FILE]', "
            "'hf:REPO_ID_OR_DIR[:none]' or 'torchhub:REPO_DIR:ENTRYPOINT[:none|FILE]', "
            "or pass an nn.Module"
        )
    return source, name.strip(), weights.strip()


def named_weights(weights):
    """A spec's weights field, or None when it is absent or ``none`` (random weights)."""
    return None if weights.lower() in ("", "none") else weights


def is_file_weights(weights):
    """Whether a spec's weights field names a file (a path, or a checkpoint's suffix)."""
    return os.sep in weights or "/" in weights or weights.endswith(_WEIGHT_SUFFIXES)


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
        raise TypeError(f"the {source!r} model source returned {loaded!r}, not a LoadedModel")
    loaded.module.eval()
    return dataclasses.replace(loaded, source=source)


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
        carry a prefix such as ``module.`` or ``backbone.``; every weight of the network
        except the classifier must be in it.

    Returns
    -------
    torch.nn.Module

    Raises
    ------
    WeightsUnavailableError
        When named weights are in none of their library's caches; the message names
        the file, the cache folder and how to pass a local file.
    ImportError
        When the spec's library is not installed; the message names the extra to install.

    Examples
    --------
    >>> from imagenet_cog.features import weights_sha256
    >>> net = load_model("torchvision:resnet18")
    >>> type(net).__name__, net.training
    ('ResNet', False)
    >>> weights_sha256(net) == weights_sha256(load_model("torchvision:resnet18:none"))
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


def missing_library(spec, package, extra):
    """The one-line error for a spec whose library is not installed."""
    return ImportError(
        f"the model spec {spec!r} needs {package}, which is not installed: "
        f"pip install 'imagenet_cog[{extra}]'"
    )


def hf_cache_dir():
    """The Hugging Face hub cache (``HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        home = os.environ.get("HF_HOME", os.path.join("~", ".cache", "huggingface"))
        return os.path.expanduser(os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub")))
    return str(constants.HF_HUB_CACHE)


def cached_hf_file(repo_id, filenames):
    """The path of the first of ``filenames`` in the Hugging Face cache for ``repo_id``, or None.

    Looks only in the cache; never downloads. ``repo_id`` may end in ``@revision``.
    """
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    repo_id, _, revision = repo_id.partition("@")
    for filename in filenames:
        path = try_to_load_from_cache(repo_id, filename, revision=revision or None)
        if isinstance(path, str) and os.path.isfile(path):
            return path
    return None


def check_weights_file(path):
    """Raise the one-line error for a weights file that is not there, before any network is built."""
    if path and not os.path.isfile(path):
        raise FileNotFoundError(f"no weights file at {path}")


def read_state_dict(path):
    """The tensors of a checkpoint file, read without unpickling anything.

    ``.safetensors`` files are read with safetensors; any other file with
    ``torch.load(weights_only=True)``, which refuses everything but tensors and plain
    containers. A ``state_dict``, ``model``, ``teacher``, ``module`` or ``net`` entry is
    unwrapped.
    """
    import torch

    check_weights_file(path)
    if str(path).endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ImportError(
                f"reading {path} needs safetensors, which is not installed: pip install safetensors"
            ) from None
        state = load_file(str(path), device="cpu")
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "teacher", "module", "net"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not state:
        raise ValueError(f"{path}: not a state dict")
    return state


def load_weights_file(module, path):
    """Load a checkpoint file into ``module``: a key prefix is found, the classifier may miss."""
    state = read_state_dict(path)
    own = module.state_dict()
    # The most common prefix that maps the file's keys onto the network's
    # (``module.``, ``backbone.``, ``module.encoder_q.``...).
    counts = {}
    for key in state:
        parts = str(key).split(".")
        for i in range(len(parts)):
            if ".".join(parts[i:]) in own:
                prefix = ".".join(parts[:i]) + ("." if i else "")
                counts[prefix] = counts.get(prefix, 0) + 1
                break
    if not counts:
        raise ValueError(f"{path}: none of its keys match the network's weights")
    prefix = min(counts, key=lambda p: (-counts[p], len(p)))
    matched = {k[len(prefix) :]: v for k, v in state.items() if str(k).startswith(prefix)}
    matched = {k: v for k, v in matched.items() if k in own}
    head = head_names(module)
    missing = [k for k in own if k not in matched and not any(k.startswith(h + ".") for h in head)]
    if missing:
        raise ValueError(
            f"{path}: {len(missing)} weights of the network are missing from the file "
            f"(keys read with prefix {prefix!r}), e.g. {', '.join(missing[:5])}"
        )
    bad = [k for k, v in matched.items() if tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        raise ValueError(f"{path}: shapes differ from the network's for {', '.join(bad[:5])}")
    module.load_state_dict(matched, strict=False)


def head_names(module):
    """The classifier attributes (``fc``, ``classifier``, ``head``, ``heads``) of a network."""
    from torch import nn

    return [h for h in HEADS if isinstance(getattr(module, h, None), nn.Module)]
