import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_run_folder

import imagenet_cog
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
        [
            "levels",
            "--measure",
            "wup",
            "--candidates",
            str(tmp_path / "pool.txt"),
            "--counts",
            str(tmp_path / "counts.tsv"),
            "--n-levels",
            "2",
            "--level-size",
            "10",
            "--out",
            str(tmp_path / "out"),
        ]
    )
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
        "levels_absolute.png",
        "levels_relative.png",
        "fewshot.png",
        "fewshot_relative.png",
    }
    assert main(["report"]) == 2
    assert "--reference paper" in capsys.readouterr().err


def _subset_run(folder):
    cells = [
        {
            "model": "tiny",
            "domain": d,
            "shots": "all",
            "seed": s,
            "top1": 99.0,
            "config_hash": "abc",
        }
        for d in ("in1k", "L1", "L2", "L3", "L4", "L5")
        for s in (22, 37, 45, 77, 93)
    ]
    data = {
        d: {
            "n_classes": 3,
            "classes_sha256": "0" * 64,
            "wnid_labels": True,
            "n_train": 30,
            "n_test": 6,
        }
        for d in ("in1k", "L1", "L2", "L3", "L4", "L5")
    }
    config = {
        "levels": "official",
        "data": data,
        "versions": {"optuna": "2.3.0"},
        "protocol": {"epochs": 100, "batch_size": 1024, "n_trials": 30, "normalize": True},
    }
    write_run_folder(folder, config, cells)


def test_report_answers_first_then_marks_a_subset_run_and_strict_refuses_it(tmp_path, capsys):
    _subset_run(tmp_path / "run")
    assert main(["report", str(tmp_path / "run"), "--reference", "paper"]) == 0
    printed = capsys.readouterr().out
    # The answer first (the rank), the verdict right under it.
    assert printed.startswith("Your model among the paper's 31 models")
    banner = next(b for b in printed.split("\n\n") if b.startswith("!!! NOT COMPARABLE"))
    assert banner.startswith("!!! NOT COMPARABLE with the paper: tiny !!!")
    # One line for the subset over every domain, not one per domain.
    assert (
        "  - IN-1K, L1-L5: subsets of 3 concepts and 6 test images instead of the paper's "
        "1,000 and 50,000" in banner
    )
    assert "add --full" in printed and "s-DINO" not in printed
    assert any(
        x.startswith("tiny rank") and x.split()[2] == "(1)*/32" for x in printed.splitlines()
    )
    assert main(["report", str(tmp_path / "run"), "--reference", "paper", "--strict"]) == 2
    err = capsys.readouterr().err
    assert "NOT COMPARABLE" in err and "L5: 3 concepts" in err
    assert main(["report", str(tmp_path / "run"), "--strict"]) == 2


# ------------------------------------------------------- errors: one line, exit 2
def _small_pool(tmp_path):
    pool = load_levels("official").levels[0][:40]
    (tmp_path / "pool.txt").write_text("\n".join(pool) + "\n")
    return [
        "levels",
        "--candidates",
        str(tmp_path / "pool.txt"),
        "--n-levels",
        "2",
        "--level-size",
        "10",
    ]


def test_an_os_error_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file where the output folder should go")
    code = main([*_small_pool(tmp_path), "--out", str(tmp_path / "taken")])
    err = capsys.readouterr().err
    assert code == 2
    lines = [x for x in err.splitlines() if not x.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("imagenet-cog: error: ")
    assert "taken" in lines[0] and "Traceback" not in err


def test_traceback_flag_and_environment_variable_show_the_error(tmp_path, monkeypatch):
    argv = ["levels", "--measure", "nope", "--candidates", "cog", "--out", str(tmp_path)]
    with pytest.raises(ValueError, match="unknown measure 'nope'"):
        main(["--traceback", *argv])
    monkeypatch.setenv("IMAGENET_COG_TRACEBACK", "1")
    with pytest.raises(ValueError, match="unknown measure 'nope'"):
        main(argv)


@pytest.mark.slow
def test_a_malformed_levels_file_from_the_command_line(tmp_path):
    # A subprocess, as a user runs it: no traceback, one line naming the file and line, exit 2.
    (tmp_path / "data").mkdir()
    (tmp_path / "levels.tsv").write_text("level\twnid\tscore\n1\tn01440764\t0.5\n1\n")
    argv = [
        sys.executable,
        "-m",
        "imagenet_cog",
        "extract",
        "--model",
        "torchvision:resnet18:none",
        "--data",
        str(tmp_path / "data"),
        "--domain",
        "L1",
        "--device",
        "cpu",
        "--levels",
        str(tmp_path / "levels.tsv"),
        "--out",
        str(tmp_path / "store"),
    ]
    src = str(Path(imagenet_cog.__file__).resolve().parents[1])  # this checkout's package
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
    assert done.returncode == 2, done.stderr
    expected = f"{tmp_path / 'levels.tsv'}:3: expected 'level<TAB>wnid[<TAB>score]', got '1'"
    assert done.stderr.strip().splitlines() == [f"imagenet-cog: error: {expected}"]


# ------------------------------------------------------------------ help text
def _option_blocks(help_text):
    """Each option's part of a --help text, keyed by its first line."""
    blocks = []
    for line in help_text.splitlines():
        if line.startswith("  -"):
            blocks.append(line)
        elif blocks and line.startswith("   "):
            blocks[-1] += " " + line.strip()
    return blocks


def test_every_option_has_help_and_shows_its_default():
    import argparse

    from imagenet_cog.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name, sub in [("imagenet-cog", parser), *subparsers.choices.items()]:
        blocks = _option_blocks(sub.format_help())
        for action in sub._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            where = f"{name} {'/'.join(action.option_strings)}"
            assert action.help, f"{where} has no help text"
            default = action.default
            if default is None or default is False or default is argparse.SUPPRESS:
                continue
            shown = " ".join(map(str, default)) if isinstance(default, list) else str(default)
            block = next(b for b in blocks if b.lstrip().startswith(action.option_strings[0]))
            # The value itself, or the help's own words for it ("default: both").
            assert shown in block or "default" in block.lower(), (
                f"{where}: default {shown!r} not shown in {block!r}"
            )
            checked += 1
    assert checked >= 20


def test_levels_output_says_first_that_these_are_not_the_official_levels(tmp_path, capsys):
    assert main([*_small_pool(tmp_path), "--out", str(tmp_path / "out")]) == 0
    first = capsys.readouterr().out.splitlines()[:2]
    assert first[0].startswith("NOTE: these are NOT the official ImageNet-CoG levels: 20 of ")
    assert "extract uses the official levels" in first[1]
    assert "evaluate uses the levels its features were extracted with" in first[1]
