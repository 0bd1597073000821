"""The checks of :func:`~imagenet_cog.evaluate`'s input, and what its records say of the data.

Part of the protocol stage: every parameter check made before anything is read or written
(:func:`check_settings`, :func:`check_classes`), every check of a domain's arrays made before
anything is written for it (:func:`check_domain`), and the summary of a domain's data that
``config.json`` records (:func:`data_summary`, :func:`inert_settings`).
"""

from __future__ import annotations

import warnings

import numpy as np

from .._comparability import concepts_checksum, labels_are_wnids
from .._feature_source import host
from .._grid import Protocol, holdout_sizes, short_class
from .._tables import check_name
from .._validation import Param, check_values

__all__ = [
    "RUN_PARAMS",
    "check_classes",
    "check_domain",
    "check_settings",
    "data_summary",
    "inert_settings",
]


#: Bytes of features :func:`_finite_rows` reads at a time (a few thousand rows at CoG's width).
_SCAN_BYTES = 32 << 20


def _scan_rows(X):
    """Rows of ``X`` one block of a scan reads: 32 MiB of float32 features."""
    return max(1, _SCAN_BYTES // (4 * max(1, int(np.prod(X.shape[1:])))))


def _finite_rows(X, chunk=None):
    """Row indices of non-finite features, scanning a memmap or a tensor in chunks of
    ``chunk`` rows (default: 32 MiB of them)."""
    chunk = chunk or _scan_rows(X)
    bad = []
    for start in range(0, X.shape[0], chunk):
        block = host(X[start : start + chunk])
        rows = np.flatnonzero(~np.isfinite(block).all(axis=1))
        if rows.size:
            bad.extend((rows + start)[:5].tolist())
            if len(bad) >= 5:
                break
    return bad


def _real_dtype(X):
    """``(ok, name)``: whether ``X`` holds real numbers (float, int), and its dtype's name."""
    if hasattr(X, "detach"):  # a torch tensor
        return not X.is_complex() and str(X.dtype) != "torch.bool", str(X.dtype)
    dtype = np.dtype(X.dtype) if hasattr(X, "dtype") else np.asarray(X).dtype
    return dtype.kind in "iuf", str(dtype)


def check_domain(domain, X_train, y_train, X_test, y_test, shots, scan=True):
    """Every check that must pass before anything is written for ``domain``; ``scan``: also
    read every feature, to check they are finite (the plan reads the labels and shapes only)."""
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    for name, X, y in (("train", X_train, y_train), ("test", X_test, y_test)):
        if getattr(X, "ndim", None) != 2:
            raise ValueError(f"{domain}: X_{name} must be 2-d (n_samples, n_features)")
        ok, dtype = _real_dtype(X)
        if not ok:
            what = "complex" if "complex" in dtype else "not real numbers"
            raise ValueError(
                f"{domain}: X_{name} holds {dtype} values ({what}); the probes need real "
                "(float or integer) features"
            )
        if y.ndim != 1:
            raise ValueError(
                f"{domain}: y_{name} must be 1-d (one label per row), got shape {y.shape}"
            )
        if X.shape[0] != y.shape[0]:
            raise ValueError(
                f"{domain}: X_{name} has {X.shape[0]} rows but y_{name} has {y.shape[0]}"
            )
        if X.shape[0] == 0:
            raise ValueError(f"{domain}: the {name} set is empty")
    if X_train.shape[1] != X_test.shape[1]:
        raise ValueError(
            f"{domain}: feature widths differ: train has {X_train.shape[1]} features, "
            f"test has {X_test.shape[1]}"
        )
    for name, X in (("train", X_train), ("test", X_test)) if scan else ():
        bad = _finite_rows(X)
        if bad:
            raise ValueError(f"{domain}: X_{name} holds NaN or infinite values (rows {bad})")
    classes, counts = np.unique(y_train, return_counts=True)
    held_out = holdout_sizes(counts)
    if classes.size < 2:
        raise ValueError(
            f"{domain}: the training set has a single class ({str(classes[0])!r}); a probe needs "
            "at least 2"
        )
    if not held_out.any():
        raise ValueError(
            f"{domain}: no class has the 5 training images needed to hold out 20% for "
            f"validation (the largest has {counts.max()}), so the search has no validation set"
        )
    missing = np.setdiff1d(np.unique(y_test), classes)
    if missing.size:
        shown = ", ".join(map(str, missing[:5]))
        raise ValueError(
            f"{domain}: {missing.size} test label(s) never appear in the training set ({shown})"
        )
    for n in shots:
        if n == "all":
            continue
        # The search draws N per class from the 80% left after the holdout.
        available = counts - held_out
        short = short_class(available, n)
        if short is not None:
            c, more = short
            raise ValueError(
                f"{domain}: N={n} shots asked, but class '{classes[c]}' has {counts[c]} training "
                f"images, {available[c]} of them outside the 20% validation holdout{more}"
                f"; ask for fewer shots with --shots (shots= in Python), at most {available.min()}"
            )
    return classes


def data_summary(y_train, y_test, domain="", names=None):
    """What a domain's data was: its concepts (count and checksum) and image counts.

    ``names`` (the ``classes`` of :func:`evaluate`) gives the wnid of each integer label:
    the concepts are then recorded by wnid, and ``"class_names": "given"`` says so.
    """
    classes = np.unique(np.asarray(y_train))
    given = {}
    if names is not None:
        if classes.dtype.kind not in "iu":
            raise ValueError(
                f"classes[{domain!r}] names the concepts of integer labels, but {domain}'s "
                f"labels are {classes.dtype} values"
            )
        labels = np.union1d(classes, np.asarray(y_test))
        outside = labels[(labels < 0) | (labels >= len(names))]
        if outside.size:
            raise ValueError(
                f"{domain}: label {outside[0]} has no name in classes[{domain!r}], which names "
                f"{len(names)} labels (0 to {len(names) - 1})"
            )
        classes = names[classes]
        given = {"class_names": "given"}
    return {
        "n_classes": int(classes.size),
        "classes_sha256": concepts_checksum(classes),
        "wnid_labels": labels_are_wnids(classes),
        "n_train": int(np.asarray(y_train).shape[0]),
        "n_test": int(np.asarray(y_test).shape[0]),
        **given,
    }


def _unit_norm(X, chunk=None):
    """Whether every row of ``X`` has unit l2 norm (to float32 rounding) or is zero, scanning
    ``chunk`` rows at a time (default: 32 MiB of them)."""
    chunk = chunk or _scan_rows(X)
    for start in range(0, X.shape[0], chunk):
        block = np.asarray(host(X[start : start + chunk]))
        if block.dtype.kind != "f":
            block = block.astype(np.float64)
        with np.errstate(over="ignore", under="ignore"):
            # Squares summed in float64 as they are read (no float64 copy of the block).
            norms = np.sqrt(np.einsum("ij,ij->i", block, block, dtype=np.float64))
        if not np.all((np.abs(norms - 1) <= 1e-5) | (norms == 0)):
            return False
    return True


def inert_settings(arrays, info, normalize):
    """What ``config.json`` records of settings that could not change a domain's numbers,
    so that they are no deviation from the paper (recorded only where they apply):

    - ``"unit_norm": True``: with ``normalize=False``, features that are unit-norm already
      (the l2 normalisation would have left them as they are);
    - ``"uncapped": True``: no concept reached the training-image cap (even counting the
      images skipped), so the split's seed and cap chose nothing: the training images are
      all of each concept's, as with the official seed and cap.
    """
    from .._comparability import OFFICIAL_SPLIT

    found = {}
    # A store extracted with normalize=True holds unit-norm rows (checked by its checksums).
    normalized = (info.get("extraction") or {}).get("normalize") is True
    if not normalize and (normalized or (_unit_norm(arrays[0]) and _unit_norm(arrays[2]))):
        found["unit_norm"] = True
    split = info.get("split") or {}
    if "seed" in split and any(split.get(k) != v for k, v in OFFICIAL_SPLIT.items()):
        caps = [c for c in (split.get("cap"), OFFICIAL_SPLIT["cap"]) if c is not None]
        counts = np.unique(np.asarray(arrays[1]), return_counts=True)[1]
        skipped = (info.get("skipped") or {}).get("train", 0)
        if counts.size and int(counts.max()) + int(skipped) < min(caps):
            found["uncapped"] = True
    return found


def check_classes(classes, domains):
    """``classes`` of :func:`evaluate` as ``{domain: array of wnids}``, checked."""
    if classes is None:
        return {}
    if not hasattr(classes, "items"):
        raise ValueError(f"classes must be a mapping {{domain: [wnid, ...]}}, got {classes!r}")
    checked = {}
    for domain, names in classes.items():
        if domain not in domains:
            raise ValueError(
                f"classes names domain {domain!r}, which is not evaluated "
                f"(domains: {list(domains)})"
            )
        names = np.asarray(list(names), dtype=str)
        bad = [x for x in names.tolist() if not labels_are_wnids([x])]
        if names.ndim != 1 or not names.size or bad:
            raise ValueError(
                f"classes[{domain!r}] must list the wnid of each label (n and 8 digits)"
                + (f"; {bad[0]!r} is not one" if bad else "")
            )
        if np.unique(names).size != names.size:
            raise ValueError(f"classes[{domain!r}] names a concept twice")
        checked[domain] = names
    return checked


def _jobs(value):
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, np.integer, type(None)))
        and (value != 0)
    )


#: The constraints of evaluate's arguments that are not the protocol's (the protocol carries its
#: own, :attr:`Protocol._parameter_constraints`; the others are checked against the data).
RUN_PARAMS = {"n_jobs": Param(None, _jobs, "a nonzero integer (joblib's convention)")}


def _domains(domains):
    if isinstance(domains, str):
        domains = [domains]
    domains = list(domains)
    if not domains:
        raise ValueError("domains is empty")
    if len(set(domains)) != len(domains):
        raise ValueError(f"domains repeat: {domains}")
    for domain in domains:  # every record, table and export names it
        check_name(domain, "domain")
    return domains


def check_settings(arguments):
    """Every parameter check of :func:`evaluate` and :func:`plan_evaluate`, before anything is
    read or written: ``arguments`` are the call's keywords. Returns the run's
    :class:`~imagenet_cog._grid.Protocol` (as it runs on the device), its domains and the
    resolved device."""
    domains = _domains(arguments["domains"])
    if arguments.get("model") is not None:  # else the stores' own, checked once known
        check_name(arguments["model"])
    protocol = Protocol.from_arguments(arguments)
    if protocol.n_trials <= protocol.n_startup_trials:
        warnings.warn(
            f"n_trials={protocol.n_trials} does not exceed n_startup_trials="
            f"{protocol.n_startup_trials}: every trial is a random startup trial and TPE never "
            "runs (the paper: 30 trials, 10 of them startup; lower --startup-trials for a short "
            "search)",
            UserWarning,
            stacklevel=3,
        )
    check_values(RUN_PARAMS, n_jobs=arguments.get("n_jobs", 1))
    from .._device import resolve_device

    # The one resolution of the device in a run: everything below takes it as given.
    device = arguments["device"]
    try:
        dev = resolve_device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a device torch knows ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: the probes run on 'cpu' or 'cuda[:N]' only")
    return protocol.on(dev), domains, dev
