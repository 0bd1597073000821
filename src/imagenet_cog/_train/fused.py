"""The fused SGD step of :func:`imagenet_cog._train.engine.train_many`, for the GPU, checked as it runs.

The eager step launches dozens of small kernels per step; with a thousand classes the GPU then
waits on launches and on separate elementwise passes over the weight-sized tensors. This step:

* reads everything a step needs from device tensors: the epoch's row indices (uploaded once
  per epoch), a step counter advanced on the device, the per-epoch learning rates and weight
  decays, so a step needs no host work;
* does the elementwise work in two functions, :func:`grad_logits` (softmax, cross-entropy,
  its gradient, the bias gradient) and :func:`sgd_update` (momentum, weight decay, update,
  the bfloat16 copy of the weights), which ``torch.compile`` fuses into a few kernels;
* on CUDA, captures each step in a CUDA graph (one per number of groups taking the step) and
  replays it, everything on the weights' device.

The arithmetic is the eager step's (the official protocol's); only the rounding of fused
operations differs. Nothing here is taken on trust:

* the first two runs of each variant of the step (each number of groups; compiled or not),
  or its run before the capture and the graph's first replay, are compared with the eager
  step on copies of the weights and momentum buffers (:data:`CHECK_TOLERANCE`), and the
  device's step counter must have moved by one;
* at the end of every epoch the step counter must equal the number of steps taken
  (:meth:`FusedStep.epoch_ok`); if not, ``train_many`` trains the fit again, eagerly;
* a step that fails half-way, or disagrees with the eager one, leaves the weights as the eager
  step would have, so no update is lost or applied twice.

A disagreement warns once, and the fit goes on with the eager step, as do later fits of the
same kind (:func:`signature`) in the process. A failed compile or capture warns once per kind
and device type and is not tried again in the process: the step then runs uncompiled, or
without graphs, still checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import types
import warnings
import weakref

import torch

#: Differences of an entry up to this many units in the last place of its value are rounding
#: (the two steps round their sums in other orders), whatever the size of the update.
ROUNDING_ULPS = 8
#: Largest difference the check accepts between the fused and the eager step, beyond
#: rounding, per configuration, as a fraction of the size of that configuration's update (the
#: largest change of its weights, bias or loss in the step; for the momentum buffers, their
#: largest entry, the direction the weights move in). An empty graph, a stale buffer or a
#: wrong kernel differs by about the whole update (1); the rounding of the fused functions
#: stays far below (measured figures in docs/guide/protocol.rst).
CHECK_TOLERANCE = 1e-3
#: The same with bfloat16 features or TF32 matrix products: 5 units of bfloat16 (5/256). A
#: gradient entry whose float32 value lies within rounding of a bfloat16 boundary can round
#: one bfloat16 unit apart in the two steps, and such a flip travels into the update.
CHECK_TOLERANCE_LOW = 5 * 2.0**-8


def grad_logits(z, b, y, w, loss, K: int, C: int):
    """Gradient of the batch-mean cross-entropy w.r.t. the logits, and of the bias.

    ``z`` (groups, rows, K*C) are the products ``x W`` (in the feature dtype), ``b`` (groups,
    1, K*C) the bias, ``y`` (groups, rows) the labels, ``w`` (groups, rows) the row weights
    (1/batch, 0 for padding). Adds each configuration's weighted loss to ``loss`` (groups, K).
    """
    n, Bm, KC = z.shape
    z = (z.to(b.dtype) + b).view(n, Bm, K, C)
    top = z.amax(-1, keepdim=True)
    e = (z - top).exp()
    total = e.sum(-1, keepdim=True)
    y4 = y.view(n, Bm, 1, 1)
    nll = total.log() + top - z.gather(-1, y4.expand(n, Bm, K, 1))
    wv = w.view(n, Bm, 1, 1).to(z.dtype)
    loss.add_((nll * wv).sum(1).view(n, K))
    g = e * (wv / total)
    g = torch.where(torch.arange(C, device=z.device) == y4, g - wv, g).view(n, Bm, KC)
    return g, g.sum(1, keepdim=True)


def sgd_update(W, buf_W, g_W, b, buf_b, g_b, wd, neg_lr, momentum: float, W_low=None):
    """``torch.optim.SGD``'s step in place: ``buf = m buf + g + wd p; p -= lr buf``.

    ``W``/``buf_W``/``g_W`` are (groups, features, K*C), ``b``/``buf_b``/``g_b`` (groups, 1,
    K*C); ``wd`` and ``neg_lr`` (groups, 1, K, 1). ``W_low`` receives ``W`` in the feature dtype.
    ``g_W=None``: ``buf_W`` already holds ``m buf + g`` (the step accumulated the weight
    gradient into it, as the eager step does).
    """
    n, _, KC = W.shape
    K = wd.shape[2]
    for p, buf, g in ((W, buf_W, g_W), (b, buf_b, g_b)):
        shape = (n, p.shape[1], K, KC // K)
        p4, buf4 = p.view(shape), buf.view(shape)
        # In place, as the eager step: no weight-sized temporary, even uncompiled.
        if g is not None:
            buf4.mul_(momentum).add_(g.view(shape))
        buf4.addcmul_(p4, wd)
        p4.addcmul_(buf4, neg_lr)
    if W_low is not None:
        W_low.copy_(W)


def signature(dtype, feature_dtype, K, C, momentum, tf32):
    """What the compiled step depends on besides its sizes; failures are remembered by it."""
    return (str(dtype), str(feature_dtype), int(K), int(C), float(momentum), bool(tf32))


def _describe(sig):
    dtype, fdt, K, C, momentum, tf32 = sig
    return (
        f"{dtype.removeprefix('torch.')} weights, {fdt.removeprefix('torch.')} features"
        f"{', TF32' if tf32 else ''}, {K} configuration(s) x {C} classes, momentum {momentum:g}"
    )


# The step last made on each device, kept for the next train_many call of the same shape on the
# same data (see reusable): device -> _Kept.
_STEPS = {}
# What failed in this process: (stage, device type, signature) -> the warning given. A stage
# that failed is not tried again for that kind of step, and each failure warns once.
_FAILED = {}
# One compiled copy of each function per (device type, signature), see _compiled.
_COMPILED = {}


def distrusted(device_type, sig):
    """Whether the fused step of this kind disagreed with the eager one in this process."""
    return ("check", device_type, sig) in _FAILED


def _remember(stage, device_type, sig, message):
    key = (stage, device_type, sig)
    if key not in _FAILED:
        _FAILED[key] = message
        warnings.warn(message, RuntimeWarning, stacklevel=5)


def _cause(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class CompileError(RuntimeError):
    """A compiled function of the step failed (to compile, or when its compiled code ran)."""


@contextlib.contextmanager
def _torch_deprecations_ignored():
    """torch.compile's own machinery warns of its deprecations while it loads and compiles
    (torch 2.11 imports ``torch.utils.mkldnn``, which uses the deprecated
    ``torch.jit.script_method``): not a failure of the step, even under ``-W error``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


class _Compiled:
    def __init__(self, fn):
        self.fn = fn
        config = torch._dynamo.config
        # Dynamo's recompile limit: an error here, not a silent switch to uncompiled code.
        self.limit_as_error = (
            {"fail_on_recompile_limit_hit": True}
            if hasattr(config, "fail_on_recompile_limit_hit")
            else {}
        )

    def __call__(self, *args):
        try:
            with torch._dynamo.config.patch(**self.limit_as_error), _torch_deprecations_ignored():
                return self.fn(*args)
        except Exception as exc:
            if type(exc).__name__ == "FailOnRecompileLimitHit":
                config = torch._dynamo.config
                limit = getattr(config, "recompile_limit", None) or config.cache_size_limit
                raise CompileError(
                    f"torch.compile reached dynamo's recompile limit ({limit}) for this step"
                ) from exc
            raise CompileError(_cause(exc)) from exc


def _compiled(fn, device_type, sig):
    """``torch.compile`` of a copy of ``fn`` made for one signature.

    Dynamo keeps its compiled variants, and counts recompilations against its limit (8), per
    code object. A copy of the function per signature (dtypes, configurations, classes...)
    holds only that signature's variants: static sizes, then dynamic ones, however many dtypes
    and problem sizes one process mixes.
    """
    key = (fn.__name__, device_type, sig)
    if key not in _COMPILED:
        name = f"{fn.__name__}_{len(_COMPILED)}"
        renamed = {"co_name": name}
        if sys.version_info >= (3, 11):
            renamed["co_qualname"] = name
        code = fn.__code__.replace(**renamed)
        copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
        with _torch_deprecations_ignored():
            _COMPILED[key] = _Compiled(torch.compile(copy, dynamic=None))
    return _COMPILED[key]


def _cuda_index(device):
    """The CUDA device index of ``device``; None for other devices (tests simulate CUDA here)."""
    return device.index if device.type == "cuda" else None


def record(stats, path, max_diff=None, fallbacks=()):
    """Add one fit to ``stats``: the step that trained it, the checks' largest difference."""
    if stats is None:
        return
    paths = stats.setdefault("step_paths", {})
    if path is not None:
        paths[path] = paths.get(path, 0) + 1
    old = stats.get("step_check_max_diff")
    if max_diff is not None:
        stats["step_check_max_diff"] = max_diff if old is None else max(old, max_diff)
    else:
        stats.setdefault("step_check_max_diff", None)
    seen = stats.setdefault("step_fallbacks", [])
    seen.extend(f for f in fallbacks if f not in seen)


@dataclasses.dataclass(eq=False)
class _Kept:
    key: tuple
    X: weakref.ref
    y: weakref.ref
    step: FusedStep


def reusable(data, key, make):
    """The fused step of shape ``key`` on ``data``: the one an earlier call made, or ``make()``.

    A step holds everything its compiled functions and CUDA graphs read (weights, momentum,
    the epoch's indices, the hyper-parameters), so a later :func:`train_many` call of the same
    shape (``key``: groups, configurations, classes, batch, steps, dtypes, mode, signature) on
    the same features replays what the first one compiled, captured and checked. One step is
    kept per device, the last one made (a fit of another shape or other data replaces it, its
    memory freed before the new one is allocated, so memory stays what one call needs), and it
    holds no reference to the features: it is forgotten when they are freed.
    """
    where = str(data.device)
    kept = _STEPS.get(where)
    if (
        kept is not None
        and kept.key == key
        and kept.X() is data.X
        and kept.y() is data.y
        and kept.step.eager_step is None
    ):
        return kept.step
    forget(where)
    step = make()

    def gone(_, where=where, step=step):
        if where in _STEPS and _STEPS[where].step is step:
            del _STEPS[where]

    _STEPS[where] = _Kept(key, weakref.ref(data.X, gone), weakref.ref(data.y, gone), step)
    return step


def forget(where=None):
    """Drop the step kept for device ``where`` (``str`` of the device; None: every device)."""
    if where is None:
        _STEPS.clear()
    else:
        _STEPS.pop(str(where), None)


class FusedStep:
    """Every step of one epoch from device-side indices, optionally compiled and graph-replayed.

    ``mode`` is ``"fused"`` (the two functions uncompiled: the same plumbing, for tests),
    ``"compiled"`` or ``"graph"`` (compiled, and on CUDA each step captured in a CUDA graph).
    ``eager(W, b, buf_W, buf_b)`` makes the eager step on those tensors: the reference of the
    checks, and the step the fit goes on with when the fused one is given up. ``sig`` is the
    step's :func:`signature`. :attr:`path`, :attr:`max_diff` and :attr:`fallbacks` say how the
    fit went. A step serves several fits (:func:`reusable`), each started by :meth:`attach`;
    what it compiled, captured and checked stays.
    """

    def __init__(
        self,
        W,
        b,
        buf_W,
        buf_b,
        K,
        C,
        Bm,
        S,
        cdt,
        momentum,
        data,
        row_w,
        mode,
        *,
        eager,
        sig,
        tf32=False,
    ):
        self.W, self.b, self.buf_W, self.buf_b = W, b, buf_W, buf_b
        self.K, self.C, self.Bm, self.momentum = K, C, Bm, float(momentum)
        self._data = weakref.ref(data.X), weakref.ref(data.y)
        self.row_w = row_w
        device = W.device
        n_groups = W.shape[0]
        self.low = cdt != W.dtype
        self.W_low = torch.empty(W.shape, dtype=cdt, device=device) if self.low else None
        self.idx = torch.zeros(S, n_groups, Bm, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.neg_lr = torch.zeros(n_groups, 1, K, 1, dtype=W.dtype, device=device)
        self.wd = torch.zeros_like(self.neg_lr)
        self.loss = torch.zeros(n_groups, K, dtype=W.dtype, device=device)
        self.use_wd = True
        self.make_eager, self.sig, self.device_type = eager, sig, device.type
        low_precision = cdt == torch.bfloat16 or (tf32 and device.type == "cuda")
        self.tolerance = CHECK_TOLERANCE_LOW if low_precision else CHECK_TOLERANCE
        self.verified = {}  # (kind, groups) -> checks passed
        self.eager_step = None  # the eager step, once the fused one is given up
        self.max_diff = None  # largest difference the checks saw
        self.fallbacks = []  # what went wrong, one line each
        self.steps = 0  # steps of the last epoch
        self.grad, self.update = grad_logits, sgd_update
        self.compiled = False
        if mode in ("compiled", "graph") and ("compile", device.type, sig) not in _FAILED:
            try:
                self.grad = _compiled(grad_logits, device.type, sig)
                self.update = _compiled(sgd_update, device.type, sig)
                self.compiled = True
            except Exception as exc:  # noqa: BLE001 - torch.compile itself refused
                self._uncompiled(exc)
        self.cuda = _cuda_index(device)
        self.graph = mode == "graph" and self.cuda is not None
        self.graph = self.graph and ("capture", device.type, sig) not in _FAILED
        self.graphs, self.pool, self.stream = {}, None, None

    @property
    def path(self):
        """The step that trained: "eager", "fused", "compiled", with "+graph" when replayed."""
        if self.eager_step is not None:
            return "eager"
        return ("compiled" if self.compiled else "fused") + ("+graph" if self.graph else "")

    def attach(self, data, row_w):
        """Start a fit on ``data`` (the features the step was made for) with its row weights.

        :attr:`max_diff` and :attr:`fallbacks` go on: they say what the checks of the step
        that trains the fit saw, and what went wrong with it, whichever fit that was in.
        """
        self._data = weakref.ref(data.X), weakref.ref(data.y)
        self.row_w.copy_(row_w)

    # The features and labels, held weakly: a kept step does not keep them alive (its graphs
    # hold their addresses, replayed only on the same tensors, see reusable).
    @property
    def X(self):
        return self._data[0]()

    @property
    def y(self):
        return self._data[1]()

    def _on_device(self):
        # Streams, graphs and their memory pool follow the *current* device, not the tensors'.
        return torch.cuda.device(self.cuda) if self.cuda is not None else contextlib.nullcontext()

    def run_epoch(self, idx, active, loss_e, neg_lr, wd_t, use_wd):
        """Train one epoch: ``idx`` (step, group, row) host rows; ``loss_e`` receives the sums."""
        self.use_wd = use_wd
        with self._on_device():
            rows = torch.from_numpy(idx)
            if self.idx.device.type == "cuda":
                rows = rows.pin_memory()
            self.idx.copy_(rows, non_blocking=True)
            self.neg_lr.copy_(neg_lr)
            self.wd.copy_(wd_t)
            self.counter.zero_()
            self.loss.zero_()
            if self.low:  # the weights may have changed outside the step (frozen, zeroed)
                self.W_low.copy_(self.W)
            for s, n in enumerate(active.tolist()):
                self._step(s, int(n))
            loss_e.add_(self.loss)
        self.steps = len(active)

    def epoch_ok(self):
        """Whether the device's step counter equals the steps of the epoch (reads it: a sync)."""
        ran = int(self.counter)
        if ran == self.steps:
            return True
        message = (
            f"the {self.path} SGD step ran {ran} of the epoch's {self.steps} steps on the "
            "device (an empty CUDA graph, or one replaying stale work); this fit trains "
            "again with the eager step, as will later ones of its kind "
            f"({_describe(self.sig)}) in this process"
        )
        self.fallbacks.append(message)
        _remember("check", self.device_type, self.sig, message)
        self.graphs.clear()  # their memory, before the fit trains again
        return False

    # ---------------------------------------------------------------- steps
    def _step(self, s, n):
        if self.eager_step is not None:
            self._eager(s, n)
        elif not self.graph:
            if self.verified.get(("run", n), 0) >= 2:
                self._body(n)
            else:  # checked twice: the first step of a fit has no momentum yet
                self._first(s, n, "run", lambda: self._body(n))
        elif n not in self.graphs:
            # The step runs for real on a side stream, which also compiles and warms up what
            # the capture records; the capture itself executes nothing.
            ref = self._first(s, n, "run", lambda: self._on_side_stream(n))
            if ref is not None and self.graph:
                self._capture(n, ref)
        elif ("replay", n) in self.verified:
            self.graphs[n].replay()
        else:  # after the warm-up step: with momentum
            self._first(s, n, "replay", self.graphs[n].replay)

    def _body(self, n):
        Bm, K, C = self.Bm, self.K, self.C
        W, b = self.W[:n], self.b[:n]
        rows = self.idx.index_select(0, self.counter)[0, :n].reshape(-1)
        xb = self.X.index_select(0, rows).view(n, Bm, -1)
        y = self.y.index_select(0, rows).view(n, Bm)
        w = self.row_w.index_select(0, self.counter)[0, :n]
        W_mm = self.W_low[:n] if self.low else W
        z = torch.bmm(xb, W_mm)
        g, g_b = self.grad(z, b, y, w, self.loss[:n], K, C)
        xT = xb.transpose(1, 2)
        if self.low:  # the product in the feature dtype, as the eager step computes it
            g_W = torch.bmm(xT, g.to(xb.dtype))
        else:
            # buf = m buf + x^T g in one product, as the eager step: no weight-sized gradient.
            self.buf_W[:n].baddbmm_(xT, g, beta=self.momentum)
            g_W = None
        W_low = self.W_low[:n] if self.low else None
        self.update(
            W,
            self.buf_W[:n],
            g_W,
            b,
            self.buf_b[:n],
            g_b,
            self.wd[:n],
            self.neg_lr[:n],
            self.momentum,
            W_low,
        )
        self.counter.add_(1)

    def _batch(self, s, n):
        rows = self.idx[s, :n].reshape(-1)
        xb = self.X.index_select(0, rows).view(n, self.Bm, -1)
        return xb, self.y.index_select(0, rows).view(n, self.Bm), self.row_w[s, :n]

    def _eager(self, s, n):
        xb, y, w = self._batch(s, n)
        self.eager_step(n, xb, y, w, self.loss, self.neg_lr, self.wd, self.use_wd)
        self.counter.add_(1)

    def _on_side_stream(self, n):
        cuda = torch.cuda
        if self.stream is None:
            self.stream = cuda.Stream(self.cuda)
            self.pool = cuda.graph_pool_handle()
        self.stream.wait_stream(cuda.current_stream(self.cuda))
        try:
            with cuda.stream(self.stream):
                self._body(n)
        finally:  # also before a restore of what a failure left half done
            cuda.current_stream(self.cuda).wait_stream(self.stream)

    def _capture(self, n, ref):
        """Capture step ``n``'s work in a CUDA graph; on failure, go on without graphs.

        The lower-level capture API, not ``torch.cuda.graph``, which empties the allocator's
        cache on every capture. A capture that fails is ended (its stream leaves capture mode)
        and discarded, and the stream is never used again.
        """
        cuda = torch.cuda
        graph = cuda.CUDAGraph()
        count = int(self.counter)
        try:
            self.stream.wait_stream(cuda.current_stream(self.cuda))
            with cuda.stream(self.stream):
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                try:
                    self._body(n)
                except BaseException:
                    with contextlib.suppress(Exception):
                        graph.capture_end()  # ends the stream's (invalid) capture
                    raise
                graph.capture_end()
            if int(self.counter) != count:
                raise RuntimeError(
                    "the capture ran the step instead of recording it (is the capture on "
                    "another device than the weights?)"
                )
        except Exception as exc:  # noqa: BLE001 - any failure means: no graphs
            with contextlib.suppress(Exception):
                graph.reset()
            self._restore(n, ref)  # whatever the capture may have run, the step is done once
            self._no_graphs(exc)
            return
        self.graphs[n] = graph

    # ---------------------------------------------------------------- the check
    def _state(self):
        return {
            "W": self.W,
            "b": self.b,
            "buf_W": self.buf_W,
            "buf_b": self.buf_b,
            "loss": self.loss,
        }

    def _reference(self, s, n):
        """Step ``s`` taken by the eager step on copies; and the size of each update.

        The copies cover the ``n`` groups (the state a failed check restores); the eager step
        and the comparisons run one group at a time, so that the check adds two copies of
        the weights to the device's memory and little more (the memory plan counts them).
        """
        ref = {name: t[:n].clone() for name, t in self._state().items()}
        rows, w = self.idx[s], self.row_w[s]
        scale = {name: [] for name in ref}
        for g in range(n):
            one = {name: t[g : g + 1] for name, t in ref.items()}
            step = self.make_eager(one["W"], one["b"], one["buf_W"], one["buf_b"])
            xb = self.X.index_select(0, rows[g]).view(1, self.Bm, -1)
            y = self.y.index_select(0, rows[g]).view(1, self.Bm)
            step(
                1,
                xb,
                y,
                w[g : g + 1],
                one["loss"],
                self.neg_lr[g : g + 1],
                self.wd[g : g + 1],
                self.use_wd,
            )
            del step
            # The size of the update: the change of the weights, biases and loss; the momentum
            # buffers themselves, which are the direction the weights move in.
            for name, t in self._state().items():
                size = (
                    one[name].abs() if name.startswith("buf") else (one[name] - t[g : g + 1]).abs_()
                )
                scale[name].append(
                    _per_config(torch.nan_to_num_(size, nan=0.0, posinf=0.0), self.K)
                )
        ref["counter"] = self.counter + 1
        return ref, {name: torch.cat(parts) for name, parts in scale.items()}

    def _first(self, s, n, kind, attempt):
        """Run a new variant of the step, checked against the eager step; the reference or None.

        On an exception or a disagreement, the state becomes the eager step's result, so the
        step counts once, and the fit goes on in a safer way (see :meth:`_uncompiled`,
        :meth:`_distrust`).
        """
        ref, scale = self._reference(s, n)
        try:
            attempt()
        except CompileError as exc:
            self._restore(n, (ref, scale))
            self._uncompiled(exc.__cause__ or exc, str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - restored, warned, and trained eagerly
            self._restore(n, (ref, scale))
            self._distrust(
                f"{'replaying' if kind == 'replay' else 'running'} it failed ({_cause(exc)})"
            )
            return None
        diff = self._difference(n, ref, scale)
        self.max_diff = diff if self.max_diff is None else max(self.max_diff, diff)
        if not diff <= self.tolerance:
            self._restore(n, (ref, scale))
            what = "its first replay" if kind == "replay" else "its first run"
            self._distrust(
                f"{what} with {n} group(s) differs from the eager step by {diff:.3g} of an "
                f"update (tolerance {self.tolerance:g})"
            )
            return None
        self.verified[kind, n] = self.verified.get((kind, n), 0) + 1
        return ref, scale

    def _difference(self, n, ref, scale):
        """Largest difference from the eager step beyond rounding, relative to the update.

        Per configuration: the largest difference of an entry (weight, bias, momentum, loss)
        beyond :data:`ROUNDING_ULPS` units in the last place of its own value, divided by
        the largest change of the step.
        """
        if not torch.equal(self.counter, ref["counter"]):
            return math.inf  # the step did not run once: an empty graph, or a replay twice
        worst = []
        for name, t in self._state().items():
            tiny = torch.finfo(ref[name].dtype).tiny
            for g in range(n):  # one group at a time: the temporaries stay small
                got, want = t[g : g + 1], ref[name][g : g + 1]
                rounding = want.abs().mul_(ROUNDING_ULPS * torch.finfo(want.dtype).eps)
                excess = (got - want).abs_().sub_(rounding).clamp_(min=0)
                # Entries of a configuration on its way to diverging are not compared: the
                # epoch end freezes it in both paths.
                far = ~(torch.isfinite(want) & (want.abs() < 1e30))
                excess = torch.nan_to_num_(excess, nan=math.inf).masked_fill_(far, 0.0)
                worst.append((_per_config(excess, self.K) / (scale[name][g : g + 1] + tiny)).max())
        return float(torch.stack(worst).max())

    def _restore(self, n, reference):
        ref, _ = reference
        for name, t in self._state().items():
            t[:n].copy_(ref[name])
        self.counter.copy_(ref["counter"])
        if self.low:
            self.W_low[:n].copy_(self.W[:n])

    # ---------------------------------------------------------------- giving up, once
    def _uncompiled(self, exc, cause=None):
        message = (
            f"compiling the SGD step failed ({cause or _cause(exc)}); it runs uncompiled "
            f"(same arithmetic, slower) for {_describe(self.sig)} in this process. Pass "
            "compile=False to skip the attempt."
        )
        self.fallbacks.append(message)
        _remember("compile", self.device_type, self.sig, message)
        self.grad, self.update, self.compiled = grad_logits, sgd_update, False
        self.verified = {v: k for v, k in self.verified.items() if v[0] == "replay"}

    def _no_graphs(self, exc):
        if isinstance(exc, CompileError) and exc.__cause__ is not None:
            exc = exc.__cause__
        message = (
            f"capturing the SGD step in a CUDA graph failed ({_cause(exc)}); it runs without "
            f"graphs for {_describe(self.sig)} in this process"
        )
        self.fallbacks.append(message)
        _remember("capture", self.device_type, self.sig, message)
        self.graph = False
        self.graphs.clear()
        self.stream = None  # a stream whose capture failed is not used again

    def _distrust(self, what):
        message = (
            f"the fused SGD step ({self.path}) is wrong: {what}. This fit goes on with the "
            "eager step, as will every later fit of its kind "
            f"({_describe(self.sig)}) in this process. Please report this with the output of "
            "imagenet-cog --version and your torch and GPU versions."
        )
        self.fallbacks.append(message)
        _remember("check", self.device_type, self.sig, message)
        self.eager_step = self.make_eager(self.W, self.b, self.buf_W, self.buf_b)


def _per_config(t, K):
    """Largest entry per (group, configuration) of a (groups, rows, K*C) or (groups, K) tensor."""
    if t.dim() == 2:
        return t
    n, rows, KC = t.shape
    return t.view(n, rows, K, KC // K).amax(dim=(1, 3))
