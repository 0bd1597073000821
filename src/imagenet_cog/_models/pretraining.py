"""What a model saw before it was evaluated: the specs known to be pretrained on ImageNet-21K
images, which hold the concepts of the CoG levels.

Stage "features". The table is data, with its sources: ``data/pretraining_imagenet21k.tsv``
(a pattern, the data, where that is stated). :func:`imagenet21k_pretraining` matches a spec's
name, tag and weights file name against it; the comparability verdict names a match as a
caveat, as the paper sets d-CLIP apart for its pretraining data. A timm spec without a tag is
matched with the tag timm resolves it to (``vit_base_patch16_224`` is ``augreg2_in21k_ft_in1k``)
when timm is installed.
"""

from __future__ import annotations

import functools
import os
import re

from .._base import data_path
from .registry import parse_spec
from .spec import is_file_weights, looks_like_path

__all__ = ["PRETRAINING_FILE", "imagenet21k_pretraining", "pretraining_caveat", "pretraining_table"]

#: The table, in the package's data.
PRETRAINING_FILE = "pretraining_imagenet21k.tsv"


@functools.cache
def pretraining_table():
    """The rows of the table: ``(compiled pattern, pattern, data, source)``, in file order."""
    rows = []
    text = data_path(PRETRAINING_FILE).read_text(encoding="utf-8")
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#", "pattern\t")):
            continue
        pattern, data, source = line.split("\t")
        compiled = re.compile(rf"(?<![a-z0-9])(?:{pattern})(?![a-z0-9])", re.IGNORECASE)
        rows.append((compiled, pattern, data, source))
    return tuple(rows)


def _timm_default_tag(name):
    """The pretrained tag timm gives a model name without one, or ``""``."""
    try:
        from timm.models import get_pretrained_cfg
    except ImportError:
        return ""
    try:
        cfg = get_pretrained_cfg(name)
    except (RuntimeError, ValueError, KeyError):
        return ""
    return str(getattr(cfg, "tag", "") or "")


def _names_of(spec):
    """The parts of a spec that say which weights it holds, or None for random weights."""
    try:
        source, name, weights = parse_spec(spec)
    except ValueError:
        return None
    entry, _, rest = weights.partition(":") if source == "torchhub" else ("", "", weights)
    if rest.strip().lower() == "none":
        return None
    if source == "timm" and "." not in name:
        name = f"{name}.{_timm_default_tag(name)}"
    if looks_like_path(name):
        name = os.path.basename(os.path.normpath(name))
    parts = [name, entry]
    if rest and is_file_weights(rest):
        parts.append(os.path.basename(rest))
    elif rest:
        parts.append(rest)
    return " ".join(p for p in parts if p)


def imagenet21k_pretraining(spec):
    """The table's row a spec matches: ``{"pattern", "data", "source", "matched"}``, or None.

    Examples
    --------
    >>> imagenet21k_pretraining("timm:eva02_base_patch14_224.mim_in22k:pretrained")["matched"]
    'mim_in22k'
    >>> imagenet21k_pretraining("torchvision:resnet50:IMAGENET1K_V1") is None
    True
    """
    text = _names_of(spec) if isinstance(spec, str) else None
    if not text:
        return None
    for compiled, pattern, data, source in pretraining_table():
        found = compiled.search(text)
        if found:
            return {"pattern": pattern, "data": data, "source": source, "matched": found.group(0)}
    return None


def pretraining_caveat(spec):
    """The caveat of a spec pretrained on ImageNet-21K images, or None."""
    row = imagenet21k_pretraining(spec)
    if row is None:
        return None
    return (
        f"pretrained on ImageNet-21K images ({row['matched']!r} in {spec!r}: {row['data']}; "
        f"{row['source']}): the concepts of L1-L5 come from ImageNet-21K, so it may have seen "
        "their images, as the paper says of d-CLIP's pretraining data; its drop from IN-1K to "
        "L5 is not a measure of generalization to unseen concepts alone"
    )
