"""Zero-shot on the levels: each domain's official test images classified among its concepts
by a vision-language model's text tower, with the concepts' names.

The image features are those of the feature store (the model's image embeddings); the text
tower is built from the same spec (:func:`~imagenet_cog._models.text_towers.load_text_tower`)
and must belong to the store's image tower: its spec's image tower has the weights (by
sha256) and the feature layer the store was extracted with, else it is refused. The class
names of a domain are, in order of precedence: the user's file (``--classnames FILE``), for
IN-1K OpenAI's curated names (``--classnames openai``, what published CLIP IN-1K numbers use),
the package's names of the official domains, or names made for the domain's concepts
(:func:`~imagenet_cog._analysis.classnames.class_names`, ambiguous names told apart within
the domain). The prompts are the templates given (``--templates FILE``) or OpenAI's 80 ImageNet
templates.

Each domain is a record of ``zeroshot.jsonl`` in the analysis folder (:mod:`.records`): top-1
and top-5, per concept too, the text tower by content, the image tower's weights, the names and
templates by sha256; a resumed run reads back the domains already there.

Another evaluation than the paper's linear probe: labelled zero-shot everywhere, never ranked
with linear-probe numbers.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from .._version import __version__
from .classnames import (
    class_names,
    default_templates,
    read_class_names,
    read_templates,
    shipped_class_names,
    texts_sha256,
)
from .zeroshot import class_embeddings, zero_shot_top

__all__ = [
    "OPENAI_IN1K",
    "ZeroShotTower",
    "domain_names",
    "load_bound_tower",
    "resolve_templates",
    "run_zeroshot_domain",
    "store_spec",
    "zeroshot_settings",
]

#: ``classnames=`` for OpenAI's curated IN-1K names (OpenCLIP's ``IMAGENET_CLASSNAMES``).
OPENAI_IN1K = "openai"
#: The version of how a domain is computed and recorded.
ZEROSHOT_FORMAT = 1
_TOP = 5


class ZeroShotTower:
    """A text tower bound to the image features it classifies.

    Attributes
    ----------
    tower : TextTower
    spec : str
        The spec it was built from.
    image : dict
        ``weights_sha256`` and ``layer`` of the image tower of the same spec (what the store
        must have been extracted with), or None when the features record no extraction
        (arrays: not checked).
    """

    def __init__(self, tower, spec, image):
        self.tower, self.spec, self.image = tower, spec, image


def store_spec(extraction):
    """The spec a store's extraction can be loaded from again: the spec it records, with a
    weights file named by content (``sha256-...``) replaced by the file it recorded.

    Raises
    ------
    ValueError
        When the file is no longer where the extraction recorded it.
    """
    spec = str(extraction.get("model") or "")
    source, _, rest = spec.partition(":")
    name, _, weights = rest.partition(":")
    if weights.startswith("sha256-"):
        path = str(extraction.get("weights") or "")
        if not Path(path).is_file():
            raise ValueError(
                f"the features were extracted with a weights file ({spec}) that is no longer at "
                f"{path or 'the path recorded'}: give the spec with its file, --text-tower "
                f"{source}:{name}:FILE (text_tower= in Python)"
            )
        return f"{source}:{name}:{path}"
    return spec


def load_bound_tower(spec, extraction):
    """The :class:`ZeroShotTower` of ``spec``, refused unless its image tower is the one the
    features were extracted with (``extraction``: the store's record, or None for arrays).

    Raises
    ------
    ValueError
        For a spec without a text tower, or whose image tower has other weights or another
        feature layer than the store's (named, with both values).
    """
    from .._models.text_towers import load_text_tower
    from ..features import FeatureExtractor

    image = None
    if extraction is not None:
        found = FeatureExtractor(spec).fingerprint()
        image = {"weights_sha256": found["weights_sha256"], "layer": found["layer"]}
        stored = {k: extraction.get(k) for k in image}
        differ = [k for k in image if image[k] != stored[k]]
        if differ:
            shown = "; ".join(
                f"{k}: {stored[k]} in the store, {image[k]} for {spec}" for k in differ
            )
            raise ValueError(
                f"the text tower of {spec} does not belong to the image tower the features were "
                f"extracted with ({shown}): zero-shot needs the text tower of the same model "
                "and its image embeddings; give that model's spec with --text-tower "
                "(text_tower= in Python)"
            )
    return ZeroShotTower(load_text_tower(spec), spec, image)


def resolve_templates(templates):
    """``(templates, source)``: a templates file's, a list given in Python, or OpenAI's 80
    ImageNet templates (:func:`~imagenet_cog._analysis.classnames.default_templates`)."""
    if templates is None:
        return default_templates()
    if isinstance(templates, (str, Path)):
        return read_templates(templates), f"file {Path(templates).name}"
    found = [str(t) for t in templates]
    for t in found:
        if t.count("{c}") != 1:
            raise ValueError(f"a template holds {{c}} once, where the class name goes, got {t!r}")
    return found, "given in Python"


def _openai_in1k():
    from ..taxonomy import imagenet1k_wnids

    try:
        from open_clip import __version__ as version
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES
    except ImportError:
        raise ValueError(
            "classnames='openai' reads OpenAI's IN-1K names from OpenCLIP: pip install "
            "open_clip_torch, or give a names file with --classnames FILE"
        ) from None
    wnids = list(imagenet1k_wnids())
    names = dict(zip(wnids, IMAGENET_CLASSNAMES))
    return names, f"open_clip {version} zero_shot_metadata.IMAGENET_CLASSNAMES (OpenAI's IN-1K)"


def domain_names(domain, wnids, classnames=None, taxonomy=None):
    """``(names, source)``: one readable name per concept of a domain, in ``wnids``' order.

    Parameters
    ----------
    domain : str
    wnids : sequence of str
    classnames : None, "openai", path or mapping
        A names file (``wnid<TAB>name``), ``{wnid: name}``, ``"openai"`` (OpenAI's curated
        names for IN-1K; the levels keep the package's), or None (the package's).
    taxonomy : Taxonomy, optional

    Raises
    ------
    ValueError
        When the names given miss a concept of the domain, or name two of its concepts
        alike (the file and the concepts named).
    """
    wnids = [str(w) for w in wnids]
    given, source = None, None
    if classnames == OPENAI_IN1K:
        if domain == "in1k":
            given, source = _openai_in1k()
    elif isinstance(classnames, (str, Path)):
        given, source = read_class_names(classnames), f"file {Path(classnames).name}"
    elif classnames is not None:
        given, source = {str(k): str(v) for k, v in dict(classnames).items()}, "given in Python"
    if given is not None:
        missing = [w for w in wnids if w not in given]
        if missing:
            raise ValueError(
                f"the class names ({source}) name no concept {', '.join(missing[:3])} of "
                f"{domain} ({len(missing)} missing): add them to the file given to --classnames"
            )
        names = [given[w] for w in wnids]
    else:
        shipped = shipped_class_names()
        if all(w in shipped for w in wnids):
            names = [shipped[w] for w in wnids]
            source = "imagenet_cog data/zeroshot_classnames.tsv (WordNet lemmas)"
        else:
            rows = class_names({domain: wnids}, taxonomy)
            names = [r["name"] for r in rows]
            source = "WordNet lemmas, made for the domain's concepts"
    seen = {}
    for w, name in zip(wnids, names):
        if name.lower() in seen:
            raise ValueError(
                f"the class names ({source}) call {seen[name.lower()]} and {w} of {domain} "
                f"both {name!r}: zero-shot cannot tell them apart; name them apart in the file "
                "given to --classnames"
            )
        seen[name.lower()] = w
    return names, source


def zeroshot_settings(bound, templates, templates_source, classnames):
    """What shapes every zero-shot domain, as ``zeroshot.jsonl`` records it."""
    option = classnames if classnames in (None, OPENAI_IN1K) else "given"
    return {
        "format": ZEROSHOT_FORMAT,
        "text_tower": bound.tower.identity(),
        "image_tower": bound.image,
        "templates": {
            "n": len(templates),
            "sha256": texts_sha256(templates),
            "source": templates_source,
        },
        "classnames": option,
        "logits": "logit_scale * cos(image, class) + logit_bias (the model's own)",
    }


def run_zeroshot_domain(
    domain,
    arrays,
    bound,
    templates,
    *,
    classnames,
    place,
    cache_dir,
    records,
    inputs,
    model,
    say=print,
    progress=False,
):
    """One domain's zero-shot record: read back from ``records`` where there, else computed
    (class embeddings cached by content) and appended.

    ``inputs`` (what the record is bound to) gets the names' sha256 and source here.
    """
    _, y_train, X_test, y_test = arrays
    wnids = np.unique(np.asarray(y_train)).astype(str)
    names, names_source = domain_names(domain, wnids.tolist(), classnames)
    inputs = {
        **inputs,
        "classnames": {"sha256": texts_sha256(names), "source": names_source},
    }
    if records is not None:
        found = records.find((domain,), inputs)
        if found is not None:
            return found
    y_test = np.asarray(y_test).astype(str)
    codes = np.searchsorted(wnids, y_test)
    bad = (codes >= len(wnids)) | (wnids[np.minimum(codes, len(wnids) - 1)] != y_test)
    if bad.any():
        raise ValueError(
            f"{domain}: test labels {sorted(set(y_test[bad].tolist()))[:3]} are not concepts "
            "of the domain's training set"
        )
    say(f"{domain}: zero-shot over {len(wnids)} class names x {len(templates)} templates")
    start = time.perf_counter()
    emb, key = class_embeddings(
        bound.tower, names, templates, device=place.device, cache_dir=cache_dir, progress=progress
    )
    top = zero_shot_top(X_test, emb, top=_TOP)
    right = top == codes[:, None]
    concepts, index, images = np.unique(y_test, return_inverse=True, return_counts=True)
    record = {
        "model": model,
        "domain": domain,
        "inputs": inputs,
        "top1": 100.0 * float(right[:, 0].mean()),
        "top5": 100.0 * float(right.any(axis=1).mean()),
        "n_test": len(y_test),
        "n_classes": len(wnids),
        "n_features": int(X_test.shape[1]),
        "concepts_sha256": hashlib.sha256("\n".join(concepts.tolist()).encode()).hexdigest(),
        "concept_images": images.astype(int).tolist(),
        "concept_hits": np.bincount(index, weights=right[:, 0], minlength=len(concepts))
        .astype(int)
        .tolist(),
        "concept_hits_top5": np.bincount(index, weights=right.any(axis=1), minlength=len(concepts))
        .astype(int)
        .tolist(),
        "class_embeddings_sha256": hashlib.sha256(np.ascontiguousarray(emb).tobytes()).hexdigest(),
        "class_embeddings_cached": bool(key.get("cached")),
        "logit_scale": float(bound.tower.logit_scale),
        "logit_bias": float(bound.tower.logit_bias),
        "device": str(place.device),
        "time_s": round(time.perf_counter() - start, 3),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "library_version": __version__,
    }
    record["concepts"] = concepts.tolist()
    return records.append(record) if records is not None else record


def summarize(record):
    """A domain's zero-shot details for ``analysis.json``: its names and templates, and its
    accuracy per concept."""
    images = np.maximum(np.asarray(record["concept_images"], dtype=float), 1)
    return {
        "classnames": record["inputs"]["classnames"],
        "n_classes": record["n_classes"],
        "record": record.get("record_sha256"),
        "concepts": {
            "wnids": record["concepts"],
            "images": record["concept_images"],
            "top1": [
                round(float(x), 4) for x in 100.0 * np.asarray(record["concept_hits"]) / images
            ],
            "top5": [
                round(float(x), 4) for x in 100.0 * np.asarray(record["concept_hits_top5"]) / images
            ],
        },
    }
