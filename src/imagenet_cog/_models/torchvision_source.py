"""The ``torchvision:NAME[:WEIGHTS]`` source: torchvision's model builders and weights.

Stage "features". Named weights come from torch's cache (``torch.hub.get_dir()/checkpoints``),
read there first, with :func:`~.weights.read_checkpoint` (never unpickled); only a file that is
not there is downloaded, silently and with a time limit, so that a machine without internet
gets the one-line error at once. The preprocessing is the paper's preset or the extractor's
default (torchvision's weights carry no eval transform the paper used), and the layer the
input of the classifier.
"""

from __future__ import annotations

import glob
import os
import threading
import time

from .registry import LoadedModel, seeded
from .spec import is_file_weights, named_weights
from .weights import (
    WeightsUnavailableError,
    cached_url_reader,
    check_weights_file,
    load_weights_file,
    routed,
    torch_checkpoints_dir,
)

#: Seconds the server of a missing named weights file has to answer before the one-line error
#: (a machine without network or DNS); an answered download then takes what it takes.
DOWNLOAD_TIMEOUT = 10.0


def load(name, weights, spec, load_weights=True):
    """The network of ``torchvision:NAME[:WEIGHTS]``."""
    import torchvision.models
    import torchvision.models._api

    weights = named_weights(weights)
    file = weights if weights and is_file_weights(weights) else None
    if not load_weights:
        weights = file = None
    check_weights_file(file)
    if name not in torchvision.models.list_models():
        raise ValueError(f"torchvision has no model {name!r}")
    kwargs = {}
    if weights and not file:
        choices = torchvision.models.get_model_weights(name)
        if weights not in choices.__members__:
            raise ValueError(
                f"unknown weights {weights!r} for torchvision's {name}; "
                f"choose from {', '.join(choices.__members__)}, 'none' or a file"
            )
        kwargs["weights"] = choices[weights]
    elif name in ("inception_v3", "googlenet"):
        kwargs["init_weights"] = False  # the scipy-based init is slow and warns
    # torchvision's builders read named weights with load_state_dict_from_url (which would
    # unpickle the cached file and print a download line): read the cache here instead.
    reader = cached_url_reader(lambda *args: _download(spec, name, *args))
    with seeded(), routed(torchvision.models._api, "load_state_dict_from_url", reader):
        module = torchvision.models.get_model(name, **kwargs)
    head = load_weights_file(module, file) if file else ()
    kind = "file" if file else "pretrained" if weights else "random"
    return LoadedModel(module, kind, head_not_loaded=head)


def _download(spec, name, url, path, check_hash):
    """Put the weights at ``path`` from ``url``, silently, or raise the one-line error."""
    import torch.hub

    os.makedirs(os.path.dirname(path), exist_ok=True)
    match = check_hash and torch.hub.HASH_REGEX.search(os.path.basename(path))
    outcome = []

    def fetch():
        try:
            torch.hub.download_url_to_file(
                url, path, match.group(1) if match else None, progress=False
            )
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller's thread
            outcome.append(exc)

    # A daemon thread, so that a machine without DNS does not wait for the resolver: the
    # limit is on the answer, not the download. torch writes <path>.<hex>.partial once the
    # server answered; from then on the download takes what it takes.
    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    deadline = time.monotonic() + DOWNLOAD_TIMEOUT
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.05)
        if glob.glob(glob.escape(path) + ".*.partial"):
            thread.join()
            break
    if outcome and outcome[0] is None and os.path.isfile(path):
        return
    exc = outcome[0] if outcome else TimeoutError(f"no answer within {DOWNLOAD_TIMEOUT:g} s")
    file = os.path.basename(path)
    raise WeightsUnavailableError(
        f"the weights of {spec!r} could not be downloaded from {url} "
        f"({type(exc).__name__}: {' '.join(str(exc).split())}). torch looks for them in "
        f"{torch_checkpoints_dir()}: copy {file} there (the file name must stay {file}), or "
        f"pass a local checkpoint instead, as in 'torchvision:{name}:/path/to/{file}'"
    ) from None
