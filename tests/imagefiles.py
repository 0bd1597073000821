"""Tiny image collections laid out like ImageNet, written by the tests themselves.

Images are 8 to 40 pixels, made from a seeded random generator, so the same
call always writes the same bytes.
"""

import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from imagenet_cog._data.labels import read_val_labels
from imagenet_cog.levels import load_levels
from imagenet_cog.taxonomy import imagenet1k_wnids

#: Kinds of file; the last three cannot be decoded.
DECODABLE = ("jpeg", "png", "cmyk", "gray", "palette")
UNDECODABLE = ("truncated", "random", "empty")


def image_bytes(kind, seed):
    """The bytes of one small image file of the given kind."""
    rng = np.random.default_rng(seed)
    w, h = (int(x) for x in rng.integers(8, 41, size=2))
    rgb = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    if kind == "jpeg":
        Image.fromarray(rgb).save(buf, "JPEG", quality=90)
    elif kind == "png":
        Image.fromarray(rgb).save(buf, "PNG")
    elif kind == "cmyk":
        Image.fromarray(rgb).convert("CMYK").save(buf, "JPEG")
    elif kind == "gray":
        Image.fromarray(rgb[..., 0]).save(buf, "PNG")
    elif kind == "palette":
        image = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
        image.info["transparency"] = 0
        image.save(buf, "PNG", transparency=0)
    elif kind == "truncated":
        noise = rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
        Image.fromarray(noise).save(buf, "JPEG", quality=95)
        return buf.getvalue()[: len(buf.getvalue()) // 2]
    elif kind == "random":
        return rng.integers(0, 256, size=300, dtype=np.uint8).tobytes()
    elif kind == "empty":
        return b""
    else:
        raise ValueError(kind)
    return buf.getvalue()


def write_concepts(root, concepts, layout="folders"):
    """Write ``{wnid: [(file name, kind), ...]}`` as wnid folders or wnid tars.

    Returns ``{image id: kind}``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    kinds = {}
    for c, (wnid, files) in enumerate(sorted(concepts.items())):
        blobs = []
        for i, (name, kind) in enumerate(files):
            blobs.append((name, image_bytes(kind, seed=1000 * c + i)))
            kinds[f"{wnid}/{name}"] = kind
        if layout == "folders":
            (root / wnid).mkdir()
            for name, data in blobs:
                (root / wnid / name).write_bytes(data)
            (root / wnid / "notes.txt").write_text("not an image")
        else:
            with tarfile.open(root / f"{wnid}.tar", "w") as tar:
                for name, data in blobs:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return kinds


def official_concepts(n_concepts=2, n_train=9, bad=True):
    """Concepts of official L1 with their 50 official test files plus train files.

    With ``bad``, the train files include a CMYK JPEG, a grayscale PNG, a
    palette PNG, a truncated JPEG, random bytes and an empty file.
    """
    levels = load_levels("official")
    wnids = levels["L1"][:n_concepts]
    extra = ["cmyk", "gray", "palette", "truncated", "random", "empty"] if bad else []
    concepts = {}
    for wnid in wnids:
        files = [(p.split("/", 1)[1], "jpeg") for p in levels.test_images[wnid]]
        kinds = ["jpeg"] * n_train
        for i, kind in enumerate(extra):
            kinds[i % n_train] = kind
        files += [(f"{wnid}_{990000 + i}.JPEG", k) for i, k in enumerate(kinds)]
        concepts[wnid] = files
    return concepts


def plain_concepts(wnids, n_images, kinds=None):
    """``n_images`` JPEG files per concept (``kinds`` overrides some)."""
    concepts = {}
    for wnid in wnids:
        files = [(f"{wnid}_{i}.JPEG", "jpeg") for i in range(n_images)]
        for i, kind in (kinds or {}).get(wnid, {}).items():
            files[i] = (files[i][0], kind)
        concepts[wnid] = files
    return concepts


def write_in1k(root, n_classes=3, n_train=4, n_val=2, val_layout="flat"):
    """A mini ImageNet-1K: ``train/<wnid>/`` and a flat or foldered ``val/``."""
    root = Path(root)
    wnids = list(imagenet1k_wnids())[:n_classes]
    write_concepts(root / "train", plain_concepts(wnids, n_train))
    labels = read_val_labels()
    val = {w: [] for w in wnids}
    for name, wnid in sorted(labels.items()):
        if wnid in val and len(val[wnid]) < n_val:
            val[wnid].append(name)
    (root / "val").mkdir(parents=True)
    for c, wnid in enumerate(wnids):
        for i, name in enumerate(val[wnid]):
            folder = root / "val" if val_layout == "flat" else root / "val" / wnid
            folder.mkdir(exist_ok=True)
            (folder / name).write_bytes(image_bytes("jpeg", seed=50_000 + 100 * c + i))
    return wnids, val
