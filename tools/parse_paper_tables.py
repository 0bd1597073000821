"""Turn the paper's supplementary Tables 5-10 into ``cog_paper_results.csv``.

Run once, by a maintainer, with the project's paper text at hand::

    python tools/parse_paper_tables.py [../shared/seeds/cog_paper_iccv2021_with_supplement.txt]

The text is the ICCV 2021 paper with its supplement (arXiv 2012.05649) as
extracted to plain text: tables are tab-separated, "±" is rendered as "+" and
the italic category prefixes keep their HTML markup (``<i>a</i> -DeiT-S``).

The script reads Table 1 (the 31 models, their names and categories) and
Tables 5-10 (top-1 accuracy, mean + std over 5 seeds, for N = 2^0 .. 2^7 images
per concept and "All", on IN-1K and the levels L1-L5). It stops with an error
unless every row holds 9 "mean + std" cells, each table has 31 rows, there are
exactly 6 such tables numbered 5-10 for IN-1K, L1, ..., L5, the same 31 models
appear in every table, each printed name maps to exactly one Table 1 model, and
ResNet50's "All" column reads 75.8, 67.9, 63.1, 59.0, 58.1, 52.0. It then writes
``src/imagenet_cog/data/cog_paper_results.csv``: one row per (table, model,
N), tables in order, models in Table 1 order. The output depends on the text
only. ``--check`` compares instead of writing.

It also writes ``tests/data/cog_paper_tables.txt``, the excerpt of the text that
it reads and nothing else: the two sentences that give the number of seeds, the
model column of Table 1 with its group headers (its notes left out), and Tables
5-10 with the first, bold sentence of their captions. The script turns the
excerpt into the same rows as the whole text, so the tests re-read the tables
from the repository alone (``tests/test_paper_results.py``).
"""

import argparse
import csv
import hashlib
import io
import re
import sys
from pathlib import Path

# Table 1's group headers (lower-cased, per name prefix) and the columns' shots.
from imagenet_cog._comparability import CATEGORY_NAMES
from imagenet_cog._grid import SHOTS as PAPER_SHOTS

ROOT = Path(__file__).resolve().parents[1]
PAPER_NAME = "cog_paper_iccv2021_with_supplement.txt"
DEFAULT_PAPER = ROOT.parent / "shared" / "seeds" / PAPER_NAME
OUTPUT = ROOT / "src" / "imagenet_cog" / "data" / "cog_paper_results.csv"
EXCERPT = ROOT / "tests" / "data" / "cog_paper_tables.txt"

TABLES = {5: "in1k", 6: "L1", 7: "L2", 8: "L3", 9: "L4", 10: "L5"}
SHOTS = [str(n) for n in PAPER_SHOTS]  # as the tables print them
N_MODELS = 31
#: The paper's protocol (Sec. 3.4 and supplement B): 5 seeds per score.
N_SEEDS = 5
SEEDS_SENTENCES = (
    "We repeat the hyper-parameter selection 5 times with different seeds",
    "We repeat this process 5 times with different seeds",
)
#: ResNet50, column "All", as read off Tables 5-10 by hand.
RESNET50_ALL = {
    "in1k": "75.8",
    "L1": "67.9",
    "L2": "63.1",
    "L3": "59.0",
    "L4": "58.1",
    "L5": "52.0",
}
#: Printed names that no spelling normalization maps to Table 1. Tables 5-8
#: print "a-T2T-ViT-14" (Tables 9-10: "a-T2T-ViTt-14"); Table 1, Table 3,
#: Sec. 4.1 and the legend of Fig. 10 call the only T2T model a-T2T-ViT-t-14.
ALIASES = {"a-T2T-ViT-14": "a-T2T-ViT-t-14"}

HEADER = [
    "model",
    "model_as_printed",
    "category",
    "category_name",
    "table",
    "domain",
    "shots",
    "top1_mean",
    "top1_std",
    "n_seeds",
]

_TAG = re.compile(r"</?i>")
_PREFIX = re.compile(r"^([asrd]) -")
_CITATION = re.compile(r"\s*\[[\d,\s]+\]$")
_CELL = re.compile(r"^(\d{1,2}\.\d) \+ (\d{1,2}\.\d)$")
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")
_CAPTION = re.compile(
    r"^Table (\d+): \*\*Top-1 accuracies obtained by linear classifiers on (IN-1K|L_(\d)) ?\.\*\*"
)


class PaperError(Exception):
    """The paper text is not what this script expects."""


def _fail(lineno, message):
    raise PaperError(f"line {lineno}: {message}")


def clean_name(cell):
    """``<i>a</i> -DeiT-S distilled [60]`` -> ``a-DeiT-S distilled``."""
    name = _CITATION.sub("", _TAG.sub("", cell).strip())
    name = _PREFIX.sub(r"\1-", name)
    if "<" in name or ">" in name or not name:
        raise PaperError(f"cannot clean model name {cell!r}")
    return name


def name_key(name):
    """Spelling-insensitive key: lower-case letters and digits only."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


def category_of(name):
    """The category prefix of a cleaned name: ``a``, ``s``, ``r``, ``d`` or ``""``."""
    return name[0] if re.match(r"^[asrd]-", name) else ""


def parse_table1(lines):
    """``[(model, category, category_name)]`` in Table 1 order."""
    start = [i for i, line in enumerate(lines) if line.startswith("Model\tNotes")]
    end = [i for i, line in enumerate(lines) if line.startswith("Table 1:")]
    if len(start) != 1 or len(end) != 1 or not start[0] < end[0]:
        raise PaperError("cannot locate Table 1")
    models, group = [], None
    for i in range(start[0] + 1, end[0]):
        cell = lines[i].split("\t")[0].strip()
        if not cell:
            continue
        header = re.fullmatch(r"<i>([^<:]+):[^<]*</i>", cell)
        if header:
            group = header.group(1).strip().lower()
            continue
        name = clean_name(cell)
        prefix = category_of(name)
        if group is None or CATEGORY_NAMES.get(prefix) != group:
            _fail(i + 1, f"{name!r} is listed under {group!r}")
        models.append((name, prefix, group))
    names = [m[0] for m in models]
    if len(models) != N_MODELS or len({name_key(n) for n in names}) != N_MODELS:
        raise PaperError(f"Table 1 lists {len(models)} models, expected {N_MODELS} distinct")
    if {m[2] for m in models} != set(CATEGORY_NAMES.values()):
        raise PaperError("Table 1 does not have the five expected groups")
    return models


def canonical_name(printed, table1_names):
    """The one Table 1 name that ``printed`` stands for."""
    matches = [n for n in table1_names if name_key(n) == name_key(printed)]
    if printed in ALIASES:
        if matches:
            raise PaperError(f"alias {printed!r} also matches {matches} by spelling")
        matches = [n for n in table1_names if n == ALIASES[printed]]
    if len(matches) != 1:
        raise PaperError(f"{printed!r} matches {len(matches)} Table 1 models: {matches}")
    if category_of(printed) != category_of(matches[0]):
        raise PaperError(f"{printed!r} and {matches[0]!r} differ in category")
    return matches[0]


def parse_results_tables(lines):
    """``{table number: (domain, [(printed name, [(mean, std)] * 9)])}``."""
    tables = {}
    starts = [i for i, line in enumerate(lines) if line.startswith("Model\tN-shots")]
    for start in starts:
        header = [c.strip().translate(_SUPERSCRIPTS) for c in lines[start + 1].split("\t")]
        shots = [
            "all" if c == "All" else str(2 ** int(c[2:])) if re.fullmatch(r"2 \d", c) else c
            for c in header[1:]
        ]
        if header[0] != "" or shots != SHOTS:
            _fail(start + 2, f"unexpected N-shots header {header!r}")
        rows, i = [], start + 2
        while i < len(lines) and lines[i].strip():
            cells = lines[i].split("\t")
            if len(cells) != 1 + len(SHOTS):
                _fail(i + 1, f"{len(cells) - 1} value cells, expected {len(SHOTS)}")
            values = []
            for cell in cells[1:]:
                match = _CELL.match(cell.strip())
                if not match:
                    _fail(i + 1, f"{cell!r} is not 'mean + std'")
                values.append(match.groups())
            rows.append((clean_name(cells[0]), values))
            i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
        caption = _CAPTION.match(lines[i]) if i < len(lines) else None
        if not caption:
            _fail(i + 1, "no 'Top-1 accuracies' caption after the table")
        number = int(caption.group(1))
        domain = "in1k" if caption.group(2) == "IN-1K" else f"L{caption.group(3)}"
        if number in tables or TABLES.get(number) != domain:
            _fail(i + 1, f"Table {number} on {domain} is unexpected or repeated")
        if len(rows) != N_MODELS:
            _fail(i + 1, f"Table {number} has {len(rows)} rows, expected {N_MODELS}")
        tables[number] = (domain, rows)
    if sorted(tables) != sorted(TABLES):
        raise PaperError(f"found results Tables {sorted(tables)}, expected {sorted(TABLES)}")
    return tables


def build_rows(text):
    """The CSV rows, as lists of strings, in output order."""
    lines = text.split("\n")
    for sentence in SEEDS_SENTENCES:
        if sentence not in text:
            raise PaperError(f"the protocol sentence {sentence!r} is missing")
    table1 = parse_table1(lines)
    names = [m[0] for m in table1]
    results = {}
    for number, (domain, rows) in parse_results_tables(lines).items():
        by_model = {}
        for printed, values in rows:
            try:
                model = canonical_name(printed, names)
            except PaperError as exc:
                raise PaperError(f"Table {number}: {exc}") from None
            if model in by_model:
                raise PaperError(f"Table {number}: {model} appears twice")
            by_model[model] = (printed, values)
        if set(by_model) != set(names):
            raise PaperError(f"Table {number} lacks {sorted(set(names) - set(by_model))}")
        results[number] = (domain, by_model)
    for number, (domain, by_model) in results.items():
        got = by_model["ResNet50"][1][-1][0]
        if got != RESNET50_ALL[domain]:
            raise PaperError(
                f"Table {number}: ResNet50 All = {got}, expected {RESNET50_ALL[domain]}"
            )
    out = []
    for number in sorted(results):
        domain, by_model = results[number]
        for model, category, category_name in table1:
            printed, values = by_model[model]
            for shots, (mean, std) in zip(SHOTS, values):
                row = [model, printed, category, category_name, str(number), domain, shots]
                out.append([*row, mean, std, str(N_SEEDS)])
    if len(out) != N_MODELS * len(TABLES) * len(SHOTS):
        raise PaperError(f"{len(out)} rows")
    return out


def render(text):
    """The whole CSV file as a string."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    buf = io.StringIO()
    buf.write(
        "# ImageNet-CoG reference results: top-1 accuracy (%) of linear classifiers on frozen\n"
        "# features, mean and standard deviation over 5 seeds, as printed in\n"
        "# Sariyildiz, Kalantidis, Larlus, Alahari. Concept Generalization in Visual\n"
        "# Representation Learning. ICCV 2021, supplementary Tables 5–10. arXiv 2012.05649.\n"
        f"# Written by tools/parse_paper_tables.py from {PAPER_NAME}\n"
        f"# (sha256 {digest}). Do not edit by hand.\n"
    )
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(HEADER)
    writer.writerows(build_rows(text))
    return buf.getvalue()


def excerpt(text):
    """The lines of the paper text that :func:`build_rows` reads, as a file of their own."""
    build_rows(text)  # only the excerpt of a text that parses
    lines = text.split("\n")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    out = [
        f"# The lines of {PAPER_NAME} (sha256 {digest})",
        "# that tools/parse_paper_tables.py reads: the protocol's seeds, the model column of",
        "# Table 1 and Tables 5-10 (Sariyildiz et al., ICCV 2021, arXiv 2012.05649). Written by",
        "# that script; do not edit by hand.",
        "",
        *SEEDS_SENTENCES,
        "",
    ]
    start = next(i for i, line in enumerate(lines) if line.startswith("Model\tNotes"))
    end = next(i for i, line in enumerate(lines) if line.startswith("Table 1:"))
    out += ["Model\tNotes"] + [
        line.split("\t")[0] + "\t" * ("\t" in line) for line in lines[start + 1 : end]
    ]
    out += [lines[end], ""]
    for start in (i for i, line in enumerate(lines) if line.startswith("Model\tN-shots")):
        i = start
        while not _CAPTION.match(lines[i]):
            out.append(lines[i])
            i += 1
        out += [_CAPTION.match(lines[i]).group(0), ""]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paper", type=Path, nargs="?", default=DEFAULT_PAPER)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument(
        "--excerpt",
        type=Path,
        default=EXCERPT,
        help="where to write the excerpt the tests read ('' for none)",
    )
    parser.add_argument("--check", action="store_true", help="compare with --output, write nothing")
    args = parser.parse_args(argv)
    text = args.paper.read_text(encoding="utf-8")
    try:
        content = render(text)
        files = {args.output: content}
        if str(args.excerpt) not in ("", "."):
            files[args.excerpt] = excerpt(text)
    except PaperError as exc:
        raise SystemExit(f"{args.paper}: {exc}") from None
    if args.check:
        differ = [p for p, c in files.items() if not p.exists() or p.read_text("utf-8") != c]
        for path in files:
            print(f"{path}: {'DIFFERS' if path in differ else 'up to date'}")
        return 1 if differ else 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data, encoding="utf-8", newline="\n")
    n_rows = sum(1 for line in content.splitlines() if not line.startswith("#")) - 1
    print(f"wrote {args.output} ({n_rows} rows)" + "".join(f" and {p}" for p in list(files)[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
