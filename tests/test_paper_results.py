"""The bundled paper results (supplementary Tables 5-10) and their loader.

The comparison with the paper re-reads the tables with one regular expression per
table row, independently of ``tools/parse_paper_tables.py``, from
``tests/data/cog_paper_tables.txt``: the lines of the paper text that hold them (written
by that script from the whole text, whose sha256 it records), so that the tests run from
the repository alone.
"""

import itertools
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from imagenet_cog._comparability import CATEGORY_NAMES, paper_models, read_paper_results
from imagenet_cog._grid import DOMAINS, SHOTS

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "tests" / "data" / "cog_paper_tables.txt"
SCRIPT = ROOT / "tools" / "parse_paper_tables.py"
SHIPPED = ROOT / "src" / "imagenet_cog" / "data" / "cog_paper_results.csv"

TABLES = dict(zip(range(5, 11), DOMAINS))
#: Table 1, in its order.
TABLE1 = [
    "ResNet50",
    "a-T2T-ViT-t-14",
    "a-DeiT-S",
    "a-DeiT-S-distilled",
    "a-Inception-v3",
    "a-NAT-M4",
    "a-EfficientNet-B1",
    "a-EfficientNet-B4",
    "a-DeiT-B-distilled",
    "a-ResNet152",
    "a-VGG19",
    "s-SimCLR-v2",
    "s-MoCo-v2",
    "s-BYOL",
    "s-MoChi",
    "s-InfoMin",
    "s-OBoW",
    "s-SwAV",
    "s-DINO",
    "s-BarlowTwins",
    "s-CompReSS",
    "r-MixUp",
    "r-Manifold-MixUp",
    "r-CutMix",
    "r-ReLabel",
    "r-Adv-Robust",
    "r-MEAL-v2",
    "d-MoPro",
    "d-Semi-Sup",
    "d-Semi-Weakly-Sup",
    "d-CLIP",
]
#: Names as Tables 5-10 print them (markup stripped) -> Table 1 names, where they differ.
RENAMED = {
    "a-ResNet-152": "a-ResNet152",
    "a-T2T-ViT-14": "a-T2T-ViT-t-14",  # Tables 5-8
    "a-T2T-ViTt-14": "a-T2T-ViT-t-14",  # Tables 9-10
    "a-DeiT-S distilled": "a-DeiT-S-distilled",
    "a-DeiT-B distilled": "a-DeiT-B-distilled",
    "d-Semi-Sup.": "d-Semi-Sup",
    "d-Semi-Weakly-Sup.": "d-Semi-Weakly-Sup",
    "r-Mixup": "r-MixUp",
    "r-Manifold Mixup": "r-Manifold-MixUp",
    "r-AdvRobust": "r-Adv-Robust",
}
RESNET50_ALL = [75.8, 67.9, 63.1, 59.0, 58.1, 52.0]

_CELL = r"(\d+\.\d) \+ (\d+\.\d)"
_ROW = re.compile(r"^(?:<i>([asrd])</i> -)?([^\t<>]+)\t" + "\t".join([_CELL] * 9) + r"$")
_CAPTION = re.compile(r"^Table (\d+): \*\*Top-1 accuracies obtained by linear classifiers on ")


@pytest.fixture(scope="module")
def rows():
    return read_paper_results()


@pytest.fixture(scope="module")
def paper_lines():
    """The lines of the paper text that hold its tables."""
    return PAPER.read_text(encoding="utf-8").splitlines()


def _paper_tables(lines):
    """``{table: {printed name: [(mean, std)] * 9}}``; rows come before their caption."""
    tables, pending = {}, []
    for line in lines:
        row = _ROW.match(line)
        if row:
            prefix, name, *cells = row.groups()
            name = f"{prefix}-{name}" if prefix else name
            pending.append((name, [(float(m), float(s)) for m, s in zip(cells[::2], cells[1::2])]))
            continue
        caption = _CAPTION.match(line)
        if caption:
            assert int(caption.group(1)) not in tables
            tables[int(caption.group(1))] = dict(pending)
            assert len(tables[int(caption.group(1))]) == len(pending)
            pending = []
    assert not pending
    return tables


# -- (a) the CSV against the paper text ---------------------------------------


def test_csv_matches_paper_text(rows, paper_lines):
    paper = _paper_tables(paper_lines)
    assert sorted(paper) == list(TABLES)
    assert all(len(table) == 31 for table in paper.values())
    csv = defaultdict(dict)
    for r in rows:
        csv[r["table"]].setdefault(r["model_as_printed"], {})[r["shots"]] = (
            r["top1_mean"],
            r["top1_std"],
        )
    for number, table in paper.items():
        assert set(csv[number]) == set(table), number
        for printed, values in table.items():
            assert [csv[number][printed][n] for n in SHOTS] == values, (number, printed)


def test_all_column_matches_paper_text(rows, paper_lines):
    # The column the paper's Sec. 4.2.1 and Fig. 3(a) use, spelled out on its own.
    paper = _paper_tables(paper_lines)
    got = {(r["table"], r["model_as_printed"]): r["top1_mean"] for r in rows if r["shots"] == "all"}
    want = {(t, name): v[-1][0] for t, table in paper.items() for name, v in table.items()}
    assert got == want
    assert len(got) == 31 * 6


def test_models_match_table1(paper_lines):
    start = paper_lines.index(next(x for x in paper_lines if x.startswith("Model\tNotes")))
    end = paper_lines.index(next(x for x in paper_lines if x.startswith("Table 1:")))
    names = []
    for line in paper_lines[start + 1 : end]:
        m = re.match(r"^(?:<i>([asrd])</i> -)?([\w.-]+)(?: \[[\d, ]+\])?\t", line)
        if m:
            names.append(f"{m.group(1)}-{m.group(2)}" if m.group(1) else m.group(2))
    assert names == TABLE1


def test_script_reproduces_csv(tmp_path):
    out = tmp_path / "out.csv"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(PAPER), "--output", str(out), "--excerpt", ""],
        check=True,
        capture_output=True,
    )

    def rows(path):  # the header comment names the text the file was made from
        return [x for x in path.read_text(encoding="utf-8").splitlines() if not x.startswith("#")]

    assert rows(out) == rows(SHIPPED)


def test_the_excerpt_and_the_csv_come_from_the_same_paper_text(paper_lines):
    digest = re.search(r"sha256 ([0-9a-f]{64})", paper_lines[0]).group(1)
    assert f"(sha256 {digest})" in SHIPPED.read_text(encoding="utf-8").split("\n", 6)[5]


# -- (b) structure of the CSV ---------------------------------------------------


def test_shape(rows):
    assert len(rows) == 1674 == 31 * 6 * 9
    keys = [(r["model"], r["domain"], r["shots"]) for r in rows]
    assert sorted(keys, key=str) == sorted(itertools.product(TABLE1, DOMAINS, SHOTS), key=str)
    assert all(TABLES[r["table"]] == r["domain"] for r in rows)
    # Tables in order, then Table 1 order, then shots.
    assert keys == [(m, d, n) for d in DOMAINS for m in TABLE1 for n in SHOTS]


def test_values(rows):
    for r in rows:
        assert 0 < r["top1_mean"] < 100
        assert 0 <= r["top1_std"] < 1
        assert round(r["top1_mean"], 1) == r["top1_mean"]
        assert round(r["top1_std"], 1) == r["top1_std"]
        assert r["n_seeds"] == 5


def test_resnet50_spot_values(rows):
    got = [r["top1_mean"] for r in rows if r["model"] == "ResNet50" and r["shots"] == "all"]
    assert got == RESNET50_ALL
    first = next(r for r in rows if r["model"] == "ResNet50")
    assert (first["domain"], first["shots"], first["top1_mean"], first["top1_std"]) == (
        "in1k",
        1,
        45.0,
        0.7,
    )


def test_names_and_categories(rows):
    printed = defaultdict(set)
    for r in rows:
        printed[r["model"]].add(r["model_as_printed"])
        assert r["category"] == (r["model"][0] if r["model"][1] == "-" else "")
        assert r["category_name"] == CATEGORY_NAMES[r["category"]]
        assert r["model_as_printed"][:2] == r["model"][:2]
    mapping = {p: m for m, names in printed.items() for p in names}
    assert {p: m for p, m in mapping.items() if p != m} == RENAMED
    assert printed["a-T2T-ViT-t-14"] == {"a-T2T-ViT-14", "a-T2T-ViTt-14"}
    assert all(len(v) == 1 for k, v in printed.items() if k != "a-T2T-ViT-t-14")


def _series(rows, along):
    """``{other keys: [means in the order of `along`]}``."""
    series = defaultdict(dict)
    for r in rows:
        key = (r["model"], r["shots"]) if along == "domain" else (r["model"], r["domain"])
        series[key][r[along]] = r["top1_mean"]
    order = DOMAINS if along == "domain" else SHOTS
    return {k: [v[x] for x in order] for k, v in series.items()}


def test_means_increase_with_shots(rows):
    # Non-decreasing everywhere; strictly, except two ties of a-DeiT-B-distilled on IN-1K.
    ties = []
    for (model, domain), means in _series(rows, "shots").items():
        for n, a, b in zip(SHOTS, means, means[1:]):
            assert b >= a, (model, domain, n)
            if a == b:
                ties.append((model, domain, n))
    assert ties == [("a-DeiT-B-distilled", "in1k", 8), ("a-DeiT-B-distilled", "in1k", 128)]


def test_means_decrease_with_levels(rows):
    # IN-1K > L1 > ... > L5 for every model and N, but for d-CLIP, higher on L4 than on L3
    # for every N >= 2 (e.g. All: 63.5 on L3, 64.0 on L4).
    rises = set()
    for (model, n), means in _series(rows, "domain").items():
        for d, a, b in zip(DOMAINS, means, means[1:]):
            if b >= a:
                rises.add((model, d, n))
    assert rises == {("d-CLIP", "L3", n) for n in SHOTS[1:]}


# -- (c) the loader ------------------------------------------------------------------


def test_loader_types(rows):
    for r in rows:
        assert set(r) == {
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
        }
        assert type(r["table"]) is int and type(r["n_seeds"]) is int
        assert type(r["top1_mean"]) is float and type(r["top1_std"]) is float
        assert r["shots"] == "all" or type(r["shots"]) is int
        assert all(type(r[k]) is str for k in ("model", "model_as_printed", "category", "domain"))


def test_loader_returns_fresh_copies():
    first = read_paper_results()
    first[0]["top1_mean"] = -1.0
    first.clear()
    again = read_paper_results()
    assert len(again) == 1674 and again[0]["top1_mean"] == 45.0


def test_paper_models():
    models = paper_models()
    assert list(models) == TABLE1
    assert models == {m: (m[0] if m[1] == "-" else "") for m in TABLE1}
    assert sum(c == "a" for c in models.values()) == 10
    assert sum(c == "s" for c in models.values()) == 10
    assert sum(c == "r" for c in models.values()) == 6
    assert sum(c == "d" for c in models.values()) == 4
