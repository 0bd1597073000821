"""The benchmark grid: the paper's domains, shots and seeds, and how they are named and sorted;
and what a cell's search takes of each class (the validation holdout, the shots).

Every stage that walks the grid (probe, protocol, results, analysis, the published results)
takes it from here, so none of them has to import another to learn it. Imports nothing from
the package.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "DOMAINS",
    "SEEDS",
    "SHOTS",
    "VAL_FRACTION",
    "display_domain",
    "display_shots",
    "domain_key",
    "holdout_sizes",
    "normalize_shots",
    "short_class",
    "shot_key",
]

#: Domains in the order of the paper's tables: IN-1K, then L1 (closest) to L5.
DOMAINS = ("in1k", "L1", "L2", "L3", "L4", "L5")
#: Shots in the order of the paper's tables; ``"all"`` is the whole training set.
SHOTS = (1, 2, 4, 8, 16, 32, 64, 128, "all")
#: The five seeds of the official protocol (the paper, Sec. 4 and supplement B).
SEEDS = (22, 37, 45, 77, 93)
#: The share of each class's training images a search holds out for validation.
VAL_FRACTION = 0.2


def holdout_sizes(counts, val_fraction=VAL_FRACTION):
    """Images held out for validation per class: ``floor(val_fraction * n_c)``.

    In integer arithmetic, so that ``0.2 * n`` never rounds below ``n / 5``. ``counts`` is a
    count or an integer array of one count per class.
    """
    scale = 10**6
    return counts * round(val_fraction * scale) // scale


def short_class(available, n_shots):
    """The first class with fewer than ``n_shots`` images ``available`` (one count per class).

    Returns ``(index, note)``, the note saying how many more classes are short (empty when
    none is), or ``None`` when every class has enough.
    """
    short = np.flatnonzero(np.asarray(available) < n_shots)
    if not short.size:
        return None
    note = f" ({short.size - 1} more classes are short too)" if short.size > 1 else ""
    return int(short[0]), note


def domain_key(domain):
    """Sort key: the paper's domains in table order, then any other name alphabetically."""
    return (DOMAINS.index(domain), "") if domain in DOMAINS else (len(DOMAINS), str(domain))


def shot_key(shots):
    """Sort key: numbers ascending, ``"all"`` last."""
    return math.inf if shots == "all" else float(shots)


def normalize_shots(value):
    """``"all"`` stays ``"all"``; anything else becomes a positive int.

    Examples
    --------
    >>> normalize_shots("16"), normalize_shots("All"), normalize_shots(4)
    (16, 'all', 4)
    """
    allowed = "shots must be a positive number of images per class or 'all', got"
    if isinstance(value, str):
        if value.strip().lower() == "all":
            return "all"
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{allowed} {value!r}") from None
    value = int(value)
    if value < 1:
        raise ValueError(f"{allowed} {value}")
    return value


def display_domain(domain):
    """``"in1k"`` → ``"IN-1K"``; level names as they are."""
    return "IN-1K" if domain == "in1k" else str(domain)


def display_shots(shots):
    """``"all"`` → ``"All"``; numbers as they are."""
    return "All" if shots == "all" else str(shots)
