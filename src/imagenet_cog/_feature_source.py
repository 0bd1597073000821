"""Where the features of ``evaluate`` and ``analyze`` come from: arrays, a store or a model.

Stage "features/store". One interface, three sources:

* :class:`ArrayFeatures`: a mapping ``{domain: (X_train, y_train, X_test, y_test)}`` in memory;
* :class:`StoreFeatures`: a feature-store root (``ROOT/<domain>/<split>/``);
* :class:`ModelFeatures`: a model spec (or module) with the image folders: :meth:`prepare`
  extracts the features into a store first with ``extract_all``, then it is a store.

:func:`feature_source` picks the class. With ``normalize`` set, the features the probes see
are l2-normalised (:func:`l2_normalize`); the ``mmap=True`` view the checks read stays raw.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import types
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ._fileio import lock_holder
from ._grid import DOMAINS
from ._models.spec import default_name
from ._provenance import RANDOM_WEIGHTS, check_stores_agree, domain_provenance, store_levels

__all__ = [
    "ArrayFeatures",
    "FeatureSource",
    "ModelFeatures",
    "StoreFeatures",
    "feature_source",
    "fingerprint_arrays",
    "host",
    "l2_normalize",
    "no_store_message",
    "unfinished_note",
]

_VERIFY = (None, "size", "cached", "sha256")


def host(block):
    """A numpy copy of a block of rows (from an array, a memmap or a torch tensor)."""
    if hasattr(block, "detach"):
        return block.detach().float().cpu().numpy()
    return np.asarray(block)


#: Row norms below this came from squares that may have underflowed: recomputed scaled.
_TINY_NORM = 1e-150


#: Bytes of float64 one block of :func:`l2_normalize` converts at a time: its temporaries stay
#: this small whatever the rows (65,536 rows of 2,048 features were 1.5 GiB).
_NORM_BLOCK_BYTES = 64 << 20


def l2_normalize(X, copy=True, chunk=None):
    """Rows of ``X`` scaled to unit l2 norm, as the official probe does to its input.

    The norm is floored at ``1e-12`` (``torch.nn.functional.normalize``), so a zero row stays
    zero. When every row is unit-norm already (to float32 rounding, e.g. features the
    extractor normalised) or zero, ``X`` is returned as it is: no copy, no extra rounding. Otherwise
    the work goes in blocks of ``chunk`` rows (default: 64 MiB of float64), in place when ``copy=False`` and ``X`` is a
    writable array, else into a new array (float arrays keep their dtype, others become
    float32). A torch tensor gives a tensor. Rows so large (or so small) that the squares of
    their entries overflow (or underflow) in float64 are divided by their largest entry
    first, so every finite row comes out unit-norm.

    Examples
    --------
    >>> import numpy as np
    >>> l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6, 0.8], [0.0, 0.0]]
    >>> X = np.array([[0.6, 0.8]], dtype=np.float32)
    >>> l2_normalize(X) is X
    True
    """
    n = X.shape[0]
    if chunk is None:
        width = int(np.prod(X.shape[1:])) if len(X.shape) > 1 else 1
        chunk = max(1, _NORM_BLOCK_BYTES // (8 * max(width, 1)))
    if hasattr(X, "detach"):  # a torch tensor
        import torch

        norms = torch.linalg.vector_norm(X.detach().double(), dim=1)
        if torch.all(((norms - 1).abs() <= 1e-5) | (norms == 0)):
            return X
        X = X if X.is_floating_point() else X.float()
        bad = ~torch.isfinite(norms) | ((norms < _TINY_NORM) & (norms > 0))
        bad |= (norms == 0) & (X.detach() != 0).any(dim=1)
        if bool(bad.any()):  # squares that overflow (or underflow): divide by the max first
            peak = X.detach().abs().amax(dim=1, keepdim=True)
            X = X / torch.where(bad[:, None], peak, torch.ones_like(peak))
        return torch.nn.functional.normalize(X, dim=1)
    norms = np.empty(n, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):  # such rows are normalised apart below
        for start in range(0, n, chunk):
            block = np.asarray(X[start : start + chunk])
            if block.dtype.kind != "f":
                block = block.astype(np.float64)
            # The squares summed in float64 as they are read: no float64 copy of the block.
            sq = np.einsum("ij,ij->i", block, block, dtype=np.float64, casting="safe")
            norms[start : start + block.shape[0]] = np.sqrt(sq)
    if np.all((np.abs(norms - 1) <= 1e-5) | (norms == 0)):  # zero rows stay zero anyway
        return X
    # Finite float64 rows whose squares overflow (or underflow to 0): normalised apart,
    # scaled by their largest entry first, so they never become zeros (or stay tiny).
    bad = np.flatnonzero(~np.isfinite(norms) | (norms < _TINY_NORM))
    fixed = None
    if bad.size:
        rows = np.asarray(X[bad], dtype=np.float64)
        peak = np.abs(rows).max(axis=1, keepdims=True)
        rows = rows / np.where(peak > 0, peak, 1.0)  # a zero row stays zero
        length = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        fixed = rows / np.where(length > 0, length, 1.0)[:, None]
        norms[bad] = 1.0
    in_place = not copy and isinstance(X, np.ndarray) and X.flags.writeable and X.dtype.kind == "f"
    if in_place:
        out = X
    else:
        kind = getattr(getattr(X, "dtype", None), "kind", "f")
        out = np.empty(X.shape, dtype=X.dtype if kind == "f" else np.float32)
    norms = np.maximum(norms, 1e-12).astype(out.dtype)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        np.divide(np.asarray(X[start:stop]), norms[start:stop, None], out=out[start:stop])
    if fixed is not None:
        out[bad] = fixed
    return out


def fingerprint_arrays(X_train, y_train, X_test, y_test):
    """A cheap, content-based key of a domain's data for the resume check.

    Shapes, dtypes, every label, and a strided sample of feature rows: a
    different feature file, model or split changes it, without reading
    gigabytes of features.
    """
    h = hashlib.sha256()
    for X, y in ((X_train, y_train), (X_test, y_test)):
        h.update(repr((tuple(X.shape), str(X.dtype))).encode())
        labels = np.asarray(y)
        h.update("\n".join(map(str, labels.tolist())).encode())
        rows = np.unique(np.linspace(0, X.shape[0] - 1, num=min(X.shape[0], 257)).astype(np.int64))
        h.update(np.ascontiguousarray(host(X[rows]), dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


class FeatureSource:
    """Lazily loaded ``(X_train, y_train, X_test, y_test)`` per domain.

    With ``normalize`` set (``evaluate`` sets it), :meth:`load` returns l2-normalised
    features; the ``mmap=True`` view used by the checks stays raw.
    """

    def __init__(self, verify="cached", normalize=False):
        if verify not in _VERIFY:
            raise ValueError(f"verify must be 'cached', 'sha256', 'size' or None, got {verify!r}")
        self.verify = verify  # how a store is checked when it is loaded
        self.normalize = normalize
        self._cache = {}

    def available(self):
        """The domains this source has features for."""
        raise NotImplementedError

    def prepare(self, domains):
        """Make the features of ``domains`` ready (a model extracts them); nothing by default."""

    def load(self, domain, mmap=False):
        """The domain's four arrays: cached, l2-normalised when asked (except ``mmap``)."""
        raise NotImplementedError

    def training(self, domain):
        """The domain's arrays as the probes train on them: l2-normalised when asked."""
        return self.load(domain)

    def release(self, domain):
        """Drop the domain's cached arrays."""
        self._cache.pop(domain, None)

    def store_files(self, domains, splits=("train", "test")):
        """``[(path, bytes)]`` of the feature files the domains' features are read from, in
        row order (none for arrays in memory)."""
        return []

    def manifest_files(self, domains):
        """The manifests of the stores that hold ``domains``' features (none for arrays)."""
        return []

    def model_name(self):
        """The model the features come from, or None when unknown."""
        return

    def fingerprint(self, domain):
        """What identifies the domain's data (the key a record of it is bound to): its
        stores' manifests, or a sample of its arrays."""
        return self._fingerprint(domain, self.load(domain, mmap=True))

    def extraction(self, domain):
        """How the domain's features were extracted (the store's fingerprint: model spec,
        weights' sha256, layer...), or None for arrays, which record nothing."""
        return self._provenance(domain)["extraction"]

    def describe(self, domains, levels=None, check=None):
        """What ``evaluate`` checks and records of the features of ``domains``, in one call.

        In order: the features of every domain come from one extraction (a store's
        manifests say; arrays record nothing to check); the levels they were made with
        (``levels``: the caller's ``levels=``, checked against the stores' own); then, domain
        by domain, ``check(domain, arrays, provenance)`` on the raw (``mmap=True``) arrays and
        where they come from, whose returned dict starts the domain's record, its fingerprint
        for the resume check, and where its features come from. A store's manifests are read once for all of it.

        Returns
        -------
        types.SimpleNamespace
            ``levels`` (``{"name", "sha256"}``), ``features`` (``{domain: fingerprint}``),
            ``data`` (``{domain: record}``) and ``model`` (:meth:`model_name`).

        Raises
        ------
        ValueError
            From ``check``; stores made by different extractions (the store and the field
            named); ``levels`` that are not the stores' levels.
        """
        self._check_agreement(domains)
        levels_used = self._levels(domains, levels)
        fingerprints, data = {}, {}
        for domain in domains:
            arrays = self.load(domain, mmap=True)
            provenance = self._provenance(domain)
            summary = check(domain, arrays, provenance) if check is not None else {}
            fingerprints[domain] = self._fingerprint(domain, arrays)
            data[domain] = {**summary, **provenance}
            self.release(domain)
        return types.SimpleNamespace(
            levels=levels_used, features=fingerprints, data=data, model=self.model_name()
        )

    def _fingerprint(self, domain, arrays):
        """What identifies the domain's data, for the resume check."""
        return fingerprint_arrays(*arrays)

    def _check_agreement(self, domains):
        """Raise when the features of ``domains`` were not made by one extraction; arrays
        record nothing to check."""

    def _levels(self, domains, given=None):
        """``{"name", "sha256"}`` of the levels the features were made with: what the caller
        says (``given``, None: not known) for arrays; see :meth:`StoreFeatures._levels`."""
        if given is None:
            return {"name": None, "sha256": None}
        from .levels import load_levels

        loaded = load_levels(given)
        if hasattr(given, "levels"):  # a Levels object
            name = loaded.provenance.get("name", "custom")
        else:
            name = str(given)
        return {"name": name, "sha256": loaded.checksum}

    def _provenance(self, domain):
        """What ``config.json`` records of where a domain's features come from; arrays carry
        no record of their model, weights, settings or images: None for each."""
        return {"extraction": None, "train_ids_sha256": None, "test_ids_sha256": None}


class ArrayFeatures(FeatureSource):
    """Features given in memory: ``{domain: (X_train, y_train, X_test, y_test)}``.

    The mapping is kept as given: a lazy mapping builds each domain only when it is used.
    """

    def __init__(self, arrays, verify="cached", normalize=False):
        super().__init__(verify, normalize)
        self._arrays = arrays

    def available(self):
        return list(self._arrays)

    def _raw(self, domain):
        if domain not in self._arrays:
            raise ValueError(f"no features for domain {domain!r}; have {sorted(self._arrays)}")
        item = self._arrays[domain]
        if len(item) != 4:
            raise ValueError(f"features[{domain!r}] must be (X_train, y_train, X_test, y_test)")
        return tuple(item)

    def load(self, domain, mmap=False):
        if mmap and self.normalize and domain not in self._cache:
            return self._raw(domain)  # the checks see the data as given
        if domain not in self._cache:
            X_train, y_train, X_test, y_test = self._raw(domain)
            if self.normalize:  # the caller's arrays: normalised into copies
                X_train, X_test = l2_normalize(X_train), l2_normalize(X_test)
            self._cache[domain] = (X_train, y_train, X_test, y_test)
        return self._cache[domain]


class StoreFeatures(FeatureSource):
    """Features in a feature-store root (``ROOT/<domain>/<split>/``).

    Each store's manifest is read once, and each store opened (its files checked at
    ``verify``) once, for the life of the source: ``evaluate`` asks for a domain's arrays
    several times (the checks, the memory plan, each lockstep unit).
    """

    def __init__(self, root, verify="cached", normalize=False):
        super().__init__(verify, normalize)
        self.root = Path(root)
        # Domains whose features were found unit-norm: evaluate asks for a domain's training
        # arrays once per lockstep unit, and the norm check is a pass over the whole store.
        self._unit_norm = set()
        self._read = {}  # "<domain>/<split>": the store's path, manifest and skipped images
        self._opened = {}  # domain: its (train, test) FeatureStore

    def available(self):
        from .store import list_domains

        return list(list_domains(self.root))

    def _manifests(self, domains):
        """``{"<domain>/<split>": store}`` with each store's path, manifest and skipped images,
        read from the manifests alone (each read once)."""
        from ._storecheck import read_manifest
        from .store import FORMAT, FORMAT_VERSION, store_path

        out = {}
        for domain in domains:
            for split in ("train", "test"):
                name = f"{domain}/{split}"
                if name not in self._read:
                    path = store_path(self.root, domain, split)
                    manifest = read_manifest(path / "manifest.json", FORMAT, FORMAT_VERSION)
                    self._read[name] = types.SimpleNamespace(
                        path=path, manifest=manifest, skipped=manifest["skipped"]
                    )
                out[name] = self._read[name]
        return out

    def _stores(self, domain):
        """The domain's train and test :class:`~imagenet_cog.FeatureStore`, opened once."""
        from ._storecheck import check_pair
        from .store import open_store

        if domain not in self._opened:
            read = self._manifests([domain])
            train, test = (
                open_store(store.path, verify=self.verify, manifest=store.manifest)
                for store in (read[f"{domain}/train"], read[f"{domain}/test"])
            )
            check_pair(train.key, test.key, f"{domain} in {self.root}")
            self._opened[domain] = (train, test)
        return self._opened[domain]

    def load(self, domain, mmap=False):
        train, test = self._stores(domain)
        if mmap:
            return train.features, train.labels, test.features, test.labels
        if domain not in self._cache:
            X_train, X_test = np.asarray(train.features), np.asarray(test.features)
            if self.normalize:  # fresh in-memory copies: normalised in place
                X_train = l2_normalize(X_train, copy=False)
                X_test = l2_normalize(X_test, copy=False)
            self._cache[domain] = (X_train, train.labels, X_test, test.labels)
        return self._cache[domain]

    def training(self, domain):
        """The store stays memory-mapped: its features are unit-norm when extracted with the
        default settings, and :func:`l2_normalize` then returns them as they are."""
        X_train, y_train, X_test, y_test = self.load(domain, mmap=True)
        if self.normalize and domain not in self._unit_norm:
            unit_train, unit_test = l2_normalize(X_train), l2_normalize(X_test)
            if unit_train is X_train and unit_test is X_test:
                self._unit_norm.add(domain)
            X_train, X_test = unit_train, unit_test
        return X_train, y_train, X_test, y_test

    def _fingerprint(self, domain, arrays):
        h = hashlib.sha256()
        stores = self._manifests([domain])
        for split in ("train", "test"):
            manifest = stores[f"{domain}/{split}"].manifest
            h.update(
                json.dumps(
                    [manifest["key"], manifest["rows"], manifest["shards"]],
                    sort_keys=True,
                    default=str,
                ).encode()
            )
        return h.hexdigest()[:16]

    def manifest_files(self, domains):
        return [store.path / "manifest.json" for store in self._manifests(domains).values()]

    def store_files(self, domains, splits=("train", "test")):
        out = []
        for name, store in self._manifests(domains).items():
            if name.split("/")[1] in splits:
                out += [(store.path / s["file"], int(s["bytes"])) for s in store.manifest["shards"]]
        return out

    def model_name(self):
        # A short name (architecture and weights): a checkpoint by its file's stem, never by
        # its whole path or its content hash.
        first = self.available()[0]
        manifest = self._manifests([first])[f"{first}/train"].manifest
        weights = (manifest.get("origin") or {}).get("weights")
        return default_name(manifest["key"]["model"], weights, random=weights == RANDOM_WEIGHTS)

    def _check_agreement(self, domains):
        """Raise ``ValueError`` naming the store and the field when the stores of ``domains``
        differ in model, weights, preprocessing, layer, normalisation, amp, decoder or width."""
        check_stores_agree(self._manifests(domains))

    def _levels(self, domains, given=None):
        """The levels the stores of ``domains`` were extracted with, from their manifests.

        ``given`` (the caller's ``levels=``) must be those levels, compared by content
        checksum. None when no domain is a level and nothing is given.

        Raises
        ------
        ValueError
            When the stores name different levels, or ``given`` is not theirs.
        """
        recorded = store_levels(self._manifests(domains))
        if recorded is None:
            return super()._levels(domains, given)
        if given is None:
            return recorded
        from .levels import load_levels

        wanted = load_levels(given)
        shown = f"levels={given!r}" if not hasattr(given, "levels") else "the levels given"
        if wanted.checksum != recorded["sha256"]:
            raise ValueError(
                f"{shown} are not the levels the stores in {self.root} were extracted with "
                f"({recorded['name']!r}, other contents); leave levels out to use theirs, or "
                "extract with these levels"
            )
        return recorded

    def _provenance(self, domain):
        stores = self._manifests([domain])
        return domain_provenance(stores[f"{domain}/train"], stores[f"{domain}/test"])


class ModelFeatures(StoreFeatures):
    """A model spec (or module) and the image folders: extracted into ``store`` first."""

    def __init__(
        self,
        model,
        data,
        store,
        levels="official",
        extract_options=None,
        verify="cached",
        normalize=False,
    ):
        super().__init__(store, verify, normalize)
        self.model = model
        self.data = dict(data)
        self.levels = levels
        self.extract_options = dict(extract_options or {})
        self._extracted = False

    def available(self):
        return super().available() if self._extracted else list(DOMAINS)

    def prepare(self, domains):
        """Extract the features of ``domains`` into the store, then read them from there."""
        from ._extract_all import extract_all

        # One call: the network is loaded once for every domain and split.
        extract_all(
            self.model,
            self.data,
            self.root,
            levels=self.levels,
            domains=list(domains),
            **self.extract_options,
        )
        self._extracted = True

    def model_name(self):
        if self._extracted:
            return super().model_name()
        return self.model if isinstance(self.model, str) else None


def _is_module(obj):
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, torch.nn.Module)


#: A model spec: a source name, a colon, then the model ("torchvision:resnet50"). A path has
#: a separator or no colon; a one-letter "source" is a Windows drive ("C:").
_MODEL_SPEC = re.compile(r"[A-Za-z][\w.-]+:[^/\\].*")
_EXTRACT = "the --out folder of imagenet-cog extract, which holds <domain>/<split>/ stores"
#: Subfolders searched for the store root meant, per level.
_SEARCH_LIMIT = 100


def _store_roots(folder, depth=2):
    """Folders under ``folder`` (itself excluded) that hold complete stores, ``depth`` deep."""
    from .store import list_domains

    def subfolders(path):
        try:
            with os.scandir(path) as entries:
                return [Path(e.path) for e in entries if e.is_dir()]
        except OSError:  # unreadable: nothing found there
            return []

    found, level = [], [folder]
    for _ in range(depth):
        # Bounded: the folder may be a dataset root with thousands of concept folders.
        level = sorted(c for p in level for c in subfolders(p))[:_SEARCH_LIMIT]
        found += [c for c in level if subfolders(c) and list_domains(c)]
        level = [c for c in level if c not in found]
    return found


def unfinished_stores(root):
    """``["L1/test", ...]``: the stores under ``root`` that a run started and did not finish."""
    # Only <domain>/{train,test}/: the folder may be a dataset root with millions of files.
    return sorted(
        f"{e.name}/{split}"
        for e in os.scandir(root)
        if e.is_dir()
        for split in ("train", "test")
        if (
            Path(e.path, split, "run.json").is_file()
            and not Path(e.path, split, "manifest.json").is_file()
        )
    )


def unfinished_note(root):
    """``"; unfinished stores (...): ..."`` when ``root`` (a path) has some, else ``""``."""
    if not isinstance(root, (str, os.PathLike)) or not Path(root).is_dir():
        return ""
    names = unfinished_stores(root)
    # An extraction still running holds its store's lock: it is not to be started again.
    running = [n for n in names if lock_holder(Path(root, n)) is not None]
    stopped = [n for n in names if n not in running]

    def shown(names):
        return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")

    note = ""
    if running:
        note += f"; stores an extraction is still writing ({shown(running)}): wait for it to end"
    if stopped:
        note += (
            f"; unfinished stores ({shown(stopped)}): run the same extract command again "
            "to finish them"
        )
    return note


def no_store_message(path):
    """Why ``path`` is not a feature-store root: what is there, and the folder meant, if any."""
    path = Path(path)
    if not path.exists():
        return f"no feature store at {path}: no such folder (give {_EXTRACT})"
    if not path.is_dir():
        return f"no feature store at {path}: it is a file (give {_EXTRACT})"
    found, meant = [], []
    for up, what in ((1, "a domain folder"), (2, "a split folder")):
        root = path.parents[up - 1] if len(path.parents) >= up else None
        marker = path / "train" / "manifest.json" if up == 1 else path / "manifest.json"
        if root is not None and marker.is_file():
            found.append(f"it is {what} of a store")
            meant.append(root)
    unfinished = unfinished_stores(path)
    if unfinished:
        found.append(unfinished_note(path)[2:])
    if (path / "runs.jsonl").is_file() or (path / "config.json").is_file():
        found.append("it is an evaluate output folder (runs.jsonl), not a feature store")
    roots = [] if meant or unfinished else _store_roots(path)
    if roots:
        found.append(f"the stores of {len(roots)} model{'s' * (len(roots) != 1)} in subfolders")
        meant += roots
    if not found:
        entries = sorted(p.name for p in path.iterdir())
        found.append(
            "it is empty"
            if not entries
            else f"nothing extract writes (it holds {', '.join(entries[:5])}"
            f"{', ...' if len(entries) > 5 else ''})"
        )
    text = f"no feature store in {path}: {'; '.join(found)}"
    if meant:
        shown = " or ".join(str(p) for p in meant[:3]) + (" or ..." if len(meant) > 3 else "")
        return f"{text}; did you mean {shown}?"
    return f"{text} (give {_EXTRACT})"


def feature_source(
    features,
    data=None,
    store=None,
    levels="official",
    extract_options=None,
    verify="cached",
    normalize=False,
):
    """The :class:`FeatureSource` of what ``evaluate`` or ``analyze`` was given.

    Raises
    ------
    FileNotFoundError
        A path that holds no complete store: the message says what is there and names the
        store root meant, when it finds one nearby (:func:`no_store_message`).
    ValueError
        A model spec without ``data`` or ``store``, or an unknown ``verify``.
    TypeError
        Anything that is not a store folder, a mapping or a model spec.
    """
    if verify not in _VERIFY:
        raise ValueError(f"verify must be 'cached', 'sha256', 'size' or None, got {verify!r}")
    if isinstance(features, Mapping):
        return ArrayFeatures(features, verify, normalize)
    if isinstance(features, (str, os.PathLike)) and Path(features).is_dir():
        from .store import list_domains

        if not list_domains(features):
            raise FileNotFoundError(no_store_message(features))
        return StoreFeatures(features, verify, normalize)
    # A path that is no folder (a mistyped store root), unless data and store make it a model.
    if (data is None and store is None) and (
        isinstance(features, os.PathLike)
        or (isinstance(features, str) and not _MODEL_SPEC.fullmatch(features))
    ):
        raise FileNotFoundError(no_store_message(features))
    if isinstance(features, str) or _is_module(features):
        if data is None:
            raise ValueError(
                "features is a model spec: give data={'in1k': IN-1K root, 'in21k': IN-21K root} "
                "and store=DIR so the features can be extracted first"
            )
        if store is None:
            raise ValueError("features is a model spec: give store=DIR for the extracted features")
        return ModelFeatures(features, data, store, levels, extract_options, verify, normalize)
    raise TypeError(
        "features must be a feature-store folder, a mapping {domain: (X_train, y_train, "
        "X_test, y_test)}, or a model spec with data= and store=; got "
        f"{type(features).__name__}"
    )
