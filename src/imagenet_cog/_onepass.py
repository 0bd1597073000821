"""One pass over a shard copy for several stores: each data file is read once, in order.

A copy shuffled across classes (the webdataset shards of ImageNet-21K) holds in every data
file images of every level, train and test. Built one store at a time, each store would read
every data file again. Here the images of all the stores are put in the copy's order (data
file, then offset or row), read and computed once, and each data file's features are kept per
store in ``<store>/.pass/`` as soon as the file is done: that record is what a killed pass
resumes from (per data file), checked by content (its own sha256, and its features file's)
before it is used. When every data file is done, each store's shards are written from those
records, in the split's order, exactly as a store built alone writes them, and its records
are removed as soon as its manifest is written. Records a pass killed between the two left in
a finished store are removed by the next run that meets the store, whether it reuses it or
skips it (:func:`remove_leftovers`).

Under ``torchrun`` the ranks split the data files, not the images: each rank reads a
contiguous run of them (balanced by images) and writes their records, and rank 0 assembles
the stores once every rank is done. The data files that share a partial batch (see
:func:`_plan`) go to the same rank.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np

from ._data.sources import in_split_order, location
from ._fileio import (
    FolderLock,
    FolderLockedError,
    atomic_write_bytes,
    file_sha256,
    loads_json,
)
from .datasets import ImageDataset

__all__ = ["PASS_FOLDER", "assemble", "remove_leftovers", "remove_records", "run_pass"]

#: The folder of a store that holds the one pass's record per data file while it runs.
PASS_FOLDER = ".pass"


def _record_name(path):
    return hashlib.sha256(str(path).encode()).hexdigest()[:24]


def _content_sha256(record):
    """sha256 of a record's fields but its own checksum, as canonical JSON."""
    kept = {k: v for k, v in record.items() if k != "record_sha256"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode("utf-8")).hexdigest()


def _record_done(job, path, indices):
    """True when the store holds this data file's record, made for this key and plan, and
    its bytes are the ones written: the record matches its own checksum and the features
    file its sha256 (a byte changed since is computed again, never stored)."""
    folder = job.path / PASS_FOLDER
    name = _record_name(path)
    try:
        record = loads_json((folder / f"{name}.json").read_text(encoding="utf-8"))
        return (
            record.get("file") == str(path)
            and record.get("key_sha256") == job.key_sha
            and record.get("indices") == indices
            and record.get("record_sha256") == _content_sha256(record)
            and file_sha256(folder / f"{name}.npy") == record.get("sha256")
        )
    except (OSError, ValueError, AttributeError):
        return False


def _write_record(job, path, indices, part):
    """Keep the features one store takes from one data file, and the images it skipped."""
    folder = job.path / PASS_FOLDER
    folder.mkdir(exist_ok=True)
    name = _record_name(path)
    if part["features"]:
        array = np.ascontiguousarray(np.concatenate(part["features"]), dtype=np.float32)
    else:
        array = np.zeros((0, 0), dtype=np.float32)
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getvalue()
    atomic_write_bytes(folder / f"{name}.npy", data)
    record = {
        "file": str(path),
        "key_sha256": job.key_sha,
        "indices": indices,
        "rows": [int(i) for r in part["rows"] for i in r],
        "skipped": part["skipped"],
        "truncated": part["truncated"],
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    record = json.loads(json.dumps(record))  # checksummed as it is read back
    record["record_sha256"] = _content_sha256(record)
    atomic_write_bytes(folder / f"{name}.json", json.dumps(record).encode("utf-8"))


def _plan(jobs, bs):
    """``(regular, tails, files)``.

    ``regular``: the images of the stores' full batches as ``(where, store, index)``;
    ``tails``: the last, partial batch of each store shard, as a store built alone reads
    it; ``files``: ``{data file: {store: sorted indices}}``. A network gives an image
    the same features in any batch of the same size (checked on the CPU), not in a batch
    of another size: the partial batches are computed as the store alone computes them.
    """
    regular, tails, files = [], [], {}
    for s, job in enumerate(jobs):
        split = job.split
        for k in job.shards:
            shard = []
            for i in range(*job.bounds(k)):
                where = location(split.sources[i])
                if where is None:
                    raise ValueError(
                        f"{split.ids[i]} is not in a shard copy: one pass reads webdataset "
                        "shards and Parquet files only"
                    )
                shard.append((where, s, i))
                files.setdefault(where[0], {}).setdefault(s, []).append(i)
            shard.sort()  # the order in which a store built alone reads it
            cut = len(shard) - len(shard) % bs
            regular += shard[:cut]
            if cut < len(shard):
                tails.append(shard[cut:])
    regular.sort()
    for per_store in files.values():
        for indices in per_store.values():
            indices.sort()
    return regular, tails, files


def _owners(files, tails, world):
    """``{data file: rank}``: contiguous runs of files of about as many images each.

    The files of one partial batch are computed by one rank, which keeps their records:
    they are kept together (a partial batch lies at the end of a store shard's reading
    order, so it joins at most a few neighbouring files).
    """
    names = sorted(files)
    parent = {f: f for f in names}

    def root(f):
        while parent[f] != f:
            parent[f] = parent[parent[f]]
            f = parent[f]
        return f

    for tail in tails:
        joined = sorted({w[0] for w, _, _ in tail})
        for f in joined[1:]:
            parent[root(f)] = root(joined[0])
    groups = {}
    for f in names:
        groups.setdefault(root(f), []).append(f)
    images = {f: sum(len(ix) for ix in files[f].values()) for f in names}
    total = max(1, sum(images.values()))
    owner, before = {}, 0
    for group in sorted(groups.values()):
        rank = min(world - 1, before * world // total)
        for f in group:
            owner[f] = rank
        before += sum(images[f] for f in group)
    return owner


def _new_part():
    return {"features": [], "rows": [], "skipped": [], "truncated": []}


def run_pass(jobs, extractor, *, progress=None, rank=0, world=1):
    """Compute the records of the data files of the store shards left in every job.

    With ``world`` processes each computes the records of its own data files. Once every
    process is done, :func:`assemble` writes the stores' shards.

    Parameters
    ----------
    jobs : list of StoreJob
        The stores, prepared (their run state written, their shards left to compute set) by
        the caller.
    extractor : FeatureExtractor
    progress : bool or tqdm bar, optional
    rank, world : int
        This process and the number of processes.

    Returns
    -------
    dict
        ``{"files": the data files and the images each store takes from them,
        "own": those this process computed (or found done), "files_resumed": those done by
        an earlier pass, "pillow_fallbacks": [[(index, reason)] per store]}``.
    """
    bs = int(extractor.batch_size)
    regular, tails, files = _plan(jobs, bs)
    own = files
    if world > 1:
        owner = _owners(files, tails, world)
        own = {f: per for f, per in files.items() if owner[f] == rank}
        regular = [x for x in regular if owner[x[0][0]] == rank]
        tails = [t for t in tails if owner[t[-1][0][0]] == rank]
    done = {
        f for f, per in own.items() if all(_record_done(jobs[s], f, ix) for s, ix in per.items())
    }
    regular = [x for x in regular if x[0][0] not in done]
    batches = [regular[a : a + bs] for a in range(0, len(regular), bs)]
    batches += [t for t in tails if any(x[0][0] not in done for x in t)]
    # Each batch when its last image is reached: the files are read in order, apart from the
    # partial batches (a few images at the end of each store shard's reading order).
    batches.sort(key=lambda b: b[-1][0])
    # (file, store kept, store, index); kept -1 for an image computed but not kept: a copy
    # filling the last batch to its size, or an image of a file an earlier pass finished.
    seq, spans = [], []
    for batch in batches:
        first = len(seq)
        seq += [(w[0], -1 if w[0] in done else s, s, i) for w, s, i in batch]
        if regular and batch[-1] == regular[-1] and len(batch) < bs:  # the last full batch
            seq += [(seq[-1][0], -1, seq[-1][2], seq[-1][3])] * (bs - len(batch))
        spans.append(list(range(first, len(seq))))
    names = sorted({f for f, kept, _, _ in seq if kept >= 0})
    file_id = {f: j for j, f in enumerate(names)}
    seq_file = np.array([file_id.get(x[0], -1) for x in seq], dtype=np.int64)
    seq_store = np.array([x[1] for x in seq], dtype=np.int64)
    seq_index = np.array([x[3] for x in seq], dtype=np.int64)
    left = np.bincount(seq_file[seq_store >= 0], minlength=len(names))
    splits = [job.split for job in jobs]
    dataset = ImageDataset(
        [splits[s].sources[i] for _, _, s, i in seq], [splits[s].ids[i] for _, _, s, i in seq]
    )
    pending = {}

    def part(j, s):
        return pending.setdefault(j, {}).setdefault(s, _new_part())

    fallbacks = [[] for _ in jobs]
    for indices, features, failed, notes, left_to_pillow in extractor.iter_batches(
        dataset, spans, progress=progress, desc="features (one pass)", for_store=True, by_file=True
    ):
        for gi, why in left_to_pillow:
            if seq_store[gi] >= 0:
                fallbacks[int(seq_store[gi])].append((int(seq_index[gi]), why))
        g = np.asarray(indices, dtype=np.int64)
        g_kept = g[seq_store[g] >= 0]
        if len(g_kept):
            feats = features[seq_store[g] >= 0]
            keys = seq_file[g_kept] * len(jobs) + seq_store[g_kept]
            for key in np.unique(keys):
                mask = keys == key
                entry = part(int(key) // len(jobs), int(key) % len(jobs))
                entry["features"].append(feats[mask])
                entry["rows"].append(seq_index[g_kept[mask]])
        failed = [(gi, why) for gi, why in failed if seq_store[gi] >= 0]
        for gi, why in failed:
            part(int(seq_file[gi]), int(seq_store[gi]))["skipped"].append([int(seq_index[gi]), why])
        for gi, why in notes:
            s, i = int(seq_store[gi]), int(seq_index[gi])
            if s >= 0:
                part(int(seq_file[gi]), s)["truncated"].append(
                    {"index": i, "id": splits[s].ids[i], "wnid": splits[s].labels[i], "note": why}
                )
        for gi in [*g_kept.tolist(), *(x for x, _ in failed)]:
            j = int(seq_file[gi])
            left[j] -= 1
            if left[j] == 0:  # the data file is done: its record, per store, is kept
                for s, indices_of in own[names[j]].items():
                    got = pending.get(j, {}).get(s) or _new_part()
                    _write_record(jobs[s], names[j], indices_of, got)
                pending.pop(j, None)
    if pending:  # pragma: no cover - the batches always complete their files
        raise RuntimeError(f"data files {sorted(names[j] for j in pending)} were not completed")
    return {"files": files, "own": own, "files_resumed": len(done), "pillow_fallbacks": fallbacks}


def assemble(jobs, files, write_shard):
    """Write every store's shards from the data files' records, as a store built alone.

    ``files`` is :func:`run_pass`'s ``"files"``; ``write_shard(job, k, entry, dim)`` is the
    store's own writer.

    Raises
    ------
    RuntimeError
        When a data file's record is missing (a rank did not finish it).
    """
    missing = [
        f
        for f, per in files.items()
        if not all(_record_done(jobs[s], f, ix) for s, ix in per.items())
    ]
    if missing:
        raise RuntimeError(
            f"{len(missing)} data file(s) were not computed by any process, among them "
            f"{missing[0]}: run the extraction again to resume them"
        )
    for s, job in enumerate(jobs):
        folder = job.path / PASS_FOLDER
        parts, dim = [], None
        for path in (f for f, per in files.items() if s in per):
            name = _record_name(path)
            record = loads_json((folder / f"{name}.json").read_text(encoding="utf-8"))
            features = np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
            if len(record["rows"]):
                dim = features.shape[1]
            parts.append((np.asarray(record["rows"], dtype=np.int64), features, record))
        for k in job.shards:
            start, stop = job.bounds(k)
            entry = {"features": [], "rows": [], "skipped": [], "truncated": []}
            for rows, features, record in parts:
                mask = (rows >= start) & (rows < stop)
                if mask.any():
                    entry["features"].append(np.asarray(features[mask]))
                    entry["rows"].append(rows[mask])
                entry["skipped"] += [(i, why) for i, why in record["skipped"] if start <= i < stop]
                entry["truncated"] += [
                    {key: t[key] for key in ("id", "wnid", "note")}
                    for t in record["truncated"]
                    if start <= t["index"] < stop
                ]
            entry["features"] = in_split_order(entry["rows"], entry["features"])
            entry["truncated"].sort(key=lambda t: t["id"])
            write_shard(job, k, entry, dim)


def remove_records(jobs):
    """Remove the one pass's records of finished stores (each as soon as its manifest is
    written: a pass killed after some stores finished leaves no copy of their features)."""
    for job in jobs:
        shutil.rmtree(job.path / PASS_FOLDER, ignore_errors=True)


def remove_leftovers(path):
    """Remove what a run killed after the store at ``path`` was finished left in it: the one
    pass's records (``.pass/``) and the state of the unfinished run (``run.json``), when no
    other process holds the store (a reader, a writer); they are then left for a later run.
    Returns True when the store was tidied.
    """
    path = Path(path)
    if not (path / PASS_FOLDER).is_dir() and not (path / "run.json").is_file():
        return False
    try:
        with FolderLock(path, "feature store"):
            if not (path / "manifest.json").is_file():  # unfinished: what a run resumes from
                return False
            shutil.rmtree(path / PASS_FOLDER, ignore_errors=True)
            (path / "run.json").unlink(missing_ok=True)
    except (FolderLockedError, OSError):  # held by another process, or read-only
        return False
    return True
