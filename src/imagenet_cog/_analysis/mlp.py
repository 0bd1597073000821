"""The MLP probe of the CoG paper's first version (supplement C.3), on the probe's SGD protocol.

:func:`train_mlp` trains one multi-layer perceptron with the protocol of the linear probe
(SGD with momentum, weight decay on every parameter, batches reshuffled every epoch, the
cosine schedule applied after each epoch, the last epoch's weights). :class:`MLPProbe` wraps
it as a scikit-learn classifier. Unlike the linear probes, MLPs do not batch several
configurations into one pass: each fit is its own pass over the features.

:mod:`imagenet_cog.analysis` exports :class:`MLPProbe` and builds the search
(:func:`~imagenet_cog.analysis.mlp_probe`) on top of :func:`train_mlp`.
"""

from __future__ import annotations

import dataclasses
import math
from itertools import pairwise
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .._classifier import ProbeClassifierMixin
from .._device import DeviceTagsMixin
from .._grid import PAPER_PROTOCOL
from .._validation import (
    DTYPE,
    HIDDEN_LAYER_SIZES,
    LR,
    SGD_PARAMS,
    WEIGHT_DECAY,
    Param,
    check_params,
    encode_labels,
    int_seed,
)

__all__ = ["MLPProbe"]

#: ``activation`` values: ``"relu"`` is the paper's MLP, ``"identity"`` its MLP_NoAct.
ACTIVATIONS = ("relu", "identity")
#: Learning-rate ranges of the search (supplement B.2): MLP (ReLU) as LogReg, [0.1, 100];
#: MLP_NoAct (identity) [0.01, 10].
MLP_LR_RANGES = {"relu": (0.1, 100.0), "identity": (0.01, 10.0)}
#: Weight-decay range of the search for both MLP variants (supplement B.2).
MLP_WD_RANGE = (1e-8, 1e-4)

#: What to do when an MLP's loss turns non-finite.
MLP_HINT = "lower lr"

# Rows of one evaluation block: bounds the activations held at once.
_EVAL_ROWS = 8192


@dataclasses.dataclass
class MLPTrainResult:
    """What :func:`train_mlp` returns.

    ``coefs``/``intercepts`` are NumPy arrays shaped as scikit-learn's ``MLPClassifier``'s
    (``coefs[i]`` is ``(n_in, n_out)``), ``None`` when the fit diverged. ``loss_curve[e]`` is
    the mean of epoch ``e``'s batch losses (NaN from the divergence on); ``n_epochs`` counts
    the epochs with finite loss; ``top1``/``top5`` are fractions on ``eval_idx``.
    """

    coefs: list | None
    intercepts: list | None
    loss_curve: np.ndarray
    diverged: bool
    n_epochs: int
    top1: float = math.nan
    top5: float = math.nan


def _init_params(sizes, seed, dtype):
    """``nn.Linear``'s initialisation of every layer, from one seeded generator.

    Layer by layer, weight then bias, each uniform in ``±1/sqrt(fan_in)`` (what
    ``nn.Linear.reset_parameters`` draws). The generator then shuffles the batches, as the
    linear engine's does, so an MLP without hidden layers is exactly the linear probe.
    """
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    params = []
    for fan_in, fan_out in pairwise(sizes):
        bound = 1.0 / math.sqrt(fan_in)
        params.append(
            torch.empty(fan_out, fan_in, dtype=dtype).uniform_(-bound, bound, generator=gen)
        )
        params.append(torch.empty(fan_out, dtype=dtype).uniform_(-bound, bound, generator=gen))
    return gen, params


def _forward(params, x, activation):
    """Logits of the MLP whose ``nn.Linear``-shaped parameters are ``[W1, b1, W2, b2, ...]``."""
    import torch

    last = len(params) - 2
    for i in range(0, len(params), 2):
        x = torch.addmm(params[i + 1], x, params[i].T)
        if i < last and activation == "relu":
            x = torch.relu(x)
    return x


def _batches(data, rows, rows_dev, batch):
    """Yield ``(features, labels)`` of consecutive batches of ``rows`` on the device.

    Streamed data is gathered on the host a chunk of whole batches at a time, so the batch
    boundaries are those of resident data.
    """
    if data.resident:
        for start in range(0, len(rows), batch):
            sel = rows_dev[start : start + batch]
            yield data.X.index_select(0, sel), data.y[sel]
        return
    span = max(1, data.rows_per_chunk // batch) * batch
    for s0 in range(0, len(rows), span):
        chunk = data.host_rows(rows[s0 : s0 + span])
        for start in range(0, chunk.shape[0], batch):
            sel = rows_dev[s0 + start : s0 + start + batch]
            yield chunk[start : start + batch], data.y[sel]


def train_mlp(
    data,
    *,
    n_classes,
    hidden_layer_sizes=(2048, 2048),
    activation="relu",
    lr=0.1,
    weight_decay=0.0,
    seed=0,
    train_idx=None,
    eval_data=None,
    eval_idx=None,
    epochs=PAPER_PROTOCOL.epochs,
    batch_size=PAPER_PROTOCOL.batch_size,
    momentum=PAPER_PROTOCOL.momentum,
    schedule=PAPER_PROTOCOL.schedule,
    verbose=0,
):
    """Train one MLP by minibatch SGD with the linear probe's protocol.

    ``torch.optim.SGD`` (momentum, no Nesterov, weight decay on every weight and bias) over
    ``nn.Linear`` layers with ``activation`` between them, cross-entropy averaged over the
    batch, batches of ``min(batch_size, n)`` rows reshuffled every epoch by the seeded
    generator that drew the initial weights, the last batch partial, the learning rate set per
    epoch by :func:`~imagenet_cog._train.engine.lr_schedule` (the cosine decay applied after each
    epoch), and the last epoch's weights. A non-finite epoch loss (or weight) stops the fit and
    marks it diverged.

    Parameters
    ----------
    data : DeviceData
        Training features and class indices; its dtype is the training dtype.
    n_classes : int
    hidden_layer_sizes : tuple of int
        Widths of the hidden layers; ``()`` is softmax regression.
    activation : {"relu", "identity"}
    lr, weight_decay, seed, epochs, batch_size, momentum, schedule
        The SGD protocol.
    train_idx : array of int, optional
        Rows of ``data`` to train on (default: all).
    eval_data : DeviceData, optional
        Data ``eval_idx`` indexes (default: ``data``).
    eval_idx : array of int, optional
        Rows whose last-epoch top-1/top-5 are wanted.
    verbose : int
        Print the loss after each epoch.

    Returns
    -------
    MLPTrainResult
    """
    import torch

    from .._train.engine import _as_index, lr_schedule

    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    device, dtype = data.device, data.dtype
    idx = _as_index(train_idx, data.n, "train_idx")
    if idx.size == 0:
        raise ValueError("train_idx is empty")
    sizes = (data.d, *(int(h) for h in hidden_layer_sizes), int(n_classes))
    gen, params = _init_params(sizes, seed, dtype)
    params = [p.to(device).requires_grad_() for p in params]
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    factors = lr_schedule(schedule, epochs)
    batch = min(int(batch_size), idx.size)
    curve = np.full(epochs, np.nan)
    diverged_at = -1
    for epoch in range(epochs):
        for group in opt.param_groups:
            group["lr"] = lr * float(factors[epoch])
        rows = idx[torch.randperm(idx.size, generator=gen).numpy()]
        rows_dev = torch.from_numpy(rows).to(device)
        total = torch.zeros((), dtype=torch.float64, device=device)
        steps = 0
        for xb, yb in _batches(data, rows, rows_dev, batch):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(_forward(params, xb, activation), yb)
            loss.backward()
            opt.step()
            total += loss.detach()
            steps += 1
        curve[epoch] = float(total) / steps
        with torch.no_grad():
            finite = math.isfinite(curve[epoch]) and all(
                bool(torch.isfinite(p).all()) for p in params
            )
        if verbose:
            print(f"epoch {epoch + 1}/{epochs}: loss {curve[epoch]:.4f}")
        if not finite:
            diverged_at = epoch
            curve[epoch:] = np.nan
            break
    if diverged_at >= 0:
        return MLPTrainResult(None, None, curve, True, diverged_at)
    top1 = top5 = math.nan
    if eval_idx is not None:
        top1, top5 = _evaluate(params, activation, eval_data or data, eval_idx)
    weights = [p.detach().cpu().numpy() for p in params]
    return MLPTrainResult(
        coefs=[w.T.copy() for w in weights[0::2]],
        intercepts=[b.copy() for b in weights[1::2]],
        loss_curve=curve,
        diverged=False,
        n_epochs=epochs,
        top1=top1,
        top5=top5,
    )


def _evaluate(params, activation, data, eval_idx):
    """Top-1 and top-5 fractions of the MLP on rows ``eval_idx`` of ``data``."""
    import torch

    from .._train.engine import _as_index, best_classes

    idx = _as_index(eval_idx, data.n, "eval_idx")
    if idx.size == 0:
        return math.nan, math.nan
    hits1 = hits5 = 0
    with torch.no_grad():
        idx_dev = torch.from_numpy(idx).to(data.device)
        for xb, yb in _batches(data, idx, idx_dev, _EVAL_ROWS):
            logits = _forward(params, xb, activation)
            top = best_classes(logits)
            match = top == yb[:, None]
            hits1 += int(match[:, 0].sum())
            hits5 += int(match.any(1).sum())
    return hits1 / idx.size, hits5 / idx.size


def _check_hidden(value):
    HIDDEN_LAYER_SIZES.check("hidden_layer_sizes", value)
    return tuple(int(h) for h in value)


class MLPProbe(DeviceTagsMixin, ProbeClassifierMixin, BaseEstimator):
    """A multi-layer perceptron probe on frozen features (CoG supplement C.3).

    The paper's MLP has two hidden layers of 2048 units with ReLU between them,
    ``s = W3 ρ(W2 ρ(W1 x + b1) + b2) + b3``; MLP_NoAct is the same network with
    ``activation="identity"`` (a linear model overall, with many more parameters than
    LogReg). Training follows :class:`~imagenet_cog.LinearProbe`'s SGD protocol: cross-entropy
    averaged over the batch, ``torch.optim.SGD`` with momentum 0.9 (no Nesterov) and weight
    decay on every weight and bias, batches of ``min(batch_size, n_samples)`` rows reshuffled
    every epoch (last one partial), the cosine schedule applied after each epoch, 100 epochs,
    the last epoch's weights. The layers start from ``nn.Linear``'s initialisation drawn from
    ``random_state``, which also shuffles the batches. With ``hidden_layer_sizes=()`` it is
    exactly :class:`~imagenet_cog.LinearProbe` (same weights for the same seed).

    The paper feeds MLPs the features *without* l2 normalisation (an MLP can adapt to their
    scale); this estimator uses ``X`` as given. Features from a store extracted with
    ``normalize=True`` (the default) are already l2-normalised.

    Parameters
    ----------
    hidden_layer_sizes : tuple of int, default=(2048, 2048)
    activation : {"relu", "identity"}, default="relu"
        ``"identity"`` is the paper's MLP_NoAct.
    lr : float, default=0.1
        Initial learning rate (the low end of the paper's search range for the MLP).
    weight_decay : float, default=0.0
    epochs : int, default=100
    batch_size : int, default=1024
    momentum : float, default=0.9
    schedule : {"cosine", "constant"}, default="cosine"
    device : str or torch.device, optional
        ``None``: CUDA when available, else the CPU.
    dtype : {"float32", "float64"}, default="float32"
    memory_budget : int, optional
        Most bytes the features may take on the device; larger features stream from the host
        in chunks of whole batches, with the same result.
    random_state : int, RandomState instance or None, default=None
        Seeds the initial weights and the shuffling (a local ``torch.Generator``): two fits
        with the same int give the same model, bit for bit on the CPU.
    verbose : int, default=0

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coefs_ : list of ndarray
        ``coefs_[i]`` has shape ``(n_in, n_out)`` of layer ``i``, as in scikit-learn's
        ``MLPClassifier``. The output layer always has one unit per class (also for two
        classes) and a softmax.
    intercepts_ : list of ndarray
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` has string column names.
    n_layers_ : int
        Layers including input and output, as in ``MLPClassifier``.
    n_outputs_ : int
    out_activation_ : str
        ``"softmax"``.
    n_iter_ : int
        Epochs run.
    loss_curve_ : ndarray of shape (epochs,)
        Mean batch loss of each epoch.

    Raises
    ------
    ValueError
        From :meth:`fit`, when the training loss becomes non-finite; no model is kept.

    See Also
    --------
    imagenet_cog.analysis.mlp_probe : the paper's search over ``lr`` and ``weight_decay``.

    Examples
    --------
    >>> from sklearn.datasets import make_circles
    >>> from imagenet_cog.analysis import MLPProbe
    >>> X, y = make_circles(n_samples=200, factor=0.5, noise=0.05, random_state=0)
    >>> mlp = MLPProbe(hidden_layer_sizes=(32, 32), epochs=60, batch_size=32, device="cpu",
    ...                random_state=0).fit(X, y)
    >>> mlp.score(X, y) > 0.9  # concentric circles: no linear probe separates them
    True
    >>> [c.shape for c in mlp.coefs_]
    [(2, 32), (32, 32), (32, 2)]
    """

    _parameter_checks: ClassVar[dict[str, Param]] = {
        "lr": LR,
        "weight_decay": WEIGHT_DECAY,
        "activation": Param((str,), lambda v: v in ACTIVATIONS, "'relu' or 'identity'"),
        **SGD_PARAMS,
        "hidden_layer_sizes": HIDDEN_LAYER_SIZES,
        "dtype": DTYPE,
    }

    def __init__(
        self,
        hidden_layer_sizes=(2048, 2048),
        activation="relu",
        lr=0.1,
        weight_decay=0.0,
        epochs=PAPER_PROTOCOL.epochs,
        batch_size=PAPER_PROTOCOL.batch_size,
        momentum=PAPER_PROTOCOL.momentum,
        schedule=PAPER_PROTOCOL.schedule,
        device=None,
        dtype="float32",
        memory_budget=None,
        random_state=None,
        verbose=0,
    ):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.lr = lr
        self.weight_decay = weight_decay
        self.epochs = epochs
        self.batch_size = batch_size
        self.momentum = momentum
        self.schedule = schedule
        self.device = device
        self.dtype = dtype
        self.memory_budget = memory_budget
        self.random_state = random_state
        self.verbose = verbose

    def fit(self, X, y):
        """Train the MLP.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
            Class labels (any sortable labels).

        Returns
        -------
        self : MLPProbe

        Examples
        --------
        >>> from imagenet_cog.analysis import MLPProbe
        >>> mlp = MLPProbe(hidden_layer_sizes=(4,), epochs=3, device="cpu", random_state=0)
        >>> mlp.fit([[0.0, 1.0], [1.0, 0.0]], ["cat", "dog"]).classes_.tolist()
        ['cat', 'dog']
        """
        from .._device import placement
        from .._train.engine import DeviceData
        from .._train.search import diverged_message

        X, y = validate_data(self, X, y, dtype=(np.float64, np.float32))
        check_classification_targets(y)
        check_params(self)
        hidden = tuple(int(h) for h in self.hidden_layer_sizes)
        place = placement(self.device, self.dtype)
        classes, y_enc = encode_labels(y)
        data = DeviceData(
            X,
            y_enc,
            device=place.device,
            dtype=place.weights,
            memory_budget=self.memory_budget,
        )
        res = train_mlp(
            data,
            n_classes=len(classes),
            hidden_layer_sizes=hidden,
            activation=self.activation,
            lr=self.lr,
            weight_decay=self.weight_decay,
            seed=int_seed(self.random_state),
            epochs=self.epochs,
            batch_size=self.batch_size,
            momentum=self.momentum,
            schedule=self.schedule,
            verbose=self.verbose,
        )
        if res.diverged:
            raise ValueError(diverged_message(self.lr, self.weight_decay, res.n_epochs, MLP_HINT))
        self.coefs_ = [np.asarray(c, dtype=np.float64) for c in res.coefs]
        self.intercepts_ = [np.asarray(b, dtype=np.float64) for b in res.intercepts]
        self.classes_ = classes
        self.n_layers_ = len(hidden) + 2
        self.n_outputs_ = len(classes)
        self.out_activation_ = "softmax"
        self.loss_curve_ = res.loss_curve
        self.n_iter_ = int(self.epochs)
        return self

    def _logits(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
        return forward_numpy(self.coefs_, self.intercepts_, X, self.activation)

    def _class_scores(self, X):
        return self._logits(X)


def forward_numpy(coefs, intercepts, X, activation):
    """Logits of an MLP given as scikit-learn-shaped NumPy weights, in float64."""
    out = np.asarray(X, dtype=np.float64)
    for i, (w, b) in enumerate(zip(coefs, intercepts)):
        out = out @ w + b
        if i < len(coefs) - 1 and activation == "relu":
            np.maximum(out, 0, out=out)
    return out
