import csv
import io
import json
import math

import numpy as np
import pytest
from helpers import write_run_folder
from official_run import paper_like

from imagenet_cog import NotComparableError, Results, comparability, reference_results
from imagenet_cog._optional_dependencies import HAS_PANDAS
from imagenet_cog._reporting.verdict import not_comparable_banner

DOMAINS = ("in1k", "L1", "L2", "L3", "L4", "L5")


def _cells(model, top1, seeds=(22, 37, 45, 77, 93), shots=("all",), spread=0.2):
    """Per-seed records: ``top1[domain] + spread * k`` for the k-th seed."""
    return [
        {"model": model, "domain": d, "shots": n, "seed": s, "top1": v + spread * k, "top5": v + 10}
        for d, v in top1.items()
        for n in shots
        for k, s in enumerate(seeds)
    ]


def test_mean_and_population_std_over_seeds():
    res = Results(_cells("m", {"L1": 60.0}, spread=1.0))
    values = 60.0 + np.arange(5.0)
    assert res.mean("m", "L1") == pytest.approx(values.mean())
    assert res.std("m", "L1") == pytest.approx(
        values.std(ddof=0)
    )  # like the official print_results
    assert res.summary()[0]["n"] == 5
    assert res.mean("m", "L1", metric="top5") == pytest.approx(70.0)  # top1 + 10, seed 0's
    assert math.isnan(res.mean("m", "L5"))


def test_tables_in_paper_layout():
    top1 = dict(zip(DOMAINS, [75.0, 70.0, 65.0, 60.0, 55.0, 50.0]))
    res = Results(_cells("mine", top1, shots=(1, 8, "all"), spread=0.0))
    overview = res.table()
    lines = overview.splitlines()
    assert lines[0].startswith("top-1 (%), all training images")
    assert lines[1].split() == ["model", "IN-1K", "L1", "L2", "L3", "L4", "L5"]
    assert lines[2].split()[:4] == ["mine", "75.0", "±", "0.0"]
    per_domain = res.table(domain="L5")
    assert per_domain.splitlines()[1].split() == ["model", "N=1", "N=8", "N=All"]
    assert res.shots == [1, 8, "all"]
    report = res.report()
    assert report.count("by shots per class") == 6


def test_relative_to_baseline_and_ranks():
    base = dict(zip(DOMAINS, [76.0, 68.0, 63.0, 59.0, 58.0, 52.0]))
    mine = {d: v + (1.0 if d == "in1k" else 3.0) for d, v in base.items()}
    worse = {d: v - 2.0 for d, v in base.items()}
    res = Results(
        _cells("ResNet50", base, spread=0)
        + _cells("mine", mine, spread=0)
        + _cells("worse", worse, spread=0)
    )
    rel = res.relative_to("ResNet50")
    assert rel.mean("mine", "in1k") == pytest.approx(1.0)
    assert rel.mean("mine", "L5") == pytest.approx(3.0)
    assert rel.mean("ResNet50", "L3") == 0.0
    assert "+3.0" in rel.table() and "relative to ResNet50" in rel.table()
    ranks = res.ranks()
    assert ranks["mine"] == dict.fromkeys(DOMAINS, 1)
    assert ranks["worse"]["L2"] == 3
    with pytest.raises(ValueError, match="baseline 'nope'"):
        res.relative_to("nope")


def test_merge_side_by_side_and_clash():
    a = Results(_cells("a", {"L1": 60.0}))
    b = Results(_cells("b", {"L1": 50.0}))
    both = a + b
    assert both.models == ["a", "b"]
    with pytest.raises(ValueError, match="appear in both"):
        a.merge(Results(_cells("a", {"L2": 1.0})))


def test_exports(tmp_path):
    res = Results(_cells("m", {"in1k": 70.0, "L5": 40.0}, shots=(2, "all")))
    text = res.to_csv(tmp_path / "r.csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 4 and rows[0]["model"] == "m" and rows[0]["shots"] == "2"
    assert (tmp_path / "r.csv").read_text() == text
    payload = json.loads(res.to_json(tmp_path / "r.json"))
    assert len(payload["records"]) == 20 and payload["summary"]["top1"][0]["n"] == 5
    md = res.to_markdown(tmp_path / "r.md")
    assert "| model | IN-1K | L5 |" in md and "|---|---:|---:|" in md


def test_markdown_keeps_cells_with_two_spaces_whole():
    # The Markdown table renders the text table's cells, not its aligned text split again.
    res = Results(_cells("my  model", {"in1k": 70.0, "L5": 40.0}, shots=(2, "all")))
    md = res.to_markdown()
    assert "| model | IN-1K | L5 |" in md
    assert "| my  model | 70.4 ± 0.3 | 40.4 ± 0.3 |" in md
    assert "| my  model | 70.4 ± 0.3 | 70.4 ± 0.3 |" in md  # the IN-1K table, by shots
    assert all(line.count("|") == 4 for line in md.splitlines() if line.startswith("| my"))


@pytest.mark.skipif(not HAS_PANDAS, reason="needs pandas")
def test_to_frame():
    res = Results(_cells("m", {"in1k": 70.0, "L5": 40.0}, shots=(2, "all")))
    frame = res.to_frame()
    assert set(frame.columns) >= {"model", "domain", "shots", "mean", "std", "n"}
    assert len(frame) == 4


def test_load_runs_jsonl(tmp_path):
    out = write_run_folder(
        tmp_path / "run", {"protocol": {"epochs": 100}}, _cells("x", {"L2": 33.0})
    )
    res = Results.load(out)
    assert res.models == ["x"] and res.mean("x", "L2") == pytest.approx(33.4)
    assert Results.load(out / "runs.jsonl", model="renamed").models == ["renamed"]
    (out / "runs.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="not a JSON line"):
        Results.load(out)
    with pytest.raises(FileNotFoundError):
        Results.load(tmp_path / "nothing")


def test_plots_are_written(tmp_path):
    base = dict(zip(DOMAINS, [76.0, 68.0, 63.0, 59.0, 58.0, 52.0]))
    res = Results(
        _cells("ResNet50", base, shots=(1, 2, "all"))
        + _cells("mine", {d: v + 2 for d, v in base.items()}, shots=(1, 2, "all"))
    )
    paths = res.plot(tmp_path, baseline="ResNet50", highlight=["mine"])
    names = sorted(p.name for p in paths)
    assert names == [
        "fewshot.png",
        "fewshot_relative.png",
        "levels_absolute.png",
        "levels_relative.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


# --------------------------------------------------------------- the paper
def test_reference_results_are_the_paper_tables():
    paper = reference_results()
    assert len(paper.models) == 31
    assert paper.domains == list(DOMAINS)
    assert paper.shots == [1, 2, 4, 8, 16, 32, 64, 128, "all"]
    expect = {"in1k": 75.8, "L1": 67.9, "L2": 63.1, "L3": 59.0, "L4": 58.1, "L5": 52.0}
    for domain, value in expect.items():
        assert paper.mean("ResNet50", domain, "all") == value
    assert paper.meta["categories"]["s-DINO"] == "self-supervision"
    assert reference_results(models=["s-DINO"]).models == ["s-DINO"]


def test_compare_ranks_a_run_among_the_31_and_notes_deviations(tmp_path):
    paper = reference_results()
    strong = {d: paper.mean("s-DINO", d) + 0.5 for d in DOMAINS}
    mine = Results(
        _cells("mine", strong, seeds=(22, 37), spread=0),
        meta={
            "protocol": {
                "mine": {"epochs": 100, "trials_per_batch": 5, "n_trials": 30, "levels": "official"}
            }
        },
    )
    both = mine.compare(paper, baseline="ResNet50")
    assert len(both.models) == 32 and both.meta["highlight"] == ["mine"]
    ranks = both.ranks()
    assert ranks["mine"]["L5"] <= 3
    text = both.comparison_report()
    assert "Your model among 32 models" in text
    assert "mine vs ResNet50" in text
    notes = comparability(both)
    assert notes[0].startswith("Comparable with the paper means")
    assert any("2 seeds per cell" in n for n in notes)
    assert any("trials of one search batched" in n for n in notes)
    assert any("no results" not in n for n in notes)
    paths = both.plot(tmp_path, baseline="ResNet50", highlight=both.meta["highlight"])
    # The paper's few-shot curves are drawn too; this run adds only its all-data points.
    assert sorted(p.name for p in paths) == [
        "fewshot.png",
        "fewshot_relative.png",
        "levels_absolute.png",
        "levels_relative.png",
    ]
    with pytest.raises(ValueError, match="unknown reference models"):
        mine.compare(paper, models=["s-NOPE"])


# ------------------------------------------------------ comparability, per deviation
def _paper_like(**change):
    """A run that follows the paper's protocol in every recorded respect, then ``change``."""
    return paper_like(**change)


def test_a_run_following_the_paper_has_nothing_to_flag():
    assert comparability(_paper_like()) == []
    assert not_comparable_banner(_paper_like()) == ""
    both = _paper_like().compare(reference_results(), strict=True)
    assert "NOT COMPARABLE" not in both.comparison_report()


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"data_n_classes": 3}, "L2: 3 concepts instead of the paper's 1000 (a subset)"),
        ({"data_classes_sha256": "0" * 64}, "L2: 1000 concepts, but not the official L2 list"),
        ({"data_n_test": 150}, "L2: 150 test images instead of the paper's 50000"),
        ({"epochs": 10}, "epochs: 10 instead of 100"),
        ({"batch_size": 256}, "batch_size: 256 instead of 1024"),
        ({"n_trials": 5}, "n_trials: 5 instead of 30"),
        ({"lr_range": [0.01, 10]}, "lr_range: [0.01, 10] instead of [0.1, 100]"),
        ({"wd_range": [0, 1e-3]}, "wd_range: [0, 0.001] instead of [1e-12, 0.0001]"),
        ({"trials_per_batch": 5}, "trials of one search batched"),
        ({"mixed_precision": "bf16"}, "mixed precision: 'bf16' instead of None"),
        ({"normalize": False}, "features not l2-normalised (normalize=False)"),
        ({"seeds": (22, 37)}, "2 seeds per cell instead of the paper's 5"),
        ({"seeds": (1, 2, 3, 4, 5)}, "seeds [1, 2, 3, 4, 5] are not the official ones"),
        ({"shots": (3, "all")}, "shots [3] are not among the paper's"),
    ],
)
def test_each_deviation_makes_a_run_not_comparable(change, expect):
    run = _paper_like(**change)
    found = comparability(run, by_model=True)["mine"]["deviations"]
    assert len(found) == 1 and found[0].startswith(expect), found
    assert not_comparable_banner(run).startswith("!!! NOT COMPARABLE with the paper: mine !!!")
    both = run.compare(reference_results(), models=["s-DINO"])
    text = both.comparison_report()
    assert text.startswith("Your model among 3 models")
    assert "\n\n!!! NOT COMPARABLE with the paper: mine" in text
    rank_line = next(x for x in text.splitlines() if x.startswith("mine rank"))
    assert "(" in rank_line and ")*/3" in rank_line
    with pytest.raises(NotComparableError, match="NOT COMPARABLE with the paper"):
        run.compare(reference_results(), strict=True)


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"domains": ("in1k", "L1")}, "no results for L2, L3, L4, L5"),
        ({"shots": (1, "all")}, "no results for N=2, 4, 8, 16, 32, 64, 128"),
        ({"versions": {"optuna": "4.5.0"}}, "Optuna 4.5.0 instead of the official code's 2.3.0"),
        ({"data_wnid_labels": False}, "L2: the labels are not wnids"),
        ({"data_n_test": 49_990}, "L2: 49990 test images"),
    ],
)
def test_caveats_are_listed_but_leave_the_ranks(change, expect):
    run = _paper_like(**change)
    found = comparability(run, by_model=True)["mine"]
    assert found["deviations"] == [] and any(c.startswith(expect) for c in found["caveats"])
    assert any(n.startswith(f"mine: (caveat) {expect}") for n in comparability(run))
    assert "NOT COMPARABLE" not in run.compare(reference_results()).comparison_report()


def test_missing_cells_are_a_caveat():
    run = _paper_like(shots=(1, "all"))
    run = Results(
        [r for r in run.records if not (r["domain"] == "L3" and r["shots"] == 1)], meta=run.meta
    )
    caveats = comparability(run, by_model=True)["mine"]["caveats"]
    assert any(c == "missing cells: L3 N=1" for c in caveats), caveats


def test_unrecorded_settings_are_deviations():
    run = _paper_like()
    del run.meta["protocol"]["mine"]["normalize"], run.meta["protocol"]["mine"]["data"]
    found = comparability(run, by_model=True)["mine"]["deviations"]
    assert any("l2-normalised is not recorded" in x for x in found)
    assert any("concepts and images used are not recorded" in x for x in found)


def test_load_refuses_a_file_mixing_configurations(tmp_path):
    lines = [
        {"model": "m", "domain": "L1", "shots": "all", "seed": s, "top1": 50.0, "config_hash": h}
        for s, h in ((22, "aaaa"), (37, "aaaa"), (45, "bbbb"))
    ]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(
        ValueError, match=r"mixes results of 2 configurations .*aaaa from line 1, bbbb from line 3"
    ):
        Results.load(tmp_path)


# ------------------------------------------------------------------ what the readers use
def _private_names_of_results():
    """The private attributes of :class:`Results`: its private methods, and what its methods
    set on ``self``."""
    import ast
    import inspect

    import imagenet_cog.results as module

    tree = ast.parse(inspect.getsource(module))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Results"]
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    names |= {
        n.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and isinstance(n.ctx, ast.Store)
    }
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_reader_of_results_touches_its_private_attributes():
    # The terminal report, the exports, the figures, the paired test and the HTML page read
    # Results through its documented methods: none reaches into how it stores its cells.
    import ast
    from pathlib import Path

    import imagenet_cog

    private = _private_names_of_results()
    assert {"_summary"} <= private  # the checker sees the class
    package = Path(imagenet_cog.__file__).parent
    bad = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "results.py" and path.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                bad.append(f"{path.relative_to(package)}:{node.lineno}: .{node.attr}")
    assert not bad, "private attributes of Results read outside it:\n" + "\n".join(bad)
