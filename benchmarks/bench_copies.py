"""Listing and reading a webdataset shard copy against the folder layout, in the same run.

The same synthetic JPEGs (``--images`` of them, ``--concepts`` concepts, ``--side`` px) are
written twice: a folder per wnid, and webdataset shards in timm's layout (``<key>.cls``,
``<key>.jpg``, ``<key>.json`` per sample, shuffled across classes, ``--shards`` shards).
Printed:

* listing: samples listed per second, the folder layout, the shards read from their headers
  (no cache), and the shards again from the listing cache; the ratio;
* tar headers: members read per second from the shards' headers by the package's tar reader
  (one ``pread`` per header, every check of a tar per wnid and of a shard) and by Python's
  ``tarfile`` (names, offsets and sizes of the regular members), best of three; the ratio;
* reading: images read and decoded per second through :class:`~imagenet_cog.ImageDataset`
  (one process, the split's order: by concept, random access into the shards), both layouts;
  the ratio;
* with ``--stores``: four stores (two levels, train and test) of the shard copy built store
  after store and in one pass (``build_stores``): seconds, data-file opens, the ratio; the
  network is a random ResNet-18 on 32 px inputs, so reading and decoding weigh as they do
  on a GPU;
* with ``--workers N`` (and ``--stores``): the one pass again with N DataLoader workers, the
  workers sharing out the batches in turn (the DataLoader's own way) and sharing out the data
  files (this library's): seconds, data-file opens over all the workers, the ratio;
* the projected time to list the 13.7M-sample Fall 2011 shard copy from the header rate
  (extrapolated: header reading is bound by the file system's metadata reads, so a network
  file system lists more slowly than the local disk measured here).

Run: ``python benchmarks/bench_copies.py [--images 4000] [--shards 8] [--stores] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

FALL2011_SAMPLES = 13_700_000


def _jpeg(rng, side):
    pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--concepts", type=int, default=20)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--stores", action="store_true", help="also time the one pass")
    parser.add_argument(
        "--workers", type=int, default=0, help="also time the one pass with N workers"
    )
    args = parser.parse_args()
    from copyfiles import write_shards

    from imagenet_cog._data.folders import list_images
    from imagenet_cog._data.listing import list_copy
    from imagenet_cog.datasets import ImageDataset

    rng = np.random.default_rng(0)
    wnids = [f"n{10_000_000 + i:08d}" for i in range(args.concepts)]
    blobs = [_jpeg(rng, args.side) for _ in range(64)]
    images = {
        f"{wnids[i % args.concepts]}/{wnids[i % args.concepts]}_{i}.JPEG": blobs[i % 64]
        for i in range(args.images)
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["IMAGENET_COG_CACHE"] = str(tmp / "cache")
        for image_id, data in images.items():
            (tmp / "folders" / image_id).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "folders" / image_id).write_bytes(data)
        paths = write_shards(tmp / "wds", images, n_shards=args.shards)

        t = time.perf_counter()
        folders = list_images(tmp / "folders", wnids)
        t_folders = time.perf_counter() - t
        t = time.perf_counter()
        shards, _ = list_copy(tmp / "wds", wnids)
        t_headers = time.perf_counter() - t
        t = time.perf_counter()
        list_copy(tmp / "wds", wnids)
        t_cached = time.perf_counter() - t
        members, t_reader, t_tarfile = _time_tar_headers(paths)
        assert {w: sorted(v) for w, v in folders.items()} == {
            w: sorted(v) for w, v in shards.items()
        }

        def read_all(listing):
            sources = [s for w in wnids for _, s in sorted(listing[w].items())]
            ds = ImageDataset(sources)
            t = time.perf_counter()
            for i in range(len(ds)):
                ds._load_checked(i)  # read and decode, as the extraction does
            return time.perf_counter() - t

        r_folders, r_shards = read_all(folders), read_all(shards)
        passes = _time_stores(tmp / "wds", wnids) if args.stores else None
        shared = _time_workers(tmp / "wds", wnids, args.workers) if args.workers else None

    n = args.images
    rate = {"folders": n / t_folders, "headers": n / t_headers, "cached": n / t_cached}
    print(
        f"{n:,} images of {args.side}x{args.side} px, {args.concepts} concepts, "
        f"{args.shards} shards; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
    )
    print(f"{'listing':28s} {'samples/s':>12s}")
    print(f"{'folder per wnid':28s} {rate['folders']:12,.0f}")
    print(
        f"{'shards, headers (no cache)':28s} {rate['headers']:12,.0f}   "
        f"{rate['headers'] / rate['folders']:.2f}x the folders"
    )
    print(
        f"{'shards, from the cache':28s} {rate['cached']:12,.0f}   "
        f"{rate['cached'] / rate['folders']:.2f}x the folders"
    )
    print(f"{'tar headers':28s} {'members/s':>12s}")
    print(f"{'this package tar reader':28s} {members / t_reader:12,.0f}")
    print(
        f"{'Python tarfile':28s} {members / t_tarfile:12,.0f}   "
        f"the package's reader: {t_tarfile / t_reader:.2f}x the speed of tarfile"
    )
    print(f"{'read + decode':28s} {'images/s':>12s}")
    print(f"{'folder per wnid':28s} {n / r_folders:12,.0f}")
    print(
        f"{'shards (random access)':28s} {n / r_shards:12,.0f}   "
        f"{r_folders / r_shards:.2f}x the folders"
    )
    print(
        f"projected listing of the {FALL2011_SAMPLES / 1e6:.1f}M-sample Fall 2011 shard copy "
        f"(extrapolated): {FALL2011_SAMPLES / rate['headers'] / 60:,.1f} min from the headers, "
        f"{FALL2011_SAMPLES / rate['cached'] / 60:,.1f} min from the cache"
    )
    if passes:
        print(f"{'4 stores of the shard copy':28s} {'seconds':>12s} {'opens':>8s}")
        for name, (seconds, opens) in passes.items():
            print(f"{name:28s} {seconds:12.2f} {opens:8d}")
        alone, one = passes["store after store"][0], passes["one pass"][0]
        print(f"one pass: {alone / one:.2f}x the speed of store after store")
    if shared:
        print(f"{f'one pass, {args.workers} workers':28s} {'seconds':>12s} {'opens':>8s}")
        for name, (seconds, opens) in shared.items():
            print(f"{name:28s} {seconds:12.2f} {opens:8d}")
        turn, files = shared["batches in turn"][0], shared["data files shared"][0]
        print(f"data files shared: {turn / files:.2f}x the speed of batches in turn")


def _time_tar_headers(paths, repeats=3):
    """``(members, seconds of the package's tar reader, seconds of tarfile)``: the best of
    ``repeats`` reads of every shard's headers by each, checked to give the same members."""
    from imagenet_cog._data.tar import read_members

    def ours():
        out = []
        for path in paths:
            with open(path, "rb") as f:
                out += [(m.name, m.offset, m.size) for m in read_members(f, path)]
        return out

    def reference():
        out = []
        for path in paths:
            with tarfile.open(path, "r:") as tar:
                out += [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
        return out

    times = {}
    for name, read in (("ours", ours), ("tarfile", reference)):
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            got = read()
            best = min(best, time.perf_counter() - t)
        times[name] = (best, got)
    assert times["ours"][1] == times["tarfile"][1]
    return len(times["ours"][1]), times["ours"][0], times["tarfile"][0]


def _time_stores(root, wnids):
    """``{way: (seconds, data-file opens)}`` of four stores built store after store, then in
    one pass; the stores are checked equal."""
    from imagenet_cog import Levels, make_split
    from imagenet_cog._data import sources as sources_module
    from imagenet_cog.features import FeatureExtractor
    from imagenet_cog.store import build_store, build_stores, open_store

    half = len(wnids) // 2
    levels = Levels([wnids[:half], wnids[half:]])
    opens = []
    sources_module.open = lambda path, mode="r": opens.append(path) or open(path, mode)  # noqa: SIM115
    out = {}
    for name in ("store after store", "one pass"):
        jobs = [
            (root.parent / name / d / s, make_split(root, d, s, levels, n_test=10))
            for d in ("L1", "L2")
            for s in ("train", "test")
        ]
        ext = FeatureExtractor("torchvision:resnet18:none", preprocessing={"size": 32})
        ext.set_params(progress=False)
        ext.fingerprint()
        opens.clear()
        t = time.perf_counter()
        if name == "one pass":
            build_stores(jobs, ext, shard_size=1000)
        else:
            for path, split in jobs:
                build_store(path, ext, split, shard_size=1000)
        out[name] = (time.perf_counter() - t, len(opens))
        out[name + " stores"] = [open_store(p) for p, _ in jobs]
    del sources_module.open
    for a, b in zip(out.pop("store after store stores"), out.pop("one pass stores")):
        assert list(a.ids) == list(b.ids)
        assert np.array_equal(np.asarray(a.features), np.asarray(b.features))
    return out


def _time_workers(root, wnids, workers):
    """``{way: (seconds, data-file opens over all processes)}`` of the one pass with
    ``workers`` DataLoader workers: batches handed out in turn, then data files shared out."""
    from imagenet_cog import Levels, make_split
    from imagenet_cog._data import file_split as _file_split
    from imagenet_cog._data import sources as sources_module
    from imagenet_cog.features import FeatureExtractor
    from imagenet_cog.store import build_stores, open_store

    half = len(wnids) // 2
    levels = Levels([wnids[:half], wnids[half:]])
    log = root.parent / "opens.log"

    def opening(path, mode="r"):
        with open(log, "a") as f:  # a file: the workers are other processes
            f.write(f"{path}\n")
        return open(path, mode)

    sources_module.open = opening
    by_file = _file_split.split_runs

    def in_turn(batches, sources, parts):  # batch i to worker i % parts, as a DataLoader does
        return [list(batches[w::parts]) for w in range(parts)]

    out, stores = {}, {}
    for name, split_runs in (("batches in turn", in_turn), ("data files shared", by_file)):
        _file_split.split_runs = split_runs
        jobs = [
            (root.parent / name / d / s, make_split(root, d, s, levels, n_test=10))
            for d in ("L1", "L2")
            for s in ("train", "test")
        ]
        ext = FeatureExtractor("torchvision:resnet18:none", preprocessing={"size": 32})
        ext.set_params(progress=False, num_workers=workers)
        ext.fingerprint()
        log.write_text("")
        t = time.perf_counter()
        build_stores(jobs, ext, shard_size=1000)
        out[name] = (time.perf_counter() - t, len(log.read_text().splitlines()))
        stores[name] = [open_store(p) for p, _ in jobs]
    _file_split.split_runs = by_file
    del sources_module.open
    for a, b in zip(*stores.values()):
        assert np.array_equal(np.asarray(a.features), np.asarray(b.features))
    return out


if __name__ == "__main__":
    main()
