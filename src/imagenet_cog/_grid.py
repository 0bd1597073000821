"""The paper's protocol: its grid (domains, shots and seeds, and how they are named and
sorted), what a cell's search takes of each class (the validation holdout, the shots), and the
protocol's settings as one frozen :class:`Protocol`, whose defaults are the paper's values.

Every stage that walks the grid or trains with the protocol (the engine, the probes, the
protocol, the results, the analyses, the published results) takes it from here, so none of
them has to import another to learn it. Imports nothing from the package but the parameter
vocabulary (:mod:`imagenet_cog._validation`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import ClassVar

import numpy as np

from ._validation import MIXED_PRECISIONS, SGD_PARAMS, Param, whole

__all__ = [
    "DOMAINS",
    "PAPER_PROTOCOL",
    "SEEDS",
    "SHOTS",
    "VAL_FRACTION",
    "Protocol",
    "Seeds",
    "Shots",
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


# ------------------------------------------------------------------ typed values of the grid
class Shots(tuple):
    """The shots of a run: numbers of training images per class (ints >= 1) and ``"all"``,
    distinct, in the order given. One value stands for itself; ``"16"`` and ``"All"`` are
    read as ``16`` and ``"all"``.

    Examples
    --------
    >>> Shots(["16", "All", 4]), Shots(8)
    ((16, 'all', 4), (8,))
    """

    def __new__(cls, values=SHOTS):
        if isinstance(values, (str, numbers.Integral)):
            values = [values]
        shots = [normalize_shots(s) for s in values]
        if not shots:
            raise ValueError("shots and seeds must not be empty")
        if len(set(shots)) != len(shots):
            raise ValueError(f"shots repeat: {shots}")
        return super().__new__(cls, shots)


class Seeds(tuple):
    """The seeds of a run: distinct integers from 0 to 2**32 - 1 (what numpy's generators and
    Optuna's sampler take), in the order given (one int stands for itself).

    Examples
    --------
    >>> Seeds([22, "37"]), Seeds(45)
    ((22, 37), (45,))
    """

    def __new__(cls, values=SEEDS):
        try:
            seeds = [int(s) for s in ([values] if isinstance(values, numbers.Integral) else values)]
        except (TypeError, ValueError):
            raise ValueError(f"seeds must be integers, got {values!r}") from None
        if not seeds:
            raise ValueError("shots and seeds must not be empty")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds repeat: {seeds}")
        if min(seeds) < 0:
            raise ValueError(f"seeds must be >= 0 (numpy's generator refuses others), got {seeds}")
        if max(seeds) >= 2**32:
            raise ValueError(
                f"seeds must be below 2**32 (Optuna's sampler refuses larger ones), got {seeds}; "
                "choose others with --seeds (seeds= in Python)"
            )
        return super().__new__(cls, seeds)


# ------------------------------------------------------------------ the protocol
#: How every search asks for its trials (recorded as it is: there is no other).
TPE_SAMPLER = "optuna TPE multivariate, seeded"


def _setting(default, *, recorded=True, compared=True, label=None):
    """A field of :class:`Protocol`: ``recorded`` in ``config.json``'s ``"protocol"``;
    ``compared``: one of the settings two runs must share to be compared (the comparability
    verdict, the paired test, the HTML report's protocol row); ``label``: the verdict's words
    for it (its name otherwise). A field declared without them is recorded and compared."""
    return dataclasses.field(
        default=default, metadata={"recorded": recorded, "compared": compared, "label": label}
    )


def _range(value):
    try:
        lo, hi = value
        return 0 < lo < hi < math.inf
    except (TypeError, ValueError):
        return False


def _floats(value):
    return tuple(float(x) for x in value)


def _recorded(value):
    return list(value) if isinstance(value, tuple) else value


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The linear-probe protocol of a run, whose defaults are the paper's (Sec. 3.4.2 and
    supplement B.2): 100 epochs of SGD (batch 1024, momentum 0.9, cosine decay) per probe;
    per search, 30 Optuna TPE trials (10 random startup trials, asked one at a time) of lr in
    [0.1, 100] and wd in [1e-12, 1e-4], scored on a per-class 20% validation holdout; float32
    throughout; l2-normalised features; every shots value of the paper's tables, five seeds.

    Frozen, and checked when made against :attr:`_parameter_constraints` (one
    :class:`~imagenet_cog._validation.Param` per field, scikit-learn's style): a bad value is a
    one-line ``ValueError`` naming the setting. ``evaluate`` and ``plan_evaluate`` make one
    from their keywords; the engine, the searches and the memory plan read it; ``config.json``
    records it (:meth:`record`, read back by :meth:`from_record`); the comparability verdict,
    the paired test and the HTML report compare and show the settings of :meth:`compared`.

    Examples
    --------
    >>> from imagenet_cog._grid import PAPER_PROTOCOL, Protocol
    >>> run = Protocol(epochs=5, shots=[1, "all"], seeds=22)
    >>> run.shots, run.seeds, run.batch_size
    ((1, 'all'), (22,), 1024)
    >>> Protocol.differences(run.record(), PAPER_PROTOCOL.record())
    [('epochs', 5, 100)]
    >>> Protocol(n_trials=0)
    Traceback (most recent call last):
    ...
    ValueError: n_trials must be an integer >= 1, got 0
    """

    epochs: int = 100
    batch_size: int = 1024
    n_trials: int = 30
    n_startup_trials: int = 10
    trials_per_batch: int = _setting(
        1,
        label="trials of one search batched (TPE sequence differs from the official "
        "sequential one)",
    )
    lr_range: tuple = (0.1, 100.0)
    wd_range: tuple = (1e-12, 1e-4)
    val_fraction: float = VAL_FRACTION
    mixed_precision: str | None = _setting(None, label="mixed precision")
    normalize: bool = True
    # Recorded, not compared: no run changes them.
    momentum: float = _setting(0.9, compared=False)
    schedule: str = _setting("cosine", compared=False)
    sampler: str = _setting(TPE_SAMPLER, compared=False)
    # The grid: each record says its own cell, so they are neither recorded nor compared here.
    # (_setting returns a dataclasses.field: the default is the immutable tuple given.)
    shots: Shots = _setting(SHOTS, recorded=False, compared=False)  # noqa: RUF009
    seeds: Seeds = _setting(SEEDS, recorded=False, compared=False)  # noqa: RUF009

    #: One constraint per field, checked in this order when a protocol is made.
    _parameter_constraints: ClassVar[dict[str, Param]] = {
        "shots": Param(None, None, "", convert=Shots),
        "seeds": Param(None, None, "", convert=Seeds),
        "n_trials": Param(None, whole(1), "an integer >= 1", convert=int),
        "n_startup_trials": Param(None, whole(0), "an integer >= 0", convert=int),
        "trials_per_batch": Param(None, whole(1), "an integer >= 1", convert=int),
        "epochs": Param(None, whole(1), "an integer >= 1", convert=int),
        "batch_size": Param(None, whole(1), "an integer >= 1", convert=int),
        "mixed_precision": Param(None, lambda v: v in MIXED_PRECISIONS, "None, 'tf32' or 'bf16'"),
        "normalize": Param(
            None, lambda v: isinstance(v, (bool, np.bool_)), "True or False", convert=bool
        ),
        "lr_range": Param(None, _range, "(low, high) with 0 < low < high", convert=_floats),
        "wd_range": Param(None, _range, "(low, high) with 0 < low < high", convert=_floats),
        "val_fraction": Param(None, lambda v: 0 < v < 1, "in (0, 1)", convert=float),
        "momentum": SGD_PARAMS["momentum"],
        "schedule": SGD_PARAMS["schedule"],
        "sampler": Param(None, lambda v: v == TPE_SAMPLER, repr(TPE_SAMPLER)),
    }

    def __post_init__(self):
        unchecked = [f.name for f in dataclasses.fields(self)]
        unchecked = [n for n in unchecked if n not in self._parameter_constraints]
        if unchecked:
            raise TypeError(f"{type(self).__name__}: no constraint for {unchecked}")
        for name, param in self._parameter_constraints.items():
            object.__setattr__(self, name, param.check(name, getattr(self, name)))

    # -------------------------------------------------------------- made
    @classmethod
    def from_arguments(cls, arguments):
        """The protocol of a call: the entries of ``arguments`` (a function's keywords) that
        name a setting; the others keep the paper's values."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: arguments[name] for name in names if name in arguments})

    def replace(self, **changes):
        """This protocol with ``changes``, checked."""
        return dataclasses.replace(self, **changes)

    def on(self, device):
        """The protocol as it runs on ``device`` (a ``torch.device``): TF32 is a CUDA matmul
        mode, so elsewhere ``mixed_precision="tf32"`` is the default float32 run."""
        if self.mixed_precision == "tf32" and device.type != "cuda":
            return self.replace(mixed_precision=None)
        return self

    # -------------------------------------------------------------- recorded
    def record(self):
        """``config.json``'s ``"protocol"``: every recorded setting, as JSON keeps it."""
        return {
            f.name: _recorded(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.metadata.get("recorded", True)
        }

    @classmethod
    def from_record(cls, record, *, shots=SHOTS, seeds=SEEDS):
        """The protocol a :meth:`record` holds (with the grid ``shots`` and ``seeds``).

        Raises
        ------
        ValueError
            When the record lacks a setting, names one this protocol does not have, or holds
            a value it refuses.
        """
        names = [f.name for f in dataclasses.fields(cls) if f.metadata.get("recorded", True)]
        missing = [n for n in names if n not in record]
        unknown = sorted(set(record) - set(names))
        if missing or unknown:
            raise ValueError(
                "not a protocol record: "
                + "; ".join(
                    [f"it lacks {missing}"] * bool(missing) + [f"unknown {unknown}"] * bool(unknown)
                )
            )
        return cls(**{n: record[n] for n in names}, shots=shots, seeds=seeds)

    # -------------------------------------------------------------- compared
    @classmethod
    def compared(cls):
        """The names of the settings two runs must share to be compared, in order."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("compared", True))

    @classmethod
    def label(cls, name):
        """The comparability verdict's words for setting ``name``."""
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        return field.metadata.get("label") or name

    @classmethod
    def differences(cls, a, b):
        """``[(name, value in a, value in b)]`` of the compared settings that two recorded
        protocols (``config.json``'s, or a :meth:`record`) both hold and that differ: the one
        comparison of the verdict, the paired test and the report. A setting a record does
        not hold (written before it existed) is no difference."""
        return [
            (name, a[name], b[name])
            for name in cls.compared()
            if name in a and name in b and a[name] != b[name]
        ]

    @classmethod
    def rows(cls, record):
        """``[(name, value)]`` of the compared settings a recorded protocol holds, in order:
        what a report shows of it."""
        return [(name, record[name]) for name in cls.compared() if name in record]


#: The paper's protocol.
PAPER_PROTOCOL = Protocol()
