"""The ``imagenet-cog`` commands that read a results folder: ``report`` and ``verify``.

Each has an ``add_<name>`` function that declares its arguments and a ``run_<name>`` function
that does the work; :mod:`imagenet_cog.cli` registers them.
"""

from __future__ import annotations

import shutil
import sys

from ._runfolder import RUNS, runs_file

__all__ = ["add_report", "add_verify"]


# ------------------------------------------------------------------ report
def add_report(sub):
    p = sub.add_parser(
        "report",
        help="print the tables of evaluate results, compare models, draw the figures",
        description="Tables like the paper's Tables 5-10, scores relative to a baseline, "
        "ranks among the paper's 31 models, and Figure 3/4-style plots.",
    )
    p.add_argument(
        "results",
        nargs="*",
        metavar="RESULTS",
        help=f"evaluate output folders or {RUNS}; none with --reference paper shows the "
        "paper's own tables (and plots with --plot)",
    )
    p.add_argument(
        "--baseline",
        default=None,
        help="model to show scores relative to (default with --reference paper: ResNet50)",
    )
    p.add_argument(
        "--reference",
        choices=["paper"],
        default=None,
        help="place the models among the paper's 31 published ones",
    )
    p.add_argument(
        "--models",
        default=None,
        help="with --reference: published models to show, "
        "comma-separated (e.g. s-DINO,a-DeiT-S; default all 31)",
    )
    p.add_argument("--plot", metavar="DIR", default=None, help="write the figures here")
    p.add_argument(
        "--plot-format",
        default="png",
        metavar="png,pdf,svg",
        help="formats of the figures, comma-separated (PDF and SVG are vector "
        "formats, for papers; default png)",
    )
    p.add_argument(
        "--format",
        choices=["text", "md", "csv", "json", "latex"],
        default="text",
        help="output format (latex: the paper's Tables 5-10 layout, booktabs; every "
        "format carries the comparability verdict)",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="with --reference paper and RESULTS: also print the full tables of "
        "every model (by default the rank of yours, its verdict and caveats)",
    )
    p.add_argument(
        "--compare",
        metavar="A,B",
        default=None,
        help="test whether model A beats model B in every domain: paired "
        "differences over the seeds, a confidence interval, p-values adjusted "
        "over the domains (see the results guide)",
    )
    p.add_argument(
        "--shots", default="all", help="with --compare: the shots per class compared (default all)"
    )
    p.add_argument("--metric", choices=["top1", "top5"], default="top1", help="accuracy shown")
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 2) when a model is not comparable with the paper (a subset "
        "of concepts, other constants or seeds, unnormalised features...) instead "
        "of marking it",
    )
    p.set_defaults(run=run_report)


def run_report(args):
    from .results import (
        NotComparableError,
        Results,
        comparability,
        not_comparable_banner,
        reference_results,
    )

    if not args.results and args.reference != "paper":
        raise ValueError("give RESULTS folders, or --reference paper to show the paper's tables")
    mine = []
    if args.results:
        results = Results.load(args.results[0])
        for path in args.results[1:]:
            results = results.merge(Results.load(path))
        mine = list(results.models)
        if args.strict:
            found = comparability(results, by_model=True)
            reasons = [f"{m}: {r}" for m, v in found.items() for r in v["deviations"]]
            if reasons:
                raise NotComparableError(
                    "NOT COMPARABLE with the paper (--strict): " + "; ".join(reasons)
                )
    baseline = args.baseline
    models = [m for m in args.models.split(",") if m] if args.models else None
    if args.reference == "paper":
        baseline = baseline or "ResNet50"
        if mine:
            results = results.compare(reference_results(), baseline=baseline, models=models)
        else:  # the paper's own tables
            keep = None if models is None else list(dict.fromkeys([*models, baseline]))
            results = reference_results(models=keep)
    if baseline is not None and baseline not in results.models:
        hint = ""
        if args.reference != "paper" and baseline in reference_results().models:
            hint = f"; {baseline} is one of the paper's models: add --reference paper"
        raise ValueError(f"baseline {baseline!r} is not among the models {results.models}{hint}")
    banner = not_comparable_banner(results) if mine else ""
    if banner and args.format != "text":  # keep stdout machine-readable
        print(banner, file=sys.stderr)

    if args.compare:
        pair = [m.strip() for m in args.compare.split(",") if m.strip()]
        if len(pair) != 2:
            raise ValueError(f"--compare takes two models, A,B; got {args.compare!r}")
        unknown = [m for m in pair if m not in results.models]
        if unknown:
            raise ValueError(
                f"--compare: unknown model(s) {unknown}; have {results.models}"
                + ("" if args.reference else " (add --reference paper for the paper's models)")
            )
        print(results.compare_models(*pair, shots=args.shots, metric=args.metric))
        return
    if args.format == "latex":
        print(results.to_latex(metric=args.metric), end="")
    elif args.format == "csv":
        print(results.to_csv(metric=args.metric), end="")
    elif args.format == "json":
        print(results.to_json(), end="")
    elif args.format == "md":
        print(results.to_markdown(metric=args.metric), end="")
        if baseline is not None:
            print()
            print(
                results.relative_to(baseline, args.metric).to_markdown(metric=args.metric), end=""
            )
    elif args.reference == "paper" and mine:
        # The answer first (rank, scores, drop L1 -> L5), the verdict under it, then the
        # caveats; the 31 models' full tables only when asked for.
        width = shutil.get_terminal_size((100, 24)).columns
        print(_wrap_prose(results.comparison_report(metric=args.metric), width))
        if args.full:
            print()
            print(results.report(metric=args.metric, banner=False))
            print()
            print(results.relative_to(baseline, args.metric).table(args.metric))
        else:
            print(f"\nThe full tables of the {len(results.models)} models: add --full")
        if results.meta.get("analysis"):
            print()
            print(results.analysis_table())
    else:
        # The banner once, at the top (the report's), with the reasons; the caveats below.
        print(results.report(metric=args.metric, banner=bool(mine)))
        if baseline is not None:
            print()
            print(results.relative_to(baseline, args.metric).table(args.metric))
        if results.meta.get("analysis"):
            print()
            print(results.analysis_table())
        if mine:
            notes = comparability(results, deviations=False)
            if notes:
                print("\nComparability with the paper:")
                for note in notes:
                    print(f"  - {note}")
    if args.plot:
        # The user's models, and every paper model named in --models, are labelled.
        highlight = [*mine, *(models or [])] if args.reference else None
        formats = [f.strip() for f in args.plot_format.split(",") if f.strip()]
        paths = results.plot(
            args.plot, baseline=baseline, highlight=highlight, metric=args.metric, formats=formats
        )
        print("\nwrote " + ", ".join(str(p) for p in paths), file=sys.stderr)


# ------------------------------------------------------------------ verify
def add_verify(sub):
    p = sub.add_parser(
        "verify",
        help="check that evaluate results still match what made them",
        description=f"Check evaluate output folders: {RUNS} records made by another "
        "configuration than the folder's config.json (a file copied from another run), a "
        "config.json edited after the run, a record edited by hand. Prints every mismatch, "
        "naming the file and line, and what carries no checksum (files of an earlier version); "
        "exits 1 when anything does not match. Checksums catch copies and edits, not an edit "
        "that recomputes them (docs/guide/reproducibility.rst).",
    )
    p.add_argument(
        "results", nargs="+", metavar="RESULTS", help=f"evaluate output folders or {RUNS} files"
    )
    p.set_defaults(run=run_verify)


def run_verify(args):
    from pathlib import Path

    from ._runfolder import verify_run

    failed = False
    for path in args.results:
        file = runs_file(path)
        if not file.is_file():
            raise FileNotFoundError(f"no results at {path} (expected a {RUNS})")
        found = verify_run(file)
        problems, unchecked = found["problems"], found["unchecked"]
        folder = Path(file).parent
        if problems:
            failed = True
            print(
                f"{folder}: {len(problems)} mismatch{'es' if len(problems) != 1 else ''} in "
                f"{found['records']} records and their config.json:"
            )
            for line in problems:
                print(f"  {line}")
        else:
            print(f"{folder}: config.json and its {found['records']} records match what made them")
        for line in unchecked:
            print(f"  not checked: {line}")
    return 1 if failed else 0


def _wrap_prose(text, width):
    """Lines of prose longer than ``width`` wrapped under their indentation; table rows
    (columns aligned by runs of spaces) are left whole."""
    import re
    import textwrap

    out = []
    for line in text.splitlines():
        body = line.lstrip()
        indent = line[: len(line) - len(body)]
        if len(line) <= width or re.search(r"\S {2,}\S", body):
            out.append(line)
        else:
            out += textwrap.wrap(
                body, width, initial_indent=indent, subsequent_indent=indent + "    "
            )
    return "\n".join(out)
