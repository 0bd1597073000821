"""Model loading: a spec such as ``"torchvision:resnet50:IMAGENET1K_V1"`` in, a network out.

Stage "features". :func:`load_model` parses the spec and hands it to the module of its
source (``_source_torchvision``, ``_source_timm``); checkpoint files are read here, for
every source. torch is imported only when a network is loaded.
"""

from __future__ import annotations

import importlib
import os

__all__ = [
    "HEADS",
    "WeightsUnavailableError",
    "head_names",
    "is_file_weights",
    "load_model",
    "load_weights_file",
    "parse_spec",
]

HEADS = ("fc", "classifier", "head", "heads")
#: The module that loads each source's networks: ``load(spec, name, weights, file)``.
_SOURCES = {"torchvision": "._source_torchvision", "timm": "._source_timm"}


class WeightsUnavailableError(FileNotFoundError):
    """Pretrained weights are not in torch's cache and could not be downloaded.

    The message says where the cache looks for the file and how to pass a
    local checkpoint instead. A subclass of ``FileNotFoundError`` (an
    ``OSError``): the weights file is missing.

    Examples
    --------
    >>> issubclass(WeightsUnavailableError, OSError)
    True
    """


def parse_spec(spec):
    source, sep, rest = str(spec).partition(":")
    name, _, weights = rest.partition(":")
    if not sep or not name or source not in ("torchvision", "timm"):
        raise ValueError(
            f"bad model spec {spec!r}: use 'torchvision:NAME[:WEIGHTS]' or 'timm:NAME[:WEIGHTS]', "
            "or pass an nn.Module"
        )
    weights = weights.strip()
    return source, name, None if weights.lower() in ("", "none") else weights


def is_file_weights(weights):
    return os.sep in weights or "/" in weights or weights.endswith((".pth", ".pt", ".bin"))


def load_model(spec):
    """Build the network named by a spec, in eval mode, on the CPU.

    Parameters
    ----------
    spec : str
        ``"torchvision:NAME[:WEIGHTS]"`` where ``WEIGHTS`` is a torchvision
        weights name (``IMAGENET1K_V1``, ``DEFAULT``...), a weights file, or
        ``none``; ``"timm:NAME[:WEIGHTS]"`` (needs timm) where ``WEIGHTS`` is
        ``pretrained``, a weights file, or ``none``. Without ``WEIGHTS`` (or
        with ``none``) the network keeps its random initialization, drawn with
        seed 0 so that every process builds the same network. A weights file
        is read with ``torch.load(weights_only=True)``; its keys may carry a
        prefix such as ``module.`` or ``backbone.``; every weight of the
        network except the classifier must be in it.

    Returns
    -------
    torch.nn.Module
        timm networks come without their classifier (``num_classes=0``).

    Raises
    ------
    WeightsUnavailableError
        When named weights are neither in torch's cache
        (``torch.hub.get_dir()/checkpoints``) nor downloadable; the message
        names the file and the cache folder.

    Examples
    --------
    >>> from imagenet_cog.features import weights_sha256
    >>> net = load_model("torchvision:resnet18")
    >>> type(net).__name__, net.training
    ('ResNet', False)
    >>> weights_sha256(net) == weights_sha256(load_model("torchvision:resnet18:none"))
    True
    """
    source, name, weights = parse_spec(spec)
    file = weights if weights and is_file_weights(weights) else None
    source_module = importlib.import_module(_SOURCES[source], __package__)
    module = source_module.load(spec, name, weights, file)
    if file:
        load_weights_file(module, file)
    return module.eval()


def load_weights_file(module, path):
    import torch

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no weights file at {path}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "teacher", "module", "net"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not state:
        raise ValueError(f"{path}: not a state dict")
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
    from torch import nn

    return [h for h in HEADS if isinstance(getattr(module, h, None), nn.Module)]
