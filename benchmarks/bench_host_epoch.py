"""The host's work per epoch in ``train_many``: building the epoch's row index, old and new.

At CoG's full scale a lockstep unit trains 30 searches (6 domains x 5 seeds) of about 0.9-1.0M
training rows each (all the shots), in batches of 1024. Every epoch, each search's generator
draws a ``torch.randperm`` of its rows, and the rows of all searches go into one
``(step, search, row)`` index for the device. This script times, on the CPU and in one run:

* **before**: a fresh int64 index per epoch, filled through a padded copy per search, then
  copied once more for the upload (``pin_memory``, here a plain copy: a CPU-only machine has
  no pinned memory, so the real cost was higher);
* **now** (:class:`imagenet_cog._train.feed.EpochIndex`): the same draws, written straight into one
  of two reused int32 buffers (pinned on CUDA, so the upload needs no copy), one epoch ahead
  in a background thread; and in int64, as the fused step's device index takes them;
* **now, overlapped**: how long the training loop still waits for the index per epoch when it
  is busy for ``--busy`` seconds per epoch meanwhile (a sleep standing in for the device's
  epoch: a stand-in, not a GPU measurement).

It checks that both give the same index, prints each phase as it ends, and the ratio. Nothing
here asserts a time.

Examples::

    python benchmarks/bench_host_epoch.py            # full scale (about 1 GB of RAM)
    python benchmarks/bench_host_epoch.py --quick    # seconds
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import numpy as np
import torch

print = functools.partial(print, flush=True)

#: Training rows of each domain (the paper, Sec. 3 and supplement A).
TRAIN_ROWS = (1_281_167, 1_118_804, 1_115_788, 1_095_203, 1_107_128, 1_091_654)


def problem(scale, seeds, batch):
    """Each search's training rows (80% of its domain, offset into the unit), steps, batches."""
    rng = np.random.default_rng(0)
    rows, offset = [], 0
    for n in TRAIN_ROWS:
        n = max(10, int(n * scale))
        for _ in range(seeds):
            keep = rng.random(n) >= 0.2
            rows.append(np.flatnonzero(keep).astype(np.int64) + offset)
        offset += n
    sizes = [r.size for r in rows]
    bsz = [min(batch, s) for s in sizes]
    steps = [-(-s // b) for s, b in zip(sizes, bsz)]
    return rows, sizes, steps, bsz, offset


def before(rows, gens, sizes, steps, bsz):
    """The index as ``train_many`` built it: fresh int64 arrays, then a copy to upload."""
    S, Bm = max(steps), max(bsz)
    idx = np.zeros((S, len(rows), Bm), dtype=np.int64)
    for g, r in enumerate(rows):
        perm = torch.randperm(sizes[g], generator=gens[g]).numpy()
        flat = np.zeros(steps[g] * bsz[g], dtype=np.int64)
        flat[: sizes[g]] = r[perm]
        idx[: steps[g], g, : bsz[g]] = flat.reshape(steps[g], bsz[g])
    upload = torch.from_numpy(idx).clone()  # pin_memory() copies likewise (into pinned pages)
    return idx, upload


def gens(n):
    return [torch.Generator().manual_seed(1000 + g) for g in range(n)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a 1/100 scale run that takes seconds")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--busy",
        type=float,
        default=1.0,
        help="seconds the training loop is busy per epoch in the overlapped run",
    )
    args = p.parse_args(argv)
    from imagenet_cog._train.feed import EpochIndex

    scale = 0.01 if args.quick else 1.0
    rows, sizes, steps, bsz, n_rows = problem(scale, 5, 1024)
    S, G, Bm = max(steps), len(rows), max(bsz)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"epoch index: {G} searches of {min(sizes):,}..{max(sizes):,} rows, batch 1024, "
        f"{S} steps: ({S}, {G}, {Bm}) = {S * G * Bm / 1e6:.1f}M entries; torch threads "
        f"{torch.get_num_threads()}, load average {load:.2f}, {args.epochs} epochs each"
    )

    old_gens = gens(G)
    start = time.perf_counter()
    first_old = None
    for _ in range(args.epochs):
        idx, _upload = before(rows, old_gens, sizes, steps, bsz)
        first_old = idx if first_old is None else first_old
    t_old = (time.perf_counter() - start) / args.epochs
    print(f"before: {t_old:.3f} s per epoch (int64 index {idx.nbytes / 1e6:.0f} MB, plus its copy)")
    del idx, _upload

    # Handed out in a loop that does nothing else, each epoch's index waits for its whole fill.
    first_new = None
    fill_index = EpochIndex(rows, gens(G), sizes, steps, bsz, n_rows, args.epochs)
    start = time.perf_counter()
    for _ in range(args.epochs):
        got = fill_index.next()
        first_new = got.copy() if first_new is None else first_new
    t_new = (time.perf_counter() - start) / args.epochs
    fill_index.close()
    same = np.array_equal(first_old, first_new)
    print(
        f"now: {t_new:.3f} s per epoch (int32 index {got.nbytes / 1e6:.0f} MB, reused, no copy); "
        f"same index as before: {same}"
    )
    print(f"ratio before / now: {t_old / t_new:.2f}x")

    # The fused step's device index is int64: the index then comes in int64, so that the
    # upload needs no conversion.
    wide = EpochIndex(rows, gens(G), sizes, steps, bsz, n_rows, args.epochs, dtype=torch.int64)
    start = time.perf_counter()
    for _ in range(args.epochs):
        wide.next()
    t_wide = (time.perf_counter() - start) / args.epochs
    wide.close()
    print(
        f"now, int64 (the fused step's index): {t_wide:.3f} s per epoch; ratio {t_old / t_wide:.2f}x"
    )

    index = EpochIndex(rows, gens(G), sizes, steps, bsz, n_rows, args.epochs + 1)
    index.next()
    waits = []
    for _ in range(args.epochs):
        time.sleep(args.busy)  # the loop busy with an epoch (a stand-in for the device)
        start = time.perf_counter()
        index.next()
        waits.append(time.perf_counter() - start)
    index.close()
    t_wait = float(np.mean(waits))
    print(
        f"now, overlapped with {args.busy:.1f} s of other work per epoch: the loop waits "
        f"{t_wait:.3f} s per epoch for the index (before: {t_old:.3f} s in the loop)"
    )
    if not same:
        raise SystemExit("the two indices differ")


if __name__ == "__main__":
    main()
