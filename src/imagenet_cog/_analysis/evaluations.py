"""The evaluations' rows of the table of analyses: k-NN and zero-shot on the levels, other
protocols than the paper's linear probe.

What :mod:`.table` runs for the rows ``knn`` and ``zeroshot`` (``run_<name>``), records in
``analysis.json``'s settings (``<name>_settings``) and shows beside the linear probe
(``<name>_scores``, a :class:`Scores`): the grid and the towers are in :mod:`.knn_grid` and
:mod:`.zeroshot_domain`, the records in :mod:`.records`. Every number they give is labelled by
its protocol (:data:`KNN_PROTOCOL`, :data:`ZEROSHOT_PROTOCOL`) and never ranked with the
paper's linear-probe numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "KNN_PROTOCOL",
    "REPORTED_K",
    "ZEROSHOT_PROTOCOL",
    "Scores",
    "add_evaluation_options",
    "evaluation_arguments",
    "knn_scores",
    "knn_settings",
    "open_records",
    "run_knn",
    "run_zeroshot",
    "zeroshot_scores",
    "zeroshot_settings",
    "zeroshot_tower",
]


def _say(options, line):
    if options.verbose:
        print(line)


@dataclass(frozen=True)
class Scores:
    """An evaluation's numbers at one number of training images per concept, as the reports
    show them beside the linear probe's.

    Attributes
    ----------
    label : str
        Its protocol and settings (``"k-NN, k = 20, T = 0.07"``).
    domains : dict
        ``{domain: top-1 (%)}`` (mean over the seeds for few-shot k-NN).
    stds : dict
        ``{domain: std over the seeds}``; empty where there is one value.
    concepts : dict
        ``{wnid: top-1 (%)}`` of every test concept, where recorded (the all-data cell).
    note : str
        What the numbers are of (the seeds, the training images), in a few words.
    """

    label: str
    domains: dict
    stds: dict = field(default_factory=dict)
    concepts: dict = field(default_factory=dict)
    note: str = ""


#: The name of each evaluation's protocol, as every report labels its numbers.
KNN_PROTOCOL = "k-NN"
ZEROSHOT_PROTOCOL = "zero-shot"
#: The k the reports show beside the linear probe: the one DINO reports.
REPORTED_K = 20


def open_records(options, name, settings, key_fields):
    """The evaluation's records in ``options.out`` (opened once per run), or None without
    an out folder."""
    if options.out is None:
        return None
    found = options.loaded.get(f"{name}_records")
    if found is None:
        from .records import EvaluationRecords

        found = EvaluationRecords(options.out, name, settings, key_fields)
        options.loaded[f"{name}_records"] = found
    return found


def run_knn(data, options):
    """The k-NN grid of one domain (:class:`~.table.DomainData`), its cells read back from
    or appended to ``knn.jsonl``: the domain's measures, details and records' binding."""
    from .knn_grid import domain_measures, run_knn_domain, summarize
    from .knn_grid import knn_settings as settings_of

    ks, temperature = options.knn_ks, options.knn_temperature
    records = open_records(
        options, "knn", settings_of(ks, temperature), ("domain", "shots", "seed")
    )
    cells, skipped, concepts = run_knn_domain(
        data.domain,
        data.source.load(data.domain, mmap=True),
        ks=ks,
        temperature=temperature,
        shots=options.grid_shots,
        seeds=options.grid_seeds,
        place=options.place,
        records=records,
        inputs={"features": data.source.fingerprint(data.domain)},
        model=options.model,
        say=lambda line: _say(options, line),
        progress=options.progress,
    )
    details = summarize(cells, concepts, ks, temperature)
    details["skipped"] = {str(n): why for n, why in skipped.items()}
    binding = records.binding() if records is not None else {}
    return {"measures": domain_measures(cells, ks), "details": details, "records": binding}


def knn_settings(options):
    """What ``analysis.json``'s settings record of the k-NN grid."""
    from .knn_grid import DRAW_RULE

    return {
        "knn": {
            "protocol": KNN_PROTOCOL,
            "ks": [int(k) for k in options.knn_ks],
            "temperature": float(options.knn_temperature),
            "shots": [s if s == "all" else int(s) for s in options.grid_shots],
            "seeds": [int(s) for s in options.grid_seeds],
            "draws": DRAW_RULE,
            "records": None if options.out is None else "knn.jsonl",
        }
    }


def knn_scores(payload, shots):
    """The k-NN's :class:`Scores` at ``shots`` (at k = 20, DINO's, where computed), from a
    model's ``analysis.json`` payload; None without k-NN numbers there."""
    section = (payload or {}).get("knn") or {}
    if not section:
        return None
    first = next(iter(section.values()))
    ks = [int(k) for k in first.get("ks", [])]
    if not ks:
        return None
    k = str(REPORTED_K if REPORTED_K in ks else ks[0])
    domains, stds, concepts = {}, {}, {}
    seeds = set()
    for domain, found in section.items():
        cell = next((c for c in found.get("grid", []) if c["shots"] == shots), None)
        if cell is None:
            continue
        domains[domain] = cell["top1"][k]["mean"]
        if cell.get("seeds"):
            stds[domain] = cell["top1"][k]["std"]
            seeds.update(cell["seeds"])
        per = found.get("concepts") or {}
        if shots == "all" and k in (per.get("top1") or {}):
            concepts.update(zip(per["wnids"], per["top1"][k]))
    if not domains:
        return None
    note = (
        "all training images (one cell, no seed)"
        if shots == "all"
        else f"{shots} images per concept, mean over seeds {', '.join(map(str, sorted(seeds)))}"
    )
    label = f"k-NN, k = {k}, T = {first.get('temperature', 0.07):g}"
    return Scores(label, domains, stds, concepts, note)


def zeroshot_scores(payload, shots):
    """Zero-shot's :class:`Scores` (the same at any ``shots``: it trains on no image), from a
    model's ``analysis.json`` payload; None without zero-shot numbers there."""
    section = (payload or {}).get("zeroshot") or {}
    measures = (payload or {}).get("domains") or {}
    domains = {d: v["zeroshot_top1"] for d, v in measures.items() if "zeroshot_top1" in v}
    if not domains:
        return None
    concepts = {}
    for found in section.values():
        per = found.get("concepts") or {}
        concepts.update(zip(per.get("wnids", []), per.get("top1", [])))
    settings = ((payload or {}).get("settings") or {}).get("zeroshot") or {}
    n = (settings.get("templates") or {}).get("n")
    label = "zero-shot" + (f", {n} prompt template{'s' * (n != 1)}" if n else "")
    return Scores(label, domains, {}, concepts, "no training image: the concepts' names")


def run_zeroshot(data, options):
    """Zero-shot on one domain (:class:`~.table.DomainData`), read back from or appended to
    ``zeroshot.jsonl``; or why it cannot run (a str)."""
    from .zeroshot_domain import run_zeroshot_domain, summarize

    found = zeroshot_tower(data, options)
    if isinstance(found, str):
        return found  # why it cannot run
    bound, templates, records = found
    record = run_zeroshot_domain(
        data.domain,
        data.source.load(data.domain, mmap=True),
        bound,
        templates,
        classnames=options.classnames,
        place=options.place,
        cache_dir=options.embeddings_cache,
        records=records,
        inputs={"features": data.source.fingerprint(data.domain)},
        model=options.model,
        say=lambda line: _say(options, line),
        progress=options.progress,
    )
    binding = records.binding() if records is not None else {}
    return {
        "measures": {"zeroshot_top1": record["top1"], "zeroshot_top5": record["top5"]},
        "details": summarize(record),
        "records": binding,
    }


def zeroshot_tower(data, options):
    """``(bound tower, templates, records)``, loaded once and checked against every domain's
    extraction; or why zero-shot cannot run (no model to take the text tower from)."""
    from .zeroshot_domain import load_bound_tower, resolve_templates, store_spec
    from .zeroshot_domain import zeroshot_settings as settings_of

    extraction = data.source.extraction(data.domain)
    found = options.loaded.get("zeroshot")
    if found is None:
        spec = options.text_tower
        if spec is None and extraction is None:
            return "no text tower: the features record no model (give text_tower=, --text-tower)"
        bound = load_bound_tower(spec or store_spec(extraction), extraction)
        templates, source = resolve_templates(options.templates)
        settings = settings_of(bound, templates, source, options.classnames)
        records = open_records(options, "zeroshot", settings, ("domain",))
        found = options.loaded["zeroshot"] = (bound, templates, records)
        options.loaded["zeroshot_settings"] = settings
    bound = found[0]
    if bound.image is not None and extraction is not None:
        differ = [k for k, v in bound.image.items() if extraction.get(k) != v]
        if differ:
            raise ValueError(
                f"{data.domain}: its features were extracted with another {differ[0]} "
                f"({extraction.get(differ[0])}) than the image tower of {bound.spec} "
                f"({bound.image[differ[0]]}): zero-shot needs one model's features in every domain"
            )
    return found


def zeroshot_settings(options):
    """What ``analysis.json``'s settings record of zero-shot: the text tower, the image
    tower it belongs to, the templates and the names."""
    found = dict(options.loaded.get("zeroshot_settings") or {})
    found["protocol"] = ZEROSHOT_PROTOCOL
    found["records"] = None if options.out is None else "zeroshot.jsonl"
    return {"zeroshot": found}


# ------------------------------------------------------------------ the command line
def add_evaluation_options(p, shots, seeds):
    """The options of ``imagenet-cog analyze`` for the evaluations (their defaults DINO's k
    and T, and the paper's ``shots`` and ``seeds``); loads no torch."""
    from .._neighbors.votes import DINO_KS, DINO_TEMPERATURE

    knn = p.add_argument_group(
        "k-NN and zero-shot (other protocols than the paper's linear probe; see the guide's "
        "'Other evaluations')"
    )
    knn.add_argument(
        "--knn-k",
        default=",".join(map(str, DINO_KS)),
        help="the k of the k-NN, comma-separated, all from one search per cell (DINO's)",
    )
    knn.add_argument(
        "--knn-temperature",
        type=float,
        default=DINO_TEMPERATURE,
        help="T of the k-NN's votes exp(similarity / T) (DINO's)",
    )
    knn.add_argument(
        "--knn-shots",
        default=",".join(map(str, shots)),
        help="the k-NN's grid: images per concept, comma-separated, 'all' for every image",
    )
    knn.add_argument(
        "--knn-seeds",
        default=",".join(map(str, seeds)),
        help="the k-NN's grid: the seeds of the linear protocol's draws, comma-separated",
    )
    knn.add_argument(
        "--plan",
        action="store_true",
        help="with --analyses knn: print what the k-NN grid computes and costs (FLOP, memory, "
        "time predicted from a search timed here), and compute nothing",
    )
    knn.add_argument(
        "--text-tower",
        metavar="MODEL",
        default=None,
        help="zero-shot: the model spec whose text tower classifies (default: the spec the "
        "store was extracted with; refused unless its image tower is the store's)",
    )
    knn.add_argument(
        "--classnames",
        metavar="FILE|openai",
        default=None,
        help="zero-shot: the class names, a file of wnid<TAB>name lines, or 'openai' for "
        "OpenAI's curated IN-1K names (the levels keep the package's); default: the "
        "package's WordNet names",
    )
    knn.add_argument(
        "--templates",
        metavar="FILE",
        default=None,
        help="zero-shot: prompt templates, one per line with {c} where the name goes "
        "(default: OpenAI's 80 ImageNet templates)",
    )


def _ints(text, option):
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got {text!r}") from None


def evaluation_arguments(args):
    """The keywords of :func:`~imagenet_cog.analysis.analyze` that the options give."""
    return {
        "knn_k": _ints(args.knn_k, "--knn-k"),
        "knn_temperature": args.knn_temperature,
        "knn_shots": [s for s in args.knn_shots.replace(" ", "").split(",") if s],
        "knn_seeds": _ints(args.knn_seeds, "--knn-seeds"),
        "text_tower": args.text_tower,
        "classnames": args.classnames,
        "templates": args.templates,
    }
