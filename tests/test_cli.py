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
