"""Where the features of a run come from, as the feature stores record it.

Stage "features/store". What ``evaluate`` writes into ``config.json`` per domain, read from the
manifests of a store ROOT: the extraction fingerprint (the store's key, with the weights'
origin and where the settings depart from the architecture's preset), the checksums of the
train and test image-id lists, the split's seed and cap, and the levels (name and content
checksum). Also the check that the stores of one folder come from one extraction, and the
notice for a network whose spec names no weights. Imports nothing of the stage but its
validation helpers: the extractor uses it, and the stores are opened by the caller.
"""

from __future__ import annotations

import logging

from ._base import names_checksum

__all__ = [
    "RANDOM_WEIGHTS",
    "check_stores_agree",
    "differs_from_preset",
    "domain_provenance",
    "extraction_record",
    "notify_random_weights",
    "store_levels",
    "weights_identity",
    "weights_of",
]

#: The weights of a spec that names none (or ``none``): the random initialisation, seed 0.
RANDOM_WEIGHTS = "random"
#: How a split chose its images (its manifest's ``split`` section), recorded per domain.
_SPLIT_FIELDS = ("seed", "cap", "n_test", "official_test_lists", "n_concepts", "copy")
#: Fields of a store's key that say which store it is, not how its features were made.
_WHICH_STORE = ("domain", "split", "split_sha256")
_LOG = logging.getLogger("imagenet_cog")


def weights_of(model, notify=False):
    """How a network's weights were set: ``"random"``, the weights a spec names, or ``"module"``.

    A spec without weights (``"torchvision:resnet50"``) or with ``none`` keeps the random
    initialisation; a network given as a module is whatever it is (``"module"``). With
    ``notify``, a spec that names no weights at all is said to be random in one logged line
    (:func:`notify_random_weights`); ``none`` asks for random weights knowingly.

    Examples
    --------
    >>> weights_of("torchvision:resnet50"), weights_of("torchvision:resnet50:none")
    ('random', 'random')
    >>> weights_of("torchvision:resnet50:IMAGENET1K_V1"), weights_of(object())
    ('IMAGENET1K_V1', 'module')
    """
    if not isinstance(model, str):
        return "module"
    if model.startswith("module:"):  # a store's record of a module
        return "module"
    parts = model.split(":", 2)
    weights = parts[2].strip() if len(parts) == 3 else ""
    if weights.lower() not in ("", "none"):
        return weights
    if notify and not weights:
        notify_random_weights(model)
    return RANDOM_WEIGHTS


def differs_from_preset(model, used, default_layer, zoo, resolve):
    """``{setting: {"used", "preset"}}`` where an extraction departs from its network's preset.

    The preset of a spec's network: the preprocessing of ``preprocessing=None`` or of any
    model-zoo row of the same network (``resolve(key)`` resolves one, ``resolve(None)`` the
    default), the layer right before the classifier (``default_layer``), and no amp. None
    for a network given as a module, whose preset is not known.

    Examples
    --------
    >>> zoo = {"r50": {"spec": "torchvision:resnet50:IMAGENET1K_V1"}, "vit": {"spec": None}}
    >>> sizes = {None: {"crop": 224}, "r50": {"crop": 224}}
    >>> used = {"preprocessing": {"crop": 224}, "layer": "input:fc", "amp": "bf16"}
    >>> differs_from_preset("torchvision:resnet50", used, "input:fc", zoo, sizes.get)
    {'amp': {'used': 'bf16', 'preset': 'off'}}
    """
    if not isinstance(model, str):
        return None
    arch = model.split(":")[:2]
    keys = [k for k, row in zoo.items() if (row.get("spec") or "").split(":")[:2] == arch]
    # A preset that cannot be resolved (a library's preprocessing the extractor cannot
    # follow, where the user gave their own) is none to compare with.
    presets = [p for p in map(resolve, [None, *keys]) if p is not None]
    found = {}
    if not presets:
        found["preprocessing"] = {"used": used["preprocessing"], "preset": None}
    elif used["preprocessing"] not in presets:
        # The settings that differ from the closest preset, and only those.
        mine = used["preprocessing"]
        diffs = [{k for k in set(mine) | set(p) if mine.get(k) != p.get(k)} for p in presets]
        i = min(range(len(presets)), key=lambda j: len(diffs[j]))
        found["preprocessing"] = {
            "used": {k: mine.get(k) for k in sorted(diffs[i])},
            "preset": {k: presets[i].get(k) for k in sorted(diffs[i])},
        }
    if used["layer"] != default_layer:
        found["layer"] = {"used": used["layer"], "preset": default_layer}
    if used["amp"] != "off":
        found["amp"] = {"used": used["amp"], "preset": "off"}
    return found


def random_weights_notice(spec):
    """The one line said when a spec's network keeps its random initialisation."""
    source, _, rest = str(spec).partition(":")
    name = rest.split(":", 1)[0]
    example = f"{source}:{name}:" + ("pretrained" if source == "timm" else "IMAGENET1K_V1")
    return (
        f"imagenet_cog: {spec!r} names no weights: the network keeps its random "
        f"initialisation (seed 0), so its results are not comparable with the paper's; "
        f"name the weights, as in {example!r} (or a weights file, or ':none' for random "
        "weights on purpose)"
    )


def notify_random_weights(spec):
    """Say, in one logged line (logger ``imagenet_cog``, level WARNING), that ``spec`` is random."""
    _LOG.warning(random_weights_notice(spec))


def extraction_record(manifest):
    """The extraction fingerprint of a store: its key without the domain and split, the
    decoder (``"pil"`` when the key does not name one: the Pillow path), the weights' origin,
    the files they were read from (``weights_files``: name, bytes and the file's sha256, when
    the store records them) and where the settings depart from the architecture's preset."""
    out = {k: v for k, v in manifest["key"].items() if k not in _WHICH_STORE}
    out.setdefault("decoder", "pil")
    out["weights"] = manifest["origin"]["weights"]
    out["differs_from_preset"] = manifest["origin"]["differs_from_preset"]
    # The files the weights were read from, by their own sha256 (stores made before it was
    # recorded have none: their key's weights_sha256, the state dict's, still says which).
    if "weights_files" in manifest["origin"]:
        out["weights_files"] = manifest["origin"]["weights_files"]
    return out


def _agreement_fields(store):
    record = extraction_record(store.manifest)
    record.pop("differs_from_preset", None)
    # Where the weights were read from: the key's state dict digest says whether they agree.
    record.pop("weights_files", None)
    record["dim"] = store.manifest["dim"]
    return record


def check_stores_agree(stores):
    """Raise ``ValueError`` naming the store and the field when ``stores`` (``{"<domain>/<split>":
    FeatureStore}``) were not all made by one extraction: model, weights, preprocessing,
    layer, normalisation, amp, decoder, width."""
    first = None
    for name, store in stores.items():
        fields = _agreement_fields(store)
        if first is None:
            first = (name, store, fields)
            continue
        ref_name, ref, reference = first
        differ = [
            k for k in sorted(set(fields) | set(reference)) if fields.get(k) != reference.get(k)
        ]
        if differ:
            shown = "; ".join(
                f"{k} {fields.get(k)!r}, where {ref_name} has {reference.get(k)!r}" for k in differ
            )
            raise ValueError(
                f"the feature store {store.path} was made differently from {ref.path}: {shown}. "
                "The stores of one run must come from one extraction: extract "
                f"{name.split('/')[0]} again with the same model and settings, or evaluate it "
                "in a run of its own"
            )


def store_levels(stores):
    """``{"name", "sha256"}`` of the levels the level domains' stores (``{"<domain>/<split>":
    FeatureStore}``) were extracted with, or None when no store is of a level. Raises
    ``ValueError`` when they name different levels."""
    found = {}
    for name, store in stores.items():
        info = store.manifest["split"]
        if "levels" in info:
            found[name] = (info["levels"], info["levels_sha256"])
    if not found:
        return None
    if len(set(found.values())) > 1:
        shown = ", ".join(f"{where} {name!r} ({sha[:12]})" for where, (name, sha) in found.items())
        raise ValueError(f"the feature stores were extracted with different levels: {shown}")
    name, sha = next(iter(found.values()))
    return {"name": name, "sha256": sha}


def _listed_ids(store):
    """The image ids the split listed (``split.tsv``), decoded or not."""
    text = (store.path / store.manifest["split"]["file"]).read_text(encoding="utf-8")
    return [line.split("\t", 1)[0] for line in text.splitlines()[1:]]


def domain_provenance(train, test):
    """What ``config.json`` records of one domain's two stores: the extraction fingerprint, the
    checksums of the train and test image-id lists (every image the split listed, sorted),
    the images skipped, the check of the first features, how the training images were chosen,
    and the levels."""
    info = train.manifest["split"]
    out = {
        "extraction": extraction_record(train.manifest),
        "train_ids_sha256": names_checksum(_listed_ids(train)),
        "test_ids_sha256": names_checksum(_listed_ids(test)),
        "skipped": {"train": len(train.skipped), "test": len(test.skipped)},
        # The first training images' features: nearly identical ones come from a broken network.
        "feature_check": (train.manifest.get("execution") or {}).get("feature_check"),
        "split": {k: info[k] for k in _SPLIT_FIELDS if k in info},
    }
    if "levels" in info:
        out["levels"] = {"name": info["levels"], "sha256": info["levels_sha256"]}
    return out


def weights_identity(extraction):
    """``[(label, text)]``: the weights of an extraction record, by their two digests, as the
    reports show them. The state dict's sha256 (the store key's ``weights_sha256``) is over the
    tensors, whatever file holds them; a weights file's sha256 is over its bytes, what
    ``sha256sum`` prints. A record made before the files were recorded says so.

    Examples
    --------
    >>> ext = {"weights_sha256": "8ba5", "weights_files": [
    ...     {"name": "mobilenet_v2-b0353104.pth", "bytes": 14212972, "sha256": "b035"}]}
    >>> [label for label, _ in weights_identity(ext)]
    ["weights' state dict sha256", 'weights file sha256']
    >>> weights_identity(ext)[1][1]
    'b035 (mobilenet_v2-b0353104.pth, 14,212,972 bytes: what sha256sum prints)'
    """
    out = []
    if extraction.get("weights_sha256"):
        text = (
            f"{extraction['weights_sha256']} (over the tensors' names, dtypes, shapes and bytes, "
            "whatever file holds them: the store key's weights_sha256)"
        )
        out.append(("weights' state dict sha256", text))
    files = extraction.get("weights_files")
    if files is None:
        out.append(("weights file sha256", "not recorded (stores extracted before it was)"))
    for f in files or ():
        out.append(
            (
                "weights file sha256",
                f"{f['sha256']} ({f['name']}, {f['bytes']:,} bytes: what sha256sum prints)",
            )
        )
    return out
