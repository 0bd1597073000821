"""Every name in every export, escaped or refused: a results folder received from someone
else can hold any text in its model and domain names and in its config.json, and none of it
may become live LaTeX, a spreadsheet formula, a terminal's escape sequence or a broken
Markdown table. And the bold of a LaTeX column follows what is printed, among comparable
entries only."""

import csv
import io
import json
import re

import pytest
from helpers import write_run_folder
from official_run import paper_like

from imagenet_cog import Results, reference_results
from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS


def _write_run(folder, model="mine", domain_names=DOMAINS, config=None):
    """A results folder on the default protocol's shape (every shots value beside "all",
    five seeds), with a config.json when one is given."""
    cells = [
        {"model": model, "domain": d, "shots": n, "seed": s, "top1": 50.0 + k}
        for d in domain_names
        for n in SHOTS
        for k, s in enumerate(SEEDS)
    ]
    if config is not None:  # as evaluate writes it: every file bound by its checksums
        return write_run_folder(folder, config, cells)
    folder.mkdir(parents=True)
    (folder / "runs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    return folder


def _live_latex(tex):
    """The lines of a LaTeX source outside comments."""
    return [line for line in tex.splitlines() if not line.lstrip().startswith("%")]


def test_a_model_name_with_a_line_break_is_refused_in_one_line(tmp_path, capsys):
    from imagenet_cog.cli import main

    run = _write_run(tmp_path / "run", model="mine\n\\input{/etc/passwd}")
    assert main(["report", str(run), "--format", "latex"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        (
            "imagenet-cog: error: the model name 'mine\\n\\\\input{/etc/passwd}' holds a "
            "control character (a line break or an escape sequence), which no table or export "
            "can show: give the run another name (Results.load(path, model=...), evaluate "
            "--model)"
        )
    ]
    with pytest.raises(ValueError, match="holds a control character"):
        Results([{"model": "a\x1b[31mb", "domain": "L5", "shots": "all", "top1": 1.0}])
    # Renamed on loading, the same folder reports.
    assert Results.load(run, model="mine").models == ["mine"]


def test_a_model_name_with_a_lone_surrogate_is_refused_in_one_line(tmp_path, capsys):
    # Before: the text report and the CSV wrote it as bytes that are not UTF-8 (or Python's
    # encoder message), --plot and --html ended in matplotlib's TypeError.
    from imagenet_cog.cli import main

    run = _write_run(tmp_path / "run", model="a\udc80b")  # JSON's "\udc80"
    said = (
        "imagenet-cog: error: the model name 'a\\udc80b' holds a lone surrogate (bytes that "
        "are not UTF-8), which no table, export or figure can write: give the run another name "
        "(Results.load(path, model=...), evaluate --model)"
    )
    for extra in ([], ["--format", "csv"], ["--plot", tmp_path / "f"], ["--html", tmp_path / "p"]):
        assert main(["report", str(run), *map(str, extra)]) == 2, extra
        captured = capsys.readouterr()
        assert captured.err.splitlines() == [said] and "\udc80" not in captured.out, extra
    assert not (tmp_path / "f").exists() and not (tmp_path / "p").exists()
    assert Results.load(run, model="mine").models == ["mine"]


def test_a_domain_name_never_reaches_a_label_or_a_caption_unescaped(tmp_path):
    evil = "\\input{/etc/passwd}"
    run = _write_run(tmp_path / "run", domain_names=("L5", evil))
    tex = Results.load(run).to_latex()
    live = "\n".join(_live_latex(tex))
    assert "\\input" not in live
    labels = re.findall(r"\\label\{([^}]*)\}", live)
    assert labels == ["tab:cog-l5", "tab:cog-input-etc-passwd"]
    assert "\\textbackslash{}input\\{/etc/passwd\\}" in live


def _copy(name):
    """The record of a resized copy of that name, as a split keeps it."""
    return {"processed": True, "name": name, "layout": "folders", "resized": 1, "samples": 10}


def test_comment_lines_stay_comments_whatever_the_reasons_hold(tmp_path):
    # A reason quoting config.json text with a line break: the comment stays one line.
    evil = "3\n\\input{/etc/passwd}"
    config = {
        "levels": "official",
        "protocol": {"epochs": 100, "batch_size": 1024, "n_trials": 30, "normalize": True},
        "data": {"L5": {"n_classes": 3, "wnid_labels": True, "split": {"copy": _copy(evil)}}},
    }
    run = _write_run(tmp_path / "run", domain_names=("L5",), config=config)
    tex = Results.load(run).to_latex()
    assert "\\input" not in "\n".join(_live_latex(tex))
    assert any("\\input{/etc/passwd}" in line for line in tex.splitlines() if line[:1] == "%")


def test_csv_cells_are_never_spreadsheet_formulas(tmp_path):
    for name in ('=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)"):
        rows = list(csv.DictReader(io.StringIO(Results.load(
            _write_run(tmp_path / str(abs(hash(name))), model=name)
        ).to_csv())))  # fmt: skip
        assert {r["model"] for r in rows} == {"'" + name}
        assert all(r["deviations"][:1] not in "=+-@" for r in rows)


def test_the_terminal_is_shown_escape_sequences_never_sent_them(tmp_path, capsys):
    from imagenet_cog.cli import main

    evil = "\x1b]0;owned\x07\x1b[2J"
    config = {
        "levels": "official",
        "protocol": {"epochs": 100, "batch_size": 1024, "n_trials": 30, "normalize": True},
        "data": {
            d: {"n_classes": 1000, "wnid_labels": True, "split": {"copy": _copy(evil)}}
            for d in DOMAINS
        },
    }
    run = _write_run(tmp_path / "run", config=config)
    for argv in (["report", str(run)], ["report", str(run), "--reference", "paper"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out
        assert "images from the \\x1b]0;owned\\x07\\x1b[2J copy (folders)" in out
    run2 = _write_run(tmp_path / "run2", model="a\x1b[2Jb")
    assert main(["report", str(run2)]) == 2
    assert "\x1b" not in capsys.readouterr().err


def test_a_pipe_in_a_name_leaves_the_markdown_table_whole(tmp_path):
    run = _write_run(tmp_path / "run", model="a|b_c")
    md = Results.load(run).to_markdown()
    table = [line for line in md.splitlines() if line.startswith("| a")]
    assert table and all(line.startswith("| a\\|b\\_c |") for line in table)
    # Each row has as many cells as the header of its table.
    header = None
    for line in md.splitlines():
        if line.startswith("| model"):
            header = line
        elif line.startswith("| a"):
            assert len(re.findall(r"(?<!\\)\|", line)) == len(re.findall(r"\|", header))
    assert "> **a\\|b\\_c: not comparable with the paper**" in md


# ------------------------------------------------------------------ bold
def _two_comparable(mean_a, mean_b):
    """Two runs that follow the paper in every recorded respect, with these means."""
    runs = []
    for name, mean in (("A", mean_a), ("B", mean_b)):
        run = paper_like(model=name)
        shift = mean - run.mean(name, "L5", "all")
        runs.append(Results([{**r, "top1": r["top1"] + shift} for r in run.records], meta=run.meta))
    return runs[0].merge(runs[1])


def _bold(tex, domain="l5"):
    block = tex.split(f"\\label{{tab:cog-{domain}}}")[1].split("\\end{table}")[0]
    return {
        line.split(" & ")[0]: [("\\mathbf" in c) for c in line.split(" & ")[1:]]
        for line in block.splitlines()
        if line.endswith("\\\\") and line[:1] in "AB"
    }


def test_bold_follows_the_printed_value_at_the_rounding_edge():
    both = _two_comparable(60.06, 60.04)
    assert both.to_latex().count("60.1") and both.to_latex().count("60.0")
    bold = _bold(both.to_latex())
    assert bold["A"][-1] and not bold["B"][-1]
    # Means that print alike are both bold.
    bold = _bold(_two_comparable(60.41, 60.36).to_latex())
    assert bold["A"][-1] and bold["B"][-1]


def test_bold_goes_to_comparable_entries_only(tmp_path):
    cells = [
        {"model": "tiny", "domain": d, "shots": n, "seed": s, "top1": 100.0}
        for d in DOMAINS
        for n in SHOTS
        for s in SEEDS
    ]
    both = Results(cells).compare(reference_results(), models=["s-DINO"])
    tex = both.to_latex()
    block = tex.split("\\label{tab:cog-l5}")[1].split("\\end{table}")[0]
    rows = {line.split(" & ")[0]: line for line in block.splitlines() if " & " in line}
    tiny = next(v for k, v in rows.items() if k.startswith("tiny"))
    assert "\\mathbf" not in tiny and "100.0" in tiny
    assert "\\mathbf{57.6}" in rows["s-DINO"]
    assert "best comparable value per column in bold" in tex
    # Without the verdict written out, bold still skips it.
    assert "\\mathbf" not in next(
        line for line in both.to_latex(verdict=False).splitlines() if line.startswith("tiny")
    )


def test_an_analysis_from_elsewhere_cannot_drive_the_terminal(tmp_path, capsys):
    from imagenet_cog._runfolder import write_analysis
    from imagenet_cog.cli import main

    run = _write_run(tmp_path / "run")
    write_analysis(run / "analysis.json", {"model": "mine", "domains": {"L5\x1b[2J": {"nmi": 0.5}}})
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "L5\\x1b[2J" in out


# ------------------------------------------------------------------ names in figures
def _svg_texts(fig):
    """The texts a figure draws, as its SVG holds them (text kept as text)."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg")
    return [html_unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", buffer.getvalue())]


def html_unescape(text):
    import html

    return html.unescape(text)


def test_model_names_are_drawn_as_written_in_figures(tmp_path, capsys):
    # Before: two "$" made a name mathtext (drawn as a formula, or stopping the figure with
    # the parser's message when malformed), a name starting with "_" was left out of the
    # legend, and a 100,000-character name ended --plot in a MemoryError.
    import matplotlib.pyplot as plt

    from imagenet_cog.cli import main

    long = "m" * 50_000 + "-end-" + "n" * 50_000
    names = ["$x^2$", "bad$\\frac{$", "_private", long]
    res = Results.load(*[_write_run(tmp_path / f"r{k}", model=n) for k, n in enumerate(names)])
    figs = res.figures(baseline="$x^2$")
    texts = _svg_texts(figs["levels_absolute"])
    legend = [t for t in texts if "(not comparable)" in t]
    assert "$x^2$ (not comparable) (baseline)" in legend
    assert "bad$\\frac{$ (not comparable)" in legend
    assert any(t.endswith("_private (not comparable)") for t in legend)  # in the legend
    (shown,) = [t for t in legend if t.startswith("mmm")]
    assert len(shown) < 100 and "…" in shown and shown.endswith("nnn (not comparable)")
    assert any("top-1 − $x^2$ (points)" in t for t in _svg_texts(figs["levels_relative"]))
    plt.close("all")
    for extra in (["--plot", tmp_path / "figs"], ["--html", tmp_path / "page.html"]):
        argv = ["report", *(tmp_path / f"r{k}" for k in range(4)), *extra]
        assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    assert (tmp_path / "figs" / "levels_absolute.png").is_file()
    assert len((tmp_path / "page.html").read_bytes()) < 5_000_000
    capsys.readouterr()


def test_a_name_in_brackets_after_a_rule_is_text_not_the_rules_thickness(tmp_path):
    # Before: "\\midrule" (or "\\\\") followed by "[9in]" read it as its optional argument:
    # "Float too large", or a 9-inch rule.
    tex = Results.load(_write_run(tmp_path / "run", model="[9in]")).to_latex()
    rows = [line.strip() for line in _live_latex(tex)]
    assert not [line for line in rows if line.startswith("[")]
    assert any(line.startswith("{[}9in{]}") for line in rows)
