"""A run that follows the paper in every recorded respect, as its config.json would say.

The checksums of the official concepts, test images and levels are computed here from the
shipped lists, independently of the library's comparability code: sha256 of the sorted ids
(or wnids) joined by newlines, and of ``L<k><TAB>wnid`` lines for the levels.
"""

import functools
import hashlib

from imagenet_cog import Results, imagenet1k_wnids, load_levels
from imagenet_cog._comparability import PAPER_PROTOCOL
from imagenet_cog._data.labels import read_val_labels
from imagenet_cog.levels import official_test_images

DOMAINS = ("in1k", "L1", "L2", "L3", "L4", "L5")
#: The paper's training-set sizes (the official train lists; ILSVRC-2012 train).
TRAIN_SIZES = {
    "in1k": 1_281_167,
    "L1": 1_118_804,
    "L2": 1_115_788,
    "L3": 1_095_203,
    "L4": 1_107_128,
    "L5": 1_091_654,
}
EXTRACTION = {
    "model": "torchvision:resnet50:IMAGENET1K_V1",
    "weights_sha256": "ab" * 32,
    "layer": "input:fc",
    "preprocessing": {
        "resize": 224,
        "crop": 224,
        "interpolation": "bicubic",
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    },
    "normalize": True,
    "amp": "off",
    "dtype": "float32",
    "decoder": "pil",
    "weights": "IMAGENET1K_V1",
    "differs_from_preset": {},
}


def sorted_sha(names):
    return hashlib.sha256("\n".join(sorted(set(names))).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def official_sums():
    """``(concepts, test ids, levels)`` checksums of the official data."""
    levels = load_levels("official")
    lists = official_test_images()
    concepts = {"in1k": sorted_sha(imagenet1k_wnids())}
    tests = {"in1k": sorted_sha(f"{w}/{f}" for f, w in read_val_labels().items())}
    lines = []
    for name, level in zip(levels.names, levels.levels):
        concepts[name] = sorted_sha(level)
        tests[name] = sorted_sha(i for w in level for i in lists[w])
        lines += [f"{name}\t{w}" for w in sorted(level)]
    return concepts, tests, hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()


def paper_like(model="mine", **change):
    """Results of a run that follows the paper, then ``change``: ``data_<field>`` changes L2's
    record, ``ext_<field>`` every domain's extraction, other keys the protocol."""
    concepts, tests, levels_sha = official_sums()
    data = {}
    for d in DOMAINS:
        data[d] = {
            "n_classes": 1000,
            "classes_sha256": concepts[d],
            "wnid_labels": True,
            "n_train": TRAIN_SIZES[d],
            "n_test": 50_000,
            "extraction": dict(EXTRACTION),
            "train_ids_sha256": "0" * 64,
            "test_ids_sha256": tests[d],
            "skipped": {"train": 0, "test": 0},
        }
        if d != "in1k":
            data[d]["split"] = {
                "seed": 0,
                "cap": 1300,
                "n_test": 50,
                "official_test_lists": 1000,
                "n_concepts": 1000,
            }
            data[d]["levels"] = {"name": "official", "sha256": levels_sha}
    proto = {
        **PAPER_PROTOCOL.record(),
        "levels": "official",
        "levels_sha256": levels_sha,
        "normalize": True,
        "data": data,
        "versions": {"optuna": "2.3.0"},
    }
    seeds = change.pop("seeds", (22, 37, 45, 77, 93))
    shots = change.pop("shots", (1, 2, 4, 8, 16, 32, 64, 128, "all"))
    domains = change.pop("domains", DOMAINS)
    for key, value in change.items():
        if key.startswith("data_"):
            data["L2"] = {**data["L2"], key[5:]: value}
        elif key.startswith("ext_"):
            for d in DOMAINS:
                data[d]["extraction"] = {**data[d]["extraction"], key[4:]: value}
        else:
            proto[key] = value
    cells = [
        {"model": model, "domain": d, "shots": n, "seed": s, "top1": 60.0 + 0.2 * k, "top5": 70.0}
        for d in domains
        for n in shots
        for k, s in enumerate(seeds)
    ]
    return Results(cells, meta={"protocol": {model: proto}})
