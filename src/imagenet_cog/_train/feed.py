"""What feeds the SGD engine: feature rows from the host, bounded, and the epochs' row order.

* :class:`HostRows`: several feature arrays (NumPy arrays, memory maps or torch tensors),
  each optionally restricted to some of its rows, seen as one ``(n, d)`` array. Rows are
  gathered from each part straight into a destination buffer, a block at a time, so the
  host never holds a concatenation of the parts.
* :class:`ChunkStream`: streamed rows in fixed-size chunks through two preallocated host
  buffers (pinned on CUDA) and two device buffers, reused from chunk to chunk: while the
  device reads one chunk, the host gathers the next, and nothing is alive twice.
* :class:`EpochIndex`: each epoch's shuffled rows of every group, prepared one epoch ahead
  in a background thread into two reused (pinned) buffers, int32 where the rows allow.

Imports nothing from the package; :mod:`imagenet_cog._train.engine` builds on it.
"""

from __future__ import annotations

import concurrent.futures
import warnings

import numpy as np
import torch

#: Bytes of one streamed chunk (each of the two host and two device buffers).
CHUNK_BYTES = 1 << 30
#: Rows gathered from one part in one go: bounds the host temporaries of a gather.
GATHER_ROWS = 1 << 14


def as_tensor(a):
    """``torch.as_tensor`` without a copy, also for read-only arrays (which are never written)."""
    if isinstance(a, torch.Tensor):
        return a
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(np.asarray(a))


def _take(X, rows):
    """Rows ``rows`` (int64 array) of ``X``, as a tensor on ``X``'s device, in its dtype.

    Indexed, never ``np.take``: on a store's sharded memory maps ``np.take`` would first join
    every shard into one array (the whole store, at each call)."""
    if isinstance(X, torch.Tensor):
        return X.index_select(0, torch.from_numpy(rows).to(X.device))
    return as_tensor(np.asarray(X[rows]))


class HostRows:
    """Several feature arrays stacked by rows, each restricted to ``rows`` (None: all).

    Parameters
    ----------
    parts : sequence of (array, rows)
        ``array`` is a NumPy array, a memory map or a torch tensor of shape ``(m, d)``;
        ``rows`` an increasing int array of the rows used (None: all ``m``). Row ``i`` of the
        whole is row ``rows[i - start]`` of the part whose span holds ``i``.
    """

    def __init__(self, parts):
        self.parts = []
        lengths = []
        for X, rows in parts:
            rows = None if rows is None else np.asarray(rows, dtype=np.int64)
            self.parts.append((X, rows))
            lengths.append(int(X.shape[0]) if rows is None else int(rows.size))
        if not self.parts:
            raise ValueError("HostRows needs at least one part")
        widths = {int(X.shape[1]) for X, _ in self.parts}
        if len(widths) != 1:
            raise ValueError(f"the parts have different widths: {sorted(widths)}")
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.shape = (int(self.starts[-1]), widths.pop())

    def whole(self):
        """The single part when it is used whole (nothing to gather), else None."""
        if len(self.parts) == 1 and self.parts[0][1] is None:
            return self.parts[0][0]
        return None

    def on(self, device):
        """Whether every part is a tensor already on ``device``."""
        return all(isinstance(X, torch.Tensor) and X.device == device for X, _ in self.parts)

    def gather(self, idx, out):
        """Write rows ``idx`` (int array) into ``out`` (a tensor of ``len(idx)`` rows).

        Each part's rows are read a block at a time (at most :data:`GATHER_ROWS` rows) and
        converted to ``out``'s dtype as they are written, so the host temporaries stay small
        whatever the size of the parts.
        """
        idx = np.asarray(idx, dtype=np.int64)
        part_of = (
            (np.searchsorted(self.starts, idx, side="right") - 1) if len(self.parts) > 1 else None
        )
        for p, (X, rows) in enumerate(self.parts):
            pos = np.arange(idx.size) if part_of is None else np.flatnonzero(part_of == p)
            for s in range(0, pos.size, GATHER_ROWS):
                sel = pos[s : s + GATHER_ROWS]
                local = idx[sel] - self.starts[p]
                block = _take(X, local if rows is None else rows[local])
                if sel[-1] - sel[0] + 1 == sel.size:  # a contiguous run: no scatter
                    out[int(sel[0]) : int(sel[-1]) + 1].copy_(block)
                else:
                    out[torch.from_numpy(sel).to(out.device)] = block.to(out.device, out.dtype)

    def upload(self, device, dtype, staged=None):
        """All rows as one tensor on ``device`` in ``dtype``, copied a block at a time.

        Off the CPU, rows not on ``device`` already go through two host buffers (pinned on
        CUDA) of at most ``4 * GATHER_ROWS`` rows (``staged`` forces that, to test it).
        """
        n, d = self.shape
        whole = self.whole()
        if staged is None:
            staged = not (device.type == "cpu" or self.on(device))
            on_gpu = isinstance(whole, torch.Tensor) and whole.device.type != "cpu"
            if whole is not None and (device.type == "cpu" or on_gpu):
                return as_tensor(whole).to(device=device, dtype=dtype)  # no copy when none needed
        out = torch.empty(n, d, dtype=dtype, device=device)
        direct = not staged
        block = max(1, min(n, GATHER_ROWS * 4))
        slots = [] if direct else [_host_buffer(block, d, dtype, device) for _ in range(2)]
        copied = [torch.cuda.Event(), torch.cuda.Event()] if device.type == "cuda" else None
        for k, start in enumerate(range(0, n, block)):
            stop = min(n, start + block)
            if direct:
                self.gather(np.arange(start, stop), out[start:stop])
                continue
            # Two pinned slots: the host fills one while the other is copied over.
            buf = slots[k % 2][: stop - start]
            if copied is not None:
                copied[k % 2].synchronize()  # the copy out of this slot two blocks ago is done
            self.gather(np.arange(start, stop), buf)
            out[start:stop].copy_(buf, non_blocking=True)
            if copied is not None:
                copied[k % 2].record()
        return out


def _host_buffer(rows, d, dtype, device):
    return torch.empty(rows, d, dtype=dtype, pin_memory=device.type == "cuda")


class ChunkStream:
    """Rows of a :class:`HostRows` delivered on the device a chunk at a time, in two slots.

    ``fetch(idx)`` gathers rows ``idx`` into host slot ``k % 2`` and, on a device other than
    the CPU, copies it into device slot ``k % 2`` (on CUDA on a copy stream, ordered against
    the compute stream by events); it returns a view of the slot. The buffers are allocated
    once, :data:`CHUNK_BYTES` each (or ``rows_per_chunk`` rows), and reused: a caller must be
    done with chunk ``k`` before it fetches chunk ``k + 2``, which is how chunks are consumed
    (one after another). On the CPU the host slot is the chunk (``staged`` forces the
    device copy, to test it there).
    """

    def __init__(self, source, device, dtype, rows_per_chunk, staged=None):
        self.source, self.device, self.dtype = source, device, dtype
        self.rows_per_chunk = max(1, int(rows_per_chunk))
        self.d = source.shape[1]
        self.staged = device.type != "cpu" if staged is None else bool(staged)
        self.cuda = device.type == "cuda"
        self.capacity = 0
        self.host, self.dev = [], []
        self.allocated = []  # (where, bytes) of every buffer ever allocated: tests read it
        self.fetches = 0
        if self.cuda:
            self.copy_stream = torch.cuda.Stream(device)
            self.copied = [torch.cuda.Event(), torch.cuda.Event()]
            self.consumed = [torch.cuda.Event(), torch.cuda.Event()]

    def _reserve(self, rows):
        if rows <= self.capacity:
            return
        # A step larger than a chunk (rare: tiny budgets) grows the slots; the old ones go first.
        if self.cuda and self.fetches:
            torch.cuda.current_stream(self.device).synchronize()
        self.host, self.dev = [], []
        cap = max(rows, min(self.rows_per_chunk, self.source.shape[0]))
        size = cap * self.d * torch.empty((), dtype=self.dtype).element_size()
        for _ in range(2):
            self.host.append(_host_buffer(cap, self.d, self.dtype, self.device))
            self.allocated.append(("host", size))
            if self.staged:
                buf = torch.empty(cap, self.d, dtype=self.dtype, device=self.device)
                if self.cuda:
                    buf.record_stream(self.copy_stream)
                self.dev.append(buf)
                self.allocated.append(("device", size))
        self.capacity = cap

    def fetch(self, idx):
        """Rows ``idx`` (NumPy int array) on the device, as a view of the next slot."""
        m = len(idx)
        self._reserve(m)
        slot = self.fetches % 2
        if self.cuda and self.fetches:
            # The caller has queued all its work on the previous chunk.
            self.consumed[1 - slot].record(torch.cuda.current_stream(self.device))
        self.fetches += 1
        host = self.host[slot][:m]
        if self.cuda:
            self.copied[slot].synchronize()  # the last copy out of this host slot is done
        self.source.gather(idx, host)
        if not self.staged:
            return host
        dev = self.dev[slot][:m]
        if not self.cuda:
            return dev.copy_(host)
        self.copy_stream.wait_event(self.consumed[slot])  # nobody reads this slot any more
        with torch.cuda.stream(self.copy_stream):
            dev.copy_(host, non_blocking=True)
            self.copied[slot].record(self.copy_stream)
        torch.cuda.current_stream(self.device).wait_event(self.copied[slot])
        return dev


class EpochIndex:
    """Each epoch's rows of every group as ``(step, group, row)``, one epoch ahead.

    Group ``g`` draws ``torch.randperm(sizes[g], generator=gens[g])`` once per epoch, in
    epoch order, exactly as a separate fit would; its rows ``rows[g][perm]`` fill its
    ``steps[g]`` batches of ``bsz[g]`` rows, and everything else (padding) is row 0. The
    draws and gathers of epoch ``e + 1`` run in a background thread while epoch ``e``
    trains. Two buffers (pinned on CUDA) are reused: epoch ``e + 2`` overwrites epoch
    ``e``'s, so :meth:`next` must not be called before everything reading epoch ``e``'s
    buffer is done (the engine synchronises at the end of every epoch). The padding is
    written once, since every epoch writes the same positions. Rows are int32 when they fit
    (``dtype=None``), or ``dtype``: the dtype of the device buffer they are copied into, since
    a copy that also converts goes through a pageable temporary.
    """

    def __init__(self, rows, gens, sizes, steps, bsz, n_rows, epochs, pin=False, dtype=None):
        if dtype is None:
            self.dtype = np.int32 if n_rows <= np.iinfo(np.int32).max else np.int64
        else:
            self.dtype = np.dtype(str(dtype).removeprefix("torch."))
        self.rows = [np.asarray(r).astype(self.dtype, copy=False) for r in rows]
        self.gens, self.sizes = gens, [int(s) for s in sizes]
        self.steps, self.bsz = [int(s) for s in steps], [int(b) for b in bsz]
        shape = (max(self.steps), len(self.rows), max(self.bsz))
        tdt = torch.int32 if self.dtype == np.int32 else torch.int64
        self.buffers = [
            torch.zeros(shape, dtype=tdt, pin_memory=pin) for _ in range(min(2, int(epochs)))
        ]
        self._left = int(epochs)
        self._slot = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="epoch-index")
        self._pending = self._submit()

    def _submit(self):
        if self._left == 0:
            return None
        self._left -= 1
        out = self.buffers[self._slot].numpy()
        self._slot = (self._slot + 1) % len(self.buffers)
        return self._pool.submit(self._fill, out)

    def _fill(self, out):
        for g, rows in enumerate(self.rows):
            perm = torch.randperm(self.sizes[g], generator=self.gens[g]).numpy()
            b = self.bsz[g]
            full = self.sizes[g] // b
            if full:  # straight into the strided (step, row) view of group g
                np.take(rows, perm[: full * b].reshape(full, b), out=out[:full, g, :b], mode="clip")
            rest = self.sizes[g] - full * b
            if rest:
                out[full, g, :rest] = rows[perm[full * b :]]
        return out

    def next(self):
        """The next epoch's index (a NumPy view of a reused buffer); starts the one after."""
        if self._pending is None:
            raise RuntimeError("every epoch's index has been handed out")
        out = self._pending.result()
        self._pending = self._submit()
        return out

    def close(self):
        """Wait for the background thread and stop it."""
        self._pool.shutdown(wait=True)
