"""Weights: where a network's weights file is, and the one way it is read.

Stage "features". Every source finds its named weights with :func:`find_weights` (in its
library's caches, or the given path; nothing is downloaded) and every checkpoint, whatever
the source, is read by :func:`read_checkpoint`, which never unpickles anything but tensors:
``.safetensors`` files with safetensors, anything else with
``torch.load(weights_only=True)``. Where a library reads weights itself (torchvision's named
weights, a ``torch.hub`` entrypoint, OpenCLIP's checkpoint conversions), its reader is routed
here while the network is built (:func:`routed`).

A checkpoint file given in a spec is loaded strictly (:func:`load_weights_file`): each of the
network's weights must be in it and each of its weights must be used, but for the
classifier, which the feature layer usually drops (:func:`check_head_unused`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import warnings

__all__ = [
    "HEADS",
    "HF_WEIGHT_FILES",
    "CheckpointError",
    "WeightsUnavailableError",
    "cached_hf_file",
    "cached_url_reader",
    "check_head_unused",
    "check_weights_file",
    "find_weights",
    "head_names",
    "hf_cache_dir",
    "load_weights_file",
    "read_checkpoint",
    "recorded_reads",
    "routed",
    "safe_first",
    "torch_checkpoints_dir",
    "weights_file_record",
]

#: The attributes that hold a network's classifier.
HEADS = ("fc", "classifier", "head", "heads")
#: The weights files a library keeps in a Hugging Face repository: (safetensors, pickled).
HF_WEIGHT_FILES = {
    "timm": ("model.safetensors", "pytorch_model.bin"),
    "transformers": ("model.safetensors", "pytorch_model.bin"),
    "open_clip": ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"),
}
#: Entries that wrap a state dict in a training checkpoint.
_WRAPPERS = ("state_dict", "model", "teacher", "module", "net")
#: The lists of :func:`recorded_reads` blocks open now, innermost last.
_READS = []


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


class CheckpointError(ValueError):
    """A weights file that cannot be read as tensors, or that does not fit the network.

    The message is one line naming the file and what is wrong with it.

    Examples
    --------
    >>> issubclass(CheckpointError, ValueError)
    True
    """


# ------------------------------------------------------------------ where
def hf_cache_dir():
    """The Hugging Face hub cache (``HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        home = os.environ.get("HF_HOME", os.path.join("~", ".cache", "huggingface"))
        return os.path.expanduser(os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub")))
    return str(constants.HF_HUB_CACHE)


def torch_checkpoints_dir():
    """torch's weights cache, ``torch.hub.get_dir()/checkpoints`` (``$TORCH_HOME/hub/...``)."""
    import torch.hub

    return os.path.join(torch.hub.get_dir(), "checkpoints")


def safe_first(filename, library):
    """``filename``, after its ``.safetensors`` twin when it is a pickled ``.bin`` or ``.pth``.

    The twin of ``library``'s default file is its name in :data:`HF_WEIGHT_FILES`.

    Examples
    --------
    >>> safe_first("open_clip_pytorch_model.bin", "open_clip")
    ['open_clip_model.safetensors', 'open_clip_pytorch_model.bin']
    >>> safe_first("vit_b16.bin", "open_clip")
    ['vit_b16.safetensors', 'vit_b16.bin']
    """
    safe, pickled = HF_WEIGHT_FILES[library]
    if filename == pickled:
        return [safe, pickled]
    if filename.endswith((".bin", ".pth")):
        return [filename[:-4] + ".safetensors", filename]
    return [filename]


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


def find_weights(places, missing):
    """The first weights file of ``places`` that exists; nothing is downloaded.

    Parameters
    ----------
    places : list of tuple
        ``("file", path)``, or ``("hf", repo_id, filenames)`` for a Hugging Face repository
        in the hub cache, in the order a library looks.
    missing : str
        The error's text when none is there; ``{looked}`` becomes the list of places.

    Returns
    -------
    str

    Raises
    ------
    WeightsUnavailableError
    """
    looked = []
    for place in places:
        if place[0] == "hf":
            _, repo, names = place
            path = cached_hf_file(repo, names)
            looked.append(f"{repo}/{names[0]} in the Hugging Face cache {hf_cache_dir()}")
        else:
            path = place[1] if place[1] and os.path.isfile(place[1]) else None
            looked.append(str(place[1]))
        if path:
            return path
    looked = " and ".join(looked) or "nothing: the tag names no file"
    raise WeightsUnavailableError(missing.format(looked=looked))


def check_weights_file(path):
    """Raise the one-line error for a weights file that is not there, before any network is built."""
    if path and not os.path.isfile(path):
        raise FileNotFoundError(f"no weights file at {path}")


# ------------------------------------------------------------------- read
def read_checkpoint(path, unwrap=True):
    """The tensors of a checkpoint file, read without unpickling anything else.

    ``.safetensors`` files are read with safetensors; any other file with
    ``torch.load(weights_only=True)``, which refuses everything but tensors and plain
    containers.

    Parameters
    ----------
    path : str or path-like
    unwrap : bool
        Unwrap a ``state_dict``, ``model``, ``teacher``, ``module`` or ``net`` entry and
        check that a state dict is left. ``False``: the file's contents as they are, for a
        library that unwraps them its own way.

    Returns
    -------
    dict
        Key to tensor.

    Raises
    ------
    FileNotFoundError
        When there is no file at ``path``.
    CheckpointError
        One line naming the file: empty, truncated or damaged, holding Python objects other
        than tensors, or not a state dict.
    """
    import torch

    path = os.fspath(path)
    check_weights_file(path)
    for reads in _READS:
        if path not in reads:
            reads.append(path)
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path}: the weights file is empty")
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ImportError(
                f"reading {path} needs safetensors, which is not installed: pip install safetensors"
            ) from None
        try:
            state = load_file(path, device="cpu")
        except Exception as exc:  # noqa: BLE001 -- safetensors' errors name no file
            raise CheckpointError(
                f"{path}: not a readable .safetensors file, damaged or cut short "
                f"({_first_line(exc)})"
            ) from None
    else:
        try:
            with warnings.catch_warnings():  # the refusal below says what matters
                warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 -- pickle, zip and EOF errors alike
            raise _unreadable(path, exc) from None
    if not unwrap:
        return state
    for key in _WRAPPERS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not any(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(
            f"{path}: not a state dict (a mapping of names to tensors) but a {type(state).__name__}"
        )
    return state


@contextlib.contextmanager
def recorded_reads():
    """Inside, the path of every checkpoint file :func:`read_checkpoint` reads is added to
    the list the block gets, once each, in order: the files a network's weights came from,
    whatever the source (a file given, a library's cache, a repository's shards)."""
    reads = []
    _READS.append(reads)
    try:
        yield reads
    finally:
        _READS.remove(reads)


def weights_file_record(path):
    """``{"name", "bytes", "sha256"}`` of a weights file: its name, size and the sha256 of its
    bytes (what ``sha256sum`` prints), as a store's ``origin.weights_files`` records it."""
    from .._fileio import file_sha256

    return {
        "name": os.path.basename(path),
        "bytes": os.path.getsize(path),
        "sha256": file_sha256(path),
    }


def _unreadable(path, exc):
    """The one-line error for a file ``torch.load(weights_only=True)`` refused.

    torch's own text advises ``weights_only=False``, which would run whatever the file
    holds: it is never shown.
    """
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and "weights only" in text.lower():
        refused = re.search(r"GLOBAL ([\w.]+)", text)
        what = f" ({refused.group(1)})" if refused else ""
        return CheckpointError(
            f"{path}: holds Python objects other than tensors{what}, which are never unpickled "
            "(they could run code); save the network's state_dict() with torch.save, or as "
            ".safetensors, and pass that file"
        )
    if isinstance(exc, EOFError):
        return CheckpointError(f"{path}: not a readable checkpoint: it ends too early")
    return CheckpointError(
        f"{path}: not a readable checkpoint, damaged or cut short "
        f"({type(exc).__name__}: {_first_line(exc)})"
    )


def _first_line(exc):
    """The first line of an exception's text, never torch's advice to unpickle."""
    line = (str(exc).strip().splitlines() or [""])[0]
    line = line.split(". This is an internal", 1)[0]  # torch's zip-reader boilerplate
    return type(exc).__name__ if "weights_only" in line or not line else line[:200]


def cached_url_reader(missing):
    """A ``load_state_dict_from_url`` that reads torch's cache with :func:`read_checkpoint`.

    Parameters
    ----------
    missing : callable
        ``missing(url, path, check_hash)``, called when the file is not in the cache: it
        raises, or puts the file at ``path`` (checking the hash its name carries when
        ``check_hash``).
    """

    def load_state_dict_from_url(
        url,
        model_dir=None,
        map_location=None,
        progress=True,
        check_hash=False,
        file_name=None,
        weights_only=False,
    ):
        folder = model_dir or torch_checkpoints_dir()
        path = os.path.join(folder, file_name or os.path.basename(url.split("?", 1)[0]))
        if not os.path.isfile(path):
            missing(url, path, check_hash)
        state = read_checkpoint(path, unwrap=False)  # the caller unwraps, as it would
        if not isinstance(state, dict):
            return state
        import torch

        if isinstance(map_location, (str, torch.device)) and str(map_location) != "cpu":
            state = {
                k: v.to(map_location) if isinstance(v, torch.Tensor) else v
                for k, v in state.items()
            }
        return state

    return load_state_dict_from_url


@contextlib.contextmanager
def routed(owner, name, replacement):
    """Inside, ``owner.name`` (a library's weights reader) is ``replacement``."""
    if not hasattr(owner, name):
        raise ImportError(
            f"{getattr(owner, '__name__', owner)} has no {name}: this version of the library "
            "reads weights in a way imagenet_cog does not know; pass a checkpoint file instead"
        )
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


# ------------------------------------------------------------------- load
def head_names(module):
    """The classifier attributes (``fc``, ``classifier``, ``head``, ``heads``) of a network."""
    from torch import nn

    return [h for h in HEADS if isinstance(getattr(module, h, None), nn.Module)]


def _in_head(key):
    return str(key).split(".", 1)[0] in HEADS


def load_weights_file(module, path):
    """Load a checkpoint file into ``module``, strictly; a key prefix is found and removed.

    Every weight of the network must be in the file, with its shape, and every key of the
    file (under the prefix) must be a weight of the network. Only the classifier (``fc``,
    ``classifier``, ``head``, ``heads``) may be missing, differ in shape or be absent from
    the network: those keys are returned, and :func:`check_head_unused` refuses them where
    the feature layer uses the classifier.

    Returns
    -------
    tuple of str
        The network's classifier weights left as they were built.

    Raises
    ------
    CheckpointError
        Naming the keys that are missing, unused or of another shape.
    """
    state = read_checkpoint(path)
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
        raise CheckpointError(_no_key_matches(path, state, own))
    prefix = min(counts, key=lambda p: (-counts[p], len(p)))
    ours = {k[len(prefix) :]: v for k, v in state.items() if str(k).startswith(prefix)}
    unused = [k for k in ours if k not in own and not _in_head(k)]
    if unused:
        pair = _closest(unused, [k for k in own if k not in ours])
        raise CheckpointError(
            f"{path}: {len(unused)} weights of the file are not in the network "
            f"(keys read with prefix {prefix!r}), e.g. {', '.join(_few(unused))}"
            + (f" (closest in the network: {pair[1]!r} for {pair[0]!r})" if pair else "")
            + ": it was made for another architecture"
        )
    shaped = {k for k, v in ours.items() if k in own and tuple(v.shape) != tuple(own[k].shape)}
    bad = sorted(k for k in shaped if not _in_head(k))
    if bad:
        shown = [f"{k} ({tuple(ours[k].shape)} vs {tuple(own[k].shape)})" for k in bad]
        raise CheckpointError(
            f"{path}: {len(bad)} weights of the file differ in shape from the network's, e.g. "
            f"{', '.join(_few(shown))}: it was made for another architecture or width"
        )
    matched = {k: v for k, v in ours.items() if k in own and k not in shaped}
    missing = [k for k in own if k not in matched]
    body = [k for k in missing if not _in_head(k)]
    if body:
        pair = _closest(body, [k for k in ours if k not in matched])
        raise CheckpointError(
            f"{path}: {len(body)} weights of the network are missing from the file "
            f"(keys read with prefix {prefix!r}), e.g. {', '.join(_few(body))}"
            + (f" (closest in the file: {pair[1]!r} for {pair[0]!r})" if pair else "")
        )
    module.load_state_dict(matched, strict=False)
    return tuple(missing)


#: How many of a file's keys are compared with the network's for the closest pair.
_CLOSEST_AMONG = 16


def _closest(keys, candidates):
    """``(key, candidate)``: the most alike pair of one of the first keys and any candidate
    (difflib's ratio; the first key's best when none is alike)."""
    import difflib

    best, pair = -1.0, None
    for key in list(keys)[:_CLOSEST_AMONG]:
        match = difflib.get_close_matches(str(key), candidates, n=1, cutoff=0.0)
        if match:
            ratio = difflib.SequenceMatcher(None, str(key), match[0]).ratio()
            if ratio > best:
                best, pair = ratio, (str(key), match[0])
    return pair


def _no_key_matches(path, state, own):
    """The one line for a file none of whose keys is a weight of the network: a key of each
    side, the closest pair, and the way to rename a file of the same network."""
    theirs, ours = [str(k) for k in state], list(own)
    pair = _closest(theirs, ours)
    closest = f"; closest: the file's {pair[0]!r} and the network's {pair[1]!r}" if pair else ""
    return (
        f"{path}: none of its {len(theirs)} keys is a weight of the network, with or without "
        f"a prefix (the file's {theirs[0]!r}, {theirs[1]!r}..., the network's {ours[0]!r}, "
        f"{ours[1]!r}...{closest}): the file names the weights another way, as another "
        "library does; a file of the same network can be renamed in order with "
        "tools/rename_weights.py (the model zoo's page says how)"
        if len(theirs) > 1 and len(ours) > 1
        else f"{path}: none of its keys is a weight of the network"
    )


def _few(keys, n=5):
    keys = list(keys)
    return keys[:n] + ([f"and {len(keys) - n} more"] if len(keys) > n else [])


def check_head_unused(module, layer, head_keys, what="the checkpoint"):
    """Refuse a feature layer that uses classifier weights the checkpoint did not set.

    The feature layer must come before those weights: the input of the classifier (the
    default), or a module registered before it (``avgpool``, ``layer4``...). The network's
    output, a source's own feature (``feature:...``, the output of a network built without
    its classifier, such as timm's pooled and normed ``pre_logits``), or a layer inside or
    after the classifier, would depend on them.

    Parameters
    ----------
    module : torch.nn.Module
    layer : str
        The resolved layer: ``"output"``, ``"input:NAME"``, ``"output:NAME"`` or
        ``"feature:..."`` (a source's own feature: the network's output).
    head_keys : sequence of str
        The classifier weights left as they were built (:func:`load_weights_file`).
    """
    if not head_keys:
        return
    kind, _, name = str(layer).partition(":")
    if kind == "feature":  # the network's output is the feature
        name = ""
    order = {n: i for i, (n, _) in enumerate(module.named_modules())}
    used = []
    for key in head_keys:
        owner = key.rsplit(".", 1)[0]
        if not name:  # the network's output runs every module
            used.append(key)
        elif owner == name or owner.startswith(name + "."):
            if kind == "output":
                used.append(key)
        elif order.get(owner, -1) < order.get(name, -1) or name.startswith(owner + "."):
            used.append(key)
    if used:
        hint = (
            ""
            if kind == "feature"
            else "take the features before the classifier (the default layer) or "
        )
        raise CheckpointError(
            f"{what} does not set the classifier weights {', '.join(_few(used))}, which the "
            f"feature layer {layer!r} uses; {hint}pass a checkpoint that holds them"
        )
