"""``imagenet-cog data``: what a copy of ImageNet holds for each domain, before a long
extraction (the listings read, no image decoded), and the extract command that follows."""

from __future__ import annotations

import sys

__all__ = ["add_data", "run_data"]


def add_data(sub):
    """Declare ``imagenet-cog data`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "data",
        help="what your copy of ImageNet holds for each domain, before a long extraction",
        description="Read the listings of the data roots (folders, tars per wnid, webdataset "
        "shards, Parquet files; no image is decoded) and print, per root and domain (IN-1K, "
        "L1..L5): the copy detected, the concepts present, the training images against the "
        "paper's, the official test images found, what the copy's processing changed, the "
        "images to decode and the disk the features take, and whether a run on it can be "
        "comparable with the paper. Writes what is missing and, for a partial copy, the "
        "concepts it can build (the file extract --wnids takes); the last line is the extract "
        "command. Exits 1 when a domain cannot be built (docs: Getting ImageNet).",
    )
    p.add_argument("roots", nargs="+", metavar="ROOT", help="data roots, in any layout")
    p.add_argument("--levels", default="official", help="'official' or a levels file")
    p.add_argument(
        "--missing",
        default="imagenet-cog-missing.tsv",
        metavar="FILE",
        help="where the missing concepts and test images are written",
    )
    p.add_argument(
        "--present",
        default="imagenet-cog-present.txt",
        metavar="FILE",
        help="where the concepts a partial copy can build are written, one wnid a line (for "
        "extract --wnids)",
    )
    p.set_defaults(run=run_data)


def run_data(args):
    """Print what the roots ``args.roots`` hold per domain; 1 when a domain cannot be built."""
    from .._coverage import (
        check_coverage,
        format_coverage,
        next_command,
        nothing_to_build,
        write_missing,
        write_present,
    )

    rows = check_coverage(args.roots, args.levels, progress=sys.stderr.isatty())
    print(format_coverage(rows))
    n = write_missing(rows, args.missing)
    print(
        f"{n:,} missing concepts and test images written to {args.missing}"
        if n
        else "nothing missing"
    )
    bad = [r for r in rows if not r["buildable"]]
    if not bad:
        print(f"next: {next_command(rows)}")
        return 0
    several = len({r["domain"] for r in rows}) < len(rows)
    names = [
        ("IN-1K" if r["domain"] == "in1k" else r["domain"])
        + (f" of copy {r['copy']}" if several else "")
        for r in bad
    ]
    print(
        "cannot be built: " + ", ".join(names) + " (a concept, an official test image or a "
        "training image beside them is missing; see the file above)"
    )
    n_present = write_present(rows, args.present)
    command = next_command(rows, args.present) if n_present else None
    if command is None:
        print(nothing_to_build(rows))
    else:
        print(
            f"{n_present:,} concepts that can be built written to {args.present}; to extract "
            f"them (a run not comparable with the paper): {command}"
        )
    return 1
