"""Model specs: ``"SOURCE:NAME[:WEIGHTS]"`` taken apart, before any library is imported.

Stage "features". The source's name is checked against the registry
(:func:`~imagenet_cog._models.registry.parse_spec`); here are the rules of the text itself:
the three fields, the weights field's ``none``, and what makes a field a file's path.
"""

from __future__ import annotations

import os

__all__ = [
    "SPEC_FORMS",
    "bad_spec",
    "is_file_weights",
    "looks_like_path",
    "named_weights",
    "split_spec",
]

#: The spec forms of the built-in sources, as messages list them.
SPEC_FORMS = (
    "'torchvision:NAME[:WEIGHTS]', 'timm:NAME[:pretrained|none|FILE]', "
    "'open_clip:ARCH[:TAG|none|FILE]', 'hf:REPO_ID_OR_DIR[:none]' or "
    "'torchhub:REPO_DIR:ENTRYPOINT[:none|FILE]'"
)
#: Suffixes that make a spec's last field a checkpoint file rather than a weights name.
WEIGHT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".tar")


def bad_spec(spec):
    """The one-line error for a spec that is not ``SOURCE:NAME[:WEIGHTS]`` of a known source."""
    return ValueError(f"bad model spec {spec!r}: use {SPEC_FORMS}, or pass an nn.Module")


def split_spec(spec):
    """``(source, name, weights)`` of a spec: ``weights`` is the rest after ``NAME:``, or ``""``.

    Examples
    --------
    >>> split_spec("timm:convnext_base.fb_in1k:pretrained")
    ('timm', 'convnext_base.fb_in1k', 'pretrained')
    >>> split_spec("torchvision:resnet50")
    ('torchvision', 'resnet50', '')
    """
    source, sep, rest = str(spec).partition(":")
    name, _, weights = rest.partition(":")
    if not sep or not name.strip():
        raise bad_spec(spec)
    return source, name.strip(), weights.strip()


def named_weights(weights):
    """A spec's weights field, or None when it is absent or ``none`` (random weights)."""
    return None if weights.lower() in ("", "none") else weights


def is_file_weights(weights):
    """Whether a spec's weights field names a file (a path, or a checkpoint's suffix)."""
    return os.sep in weights or "/" in weights or weights.endswith(WEIGHT_SUFFIXES)


def looks_like_path(name):
    """Whether a spec's field is meant as a local path rather than a hub id.

    It starts with ``/``, ``./``, ``../`` or ``~``, or holds the platform's separator where
    that is not ``/`` (a hub id ``owner/name`` holds one ``/``).

    Examples
    --------
    >>> looks_like_path("/a/missing/folder"), looks_like_path("facebook/dinov2-small")
    (True, False)
    """
    name = str(name)
    return (
        name.startswith(("/", "./", "../", "~"))
        or name in (".", "..")
        or (os.sep != "/" and os.sep in name)
        or name.count("/") > 1
    )
