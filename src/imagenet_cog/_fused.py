"""The fused SGD step of :func:`imagenet_cog._engine.train_many`, for the GPU.

The eager step launches dozens of small kernels per step; with a thousand classes the GPU then
waits on launches and on separate elementwise passes over the weight-sized tensors. This step:

* reads everything a step needs from device tensors: the epoch's row indices (uploaded once
  per epoch), a step counter advanced on the device, the per-epoch learning rates and weight
  decays, so a step needs no host work;
* does the elementwise work in two functions, :func:`grad_logits` (softmax, cross-entropy,
  its gradient, the bias gradient) and :func:`sgd_update` (momentum, weight decay, update,
  the bfloat16 copy of the weights), which ``torch.compile`` fuses into a few kernels;
* on CUDA, captures each step in a CUDA graph (one per number of groups taking the step) and
  replays it.

The arithmetic is the eager step's (the official protocol's); only the rounding of fused
operations differs. Nothing here is required: a failed compile or capture warns once and the
step goes on eagerly.
"""

from __future__ import annotations

import warnings

import torch


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
    """
    n, _, KC = W.shape
    K = wd.shape[2]
    for p, buf, g in ((W, buf_W, g_W), (b, buf_b, g_b)):
        shape = (n, p.shape[1], K, KC // K)
        p4, buf4 = p.view(shape), buf.view(shape)
        new = buf4 * momentum + g.view(shape).to(p.dtype) + p4 * wd
        buf4.copy_(new)
        p4.add_(new * neg_lr)
    if W_low is not None:
        W_low.copy_(W)


class _Maybe:
    """A function compiled by ``torch.compile``, or the plain one when that fails (warned once)."""

    def __init__(self, fn, compile):
        self.plain = self.fn = fn
        if not compile:
            return
        try:
            self.fn = torch.compile(fn, dynamic=None)
        except Exception as exc:  # noqa: BLE001 - any failure means: run eagerly
            _fallback_warning("compiling the SGD step", exc)

    def __call__(self, *args):
        if self.fn is self.plain:
            return self.fn(*args)
        try:
            # Inductor compiles the whole function before running any of it, so a failure
            # here has modified nothing.
            return self.fn(*args)
        except Exception as exc:  # noqa: BLE001
            _fallback_warning("compiling the SGD step", exc)
            self.fn = self.plain
            return self.fn(*args)


def _fallback_warning(what, exc):
    warnings.warn(
        f"{what} failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
        "training goes on with the eager step (same arithmetic, slower). Pass compile=False "
        "to skip the attempt.",
        RuntimeWarning,
        stacklevel=4,
    )


class FusedStep:
    """Every step of one epoch from device-side indices, optionally compiled and graph-replayed.

    ``mode`` is ``"fused"`` (the two functions uncompiled: the same plumbing, for tests),
    ``"compiled"`` or ``"graph"`` (compiled, and on CUDA each step captured in a CUDA graph).
    """

    def __init__(self, W, b, buf_W, buf_b, K, C, Bm, S, cdt, momentum, data, row_w, mode):
        self.W, self.b, self.buf_W, self.buf_b = W, b, buf_W, buf_b
        self.K, self.C, self.Bm, self.momentum = K, C, Bm, float(momentum)
        self.X, self.y, self.row_w = data.X, data.y, row_w
        device = W.device
        n_groups = W.shape[0]
        self.low = cdt != W.dtype
        self.W_low = torch.empty(W.shape, dtype=cdt, device=device) if self.low else None
        self.idx = torch.zeros(S, n_groups, Bm, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.neg_lr = torch.zeros(n_groups, 1, K, 1, dtype=W.dtype, device=device)
        self.wd = torch.zeros_like(self.neg_lr)
        self.loss = torch.zeros(n_groups, K, dtype=W.dtype, device=device)
        compiled = mode in ("compiled", "graph")
        self.grad = _Maybe(grad_logits, compiled)
        self.update = _Maybe(sgd_update, compiled)
        self.graph = mode == "graph" and device.type == "cuda"
        self.graphs, self.pool = {}, None

    def run_epoch(self, idx, active, loss_e, neg_lr, wd_t, use_wd):
        """Train one epoch: ``idx`` (step, group, row) host rows; ``loss_e`` receives the sums."""
        del use_wd  # wd 0 adds exactly 0
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
        for n in active.tolist():
            self._step(int(n))
        loss_e.add_(self.loss)

    def _step(self, n):
        if not self.graph:
            self._body(n)
            return
        graph = self.graphs.get(n)
        if graph is not None:
            graph.replay()
            return
        # The first step with n groups runs for real on a side stream, which also compiles
        # and warms up what the capture records; the capture itself executes nothing.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(n)
        torch.cuda.current_stream().wait_stream(side)
        try:
            graph = torch.cuda.CUDAGraph()
            # One memory pool for all the graphs: their temporaries die within a replay, and
            # they replay one at a time in the order they were captured.
            with torch.cuda.graph(graph, pool=self.pool):
                self._body(n)
        except Exception as exc:  # noqa: BLE001
            _fallback_warning("capturing the SGD step in a CUDA graph", exc)
            self.graph = False
            return
        self.pool = graph.pool()
        self.graphs[n] = graph

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
        g_W = torch.bmm(xb.transpose(1, 2), g.to(xb.dtype))
        W_low = self.W_low[:n] if self.low else None
        self.update(
            W, self.buf_W[:n], g_W, b, self.buf_b[:n], g_b,
            self.wd[:n], self.neg_lr[:n], self.momentum, W_low,
        )  # fmt: skip
        self.counter.add_(1)
