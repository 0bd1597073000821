import csv
import io
import json
import math

import numpy as np
import pytest

from imagenet_cog import Results, reference_results
from imagenet_cog.results import comparability

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
    frame = res.to_frame()
    assert set(frame.columns) >= {"model", "domain", "shots", "mean", "std", "n"}
    assert len(frame) == 4


def test_load_runs_jsonl(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lines = [json.dumps(r) for r in _cells("x", {"L2": 33.0})]
    (out / "runs.jsonl").write_text("\n".join(lines) + "\n")
    (out / "config.json").write_text(json.dumps({"protocol": {"epochs": 100}}))
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
    mine = Results(_cells("mine", strong, seeds=(22, 37), spread=0), meta={"protocol": {"mine": {
        "epochs": 100, "trials_per_batch": 5, "n_trials": 30, "levels": "official"}}})  # fmt: skip
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
        "fewshot.png", "fewshot_relative.png", "levels_absolute.png", "levels_relative.png",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown reference models"):
        mine.compare(paper, models=["s-NOPE"])
