"""What the default integrity check of ``open_store`` costs on a large feature store.

Builds a synthetic store shaped like ImageNet-1K train features of a ResNet-50
(1.1M rows x 2048 float32, 9 GB at full size; 10% by default, ``--full`` for
all of it), then times, each printed as soon as it is measured:

* the baselines: reading every shard with numpy, and hashing every file with
  hashlib's sha256 (what any full check must at least cost);
* ``open_store(verify="cached")`` the first time (hashes every file once,
  writes ``.verified.json``), then again (the cache vouches: one ``stat`` per
  file), then ``verify="size"``, ``verify=None`` and ``verify="sha256"``.

The files are freshly written, so they are (mostly) in the page cache: the
figures are CPU costs; from a cold disk, the first check and the baselines
are bounded by the disk's read speed instead. With a fraction of the store,
the hashing figures are also extrapolated linearly to the full size, and the
output says so. The script never asserts.

    python benchmarks/bench_store.py                 # 110,000 rows (0.9 GB)
    python benchmarks/bench_store.py --rows 1100000  # the full 9 GB (same as --full)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FULL_ROWS = 1_100_000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=FULL_ROWS // 10, help="rows (default 110,000)")
    p.add_argument("--full", action="store_true", help="1.1M rows (9 GB of disk)")
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--shard-size", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3, help="best of this many (cheap timings)")
    p.add_argument("--tmp", default=None, help="where to write the store (default: a temp dir)")
    args = p.parse_args(argv)
    if args.full:
        args.rows = FULL_ROWS
    return args


def sha(data):
    return hashlib.sha256(data).hexdigest()


def write_store(path, n, dim, shard_size):
    """A complete store in the format of imagenet_cog.store, with random features."""
    from imagenet_cog.store import FORMAT, FORMAT_VERSION

    path.mkdir(parents=True)
    rng = np.random.default_rng(0)
    wnids = [f"n{c:08d}" for c in range(1000)]
    ids = [f"{wnids[i % 1000]}/{wnids[i % 1000]}_{i}.JPEG" for i in range(n)]
    labels = [i.split("/")[0] for i in ids]
    split = ("image_id\twnid\n" + "".join(f"{i}\t{w}\n" for i, w in zip(ids, labels))).encode()
    (path / "split.tsv").write_bytes(split)
    (path / "rows.tsv").write_bytes(split)
    shards = []
    for k, start in enumerate(range(0, n, shard_size)):
        rows = min(shard_size, n - start)
        array = rng.standard_normal((rows, dim), dtype=np.float32)
        file = path / f"shard-{k:05d}.npy"
        np.save(file, array, allow_pickle=False)
        shards.append(
            {
                "file": file.name,
                "rows": rows,
                "bytes": file.stat().st_size,
                "sha256": sha(file.read_bytes()),
            }
        )
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "key": {"model": "synthetic", "domain": "in1k", "split": "train"},
        "n_images": n,
        "n_rows": n,
        "dim": dim,
        "dtype": "float32",
        "split": {"file": "split.tsv", "sha256": sha(split)},
        "rows": {"file": "rows.tsv", "sha256": sha(split)},
        "shards": shards,
        "skipped": [],
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return sum(s["bytes"] for s in shards) + 2 * len(split)


def timed(fn, repeats=1):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None):
    args = parse_args(argv)
    from imagenet_cog._storecheck import file_sha256
    from imagenet_cog.store import open_store

    base = Path(tempfile.mkdtemp(dir=args.tmp, prefix="bench_store_"))
    try:
        path = base / "in1k" / "train"
        t = time.perf_counter()
        size = write_store(path, args.rows, args.dim, args.shard_size)
        scale = FULL_ROWS / args.rows
        n_files = len(list(path.glob("shard-*.npy"))) + 2
        elapsed = time.perf_counter() - t
        print(
            f"store: {args.rows:,} rows x {args.dim} float32 in {n_files - 2} shards, "
            f"{size / 1e9:.2f} GB, written in {elapsed:.1f} s",
            flush=True,
        )
        if scale != 1:
            print(
                f"a fraction 1/{scale:g} of the full 1.1M-row store: every time is also "
                f"extrapolated linearly (x{scale:g}) in [brackets]",
                flush=True,
            )
        files = sorted(p for p in path.iterdir() if not p.name.startswith("."))
        figures = {}

        def show(key, label, seconds):
            figures[key] = seconds
            full = f"   [{seconds * scale:8.2f} s at 1.1M rows]" if scale != 1 else ""
            print(f"{label:<44} {seconds:8.3f} s{full}", flush=True)

        def read_numpy():
            for f in files:
                if f.suffix == ".npy":
                    np.load(f, allow_pickle=False)

        def hash_all():
            for f in files:
                file_sha256(f)

        def opened(verify, repeats=1):
            return timed(lambda: open_store(path, verify=verify), repeats)

        r = args.repeats
        show("numpy", "baseline: np.load of every shard", timed(read_numpy))
        show("hashlib", "baseline: hashlib sha256 of every file", timed(hash_all))
        show("first", 'open_store(verify="cached"), first open', opened("cached"))
        show("cached", 'open_store(verify="cached"), cached reopen', opened("cached", r))
        show("size", 'open_store(verify="size")', opened("size", r))
        show("none", "open_store(verify=None)", opened(None, r))
        show("sha256", 'open_store(verify="sha256")', opened("sha256"))
        print()
        print(f"first checked open / sha256 baseline:  {figures['first'] / figures['hashlib']:.2f}")
        print(f"first checked open / np.load baseline: {figures['first'] / figures['numpy']:.2f}")
        print(f"cached reopen / verify=None:           {figures['cached'] / figures['none']:.2f}")
        print(
            json.dumps(
                {
                    "rows": args.rows,
                    "dim": args.dim,
                    "bytes": size,
                    "scale_to_full": scale,
                    "seconds": {k: round(v, 4) for k, v in figures.items()},
                }
            ),
            flush=True,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
