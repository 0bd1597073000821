"""What goes from results into a paper: statistics between models, LaTeX tables, the verdict
in every export."""

import csv
import io
import json
import math
import re
import shutil
import subprocess

import numpy as np
import pytest
from helpers import needs
from scipy import stats

from imagenet_cog import Results, reference_results
from imagenet_cog._paired import holm, sign_flip_p

SEEDS = (22, 37, 45, 77, 93)


def _two_models(delta=1.0, noise_a=(0.3, -0.4, 0.1, 0.5, -0.2), noise_b=(0.1, 0.2, -0.3, 0.0, 0.1)):
    cells = []
    for model, base, noise in [("A", 50.0 + delta, noise_a), ("B", 50.0, noise_b)]:
        for domain, shift in [("in1k", 20.0), ("L5", 0.0)]:
            for seed, e in zip(SEEDS, noise):
                cells.append(
                    {
                        "model": model,
                        "domain": domain,
                        "shots": "all",
                        "seed": seed,
                        "top1": base + shift + e,
                    }
                )
    return Results(cells)


def test_paired_difference_equals_scipys_paired_t_test():
    res = _two_models(delta=0.6)
    c = res.paired_difference("A", "B", "L5")
    a = [r["top1"] for r in res.records if r["model"] == "A" and r["domain"] == "L5"]
    b = [r["top1"] for r in res.records if r["model"] == "B" and r["domain"] == "L5"]
    ref = stats.ttest_rel(a, b, alternative="greater")
    assert c.test == "paired" and c.seeds == SEEDS
    assert c.mean == pytest.approx(np.mean(np.subtract(a, b)))
    assert c.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    # The bound is the test's own: one-sided, at the same level.
    ci = ref.confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low), math.inf)


def test_seeds_are_paired_by_value_not_by_order():
    res = _two_models()
    shuffled = Results(list(reversed(res.records)))
    assert shuffled.paired_difference("A", "B", "L5") == res.paired_difference("A", "B", "L5")


def test_sign_flip_is_exact():
    # All five differences positive: only the observed pattern is as extreme, 1/32.
    assert sign_flip_p([0.5, 0.2, 0.1, 0.4, 0.3]) == pytest.approx(1 / 32)
    # One of five negative and smallest in size: the patterns with mean at least the
    # observed one are the all-positive and the observed: 2/32.
    assert sign_flip_p([0.5, 0.2, -0.1, 0.4, 0.3]) == pytest.approx(2 / 32)
    # Brute force on random differences.
    rng = np.random.default_rng(0)
    d = rng.normal(0.2, 1.0, size=6)
    count = sum(
        np.mean(d * np.array(s)) >= d.mean() - 1e-12
        for s in np.ndindex(*(2,) * 6)
        for s in [[1 if b == 0 else -1 for b in s]]
    )
    assert sign_flip_p(d) == pytest.approx(count / 64)


def test_a_model_with_only_published_summaries_gets_welchs_test():
    paper = reference_results(["ResNet50", "s-DINO"])
    c = paper.paired_difference("s-DINO", "ResNet50", "L5")
    assert c.test == "welch" and c.n == 0 and math.isnan(c.p_sign_flip)
    rows = {m: paper.cell(m, "L5", "all") for m in ("s-DINO", "ResNet50")}
    # The paper prints population stds (ddof=0); scipy wants sample stds.
    # A printed 0.0 is read as the rounding's bound, 0.05.
    sd = {m: max(r["std"], 0.05) * math.sqrt(r["n"] / (r["n"] - 1)) for m, r in rows.items()}
    ref = stats.ttest_ind_from_stats(
        rows["s-DINO"]["mean"],
        sd["s-DINO"],
        rows["s-DINO"]["n"],
        rows["ResNet50"]["mean"],
        sd["ResNet50"],
        rows["ResNet50"]["n"],
        equal_var=False,
        alternative="greater",
    )
    assert c.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert c.mean == pytest.approx(57.6 - 52.0)


def test_holm_matches_a_hand_computation():
    # Sorted 0.01, 0.03, 0.04 -> 3*0.01, max(0.03, 2*0.03), max(0.06, 1*0.04).
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_compare_models_table_says_which_domains_differ():
    res = _two_models(delta=2.0)
    text = res.compare_models("A", "B")
    lines = text.splitlines()
    assert "one-sided test of 'A better' (paired t-test" in lines[0]
    assert "Holm-adjusted over 2 domains" in lines[0]
    assert lines[2].startswith("IN-1K") and lines[3].startswith("L5")
    assert lines[3].endswith("A better")
    same = _two_models(delta=0.0).compare_models("A", "B")
    assert same.splitlines()[3].endswith("no evidence that A is better")


def test_pairing_needs_shared_seeds():
    res = _two_models()
    b_other = [dict(r, seed=r["seed"] + 1) if r["model"] == "B" else r for r in res.records]
    with pytest.raises(ValueError, match="share 0 seed"):
        Results(b_other).paired_difference("A", "B", "L5")
    with pytest.raises(ValueError, match="unknown model 'C'"):
        res.paired_difference("A", "C", "L5")


def _latex_rows(tex, domain_label):
    block = tex.split(f"\\label{{tab:cog-{domain_label}}}")[1].split("\\end{table}")[0]
    return [line for line in block.splitlines() if line.endswith("\\\\")]


def test_latex_tables_have_the_papers_layout_and_bold_best():
    paper = reference_results(["ResNet50", "a-DeiT-S", "s-DINO"])
    tex = paper.to_latex()
    assert tex.count("\\begin{table}") == 6 and tex.count("\\end{table}") == 6
    assert tex.count("\\toprule") == tex.count("\\bottomrule") == 6
    rows = _latex_rows(tex, "l5")
    header = rows[1]
    assert header.startswith("Model & $2^{0}$") and header.endswith("All \\\\")
    by_model = {r.split(" & ")[0]: r.split(" & ")[1:] for r in rows[2:]}
    assert set(by_model) == {"ResNet50", "a-DeiT-S", "s-DINO"}
    # Every row has one cell per column; the best mean of each column is bold, once.
    n_cols = header.count("&")
    for cells in by_model.values():
        assert len(cells) == n_cols
    for j in range(n_cols):
        col = {m: cells[j] for m, cells in by_model.items()}
        means = {m: float(re.search(r"(\d+\.\d)", c).group(1)) for m, c in col.items()}
        bold = [m for m, c in col.items() if "\\mathbf" in c]
        assert bold and all(means[m] == max(means.values()) for m in bold)
    assert by_model["s-DINO"][-1] == "$\\mathbf{57.6}$\\,{\\scriptsize$\\pm$0.0} \\\\"
    # The paper's groups are separated by rules.
    block = tex.split("\\label{tab:cog-l5}")[1]
    assert block.count("\\midrule") == 1 + 2


def test_latex_carries_the_verdict_and_escapes_names():
    cells = [{"model": "my_model 50%", "domain": "L5", "shots": "all", "seed": 22, "top1": 40.0}]
    tex = Results(cells).to_latex()
    assert "% NOT COMPARABLE with the paper: my_model 50%" in tex
    assert "my\\_model 50\\%$^\\dagger$ &" in tex
    assert "{\\scriptsize $^\\dagger$Not comparable with the paper: 1 seed per cell" in tex


def test_every_export_carries_the_verdict():
    cells = [
        {"model": "m", "domain": d, "shots": "all", "seed": 22, "top1": 40.0}
        for d in ("in1k", "L5")
    ]
    res = Results(cells)
    rows = list(csv.DictReader(io.StringIO(res.to_csv())))
    assert {r["comparable"] for r in rows} == {"no"}
    assert "1 seed per cell" in rows[0]["deviations"]
    payload = json.loads(res.to_json())
    assert payload["verdict"]["comparable"] == {"m": "no"}
    assert "1 seed per cell" in payload["verdict"]["not_comparable"]["m"][0]
    md = res.to_markdown()
    assert md.startswith("> **m: not comparable with the paper**: 1 seed per cell")
    paper = reference_results(["ResNet50"])
    assert {r["comparable"] for r in csv.DictReader(io.StringIO(paper.to_csv()))} == {"reference"}


def test_report_compare_and_latex_from_the_command_line(tmp_path, capsys):
    from imagenet_cog.cli import main

    out = tmp_path / "run"
    out.mkdir()
    res = _two_models(delta=2.0)
    (out / "runs.jsonl").write_text("\n".join(json.dumps(r) for r in res.records) + "\n")
    assert main(["report", str(out), "--compare", "A,B"]) in (0, None)
    text = capsys.readouterr().out
    assert "A vs B" in text and "A better" in text
    assert main(["report", "--reference", "paper", "--models", "s-DINO", "--format", "latex"]) in (
        0,
        None,
    )
    tex = capsys.readouterr().out
    assert "\\begin{tabular}" in tex and "s-DINO" in tex


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_latex_compiles_with_pdflatex(tmp_path):
    cells = [
        {"model": "my_model", "domain": "L5", "shots": s, "seed": 22, "top1": 40.0}
        for s in (1, "all")
    ]
    both = Results(cells).compare(reference_results(), baseline="ResNet50", models=["s-DINO"])
    doc = (
        "\\documentclass{article}\n\\usepackage{booktabs,graphicx}\n\\begin{document}\n"
        + both.to_latex()
        + "\\end{document}\n"
    )
    (tmp_path / "t.tex").write_text(doc)
    run = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    assert (tmp_path / "t.pdf").stat().st_size > 1000


# ------------------------------------------------------------------ figures, read back
matplotlib = needs("matplotlib", module_level=True)
DATA_RGB, LEGEND_RGB = (255, 0, 255), (0, 255, 255)


def _rendered(fig_name, results, tmp_path, **kw):
    """Render one figure to PNG with the axes and legend filled in marker colours, and read
    the pixels back."""
    from PIL import Image

    rc = {"axes.facecolor": "#ff00ff", "legend.facecolor": "#00ffff", "legend.framealpha": 1.0}
    with matplotlib.rc_context(rc):
        paths = results.plot(tmp_path, **kw)
    path = next(p for p in paths if p.stem == fig_name)
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def _box(pixels, rgb):
    ys, xs = np.nonzero(np.all(pixels == rgb, axis=-1))
    assert len(ys), f"no pixel of colour {rgb}"
    return ys.min(), ys.max(), xs.min(), xs.max()


def _overlap(a, b):
    return not (a[1] < b[0] or b[1] < a[0] or a[3] < b[2] or b[3] < a[2])


def _mine_and_paper():
    cells = [
        {"model": "MyNet", "domain": d, "shots": s, "seed": seed, "top1": v - 3 * i + 0.2 * j}
        for i, (d, v) in enumerate([("in1k", 70.0), ("L1", 62), ("L5", 45)])
        for s in (1, 16, "all")
        for j, seed in enumerate(SEEDS)
    ]
    return Results(cells).compare(reference_results(), baseline="ResNet50")


@pytest.mark.parametrize("name", ["levels_absolute", "levels_relative", "fewshot"])
def test_figures_keep_legend_outside_the_data_and_nothing_clipped(tmp_path, name):
    both = _mine_and_paper()
    px = _rendered(name, both, tmp_path, baseline="ResNet50", highlight=["MyNet", "s-DINO"])
    legend = _box(px, LEGEND_RGB)
    data = _box(px, DATA_RGB)
    # Several panels: every magenta region is a panel; none may meet the legend.
    mask = np.all(px == DATA_RGB, axis=-1)
    ly0, ly1, lx0, lx1 = legend
    assert not mask[ly0 : ly1 + 1, lx0 : lx1 + 1].any(), "the legend covers data"
    assert not _overlap(legend, data) or name == "fewshot"
    h, w, _ = px.shape
    assert ly0 >= 3 and ly1 < h - 3 and lx0 >= 3 and lx1 < w - 3, "legend not inside the canvas"
    # Nothing reaches the canvas' edge: a cut label would leave ink there.
    border = np.concatenate(
        [
            px[:3].reshape(-1, 3),
            px[-3:].reshape(-1, 3),
            px[:, :3].reshape(-1, 3),
            px[:, -3:].reshape(-1, 3),
        ]
    )
    assert (border >= 250).all(), "something is cut at the canvas' edge"


def _hue_share(px):
    import colorsys

    flat = px.reshape(-1, 3) / 255.0
    keep = [
        colorsys.rgb_to_hsv(*c)
        for c in flat[::3]
        if not (np.allclose(c, (1, 0, 1)) or np.allclose(c, (0, 1, 1)))
    ]
    hsv = np.array(keep)
    vivid = hsv[(hsv[:, 1] > 0.35) & (hsv[:, 2] > 0.25)]
    return vivid[:, 0]


def test_the_papers_groups_each_have_their_own_colour_family(tmp_path):
    from PIL import Image

    paths = reference_results().plot(tmp_path)
    px = np.asarray(Image.open(tmp_path / "levels_absolute.png").convert("RGB")).astype(int)
    hue = _hue_share(px)
    families = {  # matplotlib's Blues, Reds, Greens and Purples
        "a- blue": (hue > 0.52) & (hue < 0.64),
        "s- red": (hue > 0.95) | (hue < 0.05),
        "r- green": (hue > 0.25) & (hue < 0.45),
        "d- purple": (hue > 0.65) & (hue < 0.80),
    }
    counts = {k: int(v.sum()) for k, v in families.items()}
    assert all(c > 150 for c in counts.values()), counts
    assert len(paths) == 2  # no baseline: no relative figures


def test_named_models_are_labelled_and_a_footnote_gives_decisive_reasons_first():
    both = _mine_and_paper()
    figs = both.figures(baseline="ResNet50", highlight=["MyNet", "s-DINO", "a-DeiT-S"])
    fig = figs["levels_absolute"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"s-DINO", "a-DeiT-S"} <= set(labels)
    assert "MyNet (not comparable)" in labels
    assert any(label.startswith("s- self-supervision (") for label in labels)
    note = fig._supxlabel.get_text()
    assert note.startswith("(not comparable) MyNet: ") and note.count("not comparable") == 1
    import matplotlib.pyplot as plt

    plt.close("all")


def test_decisive_reasons_come_first():
    from imagenet_cog._figures import footnote_text
    from imagenet_cog._reporting.verdict import decisive_first

    reasons = [
        "epochs: 5 instead of 100",
        "L1: 3 concepts instead of the paper's 1000 (a subset)",
        "random-initialised weights: 'x' names no weights",
    ]
    ordered = decisive_first(reasons)
    # The weights, then the data, then the protocol's constants.
    assert ordered[0].startswith("random") and ordered[1].startswith("L1: 3 concepts")
    assert ordered[-1].startswith("epochs")
    text = footnote_text({"m": reasons})
    assert "3 concepts" in text and "random-initialised" in text and "(+1 more)" in text
    assert "epochs" not in text


def test_vector_formats_are_written(tmp_path):
    paths = reference_results(["ResNet50", "s-DINO"]).plot(tmp_path, formats=("pdf", "svg"))
    assert {p.suffix for p in paths} == {".pdf", ".svg"}
    assert (tmp_path / "levels_absolute.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in (tmp_path / "levels_absolute.svg").read_bytes()[:2000]
    with pytest.raises(ValueError, match="choose from png, pdf, svg"):
        reference_results(["ResNet50"]).plot(tmp_path, formats=("jpg",))


def test_analysis_figure_carries_the_note_and_unclipped_labels(tmp_path):
    from PIL import Image

    from imagenet_cog.analysis import plot_analysis

    scores = {"IN-1K": {"nmi": 0.332, "alignment": 0.9}, "L5": {"nmi": 0.2, "alignment": 1.1}}
    path = tmp_path / "analysis.png"
    fig = plot_analysis(scores, path, note="(not comparable) m: random-initialised weights")
    assert "random-initialised" in fig._supxlabel.get_text()
    px = np.asarray(Image.open(path).convert("RGB")).astype(int)
    border = np.concatenate(
        [
            px[:2].reshape(-1, 3),
            px[-2:].reshape(-1, 3),
            px[:, :2].reshape(-1, 3),
            px[:, -2:].reshape(-1, 3),
        ]
    )
    assert (border >= 250).all()
    labels = [t for ax in fig.axes for t in ax.texts]
    assert labels and all(t.get_bbox_patch().get_alpha() == 1.0 for t in labels)


def test_report_with_the_paper_answers_first_and_fits_a_terminal(tmp_path, capsys, monkeypatch):
    from imagenet_cog.cli import main

    monkeypatch.setenv("COLUMNS", "90")
    out = tmp_path / "run"
    out.mkdir()
    cells = [
        {"model": "mine", "domain": d, "shots": "all", "seed": s, "top1": v}
        for d, v in [("in1k", 70.0), ("L1", 62.0), ("L5", 46.5)]
        for s in SEEDS
    ]
    (out / "runs.jsonl").write_text("\n".join(json.dumps(c) for c in cells) + "\n")
    assert main(["report", str(out), "--reference", "paper"]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0] == "Your model among 32 models (all training images; rank 1 = best)"
    assert lines[2].startswith("mine rank")
    change = next(x for x in lines if x.startswith("mine: L1 -> L5 relative change"))
    assert "-25.0%" in change and "the other 31 models" in change
    # Prose is wrapped to the terminal; the 31 models' tables only with --full.
    assert all(len(x) <= 90 for x in lines if "  " not in x.strip())
    assert len(lines) < 40 and "add --full" in printed
    assert main(["report", str(out), "--reference", "paper", "--full"]) == 0
    full = capsys.readouterr().out
    assert "s-DINO" in full and len(full.splitlines()) > 100


# ------------------------------------------------------------- accuracy per concept
def _prediction_run(folder, per_concept_hits):
    """An evaluate folder whose saved predictions give each concept a known accuracy."""
    from imagenet_cog._runfolder import PREDICTIONS_DIR, write_predictions

    for (domain, seed), hits in per_concept_hits.items():
        y_true, y_pred = [], []
        wnids = sorted(hits)
        for w in wnids:
            right = hits[w]
            y_true += [w] * 10
            y_pred += [w] * right + [wnids[(wnids.index(w) + 1) % len(wnids)]] * (10 - right)
        classes = np.array(wnids)
        index = {w: i for i, w in enumerate(wnids)}
        top5 = np.array([[index[p]] for p in y_pred], dtype=np.int32)
        write_predictions(
            folder / PREDICTIONS_DIR,
            domain,
            "all",
            seed,
            y_true=np.array(y_true),
            y_pred=np.array(y_pred),
            top5=top5,
            classes=classes,
        )


def test_concept_accuracy_reads_the_saved_predictions_and_the_levels_scores(tmp_path):
    from imagenet_cog import load_levels
    from imagenet_cog.analysis import concept_accuracy

    levels = load_levels("official")
    l1, l5 = levels["L1"][:3], levels["L5"][:3]
    hits = {
        ("L1", 22): dict(zip(l1, (10, 9, 8))),
        ("L1", 37): dict(zip(l1, (10, 7, 8))),
        ("L5", 22): dict(zip(l5, (2, 3, 4))),
        ("L5", 37): dict(zip(l5, (4, 3, 4))),
    }
    _prediction_run(tmp_path, hits)
    found = concept_accuracy(tmp_path)
    got = dict(zip(found.wnids, found.accuracy))
    assert got[l1[0]] == 100.0 and got[l1[1]] == pytest.approx(80.0) and got[l5[0]] == 30.0
    stds = dict(zip(found.wnids, found.std))
    assert stds[l1[1]] == pytest.approx(10.0) and stds[l1[2]] == 0.0
    assert found.seeds == (22, 37) and set(found.domains) == {"L1", "L5"}
    assert dict(zip(found.wnids, found.similarity))[l5[2]] == levels.scores[l5[2]]
    assert found.spearman == pytest.approx(stats.spearmanr(found.similarity, found.accuracy)[0])
    rows = list(csv.DictReader(io.StringIO(found.to_csv())))
    assert len(rows) == 6 and set(rows[0]) == {
        "wnid",
        "name",
        "level",
        "similarity",
        "top1",
        "std",
        "n_test",
    }
    fig = found.plot(tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0 and "Spearman" in fig.axes[0].get_title()
    with pytest.raises(FileNotFoundError, match="no saved predictions of a level with N=1"):
        concept_accuracy(tmp_path, shots=1)


def test_analyze_concepts_from_the_command_line(tmp_path, capsys):
    from imagenet_cog import load_levels
    from imagenet_cog.cli import main

    l1 = load_levels("official")["L1"][:4]
    _prediction_run(tmp_path / "run", {("L1", 22): dict(zip(l1, (10, 5, 6, 7)))})
    code = main(["analyze", str(tmp_path / "run"), "--analyses", "semantic", "--concepts"])
    assert code in (0, None)
    printed = capsys.readouterr().out
    assert "accuracy of 4 concepts (N=all, seeds 22)" in printed
    assert (tmp_path / "run" / "concepts.csv").is_file()
    assert (tmp_path / "run" / "concepts.png").is_file()


# ------------------------------------------------ names are labels, never evidence
def test_comparability_reads_the_network_from_the_record_not_the_name():
    from official_run import paper_like

    from imagenet_cog import comparability

    spec = "timm:convnext_base:pretrained"
    for name in (spec, "MyConvNeXt", "ResNet50-ours"):
        run = paper_like(model=name, ext_model=spec)
        caveats = comparability(run, by_model=True)[name]["caveats"]
        assert any("not one of the paper's 31 models (timm spec)" in c for c in caveats), name
    # A paper network named like something else is not flagged as another model.
    run = paper_like(model="timm:convnext_base:pretrained")
    caveats = comparability(run, by_model=True)["timm:convnext_base:pretrained"]["caveats"]
    assert not any("not one of the paper's 31" in c for c in caveats)
