"""The reader of Parquet files, as the Hugging Face ``datasets`` library stores an image dataset.

A copy's files (``data/train-00000-of-00294.parquet``...) hold an image column of
``struct<bytes: binary, path: string>`` and an integer label column, the class names in the
schema's ``huggingface`` metadata. The columns are ``image`` and ``label``, or else the one
column that metadata calls an ``Image`` and the one it calls a ``ClassLabel`` (a dataset whose
image column is named ``jpg``). Listing reads the metadata and the image ``path`` and label
columns (and the first row group's images, to tell their encoding and sizes), never the other
images. Read with pyarrow (the ``[parquet]`` extra).

Every error names the file: pyarrow's own say nothing of which file they concern.
"""

from __future__ import annotations

import json
import os

from .._base import WNID_RE
from .copies import (
    FOLDER_SAMPLE,
    copy_class_list,
    count_sample,
    count_size,
    image_sizes,
    in1k_class_names,
    label_sample,
    new_counts,
    sniff,
)
from .sources import ParquetImage, pyarrow_parquet, read_parquet_image

__all__ = ["parquet_entries"]


def _features(path, metadata):
    """The ``features`` of a file's ``huggingface`` metadata (``{}`` without it)."""
    raw = (metadata or {}).get(b"huggingface")
    if raw is None:
        return {}
    try:
        info = json.loads(raw)
        features = info.get("info", {}).get("features", {})
    except (ValueError, RecursionError, AttributeError):
        raise ValueError(
            f"{path}: its 'huggingface' metadata is not the datasets library's JSON; the copy "
            "is damaged: write it again"
        ) from None
    if not isinstance(features, dict):
        # A ValueError, not a TypeError: the file's content is bad, not the caller's code.
        raise ValueError(f"{path}: its 'huggingface' metadata has no features object")  # noqa: TRY004
    return features


def _columns(path, fields, features):
    """``(image column, label column or None)`` of a file."""

    def typed(name):
        return [k for k, v in features.items() if isinstance(v, dict) and v.get("_type") == name]

    image = "image" if "image" in fields else None
    if image is None:
        images = [k for k in typed("Image") if k in fields]
        if len(images) != 1:
            raise ValueError(
                f"{path}: no image column: none is named 'image' and "
                + (
                    f"{len(images)} are images ({', '.join(images)})"
                    if images
                    else "its metadata calls none an Image"
                )
                + f" (columns: {', '.join(sorted(fields))})"
            )
        image = images[0]
    label = "label" if "label" in fields else None
    if label is None:
        labels = [k for k in typed("ClassLabel") if k in fields]
        label = labels[0] if len(labels) == 1 else None
    return image, label


def _class_names(path, features, label):
    """The class names of the label column, checked to be a list of strings, or ``None``."""
    names = (features.get(label) or {}).get("names") if label else None
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"{path}: the class names of its '{label}' column are not a list of strings "
            f"({type(names).__name__} in its 'huggingface' metadata)"
        )
    return names


def _list_parquet(path):
    """``{"names", "column", "rows": [[row group, row, file name, label]]}`` of one file.

    Reads the metadata and the image ``path`` and label columns, not the image bytes.
    """
    pq = pyarrow_parquet()
    import pyarrow as pa

    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except (OSError, ValueError) as exc:  # cut, empty, not Parquet
        raise ValueError(f"{path}: not a readable Parquet file ({exc})") from None
    fields = {schema.field(i).name: schema.field(i).type for i in range(len(schema))}
    features = _features(path, schema.metadata)
    image, label = _columns(path, fields, features)
    kind = fields[image]
    if not (pa.types.is_struct(kind) and {"bytes", "path"} <= {f.name for f in kind}):
        raise ValueError(
            f"{path}: its image column '{image}' is {kind}, not the datasets library's "
            "struct<bytes, path>"
        )
    if label is not None and not pa.types.is_integer(fields[label]):
        raise ValueError(
            f"{path}: its label column '{label}' holds {fields[label]}, not integer class indices"
        )
    names = _class_names(path, features, label)
    md = pf.metadata
    columns = [md.row_group(0).column(i).path_in_schema for i in range(md.num_columns)]
    where = columns.index(f"{image}.bytes") if f"{image}.bytes" in columns else None
    rows = []
    try:
        for g in range(md.num_row_groups):
            if where is not None:
                stats = md.row_group(g).column(where).statistics
                if stats is not None and stats.null_count:
                    raise ValueError(
                        f"{path}: row group {g} has {stats.null_count} sample(s) without an image"
                    )
            table = pf.read_row_group(g, columns=[f"{image}.path", *([label] * bool(label))])
            paths = table.column(image).combine_chunks().field("path").to_pylist()
            labels = table.column(label).to_pylist() if label else [None] * len(paths)
            rows += [[g, r, p, lab] for r, (p, lab) in enumerate(zip(paths, labels))]
    except (OSError, pa.ArrowException) as exc:  # a file cut or damaged past its footer
        raise ValueError(f"{path}: cannot be read ({exc}); the copy is damaged") from None
    return {"names": names, "column": image, "rows": rows}


def _unlabelled(path, rows, names):
    """The one line for a file none of whose rows can be given a wnid."""
    paths = [p for _, _, p, _ in rows if p]
    if not paths:
        what = "no row has a file name (the image column's path is empty in every row)"
    else:
        what = f"its file names ({os.path.basename(paths[0])!r}...) name no wnid"
    if names is None:
        what += " and no class names are recorded"
    elif len(names) == 1000:
        what += " and its 1,000 class names are not ImageNet-1K's in the sorted wnid order"
    else:
        what += f" and its class names ({names[0]!r}...) are not wnids"
    return ValueError(
        f"{path}: no image can be given a wnid: {what}; write the copy with the wnids as "
        "class names (ClassLabel(names=[...])) or with the original file names"
    )


def parquet_entries(path):
    """The labelled listing of one Parquet file: ``{"entries": [[image id, wnid, row group,
    row, path as listed]], "column": image column, "counts": {...}}`` (what the listing cache
    keeps)."""
    listed = _list_parquet(path)
    names, rows = listed["names"], listed["rows"]
    if names and all(WNID_RE.match(n) for n in names):
        classes = names
    elif names and len(names) == 1000 and not in1k_class_names(names):
        classes = None  # 1,000 classes, but not ImageNet-1K's in its order: labels unusable
    else:  # ImageNet-1K's class names in the sorted wnid order, checked by file name
        classes = copy_class_list("", len(names or ()))
    entries, counts = [], new_counts()
    # The file names keep the originals' suffix whatever the encoding: the first row group's
    # images tell it (and their sizes), and the file is taken to hold one encoding.
    fmt = "?"
    if rows:
        first = read_parquet_image(ParquetImage(str(path), 0, 0, listed["column"]))
        fmt = sniff(first)
        group = [first] + [
            read_parquet_image(ParquetImage(str(path), 0, r, listed["column"]))
            for g, r, _, _ in rows[1:FOLDER_SAMPLE]
            if g == 0
        ]
        for size in image_sizes(group):
            if size is not None:
                count_size(counts, size)
    stem_of_file = os.path.splitext(os.path.basename(path))[0]
    for g, r, file_path, label in rows:
        stem, _ = os.path.splitext(os.path.basename(file_path or ""))
        if not stem and classes is not None and label is not None:
            # An image without a file name (a dataset made from PIL images): named by its place.
            stem = f"{stem_of_file}_{g}_{r}"
        try:
            fname, wnid = label_sample(stem, None, label, classes, path)
        except ValueError:
            if not entries and classes is None:
                raise _unlabelled(path, rows, names) from None
            raise
        entries.append([f"{wnid}/{fname}", wnid, g, r, file_path])
        count_sample(counts, fmt, None)
    return {"entries": entries, "column": listed["column"], "counts": counts}
