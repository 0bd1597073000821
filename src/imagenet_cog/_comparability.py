"""Whether a run is comparable with the paper's numbers, and why not.

Stage "results". The paper's seeds, concepts and test-set sizes, and the checks of a
:class:`~imagenet_cog.Results`' recorded protocol against them and against the paper's
protocol (:data:`~imagenet_cog._grid.PAPER_PROTOCOL`)
(:func:`comparability`, :class:`NotComparableError`, the banner of the reports), and the
paper's published results (:func:`read_paper_results`, :func:`paper_models`). Reads the
results only through their ``summary()``, ``records``, ``models`` and ``meta``, so it imports
nothing from ``results``.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json

import numpy as np

from ._base import WNID_RE, data_path, names_checksum
from ._data.copies import copy_effect, effect_deviates, reencoded
from ._fileio import changed_settings
from ._grid import (
    DOMAINS,
    PAPER_PROTOCOL,
    SEEDS,
    SHOTS,
    Protocol,
    display_domain,
    display_shots,
    domain_key,
    shot_key,
)
from ._models.presets import MODEL_ZOO, paper_preset
from ._models.pretraining import pretraining_caveat
from ._models.registry import parse_spec
from ._models.untrained import untrained_reasons
from ._provenance import RANDOM_WEIGHTS
from ._runfolder import RECORD_CHECKSUM, as_recorded, record_checksum
from ._tables import printable

__all__ = [
    "ARRAYS_CAVEAT",
    "CATEGORY_NAMES",
    "COMPARABLE",
    "DECODER_CAVEAT",
    "NOT_COMPARABLE_MARK",
    "OFFICIAL_SPLIT",
    "OPTUNA_CAVEAT",
    "PAPER_CONCEPTS",
    "PAPER_OPTUNA",
    "PAPER_PROTOCOL",
    "PAPER_SEEDS",
    "PAPER_SOURCE",
    "PAPER_TEST_IMAGES",
    "PAPER_TRAIN_IMAGES",
    "RESIZE_CAVEAT",
    "TF32_DEVIATION",
    "TRUNCATED_SKIP_CAVEAT",
    "NotComparableError",
    "comparability",
    "concepts_checksum",
    "evaluation_caveats",
    "labels_are_wnids",
    "not_comparable",
    "paper_models",
    "paper_summaries",
    "paper_test_set",
    "protocol_differences",
    "published_cells",
    "read_paper_results",
]

_domain_key, _shot_key = domain_key, shot_key


def concepts_checksum(labels):
    """sha256 of the sorted, distinct labels joined by newlines: which concepts a domain used.

    Examples
    --------
    >>> concepts_checksum(["n2", "n1", "n2"]) == concepts_checksum(["n1", "n2"])
    True
    """
    return names_checksum(labels)


def labels_are_wnids(labels):
    """Whether every label is a WordNet id (``n`` and 8 digits), so it can name a concept.

    Examples
    --------
    >>> labels_are_wnids(["n01440764", "n01443537"]), labels_are_wnids([0, 1])
    (True, False)
    """
    return all(WNID_RE.match(str(x)) for x in np.asarray(labels).ravel().tolist())


def _as_stated(value):
    """A recorded value as the paper writes it: a range's whole numbers without a point."""
    if isinstance(value, list):
        return [int(x) if isinstance(x, float) and x.is_integer() else x for x in value]
    return value


def _stated_protocol():
    """What the paper's published cells record of their protocol: the settings the verdict
    compares by value (:data:`PAPER_PROTOCOL`, as the paper states them); whether features
    were normalised is judged with the data, apart."""
    paper = PAPER_PROTOCOL.record()
    return {k: _as_stated(paper[k]) for k in Protocol.compared() if k != "normalize"}


PAPER_SEEDS = 5
COMPARABLE = (
    "Comparable with the paper means: the official levels (the same 5000 concepts and "
    "50 test images each, by content), the official training images (every other image of "
    "a concept, at most 1300, as many as the paper used), pretrained weights extracted with "
    "the model's preset (preprocessing, the layer before the classifier, no amp), the same "
    "protocol constants (100 epochs of SGD, batch 1024, 30 TPE trials per seed run "
    "sequentially, lr in [0.1, 100], wd in [1e-12, 1e-4], a 20% validation holdout, the 5 "
    "official seeds once each), and images identical between the Fall 2011 and Winter 2021 "
    "releases (the CoG images are; IN-1K is ILSVRC-2012, not its face-blurred version)."
)


#: Concepts and test images per domain in the paper (1000 concepts × 50 test images).
PAPER_CONCEPTS = 1000
PAPER_TEST_IMAGES = 50_000
#: Training images per domain in the paper: the official train lists of L1..L5 and the
#: ILSVRC-2012 training set.
PAPER_TRAIN_IMAGES = {
    "in1k": 1_281_167,
    "L1": 1_118_804,
    "L2": 1_115_788,
    "L3": 1_095_203,
    "L4": 1_107_128,
    "L5": 1_091_654,
}
#: How the training images of a CoG concept are chosen (``make_split``'s defaults): every
#: image outside the official test list, at most 1300 of them, picked with seed 0.
OFFICIAL_SPLIT = {"seed": 0, "cap": 1300}
#: The Optuna release the official code pins.
PAPER_OPTUNA = "2.3.0"
#: The smallest and largest input (crop, px) of the paper's models (their presets).
PAPER_INPUT_SIZES = (
    min(r["size"] for r in MODEL_ZOO.values()),
    max(r["size"] for r in MODEL_ZOO.values()),
)
#: The caveat of features made by the tensor JPEG decoder. The measured effect on the
#: features and on probe accuracy is stated in docs/guide/features.rst.
DECODER_CAVEAT = (
    "features decoded by the tensor JPEG decoder (decoder='torchvision'), not by Pillow as "
    "in the official code. On the CPU it gives input pixels and features identical to "
    "Pillow's (measured with torchvision's ImageNet MobileNetV2 weights on 480 real-photo "
    "crops and 1,797 upscaled digit JPEGs, 24 November 2026); on a GPU, nvJPEG decodes "
    "differently from libjpeg-turbo and its effect on the features has not been measured; "
    "see docs/guide/features.rst, section 'The tensor path'"
)

#: The caveat of features made with torch's resize of the 8-bit pixels. Its measured effect
#: is stated in docs/guide/features.rst.
RESIZE_CAVEAT = (
    "features made with torch's antialiased resize of the 8-bit pixels (resize='torch'), not "
    "Pillow's as in the official code: measured against Pillow's with the ImageNet weights of "
    "MobileNetV2 and EfficientNet-Lite0 on 1,000 real-photo JPEGs at ImageNet's sizes, the "
    "input pixels were at most 2 levels apart, the features at a cosine of at least 0.99996 "
    "and the top-1 class unchanged on 99.7% and 100% of the images (on the CPU, 29 November 2026); see "
    "docs/guide/features.rst, section 'The worker path'"
)
#: The deviation of features extracted with TF32 allowed.
TF32_DEVIATION = "extracted with TF32 convolutions and products (tf32=True) instead of float32"


def copy_caveat(name, copy):
    """The caveat of images read from a resized or re-encoded copy (``copy``: the record a
    split keeps of it), with the measured effect of the copy's processing."""
    what = []
    if copy.get("resized"):
        what.append(f"{copy['resized']:,} of {copy.get('samples', 0):,} images resized")
    formats = reencoded(copy.get("formats", {}))
    if formats:
        what.append("stored as " + ", ".join(formats))
    if copy.get("seen"):
        what.append(copy["seen"])
    text = (
        f"{name}: images from the {copy.get('name', '?')} copy ({copy.get('layout', '?')}), "
        f"which its processing changed ({'; '.join(what) or copy.get('processing')})"
    )
    effect = copy_effect(copy)  # of what its images show, or of its published processing
    if effect is not None:
        spread = effect.get("top1_scenes")
        text += (
            f"; measured on real photos with MobileNetV2's ImageNet weights, {effect['what']} "
            f"gives a mean feature cosine of {effect['cosine']} with the originals and keeps "
            f"{effect['top1']}% of the top-1 classes"
            + (f" ({spread[0]}% to {spread[1]}% over {effect['scenes']} scenes)" if spread else "")
        )
        if effect_deviates(effect):
            text += ": it changes too many of the network's predictions for a comparison"
    return text + " (docs/guide/getting_imagenet.rst, 'What the processing of a copy changes')"


#: The caveat of another Optuna than the official code's (``{version}``: the one used).
OPTUNA_CAVEAT = (
    "Optuna {version} instead of the official code's 2.3.0: the same seeded TPE search, "
    "whose trials diverge from the 11th on, so the chosen (lr, wd) can differ; measured "
    "on a synthetic task, the 5-seed mean test top-1 moved by 0.01 points against a spread "
    "over seeds of 0.25 (docs/guide/official.rst, 'Optuna version')"
)
#: The caveat of features given as arrays, which carry no record of where they come from.
#: The caveat of an extraction that skipped image files cut short (``truncated_images="skip"``).
TRUNCATED_SKIP_CAVEAT = (
    "image files cut short were skipped (truncated_images='skip'), where the official code "
    "decodes them with their missing part grey: those images are missing from its features"
)
ARRAYS_CAVEAT = (
    "features given as arrays: their model, weights, extraction settings and images are not "
    "recorded, so only the concepts (from wnid labels), the image counts and the protocol "
    "are checked"
)


class NotComparableError(ValueError):
    """A model's results deviate from the paper's protocol, and ``strict`` was asked.

    Raised by :meth:`Results.compare` with ``strict=True`` (and ``imagenet-cog report
    --strict``, which exits with status 2); the message names each deviation.

    Examples
    --------
    >>> from imagenet_cog import Results, reference_results
    >>> run = Results([{"model": "m", "domain": "L1", "shots": "all", "seed": 22, "top1": 60.0}])
    >>> try:
    ...     run.compare(reference_results(), strict=True)
    ... except ValueError as exc:  # NotComparableError is a ValueError
    ...     print(type(exc).__name__, str(exc)[:83])
    NotComparableError NOT COMPARABLE with the paper (strict): m: 1 seed per cell instead of the paper's 5
    """


@functools.lru_cache(maxsize=1)
def _official_checksums():
    from .levels import official_level_wnids
    from .taxonomy import imagenet1k_wnids

    sums = {"in1k": concepts_checksum(list(imagenet1k_wnids()))}
    # The wnids alone: the levels' similarities (WordNet, about a second) are not needed.
    for i, level in enumerate(official_level_wnids(), start=1):
        sums[f"L{i}"] = concepts_checksum(level)
    return sums


@functools.lru_cache(maxsize=1)
def _official_images():
    """``(levels checksum, {domain: checksum of the official test image ids})``: the test
    lists of the official levels, and the 50,000 ILSVRC-2012 validation images for IN-1K."""
    from .levels import Levels, official_level_wnids, official_test_images

    # The wnids alone, as for the checksums above: their similarities are not needed.
    official = Levels([list(level) for level in official_level_wnids()])
    lists = official_test_images()
    sums = {
        name: names_checksum([i for w in level for i in lists[w]])
        for name, level in zip(official.names, official.levels)
    }
    raw = gzip.decompress(data_path("imagenet1k_val_labels.tsv.gz").read_bytes()).decode()
    rows = [line.split("\t") for line in raw.splitlines() if line and not line.startswith("#")]
    sums["in1k"] = names_checksum([f"{wnid}/{name}" for name, wnid in rows[1:]])
    return official.checksum, sums


def _seed_checks(results, model, rows):
    """Deviations of the seeds: too few per cell, other than the official ones, repeated."""
    dev = []
    per_cell = {}
    for r in results.records:
        if r["model"] == model and r.get("seed") is not None:
            per_cell.setdefault((r["domain"], r["shots"]), []).append(int(r["seed"]))
    # A cell's seeds as recorded (distinct); a published summary only gives their number.
    counts = [len(set(v)) for v in per_cell.values()]
    counts += [r["n"] for r in rows if (r["domain"], r["shots"]) not in per_cell]
    if counts and min(counts) < PAPER_SEEDS:
        n = min(counts)
        dev.append(f"{n} seed{'s' if n != 1 else ''} per cell instead of the paper's {PAPER_SEEDS}")
    used = sorted({s for v in per_cell.values() for s in v})
    other_seeds = [x for x in used if x not in SEEDS]
    if other_seeds:
        dev.append(
            f"seeds {other_seeds} are not the official ones {list(SEEDS)} (other "
            "holdouts, shots and TPE draws)"
        )
    repeated = {cell: v for cell, v in per_cell.items() if len(v) != len(set(v))}
    if repeated:
        (domain, shots), seeds = min(
            repeated.items(), key=lambda kv: (_domain_key(kv[0][0]), _shot_key(kv[0][1]))
        )
        dev.append(
            f"repeated seeds in {len(repeated)} cell(s), e.g. {display_domain(domain)} "
            f"N={display_shots(shots)}: seeds {sorted(seeds)}, so one seed's result counts "
            "more than once in the mean"
        )
    hashes = sorted(
        {
            str(r["config_hash"])
            for r in results.records
            if r["model"] == model and r.get("config_hash")
        }
    )
    if len(hashes) > 1:
        dev.append(
            f"its cells come from {len(hashes)} runs with different configurations "
            f"(config_hash {', '.join(hashes)})"
        )
    return dev


def _record_checks(results, model, proto):
    """Deviations of the cells against what made them: records made by another configuration
    than the recorded one (another run's ``runs.jsonl``), records edited after they were
    written (their checksum, when they carry one, no longer matches)."""
    dev = []
    cells = [r for r in results.records if r["model"] == model]
    bound = (proto or {}).get("config_hash")
    other = sorted(
        {
            str(r.get("config_hash"))
            for r in cells
            if bound is not None and r.get("config_hash") != bound
        }
    )
    if other:
        n = sum(r.get("config_hash") != bound for r in cells)
        dev.append(
            f"{n} of its {len(cells)} cells were made by another configuration than its "
            f"config.json (config_hash {', '.join(other)}; config.json has {bound})"
        )
    edited = sum(
        RECORD_CHECKSUM in r and r[RECORD_CHECKSUM] != record_checksum(as_recorded(r))
        for r in cells
    )
    if edited:
        dev.append(
            f"{edited} of its {len(cells)} cells were edited after they were written (their "
            "contents do not match their checksums)"
        )
    return dev


def _grid_checks(rows):
    """Deviations (other shots) and caveats (missing domains, shots, cells) of the grid."""
    dev, cav = [], []
    shots = {r["shots"] for r in rows}
    other = sorted(shots - set(SHOTS), key=_shot_key)
    if other:
        dev.append(f"shots {other} are not among the paper's {list(SHOTS)}")
    domains = {r["domain"] for r in rows}
    missing = [d for d in DOMAINS if d not in domains]
    if missing:
        cav.append(f"no results for {', '.join(display_domain(d) for d in missing)}")
    absent = [s for s in SHOTS if s not in shots]
    if absent:
        cav.append(f"no results for N={', '.join(display_shots(s) for s in absent)}")
    holes = [
        f"{display_domain(d)} N={display_shots(n)}"
        for d in sorted(domains, key=_domain_key)
        for n in sorted(shots, key=_shot_key)
        if not any(r["domain"] == d and r["shots"] == n for r in rows)
    ]
    if holes:
        cav.append(f"missing cells: {', '.join(holes[:8])}" + (" ..." if len(holes) > 8 else ""))
    return dev, cav


def _domain_checks(domain, info):
    """``(deviations, caveats, official)`` of one domain's recorded data: its concepts, its
    test and training images; ``official`` tells whether its concepts are the official ones."""
    dev, cav = [], []
    name, n = display_domain(domain), info.get("n_classes")
    official = _official_checksums()
    is_official = False
    test_ids = info.get("test_ids_sha256")
    if n != PAPER_CONCEPTS:
        dev.append(f"{name}: {n} concepts instead of the paper's {PAPER_CONCEPTS} (a subset)")
    elif not info.get("wnid_labels"):
        if test_ids is not None:
            # The test images' ids are recorded: checked below against the official ones,
            # which hold the official concepts.
            cav.append(
                f"{name}: the labels are not wnids; the concepts are checked only "
                "through the test images, against the official ones"
            )
            is_official = domain in official
        elif domain in official:
            dev.append(
                f"{name}: the labels are not wnids and no class list names them, so its "
                f"{n} concepts cannot be checked against the official {name} list (give "
                f"evaluate classes={{{domain!r}: [wnid of label 0, wnid of label 1, ...]}})"
            )
    elif domain in official and info.get("classes_sha256") != official[domain]:
        dev.append(f"{name}: {n} concepts, but not the official {name} list")
    else:
        is_official = domain in official
    check = info.get("feature_check") or {}
    weights = (info.get("extraction") or {}).get("weights")
    if weights != RANDOM_WEIGHTS:  # random on purpose: said already
        dev += [f"{name}: the network looks untrained: {r}" for r in untrained_reasons(check)]
    n_test = info.get("n_test")
    if n_test is not None and n_test != PAPER_TEST_IMAGES:
        text = f"{name}: {n_test} test images instead of the paper's {PAPER_TEST_IMAGES}"
        # A few undecodable images change little; a smaller test set changes the numbers.
        (cav if n_test >= 0.99 * PAPER_TEST_IMAGES else dev).append(text)
    n_train, paper = info.get("n_train"), PAPER_TRAIN_IMAGES.get(domain)
    # Counted whatever the labels: a 1000-concept domain whose concepts are not known to
    # differ (labels that are not wnids included) has the paper's number of images.
    counted = is_official or (n == PAPER_CONCEPTS and not info.get("wnid_labels"))
    if counted and n_train is not None and paper is not None and n_train != paper:
        text = f"{name}: {n_train:,} training images instead of the paper's {paper:,}"
        # Within 1%: undecodable or missing images; beyond, another training set.
        (cav if abs(n_train - paper) <= 0.01 * paper else dev).append(text)
    test_ids, split = info.get("test_ids_sha256"), info.get("split") or {}
    if is_official and test_ids is not None and test_ids != _official_images()[1][domain]:
        if domain == "in1k":
            dev.append(f"{name}: the test images are not the 50,000 ILSVRC-2012 validation images")
        else:
            drawn = split.get("official_test_lists") == 0
            dev.append(
                f"{name}: the test images are not the official test lists"
                + (" (extracted with official_test=False: drawn with a seed)" if drawn else "")
            )
    copy = split.get("copy") or {}
    if copy.get("processed"):
        # A processing that may change a quarter of the predictions is a deviation, whatever
        # the copy.
        (dev if effect_deviates(copy_effect(copy)) else cav).append(copy_caveat(name, copy))
    other = {k: split[k] for k in OFFICIAL_SPLIT if k in split and split[k] != OFFICIAL_SPLIT[k]}
    if other and not info.get("uncapped"):  # no concept reached a cap: they chose nothing
        dev.append(
            f"{name}: training images chosen with "
            + ", ".join(f"{k}={v!r}" for k, v in other.items())
            + f" instead of seed {OFFICIAL_SPLIT['seed']} and at most {OFFICIAL_SPLIT['cap']} "
            "per concept (other training images)"
        )
    return dev, cav, is_official


def _preset_text(setting, change):
    used, preset = change.get("used"), change.get("preset")
    if preset is None:  # the library's own, which the extractor cannot follow
        return (
            f"extracted with {setting} {used!r}, where the model's library prescribes "
            "one the extractor cannot follow (no preset to compare with)"
        )
    if isinstance(used, dict) and isinstance(preset, dict):
        keys = [k for k in sorted(set(used) | set(preset)) if used.get(k) != preset.get(k)]
        used = ", ".join(f"{k}={used.get(k)!r}" for k in keys)
        preset = ", ".join(f"{k}={preset.get(k)!r}" for k in keys)
        return f"extracted with {setting} {used} instead of the preset's {preset}"
    return f"extracted with {setting} {used!r} instead of the preset {preset!r}"


def _extraction_checks(data):
    """Deviations and caveats of how the features were made, read from each domain's
    recorded extraction fingerprint (the same for every domain of one run)."""
    dev, cav = [], []
    records = [info.get("extraction", "unrecorded") for info in data.values()]
    if not records:
        return dev, cav
    if "unrecorded" in records:
        cav.append(
            "the extraction (model, weights, settings) and the image lists are not recorded: "
            "they are not checked"
        )
        return dev, cav
    if None in records:
        cav.append(ARRAYS_CAVEAT)
        return dev, cav
    unique = list({json.dumps(r, sort_keys=True): r for r in records}.values())
    if len(unique) > 1:
        dev.append(f"its domains' features come from {len(unique)} different extractions")
    for record in unique:
        model = record.get("model")
        # Which network made the features comes from the record, never from the run's name.
        other = _other_model(model)
        if other:
            cav.append(other)
        if record.get("weights") == RANDOM_WEIGHTS:
            dev.append(f"random-initialised weights: {model!r} names no weights")
        elif seen := pretraining_caveat(model):  # weights that saw ImageNet-21K images
            cav.append(seen)
        if record.get("amp", "off") != "off":
            dev.append(f"extracted with amp={record['amp']!r} instead of float32 (the preset)")
        if record["differs_from_preset"] is None:
            cav.append(
                "the network was given as a module: its preprocessing and layer have "
                "no preset to be checked against"
            )
            dev += _input_size_checks(record.get("preprocessing") or {})
        else:
            dev += [
                _preset_text(k, v)
                for k, v in record["differs_from_preset"].items()
                if k in ("preprocessing", "layer")
            ]
        if record.get("decoder", "pil") != "pil":
            cav.append(DECODER_CAVEAT)
        if record.get("resize", "pil") != "pil":
            cav.append(RESIZE_CAVEAT)
        if record.get("tf32"):
            dev.append(TF32_DEVIATION)
        if record.get("truncated_images", "keep") != "keep":
            cav.append(TRUNCATED_SKIP_CAVEAT)
        if record.get("loader"):
            source = str(model).split(":", 1)[0]
            cav.append(
                f"the network was loaded by {record['loader']}, a plug-in registered in place "
                f"of the library's {source!r} source: {model!r} does not say which network "
                "and weights it holds, so they are not checked"
            )
    return dev, cav


def _input_size_checks(preprocessing):
    """Deviations of a network given as a module whose input is outside the paper's sizes:
    the resize (every side it sets) and the crop, each read."""
    (low, high), dev = PAPER_INPUT_SIZES, []
    resize, crop = preprocessing.get("resize"), preprocessing.get("crop")
    sides = resize if isinstance(resize, list) else [resize]
    if resize == crop:  # the paper's way, S then S × S: the crop says it
        sides = []
    if all(isinstance(v, int) for v in sides) and not all(low <= v <= high for v in sides):
        shown = " × ".join(map(str, sides)) + (" px" if len(sides) > 1 else " px (shorter side)")
        dev.append(f"a resize to {shown}, outside the {low} to {high} px of the paper's models")
    if isinstance(crop, int) and not low <= crop <= high:
        dev.append(f"an input of {crop} px, outside the {low} to {high} px of the paper's models")
    return dev


def _levels_checks(proto, results, data, domain_official):
    """The levels: by content checksum when recorded, else by each level's concepts."""
    levels = proto.get("levels", results.meta.get("levels"))
    sha = proto.get("levels_sha256")
    level_domains = [d for d in data if d != "in1k"]
    if sha is not None and level_domains:
        if sha == _official_images()[0]:
            return [], []
        if all(domain_official.get(d) for d in level_domains):
            note = (
                f"levels {levels!r} are not the official ones, but each level evaluated "
                "holds the official concepts"
            )
            return [], [note]
        return [f"levels {levels!r} are not the official ones (their contents differ)"], []
    if levels not in (None, "official") and proto.get("data") is None:
        return [f"levels {levels!r} instead of the official ones"], []
    return [], []


def _check_model(results, model, proto):
    """``(deviations, caveats)`` of one model against the paper's protocol.

    Deviations change the numbers of the cells that are there (other concepts, images,
    weights, extraction settings, constants, seeds, unnormalised features, concepts named
    by no wnid, cells that do not match their run, or settings that were not recorded):
    such a model is not comparable. Caveats leave those cells comparable: cells, shots or
    domains that are missing (the others still compare), another Optuna (the same TPE
    search, another sequence of trials), the tensor JPEG decoder, a few images fewer, and
    what cannot be checked (features given as arrays).
    """
    rows = [r for r in results.summary() if r["model"] == model]
    dev = _seed_checks(results, model, rows) + _record_checks(results, model, proto)
    grid_dev, cav = _grid_checks(rows)
    dev += grid_dev
    if proto is None:
        dev.append("its protocol settings are unknown (no config.json)")
        return dev, cav
    for key, used, paper in Protocol.differences(proto, PAPER_PROTOCOL.record()):
        if key != "normalize":  # judged below, with the data
            dev.append(f"{Protocol.label(key)}: {used!r} instead of {_as_stated(paper)!r}")
    if "normalize" not in proto:
        dev.append("whether the features were l2-normalised is not recorded")
    elif not proto["normalize"] and not (
        proto.get("data") and all(d.get("unit_norm") for d in proto["data"].values())
    ):  # features unit-norm already: the normalisation would have changed nothing
        dev.append(
            "features not l2-normalised (normalize=False); the official probe normalises them "
            "and its lr range [0.1, 100] assumes unit-norm features"
        )
    data = proto.get("data")
    if data is None:
        dev.append("the concepts and images used are not recorded")
        data = {}
    domain_official = {}
    for domain in sorted(data, key=_domain_key):
        d_dev, d_cav, domain_official[domain] = _domain_checks(domain, data[domain])
        dev += d_dev
        cav += d_cav
    for found in (_levels_checks(proto, results, data, domain_official), _extraction_checks(data)):
        dev += found[0]
        cav += found[1]
    cav += _optuna_checks(results, model, (proto.get("versions") or {}).get("optuna"))
    return dev, cav


def _optuna_checks(results, model, recorded):
    """Caveats of the Optuna versions, read per cell: a folder resumed with another Optuna
    holds cells of both, each attributed to its own (records without versions, written by an
    earlier version, take the one ``config.json`` records)."""
    cells = {}
    for r in results.records:
        if r["model"] == model:
            version = (r.get("versions") or {}).get("optuna", recorded)
            cells.setdefault(version, []).append(r)
    if not cells:  # published means only: what config.json records
        cells = {recorded: []}
    if list(cells) == [None]:
        return [f"the Optuna version is not recorded (the official code pins {PAPER_OPTUNA})"]
    if len(cells) == 1:
        version = next(iter(cells))
        return [] if version == PAPER_OPTUNA else [OPTUNA_CAVEAT.format(version=version)]
    total = sum(map(len, cells.values()))
    found = []
    for version, recs in sorted(cells.items(), key=lambda kv: str(kv[0])):
        if version == PAPER_OPTUNA:
            continue
        seeds = sorted({int(r["seed"]) for r in recs if r.get("seed") is not None})
        which = (
            f"{len(recs)} of its {total} cells (seed{'s' if len(seeds) != 1 else ''} "
            f"{', '.join(map(str, seeds))})"
        )
        if version is None:
            found.append(f"the Optuna version of {which} is not recorded")
        else:
            found.append(OPTUNA_CAVEAT.format(version=version) + f"; for {which}")
    return found


def paper_test_set(domain):
    """What the paper tested on ``domain``: ``n_classes``, ``n_test`` and the checksums of its
    concepts and of its test images' ids, as a run records its own (``config.json``'s
    ``data``); None for a domain that is not one of the paper's.

    Examples
    --------
    >>> found = paper_test_set("L5")
    >>> found["n_classes"], found["n_test"], len(found["test_ids_sha256"])
    (1000, 50000, 64)
    """
    concepts = _official_checksums()
    if domain not in concepts:
        return None
    return {
        "n_classes": PAPER_CONCEPTS,
        "n_test": PAPER_TEST_IMAGES,
        "wnid_labels": True,
        "classes_sha256": concepts[domain],
        "test_ids_sha256": _official_images()[1][domain],
    }


def protocol_differences(a, b):
    """``["field: a → b"]`` where two runs' recorded protocols differ, versions aside (the
    same configuration run with other versions is one configuration)."""
    if (a is None) != (b is None):
        return ["config.json: " + ("none → present" if a is None else "present → none")]
    # The configuration hash names what the other fields say: a folder of an earlier version
    # keeps its own, so it is no difference by itself.
    return changed_settings(a, b, ignore=("versions", "config_hash")) if a is not None else []


def evaluation_caveats(payload):
    """The caveat of a model whose ``analysis.json`` (``payload``) holds evaluations by other
    protocols than the paper's linear probe (k-NN, zero-shot): named by their protocol,
    never ranked with the paper's numbers."""
    settings = (payload or {}).get("settings") or {}
    ran = settings.get("analyses") or []
    # Each evaluation's settings name its protocol (analysis.json records them).
    protocols = [
        settings[name]["protocol"]
        for name in ran
        if isinstance(settings.get(name), dict) and settings[name].get("protocol")
    ]
    if not protocols:
        return []
    which = " and ".join(protocols)
    return [
        (
            f"its {which} accuracies (analysis.json) are not the paper's protocol: shown under "
            "their own names beside its linear probe, never ranked with the paper's numbers"
        )
    ]


def _other_model(model):
    """The caveat of a network outside the paper's 31, from the spec its extraction recorded."""
    if not isinstance(model, str):
        return None
    try:
        source = parse_spec(model)[0]
    except ValueError:  # a network given as a module: its own caveat says so
        return None
    if paper_preset(model) is not None:
        return None
    return (
        f"not one of the paper's 31 models ({source} spec): ranked among them as another model, "
        "under the same protocol, with its own preprocessing and feature layer (no paper preset "
        "applies; see the docs' model zoo)"
    )


def comparability(results, by_model=False, deviations=True):
    """What keeps a run from being comparable with the paper's numbers.

    Checks each non-reference model's recorded provenance and protocol
    (``meta["protocol"]``, from its ``config.json``) and its cells against the paper's, by
    content, not by name:

    - *the data*: each domain's concepts (1000, the official list when labels are wnids),
      its test images (the official test lists, or the 50,000 ILSVRC-2012 validation
      images, by the checksum of their ids; 50 per concept), its training images (as many
      as the paper's, chosen with the official seed and cap), and the levels (by content);
    - *the features*: pretrained weights, the preprocessing and layer of the model's preset,
      no amp (float32), one extraction for every domain, and the decoder;
    - *the protocol*: the constants (epochs, batch, trials, the lr and wd ranges, sequential
      trials, no mixed precision), l2-normalised features, the five official seeds once each
      in every cell, cells of one configuration (the recorded one, unedited), the shots,
      domains and cells present, and the Optuna version of each cell.

    *Deviations* change the numbers themselves: a model with any is **not comparable**,
    and :meth:`Results.compare` and ``imagenet-cog report`` show its ranks only in
    parentheses, under a banner. *Caveats* leave the cells that are there comparable
    (missing cells, shots or domains; a few images fewer; another Optuna; the tensor JPEG
    decoder; what cannot be checked: features given as arrays, a network given as a
    module, an extraction that is not recorded). Labels that are not wnids are a deviation
    unless ``evaluate(..., classes=...)`` named their concepts, or the recorded test images
    pin them. Cells whose configuration hash is not the recorded one, or whose contents no
    longer match their checksum, are deviations too. The full list is in
    docs/guide/protocol.rst.

    Parameters
    ----------
    results : Results
        Typically made by :meth:`Results.compare`; the paper's own models (by provenance
        and content, see :meth:`Results.reference_models`, never by name) are not checked.
    by_model : bool
        Return ``{model: {"deviations": [...], "caveats": [...]}}`` instead.
    deviations : bool
        List the deviations too (the default); ``False`` lists the caveats only, for a page
        whose banner (:func:`not_comparable_banner`) names the deviations already.

    Returns
    -------
    list of str or dict
        One ``"<model>: <reason>"`` line per deviation, then one ``"<model>: (caveat)
        <reason>"`` per caveat; the first item restates what "comparable" means whenever
        there is anything. Empty when nothing deviates.

    Examples
    --------
    >>> from imagenet_cog import Results
    >>> from imagenet_cog import comparability
    >>> run = Results([{"model": "mine", "domain": "L1", "shots": "all", "seed": 22, "top1": 60.0}])
    >>> [n for n in comparability(run) if n.startswith("mine: 1 seed")]
    ["mine: 1 seed per cell instead of the paper's 5"]
    >>> comparability(run, by_model=True)["mine"]["deviations"][:2]
    ["1 seed per cell instead of the paper's 5", 'its protocol settings are unknown (no config.json)']
    """
    found = {}
    reference = set(results.reference_models())
    protocols = results.meta.get("protocol", {})
    for model in results.models:
        if model in reference:
            continue
        dev, cav = _check_model(results, model, protocols.get(model))
        cav += evaluation_caveats((results.meta.get("analysis") or {}).get(model))
        # The reasons quote a config.json, which may come from anyone: a terminal shows
        # their control characters rather than acts on them.
        found[model] = {
            "deviations": list(map(printable, dev)),
            "caveats": list(map(printable, cav)),
        }
    if by_model:
        return found
    notes = [f"{m}: {x}" for m, v in found.items() for x in v["deviations"]] if deviations else []
    notes += [f"{m}: (caveat) {x}" for m, v in found.items() for x in v["caveats"]]
    if notes:
        notes.insert(0, COMPARABLE)
    return notes


def not_comparable(results):
    """``{model: [deviations]}`` of the models that are not comparable with the paper."""
    return {
        m: v["deviations"]
        for m, v in comparability(results, by_model=True).items()
        if v["deviations"]
    }


#: What follows a non-comparable model's name in the legends of the figures.
NOT_COMPARABLE_MARK = "(not comparable)"


# ------------------------------------------------------------------ the paper's published results
# ``data/cog_paper_results.csv`` holds supplementary Tables 5-10 of Sariyildiz, Kalantidis,
# Larlus and Alahari, *Concept Generalization in Visual Representation Learning*, ICCV 2021
# (arXiv 2012.05649): top-1 accuracy of linear classifiers, mean and standard deviation over 5
# seeds, for the 31 models of Table 1, on IN-1K and the levels L1-L5, with N = 1, 2, 4, ..., 128
# and all training images per concept. ``tools/parse_paper_tables.py`` wrote it from the paper
# text; ``PROVENANCE.rst`` in the data folder says more. The domains (Tables 5-10) and the shots
# (their columns) are the protocol's own (``_grid``).
#: Model category prefix -> the group name of the paper's Table 1 (lower case).
CATEGORY_NAMES = {
    "": "reference model",
    "a": "architecture",
    "s": "self-supervision",
    "r": "regularization",
    "d": "use of web data",
}


@functools.lru_cache(maxsize=1)
def _paper_rows():
    text = data_path("cog_paper_results.csv").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    rows = []
    for row in csv.DictReader(lines):
        rows.append(
            {
                "model": row["model"],
                "model_as_printed": row["model_as_printed"],
                "category": row["category"],
                "category_name": row["category_name"],
                "table": int(row["table"]),
                "domain": row["domain"],
                "shots": "all" if row["shots"] == "all" else int(row["shots"]),
                "top1_mean": float(row["top1_mean"]),
                "top1_std": float(row["top1_std"]),
                "n_seeds": int(row["n_seeds"]),
            }
        )
    return tuple(rows)


#: The provenance of the paper's published cells (each row of :func:`reference_results`).
PAPER_SOURCE = "ImageNet-CoG paper (ICCV 2021), supplementary Tables 5-10"


@functools.lru_cache(maxsize=1)
def published_cells():
    """``{(model, domain, shots): (mean, std)}`` of the paper's published top-1 cells."""
    return {
        (r["model"], r["domain"], r["shots"]): (r["top1_mean"], r["top1_std"])
        for r in _paper_rows()
    }


def read_paper_results():
    """Read the paper's top-1 accuracies (supplementary Tables 5-10).

    The file is read once; each call returns fresh dicts, which the caller
    may modify.

    Returns
    -------
    list of dict
        One dict per (table, model, shots), 1674 in all (31 models x 6
        domains x 9 shot counts), in table order, models in Table 1 order,
        then by shots. Keys: ``model`` (the Table 1 name, e.g.
        ``"a-ResNet152"``), ``model_as_printed`` (the name as Tables 5-10
        print it, e.g. ``"a-ResNet-152"``), ``category`` (``"a"``, ``"s"``,
        ``"r"``, ``"d"``, or ``""`` for the reference ResNet50),
        ``category_name`` (see `CATEGORY_NAMES`), ``table`` (int, 5-10),
        ``domain`` (``"in1k"``, ``"L1"``, ..., ``"L5"``), ``shots`` (int
        images per concept, or ``"all"``), ``top1_mean`` and ``top1_std``
        (float, percent, as printed with one decimal) and ``n_seeds`` (int,
        5).

    See Also
    --------
    paper_models : the 31 models and their categories.

    Examples
    --------
    >>> from imagenet_cog._comparability import read_paper_results
    >>> rows = read_paper_results()
    >>> len(rows)
    1674
    >>> [r["top1_mean"] for r in rows if r["model"] == "ResNet50" and r["shots"] == "all"]
    [75.8, 67.9, 63.1, 59.0, 58.1, 52.0]
    >>> row = rows[0]
    >>> row["model"], row["domain"], row["shots"], row["top1_mean"], row["top1_std"]
    ('ResNet50', 'in1k', 1, 45.0, 0.7)
    """
    return [dict(row) for row in _paper_rows()]


def paper_models():
    """The 31 models of the paper's Table 1, in its order, with their categories.

    Returns
    -------
    dict
        ``{model: category}``: the Table 1 name and its category prefix
        (``"a"``, ``"s"``, ``"r"``, ``"d"``, or ``""`` for the reference
        ResNet50); `CATEGORY_NAMES` names the categories.

    See Also
    --------
    read_paper_results : their published top-1 accuracies.

    Examples
    --------
    >>> from imagenet_cog._comparability import CATEGORY_NAMES, paper_models
    >>> models = paper_models()
    >>> len(models)
    31
    >>> list(models)[:4]
    ['ResNet50', 'a-T2T-ViT-t-14', 'a-DeiT-S', 'a-DeiT-S-distilled']
    >>> models["s-DINO"], CATEGORY_NAMES[models["s-DINO"]]
    ('s', 'self-supervision')
    """
    return {row["model"]: row["category"] for row in _paper_rows()}


def paper_summaries():
    """``(summaries, meta)`` of :func:`imagenet_cog.reference_results`: the published cells
    as summary rows, each marked with the paper as its source, and the paper's categories
    and protocol per model."""
    rows = read_paper_results()
    summaries = [
        {
            "model": r["model"],
            "domain": r["domain"],
            "shots": r["shots"],
            "metric": "top1",
            "mean": r["top1_mean"],
            "std": r["top1_std"],
            "n": r["n_seeds"],
            "source": PAPER_SOURCE,  # the provenance of each cell: what makes a paper model
        }
        for r in rows
    ]
    categories = {r["model"]: r["category_name"] for r in rows}
    meta = {
        "source": PAPER_SOURCE,
        "categories": categories,
        "protocol": {name: dict(_stated_protocol(), levels="official") for name in categories},
    }
    return summaries, meta
