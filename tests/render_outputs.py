"""Every renderer's output on one fixed fixture, written to files, for a byte-for-byte
comparison of two versions of the library (a redesign that must change no output).

    python tests/render_outputs.py make FIXTURE           # once: two run folders, a store
    python tests/render_outputs.py render FIXTURE OUT     # with each version, then diff -r

``make`` writes, under FIXTURE: ``toy/`` (an ``evaluate`` run on synthetic features of IN-1K,
L1 and L5 labelled with real wnids, shots 1, 2 and all, two seeds, saved predictions) and
``store/`` with ``small/`` (a tiny IN-1K feature store of resnet18 with random weights and its
``evaluate`` run, saved predictions). ``render`` runs, with the version of the library on
``PYTHONPATH``, every analysis (``analyze`` in Python and on the command line, the analysis
table, its plot) into copies of the runs, and every reader of the results: the terminal
report, the tables, the comparison with the paper, the paired test, the CSV, JSON, Markdown
and LaTeX exports, the figures (PNG and SVG) and the HTML page. The page's date of making and
the analyses' timings are the only parts blanked: they differ from one minute to the next.

The fixture is made once and read by both versions, so only what renders it can differ.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np

FAST = {
    "n_trials": 2,
    "n_startup_trials": 2,
    "epochs": 3,
    "batch_size": 64,
    "device": "cpu",
    "progress": False,
}


def _domain(wnids, sep, seed, n_train=12, n_test=6, dim=10):
    rng = np.random.default_rng(seed)
    k = len(wnids)
    means = rng.normal(size=(k, dim)) * sep / np.sqrt(2)
    i_tr, i_te = np.repeat(np.arange(k), n_train), np.repeat(np.arange(k), n_test)

    def unit(x):
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    return (
        unit(means[i_tr] + rng.normal(size=(i_tr.size, dim))),
        np.asarray(wnids)[i_tr],
        unit(means[i_te] + rng.normal(size=(i_te.size, dim))),
        np.asarray(wnids)[i_te],
    )


def make(root):
    import torch

    from imagenet_cog import evaluate, extract, imagenet1k_wnids, load_levels

    sys.path.insert(0, str(Path(__file__).parent))
    from imagefiles import write_in1k

    torch.set_num_threads(1)
    root = Path(root)
    levels = load_levels("official")
    features = {
        "in1k": _domain(list(imagenet1k_wnids())[:5], 3.0, 0),
        "L1": _domain(levels["L1"][:5], 1.5, 1),
        "L5": _domain(levels["L5"][:5], 0.6, 2),
    }
    np.savez(
        root / "toy_features.npz",
        **{f"{d}_{i}": a for d, v in features.items() for i, a in enumerate(v)},
    )
    evaluate(
        features,
        domains=("in1k", "L1", "L5"),
        shots=(1, 2, "all"),
        seeds=(22, 37),
        out=root / "toy",
        save_predictions=True,
        model="toy",
        **FAST,
    )
    wnids, _ = write_in1k(root / "in1k", n_classes=3, n_train=8, n_val=2)
    for split in ("train", "test"):
        extract(
            "torchvision:resnet18",
            root / "in1k",
            "in1k",
            split,
            root / "store",
            wnids=wnids,
            preprocessing={"size": 32},
            batch_size=8,
            progress=False,
        )
    evaluate(
        root / "store",
        domains=("in1k",),
        shots=("all",),
        seeds=(22,),
        out=root / "small",
        save_predictions=True,
        **FAST,
    )


def _toy_features(root):
    data = np.load(Path(root) / "toy_features.npz")
    return {d: tuple(data[f"{d}_{i}"] for i in range(4)) for d in ("in1k", "L1", "L5")}


def _cli(argv, out, name):
    """Run the command line, writing its stdout, stderr and exit status to ``out/name.*``."""
    from imagenet_cog.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    (out / f"{name}.out").write_text(stdout.getvalue())
    (out / f"{name}.err").write_text(stderr.getvalue())
    (out / f"{name}.code").write_text(f"{code}\n")


def _blank(text):
    """The parts that change with the clock: the page's time of making, timings."""
    text = re.sub(r"on \d{4}-\d\d-\d\d \d\d:\d\d UTC", "on DATE", text)
    text = re.sub(r'"(seconds|\w+_seconds|time_s)": [0-9.e-]+', r'"\1": 0', text)
    return re.sub(r"<dc:date>[^<]*</dc:date>", "<dc:date/>", text)


def render(root, out):
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "render_outputs"  # the same ids in every run
    import torch

    from imagenet_cog import Results, reference_results
    from imagenet_cog.analysis import analyze

    torch.set_num_threads(1)
    root, out = Path(root), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # The analyses, into copies of the runs (their analysis.json is what the readers read).
    toy, small = out / "runs" / "toy", out / "runs" / "small"
    shutil.rmtree(out / "runs", ignore_errors=True)
    shutil.copytree(root / "toy", toy)
    shutil.copytree(root / "small", small)
    report = analyze(
        _toy_features(root),
        out=toy,
        analyses=("clusters", "alignment", "semantic", "pca", "mlp", "mlp_noact"),
        predictions=toy,
        device="cpu",
        pca_components=(2, 4, 8),
        probe_seeds=(22, 37),
        probe_kw={"n_trials": 2, "n_startup_trials": 2, "epochs": 3, "batch_size": 32},
    )
    (out / "analysis_table.txt").write_text(report.table() + "\n" + repr(report) + "\n")
    (out / "analysis_report.json").write_text(
        _blank(json.dumps(report.to_dict(), indent=1, sort_keys=True, default=str))
    )
    for domain, probes in report.probe_scores.items():
        for name, scores in probes.items():
            (out / f"probe_{domain}_{name}.txt").write_text(scores.table() + "\n")
    report.plot(out / "analysis_toy.png")
    report.plot(out / "analysis_toy.svg")
    _cli(
        [
            "analyze",
            str(root / "store"),
            "--predictions",
            str(small),
            "--device",
            "cpu",
            "--plot",
            str(out / "analysis_small.png"),
            "--top-k",
            "2",
        ],
        out,
        "cli_analyze_store",
    )
    _cli(
        [
            "analyze",
            str(toy),
            "--out",
            str(out / "semantic_only"),
            "--semantic-seed",
            "mean",
            "--concepts",
            "--plot",
            str(out / "semantic_only" / "analysis.png"),
        ],
        out,
        "cli_analyze_predictions",
    )
    for run in (toy, small):
        (out / f"analysis_{run.name}.json").write_text(_blank((run / "analysis.json").read_text()))
    # Results in Python: every table, export and figure.
    res = Results.load(toy).merge(Results.load(small))
    paper = res.compare(reference_results(), baseline="ResNet50")
    texts = {
        "repr": repr(res),
        "report": res.report(),
        "report_top5": res.report(metric="top5", digits=2),
        "table_L5": res.table(domain="L5"),
        "table_1shot": res.table(shots=1, with_std=False),
        "relative": res.relative_to("toy").report(),
        "ranks": json.dumps(paper.ranks()),
        "analysis_table": res.analysis_table(),
        "comparison_report": paper.comparison_report(),
        "compare_models": paper.compare_models("toy", "ResNet50"),
        "paired": repr(paper.paired_difference("toy", "ResNet50", "L5")),
        "relative_change": repr(res.relative_change("toy")),
        "summary": json.dumps(res.summary(), default=str),
        "csv": res.to_csv(),
        "json": _blank(res.to_json()),
        "markdown": res.to_markdown(),
        "latex": res.to_latex(),
        "latex_paper": paper.to_latex(domains=["L1", "L5"], shots=["all", 1]),
        "html": _blank(res.to_html()),
        "html_alone": _blank(res.to_html(reference=False)),
        "html_compare": _blank(paper.to_html(compare=("toy", "ResNet50"), shots=1)),
        "html_paper": _blank(reference_results(["ResNet50", "s-DINO"]).to_html()),
    }
    for name, text in texts.items():
        (out / f"results_{name}.txt").write_text(text)
    paper.plot(out / "figures", baseline="ResNet50", formats=("png", "svg"))
    res.plot(out / "figures_mine", formats=("png",))
    # The command line's reports.
    runs = [str(toy), str(small)]
    _cli(["report", *runs], out, "cli_report")
    _cli(["report", *runs, "--reference", "paper"], out, "cli_report_paper")
    _cli(
        ["report", *runs, "--reference", "paper", "--full", "--models", "s-DINO"],
        out,
        "cli_report_full",
    )
    _cli(["report", *runs, "--baseline", "toy"], out, "cli_report_baseline")
    for form in ("md", "csv", "json", "latex"):
        _cli(["report", *runs, "--format", form], out, f"cli_report_{form}")
    _cli(["report", *runs, "--compare", "toy,resnet18-random"], out, "cli_report_compare")
    _cli(
        [
            "report",
            *runs,
            "--reference",
            "paper",
            "--html",
            str(out / "cli.html"),
            "--compare",
            "toy,ResNet50",
            "--plot",
            str(out / "cli_figures"),
            "--plot-format",
            "png,svg",
        ],
        out,
        "cli_report_html",
    )
    _cli(["report", "--reference", "paper", "--models", "s-DINO"], out, "cli_report_paper_only")
    _cli(["verify", *runs], out, "cli_verify")
    for path in [*out.rglob("*.html"), *out.rglob("*.svg"), *out.rglob("*.json")]:
        if "runs" not in path.relative_to(out).parts:
            path.write_text(_blank(path.read_text()))
    for path in out.rglob("*"):  # the output folder, wherever it was rendered
        if "runs" in path.relative_to(out).parts:
            continue
        if path.is_file() and path.suffix in (".out", ".err", ".txt", ".html", ".json"):
            path.write_text(path.read_text().replace(str(out), "OUT"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"]:
        Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
        make(sys.argv[2])
    elif sys.argv[1:2] == ["render"]:
        render(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
