"""Results bound to what made them: records against their config.json, and each against itself.

The cases of a results folder that says more than it can: another run's runs.jsonl copied in,
a config.json edited after the run, an accuracy edited by hand. ``Results.load``,
``comparability``, ``imagenet-cog report``, a resumed ``evaluate`` and ``imagenet-cog verify``
each refuse or flag them, naming the file and the line.
"""

import json
import shutil

import numpy as np
import pytest
from test_protocol import FAST, synthetic_domain

from imagenet_cog import Results, comparability, evaluate
from imagenet_cog.cli import main

KW = {"domains": ("L1",), "shots": ("all",), "seeds": (22, 37)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(full, test, features of the full run)``: two run folders of one model, a "full" one
    and a 2-epoch, 10-class test run."""
    base = tmp_path_factory.mktemp("runs")
    feats = {"L1": synthetic_domain(1.5, n_classes=8, seed=1)}
    evaluate(feats, out=base / "full", **KW, **FAST)
    small = {"L1": synthetic_domain(1.5, n_classes=10, n_train=10, seed=2)}
    evaluate(small, out=base / "test", **KW, **{**FAST, "epochs": 2})
    return base / "full", base / "test", feats


def _copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def _lines(folder):
    return [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines()]


def _write_lines(folder, records):
    (folder / "runs.jsonl").write_text(
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    )


def test_a_run_loads_and_verifies(runs, tmp_path, capsys):
    full, _, _ = runs
    config = json.loads((full / "config.json").read_text())
    assert len(config["config_sha256"]) == 64
    assert all(len(r["record_sha256"]) == 64 for r in _lines(full))
    assert all(r["config_hash"] == config["config_hash"] for r in _lines(full))
    assert len(Results.load(full).records) == 2
    assert main(["verify", str(full)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{full}: config.json and its 2 records match what made them")
    assert "not checked" not in out


def test_verify_without_config_json_claims_no_match_it_did_not_check(runs, tmp_path, capsys):
    # Without config.json nothing binds the records to what made them: verify says what it
    # checked (each record against its own checksum) and what it could not, never "match".
    full, _, _ = runs
    bare = tmp_path / "bare"
    bare.mkdir()
    _write_lines(bare, [{k: v for k, v in r.items() if k != "record_sha256"} for r in _lines(full)])
    assert main(["verify", str(bare)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"{bare}: no config.json, and none of its 2 records carries a checksum: nothing to "
        "check them against"
    )
    assert "match what made them" not in "\n".join(out)
    sealed = tmp_path / "sealed"
    sealed.mkdir()
    shutil.copy(full / "runs.jsonl", sealed / "runs.jsonl")
    assert main(["verify", str(sealed)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"{sealed}: no config.json; its 2 records match their own checksums (nothing binds "
        "them to a configuration)"
    )


def test_another_runs_records_copied_in_are_refused(runs, tmp_path, capsys):
    full, test, feats = runs
    folder = _copy(full, tmp_path / "full")
    shutil.copy(test / "runs.jsonl", folder / "runs.jsonl")
    bound = json.loads((full / "config.json").read_text())["config_hash"]
    other = _lines(test)[0]["config_hash"]
    line = (
        f"{folder / 'runs.jsonl'}:1: made by another configuration (config_hash {other}, "
        f"config.json has {bound})"
    )
    with pytest.raises(ValueError, match="does not match what made it") as err:
        Results.load(folder)
    assert line in str(err.value) and f"imagenet-cog verify {folder}" in str(err.value)
    # The report refuses it too, in one line.
    assert main(["report", str(folder)]) == 2
    assert line in capsys.readouterr().err
    # A resumed evaluate does not return the test run's records as its own.
    with pytest.raises(
        ValueError, match=r"holds records that do not match its config\.json"
    ) as err:
        evaluate(feats, out=folder, **KW, **FAST)
    assert line in str(err.value)
    assert main(["verify", str(folder)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{folder}: 2 mismatches in 2 records and their config.json:"
    assert printed[1] == f"  {line}" and printed[2].startswith(f"  {folder / 'runs.jsonl'}:2:")


def test_an_edited_config_is_detected(runs, tmp_path, capsys):
    full, _, feats = runs
    folder = _copy(full, tmp_path / "full")
    config = json.loads((folder / "config.json").read_text())
    config["protocol"]["epochs"] = 100  # hides a deviation from the paper
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    message = (
        f"{folder / 'config.json'} was edited after the run wrote it (its contents do not "
        "match its checksum config_sha256)"
    )
    with pytest.raises(ValueError, match="does not match what made it") as err:
        Results.load(folder)
    assert message in str(err.value)
    # Resuming with the settings the edited file states is refused too.
    with pytest.raises(ValueError, match="was edited after the run wrote it"):
        evaluate(feats, out=folder, **KW, **{**FAST, "epochs": 100})
    assert main(["verify", str(folder)]) == 1
    assert f"  {message}" in capsys.readouterr().out.splitlines()


def test_an_accuracy_edited_by_hand_is_detected(runs, tmp_path, capsys):
    full, _, feats = runs
    folder = _copy(full, tmp_path / "full")
    records = _lines(folder)
    records[1]["top1"] += 7.4
    _write_lines(folder, records)
    message = (
        f"{folder / 'runs.jsonl'}:2: edited after it was written (its contents do not "
        "match its checksum record_sha256)"
    )
    with pytest.raises(ValueError, match="does not match what made it") as err:
        Results.load(folder)
    assert message in str(err.value)
    with pytest.raises(ValueError, match="holds records that do not match"):
        evaluate(feats, out=folder, **KW, **FAST)
    assert main(["verify", str(folder)]) == 1
    assert capsys.readouterr().out.splitlines()[1:] == [f"  {message}"]


def test_a_run_relabelled_as_another_model_is_detected_and_a_rename_is_not(runs, tmp_path):
    full, _, _ = runs
    folder = _copy(full, tmp_path / "full")
    _write_lines(folder, [{**r, "model": "s-DINO"} for r in _lines(full)])
    with pytest.raises(ValueError, match="does not match what made it") as err:
        Results.load(folder)
    assert f"{folder / 'runs.jsonl'}:1: edited after it was written" in str(err.value)
    # Renaming what Results.load returns leaves the file, and its checksums, as they are.
    renamed = Results.load(full, model="renamed")
    assert renamed.models == ["renamed"]
    assert not any(
        "edited" in x for x in comparability(renamed, by_model=True)["renamed"]["deviations"]
    )


def test_comparability_flags_cells_that_do_not_match_their_run(runs):
    full, test, _ = runs
    run = Results.load(full)
    assert not any("configuration" in x or "edited" in x for x in comparability(run))
    other = Results.load(test)
    mixed = Results(run.records + [{**r, "seed": 45} for r in other.records], meta=run.meta)
    found = comparability(mixed, by_model=True)["model"]["deviations"]
    bound = run.records[0]["config_hash"]
    assert (
        f"2 of its 4 cells were made by another configuration than its config.json "
        f"(config_hash {other.records[0]['config_hash']}; config.json has {bound})"
    ) in found
    edited = Results([{**run.records[0], "top1": 99.0}, run.records[1]], meta=run.meta)
    assert (
        "1 of its 2 cells were edited after they were written (their contents do not "
        "match their checksums)"
    ) in comparability(edited, by_model=True)["model"]["deviations"]


def test_a_deleted_checksum_hides_no_edit(runs, tmp_path, capsys):
    full, _, feats = runs
    folder = _copy(full, tmp_path / "full")
    config = json.loads((folder / "config.json").read_text())
    config["protocol"]["epochs"] = 100  # hides a deviation from the paper...
    del config["config_sha256"]  # ...and the checksum that would tell
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    removed = (
        f"{folder / 'config.json'} carries no checksum config_sha256, which this format always "
        "writes (removed by hand?)"
    )
    with pytest.raises(ValueError, match="does not match what made it") as err:
        Results.load(folder)
    assert removed in str(err.value)
    with pytest.raises(ValueError, match=r"holds records that do not match its config\.json"):
        evaluate(feats, out=folder, **KW, **{**FAST, "epochs": 100})
    assert main(["verify", str(folder)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert f"  {removed}" in printed
    # The configuration hash is recomputed: the one the records carry is not the edited file's.
    assert any(
        "its config_hash" in x and "is not the hash of its configuration" in x for x in printed
    )
    # A record's checksum removed after an edit is a mismatch too.
    folder = _copy(full, tmp_path / "records")
    records = _lines(folder)
    records[1]["top1"] = 99.0
    del records[1]["record_sha256"]
    _write_lines(folder, records)
    assert main(["verify", str(folder)]) == 1
    assert capsys.readouterr().out.splitlines()[1:] == [
        (
            f"  {folder / 'runs.jsonl'}:2: carries no checksum record_sha256, which this format "
            "always writes (removed by hand?)"
        )
    ]


def test_a_config_edited_with_its_checksum_recomputed_is_caught_by_its_hash(runs, tmp_path):
    from imagenet_cog._runfolder import config_checksum

    full, _, _ = runs
    folder = _copy(full, tmp_path / "full")
    config = json.loads((folder / "config.json").read_text())
    config["protocol"]["epochs"] = 100
    config["config_sha256"] = config_checksum(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="does not match what made it") as err:
        Results.load(folder)
    assert (
        f"{folder / 'config.json'}: its config_hash {config['config_hash']} is not the hash "
        in (str(err.value))
    )


# ------------------------------------------------------------- saved predictions
@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    """A run folder with the saved predictions of four concepts of the official L1."""
    from imagenet_cog import load_levels

    wnids = np.array(load_levels("official")["L1"][:4])
    X_tr, y_tr, X_te, y_te = synthetic_domain(1.5, n_classes=4, n_train=20, n_test=10)
    as_wnid = {f"n{c:08d}": wnids[c] for c in range(4)}
    labels = [np.array([as_wnid[y] for y in ys]) for ys in (y_tr, y_te)]
    out = tmp_path_factory.mktemp("predicted") / "run"
    feats = {"L1": (X_tr, labels[0], X_te, labels[1])}
    evaluate(feats, out=out, **{**KW, "seeds": (22,)}, save_predictions=True, **FAST)
    return out


def test_predictions_edited_by_hand_are_refused_by_verify_and_every_reader(
    predicted, tmp_path, capsys
):
    from imagenet_cog.analysis import load_predictions

    folder = _copy(predicted, tmp_path / "run")
    file = folder / "predictions" / "L1__all__22.npz"
    assert main(["verify", str(folder)]) == 0
    capsys.readouterr()
    with np.load(file) as z:
        arrays = dict(z)
    arrays["y_pred"] = arrays["y_true"]  # every prediction right
    np.savez(file, **arrays)
    line = (
        f"{file} was changed after the run wrote it (its sha256 is not the one runs.jsonl:1 holds)"
    )
    assert main(["verify", str(folder)]) == 1
    assert f"  {line}" in capsys.readouterr().out.splitlines()
    refused = f"{line}: its predictions cannot be trusted; rerun the cell"
    with pytest.raises(ValueError) as err:
        load_predictions(folder, "L1")
    assert str(err.value) == refused
    assert main(["analyze", str(folder), "--analyses", "semantic", "--concepts"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"imagenet-cog: error: {refused}"]


def test_a_cut_predictions_file_is_one_line(predicted, tmp_path, capsys):
    from imagenet_cog.analysis import concept_accuracy

    folder = _copy(predicted, tmp_path / "run")
    file = folder / "predictions" / "L1__all__22.npz"
    file.write_bytes(file.read_bytes()[:300])  # a copy stopped early
    assert main(["analyze", str(folder), "--analyses", "semantic", "--concepts"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"imagenet-cog: error: {file} was changed after")
    # The same file in a folder of predictions alone (no record to check it against).
    alone = tmp_path / "alone" / "predictions"
    shutil.copytree(folder / "predictions", alone)
    with pytest.raises(ValueError) as caught:
        concept_accuracy(alone, "official")
    assert str(caught.value) == (
        f"{alone / file.name}: not a readable predictions file (File is not a zip file); cut "
        "short, or not written by evaluate: rerun the cell"
    )


def test_analysis_json_is_bound_to_itself_and_to_the_predictions_it_read(
    predicted, tmp_path, capsys
):
    folder = _copy(predicted, tmp_path / "run")
    assert main(["analyze", str(folder), "--analyses", "semantic"]) == 0
    capsys.readouterr()
    path = folder / "analysis.json"
    payload = json.loads(path.read_text())
    assert payload["inputs"] == {
        "predictions": {
            "predictions/L1__all__22.npz": _lines(folder)[0]["predictions_sha256"],
        }
    }
    assert main(["verify", str(folder)]) == 0
    capsys.readouterr()
    payload["domains"]["L1"]["wup"] = 0.99
    path.write_text(json.dumps(payload))
    line = f"{path} was edited after analyze wrote it (its contents do not match its checksum)"
    assert main(["verify", str(folder)]) == 1
    assert f"  {line}" in capsys.readouterr().out.splitlines()
    with pytest.raises(ValueError) as err:
        Results.load(folder)
    assert str(err.value) == f"{line}; its numbers cannot be trusted: run analyze again"
    assert main(["report", str(folder)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"imagenet-cog: error: {line}; its numbers cannot be trusted: run analyze again"
    ]


# ---------------------------------------------------------- versions per record
def test_a_folder_resumed_with_another_optuna_attributes_each_cell_to_its_own(
    tmp_path, monkeypatch
):
    from imagenet_cog import protocol

    real = protocol.package_versions("numpy", "optuna", "torch")

    def with_optuna(version):
        monkeypatch.setattr(
            protocol, "package_versions", lambda *names: {**real, "optuna": version}
        )

    feats = {"L1": synthetic_domain(1.5, n_classes=8, seed=1)}
    out = tmp_path / "run"
    with_optuna("3.6.1")
    evaluate(feats, out=out, **{**KW, "seeds": (22, 37)}, **FAST)
    with_optuna("5.0.0")
    with pytest.warns(UserWarning, match=r"optuna 3\.6\.1 -> 5\.0\.0.*each record of runs\.jsonl"):
        res = evaluate(feats, out=out, **{**KW, "seeds": (22, 37, 45)}, **FAST)
    made = {r["seed"]: r["versions"]["optuna"] for r in res.records}
    assert made == {22: "3.6.1", 37: "3.6.1", 45: "5.0.0"}
    assert {r["seed"]: r["versions"]["torch"] for r in res.records} == dict.fromkeys(
        (22, 37, 45), real["torch"]
    )
    assert json.loads((out / "config.json").read_text())["versions"]["optuna"] == "3.6.1"
    caveats = comparability(Results.load(out), by_model=True)["model"]["caveats"]
    optuna = [c for c in caveats if c.startswith("Optuna")]
    assert len(optuna) == 2
    assert optuna[0].startswith("Optuna 3.6.1 instead of the official code's 2.3.0")
    assert optuna[0].endswith("; for 2 of its 3 cells (seeds 22, 37)")
    assert optuna[1].startswith("Optuna 5.0.0 instead of")
    assert optuna[1].endswith("; for 1 of its 3 cells (seed 45)")


# ------------------------------------------------------ integer labels are checked too
def _integer_domain(n_classes=1000, n_train=5, n_test=50, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    y_train, y_test = (
        np.repeat(np.arange(n_classes), n_train),
        np.repeat(np.arange(n_classes), n_test),
    )
    return (
        rng.normal(size=(y_train.size, dim)).astype(np.float32),
        y_train,
        rng.normal(size=(y_test.size, dim)).astype(np.float32),
        y_test,
    )


def test_integer_labels_with_every_protocol_default_are_not_comparable():
    from official_run import paper_like

    from imagenet_cog._protocol.checks import data_summary as _data_summary

    run = paper_like()
    data = run.meta["protocol"]["mine"]["data"]
    for domain in data:
        _, y_train, _, y_test = _integer_domain()
        # What evaluate records of 1,000 integer classes of arrays, 5 training images each.
        data[domain] = {
            **_data_summary(y_train, y_test, domain),
            "extraction": None,
            "train_ids_sha256": None,
            "test_ids_sha256": None,
        }
    found = comparability(run, by_model=True)["mine"]["deviations"]
    assert "L3: 5,000 training images instead of the paper's 1,095,203" in found
    assert (
        "L3: the labels are not wnids and no class list names them, so its 1000 concepts "
        "cannot be checked against the official L3 list (give evaluate classes={'L3': [wnid "
        "of label 0, wnid of label 1, ...]})"
    ) in found
    assert len(found) == 12  # two for each domain


def test_evaluate_records_integer_labels_unchecked_unless_classes_names_them(tmp_path):
    from imagenet_cog import imagenet1k_wnids

    feats = {"in1k": _integer_domain()}
    kw = {
        "domains": ("in1k",),
        "shots": ("all",),
        "seeds": (22,),
        "n_trials": 1,
        "n_startup_trials": 1,
        "epochs": 1,
        "device": "cpu",
        "progress": False,
    }
    plain = comparability(evaluate(feats, **kw), by_model=True)["model"]["deviations"]
    assert "IN-1K: 5,000 training images instead of the paper's 1,281,167" in plain
    assert any(x.startswith("IN-1K: the labels are not wnids and no class list") for x in plain)
    wnids = sorted(imagenet1k_wnids())
    named = evaluate(feats, classes={"in1k": wnids}, out=tmp_path / "named", **kw)
    config = json.loads((tmp_path / "named" / "config.json").read_text())
    assert config["data"]["in1k"]["class_names"] == "given"
    assert config["data"]["in1k"]["wnid_labels"] is True
    found = comparability(named, by_model=True)["model"]["deviations"]
    assert "IN-1K: 5,000 training images instead of the paper's 1,281,167" in found
    assert not any("concepts" in x for x in found), found  # the official 1000, by wnid
    with pytest.raises(ValueError, match=r"in1k: label 999 has no name in classes\['in1k'\]"):
        evaluate(feats, classes={"in1k": wnids[:999]}, **kw)
    with pytest.raises(ValueError, match=r"classes\['in1k'\] must list the wnid .*'cat'"):
        evaluate(feats, classes={"in1k": ["cat", *wnids[1:]]}, **kw)
    with pytest.raises(ValueError, match="classes names domain 'L1', which is not evaluated"):
        evaluate(feats, classes={"L1": wnids}, **kw)


# -------------------------------------------------------- features far from unit norm
def _network_like(scale, n=120, d=32, seed=0):
    from sklearn.datasets import make_blobs
    from sklearn.preprocessing import normalize

    X, y = make_blobs(n_samples=n, centers=3, n_features=d, random_state=seed)
    return (normalize(X) * scale).astype(np.float32), y


@pytest.mark.parametrize("scale", [30.0, 0.01])
def test_probes_on_features_far_from_unit_norm_warn_once_naming_normalizer(scale):
    import warnings

    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import Normalizer

    from imagenet_cog import LinearProbe, LinearProbeCV

    X, y = _network_like(scale)
    with pytest.warns(UserWarning, match=r"median l2 norm is .*Normalizer\(\)") as got:
        LinearProbe(epochs=2, device="cpu", random_state=0).fit(X, y)
    assert len([w for w in got if "l2 norm" in str(w.message)]) == 1
    with pytest.warns(UserWarning, match=r"LinearProbeCV: the feature vectors' median") as got:
        LinearProbeCV(n_trials=2, n_startup_trials=1, epochs=2, device="cpu", random_state=0).fit(
            X, y
        )
    assert len([w for w in got if "l2 norm" in str(w.message)]) == 1  # once, not per trial
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_pipeline(Normalizer(), LinearProbe(epochs=2, device="cpu")).fit(X, y)
        LinearProbe(epochs=2, device="cpu").fit(*_network_like(1.3))
        # L-BFGS is scikit-learn's problem, not the official probe's; toy 2-d data is no
        # network's features.
        LinearProbe(solver="lbfgs", epochs=5, device="cpu").fit(X, y)
        LinearProbe(epochs=2, device="cpu").fit(X[:, :8] * 100, y)
    assert not [str(w.message) for w in seen if "l2 norm" in str(w.message)]


def test_l2_normalize_cannot_overflow_on_finite_float64_features():
    import torch

    from imagenet_cog._feature_source import l2_normalize

    X = np.array([[3e200, 4e200], [3e-200, 4e-200], [3.0, 4.0], [0.0, 0.0]])
    out = l2_normalize(X, chunk=2)  # and no numpy warning (an error under these tests)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.6, 0.8], [0.6, 0.8], [0.0, 0.0]])
    assert out[2].tolist() == (X[2] / 5.0).tolist()  # an ordinary row: as before, bit for bit
    mine = X.copy()
    assert l2_normalize(mine, copy=False) is mine
    np.testing.assert_allclose(mine[:2], [[0.6, 0.8], [0.6, 0.8]])
    t = l2_normalize(torch.tensor(X))
    np.testing.assert_allclose(t.numpy(), out)


# ------------------------------------------- settings that could not change the numbers
def test_normalize_false_on_unit_norm_features_is_no_deviation(tmp_path):
    unit = {"L1": synthetic_domain(1.5, n_classes=3, n_train=10, n_test=4)}
    X, y, Xt, yt = unit["L1"]
    kw = {"domains": ("L1",), "shots": ("all",), "seeds": (22,), **FAST}
    res = evaluate(unit, normalize=False, out=tmp_path / "unit", **kw)
    config = json.loads((tmp_path / "unit" / "config.json").read_text())
    assert config["protocol"]["normalize"] is False and config["data"]["L1"]["unit_norm"] is True
    found = comparability(res, by_model=True)["model"]["deviations"]
    assert not any("l2-normalised" in x for x in found), found
    raw = evaluate({"L1": (X * 50.0, y, Xt, yt)}, normalize=False, **kw)
    found = comparability(raw, by_model=True)["model"]["deviations"]
    assert any(x.startswith("features not l2-normalised (normalize=False)") for x in found)
    assert "unit_norm" not in evaluate(unit, **kw).meta["protocol"]["model"]["data"]["L1"]


def test_a_split_seed_that_chose_nothing_is_no_deviation():
    from official_run import paper_like

    from imagenet_cog._protocol.checks import inert_settings as _inert_settings

    split = {"seed": 5, "cap": 1300, "n_test": 50, "official_test_lists": 1000, "n_concepts": 1000}
    expect = "L2: training images chosen with seed=5 instead of seed 0 and at most 1300"
    flagged = comparability(paper_like(data_split=split), by_model=True)["mine"]["deviations"]
    assert [x for x in flagged if x.startswith(expect)]
    run = paper_like(data_split=split, data_uncapped=True)
    assert comparability(run, by_model=True)["mine"]["deviations"] == []

    y = np.repeat(np.arange(4), 1290)  # every concept under the cap
    X = np.zeros((y.size, 2), dtype=np.float32)
    info = {"split": split, "skipped": {"train": 3, "test": 0}}
    assert _inert_settings((X, y, X, y), info, True) == {"uncapped": True}
    # Ten skipped images could hide a concept cut to 1300: the seed may have chosen.
    assert _inert_settings((X, y, X, y), {**info, "skipped": {"train": 10}}, True) == {}
    y = np.repeat(np.arange(4), 1300)
    X = np.zeros((y.size, 2), dtype=np.float32)
    assert _inert_settings((X, y, X, y), info, True) == {}
    official = {**split, "seed": 0}
    assert _inert_settings((X[:8], y[:8], X, y), {"split": official}, True) == {}


def test_analysis_json_is_bound_to_the_feature_stores_it_read(tiny_in1k_store, tmp_path, capsys):
    from imagenet_cog.analysis import analyze

    store = tiny_in1k_store()
    run = tmp_path / "run"
    evaluate(store.store, out=run, domains=("in1k",), shots=("all",), seeds=(22,), **FAST)
    analyze(store.store, out=run, analyses=("alignment",), device="cpu")
    path = run / "analysis.json"
    manifests = sorted((store.store / "in1k").glob("*/manifest.json"))
    stored = json.loads(path.read_text())["inputs"]["stores"]
    assert sorted(stored) == [str(m) for m in manifests]  # outside the run folder: absolute
    assert main(["verify", str(run)]) == 0
    capsys.readouterr()
    # The store changed after the analysis (rebuilt, or edited): its numbers are not the
    # store's any more, whatever the run's records say.
    manifests[1].write_text(manifests[1].read_text() + "\n")
    line = (
        f"{path} was computed from the features of another store than {manifests[1].parent} "
        "holds now (its manifest's sha256 differs): run analyze again"
    )
    assert main(["verify", str(run)]) == 1
    assert f"  {line}" in capsys.readouterr().out.splitlines()
    with pytest.raises(ValueError) as err:
        Results.load(run)
    assert str(err.value) == f"{line}; its numbers cannot be trusted: run analyze again"
    # A results folder taken where its stores are not stays readable; verify says what it
    # could not check.
    shutil.rmtree(store.store)
    assert Results.load(run).meta["analysis"]
    assert main(["verify", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"{manifests[0]}, which analysis.json was computed from, is not there" in out
