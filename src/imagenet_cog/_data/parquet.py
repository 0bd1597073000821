"""The reader of Parquet files, as the Hugging Face ``datasets`` library stores an image dataset.

A copy's files (``data/train-00000-of-00294.parquet``...) hold a column ``image`` of
``struct<bytes: binary, path: string>`` and a column ``label`` (int64), the class names in
the schema's ``huggingface`` metadata. Listing reads the metadata and the ``image.path`` and
``label`` columns (and the first image of each file, to tell its encoding), never the other
images. Read with pyarrow (the ``[parquet]`` extra).
"""

from __future__ import annotations

import json
import os

from .._base import WNID_RE
from .copies import copy_class_list, count_sample, label_sample, new_counts, sniff
from .sources import ParquetImage, pyarrow_parquet, read_parquet_image

__all__ = ["parquet_entries"]


def _list_parquet(path):
    """``{"names": class names or None, "rows": [[row group, row, file name, label]]}``.

    Reads the metadata and the ``image.path`` and ``label`` columns, not the image bytes.
    """
    pq = pyarrow_parquet()
    pf = pq.ParquetFile(path)
    names = None
    meta = pf.schema_arrow.metadata or {}
    if b"huggingface" in meta:
        features = json.loads(meta[b"huggingface"]).get("info", {}).get("features", {})
        names = (features.get("label") or {}).get("names")
    fields = {pf.schema_arrow.field(i).name for i in range(len(pf.schema_arrow))}
    if "image" not in fields:
        raise ValueError(f"{path}: no 'image' column (columns: {sorted(fields)})")
    md = pf.metadata
    columns = [md.row_group(0).column(i).path_in_schema for i in range(md.num_columns)]
    where = columns.index("image.bytes") if "image.bytes" in columns else None
    rows = []
    for g in range(md.num_row_groups):
        if where is not None:
            stats = md.row_group(g).column(where).statistics
            if stats is not None and stats.null_count:
                raise ValueError(
                    f"{path}: row group {g} has {stats.null_count} sample(s) without an image"
                )
        table = pf.read_row_group(g, columns=["image.path", *(["label"] * ("label" in fields))])
        paths = table.column("image").combine_chunks().field("path").to_pylist()
        labels = table.column("label").to_pylist() if "label" in fields else [None] * len(paths)
        rows += [[g, r, p, lab] for r, (p, lab) in enumerate(zip(paths, labels))]
    return {"names": names, "rows": rows}


def parquet_entries(path):
    """The labelled listing of one Parquet file: ``{"entries": [[image id, wnid, row group,
    row]], "counts": {...}}`` (what the listing cache keeps)."""
    listed = _list_parquet(path)
    names = listed["names"]
    if names and all(WNID_RE.match(n) for n in names):
        classes = names
    else:  # ImageNet-1K's class names in the sorted wnid order, checked by file name
        classes = copy_class_list("", len(names or ()))
    entries, counts = [], new_counts()
    # The file names keep the originals' suffix whatever the encoding: the first image of
    # the file (one row group read) tells it, and the file is taken to hold one encoding.
    fmt = sniff(read_parquet_image(ParquetImage(str(path), 0, 0))) if listed["rows"] else "?"
    for g, r, file_path, label in listed["rows"]:
        stem, _ = os.path.splitext(os.path.basename(file_path or ""))
        fname, wnid = label_sample(stem, None, label, classes, path)
        entries.append([f"{wnid}/{fname}", wnid, g, r])
        count_sample(counts, fmt, None)
    return {"entries": entries, "counts": counts}
