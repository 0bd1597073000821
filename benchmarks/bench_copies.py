"""Listing and reading a webdataset shard copy against the folder layout, in the same run.

The same synthetic JPEGs (``--images`` of them, ``--concepts`` concepts, ``--side`` px) are
written twice: a folder per wnid, and webdataset shards in timm's layout (``<key>.cls``,
``<key>.jpg``, ``<key>.json`` per sample, shuffled across classes, ``--shards`` shards).
Printed:

* listing: samples listed per second, the folder layout (``list_images``), the shards read
  from their headers (no cache), and the shards again from the listing cache; the ratio;
* reading: images read and decoded per second through :class:`~imagenet_cog.ImageDataset`
  (one process, the split's order: by concept, random access into the shards), both layouts;
  the ratio;
* the projected time to list the 13.7M-sample Fall 2011 shard copy from the header rate
  (extrapolated: header reading is bound by the file system's metadata reads, so a network
  file system lists more slowly than the local disk measured here).

Run: ``python benchmarks/bench_copies.py [--images 4000] [--shards 8]``.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
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
    args = parser.parse_args()
    from copyfiles import write_shards

    from imagenet_cog import _copies
    from imagenet_cog.datasets import ImageDataset, TarMember, list_images

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
        write_shards(tmp / "wds", images, n_shards=args.shards)

        t = time.perf_counter()
        folders = list_images(tmp / "folders", wnids)
        t_folders = time.perf_counter() - t
        t = time.perf_counter()
        shards, _ = _copies.list_copy(tmp / "wds", wnids, tar_member=TarMember)
        t_headers = time.perf_counter() - t
        t = time.perf_counter()
        _copies.list_copy(tmp / "wds", wnids, tar_member=TarMember)
        t_cached = time.perf_counter() - t
        assert {w: sorted(v) for w, v in folders.items()} == {
            w: sorted(v) for w, v in shards.items()
        }

        def read_all(listing):
            sources = [s for w in wnids for _, s in sorted(listing[w].items())]
            ds = ImageDataset(sources)
            t = time.perf_counter()
            for i in range(len(ds)):
                ds.load_image(i)
            return time.perf_counter() - t

        r_folders, r_shards = read_all(folders), read_all(shards)

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


if __name__ == "__main__":
    main()
