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
    "default_name",
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


def spec_by_content(spec, weights_sha256):
    """``spec`` with a checkpoint file's path replaced by its content: the same file given
    by another path (relative, absolute, moved) is the same model.

    Examples
    --------
    >>> spec_by_content("torchvision:resnet18:/tmp/r18.pth", "ab" * 32)
    'torchvision:resnet18:sha256-abababababababab'
    >>> spec_by_content("torchvision:resnet18:IMAGENET1K_V1", "ab" * 32)
    'torchvision:resnet18:IMAGENET1K_V1'
    """
    try:
        source, name, weights = split_spec(spec)
    except (ValueError, TypeError):  # a module, or no spec
        return spec
    if weights and is_file_weights(weights) and weights_sha256:
        return f"{source}:{name}:sha256-{weights_sha256[:16]}"
    return spec


def short_name(spec, random=False):
    """A short name for results and figures: the architecture with its weights tag, its
    checkpoint's stem, or ``random``.

    Examples
    --------
    >>> short_name("torchvision:resnet50:IMAGENET1K_V1")
    'resnet50-IMAGENET1K_V1'
    >>> short_name("torchvision:mobilenet_v2:/venv/site-packages/w/mobilenet_v2-b0353104.pth")
    'mobilenet_v2-b0353104'
    >>> short_name("torchvision:resnet18", random=True), short_name("hf:facebook/dinov2-small")
    ('resnet18-random', 'dinov2-small')
    >>> short_name("module:torchvision.models.resnet.ResNet")
    'ResNet'
    """
    spec = str(spec)
    if spec.startswith("module:"):
        return spec.rsplit(".", 1)[-1]
    try:
        source, name, weights = split_spec(spec)
    except ValueError:
        return spec
    arch = name.rstrip("/").rsplit("/", 1)[-1]
    if source == "torchhub":  # torchhub:REPO_DIR:ENTRYPOINT[:weights]
        arch, _, weights = weights.partition(":")
    if random:
        return f"{arch}-random"
    if not weights or weights.lower() == "none":
        return arch
    if is_file_weights(weights):
        stem = os.path.splitext(os.path.basename(weights.rstrip("/")))[0]
        return stem if stem.startswith(arch) else f"{arch}-{stem}"
    return f"{arch}-{weights}"


def default_name(key_model, weights=None, random=False):
    """The name a run gets by default from its extraction's record: :func:`short_name` of the
    spec as the user gave it, so a checkpoint file is named by its architecture and file stem
    (``weights``: the path the extraction recorded), never by the content hash the store's
    key holds in its place (:func:`spec_by_content`).

    Examples
    --------
    >>> default_name("torchvision:mobilenet_v2:sha256-8ba5582fe4b7c68f",
    ...              "/venv/w/mobilenet_v2-b0353104.pth")
    'mobilenet_v2-b0353104'
    >>> default_name("torchvision:resnet18", "random", random=True)
    'resnet18-random'
    """
    spec = str(key_model)
    try:
        source, name, field = split_spec(spec)
    except ValueError:
        return short_name(spec, random=random)
    if field.startswith("sha256-") and weights and is_file_weights(str(weights)):
        spec = f"{source}:{name}:{weights}"
    return short_name(spec, random=random)
