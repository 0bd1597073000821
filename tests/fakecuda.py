"""CUDA streams and graphs simulated on the CPU, for the graph-captured SGD step's tests.

:class:`FakeCuda` replaces the parts of ``torch.cuda`` that the step uses (devices, streams,
``CUDAGraph``, ``graph``, the allocator's cache) and follows the rules that matter to it:

* every tensor "lives" on one device index (``tensor_device``), whatever the current device;
* a stream belongs to the device that was current when it was made; ``torch.cuda.stream(s)``
  makes ``s`` the current stream of *its* device and that device the current one;
* an operation on the tensors goes to the current stream of the tensors' device. When that
  stream is capturing, the operation is recorded and not run (a new tensor it returns is
  computed now, as the allocation it stands for, and recomputed at each replay); otherwise it
  runs. So a capture made on another device records nothing, and runs the step instead;
* capturing on a device's default stream is refused, as CUDA refuses it; an operation that
  needs the host (``.item()``) raises inside a capture and invalidates it, and every later
  operation on that stream raises until the capture ends, whose end then raises too;
* ``replay`` runs the recorded operations again, on the same tensors; until then, what the
  capture allocated holds garbage (NaN, or 0 for integers);
* each host thread has its own current device and streams, as in CUDA; events record the
  stream they were recorded on, and streams the events they were made to wait for.

Failures can be injected: ``fail_capture_at`` (the k-th recorded operation of a capture
raises, as an operation CUDA does not allow during capture), ``replays_that_work`` (later
replays of a graph do nothing) and ``stale`` (replays do not redo the recorded operations of
that name, so their outputs keep the values of the capture).
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
INVALIDATED = "CUDA error: operation failed due to a previous error during capture"


class FakeStream:
    def __init__(self, device, default=False):
        self.device_index = device
        self.default = default
        self.capture = None  # the FakeGraph capturing on this stream
        self.waited = []  # the events this stream was made to wait for

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        self.waited.append(event)

    def synchronize(self):
        pass


class FakeEvent:
    """An event: where it was recorded, and how often a host thread waited for it."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.stream = None
        self.host_waits = 0

    def record(self, stream=None):
        self.stream = stream or self.cuda.current_stream()
        self.cuda.events.append(self)

    def synchronize(self):
        self.host_waits += 1

    def query(self):
        return True


class FakeGraph:
    def __init__(self, cuda):
        self.cuda = cuda
        self.ops = []
        self.captured = False
        self.invalid = None
        self.replays = 0

    def capture_begin(self, pool=None, capture_error_mode="global"):
        cuda = self.cuda
        stream = cuda.current_stream()
        if stream.default:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream.")
        if stream.capture is not None:
            raise RuntimeError("this stream is capturing already")
        stream.capture = self
        self.stream, self.device = stream, cuda.current
        self.ops, self.invalid = [], None
        cuda.captures.append(self)

    def capture_end(self):
        if self.cuda.current_stream() is not self.stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        self.stream.capture = None
        if self.invalid:
            raise RuntimeError(INVALIDATED + " (cudaErrorStreamCaptureInvalidated)")
        self.captured = True
        # Memory a capture allocates holds garbage until a replay writes it.
        for *_, out in self.ops:
            for t in [out] if isinstance(out, torch.Tensor) else out or ():
                t.fill_(float("nan") if t.is_floating_point() else 0)

    def replay(self):
        if not self.captured:
            raise RuntimeError("replay of a graph that holds no capture")
        self.replays += 1
        limit = self.cuda.replays_that_work
        if limit is not None and self.replays > limit:
            return
        for func, args, kwargs, out in self.ops:
            if out is None:
                func(*args, **kwargs)
            elif func.__name__.split(".")[0] not in self.cuda.stale:
                new = func(*args, **kwargs)
                pairs = [(out, new)] if isinstance(out, torch.Tensor) else zip(out, new)
                for kept, fresh in pairs:
                    kept.copy_(fresh)

    def reset(self):
        self.ops, self.captured = [], False

    def pool(self):
        return ("pool", id(self))


class _Dispatch(TorchDispatchMode):
    """Sends each operation to the current stream of the tensors' device."""

    def __init__(self, cuda):
        super().__init__()
        self.cuda = cuda

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        cuda = self.cuda
        capture = cuda.streams[cuda.tensor_device].capture
        if capture is None:
            cuda.ops_run += 1
            return func(*args, **kwargs)
        if capture.invalid:
            raise RuntimeError(INVALIDATED)
        name = func.__name__.split(".")[0]
        if name in ("_local_scalar_dense", "nonzero", "item"):
            capture.invalid = NOT_PERMITTED
            raise RuntimeError(NOT_PERMITTED)
        schema = func._schema
        written = [
            kwargs.get(a.name, args[i] if i < len(args) else None)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        ]
        aliasing = any(r.alias_info is not None for r in schema.returns)
        if not written and aliasing:  # a view: no work on the device
            return func(*args, **kwargs)
        if cuda.fail_capture_at is not None and len(capture.ops) + 1 >= cuda.fail_capture_at:
            capture.invalid = NOT_PERMITTED
            raise RuntimeError(NOT_PERMITTED + " (injected)")
        if written:  # recorded, not run
            capture.ops.append((func, args, kwargs, None))
            return written[0] if len(written) == 1 else tuple(written)
        out = func(*args, **kwargs)
        capture.ops.append((func, args, kwargs, out))
        return out


class FakeCuda:
    """The simulation; :meth:`install` puts it in place of ``torch.cuda``'s functions."""

    def __init__(
        self, tensor_device=0, n_devices=2, fail_capture_at=None, replays_that_work=None, stale=()
    ):
        self.tensor_device = tensor_device
        self._thread = threading.local()  # the current device and streams of each thread
        self.defaults = {i: FakeStream(i, default=True) for i in range(n_devices)}
        self.events = []
        self.fail_capture_at = fail_capture_at
        self.replays_that_work = replays_that_work
        self.stale = set(stale)
        self.captures = []
        self.empty_cache_calls = 0
        self.ops_run = 0
        cuda = self

        class graph:  # torch.cuda.graph, as torch writes it
            default_capture_stream = None

            def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
                if stream is None and type(self).default_capture_stream is None:
                    type(self).default_capture_stream = cuda.Stream()
                self.capture_stream = stream or type(self).default_capture_stream
                self.stream_ctx = cuda.stream(self.capture_stream)
                self.cuda_graph, self.pool = cuda_graph, pool

            def __enter__(self):
                cuda.synchronize()
                cuda.empty_cache()
                self.stream_ctx.__enter__()
                self.cuda_graph.capture_begin(self.pool)

            def __exit__(self, *args):
                self.cuda_graph.capture_end()
                self.stream_ctx.__exit__(*args)

        self.graph = graph

    @property
    def current(self):
        return getattr(self._thread, "current", 0)

    @current.setter
    def current(self, index):
        self._thread.current = index

    @property
    def streams(self):
        """The current stream of each device, in this thread."""
        if not hasattr(self._thread, "streams"):
            self._thread.streams = dict(self.defaults)
        return self._thread.streams

    def Event(self, enable_timing=False, blocking=False, interprocess=False):
        return FakeEvent(self)

    # -- torch.cuda's functions
    def _index(self, device):
        if device is None:
            return self.current
        return device if isinstance(device, int) else torch.device(device).index

    def current_device(self):
        return self.current

    @contextlib.contextmanager
    def device(self, device):
        before, self.current = self.current, self._index(device)
        try:
            yield
        finally:
            self.current = before

    def Stream(self, device=None, priority=0):
        return FakeStream(self._index(device))

    def current_stream(self, device=None):
        return self.streams[self._index(device)]

    @contextlib.contextmanager
    def stream(self, stream):
        before_device, before = self.current, self.streams[stream.device_index]
        self.streams[stream.device_index] = stream
        self.current = stream.device_index
        try:
            yield
        finally:
            self.streams[stream.device_index] = before
            self.current = before_device

    def CUDAGraph(self, keep_graph=False):
        return FakeGraph(self)

    def graph_pool_handle(self):
        return ("pool", 0)

    def synchronize(self, device=None):
        pass

    def empty_cache(self):
        self.empty_cache_calls += 1

    def is_current_stream_capturing(self):
        return self.current_stream().capture is not None

    def capturing_anywhere(self):
        return any(s.capture is not None for s in self.streams.values())

    @contextlib.contextmanager
    def install(self, monkeypatch):
        """Put the simulation in place of ``torch.cuda`` for the block."""
        for name in (
            "current_device",
            "device",
            "Stream",
            "current_stream",
            "stream",
            "CUDAGraph",
            "graph",
            "graph_pool_handle",
            "synchronize",
            "empty_cache",
            "is_current_stream_capturing",
            "Event",
        ):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        with _Dispatch(self):
            yield self
