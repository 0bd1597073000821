"""Figures and tables that go into a paper as written, checked by rendering them: the PDF's
fonts (``pdffonts``), the text size at the width a figure is made for, a LaTeX page compiled
with no overfull box, the user's colours outside the paper's hue families (and apart in
grayscale), labelled axes, visible points, the analysis on its table's scale."""

import colorsys
import re
import shutil
import subprocess
import zlib

import numpy as np
import pytest
from helpers import needs

from imagenet_cog import Results, reference_results
from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS

matplotlib = needs("matplotlib", module_level=True)

#: Hue ranges (0-1) of the paper's groups as matplotlib's Blues, Reds, Greens and Purples draw
#: them, and the lightness of its Greys.
FAMILIES = {
    "a- blue": (0.52, 0.64),
    "s- red": (0.95, 1.05),
    "r- green": (0.25, 0.45),
    "d- purple": (0.65, 0.80),
}
#: The widths (pt) a figure is made for: a column of a two-column paper and a page.
COLUMN, PAGE = 3.3 * 72, 7.0 * 72


def _mine(names=("mobilenet_v2-b0353104", "resnet18-random", "third")):
    """User runs on the default protocol's shape: every shots value, five seeds."""
    cells = [
        {
            "model": m,
            "domain": d,
            "shots": n,
            "seed": s,
            "top1": 60.0 - 12 * k - 4 * i - 3 * (8 - j) + 0.2 * q,
        }
        for k, m in enumerate(names)
        for i, d in enumerate(DOMAINS)
        for j, n in enumerate(SHOTS)
        for q, s in enumerate(SEEDS)
    ]
    return Results(cells)


def _pdf_text_sizes(path):
    """``(page width in pt, [font size of every text run])`` read from a PDF's streams."""
    data = path.read_bytes()
    width = float(re.search(rb"/MediaBox \[ ?[\d.]+ [\d.]+ ([\d.]+) [\d.]+", data)[1])
    sizes = []
    for stream in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", data, re.DOTALL):
        try:
            text = zlib.decompress(stream)
        except zlib.error:
            continue
        sizes += [float(x) for x in re.findall(rb"/F\d+ ([\d.]+) Tf", text)]
    return width, sizes


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """Every figure a user makes, as PDF and PNG: the results', the concepts', the analysis'."""
    from imagenet_cog._analysis.concept_accuracy import ConceptAccuracy
    from imagenet_cog.analysis import plot_analysis

    out = tmp_path_factory.mktemp("figures")
    both = _mine().compare(reference_results(), models=["s-DINO"])
    paths = both.plot(
        out, baseline="ResNet50", highlight=[*_mine().models, "s-DINO"], formats=("pdf", "png")
    )
    rng = np.random.default_rng(0)
    levels = np.repeat(["L1", "L2", "L3", "L4", "L5"], 200)
    sim = np.concatenate([rng.uniform(0.9 - 0.15 * i, 1 - 0.15 * i, 200) for i in range(5)])
    acc = np.clip(sim * 80 + rng.normal(0, 15, 1000), 0, 100)
    concepts = ConceptAccuracy(
        np.array([f"n{i:08d}" for i in range(1000)]),  # no WordNet names: they show as wnids
        levels,
        sim,
        acc,
        np.zeros(1000),
        np.full(1000, 50),
        "all",
        SEEDS,
        0.5,
    )
    for suffix in ("pdf", "png"):
        concepts.plot(out / f"concepts.{suffix}")
        paths.append(out / f"concepts.{suffix}")
    scores = {
        d: {"nmi": 0.8 - 0.05 * i, "sibling_rate": 1.0 if i == 0 else 0.25 + 0.1 * i, "wup": 0.7}
        for i, d in enumerate(("IN-1K", "L1", "L2", "L3", "L4", "L5"))
    }
    for suffix in ("pdf", "png"):
        plot_analysis(scores, out / f"analysis.{suffix}", note="(not comparable) m: reasons")
        paths.append(out / f"analysis.{suffix}")
    import matplotlib.pyplot as plt

    plt.close("all")
    return {p.name: p for p in paths}


@pytest.mark.skipif(shutil.which("pdffonts") is None, reason="pdffonts (poppler-utils) is absent")
def test_every_pdf_embeds_truetype_fonts_never_type_3(figures):
    pdfs = [p for name, p in figures.items() if name.endswith(".pdf")]
    assert len(pdfs) == 6
    for pdf in pdfs:
        listed = subprocess.run(["pdffonts", str(pdf)], capture_output=True, text=True, check=True)
        fonts = listed.stdout.splitlines()[2:]
        assert fonts, pdf.name
        assert all("TrueType" in f and "Type 3" not in f for f in fonts), (pdf.name, fonts)


def test_text_is_at_least_6_pt_at_the_width_each_figure_is_made_for(figures):
    made_for = {
        "levels_absolute": COLUMN,
        "levels_relative": COLUMN,
        "fewshot": PAGE,
        "fewshot_relative": PAGE,
        "concepts": PAGE,
        "analysis": PAGE,
    }
    for stem, target in made_for.items():
        width, sizes = _pdf_text_sizes(figures[f"{stem}.pdf"])
        # Included at \linewidth of that width, the figure is scaled by target / width.
        assert width <= target * 1.03, (stem, width)
        assert sizes and min(sizes) * target / width >= 6.0, (stem, min(sizes), width)


def _vivid_hue(rgb):
    h, s, v = colorsys.rgb_to_hsv(*(np.asarray(rgb) / 255.0))
    return h, s, v


def test_the_users_colours_are_outside_the_papers_families_and_apart_in_grayscale(figures):
    from PIL import Image

    from imagenet_cog._figures import USER_COLOURS

    png = Image.open(figures["levels_absolute.png"]).convert("RGB")
    px = np.asarray(png).astype(int)
    gray = np.asarray(png.convert("L")).astype(int)
    levels = []
    for colour in USER_COLOURS[:3]:
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        near = np.all(np.abs(px - rgb) <= 6, axis=-1)
        assert near.sum() > 30, f"{colour} is not drawn"
        hue = colorsys.rgb_to_hsv(*(rgb / 255.0))[0]
        inside = [
            name for name, (lo, hi) in FAMILIES.items() if lo <= hue <= hi or lo <= hue + 1 <= hi
        ]
        assert not inside, (colour, hue, inside)
        levels.append(np.median(gray[near]))
    gaps = [abs(a - b) for i, a in enumerate(levels) for b in levels[i + 1 :]]
    assert min(gaps) >= 25, levels


def test_the_baseline_is_named_and_relative_axes_say_what_they_subtract():
    both = _mine().compare(reference_results())
    figs = both.figures(baseline="ResNet50", highlight=_mine().models)
    labels = [t.get_text() for t in figs["levels_absolute"].legends[0].get_texts()]
    assert "ResNet50 (baseline)" in labels
    assert not any(label.startswith("reference (") for label in labels)
    assert figs["levels_relative"].axes[0].get_ylabel() == "top-1 − ResNet50 (points)"
    assert figs["fewshot_relative"].axes[0].get_ylabel() == "top-1 − ResNet50 (points)"
    import matplotlib.pyplot as plt

    plt.close("all")


def test_the_concept_plots_points_are_visible_and_none_pale(figures):
    from PIL import Image

    px = np.asarray(Image.open(figures["concepts.png"]).convert("RGB")).astype(float) / 255
    hsv = np.array([colorsys.rgb_to_hsv(*c) for c in px.reshape(-1, 3)[::2]])
    vivid = hsv[(hsv[:, 1] > 0.3)]
    assert len(vivid) > 10_000  # a thousand points of some 25 px each (every other pixel)
    # No pale yellow: every coloured point is dark or saturated enough to read on white.
    light = (vivid[:, 2] > 0.8) & (vivid[:, 0] > 0.12) & (vivid[:, 0] < 0.2)
    assert light.mean() < 0.01


def test_the_analysis_figure_uses_its_tables_scale_one_precision_a_panel():
    from imagenet_cog.analysis import plot_analysis

    scores = {
        d: {"nmi": 0.8 - 0.05 * i, "sibling_rate": 1.0 if i == 0 else 0.25 + 0.1 * i}
        for i, d in enumerate(("IN-1K", "L1", "L2", "L3", "L4", "L5"))
    }
    fig = plot_analysis(scores)
    panels = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes if ax.texts}
    assert panels["Share of errors on a sibling (%)"][0] == "100.0"
    for texts in panels.values():
        assert len({len(t.split(".")[1]) for t in texts}) == 1, texts


# ------------------------------------------------------------------ LaTeX on a page
def _compile(tmp_path, body, options=""):
    doc = (
        f"\\documentclass{options}{{article}}\n\\usepackage{{booktabs,graphicx}}\n"
        f"\\begin{{document}}\n{body}\\end{{document}}\n"
    )
    (tmp_path / "t.tex").write_text(doc)
    run = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    log = (tmp_path / "t.log").read_text(errors="replace")
    return run.returncode, log


needs_pdflatex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex")


@needs_pdflatex
def test_the_papers_full_tables_fit_an_article_page(tmp_path):
    # The 31 models and two of the user's: 33 rows, nine columns, a footnote under each.
    both = _mine(("mobilenet_v2-b0353104", "resnet18-random")).compare(reference_results())
    code, log = _compile(tmp_path, both.to_latex())
    assert code == 0, log[-3000:]
    assert "Overfull" not in log and "Float too large" not in log, log[-3000:]
    assert "Underfull \\hbox" not in log


@needs_pdflatex
def test_a_subset_of_columns_and_the_two_column_form_fit_too(tmp_path):
    both = _mine(("mine",)).compare(reference_results(), models=["s-DINO", "a-DeiT-S"])
    code, log = _compile(tmp_path, both.to_latex(shots=[1, 16, "all"], domains=["L1", "L5"]))
    assert code == 0 and "Overfull" not in log, log[-3000:]
    wide = both.to_latex(float_env="table*")
    assert wide.count("\\begin{table*}") == 6
    code, log = _compile(tmp_path, wide, "[twocolumn]")
    assert code == 0 and "Overfull" not in log and "Float too large" not in log, log[-3000:]
