"""evaluate(save_predictions=True) → analyze() → analysis.json → Results, and the commands."""

import json

import numpy as np
import pytest
import torch

from imagenet_cog import Results, evaluate, imagenet1k_wnids
from imagenet_cog._optional_dependencies import INSTALLED
from imagenet_cog.analysis import (
    AnalysisReport,
    analyze,
    load_predictions,
    semantic_errors,
)

FAST = {
    "n_trials": 2,
    "n_startup_trials": 2,
    "epochs": 4,
    "batch_size": 64,
    "device": "cpu",
    "progress": False,
}
#: Real IN-1K wnids, so the WordNet error analysis can place every label.
WNIDS = list(imagenet1k_wnids())[:6]


pytestmark = pytest.mark.usefixtures("one_thread")


def domain(sep, seed, n_train=20, n_test=10, dim=12):
    """l2-normalised Gaussian classes labelled with IN-1K wnids."""
    rng = np.random.default_rng(seed)
    k = len(WNIDS)
    means = rng.normal(size=(k, dim)) * sep / np.sqrt(2)
    i_tr, i_te = np.repeat(np.arange(k), n_train), np.repeat(np.arange(k), n_test)

    def unit(x):
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    X_tr = unit(means[i_tr] + rng.normal(size=(i_tr.size, dim)))
    X_te = unit(means[i_te] + rng.normal(size=(i_te.size, dim)))
    return X_tr, np.asarray(WNIDS)[i_tr], X_te, np.asarray(WNIDS)[i_te]


@pytest.fixture(scope="module")
def features():
    return {"in1k": domain(3.0, 0), "L5": domain(0.6, 1)}


@pytest.fixture(scope="module")
def run(features, tmp_path_factory):
    """An evaluate output folder with saved predictions (two seeds, two shots)."""
    out = tmp_path_factory.mktemp("run")
    torch.set_num_threads(1)
    res = evaluate(
        features,
        domains=("in1k", "L5"),
        shots=(2, "all"),
        seeds=(22, 37),
        out=out,
        save_predictions=True,
        model="toy",
        **FAST,
    )
    return out, res


# ----------------------------------------------------------------------- predictions
def test_evaluate_saves_predictions_that_load_without_pickle(run, features):
    out, res = run
    files = sorted(p.name for p in (out / "predictions").iterdir())
    assert files == [
        f"{d}__{s}__{seed}.npz" for d in ("L5", "in1k") for s in (2, "all") for seed in (22, 37)
    ]
    for rec in res.records:
        path = out / rec["predictions"]
        assert (
            rec["predictions"] == f"predictions/{rec['domain']}__{rec['shots']}__{rec['seed']}.npz"
        )
        with np.load(path, allow_pickle=False) as z:
            assert sorted(z.files) == ["classes", "top5", "y_pred", "y_true"]
            y_true, y_pred, top5, classes = z["y_true"], z["y_pred"], z["top5"], z["classes"]
        assert y_true.dtype.kind == y_pred.dtype.kind == classes.dtype.kind == "U"
        assert top5.dtype.kind == "i" and top5.shape == (len(y_true), 5)
        assert classes.tolist() == sorted(WNIDS)
        np.testing.assert_array_equal(y_pred, classes[top5[:, 0]])
        np.testing.assert_array_equal(y_true, features[rec["domain"]][3])
        # The saved predictions are the final model's: they give its recorded accuracy.
        assert 100 * np.mean(y_true == y_pred) == pytest.approx(rec["top1"], abs=1e-9)
        top5_acc = 100 * np.mean((classes[top5] == y_true[:, None]).any(1))
        assert top5_acc == pytest.approx(rec["top5"], abs=1e-9)
    assert not list((out / "predictions").glob(".*"))  # no temporary file left behind
    p = load_predictions(out, "L5")
    assert p["seed"] == 22 and p["path"].endswith("L5__all__22.npz")
    with pytest.raises(FileNotFoundError, match=r"no predictions for L5 N=4"):
        load_predictions(out, "L5", shots=4)
    with pytest.raises(FileNotFoundError, match="seed 99"):
        load_predictions(out, "L5", seed=99)


def test_save_predictions_needs_an_out_folder(features):
    with pytest.raises(ValueError, match="needs an out folder"):
        evaluate(
            features, domains=("in1k",), shots=("all",), seeds=(22,), save_predictions=True, **FAST
        )


def test_resuming_with_save_predictions_warns_about_cells_without_them(features, tmp_path):
    small = {"in1k": features["in1k"]}
    kw = {"domains": ("in1k",), "shots": ("all",), "out": tmp_path, **FAST}
    evaluate(small, seeds=(22,), **kw)
    with pytest.warns(UserWarning, match=r"1 cell\(s\) already in .* ran without save_predictions"):
        res = evaluate(small, seeds=(22, 37), save_predictions=True, **kw)
    assert [r.get("predictions") for r in res.records] == [None, "predictions/in1k__all__37.npz"]


# --------------------------------------------------------------------------- analyze
def test_analyze_writes_json_table_and_plot_and_results_show_it(run, features, tmp_path):
    out, _ = run
    report = analyze(features, out=out, predictions=out, device="cpu")
    assert isinstance(report, AnalysisReport) and report.model == "toy"  # from config.json
    text = (out / "analysis.json").read_text()
    payload = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in analysis.json"))
    assert set(payload) == {
        "format",
        "format_version",
        "model",
        "domains",
        "semantic",
        "settings",
        "inputs",
        "analysis_sha256",
    }
    assert (payload["format"], payload["format_version"]) == ("imagenet_cog.analysis", 3)
    assert list(payload["inputs"]["predictions"]) == [
        "predictions/in1k__all__22.npz",
        "predictions/L5__all__22.npz",
    ]
    assert list(payload["domains"]) == ["in1k", "L5"]
    for values in payload["domains"].values():
        for m in (
            "purity",
            "nmi",
            "ami",
            "ari",
            "alignment",
            "uniformity",
            "path",
            "wup",
            "sibling_rate",
        ):
            assert isinstance(values[m], float)
    dom = payload["domains"]
    assert dom["in1k"]["nmi"] > dom["L5"]["nmi"]  # better separated concepts cluster better
    assert dom["in1k"]["alignment"] < dom["L5"]["alignment"]
    sem = payload["semantic"]["L5"]
    assert sem["seeds"] == [22] and sem["shots"] == "all"
    assert sem["top_confusions"] and "explanation" in sem["top_confusions"][0]
    # The summary is semantic_errors of the lowest seed's all-data predictions.
    p = load_predictions(out, "L5", seed=22)
    direct = semantic_errors(p["y_true"], p["y_pred"])
    assert sem["overall"]["n_errors"] == direct.overall["n_errors"]
    assert dom["L5"]["wup"] == pytest.approx(direct.overall["wup"])
    assert report.errors["L5"].overall["n_errors"] == direct.overall["n_errors"]
    assert payload["settings"]["skipped"] == {}

    table = report.table()
    lines = table.splitlines()
    assert lines[0] == "analysis of toy"
    assert lines[1].split()[:5] == ["domain", "purity", "NMI", "AMI", "ARI"]
    assert "Δalign" in lines[1] and "Δunif" in lines[1] and "sib%" in lines[1]
    assert lines[2].startswith("IN-1K") and lines[3].startswith("L5")

    png = tmp_path / "analysis.png"
    fig = report.plot(png)
    assert png.stat().st_size > 10_000
    assert "Alignment (lower: tighter concepts)" in [ax.get_title() for ax in fig.axes]

    loaded = Results.load(out)
    assert loaded.meta["analysis"]["toy"]["domains"] == payload["domains"]
    assert loaded.analysis_table() == table
    with pytest.raises(ValueError, match="no analysis loaded"):
        Results([{"model": "m", "domain": "in1k", "shots": "all", "top1": 1.0}]).analysis_table()


def test_analyze_semantic_only_from_predictions_and_averaged_over_seeds(run):
    out, _ = run
    first = analyze(predictions=out)
    assert list(first.domains) == ["in1k", "L5"]
    assert set(first.domains["L5"]) == {
        "path",
        "lch",
        "wup",
        "sibling_rate",
        "hypernym_rate",
        "hyponym_rate",
    }
    assert first.settings["skipped"] == {
        "clusters": "no features given",
        "alignment": "no features given",
    }
    mean = analyze(predictions=out / "predictions", semantic_seed="mean", domains=["L5"])
    assert mean.semantic["L5"]["seeds"] == [22, 37]
    e22 = semantic_errors(
        *(load_predictions(out, "L5", seed=s)[k] for s in [22] for k in ("y_true", "y_pred"))
    )
    e37 = semantic_errors(*(load_predictions(out, "L5", seed=37)[k] for k in ("y_true", "y_pred")))
    want = (e22.overall["path"] + e37.overall["path"]) / 2
    assert mean.domains["L5"]["path"] == pytest.approx(want)
    few = analyze(predictions=out, shots=2, semantic_seed=37, domains=["in1k"])
    assert few.semantic["in1k"]["seeds"] == [37] and few.semantic["in1k"]["shots"] == 2


def test_analyze_rejects_what_it_cannot_do(features, tmp_path):
    with pytest.raises(ValueError, match="unknown analyses"):
        analyze(features, analyses=("clusters", "tsne"))
    with pytest.raises(ValueError, match="nothing to compute"):
        analyze(features, analyses=("semantic",))
    with pytest.raises(ValueError, match=r"no features for domain\(s\) \['L1'\]"):
        analyze(features, domains=["L1"], device="cpu")
    with pytest.raises(FileNotFoundError, match="no saved predictions"):
        analyze(features, predictions=tmp_path, device="cpu")
    with pytest.raises(ValueError, match="semantic_seed"):
        analyze(features, semantic_seed="best")


def test_analyze_can_run_the_pca_and_mlp_probes(features):
    small = {"in1k": features["in1k"]}
    report = analyze(
        small,
        analyses=("pca", "mlp_noact"),
        device="cpu",
        probe_seeds=(22,),
        pca_components=(4, 12, 64),
        probe_kw={"n_trials": 2, "n_startup_trials": 2, "epochs": 3},
    )
    row = report.domains["in1k"]
    assert set(row) == {"pca4_top1", "pca12_top1", "mlp_noact_top1"}  # 64 > 12 features: left out
    assert report.probe_scores["in1k"]["pca"].settings == [4, 12]
    assert report.to_dict()["probes"]["in1k"]["mlp_noact"]["probe"] == "mlp_noact"
    json.dumps(report.to_dict(), allow_nan=False)


# --------------------------------------------------------------------------- commands
def test_analyze_command_on_a_store_and_on_predictions(tmp_path, capsys, tiny_in1k_store):
    from imagenet_cog.cli import main

    store = tiny_in1k_store().store
    run = tmp_path / "run"
    assert (
        main(
            [
                "evaluate",
                str(store),
                "--out",
                str(run),
                "--domains",
                "in1k",
                "--shots",
                "all",
                "--seeds",
                "22",
                "--trials",
                "2",
                "--epochs",
                "3",
                "--device",
                "cpu",
                "--quiet",
                "--save-predictions",
            ]
        )
        == 0
    )
    assert (run / "predictions" / "in1k__all__22.npz").is_file()
    capsys.readouterr()

    png = tmp_path / "a.png"
    code = main(
        [
            "analyze",
            str(store),
            "--predictions",
            str(run),
            "--device",
            "cpu",
            "--plot",
            str(png),
            "--top-k",
            "2",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("analysis of resnet18-random\n")
    assert "NMI" in captured.out and "in1k:" in captured.out
    assert png.stat().st_size > 0
    payload = json.loads((run / "analysis.json").read_text())  # default: beside the results
    assert set(payload["domains"]["in1k"]) >= {"purity", "alignment", "wup"}
    # The k-means that ran is named: faiss's Lloyd iterations when installed, else sklearn's.
    assert payload["domains"]["in1k"]["backend"] == ("faiss" if INSTALLED["faiss"] else "sklearn")

    # An evaluate folder alone: the error analysis only.
    assert main(["analyze", str(run), "--out", str(tmp_path / "sem")]) == 0
    captured = capsys.readouterr()
    assert "sib%" in captured.out and "NMI" not in captured.out
    assert "skipped clusters: no features given" in captured.err
    assert set(json.loads((tmp_path / "sem" / "analysis.json").read_text())["domains"]["in1k"]) == {
        "path",
        "lch",
        "wup",
        "sibling_rate",
        "hypernym_rate",
        "hyponym_rate",
    }

    # The store alone: clusters and alignment, analysis.json in the store.
    assert main(["analyze", str(store), "--analyses", "alignment", "--device", "cpu"]) == 0
    assert "align" in capsys.readouterr().out
    assert (store / "analysis.json").is_file()

    # The probes on request, with their own table.
    assert (
        main(
            [
                "analyze",
                str(store),
                "--analyses",
                "mlp_noact",
                "--device",
                "cpu",
                "--probe-seeds",
                "22",
                "--probe-trials",
                "1",
                "--probe-epochs",
                "1",
                "--out",
                str(tmp_path / "probes"),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "mlp_noact_top1" in printed and "in1k: mlp_noact probe, test accuracy" in printed

    # report shows the analysis beside the accuracy tables.
    assert main(["report", str(run)]) == 0
    assert "analysis of resnet18-random" in capsys.readouterr().out

    assert main(["analyze", str(tmp_path / "in1k")]) == 2
    assert "neither a feature-store root" in capsys.readouterr().err
