import json
import subprocess
import sys

import pytest

from imagenet_cog import load_levels
from imagenet_cog.cli import main


def test_levels_command_writes_files_and_prints_the_summary(tmp_path, capsys):
    out = tmp_path / "lv"
    assert main(["levels", "--candidates", "cog", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "blocklist" in printed and "5000" in printed  # the filter table
    assert "L1" in printed and "L5" in printed and "score range" in printed
    lines = (out / "levels.tsv").read_text().splitlines()
    assert lines[0] == "level\twnid\tscore"
    assert len(lines) == 5001
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["measure"] == "lin"
    assert load_levels(out).levels[0][0] == lines[1].split("\t")[1]


def test_levels_command_with_counts_and_an_explicit_pool(tmp_path, capsys):
    pool = load_levels("official").levels[0][:40]
    (tmp_path / "pool.txt").write_text("\n".join(pool) + "\n")
    counts = {w: (900 if i % 2 else 100) for i, w in enumerate(pool)}
    (tmp_path / "counts.tsv").write_text("".join(f"{w}\t{n}\n" for w, n in counts.items()))
    code = main(
        ["levels", "--measure", "wup", "--candidates", str(tmp_path / "pool.txt"),
         "--counts", str(tmp_path / "counts.tsv"), "--n-levels", "2", "--level-size", "10",
         "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "min_images" in printed and "20" in printed
    levels = load_levels(tmp_path / "out")
    assert all(counts[w] >= 782 for level in levels.levels for w in level)


def test_levels_command_reports_errors(tmp_path, capsys):
    assert main(["levels", "--measure", "nope", "--candidates", "cog", "--out", str(tmp_path)]) == 2
    assert "unknown measure 'nope'" in capsys.readouterr().err
    assert main(["levels", "--measure", "w2v", "--out", str(tmp_path)]) == 2
    assert "--vectors" in capsys.readouterr().err


def test_console_script_and_module_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "imagenet_cog", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.startswith("imagenet-cog ")
    with pytest.raises(SystemExit):
        main(["--help"])


def test_report_shows_the_papers_tables_and_plots_without_results(tmp_path, capsys):
    plots = tmp_path / "plots"
    assert main(["report", "--reference", "paper", "--models", "s-DINO", "--plot", str(plots)]) == 0
    printed = capsys.readouterr().out
    assert "ResNet50" in printed and "s-DINO" in printed and "relative to ResNet50" in printed
    assert "NOT COMPARABLE" not in printed and "Your model" not in printed
    assert {p.name for p in plots.iterdir()} == {
        "levels_absolute.png", "levels_relative.png", "fewshot.png", "fewshot_relative.png",
    }  # fmt: skip
    assert main(["report"]) == 2
    assert "--reference paper" in capsys.readouterr().err


def _subset_run(folder):
    folder.mkdir()
    cells = [{"model": "tiny", "domain": d, "shots": "all", "seed": s, "top1": 99.0,
              "config_hash": "abc"} for d in ("in1k", "L1", "L2", "L3", "L4", "L5")
             for s in (22, 37, 45, 77, 93)]  # fmt: skip
    (folder / "runs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    data = {d: {"n_classes": 3, "classes_sha256": "0" * 64, "wnid_labels": True, "n_train": 30,
                "n_test": 6} for d in ("in1k", "L1", "L2", "L3", "L4", "L5")}  # fmt: skip
    config = {"levels": "official", "data": data, "versions": {"optuna": "2.3.0"},
              "protocol": {"epochs": 100, "batch_size": 1024, "n_trials": 30, "normalize": True}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))


def test_report_marks_a_subset_run_at_the_top_and_strict_refuses_it(tmp_path, capsys):
    _subset_run(tmp_path / "run")
    assert main(["report", str(tmp_path / "run"), "--reference", "paper"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("!!! NOT COMPARABLE with the paper: tiny !!!")
    assert "IN-1K: 3 concepts instead of the paper's 1000" in printed.split("\n\n")[0]
    assert any(
        x.startswith("tiny rank") and x.split()[2] == "(1)*/32" for x in printed.splitlines()
    )
    assert main(["report", str(tmp_path / "run"), "--reference", "paper", "--strict"]) == 2
    err = capsys.readouterr().err
    assert "NOT COMPARABLE" in err and "L5: 3 concepts" in err
    assert main(["report", str(tmp_path / "run"), "--strict"]) == 2
