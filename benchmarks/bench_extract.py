"""Images per second of ``imagenet_cog.extract`` against a plain DataLoader + model loop.

Both run in the same process, over the same JPEG files (written here, shaped
like ImageNet's: 500x375 on average), with the same preprocessing, model,
batch size and workers. ``extract`` also lists the images, builds the split
manifest, hashes the weights, writes the shards and the manifest: the ratio
says what that bookkeeping costs (target: at least 0.9 on the CPU).

Two more timings tell what limits the throughput: decoding and preprocessing
alone (the DataLoader without the model), and the model alone (random
tensors already in memory, or on the GPU). The smaller of the two is the
bottleneck.

Precision: the network runs in float32 (``extract``'s default) unless ``--amp`` is given
(autocast: fp16 on CUDA, bf16 on the CPU); the header line says which. Each phase (writing
the images, decoding alone, each pair of runs, the network alone) prints a line as it ends,
and a line every 20 s (stderr) says that a long phase is still going.
The script then prints a table and one JSON object; it never asserts.

    python benchmarks/bench_extract.py                     # CPU, ResNet-18, a few minutes
    python benchmarks/bench_extract.py --device cuda       # GPU, ResNet-50 at 224 px, float32
    python benchmarks/bench_extract.py --device cuda --amp --channels-last --workers 16
    python benchmarks/bench_extract.py --device cuda --decoder pil   # Pillow in the workers

``--decoder`` picks ``extract``'s decoder (``auto``: the tensor decoder,
nvJPEG, on CUDA and Pillow on the CPU); the baseline always decodes with
Pillow in its workers, so on CUDA the ratio measures what decoding on the GPU
gains.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _heartbeat import heartbeat

# Each phase's figures appear as soon as it ends, so a run cut short still gives them.
print = functools.partial(print, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--model", default=None, help="spec (default: resnet18 on CPU, resnet50 on GPU)")
    p.add_argument("--images", type=int, default=None, help="images (default: 192 CPU, 4096 GPU)")
    p.add_argument("--concepts", type=int, default=8, help="concept folders")
    p.add_argument("--size", type=int, default=224, help="preprocessing size S")
    p.add_argument("--batch-size", type=int, default=None, help="default: 32 CPU, 256 GPU")
    p.add_argument("--workers", type=int, default=None, help="default: 0 CPU, min(8, cores) GPU")
    p.add_argument("--repeats", type=int, default=3, help="paired runs of each")
    p.add_argument("--amp", action="store_true", help="autocast (fp16 on CUDA, bf16 on CPU)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument(
        "--decoder",
        choices=["auto", "pil", "torchvision"],
        default="auto",
        help="extract's decoder (default: auto)",
    )
    p.add_argument("--tmp", default=None, help="where to write the images (default: a temp dir)")
    p.add_argument("--json", default=None, help="also write the JSON result to this file")
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.model = args.model or ("torchvision:resnet50" if gpu else "torchvision:resnet18")
    args.images = args.images or (4096 if gpu else 192)
    args.batch_size = args.batch_size or (256 if gpu else 32)
    if args.workers is None:
        args.workers = min(8, os.cpu_count() or 1) if gpu else 0
    return args


def _write_concept(root, c, wnid, per):
    """One concept's JPEGs, from a generator of its own (the same files whatever the pool)."""
    from PIL import Image

    rng = np.random.default_rng((0, c))
    (root / wnid).mkdir(parents=True)
    for i in range(per):
        w, h = int(rng.integers(400, 600)), int(rng.integers(300, 450))
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * (c + 1) % 256, yy * (i + 1) % 256, (xx + yy) % 256], axis=-1)
        noise = rng.integers(0, 40, size=(h, w, 3))
        pixels = ((base + noise) % 256).astype(np.uint8)
        Image.fromarray(pixels).save(root / wnid / f"{wnid}_{i}.JPEG", quality=85)


def write_images(root, n_images, n_concepts):
    """JPEG files of ImageNet-like size and content, one folder per concept, written by one
    process per core (a GPU machine's cores write 4,096 images in seconds, one core in a
    minute or two)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    wnids = [f"n{90000000 + c:08d}" for c in range(n_concepts)]
    per = -(-n_images // n_concepts)
    start = last = time.perf_counter()
    cores = min(n_concepts, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    if cores < 2:
        for c, wnid in enumerate(wnids):
            if time.perf_counter() - last > 20:  # a long write shows progress
                last = time.perf_counter()
                print(f"  writing images: {c * per} of {per * n_concepts} ({last - start:.0f} s)")
            _write_concept(root, c, wnid, per)
        return wnids
    with ProcessPoolExecutor(cores) as pool:
        jobs = [pool.submit(_write_concept, root, c, w, per) for c, w in enumerate(wnids)]
        for done, job in enumerate(as_completed(jobs), 1):
            job.result()
            if time.perf_counter() - last > 20:
                last = time.perf_counter()
                print(
                    f"  writing images: {done * per} of {per * n_concepts} ({last - start:.0f} s)"
                )
    return wnids


class PlainDataset:
    """What a user writes by hand: open, convert, transform."""

    def __init__(self, paths, transform):
        self.paths, self.transform = paths, transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.paths[i]) as image:
            return self.transform(image.convert("RGB"))


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(args, device):
    import contextlib

    import torch

    if not args.amp:
        return contextlib.nullcontext()
    return torch.autocast(
        device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16
    )


def baseline(args, paths, transform, device):
    """A plain DataLoader + model loop, features gathered on the CPU."""
    import torch

    from imagenet_cog import load_model

    start = time.perf_counter()
    model = load_model(args.model)
    model.fc = torch.nn.Identity()
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    loader = torch.utils.data.DataLoader(
        PlainDataset(paths, transform),
        batch_size=args.batch_size,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
    )
    out = []
    with torch.inference_mode(), autocast(args, device):
        for x in loader:
            x = x.to(device, non_blocking=True)
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            out.append(torch.nn.functional.normalize(model(x).float(), dim=1).cpu())
    features = torch.cat(out).numpy()
    return time.perf_counter() - start, features


def ours(args, data, levels, out):
    from imagenet_cog import extract
    from imagenet_cog.store import open_store

    start = time.perf_counter()
    path = extract(
        args.model,
        data,
        "L1",
        "train",
        out,
        levels,
        n_test=1,
        shard_size=max(64, args.images // 4),
        overwrite=True,
        progress=False,
        preprocessing={"size": args.size},
        batch_size=args.batch_size,
        num_workers=args.workers,
        device=args.device,
        amp=args.amp,
        channels_last=args.channels_last,
        decoder=args.decoder,
    )
    elapsed = time.perf_counter() - start
    return elapsed, np.asarray(open_store(path).features)


def decode_only(args, paths, transform):
    import torch

    loader = torch.utils.data.DataLoader(
        PlainDataset(paths, transform), batch_size=args.batch_size, num_workers=args.workers
    )
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def model_only(args, n, device):
    import torch

    from imagenet_cog import load_model

    model = load_model(args.model).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    x = torch.randn(args.batch_size, 3, args.size, args.size, device=device)
    if args.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), autocast(args, device):
        model(x[:2])  # warm-up (cuDNN / oneDNN kernel choice)
        sync(device)
        start = time.perf_counter()
        for i in range(0, n, args.batch_size):
            model(x[: min(args.batch_size, n - i)])
        sync(device)
    return time.perf_counter() - start


def main(argv=None):
    args = parse_args(argv)
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available on this machine", file=sys.stderr)
        return 1
    amp = ("fp16" if device.type == "cuda" else "bf16") if args.amp else None
    precision = f"autocast {amp} (--amp)" if amp else "float32 (extract's default)"
    print(
        f"{args.model} at {args.size} px on {args.device}, {args.images} images, batch "
        f"{args.batch_size}, {args.workers} workers, decoder {args.decoder}, {precision}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench_extract_", dir=args.tmp))
    with heartbeat("bench_extract"):
        return measure(args, device, precision, tmp)


def measure(args, device, precision, tmp):
    """Every timing, the table and the JSON; ``tmp`` is removed at the end."""
    import torch

    from imagenet_cog import FeatureExtractor, Levels
    from imagenet_cog.datasets import make_split

    try:
        start = time.perf_counter()
        wnids = write_images(tmp / "data", args.images, args.concepts)
        print(f"wrote the images: {time.perf_counter() - start:.1f} s")
        levels = Levels([wnids])
        split = make_split(tmp / "data", "L1", "train", levels, n_test=1)
        paths = list(split.sources)
        n = len(paths)
        transform = FeatureExtractor(args.model, preprocessing={"size": args.size}).make_transform()

        decode_s = decode_only(args, paths, transform)  # also warms the page cache
        print(f"decode + preprocess only (Pillow): {n / decode_s:.1f} images/s")
        base_runs, our_runs = [], []
        for r in range(args.repeats):
            b, base_x = baseline(args, paths, transform, device)
            o, our_x = ours(args, tmp / "data", levels, tmp / f"out{r}")
            base_runs.append(b)
            our_runs.append(o)
            print(
                f"run {r + 1} of {args.repeats}: plain loop {n / b:.1f}, extract {n / o:.1f} "
                "images/s"
            )
        model_s = model_only(args, len(paths), device)
        print(f"model only: {n / model_s:.1f} images/s")
        same = base_x.shape == our_x.shape and bool(np.allclose(base_x, our_x, atol=1e-4))
        # The tensor decoder's features differ slightly from Pillow's: their cosine.
        cosine = (
            float(np.min(np.sum(base_x * our_x, axis=1)))
            if not same and base_x.shape == our_x.shape
            else None
        )
        result = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch_threads": torch.get_num_threads(),
            "model": args.model,
            "size": args.size,
            "images": n,
            "batch_size": args.batch_size,
            "workers": args.workers,
            "amp": args.amp,
            "precision": precision,
            "channels_last": args.channels_last,
            "decoder": args.decoder,
            "baseline_img_s": round(n / statistics.median(base_runs), 1),
            "extract_img_s": round(n / statistics.median(our_runs), 1),
            # Each baseline run is paired with the extract run right after it, so
            # that load from other processes on the machine hits both alike.
            "ratio": round(statistics.median(b / o for b, o in zip(base_runs, our_runs)), 3),
            "best_ratio": round(min(base_runs) / min(our_runs), 3),
            "baseline_runs_s": [round(x, 3) for x in base_runs],
            "extract_runs_s": [round(x, 3) for x in our_runs],
            "decode_only_img_s": round(n / decode_s, 1),
            "model_only_img_s": round(n / model_s, 1),
            "same_features": same,
            "min_cosine": round(cosine, 6) if cosine is not None else None,
        }
        result["bottleneck"] = (
            "decoding" if result["decode_only_img_s"] < result["model_only_img_s"] else "model"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows = [
        ("plain DataLoader + model", result["baseline_img_s"], "1.00"),
        ("imagenet_cog.extract", result["extract_img_s"], f"{result['ratio']:.2f}"),
        ("decode + preprocess (Pillow)", result["decode_only_img_s"], ""),
        ("model only", result["model_only_img_s"], ""),
    ]
    print(
        f"{args.model} at {args.size} px on {result['device']}, {n} images, "
        f"batch {args.batch_size}, {args.workers} workers, decoder {args.decoder}, {precision}"
    )
    print(
        f"{'(median of ' + str(args.repeats) + ' paired runs)':28s} {'images/s':>10s} {'ratio':>7s}"
    )
    for name, rate, ratio in rows:
        print(f"{name:28s} {rate:10.1f} {ratio:>7s}")
    print(f"bottleneck: {result['bottleneck']}; same features: {same}")
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
