"""The feature store: the features of one (model, domain, split) in a folder.

Layout of a store ROOT (the protocol reads it through :func:`load_domain`)::

    ROOT/<domain>/<split>/      domain: "in1k", "L1".."L5" or a user's name
        split.tsv               the split manifest: image_id<TAB>wnid, all images
        shard-00000.npy         float32 (rows, d): features of shard 0's decoded images
        shard-00000.json        shard 0's record: rows, skipped images, bytes, sha256
        ...
        rows.tsv                image_id<TAB>wnid of each feature row, in order
        manifest.json           written last: its presence marks a complete store
        run.json                only while a run is unfinished: its key, to resume
        .pass/                  only while a one-pass run over a shard copy is unfinished

Shard ``k`` covers images ``k·shard_size`` to ``(k+1)·shard_size`` of the
split. Every file is written to a temporary name and renamed, so a killed run
leaves whole files only, and the next run starts at the first unfinished
shard. Its shards and manifest are then byte-identical to those of an
uninterrupted run, apart from the manifest's ``execution`` section (timings,
number of processes).

A store is reused only when its key (:meth:`FeatureExtractor.fingerprint`
plus the domain, the split and the split manifest's sha256) equals the
request; otherwise it raises :class:`StoreMismatchError`, or rebuilds with
``overwrite=True``. Nothing is ever unpickled: arrays are read with
``allow_pickle=False`` and metadata is JSON.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ._data.sources import in_split_order, read_order
from ._distributed import Ranks, wait_until_seen
from ._features.settings import going_on_with, stored_auto_settings
from ._fileio import TEMPORARY_RE, FolderLock, atomic_write_bytes, changed_settings, lock_holder
from ._sharded import ShardedArray
from ._storecheck import (
    CACHE_NAME,
    VERIFY_LEVELS,
    StoreCorruptError,
    check_files,
    check_pair,
    finished_shards,
    read_manifest,
    read_run_state,
    reuse_record,
)
from ._version import package_versions

if TYPE_CHECKING:
    from .datasets import Split

# Public names are exported by the package (imagenet_cog.__all__), not here.
__all__: list[str] = []

FORMAT = "imagenet_cog.features"
#: The version of the store layout and manifest, checked on every read: a store of another
#: version is refused with a message saying to extract it again.
FORMAT_VERSION = 2
#: Images per shard: 10,000 ResNet-50 features are 82 MB.
DEFAULT_SHARD_SIZE = 10_000
_SHARD_RE = re.compile(r"^shard-(\d{5,})\.(npy|json)$")


class StoreMismatchError(ValueError):
    """A store exists at the path but was made with other settings.

    :func:`~imagenet_cog.extract` raises it, naming the fields that differ, unless
    ``overwrite=True`` asks to rebuild the store.

    Examples
    --------
    >>> issubclass(StoreMismatchError, ValueError)
    True
    """


def store_path(root, domain, split):
    """``ROOT/<domain>/<split>``, the folder of one store.

    Examples
    --------
    >>> store_path("features", "L1", "train").as_posix()
    'features/L1/train'
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not domain or "/" in domain or "\\" in domain or domain in (".", ".."):
        raise ValueError(f"bad domain name {domain!r}")
    return Path(root) / domain / split


# ------------------------------------------------------------- small helpers
def _json_bytes(obj):
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def _normalized(obj):
    return json.loads(json.dumps(obj, sort_keys=True))


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _key_diff(stored, wanted):
    """The settings that differ, one ``  key: stored → requested`` line each."""
    return "\n".join(f"  {line}" for line in changed_settings(stored, wanted))


def _shard_name(k, ext):
    return f"shard-{k:05d}.{ext}"


# ------------------------------------------------------------------ store jobs
@dataclass
class StoreJob:
    """One store to build: made once, then consumed by the build (alone or in one pass over a
    copy) and by the finalisation.

    Attributes
    ----------
    path : pathlib.Path
    split : Split
    key, key_sha : dict, str
        What shapes the features (the extractor's fingerprint, the domain, the split and the
        split manifest's sha256), as JSON reads it back, and its sha256 (in every shard record).
    layout : dict
        ``{"shard_size", "n_images", "n_shards"}``.
    overwrite : bool
    lock : FolderLock or None
        The store's lock, held by rank 0 while it writes.
    started : float
        When the build started, for the manifest's elapsed time.
    shards, resumed : list of int, int
        Once the store is prepared: the store shards left to compute, and how many an
        earlier run finished.
    """

    path: Path
    split: Split
    key: dict
    key_sha: str
    layout: dict
    overwrite: bool = False
    lock: FolderLock | None = None
    started: float = field(default_factory=time.perf_counter)
    shards: list = field(default_factory=list)
    resumed: int = 0

    @classmethod
    def make(cls, path, extractor, split, shard_size, **kwargs):
        """The job of the store of ``split`` at ``path``, its key made from ``extractor``."""
        key = {
            **extractor.fingerprint(),
            "domain": split.info.get("domain", ""),
            "split": split.info.get("split", ""),
            "split_sha256": split.checksum,
        }
        key = _normalized(key)
        n = len(split)
        layout = {"shard_size": int(shard_size), "n_images": n, "n_shards": -(-n // shard_size)}
        return cls(Path(path), split, key, _sha256(_json_bytes(key)), layout, **kwargs)

    @property
    def shard_size(self):
        """Images per store shard."""
        return self.layout["shard_size"]

    @property
    def n_shards(self):
        """The number of store shards."""
        return self.layout["n_shards"]

    def bounds(self, k):
        """``(start, stop)``: the split's images in store shard ``k``."""
        return k * self.shard_size, min((k + 1) * self.shard_size, len(self.split))


# ------------------------------------------------------------------ writing
def _clear(path, *, everything):
    """Remove temporary files, and with ``everything`` all the store's own files."""
    if not path.is_dir():
        return
    own = {"manifest.json", "run.json", "rows.tsv", "split.tsv", CACHE_NAME}
    for entry in os.scandir(path):
        if TEMPORARY_RE.match(entry.name) or (
            everything and (entry.name in own or _SHARD_RE.match(entry.name))
        ):
            os.unlink(entry.path)


def _reopen_damaged(path, manifest, key, lock):
    """Turn a complete store whose files fail their check back into an unfinished run: the
    next run keeps the shards that match their records and recomputes the others."""
    lock.acquire()
    size, n = int((manifest.get("layout") or {}).get("shard_size", 0)), manifest.get("n_images")
    layout = {"shard_size": size, "n_images": n, "n_shards": len(manifest["shards"])}
    atomic_write_bytes(path / "run.json", _json_bytes({"key": key, "layout": layout}))
    for name in ("manifest.json", "rows.tsv", CACHE_NAME):
        (path / name).unlink(missing_ok=True)


def _note_reuse(path, manifest, info):
    """Refuse or record (:func:`reuse_record`) a complete store reused for another root."""
    problem, updated = reuse_record(manifest, info)
    if problem is not None:
        raise StoreMismatchError(f"{path} {problem}: give another --out, or pass --overwrite")
    if updated is not None:
        atomic_write_bytes(path / "manifest.json", _json_bytes(updated))


def _prepare(job):
    """On rank 0: reuse, resume or start the store. Returns ``"done"`` or ``"run"``."""
    path, key, layout = job.path, job.key, job.layout
    manifest = path / "manifest.json"
    run = path / "run.json"
    if job.overwrite:
        _clear(path, everything=True)
    elif manifest.is_file():
        stored = read_manifest(manifest, FORMAT, FORMAT_VERSION)
        if _normalized(stored["key"]) != _normalized(key):
            raise StoreMismatchError(
                f"{path} holds features made with other settings (stored → requested); pass "
                "overwrite=True (--overwrite) to rebuild it, or choose another folder:\n"
                f"{_key_diff(stored['key'], _normalized(key))}"
            )
        try:
            open_store(path, verify="cached")  # a damaged store is not reused silently
        except StoreCorruptError as exc:
            _reopen_damaged(path, stored, _normalized(key), job.lock)
            raise StoreCorruptError(
                f"{exc}; the store is now marked unfinished: run the same extraction again "
                "to recompute what does not match"
            ) from None
        from ._onepass import PASS_FOLDER

        if (path / PASS_FOLDER).is_dir() or run.is_file():  # a run killed once it was written
            job.lock.acquire()
            shutil.rmtree(path / PASS_FOLDER, ignore_errors=True)
            run.unlink(missing_ok=True)
        _note_reuse(path, stored, job.split.info)
        return "done"
    elif run.is_file():
        stored = read_run_state(run)
        if _normalized(stored.get("key")) != _normalized(key):
            raise StoreMismatchError(
                f"{path} holds an unfinished run with other settings (stored → requested); "
                "pass overwrite=True (--overwrite) to start over:\n"
                f"{_key_diff(stored.get('key') or {}, _normalized(key))}"
            )
        if stored.get("layout") != layout:
            raise StoreMismatchError(
                f"{path} holds an unfinished run with shards of "
                f"{(stored.get('layout') or {}).get('shard_size')} images, not {job.shard_size}; "
                "resume it with the same shard size, or pass overwrite=True"
            )
    path.mkdir(parents=True, exist_ok=True)
    _clear(path, everything=False)  # temporary files of a killed run
    job.split.save(path / "split.tsv")
    if not run.is_file():
        atomic_write_bytes(run, _json_bytes({"key": key, "layout": layout}))
    return "run"


def _write_shard(job, k, entry, dim):
    """Write store shard ``k`` of ``job`` (its features, then its record) from ``entry``."""
    path, (start, stop) = job.path, job.bounds(k)
    if entry["features"]:
        array = np.ascontiguousarray(np.concatenate(entry["features"]), dtype=np.float32)
    else:
        array = np.zeros((0, dim or 0), dtype=np.float32)
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getvalue()
    atomic_write_bytes(path / _shard_name(k, "npy"), data)
    record = {
        "shard": k,
        "start": start,
        "stop": stop,
        "rows": int(array.shape[0]),
        "dim": int(array.shape[1]),
        "file": _shard_name(k, "npy"),
        "bytes": len(data),
        "sha256": _sha256(data),
        "skipped": [{"index": i, "reason": why} for i, why in sorted(entry["skipped"])],
        "truncated": entry["truncated"],
        "key_sha256": job.key_sha,
    }
    atomic_write_bytes(path / _shard_name(k, "json"), _json_bytes(record))
    return record


def build_store(
    path,
    extractor,
    split,
    *,
    shard_size=DEFAULT_SHARD_SIZE,
    overwrite=False,
    progress=None,
):
    """Extract the features of a split into a store folder, resuming if possible.

    Under an initialized ``torch.distributed`` group (``torchrun``), each
    process computes the shards ``k`` with ``k % world_size == rank`` and rank
    0 writes the manifest after a barrier. A single process never touches
    ``torch.distributed``.

    Parameters
    ----------
    path : path
        The store folder, ``ROOT/<domain>/<split>`` (:func:`store_path`).
    extractor : FeatureExtractor
    split : Split
        From :func:`imagenet_cog.make_split`.
    shard_size : int
        Images per shard.
    overwrite : bool
        Rebuild a store made with other settings instead of raising.
    progress : bool, optional
        Show a progress bar; defaults to the extractor's ``progress``.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    StoreMismatchError
        When ``path`` holds a store (or an unfinished run) whose key differs
        from this request, and ``overwrite`` is false.
    imagenet_cog._fileio.FolderLockedError
        When another run is building the store at ``path`` (it holds the
        folder's lock, ``path/.lock``, until it ends or dies).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from PIL import Image
    >>> from imagenet_cog import FeatureExtractor, Levels, make_split, open_store
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "images" / "n00000001").mkdir(parents=True)
    >>> for i in range(5):
    ...     Image.new("RGB", (20, 20), (50 * i, 9, 9)).save(root / "images" / "n00000001" / f"x{i}.JPEG")
    >>> split = make_split(root / "images", "L1", "train", Levels([["n00000001"]]), n_test=1)
    >>> extractor = FeatureExtractor("torchvision:resnet18", preprocessing={"size": 16})
    >>> path = build_store(root / "store", extractor, split, shard_size=2, progress=False)
    >>> len(open_store(path)), len(open_store(path).manifest["shards"])
    (4, 2)
    """
    started = time.perf_counter()
    path = Path(path)
    if not isinstance(shard_size, (int, np.integer)) or shard_size < 1:
        raise ValueError(f"shard_size must be a positive integer, got {shard_size!r}")
    if len(split) == 0:
        raise ValueError("the split has no images")
    group = Ranks.current()
    # One run owns the store: rank 0 holds its lock while the ranks of this run
    # write their shards; another run's rank 0 is refused at once, and its
    # other ranks learn it through the broadcast below.
    lock = FolderLock(path, "feature store") if group.rank == 0 else None
    try:
        with _decoder_of_store(path, extractor, overwrite):
            job = StoreJob.make(
                path, extractor, split, shard_size, overwrite=overwrite, lock=lock, started=started
            )
            return _build(job, extractor, group, progress)
    finally:
        if lock is not None:
            lock.release()


def _stored_decoder(path):
    """The decoder and resize of the store, or of the unfinished run, at ``path``; ``None``
    if neither."""
    try:
        if (path / "manifest.json").is_file():
            key = read_manifest(path / "manifest.json", FORMAT, FORMAT_VERSION)["key"]
        elif (path / "run.json").is_file():
            key = read_run_state(path / "run.json")["key"]
        else:
            return None
    except (OSError, StoreCorruptError):
        return None  # _prepare reports it
    return stored_auto_settings(key)


def _decoder_of_store(path, extractor, overwrite):
    """Under ``"auto"``, go on with the decoder and resize the store at ``path`` was
    started with (:func:`going_on_with`)."""
    return going_on_with(None if overwrite else _stored_decoder(path), path, extractor)


def build_stores(jobs, extractor, *, shard_size=DEFAULT_SHARD_SIZE, overwrite=False, progress=None):
    """Build the stores of several splits of one shard copy, reading each data file once.

    Each store ends as :func:`build_store` makes it alone (same shards, rows and manifest
    apart from its ``execution`` section); a killed pass resumes per data file. Under
    ``torchrun`` the processes split the data files, each reading its own, and rank 0
    writes the stores. When the stores were started with different decoders, they are
    built one after the other.

    Parameters
    ----------
    jobs : list of (path, Split)
        Splits whose images all lie in webdataset shards or Parquet files.
    extractor : FeatureExtractor
    shard_size : int
    overwrite : bool
    progress : bool or tqdm bar, optional

    Returns
    -------
    list of pathlib.Path
    """
    from . import _onepass

    started = time.perf_counter()
    jobs = [(Path(p), split) for p, split in jobs]
    group = Ranks.current()
    decoders = {json.dumps(_stored_decoder(p), sort_keys=True) for p, _ in jobs} - {"null"}
    if len(decoders) > 1 or len(jobs) < 2:
        kwargs = {"shard_size": shard_size, "overwrite": overwrite, "progress": progress}
        return [build_store(p, extractor, split, **kwargs) for p, split in jobs]
    first = next((p for p, _ in jobs if _stored_decoder(p) is not None), jobs[0][0])
    stores = []
    try:
        with _decoder_of_store(first, extractor, overwrite):
            for path, split in jobs:  # rank 0 holds each store's lock while it writes
                lock = FolderLock(path, "feature store") if group.rank == 0 else None
                kwargs = {"overwrite": overwrite, "lock": lock, "started": started}
                stores.append(StoreJob.make(path, extractor, split, shard_size, **kwargs))
            todo = _prepare_stores(stores, group)
            ran = group.run(
                lambda: _onepass.run_pass(
                    todo,
                    extractor,
                    progress=progress if group.rank == 0 else False,
                    rank=group.rank,
                    world=group.world,
                ),
                f"computing the features of {jobs[0][1].info.get('data_root')}",
            )

            def write_stores():  # every rank's data files are done: rank 0 writes the stores
                _onepass.assemble(todo, ran["files"], _write_shard, group.world)
                for job, fallbacks in zip(todo, ran["pillow_fallbacks"]):
                    _finalize(job, extractor, group, fallbacks)
                    _onepass.remove_records([job])  # finished: its records go at once

            group.run(write_stores if group.rank == 0 else lambda: None, "writing the stores")
    finally:
        for job in stores:
            if job.lock is not None:
                job.lock.release()
    return [p for p, _ in jobs]


def _prepare_stores(stores, group):
    """The stores left to compute, their shards set, as :func:`_onepass.run_pass` takes them.

    Rank 0 reuses, resumes or starts each store (taking its lock) and tells the other ranks
    which store shards are left.
    """
    # [error, then per store: 1 when reused, and a flag per store shard left to compute]
    flags, error = [0], None
    if group.rank == 0:
        try:
            for job in stores:
                if len(job.split) == 0:
                    raise ValueError(f"{job.path}: the split has no images")
                if job.overwrite or not (job.path / "manifest.json").is_file():
                    job.lock.acquire()  # reusing a complete store writes nothing
                if _prepare(job) == "done":
                    flags += [1] + [0] * job.n_shards
                    continue
                shards = range(job.n_shards)
                done = finished_shards(job.path, job.key_sha, job.n_shards, verify=shards)
                flags += [0] + [int(k not in done) for k in shards]
        except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the others
            error, flags = exc, [1]
    size = 1 + sum(1 + job.n_shards for job in stores)
    flags = group.broadcast(flags + [0] * (size - len(flags)))
    if error is not None:
        raise error
    if flags[0]:
        raise RuntimeError(
            f"rank 0 could not prepare the stores at {stores[0].path.parent}; see its error"
        )
    todo, at = [], 1
    for job in stores:
        reused, left = flags[at], flags[at + 1 : at + 1 + job.n_shards]
        at += 1 + job.n_shards
        if reused:
            continue
        job.shards = [k for k, t in enumerate(left) if t]
        job.resumed = job.n_shards - len(job.shards)
        todo.append(job)
    same = group.rank == 0 or all(
        _normalized(read_run_state(job.path / "run.json")["key"]) == job.key for job in todo
    )
    if not group.all_ok(same):  # every process must compute the same features
        raise RuntimeError(
            "the processes disagree on the model weights, preprocessing or splits: rank "
            f"{group.rank} computed keys {', '.join(job.key_sha[:12] for job in todo)}"
        )
    return todo


def _build(job, extractor, group, progress):
    """Reuse, resume or compute the store of ``job``; returns its path."""
    path, split = job.path, job.split
    state, error = "run", None
    if group.rank == 0:
        try:
            if job.overwrite or not (path / "manifest.json").is_file():
                job.lock.acquire()  # reusing a complete store writes nothing: no lock needed
            state = _prepare(job)
        except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the others
            error = exc
    code = group.broadcast([{"run": 0, "done": 1}[state] if error is None else 2])[0]
    if error is not None:
        raise error
    if code == 2:
        raise RuntimeError(f"rank 0 could not prepare the store at {path}; see its error")
    if code == 1:
        return path
    if group.rank != 0:  # every process must compute the same features
        stored = read_run_state(path / "run.json")
        same = _normalized(stored["key"]) == job.key
    else:
        same = True
    if not group.all_ok(same):
        raise RuntimeError(
            "the processes disagree on the model weights, preprocessing or split: "
            f"rank {group.rank} computed key {job.key_sha[:12]}"
        )

    # Each process checks the bytes of the finished shards it owns: a shard damaged after it
    # was written is computed again, not carried into the manifest.
    n_shards = job.n_shards
    own = {k for k in range(n_shards) if k % group.world == group.rank}
    done = finished_shards(path, job.key_sha, n_shards, verify=own)
    job.shards = [k for k in sorted(own) if k not in done]
    job.resumed = len(done)
    bs = int(extractor.batch_size)
    batches = []
    for k in job.shards:  # each store shard reads its data files forward (a copy's shards)
        order = read_order(split.sources, *job.bounds(k))
        batches += [order[i : i + bs] for i in range(0, len(order), bs)]
    show = extractor.progress if progress is None else progress
    dataset = split.dataset()
    what = "/".join(str(split.info[k]) for k in ("domain", "split") if k in split.info)
    bar = show if group.rank == 0 else False
    already = len(split) - sum(len(b) for b in batches)
    if bar is True and group.world == 1 and already:  # a resumed store: the bar starts there
        from tqdm.auto import tqdm

        label = f"{what or 'features'} (resumed, {already} done)"
        bar = tqdm(total=len(split), initial=already, unit="img", smoothing=0.1, desc=label)
    try:
        fallbacks = group.run(
            lambda: _compute_shards(job, extractor, dataset, batches, bar),
            f"computing the features of {path}",
        )
    finally:
        if hasattr(bar, "close") and bar is not show:
            bar.close()
    group.run(
        lambda: _finalize(job, extractor, group, fallbacks) if group.rank == 0 else None,
        f"writing the manifest of {path}",
    )
    return path


def _compute_shards(job, extractor, dataset, batches, bar):
    """Compute the store shards of ``batches`` and write each as it completes.

    Returns the ``(index, reason)`` of the images the tensor decoder left to Pillow.
    """
    split, pending, dim, fallbacks = job.split, {}, None, []
    what = "/".join(str(split.info[k]) for k in ("domain", "split") if k in split.info)
    for indices, features, failed, notes, left_to_pillow in extractor.iter_batches(
        dataset,
        batches,
        progress=bar,
        desc=what or "features",
        for_store=True,
        by_file=True,
    ):
        fallbacks += left_to_pillow
        first = int(indices[0]) if len(indices) else failed[0][0]
        k = first // job.shard_size
        entry = pending.setdefault(
            k, {"features": [], "rows": [], "skipped": [], "truncated": [], "seen": 0}
        )
        entry["truncated"] += [
            {"id": split.ids[i], "wnid": split.labels[i], "note": why} for i, why in notes
        ]
        if features is not None:
            entry["features"].append(features)
            entry["rows"].append(indices)
            dim = features.shape[1]
        entry["skipped"] += failed
        entry["seen"] += len(indices) + len(failed)
        start, stop = job.bounds(k)
        if entry["seen"] == stop - start:
            entry["features"] = in_split_order(entry["rows"], entry["features"])
            entry["truncated"].sort(key=lambda t: t["id"])  # read order is not split order
            _write_shard(job, k, entry, dim)
            del pending[k]
    if pending:  # pragma: no cover - the batches always complete their shards
        raise RuntimeError(f"shards {sorted(pending)} were not completed")
    return fallbacks


def _finalize(job, extractor, group, fallbacks):
    """Write the store's rows and manifest once every shard is done (``fallbacks``: this
    process's images that the tensor decoder left to Pillow)."""
    path, split = job.path, job.split
    done = {}

    def missing_shards():
        done.update(finished_shards(path, job.key_sha, job.n_shards))
        return [k for k in range(job.n_shards) if k not in done]

    # The shards of other machines may show late on a network filesystem.
    missing = wait_until_seen(missing_shards, group.world)
    if missing:
        raise RuntimeError(f"{path}: shards {missing[:10]} are missing after all processes ended")
    loaded = extractor._load()
    execution = {
        "world_size": group.world,
        "device": str(loaded["device"]),
        "batch_size": int(extractor.batch_size),
        "num_workers": extractor._workers(loaded["device"]),
        "channels_last": bool(extractor.channels_last),
        "decoder": extractor._decoder_name(loaded["device"]),
        "resize": extractor._resize_name(loaded["device"]),
        "tf32": bool(extractor.tf32),
        # This process's check of the workers' JPEG decoder against Pillow.
        "jpeg_decoder_check": getattr(extractor, "jpeg_check_", None),
        # This process's images that the tensor decoder left to Pillow.
        "pillow_fallbacks": [{"id": split.ids[i], "reason": why} for i, why in fallbacks],
        # This process's first tensor-decoded images against the Pillow path.
        "decoder_check": getattr(extractor, "decoder_check_", None),
        "feature_check": getattr(extractor, "feature_check_", None),
        "shards_resumed": job.resumed,
    }
    # Random weights, and settings other than the architecture's preset (comparability).
    _write_manifest(job, [done[k] for k in range(job.n_shards)], loaded["origin"], execution)
    (path / "run.json").unlink(missing_ok=True)


def _write_manifest(job, records, origin, execution):
    """Write ``rows.tsv`` and, last, ``manifest.json`` of ``job`` from its shard ``records``:
    what made the features (``origin``) and how (``execution``, to which the finish time and
    the elapsed time are added)."""
    path, split = job.path, job.split
    dims = {r["dim"] for r in records if r["rows"]}
    if len(dims) > 1:
        raise RuntimeError(f"{path}: shards have different widths {sorted(dims)}")
    dim = dims.pop() if dims else 0
    skipped_index = {s["index"]: s["reason"] for r in records for s in r["skipped"]}
    rows, skipped = [], []
    for i, (image_id, wnid) in enumerate(zip(split.ids, split.labels)):
        if i in skipped_index:
            skipped.append({"id": image_id, "wnid": wnid, "reason": skipped_index[i]})
        else:
            rows.append(f"{image_id}\t{wnid}")
    n_rows = sum(r["rows"] for r in records)
    if n_rows != len(rows):
        raise RuntimeError(f"{path}: {n_rows} feature rows for {len(rows)} decoded images")
    rows_bytes = ("\n".join(["image_id\twnid", *rows]) + "\n").encode("utf-8")
    atomic_write_bytes(path / "rows.tsv", rows_bytes)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "key": job.key,
        "n_images": len(split),
        "n_rows": n_rows,
        "dim": dim,
        "dtype": "float32",
        "split": {"file": "split.tsv", "sha256": split.checksum, **split.info},
        "rows": {"file": "rows.tsv", "sha256": _sha256(rows_bytes)},
        "shards": [
            {"file": r["file"], "rows": r["rows"], "bytes": r["bytes"], "sha256": r["sha256"]}
            for r in records
        ],
        "skipped": skipped,
        "truncated": [t for r in records for t in r.get("truncated", [])],
        "layout": {"shard_size": job.shard_size},
        "versions": package_versions("torch", "numpy", "pillow", "torchvision"),
        "origin": origin,
        "execution": {
            **execution,
            "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "elapsed_s": round(time.perf_counter() - job.started, 3),
        },
    }
    atomic_write_bytes(path / "manifest.json", _json_bytes(manifest))


# ------------------------------------------------------------------ reading
class FeatureStore:
    """A complete store, opened by :func:`open_store`.

    Parameters
    ----------
    path : pathlib.Path
        The store folder.
    manifest : dict
        The parsed ``manifest.json``.
    features : ShardedArray
        ``(n, d)`` float32, memory-mapped.
    ids : ndarray of str
        The image id of each row.
    labels : ndarray of str
        The wnid of each row.

    Attributes
    ----------
    path, manifest, features, ids, labels
        As given.
    key : dict
        What shaped the features (model, weights, layer, preprocessing...).
    skipped : list of dict
        ``{"id", "wnid", "reason"}`` of the images that could not be decoded.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from PIL import Image
    >>> from imagenet_cog import Levels, extract
    >>> from imagenet_cog import open_store
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "images" / "n00000001").mkdir(parents=True)
    >>> for i in range(3):
    ...     Image.new("RGB", (20, 20), (80 * i, 9, 9)).save(root / "images" / "n00000001" / f"x{i}.JPEG")
    >>> _ = (root / "images" / "n00000001" / "bad.JPEG").write_bytes(b"not a JPEG")
    >>> path = extract("torchvision:resnet18", root / "images", "L1", "train", root / "features",
    ...                Levels([["n00000001"]]), n_test=1, preprocessing={"size": 16}, progress=False)
    >>> store = open_store(path)
    >>> len(store), store.features.shape, store.key["model"], len(store.skipped)
    (2, (2, 512), 'torchvision:resnet18', 1)
    """

    def __init__(self, path, manifest, features, ids, labels):
        self.path = Path(path)
        self.manifest = manifest
        self.key = manifest["key"]
        self.features = features
        self.ids = ids
        self.labels = labels
        self.skipped = manifest["skipped"]

    def __len__(self):
        return len(self.ids)

    def __repr__(self):
        k = self.key
        return (
            f"FeatureStore({k.get('domain')}/{k.get('split')}: {len(self)} x {self.features.dim}, "
            f"model={k.get('model')!r}, {len(self.skipped)} skipped)"
        )


def open_store(path, *, verify="cached", manifest=None):
    """Open a complete feature store, memory-mapped.

    Parameters
    ----------
    path : path
        A store folder, ``ROOT/<domain>/<split>``.
    verify : {"cached", "sha256", "size", None}
        How much to check. The manifest's structure, the order of its shard
        records, the rows file and each array's shape and dtype are always
        checked. ``"size"`` also checks each shard's size; ``"cached"`` (the
        default) also checks the sha256 of every file against the manifest
        once per file version: the result is kept in ``.verified.json`` in
        the store, keyed by each file's size, mtime, ctime and inode, so
        later opens only ``stat`` the files; ``"sha256"`` hashes every file
        every time, whatever the cache says; ``None`` checks nothing more.
    manifest : dict, optional
        The store's parsed ``manifest.json``, when the caller has read it already (its
        structure and format version checked): it is not read again.

    Returns
    -------
    FeatureStore

    Raises
    ------
    FileNotFoundError
        When there is no complete store at ``path``.
    StoreCorruptError
        A ``ValueError`` naming the file and what is wrong: a damaged
        manifest, a missing file, a file that does not match the manifest.

    Examples
    --------
    >>> open_store("no/such/store")
    Traceback (most recent call last):
    ...
    FileNotFoundError: no feature store at no/such/store
    """
    path = Path(path)
    if verify is False:
        verify = None
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        if (path / "run.json").is_file():
            if (holder := lock_holder(path)) is not None:
                raise FileNotFoundError(
                    f"the store at {path} is unfinished: an extraction is "
                    f"still writing it (PID {holder}); wait for it to end"
                )
            raise FileNotFoundError(
                f"the store at {path} is unfinished (a run was interrupted); run the same "
                "extraction again to resume it"
            )
        raise FileNotFoundError(f"no feature store at {path}")
    if manifest is None:
        manifest = read_manifest(manifest_path, FORMAT, FORMAT_VERSION)
    records = manifest["shards"]
    check_files(
        path,
        [
            ("split.tsv", None, manifest["split"]["sha256"]),
            ("rows.tsv", None, manifest["rows"]["sha256"]),
            *((r["file"], r["bytes"], r["sha256"]) for r in records),
        ],
        verify,
    )
    rows_file = path / "rows.tsv"
    lines = rows_file.read_bytes().decode("utf-8", "replace").splitlines()
    if not lines or lines[0] != "image_id\twnid":
        raise StoreCorruptError(f"{rows_file}: the first line must be 'image_id<TAB>wnid'")
    pairs = [x.split("\t") for x in lines[1:]]
    bad = next((n for n, p in enumerate(pairs, start=2) if len(p) != 2), None)
    if bad is not None:
        raise StoreCorruptError(f"{rows_file}:{bad}: expected 'image_id<TAB>wnid'")
    ids = np.array([p[0] for p in pairs], dtype=str)
    labels = np.array([p[1] for p in pairs], dtype=str)
    if len(ids) != manifest["n_rows"]:
        raise StoreCorruptError(
            f"{rows_file}: {len(ids)} rows, the manifest says {manifest['n_rows']}"
        )
    dim = manifest["dim"]
    shards = []
    for record in records:
        file = path / record["file"]
        if not file.is_file():
            raise StoreCorruptError(f"{path}: shard {record['file']} is missing")
        if record["rows"] == 0:
            continue
        try:
            array = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise StoreCorruptError(f"{file}: not a readable .npy array ({exc})") from None
        if array.dtype != np.float32 or array.shape != (record["rows"], dim):
            raise StoreCorruptError(
                f"{file}: {array.dtype} {array.shape}, the manifest says float32 "
                f"({record['rows']}, {dim})"
            )
        shards.append(array)
    features = ShardedArray(shards, dim)
    return FeatureStore(path, manifest, features, ids, labels)


def _domain_order(name):
    if name == "in1k":
        return (0, 0, name)
    m = re.fullmatch(r"L(\d+)", name)
    return (1, int(m.group(1)), name) if m else (2, 0, name)


def list_domains(root):
    """The domains of a store ROOT with complete ``train`` and ``test`` stores.

    ``"in1k"`` first, then the levels in order, then other names sorted.

    Parameters
    ----------
    root : path
        A store ROOT (``ROOT/<domain>/<split>/``).

    Returns
    -------
    list of str

    Examples
    --------
    >>> import tempfile
    >>> list_domains(tempfile.mkdtemp())
    []
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no feature store ROOT at {root}")
    found = [
        e.name
        for e in os.scandir(root)
        if e.is_dir()
        and all((Path(e.path) / s / "manifest.json").is_file() for s in ("train", "test"))
    ]
    return sorted(found, key=_domain_order)


def load_domain(root, domain, *, verify="cached", mmap=False):
    """The train and test features of one domain, ready for a probe.

    Parameters
    ----------
    root : path
        A store ROOT.
    domain : str
        ``"in1k"``, ``"L1"``...
    verify : {"cached", "sha256", "size", None}
        How much of the stores to check, see :func:`open_store`.
    mmap : bool
        Return :class:`ShardedArray` views instead of in-memory arrays.

    Returns
    -------
    X_train : ndarray of shape (n_train, d), float32
    y_train : ndarray of str
        wnids.
    X_test : ndarray of shape (n_test, d), float32
    y_test : ndarray of str

    Raises
    ------
    ValueError
        When the train and test features come from different models or
        settings.

    Examples
    --------
    Two tiny concepts of four images, a level holding them, and a network
    with random weights:

    >>> import pathlib, tempfile
    >>> from PIL import Image
    >>> from imagenet_cog import Levels, extract
    >>> from imagenet_cog import load_domain
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for w in ("n00000001", "n00000002"):
    ...     (root / "images" / w).mkdir(parents=True)
    ...     for i in range(4):
    ...         Image.new("RGB", (20, 20), (60 * i, 90, 30)).save(root / "images" / w / f"{w}_{i}.JPEG")
    >>> level = Levels([["n00000001", "n00000002"]])
    >>> for split in ("train", "test"):
    ...     _ = extract("torchvision:resnet18", root / "images", "L1", split, root / "features",
    ...                 level, n_test=1, preprocessing={"size": 16}, progress=False)
    >>> X_train, y_train, X_test, y_test = load_domain(root / "features", "L1")
    >>> X_train.shape, y_test.tolist()
    ((6, 512), ['n00000001', 'n00000002'])
    """
    train = open_store(store_path(root, domain, "train"), verify=verify)
    test = open_store(store_path(root, domain, "test"), verify=verify)
    check_pair(train.key, test.key, f"{domain} in {root}")
    if mmap:
        return train.features, train.labels, test.features, test.labels
    return np.asarray(train.features), train.labels, np.asarray(test.features), test.labels
