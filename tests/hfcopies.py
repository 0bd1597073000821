"""Copies of ImageNet written by the real ``webdataset`` and ``datasets`` libraries.

The layouts a researcher plausibly holds: shards written by ``webdataset.ShardWriter`` under
the names its own examples use (``shard-000000.tar``), Parquet files written by
``datasets.Dataset.to_parquet`` (with file names, or made from PIL images without them), a
folder written by ``save_to_disk``, and the Hugging Face Hub's image folders
(``train/<wnid>/``, ``validation/<wnid>/``).
"""

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def _datasets():
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()  # its bars would mix with the output tested
    return datasets


def hf_dataset(images, *, names=None, image_column="image", with_paths=True, num_classes=None):
    """A ``datasets.Dataset`` of ``{image id: bytes}``: an image column (bytes, and the file
    name unless ``with_paths`` is false) and a ``label`` ClassLabel column, label k for the
    k-th of the sorted wnids (``names``: the class names in that order, default the wnids;
    ``num_classes``: nameless classes)."""
    datasets = _datasets()
    ids = sorted(images)
    wnids = sorted({i.split("/", 1)[0] for i in ids})
    if num_classes is not None:
        label = datasets.ClassLabel(num_classes=num_classes)
    else:  # names[k] is the name of wnids[k]
        label = datasets.ClassLabel(names=names or wnids)
    labels = [wnids.index(i.split("/", 1)[0]) for i in ids]
    if with_paths:
        column = [{"bytes": images[i], "path": i.split("/", 1)[1]} for i in ids]
    else:  # a dataset made from PIL images: no file names
        column = [Image.open(io.BytesIO(images[i])).convert("RGB") for i in ids]
    features = datasets.Features({image_column: datasets.Image(), "label": label})
    return datasets.Dataset.from_dict({image_column: column, "label": labels}, features=features)


def hf_parquet(root, images, *, split="train", **kwargs):
    """Write ``{image id: bytes}`` with ``Dataset.to_parquet`` as
    ``root/data/<split>-00000-of-00001.parquet``; returns its path."""
    path = Path(root) / "data" / f"{split}-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    hf_dataset(images, **kwargs).to_parquet(str(path))
    return path


def hf_save_to_disk(root, parts):
    """``DatasetDict({split: dataset}).save_to_disk(root)`` of ``{split: {image id: bytes}}``."""
    datasets = _datasets()
    wnids = sorted({i.split("/", 1)[0] for images in parts.values() for i in images})
    datasets.DatasetDict(
        {split: hf_dataset(images, names=wnids) for split, images in parts.items()}
    ).save_to_disk(str(root))
    return Path(root)


def wds_shards(root, images, *, pattern="shard-%06d.tar", maxcount=40, seed=0):
    """Write ``{image id: bytes}`` with ``webdataset.ShardWriter`` (samples shuffled across
    classes; per sample ``.jpg``, ``.cls`` and ``.json``), the shards named by ``pattern`` as
    the library's own examples name them."""
    wds = pytest.importorskip("webdataset")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    ids = sorted(images)
    wnids = sorted({i.split("/", 1)[0] for i in ids})
    order = np.random.default_rng(seed).permutation(len(ids))
    with wds.ShardWriter(str(root / pattern), maxcount=maxcount, verbose=0) as sink:
        for j in order:
            wnid, name = ids[j].split("/", 1)
            label = wnids.index(wnid)
            sink.write(
                {
                    "__key__": os.path.splitext(name)[0],
                    "jpg": images[ids[j]],
                    "cls": str(label).encode(),
                    "json": json.dumps({"label": label, "class_name": wnid}).encode(),
                }
            )
    return sorted(root.glob("*.tar"))


def image_folders(root, parts):
    """The Hub's image-folder layout: ``root/<split>/<wnid>/<file>`` of ``{split: {id: bytes}}``."""
    root = Path(root)
    for split, images in parts.items():
        for image_id, data in images.items():
            path = root / split / image_id
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return root
