"""The ``torchhub:REPO_DIR:ENTRYPOINT[:none|FILE]`` source: ``torch.hub.load`` on a local clone.

Stage "features". ``torch.hub.load(REPO_DIR, ENTRYPOINT, source="local")``, for a clone of
``facebookresearch/dinov2`` for example. Weights the entrypoint fetches with
``torch.hub.load_state_dict_from_url`` come from torch's cache (``torch.hub.get_dir()/
checkpoints``), read with :func:`~.weights.read_checkpoint` (never unpickled); downloads are
switched off while the entrypoint runs, so a missing file is a one-line error instead of a
network access. ``none`` calls the entrypoint with
``pretrained=False``; a file is loaded into that network, as for the other sources.

An entrypoint carries no preprocessing: the extractor's default applies (224 px, bicubic,
ImageNet mean and std) unless ``preprocessing=`` is given. The feature follows the extractor's
rule: the input of the classifier, or the output when there is none (DINOv2's backbones
return the class token after the final norm).
"""

from __future__ import annotations

import contextlib
import os

from .registry import LoadedModel, seeded
from .spec import is_file_weights
from .weights import (
    WeightsUnavailableError,
    cached_url_reader,
    check_weights_file,
    load_weights_file,
    routed,
)


class _DownloadsOff(OSError):
    """Raised instead of a download while an entrypoint runs."""


def load(name, weights, spec, load_weights=True):
    """The network of ``torchhub:REPO_DIR:ENTRYPOINT[:WEIGHTS]``."""
    import torch.hub

    entry, _, weights = weights.partition(":")
    entry, weights = entry.strip(), weights.strip()
    if not entry:
        raise ValueError(f"bad model spec {spec!r}: use 'torchhub:REPO_DIR:ENTRYPOINT[:none|FILE]'")
    if not os.path.isfile(os.path.join(name, "hubconf.py")):
        raise FileNotFoundError(
            f"{name} is not a local torch.hub repository (it has no hubconf.py): give the folder "
            "of a clone of the model's repository, the one that holds its hubconf.py (git "
            "clone <its URL> <folder>)"
        )
    entries = _entrypoints(name)
    if entry not in entries:
        raise ValueError(
            f"{name}/hubconf.py has no entrypoint {entry!r}; it has {', '.join(entries)}"
        )
    file = weights if weights and is_file_weights(weights) else None
    if weights and not file and weights.lower() != "none":
        raise ValueError(f"torchhub weights must be 'none' or a file, got {weights!r}")
    if not load_weights:
        weights = file = None
    check_weights_file(file)
    kwargs = {"pretrained": False} if weights or not load_weights else {}
    reader = cached_url_reader(lambda url, path, check_hash: _refuse(spec, url, path))
    route = routed(torch.hub, "load_state_dict_from_url", reader)
    with seeded(), _downloads_off(spec), route:
        try:
            module = torch.hub.load(name, entry, source="local", **kwargs)
        except _DownloadsOff as exc:
            raise WeightsUnavailableError(
                f"{exc}; or pass ':none' or a local file instead, as in "
                f"'torchhub:{name}:{entry}:/path/to/weights.pth'"
            ) from None
        except TypeError as exc:
            if not kwargs:
                raise
            raise ValueError(
                f"{spec!r}: the entrypoint {entry!r} takes no pretrained= ({exc})"
            ) from None
    if not isinstance(module, torch.nn.Module):  # a bad spec, said in one line by the CLI
        raise ValueError(  # noqa: TRY004
            f"{spec!r}: the entrypoint {entry!r} returned a {type(module).__name__}, not an "
            "nn.Module; pick an entrypoint that builds a network"
        )
    head = load_weights_file(module, file) if file else ()
    kind = "file" if file else "random" if weights or not load_weights else "pretrained"
    return LoadedModel(module, kind, head_not_loaded=head)


def _entrypoints(repo):
    """The entrypoints of a local ``hubconf.py``, as ``torch.hub.list`` finds them on GitHub."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("hubconf", os.path.join(repo, "hubconf.py"))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(repo))  # hubconf.py imports its own repository, as torch.hub lets it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(repo))
    return sorted(f for f in dir(module) if callable(getattr(module, f)) and not f.startswith("_"))


def _refuse(spec, url, dst):
    file = os.path.basename(url.split("?", 1)[0])
    raise _DownloadsOff(
        f"the weights of {spec!r} ({url}) are not in torch's cache "
        f"{os.path.dirname(dst)}; nothing is downloaded: copy {file} there"
    )


@contextlib.contextmanager
def _downloads_off(spec):
    """``torch.hub`` reads its cache but downloads nothing while inside."""
    import torch.hub

    def refuse(url, dst, *args, **kwargs):
        _refuse(spec, url, dst)

    original = torch.hub.download_url_to_file
    torch.hub.download_url_to_file = refuse
    try:
        yield
    finally:
        torch.hub.download_url_to_file = original
