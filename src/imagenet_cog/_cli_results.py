"""The ``imagenet-cog`` commands that make or read a results folder: ``evaluate`` (and its
``--plan``), ``report`` and ``verify``.

Each has an ``add_<name>`` function that declares its arguments and a ``run_<name>`` function
that does the work; :mod:`imagenet_cog.cli` registers them.
"""

from __future__ import annotations

import shutil
import sys

from ._grid import PAPER_PROTOCOL
from ._runfolder import PREDICTIONS_DIR, RUNS, runs_file

__all__ = ["add_evaluate", "add_report", "add_verify"]


# ---------------------------------------------------------------- evaluate
def _comma_list(text):
    """``"1,2, all"`` → ``["1", "2", "all"]``: evaluate itself checks the values."""
    return [x for x in text.replace(",", " ").split() if x]


def add_evaluate(sub):
    p = sub.add_parser(
        "evaluate",
        help="run the ImageNet-CoG linear-probe protocol on extracted features",
        description="Every domain x shots x seed cell of the protocol (the paper, Sec. 3.4.2 "
        "and supplement B.2), the "
        f"seeds' searches in lockstep. Each finished cell is appended to OUT/{RUNS}; "
        "running the same command again resumes.",
    )
    p.add_argument("features", metavar="FEATURES", help="a feature-store root (from extract)")
    p.add_argument(
        "--out", metavar="RESULTS", default=None, help="output folder (needed unless --plan)"
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print what the run would take, without training: the memory plan, the work "
        "(FLOP), the time predicted on this device from a short measured step, the bytes to "
        "read (a few seconds)",
    )
    p.add_argument(
        "--domains",
        default=None,
        help="comma-separated domains (default: every domain with features in FEATURES, "
        "of in1k,L1,L2,L3,L4,L5)",
    )
    paper = PAPER_PROTOCOL
    p.add_argument(
        "--shots",
        default=",".join(map(str, paper.shots)),
        help="comma-separated images per class, 'all' for the whole set",
    )
    p.add_argument("--seeds", default=",".join(map(str, paper.seeds)), help="comma-separated seeds")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: CUDA if available)")
    p.add_argument(
        "--trials",
        type=int,
        default=paper.n_trials,
        help=f"TPE trials per search ({paper.n_trials})",
    )
    p.add_argument(
        "--startup-trials",
        type=int,
        default=paper.n_startup_trials,
        help=f"random trials before TPE's model takes over ({paper.n_startup_trials}, as the "
        "paper); a search of no more trials than this is pure random search",
    )
    p.add_argument("--epochs", type=int, default=paper.epochs, help=f"SGD epochs ({paper.epochs})")
    p.add_argument(
        "--batch-size",
        type=int,
        default=paper.batch_size,
        help=f"SGD batch size ({paper.batch_size})",
    )
    p.add_argument(
        "--trials-per-batch",
        type=int,
        default=paper.trials_per_batch,
        help="trials of one search trained together after the startup trials; "
        f"1 asks for one trial at a time, as the official loop does (default "
        f"{paper.trials_per_batch})",
    )
    p.add_argument("--bf16", action="store_true", help="keep features in bfloat16 on the device")
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="the fused SGD step: compiled and replayed from CUDA graphs on CUDA "
        "(auto, the default), also compiled on the CPU (on), or never (off: the "
        "eager step); it checks itself against the eager step as it trains",
    )
    p.add_argument("--jobs", type=int, default=1, help="parallel processes on the CPU (1)")
    p.add_argument("--model", default=None, help="model name in the results (default: the store's)")
    p.add_argument(
        "--levels",
        default=None,
        metavar="LEVELS",
        help="'official' or a levels folder/file: checked against the levels the "
        "stores were extracted with, by content (default: the stores' own levels); given, "
        "a copy is kept in RESULTS/levels/, whence report --html and analyze --concepts "
        "take each concept's similarity",
    )
    p.add_argument(
        "--save-predictions",
        action="store_true",
        help=f"also save each cell's test predictions in RESULTS/{PREDICTIONS_DIR}/ "
        "(for imagenet-cog analyze)",
    )
    p.add_argument(
        "--no-normalize",
        action="store_true",
        help="do not l2-normalise the features before the probes (the official probe "
        "does; the run is then not comparable with the paper)",
    )
    p.add_argument(
        "--verify",
        choices=["cached", "sha256", "size", "none"],
        default="cached",
        help="how the feature stores are checked: sha256 of every file once per "
        "file version (cached, the default), every time (sha256), sizes only "
        "(size), or not at all (none)",
    )
    p.add_argument(
        "--part",
        metavar="I/N",
        default=None,
        help="train part I of N (from 1) of the cells, in a job of its own, into RESULTS beside "
        "the other parts, which may run at the same time (a SLURM job array: --part "
        "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); the finished folder is the one a run of "
        "N processes makes",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="with --plan: plan the run on this many machines (default 1)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="with --plan: and this many GPUs (processes) on each, like this machine's device "
        "(default 1)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_evaluate, saved=_evaluate_saved)


def _evaluate_saved(args):
    """What an interrupted evaluate leaves in --out, for :func:`main`'s one line."""
    from ._runfolder import read_records

    n = len(read_records(runs_file(args.out)))
    if not n:
        return "no cell was finished; the same command starts again"
    return (
        f"{n} finished cell{'s' * (n != 1)} saved in {runs_file(args.out)}; the same command "
        "resumes with the others"
    )


def _present_domains(features):
    """The domains with stores under a features folder, in the paper's order, said once."""
    from ._grid import DOMAINS
    from .store import list_domains

    try:
        found = set(list_domains(features))
    except (OSError, ValueError):  # not a store root: evaluate says what it is
        found = set()
    present = [d for d in DOMAINS if d in found]
    if present:
        missing = [d for d in DOMAINS if d not in present]
        note = f"; no features for {', '.join(missing)}" if missing else ""
        print(f"domains: {', '.join(present)} (those in {features}{note}; --domains to choose)")
    return present or list(DOMAINS)  # none: evaluate says what the folder holds


def _run_evaluate(args):
    from .protocol import evaluate, plan_evaluate

    if args.out is None and not args.plan:
        raise ValueError(
            "evaluate needs an output folder: give --out RESULTS (or --plan to see what the "
            "run would take, without training)"
        )
    domains = (
        [d for d in args.domains.split(",") if d]
        if args.domains
        else _present_domains(args.features)
    )
    # What the plan and the run share: the plan is of the run these options would make.
    run = {
        "levels": args.levels,
        "domains": domains,
        "shots": _comma_list(args.shots),
        "seeds": _comma_list(args.seeds),
        "n_trials": args.trials,
        "n_startup_trials": args.startup_trials,
        "device": args.device,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "trials_per_batch": args.trials_per_batch,
        "mixed_precision": "bf16" if args.bf16 else None,
        "compile": {"auto": "auto", "on": True, "off": False}[args.compile],
        "n_jobs": args.jobs,
    }
    if args.plan:
        shape = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node}
        print(plan_evaluate(args.features, **run, **shape).table())
        return 0
    if args.nodes is not None or args.gpus_per_node is not None:
        raise ValueError(
            "--nodes and --gpus-per-node shape the plan (with --plan); a run takes its processes "
            "from torchrun or srun (docs/guide/cluster.rst)"
        )
    results = evaluate(
        args.features,
        **run,
        out=args.out,
        model=args.model,
        save_predictions=args.save_predictions,
        normalize=not args.no_normalize,
        progress=not args.quiet,
        verify=None if args.verify == "none" else args.verify,
        part=args.part,
    )
    from ._distributed import torchrun_env
    from ._reporting.cells import describe_missing

    if (torchrun_env() or (0,))[0] != 0:
        return 0
    missing = describe_missing(args.out) if args.part else None
    if missing:  # the other parts' cells: no report of a part of the grid
        print(f"part {args.part} done: its cells are in {runs_file(args.out)}; {missing}")
        return 0
    print(results.report())
    print(f"\nresults in {runs_file(args.out)}; tables and plots: imagenet-cog report {args.out}")


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
        "--name",
        action="append",
        default=[],
        metavar="FOLDER=NAME",
        help="show the cells of the RESULTS folder FOLDER under NAME, in every output (two "
        "runs of one checkpoint with other settings need names of their own); repeat for "
        "each folder; the files and their checksums are not touched",
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
        "--html",
        metavar="FILE",
        default=None,
        help="write one self-contained HTML report (it opens offline): the answer, the "
        "verdict, the figures, sortable tables, every concept from saved predictions, "
        "the provenance; with RESULTS, among the paper's models",
    )
    p.add_argument(
        "--levels",
        metavar="PATH",
        default=None,
        help="with --html: the levels the runs were made with, for each concept's similarity "
        "to IN-1K (checked by content); by default each run's own, read only from inside its "
        "folder (the copy evaluate --levels keeps in RESULTS/levels/): a path its config.json "
        "names elsewhere is never read unless given here",
    )
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
        "differences over the seeds, the one-sided t-test adjusted over the domains "
        "(Holm) and its compatible lower bounds, under the comparability verdict",
    )
    p.add_argument(
        "--shots",
        default=None,
        help="with --compare: the shots per class compared (default all); with --format "
        "latex: the columns, comma-separated (default every one)",
    )
    p.add_argument(
        "--domains",
        default=None,
        help="with --format latex: the tables, comma-separated (default every domain)",
    )
    p.add_argument(
        "--latex-float",
        choices=["table", "table*"],
        default="table",
        help="with --format latex: the float of each table; table* spans both columns of a "
        "two-column paper, where a full table in one column shrinks to a few points",
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
    from ._comparability import NotComparableError, comparability
    from ._reporting.verdict import caveat_lines, not_comparable_banner
    from .results import Results, reference_results

    if not args.results and args.reference != "paper":
        raise ValueError("give RESULTS folders, or --reference paper to show the paper's tables")
    mine = []
    names = _given_names(args.results, args.name)
    if args.results:
        results = Results.load(*args.results, names=names)
        mine = list(results.models)
        _note_missing(args.results)
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

    pair = [m.strip() for m in args.compare.split(",") if m.strip()] if args.compare else None
    if args.html:
        _write_html(results, mine, pair, args)
    if args.compare:
        if len(pair) != 2:
            raise ValueError(f"--compare takes two models, A,B; got {args.compare!r}")
        unknown = [m for m in pair if m not in results.models]
        if unknown:
            raise ValueError(
                f"--compare: unknown model(s) {unknown}; have {results.models}"
                + ("" if args.reference else " (add --reference paper for the paper's models)")
            )
        # The verdict on comparability, as every report gives it: the banner above, the
        # caveats under.
        if banner and args.format == "text":  # else said on stderr already
            print(banner + "\n")
        print(results.compare_models(*pair, shots=args.shots or "all", metric=args.metric))
        notes = caveat_lines(results) if mine else []
        if notes:
            print("\n" + "\n".join(notes))
        return
    if args.format == "latex":
        shots = _comma_list(args.shots) if args.shots else None
        domains = _comma_list(args.domains) if args.domains else None
        latex = results.to_latex(
            metric=args.metric, shots=shots, domains=domains, float_env=args.latex_float
        )
        print(latex, end="")
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
        _print_protocols(results, mine)
        if results.meta.get("analysis"):
            print()
            print(results.analysis_table())
    else:
        # The banner once, at the top (the report's), with the reasons; the caveats below.
        print(results.report(metric=args.metric, banner=bool(mine)))
        if baseline is not None:
            print()
            print(results.relative_to(baseline, args.metric).table(args.metric))
        _print_protocols(results, mine)
        if results.meta.get("analysis"):
            print()
            print(results.analysis_table())
        notes = caveat_lines(results) if mine else []
        if notes:
            print("\n" + "\n".join(notes))
    if args.plot:
        # The user's models, and every paper model named in --models, are labelled.
        highlight = [*mine, *(models or [])] if args.reference else None
        formats = [f.strip() for f in args.plot_format.split(",") if f.strip()]
        paths = results.plot(
            args.plot, baseline=baseline, highlight=highlight, metric=args.metric, formats=formats
        )
        print("\nwrote " + ", ".join(str(p) for p in paths), file=sys.stderr)


def _given_names(results, given):
    """``{folder: name}`` of ``--name FOLDER=NAME`` options; a folder may hold ``=`` (the
    first split whose left side exists is the folder), and must be one of ``results``."""
    from pathlib import Path

    from ._reporting.names import given_names

    names = {}
    for text in given:
        cuts = [i for i, c in enumerate(text) if c == "="]
        cut = next((i for i in cuts if i and Path(text[:i]).exists()), None)
        if cut is None or not text[cut + 1 :].strip():
            raise ValueError(
                f"--name {text!r}: give FOLDER=NAME, FOLDER one of the RESULTS folders "
                f"({', '.join(results) or 'none given'}) and NAME the name to show"
            )
        names[text[:cut]] = text[cut + 1 :].strip()
    try:
        given_names(results, names)
    except ValueError as exc:
        raise ValueError(f"--name: {exc}") from None
    return names


def _note_missing(paths):
    """On stderr, for each run folder of ``paths`` its plan has not finished: which cells
    are missing and which part makes them."""
    from ._reporting.cells import describe_missing

    for path in paths:
        missing = describe_missing(runs_file(path).parent)
        if missing:
            print(f"{path}: {missing}", file=sys.stderr)


def _print_protocols(results, mine):
    """Each of ``mine`` under every protocol its run holds (the linear probe, k-NN,
    zero-shot), side by side, each named; nothing for a model with the linear probe alone."""
    from ._reporting.protocols import protocols_text

    text = protocols_text(results, mine)
    if text:
        print()
        print(text)


def _write_html(results, mine, pair, args):
    """``report --html FILE``: the report of RESULTS among the paper's models (or the
    paper's own), written atomically; one line on stderr says where."""
    from pathlib import Path

    if pair is not None and (len(pair) != 2 or any(m not in results.models for m in pair)):
        return  # --compare says what is wrong below
    reference = bool(mine) and not results.reference_models()
    html = results.to_html(
        args.html,
        compare=pair,
        shots=args.shots or "all",
        reference=reference,
        baseline=args.baseline or "ResNet50",
        levels=args.levels,
    )
    size = len(html.encode("utf-8"))
    print(f"wrote {Path(args.html)} ({size / 1e6:.1f} MB, self-contained)", file=sys.stderr)


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

    from ._reporting.cells import describe_missing
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
            print(f"{folder}: {_verified(file, found['records'])}")
        for line in unchecked:
            print(f"  not checked: {line}")
        missing = describe_missing(folder)
        if missing:
            print(f"  not finished: {missing}")
    return 1 if failed else 0


def _verified(file, n):
    """What ``verify`` found of a folder with no mismatch: what matched what, and nothing
    claimed of a ``config.json`` that is not there."""
    from ._runfolder import RECORD_CHECKSUM, read_config, read_records

    if read_config(file.parent) is not None:
        return f"config.json and its {n} records match what made them"
    sealed = sum(RECORD_CHECKSUM in r for _, r in read_records(file))
    unbound = "(nothing binds them to a configuration)"
    if not sealed:
        return (
            f"no config.json, and none of its {n} records carries a checksum: nothing to "
            "check them against"
        )
    if sealed == n:
        return f"no config.json; its {n} records match their own checksums {unbound}"
    return (
        f"no config.json; the {sealed} of its {n} records that carry a checksum match it {unbound}"
    )


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
