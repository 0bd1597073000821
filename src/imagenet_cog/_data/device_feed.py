"""Batches made ready for the network one step ahead, in a thread and on a stream of their own.

The extraction's loop runs the network on batch ``n`` while batch ``n + 1`` is decoded and
preprocessed. On CUDA the preparation runs in a thread of its own, on a side stream: the
network's stream waits for an event recorded after each batch's preparation, so the host
thread that launches the network never waits for the device inside a batch, and the two
streams overlap on the GPU. Elsewhere the batches are prepared in the caller's thread, one
after the other, unless a thread is asked for.
"""

from __future__ import annotations

import contextlib
import queue
import threading

import torch

__all__ = ["DeviceFeed"]

_END = object()


class _Failure:
    def __init__(self, exc):
        self.exc = exc


class DeviceFeed:
    """Iterate over ``prepare(batch)`` for the batches of ``loader``.

    Parameters
    ----------
    loader : iterable
        Collated batches (a DataLoader).
    prepare : callable
        Makes one batch ready: returns a tuple whose second item is the network's input (a
        tensor on the device, or None).
    device : torch.device
    background : bool, optional
        Prepare the batches in a thread of their own; default: on CUDA.
    streams : bool, optional
        Prepare on a side stream and make the consumer's stream wait for it; default: on
        CUDA (with ``background``).
    ahead : int
        Batches prepared ahead of the one in use.

    Examples
    --------
    >>> feed = DeviceFeed([1, 2, 3], lambda b: (b, torch.full((1,), float(b))), torch.device("cpu"),
    ...                   background=True)
    >>> [float(x) for _, x in feed]
    [1.0, 2.0, 3.0]
    """

    def __init__(self, loader, prepare, device, *, background=None, streams=None, ahead=2):
        cuda = torch.device(device).type == "cuda"
        self.loader = loader
        self.prepare = prepare
        self.device = torch.device(device)
        self.background = cuda if background is None else bool(background)
        self.streams = (cuda and self.background) if streams is None else bool(streams)
        self.ahead = max(1, int(ahead))

    def __iter__(self):
        if not self.background:
            for batch in self.loader:
                yield self.prepare(batch)
            return
        ready = queue.Queue(self.ahead)
        stop = threading.Event()
        # What this thread queued before (the mean and std on the device...) comes first.
        origin = torch.cuda.current_stream(self.device) if self.streams else None
        worker = threading.Thread(
            target=self._produce,
            args=(ready, stop, origin),
            name="imagenet_cog-feed",
            daemon=True,
        )
        worker.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                out, event = item
                if event is not None:
                    consumer = torch.cuda.current_stream(self.device)
                    consumer.wait_event(event)
                    x = out[1]
                    if getattr(x, "is_cuda", False):  # used on this stream, freed on that one
                        x.record_stream(consumer)
                yield out
        finally:
            stop.set()
            while worker.is_alive():  # let the thread see the stop, then end
                with contextlib.suppress(queue.Empty):
                    ready.get(timeout=0.05)
            worker.join()

    def _put(self, ready, stop, item):
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, ready, stop, origin):
        side = torch.cuda.Stream(self.device) if self.streams else None
        if side is not None:
            side.wait_stream(origin)
        batches = iter(self.loader)
        try:
            for batch in batches:
                if stop.is_set():
                    return
                if side is None:
                    item = (self.prepare(batch), None)
                else:
                    with torch.cuda.device(self.device), torch.cuda.stream(side):
                        out = self.prepare(batch)
                        event = torch.cuda.Event()
                        event.record(side)
                    item = (out, event)
                if not self._put(ready, stop, item):
                    return
            self._put(ready, stop, _END)
        except BaseException as exc:  # noqa: BLE001 - raised again in the consumer's thread
            self._put(ready, stop, _Failure(exc))
        finally:
            del batches  # a DataLoader's workers end with its iterator
