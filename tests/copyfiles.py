"""Small copies of ImageNet in the published layouts, written from a folder-per-wnid root.

- webdataset shards as timm's conversion code writes them (rwightman/imagenet-12k,
  ``wds/build_wds.py`` and ``wds/tfds_to_wds.py``, through ``webdataset.TarWriter``): shards
  ``<name>-<split>-<NNNN>.tar`` of samples shuffled across classes; per sample the members
  ``<key>.cls`` (``str(label)``), ``<key>.jpg`` and ``<key>.json`` (``label``, ``class_name``,
  ``width``, ``height``; ``orig_width``/``orig_height`` when resized; ``filename`` in the 1K
  copy), written in the sorted order of their extensions, as ``TarWriter`` writes them;
- Parquet files as the ``datasets`` library writes an image dataset: ``data/<split>-NNNNN-of-
  NNNNN.parquet``, columns ``image: struct<bytes: binary, path: string>`` and ``label: int64``,
  the features in the schema's ``huggingface`` metadata.
"""

import io
import json
import os
import tarfile
import time
from pathlib import Path

import numpy as np
from imagefiles import official_concepts, write_concepts
from PIL import Image


def write_copy_layouts(root):
    """Two official L1 concepts (their 50 official test images and 9 more) as folders, as
    shards (shuffled across classes, the train and validation shards together), as Parquet.

    Returns ``(root, wnids, {image id: bytes})``; the layouts are ``root/folders``,
    ``root/wds`` and ``root/parquet``.
    """
    root = Path(root)
    concepts = official_concepts(n_concepts=2, n_train=9, bad=False)
    write_concepts(root / "folders", concepts)
    images = folder_images(root / "folders")
    ids = sorted(images)
    val_ids = set(ids[::10])
    write_shards(root / "wds", {i: images[i] for i in ids if i not in val_ids}, n_shards=3)
    write_shards(root / "wds", {i: images[i] for i in val_ids}, split="validation", n_shards=2)
    write_parquet(root / "parquet", images, n_files=2)
    return root, sorted(concepts), images


def folder_images(root):
    """``{image id: bytes}`` of a folder-per-wnid root (images only)."""
    out = {}
    for wnid in sorted(os.listdir(root)):
        for name in sorted(os.listdir(Path(root) / wnid)):
            if name.lower().endswith((".jpeg", ".jpg", ".png")):
                out[f"{wnid}/{name}"] = (Path(root) / wnid / name).read_bytes()
    return out


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    info.uname = info.gname = "bigdata"
    info.mtime = time.time()
    tar.addfile(info, io.BytesIO(data))


def resize_short(data, max_side, fmt="JPEG", quality=90):
    """The published processing: the shorter side above ``max_side`` resized (bicubic),
    then re-encoded. Returns ``(bytes, (w, h), (orig w, orig h) or None)``."""
    img = Image.open(io.BytesIO(data))
    img.load()
    w, h = img.size
    orig = None
    if min(w, h) > max_side:
        scale = max_side / min(w, h)
        img = img.convert("RGB").resize(
            tuple(round(d * scale) for d in (w, h)), Image.BICUBIC, reducing_gap=3
        )
        orig = (w, h)
    buf = io.BytesIO()
    if fmt == "JPEG":
        img.convert("RGB").save(buf, "JPEG", subsampling=1, quality=quality)
    else:
        img.convert("RGB").save(buf, fmt, quality=quality)
    return buf.getvalue(), img.size, orig


def write_shards(
    root,
    images,
    *,
    name="imagenet22k",
    split="train",
    n_shards=3,
    seed=0,
    classes=None,
    ext="jpg",
    process=None,
    filename=False,
    cls_offset=0,
):
    """Write ``{image id: bytes}`` as webdataset shards, shuffled across classes.

    ``process(bytes) -> (bytes, size, orig size or None)`` stands for the copy's
    conversion; ``classes`` is the copy's class order (default: the sorted wnids);
    ``cls_offset`` shifts every ``.cls`` (a copy in another class order).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    ids = sorted(images)
    classes = classes or sorted({i.split("/", 1)[0] for i in ids})
    order = np.random.default_rng(seed).permutation(len(ids))
    digits = max(4, len(str(n_shards)))
    paths = []
    for k, chunk in enumerate(np.array_split(order, n_shards)):
        path = root / f"{name}-{split}-{k:0{digits}d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for j in chunk:
                image_id = ids[j]
                wnid, file_name = image_id.split("/", 1)
                key = os.path.splitext(file_name)[0]
                data = images[image_id]
                if process is not None:
                    data, size, orig = process(data)
                else:
                    size, orig = Image.open(io.BytesIO(data)).size, None
                label = classes.index(wnid) + cls_offset
                record = {"label": label, "class_name": wnid, "width": size[0], "height": size[1]}
                if orig is not None:
                    record.update({"orig_width": orig[0], "orig_height": orig[1]})
                if filename:
                    record["filename"] = file_name
                sample = {
                    "cls": str(label).encode(),
                    ext: data,
                    "json": json.dumps(record).encode(),
                }
                for member_ext in sorted(sample):
                    _add(tar, f"{key}.{member_ext}", sample[member_ext])
        paths.append(path)
    return paths


def write_webdataset(root, images, *, name="imagenet22k", split="train", n_shards=3, seed=0):
    """Write ``{image id: bytes}`` as shards with the ``webdataset`` library's ``TarWriter``.

    Without the library, its writing is done here as it does it: a streamed tar
    (``tarfile.open(fileobj, "w|")``, Python's default pax format), per sample the members
    ``<key>.<ext>`` in the sorted order of their extensions, each with the time of writing
    (a float: a pax header per member), mode 0o444, user and group ``bigdata``. The samples,
    shuffled across classes, are those of :func:`write_shards`.
    """
    try:
        from webdataset import TarWriter
    except ImportError:
        TarWriter = _TarWriter
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    ids = sorted(images)
    classes = sorted({i.split("/", 1)[0] for i in ids})
    order = np.random.default_rng(seed).permutation(len(ids))
    paths = []
    for k, chunk in enumerate(np.array_split(order, n_shards)):
        path = root / f"{name}-{split}-{k:04d}.tar"
        with open(path, "wb") as f:
            sink = TarWriter(f)
            for j in chunk:
                wnid, file_name = ids[j].split("/", 1)
                width, height = Image.open(io.BytesIO(images[ids[j]])).size
                label = classes.index(wnid)
                record = {"label": label, "class_name": wnid, "width": width, "height": height}
                sink.write(
                    {
                        "__key__": os.path.splitext(file_name)[0],
                        "cls": str(label).encode(),
                        "jpg": images[ids[j]],
                        "json": json.dumps(record).encode(),
                    }
                )
            sink.close()
        paths.append(path)
    return paths


class _TarWriter:
    """``webdataset.TarWriter``'s writing, for bytes samples (see :func:`write_webdataset`)."""

    def __init__(self, fileobj):
        self.tar = tarfile.open(fileobj=fileobj, mode="w|")  # noqa: SIM115 - closed by close()

    def write(self, sample):
        key = sample["__key__"]
        for ext in sorted(sample):
            if ext == "__key__":
                continue
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(sample[ext])
            info.mtime = time.time()
            info.mode = 0o444
            info.uname = info.gname = "bigdata"
            self.tar.addfile(info, io.BytesIO(sample[ext]))

    def close(self):
        self.tar.close()


def write_parquet(
    root,
    images,
    *,
    split="train",
    n_files=2,
    seed=0,
    names=None,
    path_style="original",
    rows_per_group=4,
    classes=None,
):
    """Write ``{image id: bytes}`` as the ``datasets`` library's Parquet files.

    ``path_style``: ``"original"`` stores the file name (``n01440764_10026.JPEG``),
    ``"hf1k"`` the ImageNet-1K repack's ``<stem>_<wnid>.JPEG``; ``names`` is the ClassLabel
    list (default: the sorted wnids); ``classes`` the label order (default: the sorted wnids).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root) / "data"
    root.mkdir(parents=True, exist_ok=True)
    ids = sorted(images)
    wnids = sorted({i.split("/", 1)[0] for i in ids})
    names = names or wnids
    order = np.random.default_rng(seed).permutation(len(ids))
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    paths = []
    for k, chunk in enumerate(np.array_split(order, n_files)):
        rows, labels = [], []
        for j in chunk:
            wnid, file_name = ids[j].split("/", 1)
            if path_style == "hf1k":
                stem, suffix = os.path.splitext(file_name)
                file_name = f"{stem}_{wnid}{suffix}"
            rows.append({"bytes": images[ids[j]], "path": file_name})
            labels.append((classes or wnids).index(wnid))
        table = pa.table(
            {"image": pa.array(rows, type=image_type), "label": pa.array(labels, pa.int64())}
        ).replace_schema_metadata(meta)
        path = root / f"{split}-{k:05d}-of-{n_files:05d}.parquet"
        pq.write_table(table, path, row_group_size=rows_per_group)
        paths.append(path)
    return paths
