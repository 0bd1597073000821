"""Whether a run is comparable with the paper's numbers, and why not.

Stage "results". The paper's protocol constants, seeds, concepts and test-set sizes, and
the checks of a :class:`~imagenet_cog.Results`' recorded protocol against them
(:func:`comparability`, :class:`NotComparableError`, the banner of the reports). Reads the
results only through their ``summary()``, ``records``, ``models`` and ``meta``, so it imports
nothing from ``results``, which re-exports these names.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from ._grid import DOMAINS, SEEDS, SHOTS, display_domain, display_shots, domain_key, shot_key
from ._model_sources import parse_spec
from ._presets import paper_preset
from ._validation import WNID_RE

__all__ = [
    "COMPARABLE",
    "PAPER_CONCEPTS",
    "PAPER_OPTUNA",
    "PAPER_PROTOCOL",
    "PAPER_SEEDS",
    "PAPER_TEST_IMAGES",
    "NotComparableError",
    "comparability",
    "concepts_checksum",
    "labels_are_wnids",
    "not_comparable_banner",
]

_domain_key, _shot_key = domain_key, shot_key


def concepts_checksum(labels):
    """sha256 of the sorted, distinct labels joined by newlines: which concepts a domain used.

    Examples
    --------
    >>> concepts_checksum(["n2", "n1", "n2"]) == concepts_checksum(["n1", "n2"])
    True
    """
    names = sorted({str(x) for x in np.asarray(labels).ravel().tolist()})
    return hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()


def labels_are_wnids(labels):
    """Whether every label is a WordNet id (``n`` and 8 digits), so it can name a concept.

    Examples
    --------
    >>> labels_are_wnids(["n01440764", "n01443537"]), labels_are_wnids([0, 1])
    (True, False)
    """
    return all(WNID_RE.match(str(x)) for x in np.asarray(labels).ravel().tolist())


#: The protocol constants the paper's numbers were produced with (the paper, Sec. 3.4.2 and supplement B.2).
PAPER_PROTOCOL = {
    "epochs": 100,
    "batch_size": 1024,
    "n_trials": 30,
    "n_startup_trials": 10,
    "trials_per_batch": 1,
    "lr_range": [0.1, 100],
    "wd_range": [1e-12, 1e-4],
    "val_fraction": 0.2,
    "mixed_precision": None,
}
PAPER_SEEDS = 5
COMPARABLE = (
    "Comparable with the paper means: the official levels (the same 5000 concepts and "
    "50 test images each), the same protocol constants (100 epochs of SGD, batch 1024, "
    "30 TPE trials per seed run sequentially, lr in [0.1, 100], wd in [1e-12, 1e-4], a 20% "
    "validation holdout, 5 seeds), and images identical between the Fall 2011 and Winter 2021 "
    "releases (the CoG images are; IN-1K is ILSVRC-2012, not its face-blurred version)."
)


#: Concepts and test images per domain in the paper (1000 concepts × 50 test images).
PAPER_CONCEPTS = 1000
PAPER_TEST_IMAGES = 50_000
#: The Optuna release the official code pins.
PAPER_OPTUNA = "2.3.0"


class NotComparableError(ValueError):
    """A model's results deviate from the paper's protocol, and ``strict`` was asked.

    Raised by :meth:`Results.compare` with ``strict=True`` (and ``imagenet-cog report
    --strict``, which exits with status 2); the message names each deviation.

    Examples
    --------
    >>> from imagenet_cog import Results, reference_results
    >>> run = Results([{"model": "m", "domain": "L1", "shots": "all", "seed": 22, "top1": 60.0}])
    >>> try:
    ...     run.compare(reference_results(), strict=True)
    ... except ValueError as exc:  # NotComparableError is a ValueError
    ...     print(type(exc).__name__, str(exc)[:83])
    NotComparableError NOT COMPARABLE with the paper (strict): m: 1 seed per cell instead of the paper's 5
    """


@functools.lru_cache(maxsize=1)
def _official_checksums():
    from .levels import load_levels
    from .taxonomy import imagenet1k_wnids

    sums = {"in1k": concepts_checksum(list(imagenet1k_wnids()))}
    for i, level in enumerate(load_levels("official").levels, start=1):
        sums[f"L{i}"] = concepts_checksum(level)
    return sums


def _check_model(results, model, proto):
    """``(deviations, caveats)`` of one model against the paper's protocol.

    Deviations change the numbers of the cells that are there (other concepts, constants,
    seeds, unnormalised features, or settings that were not recorded): such a model is not
    comparable. Caveats leave those cells comparable: cells, shots or domains that are
    missing (the others still compare), another Optuna (the same TPE search, another
    sequence of trials), labels that cannot be checked against the official concepts, a
    model outside the paper's 31 (named by its spec).
    """
    dev, cav = [], []
    rows = [r for r in results.summary() if r["model"] == model]
    seeds = {r["n"] for r in rows}
    if seeds and min(seeds) < PAPER_SEEDS:
        n = min(seeds)
        dev.append(f"{n} seed{'s' if n != 1 else ''} per cell instead of the paper's {PAPER_SEEDS}")
    used = sorted({int(r["seed"]) for r in results.records
                   if r["model"] == model and r.get("seed") is not None})  # fmt: skip
    other_seeds = [x for x in used if x not in SEEDS]
    if other_seeds:
        dev.append(
            f"seeds {other_seeds} are not the official ones {list(SEEDS)} (other "
            "holdouts, shots and TPE draws)"
        )
    shots = {r["shots"] for r in rows}
    other = sorted(shots - set(SHOTS), key=_shot_key)
    if other:
        dev.append(f"shots {other} are not among the paper's {list(SHOTS)}")
    domains = {r["domain"] for r in rows}
    missing = [d for d in DOMAINS if d not in domains]
    if missing:
        cav.append(f"no results for {', '.join(display_domain(d) for d in missing)}")
    absent = [s for s in SHOTS if s not in shots]
    if absent:
        cav.append(f"no results for N={', '.join(display_shots(s) for s in absent)}")
    holes = [f"{display_domain(d)} N={display_shots(n)}"
             for d in sorted(domains, key=_domain_key) for n in sorted(shots, key=_shot_key)
             if not any(r["domain"] == d and r["shots"] == n for r in rows)]  # fmt: skip
    if holes:
        cav.append(f"missing cells: {', '.join(holes[:8])}" + (" ..." if len(holes) > 8 else ""))
    other = _other_model(model)
    if other:
        cav.append(other)
    if proto is None:
        dev.append("its protocol settings are unknown (no config.json)")
        return dev, cav
    for key, expected in PAPER_PROTOCOL.items():
        if key in proto and proto[key] != expected:
            what = {
                "trials_per_batch": "trials of one search batched (TPE sequence differs from "
                "the official sequential one)",
                "mixed_precision": "mixed precision",
            }.get(key, key)
            dev.append(f"{what}: {proto[key]!r} instead of {expected!r}")
    levels = proto.get("levels", results.meta.get("levels"))
    if levels not in (None, "official"):
        dev.append(f"levels {levels!r} instead of the official ones")
    if "normalize" not in proto:
        dev.append("whether the features were l2-normalised is not recorded (an older run)")
    elif not proto["normalize"]:
        dev.append(
            "features not l2-normalised (normalize=False); the official probe normalises them "
            "and its lr range [0.1, 100] assumes unit-norm features"
        )
    data = proto.get("data")
    if data is None:
        dev.append("the concepts and images used are not recorded (an older run)")
        data = {}
    official = _official_checksums()
    for domain in sorted(data, key=_domain_key):
        info, name = data[domain], display_domain(domain)
        n = info.get("n_classes")
        if n != PAPER_CONCEPTS:
            dev.append(f"{name}: {n} concepts instead of the paper's {PAPER_CONCEPTS} (a subset)")
        elif not info.get("wnid_labels"):
            cav.append(f"{name}: the labels are not wnids, so the concepts cannot be checked "
                       "against the official list")  # fmt: skip
        elif domain in official and info.get("classes_sha256") != official[domain]:
            dev.append(f"{name}: {n} concepts, but not the official {name} list")
        n_test = info.get("n_test")
        if n_test is not None and n_test != PAPER_TEST_IMAGES:
            text = f"{name}: {n_test} test images instead of the paper's {PAPER_TEST_IMAGES}"
            # A few undecodable images change little; a smaller test set changes the numbers.
            (cav if n_test >= 0.99 * PAPER_TEST_IMAGES else dev).append(text)
    optuna = (proto.get("versions") or {}).get("optuna")
    if optuna is None:
        cav.append(f"the Optuna version is not recorded (the official code pins {PAPER_OPTUNA})")
    elif optuna.split(".")[0] != PAPER_OPTUNA.split(".")[0]:
        cav.append(
            f"Optuna {optuna} instead of the official code's {PAPER_OPTUNA}: the same seeded "
            "TPE search, but its trials diverge from about trial 10 on, so the chosen (lr, wd) "
            "and the scores can differ slightly (see the docs, 'Differences from the official "
            "code')"
        )
    return dev, cav


def _other_model(model):
    """The caveat of a model named by a spec (its name in the results) outside the paper's 31."""
    try:
        source = parse_spec(model)[0]
    except ValueError:  # a name, not a spec: nothing to say
        return None
    if paper_preset(model) is not None:
        return None
    return (
        f"not one of the paper's 31 models ({source} spec): ranked among them as another model, "
        "under the same protocol, with its own preprocessing and feature layer (no paper preset "
        "applies; see the docs' model zoo)"
    )


def comparability(results, by_model=False):
    """What keeps a run from being comparable with the paper's numbers.

    Checks each non-reference model's recorded protocol (``meta["protocol"]``, from its
    ``config.json``) and cells against the paper's: the concepts of each domain (1000, the
    official lists when labels are wnids), the test images (50 per concept), the levels, the
    constants (epochs, batch, trials, the lr and wd ranges, sequential trials, no mixed
    precision), l2-normalised features, the five official seeds, the shots, domains and
    cells present, and the Optuna version.

    *Deviations* change the numbers themselves: a model with any is **not comparable**,
    and :meth:`Results.compare` and ``imagenet-cog report`` show its ranks only in
    parentheses, under a banner. *Caveats* leave the cells that are there comparable
    (missing cells, shots or domains; another Optuna; labels that cannot be checked).

    Parameters
    ----------
    results : Results
        Typically made by :meth:`Results.compare`; models listed in
        ``meta["reference_models"]`` are not checked.
    by_model : bool
        Return ``{model: {"deviations": [...], "caveats": [...]}}`` instead.

    Returns
    -------
    list of str or dict
        One ``"<model>: <reason>"`` line per deviation, then one ``"<model>: (caveat)
        <reason>"`` per caveat; the first item restates what "comparable" means whenever
        there is anything. Empty when nothing deviates.

    Examples
    --------
    >>> from imagenet_cog import Results
    >>> from imagenet_cog.results import comparability
    >>> run = Results([{"model": "mine", "domain": "L1", "shots": "all", "seed": 22, "top1": 60.0}])
    >>> [n for n in comparability(run) if n.startswith("mine: 1 seed")]
    ["mine: 1 seed per cell instead of the paper's 5"]
    >>> comparability(run, by_model=True)["mine"]["deviations"][:2]
    ["1 seed per cell instead of the paper's 5", 'its protocol settings are unknown (no config.json)']
    """
    found = {}
    reference = set(results.meta.get("reference_models", []))
    protocols = results.meta.get("protocol", {})
    for model in results.models:
        if model in reference:
            continue
        dev, cav = _check_model(results, model, protocols.get(model))
        found[model] = {"deviations": dev, "caveats": cav}
    if by_model:
        return found
    notes = [f"{m}: {x}" for m, v in found.items() for x in v["deviations"]]
    notes += [f"{m}: (caveat) {x}" for m, v in found.items() for x in v["caveats"]]
    if notes:
        notes.insert(0, COMPARABLE)
    return notes


def not_comparable_banner(results):
    """The banner naming each non-comparable model and why, or ``""`` when there is none.

    Examples
    --------
    >>> from imagenet_cog import Results
    >>> run = Results([{"model": "m", "domain": "L1", "shots": "all", "seed": 22, "top1": 60.0}])
    >>> print(not_comparable_banner(run).splitlines()[0])
    !!! NOT COMPARABLE with the paper: m !!!
    """
    found = {m: v["deviations"] for m, v in comparability(results, by_model=True).items()
             if v["deviations"]}  # fmt: skip
    if not found:
        return ""
    lines = [f"!!! NOT COMPARABLE with the paper: {', '.join(found)} !!!"]
    for model, reasons in found.items():
        lines += [f"  {model}: {r}" for r in reasons]
    lines.append("  Ranks of these models are shown in parentheses, for orientation only.")
    return "\n".join(lines)
