"""The parameter, seed, label and feature checks of the torch-backed estimators: one
declarative table of parameter constraints per estimator, read by :func:`check_params`.

Imports nothing from the package, and neither torch nor scikit-learn until a check needs them,
so every stage can use it. (WordNet and file constants live with the taxonomy, in ``_base``.)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable

import numpy as np

__all__ = [
    "COMPILE",
    "DTYPE",
    "HIDDEN_LAYER_SIZES",
    "INT",
    "LR",
    "MIXED_PRECISION",
    "MIXED_PRECISIONS",
    "REAL",
    "SGD_PARAMS",
    "WEIGHT_DECAY",
    "Param",
    "check_labelled_features",
    "check_params",
    "check_values",
    "encode_labels",
    "int_seed",
    "whole",
]


# ------------------------------------------------------------------ parameter constraints
# scikit-learn's ``_parameter_constraints`` pattern, written here: each estimator declares one
# table, ``_parameter_checks = {name: Param}``, and :func:`check_params` checks its parameters
# against it. (Not under scikit-learn's own name: its private validator reads that attribute
# in its own format.) The
# tables live with their estimators (probe, _mlp); the constraints they share live here.
# torch and scikit-learn are imported inside the functions: the package's light top-level
# imports use this module.


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter's constraint: its accepted ``types``, a ``test`` of its value, and the
    ``wording`` of the error, ``"<name> must be <wording>, got <value>"``; and how a value that
    passes is ``convert``-ed to the type it is kept as.

    A value of none of ``types`` is a ``TypeError`` (``bool`` counts only when listed, not as
    an int); one that fails ``test`` a ``ValueError``. ``types=None`` accepts any type and
    leaves everything to ``test`` (a ``ValueError``). A typed value whose parser has its own
    one-line errors (the shots, the seeds) has no ``test``: its ``convert`` is the parser.
    """

    types: tuple | None
    test: Callable[[object], bool] | None
    wording: str
    convert: Callable[[object], object] | None = None

    def check(self, name, value):
        """Raise the one-line error of ``name=value`` when it breaks the constraint; else return
        the value, converted."""
        if self.types is not None and (
            not isinstance(value, self.types)
            or (isinstance(value, bool) and bool not in self.types)
        ):
            raise TypeError(f"{name} must be {self.wording}, got {value!r}")
        if self.test is not None and not self.test(value):
            raise ValueError(f"{name} must be {self.wording}, got {value!r}")
        return value if self.convert is None else self.convert(value)


REAL, INT = (numbers.Real,), (numbers.Integral,)
#: The ``mixed_precision`` settings of the probes and of the protocol.
MIXED_PRECISIONS = (None, "tf32", "bf16")


def _hidden_layer_sizes(value):
    return isinstance(value, (tuple, list)) and all(
        isinstance(h, numbers.Integral) and not isinstance(h, bool) and h >= 1 for h in value
    )


#: The SGD protocol's parameters, shared by every probe's table.
SGD_PARAMS = {
    "epochs": Param(INT, lambda v: v >= 1, "an int >= 1"),
    "batch_size": Param(INT, lambda v: v >= 1, "an int >= 1"),
    "momentum": Param(REAL, lambda v: 0 <= v < 1, "a float in [0, 1)"),
    "schedule": Param((str,), lambda v: v in ("cosine", "constant"), "'cosine' or 'constant'"),
    "memory_budget": Param(
        (numbers.Integral, type(None)),
        lambda v: v is None or v > 0,
        "None or a number of bytes > 0",
    ),
    "verbose": Param((numbers.Integral, bool), lambda v: True, "an int"),
}
#: A learning rate, a weight decay.
LR = Param(REAL, lambda v: 0 < v < math.inf, "a finite float > 0")
WEIGHT_DECAY = Param(REAL, lambda v: 0 <= v < math.inf, "a finite float >= 0")
#: The fused SGD step's ``compile`` setting.
COMPILE = Param((str, bool), lambda v: v in ("auto", True, False), "'auto', True or False")
#: The weights' dtype and the mixed precision (:func:`precisions` checks the pair).
DTYPE = Param(None, lambda v: v in ("float32", "float64"), "'float32' or 'float64'")
MIXED_PRECISION = Param(None, lambda v: v in MIXED_PRECISIONS, f"one of {MIXED_PRECISIONS}")
#: An MLP's hidden layers.
HIDDEN_LAYER_SIZES = Param(None, _hidden_layer_sizes, "a tuple of ints >= 1 (possibly empty)")


def check_params(est):
    """Check an estimator's parameters against its ``_parameter_checks`` table, in order.

    Examples
    --------
    >>> class Probe:
    ...     _parameter_checks = {"epochs": SGD_PARAMS["epochs"]}
    ...     epochs = 0
    >>> check_params(Probe())
    Traceback (most recent call last):
    ...
    ValueError: epochs must be an int >= 1, got 0
    """
    for name, param in type(est)._parameter_checks.items():
        param.check(name, getattr(est, name))


def check_values(table, **values):
    """Check a function's arguments against its constraint table, in the table's order.

    The functions' counterpart of :func:`check_params`: ``evaluate``, the searches and the MLP
    probe's search each declare one table of :class:`Param`.

    Examples
    --------
    >>> check_values({"epochs": SGD_PARAMS["epochs"]}, epochs=0)
    Traceback (most recent call last):
    ...
    ValueError: epochs must be an int >= 1, got 0
    """
    for name, param in table.items():
        if name in values:
            param.check(name, values[name])


def whole(minimum):
    """A :class:`Param` test: an integer (numpy's too, not a bool) of at least ``minimum``."""
    return lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= minimum


def int_seed(random_state):
    """An int seed: an int ``random_state`` is used as is (seed 22 means 22 everywhere)."""
    if isinstance(random_state, numbers.Integral):
        return int(random_state)
    from sklearn.utils import check_random_state

    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def encode_labels(y):
    """``(classes, codes)``: sorted classes and each label's int64 index; 2 classes or more."""
    classes, y_enc = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(
            f"a linear probe needs samples of at least 2 classes; the data holds 1 class "
            f"({classes[0].item()!r})"
        )
    return classes, y_enc.astype(np.int64).ravel()


def encode_test_labels(classes, y_test, train_name):
    """Each test label's index in ``classes`` (from :func:`encode_labels` of the training
    labels, called ``train_name`` in the error); a label absent from ``classes`` is an error.
    """
    import numpy as np

    y_test = np.asarray(y_test)
    pos = np.searchsorted(classes, y_test).clip(0, len(classes) - 1)
    unknown = classes[pos] != y_test
    if unknown.any():
        raise ValueError(
            f"y_test holds labels absent from {train_name}: {np.unique(y_test[unknown])}"
        )
    return pos


def check_labelled_features(X, n, name, n_features=None):
    """Shape and finiteness checks that do not copy ``X`` (a memmap or a device tensor).

    ``n`` is the number of labels ``X`` must have rows for; ``n_features`` the width of the
    training features ``X`` must match.
    """
    import torch

    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-d (n_samples, n_features), got shape {X.shape}")
    if X.shape[0] != n:
        raise ValueError(f"{name} has {X.shape[0]} rows but its labels have {n}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{name} has {X.shape[1]} features, but X has {n_features}")
    if isinstance(X, torch.Tensor):
        if not bool(torch.isfinite(X).all()):
            raise ValueError(f"{name} contains NaN or infinity")
    else:
        from sklearn.utils import assert_all_finite

        assert_all_finite(X, input_name=name)
