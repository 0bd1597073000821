"""Zero-shot classification: image features against the text embeddings of the class names.

The classifier of CLIP (Radford et al., 2021) as OpenCLIP builds it
(``open_clip.build_zero_shot_classifier``): each class name is put in every prompt template,
the text tower embeds the prompts, each embedding is l2-normalised, a class's embedding is the
mean over its templates, normalised again. An image's logits are ``scale * cos(image, class)
+ bias``, with the model's own learned scale (``exp(logit_scale)``, 100 for trained CLIPs) and
bias (SigLIP's; 0 for CLIP), so that they are the logits the model itself gives; the ranking,
hence top-1 and top-5, does not depend on them. Equal logits rank in class order.

The class embeddings of a model, its class names and its templates are computed once and
cached (:func:`class_embeddings`): the file's name is the sha256 of everything that shapes them
(the text tower's weights and tokenizer by content, the names, the templates, the format),
its contents are written atomically and read without unpickling, and a file whose recorded
key or shape differs is computed again.

This is another evaluation than the paper's linear probe: its numbers are never ranked with
linear-probe numbers.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np

from .._fileio import atomic_write_bytes
from .classnames import prompt, texts_sha256

__all__ = [
    "EMBEDDINGS_FORMAT",
    "class_embeddings",
    "default_cache_dir",
    "embeddings_key",
    "zero_shot_logits",
    "zero_shot_top",
]

#: The version of the cached files' layout and of the way they are computed.
EMBEDDINGS_FORMAT = 1
#: Class names embedded per batch (times the templates: the prompts of one pass).
_CLASSES_PER_BATCH = 16
#: Image rows whose logits are held at once.
_ROWS = 4096


def default_cache_dir():
    """``$IMAGENET_COG_CACHE/text_embeddings`` (default ``~/.cache/imagenet_cog/...``)."""
    base = os.environ.get("IMAGENET_COG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "imagenet_cog"
    )
    return Path(base) / "text_embeddings"


def embeddings_key(tower, names, templates):
    """Everything that shapes the class embeddings of ``tower``, as a dict."""
    return {
        "format": EMBEDDINGS_FORMAT,
        "text_tower": tower.identity(),
        "n_classes": len(names),
        "names_sha256": texts_sha256(names),
        "n_templates": len(templates),
        "templates_sha256": texts_sha256(templates),
    }


def _digest(key):
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def _tokens_sha256(tower, names, templates):
    """sha256 of every prompt's tokens: the key of a tokenizer of unknown kind."""
    h = hashlib.sha256()
    for start in range(0, len(names), _CLASSES_PER_BATCH):
        batch = [prompt(t, n) for n in names[start : start + _CLASSES_PER_BATCH] for t in templates]
        for name, tensor in sorted(tower.tokenize(batch).items()):
            h.update(name.encode() + tensor.cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _read_cached(path, key, n_classes):
    try:
        with np.load(path, allow_pickle=False) as f:
            recorded = json.loads(str(f["key"]))
            emb = np.array(f["embeddings"])
    except (OSError, ValueError, KeyError):
        return None
    if recorded != key or emb.ndim != 2 or emb.shape[0] != n_classes:
        return None
    if not np.isfinite(emb).all():
        return None
    return emb


def class_embeddings(
    tower, names, templates, *, device=None, cache_dir=None, batch_classes=None, progress=False
):
    """The l2-normalised text embedding of each class name, averaged over the templates.

    Parameters
    ----------
    tower : TextTower
        From :func:`~imagenet_cog._models.text_towers.load_text_tower`.
    names : sequence of str
        One per class, in the order of the classifier's columns.
    templates : sequence of str
        Prompt templates, each with ``{c}`` where the name goes.
    device : torch.device, optional
        Where the text tower runs (the CPU by default).
    cache_dir : path or False, optional
        Where the embeddings are cached (:func:`default_cache_dir` by default); ``False``:
        no cache.
    batch_classes : int, optional
        Class names per pass of the text tower (16 by default).
    progress : bool

    Returns
    -------
    embeddings : ndarray of float32, shape (n_classes, embed_dim)
    key : dict
        :func:`embeddings_key`, with ``file`` (the cache file, or None) and ``cached`` (read
        from the cache or not).
    """
    import torch

    names, templates = [str(n) for n in names], [str(t) for t in templates]
    if not names or not templates:
        raise ValueError("zero-shot classification needs at least one class name and template")
    key = embeddings_key(tower, names, templates)
    if key["text_tower"]["tokenizer_sha256"] is None:  # unknown tokenizer: its outputs
        key["prompt_tokens_sha256"] = _tokens_sha256(tower, names, templates)
    path = None
    if cache_dir is not False:
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        path = folder / f"{_digest(key)}.npz"
        if path.is_file():
            emb = _read_cached(path, key, len(names))
            if emb is not None:
                return emb, {**key, "file": str(path), "cached": True}
    device = torch.device("cpu") if device is None else device
    model = tower.model.to(device)
    per = batch_classes or _CLASSES_PER_BATCH
    parts = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(names), desc="class embeddings", unit="class", leave=False)
    try:
        with torch.inference_mode():
            for start in range(0, len(names), per):
                batch = names[start : start + per]
                tokens = tower.tokenize([prompt(t, n) for n in batch for t in templates])
                tokens = {k: v.to(device) for k, v in tokens.items()}
                emb = torch.nn.functional.normalize(tower.encode(tokens).float(), dim=-1)
                emb = emb.reshape(len(batch), len(templates), -1).mean(dim=1)
                parts.append(torch.nn.functional.normalize(emb, dim=-1).cpu())
                if bar is not None:
                    bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
        model.to("cpu")
    emb = torch.cat(parts).numpy().astype(np.float32)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, embeddings=emb, key=np.array(json.dumps(key, sort_keys=True)))
        atomic_write_bytes(path, buffer.getvalue())
    return emb, {**key, "file": str(path) if path else None, "cached": False}


def zero_shot_logits(features, embeddings, logit_scale=100.0, logit_bias=0.0):
    """``logit_scale * cos(feature, class) + logit_bias`` for every row and class.

    Parameters
    ----------
    features : array-like of shape (n_samples, embed_dim)
        Image embeddings (normalised here).
    embeddings : ndarray of shape (n_classes, embed_dim)
        From :func:`class_embeddings`.
    logit_scale, logit_bias : float
        The model's (:class:`~imagenet_cog._models.text_towers.TextTower`).

    Returns
    -------
    ndarray of float32, shape (n_samples, n_classes)

    Examples
    --------
    >>> import numpy as np
    >>> zero_shot_logits(np.array([[2.0, 0.0]]), np.array([[1.0, 0.0], [0.0, 1.0]]))
    array([[100.,   0.]], dtype=float32)
    """
    X = np.asarray(features, dtype=np.float32)
    W = np.asarray(embeddings, dtype=np.float32)
    if X.ndim != 2 or X.shape[1] != W.shape[1]:
        raise ValueError(
            f"the image features have {X.shape[-1]} dimensions but the class embeddings "
            f"{W.shape[1]}: zero-shot needs the image embeddings of the text tower's own model "
            "(its image tower's output, as open_clip: and hf: CLIP specs extract it)"
        )
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    X = X / np.where(norms > 0, norms, 1)
    return (np.float32(logit_scale) * (X @ W.T) + np.float32(logit_bias)).astype(np.float32)


def zero_shot_top(features, embeddings, top=5):
    """The ``top`` classes of each row, highest logit first (equal logits in class order).

    Parameters
    ----------
    features : array-like of shape (n_samples, embed_dim)
    embeddings : ndarray of shape (n_classes, embed_dim)
    top : int

    Returns
    -------
    ndarray of int64, shape (n_samples, min(top, n_classes))
        Class indices: column 0 is top-1.

    Examples
    --------
    >>> import numpy as np
    >>> zero_shot_top(np.array([[1.0, 0.2]]), np.eye(2), top=2).tolist()
    [[0, 1]]
    """
    top = min(int(top), len(embeddings))
    out = np.empty((len(features), top), dtype=np.int64)
    for r0 in range(0, len(features), _ROWS):
        logits = zero_shot_logits(features[r0 : r0 + _ROWS], embeddings)
        out[r0 : r0 + len(logits)] = np.argsort(-logits, axis=1, kind="stable")[:, :top]
    return out
