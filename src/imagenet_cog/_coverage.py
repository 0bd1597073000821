"""The coverage check: what a copy of ImageNet holds for each CoG domain, before extraction.

:func:`check_coverage` reads only listings (folder entries, tar headers, webdataset headers,
Parquet metadata; cached for shards) and reports, per domain (IN-1K, L1..L5): the layout and
copy detected, the concepts present of 1,000, the training images against the paper's counts,
the official test images found of 50,000, what the copy's processing changed, the images to
decode and the disk the features will take, and whether a run on it can be comparable with
the paper. ``imagenet-cog data ROOT [ROOT...]`` prints it.
"""

from __future__ import annotations

from pathlib import Path

from ._comparability import PAPER_CONCEPTS, PAPER_TEST_IMAGES, PAPER_TRAIN_IMAGES
from ._data.copies import FOLDERS, detect_layout, reencoded
from ._data.labels import bundled_val_labels
from ._data.listing import list_root
from ._grid import display_domain
from .datasets import N_TEST, TRAIN_CAP
from .levels import load_levels, official_test_images
from .taxonomy import imagenet1k_wnids

__all__ = ["check_coverage", "format_coverage"]

#: Feature width assumed for the disk estimate (a ResNet-50's pooled features, float32).
ESTIMATE_DIM = 2048


def _is_in1k_copy(listing, copy):
    """True for a shard or Parquet copy of ImageNet-1K: by its name, else by its concepts."""
    if copy["name"].startswith("imagenet1k"):
        return True
    return bool(listing) and set(listing) <= set(imagenet1k_wnids())


def _in1k_listing(root):
    """``(train listing, {test image id}, copy record or None)`` of an ImageNet-1K root."""
    wnids = list(imagenet1k_wnids())
    train = list_root(root, wnids, part="train", partial=True)
    try:
        test = list_root(root, wnids, part="test", partial=True).images
    except FileNotFoundError:  # a copy without its validation part
        test = {}
    return train.images, {i for w in test.values() for i in w}, train.copy


def _row(domain, wnids, train_counts, test_found, test_wanted, copy, layout, cap):
    present = [w for w in wnids if w in train_counts]
    n_test = len(test_found)
    if domain == "in1k":
        n_train = sum(train_counts[w] for w in present)
    else:
        n_train = sum(min(cap, train_counts[w]) for w in present)
    missing_concepts = sorted(set(wnids) - set(present))
    missing_tests = sorted(set(test_wanted) - set(test_found))
    buildable = not missing_concepts and (domain == "in1k" or not missing_tests)
    paper = PAPER_TRAIN_IMAGES[domain]
    processed = bool(copy and copy.get("processed"))
    if not buildable:
        verdict = "cannot be built"
    elif (
        len(present) < PAPER_CONCEPTS
        or n_test < 0.99 * PAPER_TEST_IMAGES
        or abs(n_train - paper) > 0.01 * paper
    ):
        verdict = "not comparable"
    elif processed or n_test != PAPER_TEST_IMAGES or n_train != paper:
        verdict = "comparable, with caveats"
    else:
        verdict = "comparable"
    if copy is None:
        changed = "none (the files as they are)"
    else:
        what = []
        if copy.get("resized"):
            what.append(f"{copy['resized']:,} resized")
        other = reencoded(copy.get("formats", {}))
        if other:
            what.append("re-encoded as " + "/".join(other))
        changed = ", ".join(what) or copy.get("seen") or "none seen"
    n_images = n_train + n_test
    return {
        "domain": domain,
        "layout": layout if copy is None else f"{copy['layout']} ({copy['name']})",
        "concepts": len(present),
        "train_images": n_train,
        "paper_train_images": paper,
        "test_images": n_test,
        "changed": changed,
        "published_processing": None if copy is None else copy.get("processing"),
        "images_to_decode": n_images,
        "disk_bytes": n_images * ESTIMATE_DIM * 4,
        "verdict": verdict,
        "buildable": buildable,
        "missing_concepts": missing_concepts,
        "missing_test_images": missing_tests,
    }


def check_coverage(roots, levels="official", *, cap=TRAIN_CAP, n_test=N_TEST, progress=False):
    """What the data roots hold for each CoG domain, from their listings alone.

    Parameters
    ----------
    roots : sequence of path
        Data roots in any layout (folders or tars per wnid, ImageNet-1K's ``train/`` and
        ``val/``, webdataset shards, Parquet files); each is recognised as an ImageNet-1K or
        an ImageNet-21K root by its content.
    levels : "official", path or Levels
    cap, n_test : int
        As :func:`imagenet_cog.make_split`.
    progress : bool

    Returns
    -------
    list of dict
        One row per domain (IN-1K when a root holds it, then L1..L5 when a root holds
        ImageNet-21K images): see :func:`format_coverage`.
    """
    lv = load_levels(levels)
    official = lv.test_images if lv.test_images is not None else official_test_images()
    in1k, in21k = None, []
    for root in map(Path, roots):
        layout = detect_layout(root)
        if layout == FOLDERS and (root / "train").is_dir() and (root / "val").is_dir():
            in1k = (root, layout)
            continue
        # A folder copy is asked for the levels' concepts only; a copy is listed whole, its
        # concepts telling an ImageNet-1K copy from an ImageNet-21K one.
        wanted = sorted({w for name in lv.names for w in lv[name]}) if layout == FOLDERS else None
        found = list_root(root, wanted, part="all", partial=True, progress=progress)
        if layout != FOLDERS and _is_in1k_copy(found.images, found.copy):
            in1k = (root, layout)
        else:
            in21k.append((found.images, found.copy, layout))
    rows = []
    if in1k is not None:
        root, layout = in1k
        train, test, copy = _in1k_listing(root)
        counts = {w: len(v) for w, v in train.items() if v}
        wanted = {f"{w}/{n}" for n, w in bundled_val_labels().items()}
        rows.append(
            _row(
                "in1k",
                list(imagenet1k_wnids()),
                counts,
                test & wanted,
                wanted,
                copy,
                layout if copy is None else None,
                cap,
            )
        )
    if in21k:
        merged, copy, layout = {}, None, in21k[0][2]
        for listing, c, _ in in21k:
            for w, images in listing.items():
                merged.setdefault(w, {}).update(images)
            copy = copy or c
        for name in lv.names:
            wnids = sorted(lv[name])
            tests = {i for w in wnids for i in official.get(w, ())}
            found = {i for i in tests if i in merged.get(i.split("/", 1)[0], {})}
            counts = {}
            for w in wnids:
                if w in merged:
                    n_tests = len(official[w]) if w in official else n_test
                    counts[w] = max(0, len(merged[w]) - n_tests)
            rows.append(_row(name, wnids, counts, found, tests, copy, layout, cap))
    if not rows:
        raise ValueError("none of the roots holds ImageNet-1K or ImageNet-21K images")
    return rows


def _gb(n):
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 1e3:,.1f} kB"


def format_coverage(rows):
    """The coverage rows as a table a person reads at a glance, and the notes under it."""
    head = (
        "domain",
        "copy",
        "concepts",
        "train images (paper)",
        "test images",
        "processing changed",
        "to decode",
        "features",
        "a run on it",
    )
    table = [head]
    for r in rows:
        table.append(
            (
                display_domain(r["domain"]),
                r["layout"],
                f"{r['concepts']:,}/{PAPER_CONCEPTS:,}",
                f"{r['train_images']:,} ({r['paper_train_images']:,})",
                f"{r['test_images']:,}/{PAPER_TEST_IMAGES:,}",
                r["changed"],
                f"{r['images_to_decode']:,}",
                _gb(r["disk_bytes"]),
                r["verdict"],
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    processing = {r["published_processing"] for r in rows if r["published_processing"]}
    for text in sorted(processing):
        lines.append(f"published processing of the copy: {text}")
    lines.append(f"features: float32, {ESTIMATE_DIM} dimensions assumed (a ResNet-50's)")
    return "\n".join(lines)


def write_missing(rows, path):
    """Write the missing concepts and test images, one ``domain<TAB>kind<TAB>id`` a line."""
    from ._fileio import atomic_write_text

    lines = ["domain\tmissing\tid"]
    for r in rows:
        lines += [f"{r['domain']}\tconcept\t{w}" for w in r["missing_concepts"]]
        lines += [f"{r['domain']}\ttest image\t{i}" for i in r["missing_test_images"]]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return len(lines) - 1
