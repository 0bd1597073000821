"""The table of analyses: a new analysis is its row, and analyze, the text table, the JSON
export and the HTML report show it with no other edit; each row gives the measures it
declares."""

import json
import re

import numpy as np
import pytest
from helpers import write_run_folder

from imagenet_cog import Results, imagenet1k_wnids
from imagenet_cog._analysis.table import (
    _BOOKKEEPING,
    ANALYSES,
    Analysis,
    Measure,
    Outcome,
    find_measure,
)
from imagenet_cog._runfolder import PREDICTIONS_DIR, write_predictions
from imagenet_cog.analysis import analyze

WNIDS = list(imagenet1k_wnids())[:4]

pytestmark = pytest.mark.usefixtures("one_thread")


def _domain(sep, seed, n_train=12, n_test=6, dim=8):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(len(WNIDS), dim)) * sep
    i_tr, i_te = np.repeat(np.arange(len(WNIDS)), n_train), np.repeat(np.arange(len(WNIDS)), n_test)
    X_tr = (means[i_tr] + rng.normal(size=(i_tr.size, dim))).astype(np.float32)
    X_te = (means[i_te] + rng.normal(size=(i_te.size, dim))).astype(np.float32)
    return X_tr, np.asarray(WNIDS)[i_tr], X_te, np.asarray(WNIDS)[i_te]


FEATURES = {"in1k": _domain(3.0, 0), "L5": _domain(0.5, 1)}


def _norms(data, options):
    _, _, X_test, _ = data.features
    return Outcome({"norm": float(np.linalg.norm(X_test, axis=1).mean())})


#: A toy analysis: its row is all there is of it.
NORMS = Analysis(
    "norms",
    "Norms of the test features",
    "features",
    (
        Measure(
            "norm",
            "Mean norm of the test features",
            "mean l2 norm of the test features",
            better=None,
            header="norm",
        ),
    ),
    _norms,
)


def _run_folder(tmp_path):
    cells = [
        {"model": "toy", "domain": d, "shots": "all", "seed": s, "top1": 50.0 + s / 100}
        for d in FEATURES
        for s in (22, 37)
    ]
    return write_run_folder(tmp_path / "run", {"model": "toy"}, cells)


def test_a_new_row_is_in_analyze_the_tables_the_json_export_and_the_html_page(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(ANALYSES, "norms", NORMS)
    run = _run_folder(tmp_path)
    report = analyze(FEATURES, out=run, analyses=("alignment", "norms"), device="cpu")
    expected = {d: float(np.linalg.norm(f[2], axis=1).mean()) for d, f in FEATURES.items()}
    assert report.domains["L5"]["norm"] == pytest.approx(expected["L5"])
    assert report.settings["analyses"] == ["alignment", "norms"]
    table = report.table()
    assert table.splitlines()[1].split() == ["domain", "align", "Δalign", "unif", "Δunif", "norm"]
    assert f"{expected['in1k']:.3f}" in table.splitlines()[2]
    saved = json.loads((run / "analysis.json").read_text())
    assert saved["domains"]["in1k"]["norm"] == pytest.approx(expected["in1k"])

    results = Results.load(run)
    assert "norm" in results.analysis_table().splitlines()[1].split()
    exported = json.loads(results.to_json())["meta"]["analysis"]["toy"]["domains"]
    assert exported["L5"]["norm"] == pytest.approx(expected["L5"])

    page = results.to_html(reference=False)
    section = re.search(r'<section id="analyses">.*?</section>', page, re.DOTALL)[0]
    assert '<a href="#analyses">analyses</a>' in page
    assert (
        '<th title="Mean norm of the test features: Mean l2 norm of the test features.">norm'
        "</th>" in section
    )
    assert f'<td data-sort="{round(expected["L5"], 6)}">{expected["L5"]:.3f}</td>' in section
    assert "Norms of the test features (<code>norms</code>)" in section
    assert "Alignment and uniformity" in section and "lower is better" in section


def test_a_page_without_analyses_has_no_section_of_them(tmp_path):
    page = Results.load(_run_folder(tmp_path)).to_html(reference=False)
    assert 'id="analyses"' not in page and "#analyses" not in page


def test_a_new_row_is_offered_by_the_command_line(monkeypatch, capsys):
    from imagenet_cog.cli import main

    monkeypatch.setitem(ANALYSES, "norms", NORMS)
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    assert "mlp_noact, norms" in " ".join(capsys.readouterr().out.split())


def test_every_row_gives_the_measures_it_declares(tmp_path):
    # Every analysis of the table on two domains, with saved predictions for the semantic
    # one: each domain's row holds exactly the measures the rows declare.
    folder = tmp_path / PREDICTIONS_DIR
    rng = np.random.default_rng(3)
    for domain, (_, _, _, y_test) in FEATURES.items():
        y_pred = np.where(rng.random(y_test.size) < 0.3, np.roll(y_test, 1), y_test)
        write_predictions(
            folder,
            domain,
            "all",
            22,
            y_true=y_test,
            y_pred=y_pred,
            top5=np.zeros((y_test.size, 1), dtype=np.int32),
            classes=np.array(WNIDS),
        )
    report = analyze(
        FEATURES,
        analyses=list(ANALYSES),
        predictions=tmp_path,
        device="cpu",
        pca_components=(2, 4),
        probe_seeds=(22,),
        probe_kw={"n_trials": 2, "n_startup_trials": 2, "epochs": 2, "batch_size": 16},
    )
    for domain, row in report.domains.items():
        declared = [m for a in ANALYSES.values() for m in a.measures]
        found = [find_measure(k) for k in row if k not in _BOOKKEEPING]
        assert None not in found, (domain, row)
        fixed = {m.key for m in declared if not m.is_family}
        assert fixed <= set(row), (domain, fixed - set(row))
        assert {k for k in row if k.startswith("pca")} == {"pca2_top1", "pca4_top1"}
    assert set(report.probe_scores["L5"]) == {"pca", "mlp", "mlp_noact"}
    assert set(report.errors) == set(FEATURES)
    assert report.settings["definitions"] == {
        "purity": ANALYSES["clusters"].measures[0].definition,
        "alignment": ANALYSES["alignment"].measures[0].definition,
        "uniformity": ANALYSES["alignment"].measures[1].definition,
        "semantic": ANALYSES["semantic"].definition,
    }
