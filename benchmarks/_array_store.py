"""Feature stores of synthetic features, written with the library's store writer.

The scale benchmarks need stores of 1.28 million rows without extracting 1.28 million images:
this writes features given as arrays through the same pieces an extraction uses (the split
manifest, :func:`imagenet_cog.store._write_shard` for each checksummed shard, the manifest
format), so that ``evaluate`` and ``analyze`` read them exactly as they read extracted ones.
The store's origin says that no network made them.
"""

from __future__ import annotations

import time

import numpy as np


def write_array_store(root, domain, split_name, labels, chunks, *, model, shard_size=10_000):
    """Write ``chunks`` (float32 arrays, in row order) as the store ``root/<domain>/<split>``.

    ``labels`` holds the wnid of every row, ordered by concept as a split is. Returns the
    store's path.
    """
    from imagenet_cog import store as S
    from imagenet_cog._fileio import atomic_write_bytes
    from imagenet_cog.datasets import Split

    labels = np.asarray(labels)
    n = len(labels)
    ids = [f"{w}/{w}_{i}.JPEG" for i, w in enumerate(labels.tolist())]
    split = Split(ids, labels.tolist(), info={"domain": domain, "split": split_name})
    path = S.store_path(root, domain, split_name)
    path.mkdir(parents=True, exist_ok=True)
    split.save(path / "split.tsv")
    key = S._normalized(
        {
            "model": model,
            "domain": domain,
            "split": split_name,
            "split_sha256": split.checksum,
        }
    )
    key_sha = S._sha256(S._json_bytes(key))
    started = time.perf_counter()
    records, k, start, pending, dim = [], 0, 0, [], 0
    for X in chunks:
        X = np.ascontiguousarray(X, dtype=np.float32)
        dim = X.shape[1]
        pending.append(X)
        held = sum(len(x) for x in pending)
        while held >= shard_size or (held and start + held == n):
            block = np.concatenate(pending)
            rows, rest = block[:shard_size], block[shard_size:]
            stop = start + len(rows)
            entry = {"features": [rows], "skipped": [], "truncated": []}
            records.append(S._write_shard(path, k, start, stop, entry, dim, key_sha))
            k, start, pending = k + 1, stop, [rest] if len(rest) else []
            held = len(rest)
    if start != n:
        raise ValueError(f"{n} labels but {start} feature rows")
    rows_bytes = (
        "\n".join(["image_id\twnid", *(f"{i}\t{w}" for i, w in zip(ids, labels))]) + "\n"
    ).encode()
    atomic_write_bytes(path / "rows.tsv", rows_bytes)
    manifest = {
        "format": S.FORMAT,
        "format_version": S.FORMAT_VERSION,
        "key": key,
        "n_images": n,
        "n_rows": n,
        "dim": dim,
        "dtype": "float32",
        "split": {"file": "split.tsv", "sha256": split.checksum, **split.info},
        "rows": {"file": "rows.tsv", "sha256": S._sha256(rows_bytes)},
        "shards": [
            {"file": r["file"], "rows": r["rows"], "bytes": r["bytes"], "sha256": r["sha256"]}
            for r in records
        ],
        "skipped": [],
        "truncated": [],
        "layout": {"shard_size": shard_size},
        "origin": {
            "weights": "synthetic features: no network made them (a benchmark's store)",
            "differs_from_preset": [],
        },
        "execution": {"elapsed_s": round(time.perf_counter() - started, 3)},
    }
    atomic_write_bytes(path / "manifest.json", S._json_bytes(manifest))
    return path
