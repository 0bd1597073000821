"""The training engine behind the linear probes: many SGD fits in one pass over the features.

:func:`train_many` fits ``T`` softmax-regression configurations at once. Each has its own
learning rate, weight decay, seed and subset of rows; they share every pass over the features:

* configurations with the same seed and subset (a *group*) see the same batches, so one
  ``X_batch @ W_group`` product serves them all;
* groups are stacked into one batched matmul (``bmm``) over their gathered batches;
* a group whose epoch has fewer steps is masked for the extra steps (no update, momentum kept),
  and a configuration whose loss turns non-finite is frozen and flagged, so each trajectory is
  exactly the one a separate fit with the same seed would follow.

:class:`DeviceData` puts the features on the device once, or streams them in chunks when they
exceed a memory budget. :func:`train_lbfgs` is the full-batch L-BFGS alternative.

Nothing here is public API: :mod:`imagenet_cog.probe` wraps it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import math

import numpy as np
import torch

from .._device import default_budget, matmul_precision
from .._grid import PAPER_PROTOCOL
from .._validation import COMPILE
from . import fused as _fused
from .feed import CHUNK_BYTES, ChunkStream, EpochIndex, HostRows, as_tensor

# Elements of one block of logits (or features) outside the SGD loop (evaluation, L-BFGS):
# bounds the temporary memory.
_EVAL_BLOCK_ELEMENTS = 1 << 24


class DeviceData:
    """Features and integer labels, moved to the device once or streamed in chunks.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features), or HostRows
        NumPy array (a memory map works), torch tensor, or a
        :class:`~imagenet_cog._train.feed.HostRows` (rows of several arrays). A tensor already on
        ``device`` with ``dtype`` is used without a copy.
    y : array-like of int of shape (n_samples,)
        Class indices ``0..n_classes-1``.
    device : torch.device
        Resolved by the entry point (:func:`~imagenet_cog._device.resolve_device`): a
        CUDA device carries its index.
    dtype : torch.dtype
        Storage (and matmul) dtype of the features on the device: float32, float64 or bfloat16.
    memory_budget : int, optional
        Most bytes the features may take on the device. When ``X`` in ``dtype`` is larger, it
        stays on the host and streams: the rows a chunk of steps needs are gathered there into
        one of two reused host buffers (pinned on CUDA) and copied into one of two reused
        device buffers, each ``min(1 GiB, memory_budget / 2)``. Defaults to 60% of the CUDA
        memory free or cached by torch, and no limit on the CPU. The labels always move to
        the device.
    resident : bool, optional
        Decide instead of the budget (the memory plan of ``evaluate`` does): True uploads
        ``X``, False streams it in chunks of 1 GiB.
    """

    def __init__(self, X, y, *, device, dtype=torch.float32, memory_budget=None, resident=None):
        self.device = device = torch.device(device)
        self.dtype = dtype
        self.n, self.d = (int(s) for s in X.shape)
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        on_device = isinstance(X, torch.Tensor) and X.device == device
        if memory_budget is not None or resident is None:
            self.budget = default_budget(device) if memory_budget is None else int(memory_budget)
        else:
            self.budget = None
        if resident is None:
            resident = self.n * self.d * self.itemsize <= self.budget
        self.resident = bool(on_device or resident)
        if on_device:
            self.X = X if X.dtype == dtype else X.to(dtype=dtype)
        elif self.resident:
            self.X = (X if isinstance(X, HostRows) else HostRows([(X, None)])).upload(device, dtype)
        else:
            self.X = X if isinstance(X, HostRows) else HostRows([(X, None)])
            self._stream = ChunkStream(self.X, device, dtype, self.rows_per_chunk)
        self.y = as_tensor(y).to(device=device, dtype=torch.int64)

    @property
    def rows_per_chunk(self):
        """Rows one streamed chunk may hold."""
        chunk = CHUNK_BYTES if self.budget is None else min(CHUNK_BYTES, self.budget // 2)
        return max(1, chunk // (self.d * self.itemsize))

    def host_rows(self, idx):
        """Rows ``idx`` (NumPy int array) gathered on the host, converted, on the device.

        Streamed data returns a view of one of two reused buffers: it is valid until the
        next-but-one call.
        """
        if self.resident:
            return self.X.index_select(0, torch.from_numpy(np.asarray(idx)).to(self.device))
        return self._stream.fetch(idx)

    def iter_rows(self, idx, block):
        """Yield ``(start, rows)`` for consecutive blocks of at most ``block`` rows of ``idx``."""
        if self.resident:
            idx_dev = torch.from_numpy(idx).to(self.device)
            for start in range(0, len(idx), block):
                yield start, self.X.index_select(0, idx_dev[start : start + block])
            return
        block = min(block, self.rows_per_chunk)
        for start in range(0, len(idx), block):
            yield start, self.host_rows(idx[start : start + block])

    def iter_blocks(self, block):
        """Yield ``(start, rows)`` over all rows in order (resident: views, no copies)."""
        if self.resident:
            for start in range(0, self.n, block):
                yield start, self.X[start : start + block]
            return
        block = min(block, self.rows_per_chunk)
        for start in range(0, self.n, block):
            yield start, self.host_rows(np.arange(start, min(self.n, start + block)))


@dataclasses.dataclass
class TrainConfig:
    """One SGD configuration for :func:`train_many`.

    ``train_idx`` are rows of the training data (``None``: all of them); ``eval_idx`` are rows
    of the evaluation data whose last-epoch top-1/top-5 are wanted (``None``: no evaluation);
    ``init`` is an optional ``(coef (n_classes, n_features), intercept (n_classes,))`` start.
    """

    lr: float
    weight_decay: float = 0.0
    seed: int = 0
    train_idx: np.ndarray | None = None
    eval_idx: np.ndarray | None = None
    init: tuple | None = None


@dataclasses.dataclass
class TrainResult:
    """What :func:`train_many` returns for one configuration.

    ``coef`` is ``(n_classes, n_features)`` and ``intercept`` ``(n_classes,)``, NaN when the
    configuration diverged. ``loss_curve[e]`` is the mean of epoch ``e``'s batch losses, NaN
    after a divergence. ``n_epochs`` counts the epochs with finite loss. ``top1``/``top5`` are
    fractions on ``eval_idx`` (NaN when not evaluated or diverged); ``top_classes``, when
    asked for, the best classes of each ``eval_idx`` row, best first (int32, ``(n_eval,
    min(5, n_classes))``; None when not asked for, not evaluated or diverged).
    """

    coef: np.ndarray
    intercept: np.ndarray
    loss_curve: np.ndarray
    diverged: bool
    n_epochs: int
    top1: float = math.nan
    top5: float = math.nan
    top_classes: np.ndarray | None = None


def lr_schedule(schedule, epochs):
    """Per-epoch learning-rate factors, as the official code applies them.

    The official ``logreg.py`` trains epoch ``e`` and *then* sets the rate to
    ``lr0 · 0.5 · (1 + cos(π e / epochs))`` for the next one. So epoch 0 runs at
    ``lr0``, epoch ``e ≥ 1`` at ``lr0 · 0.5 · (1 + cos(π (e − 1) / epochs))``: epochs 0
    and 1 both run at ``lr0``, and the last epoch at ``0.5 (1 + cos(π (epochs − 2) /
    epochs))``, not the value the paper's formula (supplement B.2) gives for ``e = epochs − 1``.
    """
    e = np.arange(epochs, dtype=np.float64)
    if schedule == "cosine":
        return 0.5 * (1.0 + np.cos(np.pi * np.maximum(e - 1, 0) / epochs))
    if schedule == "constant":
        return np.ones(epochs)
    raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")


def _as_index(idx, n, what):
    idx = np.arange(n, dtype=np.int64) if idx is None else np.asarray(idx)
    if idx.ndim != 1 or not (idx.dtype.kind in "iu" or idx.size == 0):
        raise ValueError(f"{what} must be a 1-d integer array")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"{what} holds rows outside [0, {n})")
    return idx


def _group_configs(configs, n):
    """Group configurations by (seed, train subset); the order of first appearance is kept."""
    groups = []  # [seed, idx, positions]
    by_key = {}
    for pos, cfg in enumerate(configs):
        idx = _as_index(cfg.train_idx, n, "train_idx")
        if idx.size == 0:
            raise ValueError(f"configuration {pos} has an empty train_idx")
        key = (int(cfg.seed), idx.size, hashlib.blake2b(idx.tobytes(), digest_size=16).digest())
        if key in by_key:
            groups[by_key[key]][2].append(pos)
        else:
            by_key[key] = len(groups)
            groups.append([int(cfg.seed), idx, [pos]])
    return groups


def _init_weights(gen, n_classes, d, dtype):
    # torch.nn.Linear's default initialisation, which the official code used: weight then bias,
    # both uniform in +-1/sqrt(fan_in), here from the configuration's own generator.
    bound = 1.0 / math.sqrt(d)
    w = torch.empty(n_classes, d, dtype=dtype).uniform_(-bound, bound, generator=gen)
    b = torch.empty(n_classes, dtype=dtype).uniform_(-bound, bound, generator=gen)
    return w, b


# Initial weights by (seed, classes, features, dtype, device): every trial of a search starts
# from its seed's weights, so they are drawn on the host once per process (the CPU generator's
# numbers, as a separate fit draws them), uploaded once and copied into each configuration on
# the device; the generator's state after the draws goes with them, for the shuffles.
_INITIAL = collections.OrderedDict()
#: Most bytes the kept initial weights take on each device (CoG: 5 seeds of 8 MB).
INITIAL_BYTES = 256 << 20


def _initial_weights(seed, n_classes, d, dtype, device):
    """``(generator after the draws, weight (C, d), bias (C,))``, the tensors on ``device``."""
    key = (int(seed), int(n_classes), int(d), str(dtype), str(device))
    kept = _INITIAL.get(key)
    if kept is None:
        gen = torch.Generator().manual_seed(int(seed))
        w, b = _init_weights(gen, n_classes, d, dtype)
        kept = (w.to(device), b.to(device), gen.get_state())
        size = (w.numel() + b.numel()) * w.element_size()
        if size <= INITIAL_BYTES:
            _INITIAL[key] = kept
            on_device = [k for k in _INITIAL if k[4] == key[4]]
            while sum(_INITIAL[k][0].nbytes + _INITIAL[k][1].nbytes for k in on_device) > (
                INITIAL_BYTES
            ):
                del _INITIAL[on_device.pop(0)]
    else:
        _INITIAL.move_to_end(key)
    gen = torch.Generator()
    gen.set_state(kept[2])
    return gen, kept[0], kept[1]


def _start_weights(W4, b4, starts):
    """Write each configuration's initial weights (``starts[g][k]``: weight (C, d), bias (C,),
    on the device) into ``W4`` (group, feature, config, class) and ``b4``; padding slots 0."""
    for g, group in enumerate(starts):
        k = 0
        while k < len(group):  # configurations sharing their start: one copy on the device
            w, bias = group[k]
            m = 1
            while k + m < len(group) and group[k + m][0] is w and group[k + m][1] is bias:
                m += 1
            W4[g, :, k : k + m].copy_(w.T.unsqueeze(1).expand(-1, m, -1))
            b4[g, 0, k : k + m].copy_(bias.expand(m, -1))
            k += m
        W4[g, :, k:].zero_()
        b4[g, 0, k:].zero_()


def train_many(
    data,
    configs,
    *,
    n_classes,
    protocol=PAPER_PROTOCOL,
    dtype=torch.float32,
    tf32=False,
    eval_data=None,
    verbose=0,
    compile="auto",
    stats=None,
    top_classes=False,
):
    """Fit every configuration by minibatch SGD, sharing the passes over ``data``.

    The protocol of each configuration is ImageNet-CoG's: logits ``x W^T + b``, cross-entropy
    averaged over the batch, ``torch.optim.SGD`` with momentum (no Nesterov, no dampening) and
    weight decay on weight and bias, batch ``min(batch_size, len(train_idx))`` with the last
    batch partial, rows reshuffled every epoch by the configuration's seed, learning rate set
    per epoch by ``schedule``, and the last epoch's weights as the result.

    Parameters
    ----------
    data : DeviceData
        Training features and labels.
    configs : sequence of TrainConfig
    n_classes : int
    protocol : Protocol
        Its SGD settings (``epochs``, ``batch_size``, ``momentum``, ``schedule``), shared by
        all configurations; by default the paper's.
    dtype : torch.dtype
        Weights, softmax and optimizer state. When ``data.dtype`` is lower (bfloat16), the two
        matmuls run in ``data.dtype`` with float32 accumulation and everything else in
        ``dtype``.
    tf32 : bool
        Let float32 matmuls use TF32 on CUDA.
    eval_data : DeviceData, optional
        Data that ``eval_idx`` indexes; defaults to ``data``.
    verbose : int
    compile : "auto" or bool
        The fused step (:mod:`imagenet_cog._train.fused`): its elementwise work compiled with
        ``torch.compile`` and, on CUDA, each step replayed from a CUDA graph. ``"auto"``: on
        CUDA with resident features; ``True``: wherever possible (compiled on the CPU too, no
        graphs there); ``False``: the eager step. The arithmetic is the same either way. The
        fused step checks itself against the eager step as it runs; a disagreement, or a
        compile or capture that fails, warns once and training goes on in a safer way (see
        :mod:`imagenet_cog._train.fused`). The step of a shape is made, compiled, captured and
        checked by the first call and replayed by the next calls of that shape on the same
        ``data`` (:func:`imagenet_cog._train.fused.reusable`).
    stats : dict, optional
        Receives how the fit went, added to what it holds (one dict can gather several
        fits): ``"step_paths"`` counts the fits by the step that trained them (``"eager"``,
        ``"compiled+graph"``...), ``"step_check_max_diff"`` is the largest difference the
        fused step's checks saw, relative to an update (None when nothing was checked), and
        ``"step_fallbacks"`` lists what went wrong, once each.
    top_classes : bool
        Also keep each evaluated configuration's best classes on its ``eval_idx`` rows
        (:attr:`TrainResult.top_classes`).

    Returns
    -------
    list of TrainResult
        In the order of ``configs``.
    """
    configs = list(configs)
    if not configs:
        return []
    epochs, batch_size = protocol.epochs, protocol.batch_size
    momentum, schedule = protocol.momentum, protocol.schedule
    device, cdt = data.device, data.dtype
    for cfg in configs:
        if not (math.isfinite(cfg.lr) and cfg.lr >= 0):
            raise ValueError(f"lr must be finite and >= 0, got {cfg.lr!r}")
        if not (math.isfinite(cfg.weight_decay) and cfg.weight_decay >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {cfg.weight_decay!r}")
    groups = _group_configs(configs, data.n)
    # Groups in decreasing order of steps per epoch: the groups that take step s are then a
    # prefix, so a step computes nothing for the groups whose epoch is over (few-shot cells
    # next to all-data cells), and no step needs masking.
    groups.sort(key=lambda g: -math.ceil(g[1].size / min(int(batch_size), g[1].size)))
    n_groups, C, d = len(groups), int(n_classes), data.d
    K = max(len(g[2]) for g in groups)  # configurations per group; short groups are padded
    KC = K * C

    lr0 = np.zeros((n_groups, K))
    wd = np.zeros((n_groups, K))
    real = np.zeros((n_groups, K), dtype=bool)
    gens, sizes, bsz, starts = [], [], [], []
    for g, (seed, idx, positions) in enumerate(groups):
        gen, w0, b0 = _initial_weights(seed, C, d, dtype, device)
        gens.append(gen)
        sizes.append(idx.size)
        bsz.append(min(int(batch_size), idx.size))
        starts.append([])
        for k, pos in enumerate(positions):
            cfg = configs[pos]
            if cfg.init is not None:
                w0k = torch.as_tensor(np.asarray(cfg.init[0]), dtype=dtype).reshape(C, d)
                b0k = torch.as_tensor(np.asarray(cfg.init[1]), dtype=dtype).reshape(C)
                starts[g].append((w0k.to(device), b0k.to(device)))
            else:
                starts[g].append((w0, b0))
            lr0[g, k], wd[g, k], real[g, k] = cfg.lr, cfg.weight_decay, True

    steps = np.array([math.ceil(s / bs) for s, bs in zip(sizes, bsz)])
    S, Bm = int(steps.max()), max(bsz)
    # Row weights: 1/batch for real rows (the batch mean), 0 for padding rows and for the steps
    # a group does not have. They do not depend on the shuffle.
    row_w = np.zeros((S, n_groups, Bm))
    for g, (n_g, b_g) in enumerate(zip(sizes, bsz)):
        for s in range(steps[g]):
            m = min(b_g, n_g - s * b_g)
            row_w[s, g, :m] = 1.0 / m
    row_w = torch.as_tensor(row_w, dtype=dtype, device=device)

    sig = _fused.signature(dtype, cdt, K, C, momentum, tf32 and device.type == "cuda")
    mode = _step_mode(compile, device, data.resident, sig)
    # Weights live as (group, feature, config * class) so a group's logits are one matmul.
    if mode == "eager":
        W = torch.empty(n_groups, d, KC, dtype=dtype, device=device)
        b = torch.empty(n_groups, 1, KC, dtype=dtype, device=device)
        buf_W, buf_b = torch.empty_like(W), torch.empty_like(b)
        step = _Step(W, b, buf_W, buf_b, K, C, Bm, cdt, momentum)
    else:
        step = _fused.reusable(
            data,
            (mode, sig, n_groups, d, Bm, S),
            functools.partial(
                _fused_step, n_groups, d, K, C, Bm, S, cdt, momentum, data, dtype, mode, sig, tf32
            ),
        )
        step.attach(data, row_w)
        W, b, buf_W, buf_b = step.W, step.b, step.buf_W, step.buf_b
    W4, b4 = W.view(n_groups, d, K, C), b.view(n_groups, 1, K, C)
    buf_W4, buf_b4 = buf_W.view(n_groups, d, K, C), buf_b.view(n_groups, 1, K, C)
    _start_weights(W4, b4, starts)
    buf_W.zero_()
    buf_b.zero_()

    factors = lr_schedule(schedule, epochs)
    alive = real.copy()  # real configurations that have not diverged
    diverged_at = np.full((n_groups, K), -1)
    losses = torch.zeros(epochs, n_groups, K, dtype=dtype, device=device)
    use_wd = bool((wd > 0).any())

    def hyper(epoch):
        # Per-configuration (lr, wd) tensors shaped (group, 1, config, 1). A frozen
        # configuration (diverged, or a padding slot) gets lr 0 and wd 0: its weights never move.
        neg_lr = -lr0 * factors[epoch] * alive
        return tuple(
            torch.as_tensor(a, dtype=dtype).reshape(n_groups, 1, K, 1).to(device)
            for a in (neg_lr, wd * alive)
        )

    # Groups taking step s: the first active[s] (they are sorted by steps).
    active = (steps[None, :] > np.arange(S)[:, None]).sum(1)

    def again_eagerly():  # the fused step was caught doing other work than the eager one
        _fused.record(stats, None, step.max_diff, step.fallbacks)
        _fused.forget(device)  # its memory, before the fit trains again
        return train_many(
            data,
            configs,
            n_classes=n_classes,
            protocol=protocol,
            dtype=dtype,
            tf32=tf32,
            eval_data=eval_data,
            verbose=verbose,
            compile=False,
            stats=stats,
            top_classes=top_classes,
        )

    # Shuffled rows of every group, one epoch ahead in a background thread, drawn from each
    # group's generator in epoch order; the end-of-epoch sync below frees each buffer. They
    # come in the dtype of the fused step's device index (int64), else int32.
    device_index = getattr(step, "idx", None)
    index = EpochIndex(
        [g[1] for g in groups],
        gens,
        sizes,
        steps,
        bsz,
        data.n,
        epochs,
        pin=device.type == "cuda",
        dtype=None if device_index is None else device_index.dtype,
    )
    with matmul_precision(device, tf32), contextlib.closing(index):
        for epoch in range(epochs):
            idx = index.next()
            loss_e = losses[epoch]
            neg_lr, wd_t = hyper(epoch)
            if mode == "eager":
                idx_dev = _upload_index(idx, device) if data.resident else None
                batches = _batches(data, idx, idx_dev, active, step.x_out)
                for s, (n_on, xb, y_s) in enumerate(batches):
                    step(n_on, xb, y_s, row_w[s, :n_on], loss_e, neg_lr, wd_t, use_wd)
            else:
                step.run_epoch(idx, active, loss_e, neg_lr, wd_t, use_wd)
            loss_e.div_(torch.as_tensor(steps, dtype=dtype, device=device).view(n_groups, 1))
            finite = torch.isfinite(loss_e) & torch.isfinite(W4).all(3).all(1)
            finite &= torch.isfinite(b4).all(3).all(1)
            bad = alive & ~finite.cpu().numpy()
            if mode != "eager" and not step.epoch_ok():  # after the sync above: no wait
                return again_eagerly()
            if bad.any():
                diverged_at[bad] = epoch
                alive &= ~bad
                # Zero the frozen weights so no NaN travels through later matmuls.
                frozen = torch.as_tensor(bad, device=device).view(n_groups, 1, K, 1)
                for t in (W4, b4, buf_W4, buf_b4):
                    t.masked_fill_(frozen, 0.0)
            if verbose:
                shown = loss_e.cpu().numpy()[real & alive]
                lo, hi = (shown.min(), shown.max()) if shown.size else (math.nan, math.nan)
                print(
                    f"epoch {epoch + 1}/{epochs}: loss {lo:.4f}..{hi:.4f}, "
                    f"{int(alive.sum())}/{int(real.sum())} configurations alive"
                )

        top = _evaluate(
            configs, groups, W4, b4, alive, eval_data or data, C, cdt, dtype, top_classes
        )
    if mode == "eager":
        _fused.record(stats, "eager")
    else:
        _fused.record(stats, step.path, step.max_diff, step.fallbacks)

    losses = losses.cpu().numpy()
    W_np, b_np = W4.cpu().numpy(), b4.cpu().numpy()
    results = [None] * len(configs)
    for g, (_, _, positions) in enumerate(groups):
        for k, pos in enumerate(positions):
            curve = losses[:, g, k].copy()
            if diverged_at[g, k] >= 0:
                coef = np.full((C, d), np.nan, dtype=W_np.dtype)
                intercept = np.full(C, np.nan, dtype=W_np.dtype)
                curve[diverged_at[g, k] + 1 :] = np.nan
                n_ep = int(diverged_at[g, k])
            else:
                coef, intercept = W_np[g, :, k, :].T.copy(), b_np[g, 0, k, :].copy()
                n_ep = epochs
            top1, top5, best = top.get(pos, (math.nan, math.nan, None))
            results[pos] = TrainResult(
                coef=coef,
                intercept=intercept,
                loss_curve=curve,
                diverged=bool(diverged_at[g, k] >= 0),
                n_epochs=n_ep,
                top1=top1,
                top5=top5,
                top_classes=best,
            )
    return results


def _fused_step(n_groups, d, K, C, Bm, S, cdt, momentum, data, dtype, mode, sig, tf32):
    """A new :class:`~imagenet_cog._train.fused.FusedStep` with its own weights and buffers."""
    device = data.device
    W = torch.empty(n_groups, d, K * C, dtype=dtype, device=device)
    b = torch.empty(n_groups, 1, K * C, dtype=dtype, device=device)
    return _fused.FusedStep(
        W,
        b,
        torch.empty_like(W),
        torch.empty_like(b),
        K,
        C,
        Bm,
        S,
        cdt,
        momentum,
        data,
        torch.empty(S, n_groups, Bm, dtype=dtype, device=device),
        mode,
        eager=functools.partial(_Step, K=K, C=C, Bm=Bm, cdt=cdt, momentum=momentum),
        sig=sig,
        tf32=tf32,
    )


def _exp_logits(z, y_idx, out):
    """``exp(z - max)`` into ``out``; returns (cross-entropy, sum of exp), both ``(..., 1)``.

    The gradient of the cross-entropy w.r.t. ``z`` is then ``out / sum - onehot``. Written out
    because torch's CPU ``log_softmax`` is very slow over a short last dimension (few classes).
    """
    top = z.amax(-1, keepdim=True)
    z_y = z.gather(-1, y_idx)
    torch.sub(z, top, out=out).exp_()
    total = out.sum(-1, keepdim=True)
    return total.log() + top - z_y, total


def _upload_index(idx, device):
    idx = torch.from_numpy(idx)
    if device.type == "cuda":  # a pageable copy would wait for the device to drain
        # No copy when idx lies in pinned memory already (EpochIndex's buffers).
        return idx.pin_memory().to(device, non_blocking=True)
    return idx.to(device)


_STEP_MODES = ("eager", "fused", "compiled", "graph")
_forced = []  # the modes of the forced_step blocks we are in, innermost last


@contextlib.contextmanager
def forced_step(mode):
    """Inside the block, :func:`train_many` trains with the step ``mode`` ("fused",
    "compiled" or "graph") wherever ``compile`` is not False.

    A kind of step caught disagreeing with the eager one still trains eagerly, as always. The
    self-test runs the fused step's plumbing on the CPU (uncompiled) this way.
    """
    if mode not in _STEP_MODES:
        raise ValueError(f"unknown step mode {mode!r}")
    _forced.append(mode)
    try:
        yield
    finally:
        _forced.pop()


def _step_mode(compile, device, resident, sig=None):
    """Which step :func:`train_many` runs: "eager", "fused", "compiled" or "graph".

    A kind of step (``sig``, :func:`imagenet_cog._train.fused.signature`) whose fused step
    disagreed with the eager one earlier in this process runs eagerly.
    """
    check_compile(compile)
    if compile is False:
        mode = "eager"
    elif _forced:
        mode = _forced[-1]
    elif not resident:  # streamed features: the host gathers each chunk
        mode = "eager"
    elif device.type == "cuda":
        mode = "graph"
    else:
        mode = "compiled" if compile is True else "eager"
    if mode != "eager" and _fused.distrusted(device.type, sig):
        return "eager"
    return mode


def check_compile(compile):
    """Refuse a ``compile`` setting other than "auto", True or False, in one line: the one
    constraint the estimators' parameter tables use too (``_validation.COMPILE``)."""
    COMPILE.check("compile", compile)


class _Step:
    """One SGD step of the groups that take it, in preallocated buffers (the eager path).

    Reusing the buffers matters on the CPU, where a fresh multi-megabyte temporary per step
    costs page faults. The weight gradient goes straight into the momentum buffer
    (``buf = momentum * buf + X^T G`` as one matmul), which saves a pass over the weight-sized
    tensors: with a thousand classes, those passes, not the matmuls, bound a GPU step. The
    groups that take a step are a prefix of the group axis, so every tensor here is sliced
    ``[:n_on]`` (a contiguous view).
    """

    def __init__(self, W, b, buf_W, buf_b, K, C, Bm, cdt, momentum):
        self.W, self.b, self.buf_W, self.buf_b = W, b, buf_W, buf_b
        n_groups, d, KC = W.shape
        self.K, self.C, self.Bm, self.d = K, C, Bm, d
        self.momentum = float(momentum)
        dtype, device = W.dtype, W.device
        self.z = torch.empty(n_groups, Bm, KC, dtype=dtype, device=device)
        self.e = torch.empty_like(self.z)
        self.g_b = torch.empty_like(b)
        self.x_out = torch.empty(n_groups * Bm, d, dtype=cdt, device=device)
        self.low = cdt != dtype  # mixed precision: the two matmuls run in the feature dtype
        if self.low:
            self.W_low = torch.empty(W.shape, dtype=cdt, device=device)
            self.z_low = torch.empty(self.z.shape, dtype=cdt, device=device)
            self.g_W_low = torch.empty(W.shape, dtype=cdt, device=device)

    def __call__(self, n, xb, y_s, w_s, loss_e, neg_lr, wd_t, use_wd):
        K, C, Bm, d = self.K, self.C, self.Bm, self.d
        shape4, shape_W, shape_b = (n, Bm, K, C), (n, d, K, C), (n, 1, K, C)
        W, b, buf_W, buf_b = self.W[:n], self.b[:n], self.buf_W[:n], self.buf_b[:n]
        z, e, g_b = self.z[:n], self.e[:n], self.g_b[:n]
        y4 = y_s.view(n, Bm, 1, 1).expand(n, Bm, K, 1)
        if self.low:
            W_low, z_low = self.W_low[:n], self.z_low[:n]
            W_low.copy_(W)
            torch.bmm(xb, W_low, out=z_low)
            torch.add(z_low, b, out=z)
        else:
            torch.baddbmm(b, xb, W, out=z)
        e4 = e.view(shape4)
        nll, total = _exp_logits(z.view(shape4), y4, e4)
        loss_e[:n].view(n, 1, K).baddbmm_(w_s.unsqueeze(1), nll.view(n, Bm, K))
        # d(batch-mean loss)/d logits = (softmax - onehot) * w, w = 1/batch (0 for padding).
        w4 = w_s.view(n, Bm, 1, 1)
        e4.mul_(w4 / total)
        e4.scatter_add_(3, y4, w4.neg().expand(y4.shape))
        torch.sum(e, 1, keepdim=True, out=g_b)
        # torch.optim.SGD: buf = momentum * buf + (grad + wd * p); p -= lr * buf.
        xT = xb.transpose(1, 2)
        m = self.momentum
        if self.low:
            self.z_low[:n].copy_(e)
            g_W_low = self.g_W_low[:n]
            torch.bmm(xT, self.z_low[:n], out=g_W_low)
            torch.add(g_W_low, buf_W, alpha=m, out=buf_W)
        else:
            buf_W.baddbmm_(xT, e, beta=m)
        torch.add(g_b, buf_b, alpha=m, out=buf_b)
        buf_W4, buf_b4 = buf_W.view(shape_W), buf_b.view(shape_b)
        W4, b4 = W.view(shape_W), b.view(shape_b)
        neg_lr, wd_t = neg_lr[:n], wd_t[:n]
        if use_wd:
            buf_W4.addcmul_(W4, wd_t)
            buf_b4.addcmul_(b4, wd_t)
        W4.addcmul_(buf_W4, neg_lr)
        b4.addcmul_(buf_b4, neg_lr)


def _batches(data, idx, idx_dev, active, out):
    """Yield each step's ``(groups on, (group, row, feature) batch, (group, row) labels)``.

    Only the groups that take the step (a prefix of ``active[s]`` groups) are gathered.
    """
    S, _, Bm = idx.shape
    if data.resident:
        for s in range(S):
            n = int(active[s])
            rows = idx_dev[s, :n].reshape(-1)
            xb = torch.index_select(data.X, 0, rows, out=out[: n * Bm])
            yield n, xb.view(n, Bm, data.d), data.y[rows].view(n, Bm)
        return
    per_row = data.rows_per_chunk
    s0 = 0
    while s0 < S:
        # As many steps as fit in one chunk (at least one).
        s1, rows = s0 + 1, int(active[s0]) * Bm
        while s1 < S and rows + int(active[s1]) * Bm <= per_row:
            rows += int(active[s1]) * Bm
            s1 += 1
        flat = np.concatenate([idx[s, : active[s]].reshape(-1) for s in range(s0, s1)])
        chunk = data.host_rows(flat)
        labels = data.y[_upload_index(flat, data.device)]
        start = 0
        for s in range(s0, s1):
            n = int(active[s])
            stop = start + n * Bm
            yield n, chunk[start:stop].view(n, Bm, data.d), labels[start:stop].view(n, Bm)
            start = stop
        s0 = s1


def best_classes(z, k=5):
    """Indices of the ``k`` largest logits along the last axis (all of them when fewer), best
    first: the one top-k of the probes' accuracies and saved predictions."""
    return z.topk(min(k, z.shape[-1]), dim=-1).indices


def _evaluate(configs, groups, W4, b4, alive, eval_data, C, cdt, dtype, keep=False):
    """Top-1 and top-5 accuracy of each configuration with an ``eval_idx``, on the device,
    and, with ``keep``, its best classes on each row (else None)."""
    where = {}
    for g, (_, _, positions) in enumerate(groups):
        for k, pos in enumerate(positions):
            where[pos] = (g, k)
    sets = {}  # eval set -> positions, so configurations sharing one share the matmul
    for pos, cfg in enumerate(configs):
        if cfg.eval_idx is None:
            continue
        idx = _as_index(cfg.eval_idx, eval_data.n, "eval_idx")
        key = hashlib.blake2b(idx.tobytes(), digest_size=16).digest()
        sets.setdefault(key, (idx, []))[1].append(pos)
    out = {}
    k_top = min(5, C)
    for idx, positions in sets.values():
        live = [p for p in positions if alive[where[p]]]
        for p in positions:
            if p not in live or idx.size == 0:
                out[p] = (math.nan, math.nan, None)
        if not live or idx.size == 0:
            continue
        Wsel = torch.cat([W4[where[p][0], :, where[p][1], :] for p in live], dim=1)
        bsel = torch.cat([b4[where[p][0], 0, where[p][1], :] for p in live])
        Wc = Wsel.to(cdt)
        hits1 = torch.zeros(len(live), dtype=torch.int64, device=W4.device)
        hits5 = torch.zeros_like(hits1)
        kept = np.empty((len(live), idx.size, k_top), dtype=np.int32) if keep else None
        block = max(1, _EVAL_BLOCK_ELEMENTS // (len(live) * C))
        for start, xb in eval_data.iter_rows(idx, block):
            z = (xb @ Wc).to(dtype).add_(bsel).view(xb.shape[0], len(live), C)
            yb = eval_data.y[torch.from_numpy(idx[start : start + xb.shape[0]]).to(W4.device)]
            topk = best_classes(z, k_top)
            match = topk == yb.view(-1, 1, 1)
            hits1 += match[:, :, 0].sum(0)
            hits5 += match.any(2).sum(0)
            if keep:
                kept[:, start : start + xb.shape[0]] = topk.cpu().numpy().transpose(1, 0, 2)
        for i, (p, h1, h5) in enumerate(zip(live, hits1.cpu().tolist(), hits5.cpu().tolist())):
            out[p] = (h1 / idx.size, h5 / idx.size, kept[i] if keep else None)
    return out


def train_lbfgs(
    data,
    *,
    n_classes,
    weight_decay=0.0,
    max_iter=100,
    tol=1e-4,
    dtype=torch.float32,
    tf32=False,
    init=None,
    history_size=10,
):
    """Full-batch L-BFGS on ``mean cross-entropy + weight_decay/2 * ||W||^2``.

    The bias is not penalised, so the minimiser is that of scikit-learn's
    ``LogisticRegression(C=1 / (weight_decay * n_samples))``. The loss and its gradient are
    computed by torch on the features' device, accumulated over row blocks (streamed when
    ``data`` is not resident), so the logits never take more than a block's memory. The
    optimiser is SciPy's L-BFGS-B, the one scikit-learn drives, with scikit-learn's settings
    (``gtol=tol``, ``ftol=64·eps``, 50 line-search steps): it needs about a third fewer
    function evaluations than ``torch.optim.LBFGS`` with a strong-Wolfe search, and only the
    parameter vector crosses between host and device.

    Returns
    -------
    coef, intercept, loss_curve, n_iter, converged
        ``loss_curve`` holds the objective at each function evaluation.
    """
    from scipy.optimize import minimize

    C, d, n = int(n_classes), data.d, data.n
    device = data.device
    # bfloat16 features: the two matrix products run in bfloat16 (float32 accumulation);
    # the weights, logits, softmax and gradient sums stay in ``dtype``.
    mixed = data.dtype == torch.bfloat16 and dtype != torch.bfloat16
    if data.dtype != dtype and not mixed:
        raise ValueError(f"L-BFGS needs features in {dtype} or bfloat16, got {data.dtype}")
    theta = torch.zeros(C * d + C, dtype=dtype, device=device)
    if init is not None:
        theta[: C * d] = torch.as_tensor(np.asarray(init[0]), dtype=dtype).reshape(-1)
        theta[C * d :] = torch.as_tensor(np.asarray(init[1]), dtype=dtype).reshape(-1)
    W, b = theta[: C * d].view(C, d), theta[C * d :]
    grad = torch.zeros_like(theta)
    gW, gb = grad[: C * d].view(C, d), grad[C * d :]
    block = min(n, max(1, _EVAL_BLOCK_ELEMENTS // max(C, d)))
    z_buf = torch.empty(block, C, dtype=dtype, device=device)
    e_buf = torch.empty_like(z_buf)
    neg = torch.full((block, 1), -1.0 / n, dtype=dtype, device=device)
    if mixed:
        low = torch.bfloat16
        W_low = torch.empty(C, d, dtype=low, device=device)
        z_low = torch.empty(block, C, dtype=low, device=device)
        g_low = torch.empty(block, C, dtype=low, device=device)
        gW_low = torch.empty(C, d, dtype=low, device=device)
    curve = []

    def loss_and_grad(params):
        theta.copy_(torch.from_numpy(params))
        gW.zero_()
        gb.zero_()
        if mixed:
            W_low.copy_(W)
        loss = torch.zeros((), dtype=torch.float64, device=device)
        for start, xb in data.iter_blocks(block):
            m = xb.shape[0]
            yb = data.y[start : start + m, None]
            if mixed:
                z = z_buf[:m].copy_(torch.mm(xb, W_low.T, out=z_low[:m])).add_(b)
            else:
                z = torch.addmm(b, xb, W.T, out=z_buf[:m])
            nll, total = _exp_logits(z, yb, e_buf[:m])
            loss += nll.sum(dtype=torch.float64)
            g = e_buf[:m].mul_(total.mul_(n).reciprocal_())  # d(mean loss)/d logits
            g.scatter_add_(1, yb, neg[:m])
            if mixed:
                gW.add_(torch.mm(g_low[:m].copy_(g).T, xb, out=gW_low))
            else:
                gW.addmm_(g.T, xb)
            gb.add_(g.sum(0))
        loss /= n
        if weight_decay:
            loss += 0.5 * weight_decay * W.double().pow(2).sum()
            gW.add_(W, alpha=weight_decay)
        value = float(loss)
        curve.append(value)
        if not math.isfinite(value):
            raise _NonFinite
        return value, grad.double().cpu().numpy()

    start = theta.double().cpu().numpy()
    converged = False
    n_iter = 1
    with matmul_precision(device, tf32), _other_blas_single_threaded():
        try:
            res = minimize(
                loss_and_grad,
                start,
                jac=True,
                method="L-BFGS-B",
                options={
                    "maxiter": int(max_iter),
                    "maxcor": int(history_size),
                    "gtol": float(tol),
                    "ftol": 64 * np.finfo(float).eps,
                    "maxls": 50,
                },
            )
        except _NonFinite:
            theta.fill_(math.nan)
        else:
            theta.copy_(torch.from_numpy(res.x))  # the final point, not a line-search probe
            n_iter = max(1, int(res.nit))
            converged = bool(res.success) and math.isfinite(curve[-1])
    return (
        W.detach().cpu().numpy().copy(),
        b.detach().cpu().numpy().copy(),
        np.asarray(curve),
        n_iter,
        converged,
    )


def _other_blas_single_threaded():
    """Keep the BLAS libraries other than torch's on one thread.

    Between two loss evaluations, L-BFGS-B's small vector operations run in SciPy's
    OpenBLAS, whose idle threads spin and take the cores torch's matrix products need:
    measured here, this almost doubled the time of each evaluation.
    """
    import os

    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController()
    torch_dir = os.path.dirname(torch.__file__)
    others = [
        lib.filepath
        for lib in controller.lib_controllers
        if lib.user_api == "blas" and not lib.filepath.startswith(torch_dir)
    ]
    if not others:
        return contextlib.nullcontext()
    return controller.select(filepath=others).limit(limits=1)


class _NonFinite(Exception):
    """The objective became NaN or infinite during L-BFGS."""
