"""The ``imagenet-cog`` command line.

Each subcommand has an ``_add_<name>`` function that declares its arguments
and a ``_run_<name>`` function that does the work.
"""

from __future__ import annotations

import argparse
import sys

from ._cli_results import add_evaluate, add_report, add_verify
from ._grid import PAPER_PROTOCOL
from ._runfolder import ANALYSIS, PREDICTIONS_DIR, analysis_path, has_predictions, runs_file
from ._tables import printable
from ._version import __version__


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default after its help, unless the help already gives it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        # No default to show: none, an off flag, or a suppressed one (--help, --version).
        if default is None or default is False or default is argparse.SUPPRESS:
            return text
        if not action.option_strings or "%(default)" in text:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        if "default" in text.lower() or f"({shown})" in text:
            return text
        return f"{text} (default: {shown.replace('%', '%%')})"


def build_parser():
    """The argument parser of ``imagenet-cog``."""
    parser = argparse.ArgumentParser(
        prog="imagenet-cog",
        description="ImageNet-CoG: concept generalization levels, features, linear probes, reports.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"imagenet-cog {__version__}")
    parser.add_argument(
        "--traceback",
        action="store_true",
        help="on an error, show the full Python traceback instead of one line "
        "(or set IMAGENET_COG_TRACEBACK=1)",
    )
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="NAME=package.module:function",
        help="a model source of your own, for specs NAME:...; the function is called as a "
        "registered source's loader (see register_model_source); repeatable. Installed "
        "packages offer theirs in the entry-point group imagenet_cog.model_sources",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    # Every subcommand, including those added later, shows its defaults in --help.
    for command in sub.choices.values():
        command.formatter_class = _HelpFormatter
    return parser


# ------------------------------------------------------------------ levels
def _add_levels(sub):
    p = sub.add_parser(
        "levels",
        help="build concept generalization levels from WordNet",
        description="Rank unseen ImageNet-21K concepts by similarity to ImageNet-1K and cut "
        "them into levels (the paper, Sec. 3.3 and supplement A.1). Writes DIR/levels.tsv and "
        "DIR/provenance.json. Without image counts (--counts or --images) these are not the "
        "official levels; extract uses the official ones unless given --levels DIR, and "
        "evaluate the levels its features were extracted with.",
    )
    p.add_argument(
        "--official",
        action="store_true",
        help="print the official levels (which extract and evaluate use by default): what "
        "each holds, its similarity range, examples; builds and writes nothing",
    )
    p.add_argument(
        "--measure",
        default="lin",
        help="similarity measure: lin, wup, jcn, path, lch, w2v, one of your own as "
        "package.module:function (measure(wnids_a, wnids_b, *, taxonomy) -> array), or one "
        "an installed package offers (entry-point group imagenet_cog.measures)",
    )
    p.add_argument(
        "--candidates",
        default="imagenet21k",
        help="candidate pool: imagenet21k, cog (re-rank the official 5000), or a "
        "file with one wnid per line (default: imagenet21k)",
    )
    counts = p.add_mutually_exclusive_group()
    counts.add_argument("--counts", metavar="FILE", help="per-concept image counts ('wnid count')")
    counts.add_argument(
        "--images",
        metavar="ROOT",
        help="your IN-21K copy (nXXXXXXXX/ folders or nXXXXXXXX.tar files) to count",
    )
    p.add_argument("--min-images", type=int, default=782, help="minimum images per concept (782)")
    p.add_argument("--vectors", metavar="FILE", help="word2vec/GloVe file for --measure w2v")
    p.add_argument("--n-levels", type=int, default=5, help="number of levels, L1 to Ln")
    p.add_argument("--level-size", type=int, default=1000, help="concepts per level")
    p.add_argument("--out", metavar="DIR", default="levels", help="output folder (default: levels)")
    p.set_defaults(run=_run_levels)


def _read_wnid_file(path):
    from pathlib import Path

    if not Path(path).is_file():
        raise FileNotFoundError(f"--candidates: no such file {path!r} (or use imagenet21k / cog)")
    words = Path(path).read_text(encoding="utf-8").split()
    return [x for x in words if not x.startswith("#")]


def _run_levels(args):
    import warnings
    from pathlib import Path

    from .levels import UnofficialLevelsWarning, build_levels, load_levels
    from .taxonomy import load_taxonomy

    if args.official:
        levels = load_levels("official")
        print(format_levels_summary(levels, load_taxonomy()))
        n_test = sum(len(v) for v in levels.test_images.values())
        print(
            f"\neach concept with its 50 official test images ({n_test:,} in all); source: "
            f"{levels.provenance.get('source')}. extract uses these levels unless given "
            "--levels; build your own with imagenet-cog levels --out DIR"
        )
        return 0

    candidates = args.candidates
    if candidates not in ("imagenet21k", "cog"):
        candidates = _read_wnid_file(candidates)
    kwargs = {"vectors": args.vectors} if args.vectors else {}
    if args.measure == "w2v" and not args.vectors:
        raise ValueError("--measure w2v needs --vectors FILE (a word2vec or GloVe file)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        levels = build_levels(
            measure=args.measure,
            candidates=candidates,
            image_counts=args.counts or args.images,
            min_images=args.min_images,
            n_levels=args.n_levels,
            level_size=args.level_size,
            measure_kwargs=kwargs,
            progress=True,
        )
    for w in caught:
        # The summary's first lines say it, with the options that apply the filter.
        if not issubclass(w.category, UnofficialLevelsWarning):
            print(f"warning: {w.message}", file=sys.stderr)
    tsv = levels.save(Path(args.out))
    print(format_levels_summary(levels, load_taxonomy()))
    print(f"\nwrote {tsv} and {tsv.with_name('provenance.json')}")


def _official_note(levels, official):
    """First lines of the summary: are these the official levels, and which ones evaluate uses."""
    concepts = {w for level in official.levels for w in level}
    built = [w for level in levels.levels for w in level]
    n_official = sum(w in concepts for w in built)
    same_level = sum(len(set(a) & set(b)) for a, b in zip(levels.levels, official.levels))
    if levels.levels == official.levels:
        return ["These are the official ImageNet-CoG levels.", ""]
    note = (
        "NOTE: these are NOT the official ImageNet-CoG levels: "
        f"{n_official:,} of their {len(built):,} concepts are official CoG concepts "
        f"({same_level:,} in the same level)."
    )
    where = (
        "extract uses the official levels (--levels official, the default) unless given "
        "--levels with this folder; evaluate uses the levels its features were extracted with."
    )
    lines = [note, where]
    step = next((s for s in levels.provenance.get("filters", []) if s["step"] == "min_images"), {})
    if str(step.get("detail", "")).startswith("skipped"):
        lines.append(
            "The min-images filter (the paper's supplement A.1) did not run, for want of image "
            "counts: add --images ROOT (your ImageNet-21K copy) or --counts FILE to apply it."
        )
    return [*lines, ""]


def format_levels_summary(levels, taxonomy, examples=3, official=None):
    """The text summary ``imagenet-cog levels`` prints: how the levels compare with the
    official ones, the filters, then the levels (``official``: the official
    :class:`~imagenet_cog.Levels`, loaded when not given)."""
    if official is None:
        from .levels import load_levels

        official = load_levels("official")
    prov = levels.provenance
    lines = _official_note(levels, official)
    if "seen" in prov:
        lines += [
            f"measure: {prov.get('measure')}   seen: {prov.get('seen')} ({prov.get('n_seen')})",
            "",
        ]
    else:  # the published levels: their measure and where they come from
        lines += [f"measure: {prov.get('measure')}; scores: {prov.get('scores', 'none')}", ""]
    if prov.get("filters"):
        lines.append(f"{'filter':<12} {'removed':>8} {'remaining':>10}  detail")
        for step in prov["filters"]:
            removed = step.get("removed", "")
            lines.append(
                f"{step['step']:<12} {removed!s:>8} {step['remaining']:>10}  {step['detail']}"
            )
        lines.append("")
    lines += [f"{'level':<6} {'size':>5} {'score range':>19}  examples"]
    for name, wnids in zip(levels.names, levels.levels):
        scores = [levels.scores[w] for w in wnids if w in levels.scores]
        span = f"{min(scores):.4f} - {max(scores):.4f}" if scores else "n/a"
        shown = ", ".join(taxonomy.lemma_names(w)[0].replace("_", " ") for w in wnids[:examples])
        lines.append(f"{name:<6} {len(wnids):>5} {span:>19}  {shown}")
    return "\n".join(lines)


_COMMANDS = [_add_levels]


#: Set to 1 to see the full traceback of an error, as ``--traceback`` does.
TRACEBACK_ENV = "IMAGENET_COG_TRACEBACK"


def _is_user_error(exc):
    """Errors caused by the input (bad values, missing or unreadable files), not by a bug."""
    if isinstance(exc, (ValueError, OSError, KeyError, ImportError)):
        return True
    # The package's own public error classes (e.g. StoreMismatchError, FolderLockedError).
    cls = type(exc)
    return cls.__module__.split(".")[0] == "imagenet_cog" and not cls.__name__.startswith("_")


def _one_line(exc):
    # KeyError's str() quotes its message; show the message itself.
    msg = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else exc
    return " ".join(str(msg).split()) or type(exc).__name__


#: Exit code of a command stopped by Ctrl-C (SIGINT), as shells report it: 128 + 2.
INTERRUPTED = 130


def _interrupted_line(args):
    """The one line an interrupted command prints: what it saved, and how to go on."""
    saved = getattr(args, "saved", None)
    try:
        what = saved(args) if saved else None
    except (OSError, ValueError):  # the line comes out whatever state the folder is in
        what = None
    return "imagenet-cog: interrupted" + (f"; {what}" if what else "")


def _register_sources(given):
    """``--source NAME=package.module:function``: register each as a model source."""
    from ._models.registry import register_model_source
    from ._plugins import load_object

    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--source {item!r}: use NAME=package.module:function")
        # register_model_source refuses what is not callable.
        register_model_source(name, load_object(path, f"--source {name}"), overwrite=True)


def main(argv=None):
    """Entry point of ``imagenet-cog``; returns the exit code.

    An error caused by the input prints one line, ``imagenet-cog: error: ...``, on stderr and
    returns 2; ``--traceback`` (or the environment variable ``IMAGENET_COG_TRACEBACK=1``)
    raises it with its full traceback instead. Ctrl-C prints one line saying what is saved
    and returns 130.
    """
    import os
    import warnings

    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.traceback or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    with warnings.catch_warnings():  # restores Python's way of showing warnings after
        if not debug:
            warnings.showwarning = _warning_line
        return _main(args, debug)


def _warning_line(message, category, filename, lineno, file=None, line=None):
    """A warning on the command line: one line, without the library's file and source line."""
    text = " ".join(str(message).split())
    print(f"imagenet-cog: warning: {text}", file=sys.stderr if file is None else file)


def _main(args, debug):
    import os

    try:
        _register_sources(args.source)
        return args.run(args) or 0
    except KeyboardInterrupt:
        if debug:
            raise
        print(_interrupted_line(args), file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader of the output left (imagenet-cog ... | head): stop quietly, as other
        # commands do; stdout goes to devnull so that Python's final flush fails no more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:
        if debug or not _is_user_error(exc):
            raise
        print(f"imagenet-cog: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def run():
    """The ``imagenet-cog`` command: :func:`main`, then exit with its code.

    After Ctrl-C the process leaves at once, its output flushed, without the interpreter's
    teardown: a library thread interrupted mid-task (torch's, a DataLoader's) can abort that
    teardown ("terminate called without an active exception", exit -6 instead of 130). The
    run's files are complete by then: every file is written atomically and the locks are
    released before :func:`main` returns.
    """
    import os

    code = main()
    if code == INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


# ------------------------------------------------------------------- extract
def _add_extract(sub):
    p = sub.add_parser(
        "extract",
        help="extract frozen features of every domain (or some) into a feature store",
        description=(
            "Extract the features the protocol needs into DIR/<domain>/<split>/: with --in1k and "
            "--in21k, the train and test splits of in1k and L1..L5 (12 stores) in one run, the "
            "network loaded once, one progress bar. A finished store with the same settings is "
            "skipped, an unfinished one resumed. Under torchrun (python -m torch.distributed.run "
            "--nproc_per_node K -m imagenet_cog extract ...) the shards are shared among the "
            "processes."
        ),
    )
    p.add_argument("model_spec", nargs="?", metavar="MODEL", help="model spec (same as --model)")
    p.add_argument(
        "--model",
        default=None,
        help="model spec: torchvision:NAME[:WEIGHTS|FILE|none], timm:NAME[:pretrained|FILE], "
        "open_clip:ARCH[:TAG|FILE], hf:REPO_ID_OR_DIR or torchhub:REPO_DIR:ENTRYPOINT (the "
        "docs' model zoo); weights come from each library's cache or a file: "
        "torchvision:resnet50:/path/to/resnet50-0676ba61.pth",
    )
    p.add_argument(
        "--in1k",
        metavar="ROOT",
        default=None,
        help="ImageNet-1K root (train/ and val/, webdataset shards or Parquet "
        "files), for the domain in1k",
    )
    p.add_argument(
        "--in21k",
        metavar="ROOT",
        default=None,
        help="ImageNet-21K root (wnid folders, wnid.tar files, webdataset shards or "
        "Parquet files), for the levels",
    )
    p.add_argument(
        "--data",
        default=None,
        help="the root of the --domain(s) given: ImageNet-21K root for the levels, "
        "ImageNet-1K root for in1k (instead of --in1k/--in21k)",
    )
    p.add_argument(
        "--domain",
        default=None,
        help="comma-separated: in1k and/or level names L1..L5 (default: in1k if --in1k is "
        "given, every level if --in21k is given)",
    )
    p.add_argument(
        "--split",
        nargs="+",
        choices=["train", "test"],
        default=["train", "test"],
        help="split(s) to extract (default: both); the test split of in1k is val/",
    )
    p.add_argument("--levels", default="official", help="'official' or a levels folder/file")
    p.add_argument("--out", required=True, help="the feature store ROOT")
    p.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers (default: 0 on CPU, the cores less one on GPU)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: CUDA if any)")
    p.add_argument(
        "--amp",
        choices=["off", "on", "bf16", "fp16"],
        default="off",
        help="mixed precision (on: fp16 on CUDA, bf16 on CPU)",
    )
    p.add_argument("--channels-last", action="store_true", help="channels-last memory format")
    p.add_argument(
        "--preprocessing",
        default=None,
        help="a MODEL_ZOO key (clip, simclr_v2, inception_v3...) or a JSON object such as "
        '\'{"size": 224, "mean": null, "std": null}\' (default: the model\'s preset)',
    )
    p.add_argument(
        "--layer",
        default=None,
        help="module whose output is taken (default: before the classifier)",
    )
    p.add_argument("--no-normalize", action="store_true", help="do not l2-normalize features")
    p.add_argument("--seed", type=int, default=None, help="seed of the split choices (default 0)")
    p.add_argument("--cap", type=int, default=None, help="most train images per concept (1300)")
    p.add_argument(
        "--n-test",
        type=int,
        default=None,
        help="test images per concept without a bundled test list (50)",
    )
    p.add_argument("--wnids", default=None, help="only these concepts: comma-separated or a file")
    p.add_argument("--val-labels", default=None, help="label file of a flat ImageNet-1K val/")
    p.add_argument("--shard-size", type=int, default=None, help="images per shard (10000)")
    p.add_argument(
        "--overwrite", action="store_true", help="rebuild a store made with other settings"
    )
    p.add_argument(
        "--decoder",
        choices=["auto", "pil", "torchvision"],
        default="auto",
        help="image decoding: pil (the worker path: the DataLoader workers decode, resize and "
        "crop), torchvision (baseline JPEGs decoded in batches on the device, nvJPEG on a GPU, "
        "and resized as Pillow does), auto: pil (default: auto)",
    )
    p.add_argument(
        "--resize",
        choices=["auto", "pil", "torch"],
        default="auto",
        help="the worker path's resize: pil (Pillow's, exact), torch (torch's antialiased "
        "resize of the 8-bit pixels, faster, recorded in the store's key), auto: pil on the "
        "CPU, torch on a GPU (default: auto)",
    )
    p.add_argument(
        "--tf32",
        action="store_true",
        help="let convolutions and matrix products run in TF32 on CUDA (default: float32, "
        "recorded in the store's key when on)",
    )
    p.add_argument(
        "--truncated-images",
        choices=["keep", "skip"],
        default="keep",
        help="image files whose data stops early: keep (decoded as the official code's loader "
        "does, the missing part grey; listed in the manifest) or skip (default: keep)",
    )
    p.add_argument(
        "--part",
        metavar="I/N",
        default=None,
        help="extract part I of N (from 1) of the stores, in a job of its own, beside the other "
        "parts (a SLURM job array: --part $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_extract, saved=_extract_saved)


def _extract_saved(args):
    """What an interrupted extract leaves under --out, for :func:`main`'s one line."""
    from pathlib import Path

    # The store layout (docs/guide/features.rst, 'The store'): manifest.json marks a finished
    # store, run.json an unfinished one whose shard-*.json records mark its finished shards.
    root = Path(args.out)
    finished = list(root.glob("*/*/manifest.json"))
    unfinished = [p.parent for p in root.glob("*/*/run.json")]
    unfinished = [p for p in unfinished if not (p / "manifest.json").is_file()]
    shards = sum(len(list(p.glob("shard-*.json"))) for p in unfinished)
    if not finished and not shards:
        return "no store or shard was finished; the same command starts again"
    parts = [f"{len(finished)} finished store{'s' * (len(finished) != 1)}"] if finished else []
    if shards:
        parts.append(
            f"{shards} finished shard{'s' * (shards != 1)} of {len(unfinished)} unfinished "
            f"store{'s' * (len(unfinished) != 1)}"
        )
    return f"saved in {root}: {' and '.join(parts)}; the same command resumes from there"


def _extract_roots(args):
    """``(data, domains)`` for extract_all from --in1k/--in21k or --data/--domain."""
    model = args.model or args.model_spec
    if not model:
        raise ValueError(
            "no model given: name the network whose features to extract, as MODEL or --model "
            "MODEL (e.g. torchvision:resnet50:IMAGENET1K_V1)"
        )
    if args.model and args.model_spec and args.model != args.model_spec:
        raise ValueError(f"two models given, {args.model_spec} and --model {args.model}: give one")
    args.model = model
    domains = [d for d in (args.domain or "").replace(" ", "").split(",") if d] or None
    data = {"in1k": args.in1k, "in21k": args.in21k}
    if args.data:
        if not domains:
            raise ValueError("--data needs --domain (or use --in1k ROOT and/or --in21k ROOT)")
        kinds = {"in1k" if d == "in1k" else "in21k" for d in domains}
        if len(kinds) > 1:
            raise ValueError("--data is the root of one dataset: use --in1k and --in21k for both")
        data[kinds.pop()] = args.data
    data = {k: v for k, v in data.items() if v}
    if not data:
        raise ValueError("give --in1k ROOT and/or --in21k ROOT (or --data ROOT --domain NAME)")
    return data, domains


def _run_extract(args):
    import json
    from pathlib import Path

    from ._distributed import Part, torchrun_env
    from ._extract_all import extract_all, store_parts
    from .features import FeatureExtractor
    from .store import list_domains, open_store, store_path

    data, domains = _extract_roots(args)
    part = Part.parse(args.part) if args.part else None  # a bad --part fails before the model
    preprocessing = None
    if args.preprocessing:
        text = args.preprocessing.strip()
        try:
            preprocessing = json.loads(text) if text.startswith("{") else text
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"--preprocessing {text!r} is not valid JSON ({exc.msg} at column {exc.colno}); "
                """give an object such as '{"size": 224}' or a MODEL_ZOO key (clip...)"""
            ) from None
    # One extractor for all splits: the network is loaded once.
    extractor = FeatureExtractor(
        args.model,
        preprocessing=preprocessing,
        layer=args.layer,
        normalize=not args.no_normalize,
        batch_size=args.batch_size,
        num_workers=args.workers,
        device=args.device,
        amp={"off": False, "on": True}.get(args.amp, args.amp),
        channels_last=args.channels_last,
        decoder=args.decoder,
        truncated_images=args.truncated_images,
        resize=args.resize,
        tf32=args.tf32,
    )
    extractor.fingerprint()  # load the network first: a missing weights file fails fast
    options = {"overwrite": args.overwrite, "progress": not args.quiet}
    for name in ("seed", "cap", "n_test", "shard_size", "val_labels"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.wnids:
        wnids = Path(args.wnids)
        text = wnids.read_text() if wnids.is_file() else args.wnids
        options["wnids"] = [w for w in text.replace(",", " ").split() if not w.startswith("#")]
    root = extract_all(
        extractor,
        data,
        args.out,
        args.levels,
        domains=domains,
        splits=args.split,
        part=part,
        **options,
    )
    env = torchrun_env()
    if env is not None and env[0] != 0:
        return 0
    owner = {}
    if part is not None:
        keep = ("wnids", "cap", "n_test")
        owner = store_parts(
            data,
            args.levels,
            domains=domains,
            splits=args.split,
            count=part.count,
            **{k: v for k, v in options.items() if k in keep},
        )
    others = []
    listed = list(dict.fromkeys(d for d, _ in owner)) if owner else list_domains(root)
    for domain in domains or listed:
        source = "in1k" if domain == "in1k" else "in21k"
        if source not in data:  # extracted into this root before, from a root not given now
            continue
        for split in args.split:
            path = store_path(root, domain, split)
            theirs = part is not None and owner[domain, split] != part.number
            if theirs and not (path / "manifest.json").is_file():
                others.append(f"{domain}/{split} (--part {owner[domain, split]}/{part.count})")
                continue
            store = open_store(path)
            given = Path(data[source]).resolve()
            first = store.manifest.get("split") or {}
            # Features made from another copy of the same images are reused, and said so.
            reused = (
                f"reused (same images as {first['data_root']}, {first.get('layout')}): "
                if first.get("data_root") not in (None, str(given))
                else ""
            )
            print(
                f"{path}: {reused}{len(store)} images x {store.features.dim} features, "
                f"{len(store.skipped)} skipped"
            )
            for s in store.skipped[:20]:
                print(f"  skipped {s['id']}: {s['reason']}")
            if len(store.skipped) > 20:
                print(f"  ... and {len(store.skipped) - 20} more (see {path / 'manifest.json'})")
            cut = store.manifest.get("truncated") or []
            if cut:
                print(
                    f"  {len(cut)} truncated file(s) kept, the missing part grey, as the "
                    f"official code keeps them (listed in {path / 'manifest.json'})"
                )
    if others:
        print(f"part {part} done; not extracted yet, by the other parts: {', '.join(others)}")
    return 0


_COMMANDS.append(_add_extract)


_COMMANDS += [add_evaluate, add_report, add_verify]


# ----------------------------------------------------------------- analyze
def _add_analyze(sub):
    from ._analysis.evaluations import add_evaluation_options
    from ._analysis.table import ANALYSES

    defaults = ",".join(name for name, row in ANALYSES.items() if row.default)
    p = sub.add_parser(
        "analyze",
        help="clusters, alignment/uniformity, PCA/MLP probes and WordNet error analysis",
        description="Analyses beyond accuracy (the paper's first version, Sec. 4.3; Lymperaiou "
        "et al., 2023). Given a feature-store root: "
        "k-means cluster scores and alignment/uniformity per domain (and, with --predictions, "
        "the knowledge-driven analysis of the probe's errors). Given an evaluate output folder "
        f"holding {PREDICTIONS_DIR}/ (evaluate --save-predictions): the error analysis only. "
        f"Writes {ANALYSIS}, which `imagenet-cog report` shows.",
    )
    p.add_argument(
        "path",
        metavar="FEATURES|PREDICTIONS",
        help=f"a feature-store root, or an evaluate output folder with {PREDICTIONS_DIR}/",
    )
    p.add_argument(
        "--predictions",
        metavar="RESULTS",
        default=None,
        help=f"evaluate output folder with {PREDICTIONS_DIR}/, for the error analysis",
    )
    p.add_argument("--domains", default=None, help="comma-separated (default: all present)")
    p.add_argument(
        "--analyses",
        default=None,
        help=f"comma-separated among {', '.join(ANALYSES)} (default: {defaults})",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help=f"folder for {ANALYSIS} (default: beside the results: RESULTS when "
        "given, else the analysed folder)",
    )
    p.add_argument("--plot", metavar="PNG", default=None, help="draw the measures per domain")
    p.add_argument(
        "--concepts",
        action="store_true",
        help="accuracy of each concept against its similarity to IN-1K, from the "
        "saved predictions: concepts.csv and concepts.png in --out",
    )
    p.add_argument(
        "--levels",
        default=None,
        help="with --concepts: the levels whose scores give each concept's similarity to "
        "IN-1K; default the levels the run was made with (its config.json), read only from "
        "inside its folder; others must match them",
    )
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: CUDA if available)")
    p.add_argument("--top-k", type=int, default=5, help="confusions explained per class (5)")
    p.add_argument("--kmeans-seeds", type=int, default=3, help="k-means runs, lowest inertia (3)")
    p.add_argument("--shots", default="all", help="the predictions cell to analyse (all)")
    p.add_argument(
        "--semantic-seed",
        default="first",
        help="'first' (lowest seed), 'mean' (over seeds), or a seed",
    )
    p.add_argument("--model", default=None, help="model name (default: the store's)")
    paper = PAPER_PROTOCOL
    p.add_argument(
        "--probe-seeds",
        default=",".join(map(str, paper.seeds)),
        help="seeds of the pca/mlp probes, comma-separated",
    )
    p.add_argument(
        "--probe-trials",
        type=int,
        default=paper.n_trials,
        help=f"TPE trials of the probes ({paper.n_trials})",
    )
    p.add_argument(
        "--probe-epochs",
        type=int,
        default=paper.epochs,
        help=f"SGD epochs of the probes ({paper.epochs})",
    )
    add_evaluation_options(p, paper.shots, paper.seeds)
    p.add_argument("--verbose", action="store_true", help="a line per domain and analysis")
    p.set_defaults(run=_run_analyze)


def _concept_accuracy(predictions, out, args):
    """``analyze --concepts``: accuracy per concept against its similarity to IN-1K."""
    from pathlib import Path

    from .analysis import concept_accuracy

    if predictions is None:
        raise ValueError(
            "--concepts needs saved predictions: give an evaluate output folder "
            "run with --save-predictions (or --predictions)"
        )
    found = concept_accuracy(predictions, levels=args.levels, shots=args.shots)
    csv_path, png_path = Path(out) / "concepts.csv", Path(out) / "concepts.png"
    found.to_csv(csv_path)
    found.plot(png_path, note=_not_comparable_note(predictions))
    print(
        f"\naccuracy of {len(found.wnids)} concepts (N={found.shots}, seeds "
        f"{', '.join(map(str, found.seeds))}): Spearman {found.spearman:+.2f} between "
        f"similarity to IN-1K and top-1; most similar first:"
    )
    print(found.table(10))
    print(f"wrote {csv_path} and {png_path}", file=sys.stderr)


def _not_comparable_note(folder):
    """The figure footnote of an evaluate folder's models that are not comparable with the
    paper (decisive reasons first), or None."""
    if folder is None or not runs_file(folder).is_file():
        return None
    from ._comparability import not_comparable
    from ._figures import footnote_text
    from .results import Results

    return footnote_text(not_comparable(Results.load(folder))) or None


def _run_analyze(args):
    from pathlib import Path

    from ._analysis.evaluations import evaluation_arguments
    from .analysis import analyze
    from .store import list_domains

    path = Path(args.path)
    if not path.is_dir():
        raise FileNotFoundError(f"no such folder: {path}")
    features, predictions = None, args.predictions
    if list_domains(path):
        features = path
    elif has_predictions(path):
        if predictions is not None:
            raise ValueError(f"{path} holds predictions, not features: drop --predictions")
        predictions = path
    else:
        raise FileNotFoundError(
            f"{path} is neither a feature-store root (from extract) nor an evaluate output "
            f"folder with {PREDICTIONS_DIR}/ (from evaluate --save-predictions)"
        )
    out = Path(args.out) if args.out else Path(predictions or path)
    kwargs = {}
    if args.analyses:
        kwargs["analyses"] = [a for a in args.analyses.replace(" ", "").split(",") if a]
    evaluations = evaluation_arguments(args)
    domains = [d for d in args.domains.split(",") if d] if args.domains else None
    if args.plan:
        return _plan_knn(features, domains, kwargs.get("analyses"), evaluations, args.device)
    seed = args.semantic_seed
    report = analyze(
        features,
        out=out,
        domains=domains,
        predictions=predictions,
        seeds=args.kmeans_seeds,
        device=args.device,
        model=args.model,
        top_k=args.top_k,
        shots=args.shots,
        semantic_seed=seed if seed in ("first", "mean") else int(seed),
        probe_seeds=[int(s) for s in args.probe_seeds.split(",") if s],
        probe_kw={"n_trials": args.probe_trials, "epochs": args.probe_epochs},
        progress=True,
        verbose=int(args.verbose),
        **evaluations,
        **kwargs,
    )
    print(report.table())
    for name, rows in report.sections.items():
        for domain, found in rows.items():
            for n, why in (found.get("skipped") or {}).items():
                print(f"{name} skipped on {domain} N={n}: {why}", file=sys.stderr)
    for domain, probes in report.probe_scores.items():
        for scores in probes.values():
            print(f"\n{domain}: " + scores.table())
    for domain, summary in report.semantic.items():
        o = summary["overall"]
        cell = f"N={summary['shots']}, seed {', '.join(map(str, summary['seeds']))}"
        if o.get("n_errors") == 0:
            print(
                f"\n{domain}: no errors in {o.get('n_samples', '?')} test predictions ({cell}): "
                "no confusion to explain"
            )
            continue
        print(
            f"\n{domain}: {o.get('n_errors', '?')} errors in {o.get('n_samples', '?')} test "
            f"predictions ({cell}); most frequent confusions:"
        )
        for c in summary["top_confusions"][: args.top_k]:
            rel = f", {c['relation']}" if c.get("relation") else ""
            why = c.get("explanation") or f"{c['true']} -> {c['pred']}"
            # Labels come from the saved predictions: shown, never sent to the terminal.
            print(printable(f"  {why}  ({c['count']}x, MF {c['mf']:.0%}{rel})"))
    for what, why in report.settings.get("skipped", {}).items():
        print(f"skipped {what}: {why}", file=sys.stderr)
    if args.concepts:
        _concept_accuracy(predictions, out, args)
    if args.plot:
        try:
            report.plot(args.plot, note=_not_comparable_note(predictions))
        except ValueError as exc:  # no measure has a value to draw; the analysis stands
            print(f"no plot: {exc}", file=sys.stderr)
        else:
            print(f"wrote {args.plot}", file=sys.stderr)
    print(f"wrote {analysis_path(out)}", file=sys.stderr)


def _plan_knn(features, domains, analyses, evaluations, device):
    """``analyze --plan``: the k-NN grid's plan, nothing computed."""
    from .analysis import plan_knn

    if features is None:
        raise ValueError("--plan plans the k-NN grid of a feature-store root: give one")
    if analyses is not None and "knn" not in analyses:
        raise ValueError("--plan plans the k-NN grid: add knn to --analyses")
    grid = {k: evaluations[k] for k in ("knn_k", "knn_shots", "knn_seeds")}
    print(plan_knn(features, domains, device=device, **grid).table())
    return 0


_COMMANDS.append(_add_analyze)


# ---------------------------------------------------------------- selftest
def _add_selftest(sub):
    p = sub.add_parser(
        "selftest",
        help="check this machine and print a table to paste into a bug report",
        description="Check that this machine runs the library right, in about two minutes on "
        "one GPU: the environment, the fast SGD step against the eager one, the tensor JPEG "
        "decoder against Pillow, an all-reduce under torchrun, ms per trial-step and images per "
        "second (docs: What it costs). Exits 1 when a check fails. For the all-reduce: "
        "torchrun --nproc-per-node N -m imagenet_cog selftest",
    )
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: CUDA if available)")
    p.add_argument(
        "--model",
        default=None,
        help="network of the decoder and speed checks (default: torchvision:resnet50 on "
        "CUDA, torchvision:resnet18 on the CPU, random weights)",
    )
    p.add_argument(
        "--only",
        metavar="PHASES",
        default=None,
        help="comma-separated among environment, step, decoder, allreduce, "
        "trial-steps, throughput (default: all)",
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="also write the rows to FILE as JSON"
    )
    p.set_defaults(run=_run_selftest)


def _run_selftest(args):
    from ._selftest import PHASES, run_selftest

    # "--only environment, step" as well as "environment,step"; "--only ," names nothing and
    # is refused by run_selftest, not taken for every phase.
    phases = PHASES if args.only is None else [x.strip() for x in args.only.split(",") if x.strip()]
    report = run_selftest(args.device, model=args.model, phases=phases)
    if report is None:  # a torchrun rank other than 0: rank 0 prints the table
        return 0
    print(report.table())
    if args.json:
        import json

        from ._fileio import atomic_write_text

        atomic_write_text(args.json, json.dumps(report.to_dict(), indent=2) + "\n")
    return 1 if report.failed else 0


_COMMANDS.append(_add_selftest)


# --------------------------------------------------------------------- data
def _add_data(sub):
    from ._cli.data import add_data

    add_data(sub)


_COMMANDS.append(_add_data)


# ------------------------------------------------------------------ submit
def _add_submit(sub):
    from ._cli.submit import add_submit

    add_submit(sub, check=lambda argv: build_parser().parse_args(argv))


_COMMANDS.append(_add_submit)
