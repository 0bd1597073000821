"""The coverage check: what a copy of ImageNet holds for each CoG domain, before extraction.

:func:`check_coverage` reads only listings (folder entries, tar headers, webdataset headers,
Parquet metadata; cached for shards) and reports, per data root and domain (IN-1K, L1..L5):
the layout and copy detected, the concepts present of 1,000, the training images against the
paper's, the official test images found of 50,000, what the copy's processing changed, the
images to decode and the disk the features will take, and whether a run on it can be
comparable with the paper. Each root is reported on its own, as ``extract`` reads it: a root
is an ImageNet-1K or an ImageNet-21K root by its content, never by its name. A concept counts
as buildable when ``make_split`` can split it: present, with its official test images, and at
least one training image beside them. ``imagenet-cog data ROOT [ROOT...]`` prints it, writes
what is missing and what can be built, and says the command that extracts it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._base import WNID_RE
from ._comparability import PAPER_CONCEPTS, PAPER_TEST_IMAGES, PAPER_TRAIN_IMAGES
from ._data.copies import (
    FOLDERS,
    copy_effect,
    copy_facts,
    detect_layout,
    effect_deviates,
    reencoded,
)
from ._data.labels import bundled_val_labels
from ._data.listing import list_root
from ._grid import display_domain
from ._tables import printable
from .datasets import N_TEST, TRAIN_CAP
from .levels import load_levels, official_test_images
from .taxonomy import imagenet1k_wnids

__all__ = [
    "check_coverage",
    "format_coverage",
    "next_command",
    "nothing_to_build",
    "write_missing",
    "write_present",
]

#: Feature width assumed for the disk estimate (a ResNet-50's pooled features, float32).
ESTIMATE_DIM = 2048


def _wnid_entries(folder):
    """The wnids of a folder's wnid folders and tars."""
    with os.scandir(folder) as it:
        return {
            e.name.removesuffix(".tar")
            for e in it
            if WNID_RE.match(e.name.removesuffix(".tar"))
            and (e.is_dir() or e.name.endswith(".tar"))
        }


def _is_in1k_folders(root):
    """True for ImageNet-1K as folders: ``train/`` of ImageNet-1K concepts beside ``val/`` (or
    ``validation/``)."""
    if not (root / "train").is_dir():
        return False
    if not ((root / "val").is_dir() or (root / "validation").is_dir()):
        return False
    return _wnid_entries(root / "train") <= set(imagenet1k_wnids())


def _in1k_listing(root):
    """``(train listing, test listing, copy record or None, layout)`` of an ImageNet-1K root."""
    wnids = list(imagenet1k_wnids())
    train = list_root(root, wnids, part="train", partial=True)
    try:
        test = list_root(root, wnids, part="test", partial=True).images
    except FileNotFoundError:  # a copy without its validation part
        test = {}
    return train.images, test, train.copy, train.layout


def _copy_label(layout, copy):
    return layout if copy is None else f"{copy['layout']} ({copy['name']})"


def _verdict(buildable, present, n_test, n_train, paper, copy):
    effect = None if copy is None else copy_effect(copy)
    processed = bool(copy and copy.get("processed"))
    if not buildable:
        return "cannot be built"
    if (
        present < PAPER_CONCEPTS
        or n_test < 0.99 * PAPER_TEST_IMAGES
        or abs(n_train - paper) > 0.01 * paper
        or (processed and effect_deviates(effect))
    ):
        return "not comparable"
    if processed or n_test != PAPER_TEST_IMAGES or n_train != paper:
        return "comparable, with caveats"
    return "comparable"


def _changed(copy):
    if copy is None:
        return "none (the files as they are)"
    what = []
    if copy.get("resized"):
        what.append(f"{copy['resized']:,} resized")
    other = reencoded(copy.get("formats", {}))
    if other:
        what.append("re-encoded as " + "/".join(other))
    if copy.get("seen"):
        what.append(copy["seen"])
    return ", ".join(what) or "none seen"


def _row(
    domain, index, root, label, copy, *, concepts, held, present, n_train, found, wanted, small
):
    """One row: ``concepts`` of the domain, ``held`` those the root has images of,
    ``present`` the buildable ones, ``found`` and ``wanted`` the official test images,
    ``small`` the concepts held but too small to split."""
    missing_concepts = sorted(set(concepts) - set(held))
    missing_tests = sorted(set(wanted) - set(found))
    if domain == "in1k":
        buildable = not missing_concepts and not small
    else:
        buildable = not missing_concepts and not missing_tests and not small
    paper = PAPER_TRAIN_IMAGES[domain]
    n_images = n_train + len(found)
    return {
        "domain": domain,
        "copy": index,
        "root": str(root),
        "layout": label,
        "record": copy,
        "concepts": len(held),
        "train_images": n_train,
        "paper_train_images": paper,
        "test_images": len(found),
        "changed": _changed(copy),
        "published_processing": None if copy is None else copy.get("processing"),
        "images_to_decode": n_images,
        "disk_bytes": n_images * ESTIMATE_DIM * 4,
        "verdict": _verdict(buildable, len(held), len(found), n_train, paper, copy),
        "buildable": buildable,
        "buildable_wnids": sorted(present),
        "held": sorted(held),
        "missing_concepts": missing_concepts,
        "missing_test_images": missing_tests,
        "too_small": sorted(small),
    }


def _in1k_row(index, root):
    train, test, copy, layout = _in1k_listing(root)
    concepts = list(imagenet1k_wnids())
    wanted = {f"{w}/{n}" for n, w in bundled_val_labels().items()}
    found = {i for per in test.values() for i in per} & wanted
    have = [w for w in concepts if train.get(w)]
    # A class with no validation image cannot be split: extract refuses it.
    small = [w for w in have if not test.get(w)]
    present = [w for w in have if test.get(w)]
    n_train = sum(len(train[w]) for w in have)
    label = _copy_label(layout.removeprefix("train/ ") if copy is None else layout, copy)
    return _row(
        "in1k",
        index,
        root,
        label,
        copy,
        concepts=concepts,
        held=have,
        present=present,
        n_train=n_train,
        found=found,
        wanted=wanted,
        small=small,
    )


def _level_rows(index, root, found, lv, official, cap, n_test):
    images, copy = found.images, found.copy
    label = _copy_label(found.layout, copy)
    rows = []
    for name in lv.names:
        concepts = sorted(lv[name])
        wanted = {i for w in concepts for i in official.get(w, ())}
        tests, present, small, n_train = set(), [], [], 0
        for w in concepts:
            have = images.get(w)
            if not have:
                continue
            if w in official:
                mine = [i for i in official[w] if i in have]
                tests.update(mine)
                left = len(have) - len(mine)  # the test images present, not the list's length
                complete = len(mine) == len(official[w])
            else:
                left = len(have) - n_test
                complete = True
            if left < 1:
                small.append(w)
                continue
            n_train += min(cap, left) if cap is not None else left
            if complete:
                present.append(w)
        rows.append(
            _row(
                name,
                index,
                root,
                label,
                copy,
                concepts=concepts,
                held=[w for w in concepts if images.get(w)],
                present=present,
                n_train=n_train,
                found=tests,
                wanted=wanted,
                small=small,
            )
        )
    return rows


def check_coverage(roots, levels="official", *, cap=TRAIN_CAP, n_test=N_TEST, progress=False):
    """What the data roots hold for each CoG domain, from their listings alone.

    Parameters
    ----------
    roots : sequence of path
        Data roots in any layout (folders or tars per wnid, ImageNet-1K's ``train/`` and
        ``val/``, split folders of wnid folders, webdataset shards, Parquet files); each is
        recognised as an ImageNet-1K or an ImageNet-21K root by its content, and reported on
        its own.
    levels : "official", path or Levels
    cap, n_test : int
        As :func:`imagenet_cog.make_split`.
    progress : bool

    Returns
    -------
    list of dict
        One row per root and domain (IN-1K for an ImageNet-1K root, L1..L5 for an
        ImageNet-21K root), in the order of the roots: see :func:`format_coverage`.
    """
    lv = load_levels(levels)
    official = lv.test_images if lv.test_images is not None else official_test_images()
    every = set(imagenet1k_wnids())
    rows = []
    for index, root in enumerate(map(Path, roots), start=1):
        layout = detect_layout(root)
        if layout == FOLDERS and _is_in1k_folders(root):
            rows.append(_in1k_row(index, root))
            continue
        # A folder copy is asked for the levels' concepts only; a copy is listed whole, its
        # concepts telling an ImageNet-1K copy from an ImageNet-21K one.
        wanted = sorted({w for name in lv.names for w in lv[name]}) if layout == FOLDERS else None
        found = list_root(root, wanted, part="all", partial=True, progress=progress)
        if layout != FOLDERS and found.images and set(found.images) <= every:
            rows.append(_in1k_row(index, root))
        else:
            rows += _level_rows(index, root, found, lv, official, cap, n_test)
    if not any(r["concepts"] for r in rows):
        raise ValueError(
            "none of the roots holds ImageNet-1K or ImageNet-21K images of the levels "
            "(folders or tars per wnid, split folders of them, webdataset shards or Parquet "
            "files; docs: Getting ImageNet)"
        )
    return rows


def _gb(n):
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 1e3:,.1f} kB"


def _copies(rows):
    """``{copy number: (root, record)}`` of the rows, in order."""
    out = {}
    for r in rows:
        out.setdefault(r["copy"], (r["root"], r["record"]))
    return out


def format_coverage(rows):
    """The coverage rows as a table a person reads at a glance, and the notes under it: one
    line per copy, naming its root and its processing. A copy's names (its files', its
    folders') are shown with their control characters escaped, never sent to the terminal."""
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
                printable(f"{r['copy']}: {r['layout']}"),
                f"{r['concepts']:,}/{PAPER_CONCEPTS:,}",
                f"{r['train_images']:,} ({r['paper_train_images']:,})",
                f"{r['test_images']:,}/{PAPER_TEST_IMAGES:,}",
                printable(r["changed"]),
                f"{r['images_to_decode']:,}",
                _gb(r["disk_bytes"]),
                r["verdict"],
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    for k, (root, record) in _copies(rows).items():
        if record is None:
            what = "the files as they are"
        elif copy_facts(record) is None:
            what = (
                record.get("processing")
                if record.get("shown")
                else "not a copy whose processing is published: unknown"
            )
        else:
            what = f"published processing: {record.get('processing')}"
        lines.append(f"copy {k} = {root}: {what}")
    lines.append(f"features: float32, {ESTIMATE_DIM} dimensions assumed (a ResNet-50's)")
    return "\n".join(printable(line) for line in lines)


def write_missing(rows, path):
    """Write the missing concepts and test images, one ``domain<TAB>kind<TAB>id`` a line (the
    domain prefixed by its copy's number when several roots hold it)."""
    from ._fileio import atomic_write_text

    several = len({r["domain"] for r in rows}) < len(rows)
    lines = ["domain\tmissing\tid"]
    for r in rows:
        domain = f"{r['copy']}:{r['domain']}" if several else r["domain"]
        lines += [f"{domain}\tconcept\t{w}" for w in r["missing_concepts"]]
        lines += [f"{domain}\tconcept too small to split\t{w}" for w in r["too_small"]]
        lines += [f"{domain}\ttest image\t{i}" for i in r["missing_test_images"]]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return len(lines) - 1


def _chosen(rows):
    """The rows of the roots ``extract`` would be given: per kind (ImageNet-1K, -21K), the root
    with the most buildable concepts."""
    best = {}
    for kind in ("in1k", "in21k"):
        mine = [r for r in rows if (r["domain"] == "in1k") == (kind == "in1k")]
        score = {}
        for r in mine:
            score[r["copy"]] = score.get(r["copy"], 0) + len(r["buildable_wnids"])
        if score:
            best[kind] = max(score, key=lambda k: (score[k], -k))
    return [r for r in rows if r["copy"] in best.values()]


def write_present(rows, path):
    """Write the concepts that ``extract`` can build from the chosen roots, one wnid a line
    (the file ``--wnids`` takes); returns how many."""
    from ._fileio import atomic_write_text

    wnids = sorted({w for r in _chosen(rows) for w in r["buildable_wnids"]})
    atomic_write_text(path, "".join(f"{w}\n" for w in wnids))
    return len(wnids)


def next_command(rows, present=None):
    """The command that extracts what the roots can build: every domain when all can be
    built, else the concepts written to ``present`` (``--wnids``) of the domains that have
    some; ``None`` when nothing can be built."""
    chosen = _chosen(rows)
    complete = all(r["buildable"] for r in chosen)
    if not complete:  # the roots and domains that have something to build
        chosen = [r for r in chosen if r["buildable_wnids"]]
    domains = [r["domain"] for r in chosen]
    if not chosen or (not complete and present is None):
        return None
    roots = []
    for kind, option in (("in1k", "--in1k"), ("in21k", "--in21k")):
        mine = [r for r in chosen if (r["domain"] == "in1k") == (kind == "in1k")]
        if mine:
            roots.append(f"{option} {mine[0]['root']}")
    command = f"imagenet-cog extract MODEL {' '.join(roots)}"
    if complete:
        return command + " --out features/MODEL"
    command += f" --wnids {present}"
    every = {r["domain"] for r in _chosen(rows)}
    if len(domains) < len(every):
        command += f" --domain {','.join(domains)}"
    return command + " --out features/MODEL"


def nothing_to_build(rows):
    """Why no concept of the roots can be extracted, in words."""
    small = sorted({w for r in rows for w in r["too_small"]})
    built = {w for r in rows for w in r["buildable_wnids"]}
    incomplete = sorted({w for r in rows for w in r["held"]} - built - set(small))
    why = []
    if incomplete:
        why.append(
            f"{len(incomplete):,} concept(s) present lack official test images (a copy of the "
            "training part alone? give its validation part too)"
        )
    if small:
        why.append(f"{len(small):,} concept(s) have no image to train on or to test with")
    return "nothing can be extracted from these roots: " + (
        "; ".join(why) or "none holds a concept of the levels or of ImageNet-1K"
    )
