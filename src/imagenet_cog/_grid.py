"""The benchmark grid: the paper's domains, shots and seeds, and how they are named and sorted.

Every stage that walks the grid (probe, protocol, results, analysis, the published results)
takes it from here, so none of them has to import another to learn it. Imports nothing from
the package.
"""

from __future__ import annotations

import math

__all__ = [
    "DOMAINS",
    "SEEDS",
    "SHOTS",
    "display_domain",
    "display_shots",
    "domain_key",
    "normalize_shots",
    "shot_key",
]

#: Domains in the order of the paper's tables: IN-1K, then L1 (closest) to L5.
DOMAINS = ("in1k", "L1", "L2", "L3", "L4", "L5")
#: Shots in the order of the paper's tables; ``"all"`` is the whole training set.
SHOTS = (1, 2, 4, 8, 16, 32, 64, 128, "all")
#: The five seeds of the official protocol (the paper, Sec. 4 and supplement B).
SEEDS = (22, 37, 45, 77, 93)


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
