"""Feature stores of synthetic features, written with the library's store writer.

The scale benchmarks (and the tests of what they found) need stores of a million rows without
extracting a million images: this writes features given as arrays through the pieces an
extraction uses (a :class:`~imagenet_cog.store.StoreJob`, each checksummed shard written by
``_write_shard``, the rows and manifest by ``_write_manifest``), so that ``evaluate`` and
``analyze`` read them exactly as they read extracted ones. The store's origin says that no
network made them.
"""

from __future__ import annotations

import numpy as np

#: The weights a synthetic store records: no network made its features.
SYNTHETIC = "synthetic features: no network made them (a benchmark's store)"


def write_array_store(root, domain, split_name, labels, chunks, *, model, shard_size=10_000):
    """Write ``chunks`` (float32 arrays of rows, in order) as the store
    ``root/<domain>/<split_name>``, ``labels`` holding the wnid of every row (ordered by
    concept, as a split is). Returns the store's path."""
    from imagenet_cog import store as S
    from imagenet_cog.datasets import Split

    labels = np.asarray(labels).tolist()
    ids = [f"{w}/{w}_{i}.JPEG" for i, w in enumerate(labels)]
    split = Split(ids, labels, info={"domain": domain, "split": split_name})
    key = S._normalized(
        {"model": model, "domain": domain, "split": split_name, "split_sha256": split.checksum}
    )
    n = len(ids)
    layout = {"shard_size": shard_size, "n_images": n, "n_shards": -(-n // shard_size)}
    job = S.StoreJob(
        S.store_path(root, domain, split_name), split, key, S._sha256(S._json_bytes(key)), layout
    )
    job.path.mkdir(parents=True, exist_ok=True)
    split.save(job.path / "split.tsv")
    records, pending, held, dim = [], [], 0, 0
    for X in chunks:
        pending.append(np.ascontiguousarray(X, dtype=np.float32))
        held += len(pending[-1])
        dim = pending[-1].shape[1]
        while held >= shard_size or (held and len(records) * shard_size + held == n):
            block = np.concatenate(pending)
            rows, rest = block[:shard_size], block[shard_size:]
            entry = {"features": [rows], "skipped": [], "truncated": []}
            records.append(S._write_shard(job, len(records), entry, dim))
            pending, held = ([rest] if len(rest) else []), len(rest)
    if len(records) != job.n_shards:
        raise ValueError(f"{n} labels, but the chunks held another number of rows")
    origin = {"weights": SYNTHETIC, "differs_from_preset": []}
    S._write_manifest(job, records, origin, {"world_size": 1, "device": "none"})
    return job.path
