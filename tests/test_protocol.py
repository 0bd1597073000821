import itertools
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import strip_timings, subprocess_env

from imagenet_cog import Results, evaluate, make_search_spec
from imagenet_cog._runfolder import FORMAT, FORMAT_VERSION

DOMAINS = ("in1k", "L1", "L2", "L3", "L4", "L5")
#: Class separation falls from IN-1K to L5, so accuracy must fall too.
SEPARATION = dict(zip(DOMAINS, (4.0, 2.6, 1.8, 1.25, 0.85, 0.5)))
FAST = {
    "n_trials": 3,
    "n_startup_trials": 2,
    "epochs": 6,
    "batch_size": 64,
    "device": "cpu",
    "progress": False,
}


def synthetic_domain(separation, n_classes=8, n_train=30, n_test=40, dim=16, seed=0):
    """Gaussian classes whose means are ``separation`` apart on average, l2-normalized."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim)) * separation / np.sqrt(2)
    y_train = np.repeat([f"n{c:08d}" for c in range(n_classes)], n_train)
    y_test = np.repeat([f"n{c:08d}" for c in range(n_classes)], n_test)
    idx_tr = np.repeat(np.arange(n_classes), n_train)
    idx_te = np.repeat(np.arange(n_classes), n_test)
    X_train = means[idx_tr] + rng.normal(size=(idx_tr.size, dim))
    X_test = means[idx_te] + rng.normal(size=(idx_te.size, dim))

    def unit(x):
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    return unit(X_train), y_train, unit(X_test), y_test


def synthetic_features(**kw):
    return {d: synthetic_domain(SEPARATION[d], seed=i, **kw) for i, d in enumerate(DOMAINS)}


# ------------------------------------------------------------ the protocol
def test_accuracy_falls_with_separation_and_tables_and_plots_come_out(tmp_path):
    res = evaluate(
        synthetic_features(), shots=(1, 4, "all"), seeds=(22, 37), out=tmp_path / "run", **FAST
    )
    means = [res.mean("model", d, "all") for d in DOMAINS]
    assert all(a > b for a, b in itertools.pairwise(means)), means
    # More shots help (IN-1K is easy enough to be perfect from one shot).
    gains = [res.mean("model", d, "all") - res.mean("model", d, 1) for d in DOMAINS]
    assert min(gains) >= 0 and sum(g > 0 for g in gains) >= 4, gains
    lines = (tmp_path / "run" / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 6 * 3 * 2
    rec = json.loads(lines[0])
    for key in (
        "model",
        "domain",
        "shots",
        "seed",
        "top1",
        "top5",
        "val_top1",
        "lr",
        "wd",
        "n_train",
        "time_total_s",
        "library_version",
        "trials",
    ):
        assert key in rec
    assert 0.1 <= rec["lr"] <= 100 and 1e-12 <= rec["wd"] <= 1e-4
    assert len(rec["trials"]) == 3
    table = res.table()
    assert table.splitlines()[1].split() == ["model", "IN-1K", "L1", "L2", "L3", "L4", "L5"]
    assert "N=1" in res.table(domain="L5")
    paths = res.plot(tmp_path / "plots")
    assert {p.name for p in paths} == {"levels_absolute.png", "fewshot.png"}
    loaded = Results.load(tmp_path / "run")
    assert loaded.mean("model", "L3") == pytest.approx(res.mean("model", "L3"))
    assert loaded.meta["protocol"]["model"]["n_trials"] == 3
    # Arrays say nothing of their levels: none is recorded unless levels= says it.
    assert loaded.meta["protocol"]["model"]["levels"] is None


def test_cells_follow_spec_sizes():
    feats = {"L2": synthetic_domain(1.0, n_classes=5, n_train=21, n_test=4)}
    res = evaluate(feats, domains=("L2",), shots=(2, "all"), seeds=(22,), **FAST)
    by_shots = {r["shots"]: r for r in res.records}
    # floor(0.2 * 21) = 4 held out per class: 5 x 4 = 20 validation samples either way.
    assert by_shots["all"]["n_val"] == by_shots[2]["n_val"] == 20
    assert by_shots["all"]["n_search_train"] == 5 * 17
    assert by_shots["all"]["n_train"] == 5 * 21  # the final fit uses the whole training set
    assert by_shots[2]["n_search_train"] == by_shots[2]["n_train"] == 5 * 2


# -------------------------------------------------- few-shot sampling (the paper, Sec. 3.4.2 and supplement B.2)
def _spec_sets(y, seed, n):
    spec = make_search_spec(y, seed, n_shots=n)
    return set(spec.train_idx), set(spec.val_idx), set(spec.final_idx)


def test_holdout_is_drawn_before_the_shots():
    y = np.repeat(np.arange(6), 25)
    full_val = set(make_search_spec(y, 37).val_idx)
    for n in (1, 2, 4, 8, 16):
        _, val, _ = _spec_sets(y, 37, n)
        # The same seed gives the same holdout whatever N: it does not depend on the shots.
        assert val == full_val
    assert set(make_search_spec(y, 45).val_idx) != full_val


def test_validation_and_training_samples_are_disjoint():
    y = np.repeat(np.arange(6), 25)
    for n in (1, 4, 16, None):
        train, val, _ = _spec_sets(y, 22, n)
        assert not train & val
        counts = np.bincount(y[sorted(val)], minlength=6)
        assert (counts == 5).all()  # floor(0.2 * 25) per class, the WHOLE holdout
        if n is not None:
            assert (np.bincount(y[sorted(train)], minlength=6) == n).all()


def test_shots_are_redrawn_for_the_final_fit():
    y = np.repeat(np.arange(6), 25)
    redrawn, used_holdout = 0, 0
    for seed in range(20):
        train, val, final = _spec_sets(y, seed, 4)
        assert (np.bincount(y[sorted(final)], minlength=6) == 4).all()
        redrawn += final != train
        used_holdout += bool(final & val)  # drawn from the FULL training set
    assert redrawn == 20
    assert used_holdout >= 15  # 24 draws from 150 samples, 30 of them held out


# -------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f: f.pop("L3"), r"no features for domain\(s\) \['L3'\]"),
        (
            lambda f: f.__setitem__("L2", (f["L2"][0], f["L2"][1], f["L2"][2][:, :8], f["L2"][3])),
            "feature widths differ: train has 16 features, test has 8",
        ),
        (
            lambda f: f["L4"][0].__setitem__((5, 3), np.nan),
            r"L4: X_train holds NaN .* \(rows \[5\]\)",
        ),
        (
            lambda f: f.__setitem__(
                "L1",
                (
                    f["L1"][0],
                    f["L1"][1],
                    f["L1"][2],
                    np.where(f["L1"][3] == "n00000003", "n00000999", f["L1"][3]),
                ),
            ),
            r"L1: 1 test label\(s\) never appear in the training set \(n00000999\)",
        ),
    ],
)
def test_bad_input_raises_before_anything_is_written(tmp_path, mutate, message):
    feats = synthetic_features()
    mutate(feats)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        evaluate(feats, shots=("all",), seeds=(22,), out=out, **FAST)
    assert not out.exists()


def test_too_many_shots_names_the_class(tmp_path):
    X, y, Xt, yt = synthetic_domain(1.0, n_classes=4, n_train=30)
    keep = (y != "n00000002") | (np.arange(len(y)) % 30 < 8)  # class 2 keeps 8 images
    out = tmp_path / "run"
    with pytest.raises(
        ValueError,
        match=r"N=8 shots asked, but class 'n00000002' has 8 training images, 7 of them outside",
    ):
        evaluate(
            {"L5": (X[keep], y[keep], Xt, yt)},
            domains=("L5",),
            shots=(8,),
            seeds=(22,),
            out=out,
            **FAST,
        )
    assert not out.exists()


# ----------------------------------------------------------------- resuming
def test_resume_skips_finished_cells_and_refuses_another_configuration(tmp_path):
    feats = {d: synthetic_features()[d] for d in ("in1k", "L5")}
    out = tmp_path / "run"
    first = evaluate(feats, domains=("in1k",), shots=("all",), seeds=(22, 37), out=out, **FAST)
    assert len(first.records) == 2
    again = evaluate(feats, domains=("in1k",), shots=("all",), seeds=(22, 37), out=out, **FAST)
    assert [strip_timings(r) for r in again.records] == [strip_timings(r) for r in first.records]
    assert len((out / "runs.jsonl").read_text().splitlines()) == 2  # nothing done twice
    with pytest.raises(ValueError, match=r"different configuration .*n_trials"):
        evaluate(
            feats,
            domains=("in1k",),
            shots=("all",),
            seeds=(22, 37),
            out=out,
            **{**FAST, "n_trials": 4},
        )
    other = {"in1k": synthetic_domain(9.0, seed=5), "L5": feats["L5"]}
    with pytest.raises(ValueError, match=r"different configuration .*features"):
        evaluate(other, domains=("in1k",), shots=("all",), seeds=(22,), out=out, **FAST)
    with pytest.raises(ValueError, match="resume=True"):
        evaluate(
            feats, domains=("in1k",), shots=("all",), seeds=(22,), out=out, resume=False, **FAST
        )


def test_joblib_parallel_cells_give_the_same_records(tmp_path):
    feats = {d: synthetic_features()[d] for d in ("L1", "L2")}
    kw = {"domains": ("L1", "L2"), "shots": (2, "all"), "seeds": (22, 37)}
    serial = evaluate(feats, out=tmp_path / "a", **kw, **FAST)
    parallel = evaluate(feats, out=tmp_path / "b", n_jobs=2, **kw, **FAST)

    def key(r):
        return (r["domain"], str(r["shots"]), r["seed"])

    a = sorted((strip_timings(r) for r in serial.records), key=key)
    b = sorted((strip_timings(r) for r in parallel.records), key=key)
    assert [key(r) for r in a] == [key(r) for r in b]
    for ra, rb in zip(a, b):
        assert ra["lr"] == rb["lr"] and ra["wd"] == rb["wd"]
        assert ra["top1"] == pytest.approx(rb["top1"], abs=1e-9)


RUNNER = """
import sys, numpy as np, torch
torch.set_num_threads(1)
from imagenet_cog import evaluate
data = np.load(sys.argv[1])
feats = {d: (data[d + "_Xtr"], data[d + "_ytr"], data[d + "_Xte"], data[d + "_yte"])
         for d in ("in1k", "L1", "L2", "L3", "L4", "L5")}
evaluate(feats, shots=(1, 2, "all"), seeds=(22, 37), out=sys.argv[2], n_trials=3,
         n_startup_trials=2, epochs=30, batch_size=16, device="cpu", progress=False)
"""


def write_synthetic_npz(path):
    """The six synthetic domains in one .npz (``<domain>_Xtr``, ``_ytr``, ``_Xte``, ``_yte``),
    for runs in another process."""
    data = {}
    for d, (a, b, c, e) in synthetic_features().items():
        data.update({f"{d}_Xtr": a, f"{d}_ytr": b, f"{d}_Xte": c, f"{d}_yte": e})
    np.savez(path, **data)


def _runner(tmp_path):
    write_synthetic_npz(tmp_path / "feats.npz")
    script = tmp_path / "run.py"
    script.write_text(RUNNER)
    env = subprocess_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return [sys.executable, str(script), str(tmp_path / "feats.npz")], env


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_records(tmp_path):
    cmd, env = _runner(tmp_path)
    subprocess.run([*cmd, str(tmp_path / "full")], env=env, check=True, timeout=600)
    full = _lines(tmp_path / "full" / "runs.jsonl")
    assert len(full) == 6 * 3 * 2

    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, str(killed)], env=env)
    runs = killed / "runs.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if runs.is_file() and len(runs.read_bytes().splitlines()) >= 7:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(runs.read_bytes().splitlines())
    assert 7 <= partial < len(full)

    done = subprocess.run(
        [*cmd, str(killed)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    resumed = _lines(runs)
    cells = [(r["domain"], str(r["shots"]), r["seed"]) for r in resumed]
    assert len(cells) == len(set(cells)) == len(full)  # no cell done twice
    key = lambda r: (r["domain"], str(r["shots"]), r["seed"])
    assert sorted(map(strip_timings, resumed), key=key) == sorted(map(strip_timings, full), key=key)


# ------------------------------------------------------------ feature store
def test_evaluate_reads_a_feature_store(tmp_path, tiny_in1k_store):
    store = tiny_in1k_store().store
    res = evaluate(
        store, domains=("in1k",), shots=(2, "all"), seeds=(22,), out=tmp_path / "run", **FAST
    )
    assert res.models == ["resnet18-random"]  # the default name: short
    assert {r["shots"] for r in res.records} == {2, "all"}
    assert all(r["n_classes"] == 3 for r in res.records)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert set(config["features"]) == {"in1k"}
    assert config["data"]["in1k"]["n_classes"] == 3 and config["data"]["in1k"]["n_test"] == 6
    assert config["protocol"]["normalize"] is True
    with pytest.raises(ValueError, match=r"no features for domain\(s\) \['L1'\]"):
        evaluate(store, domains=("in1k", "L1"), shots=("all",), seeds=(22,), **FAST)


# ---------------------------------------------------------------- commands
def test_evaluate_and_report_commands(tmp_path, capsys, tiny_in1k_store):
    from imagenet_cog.cli import main

    store = tiny_in1k_store().store
    out = tmp_path / "run"
    code = main(
        [
            "evaluate",
            str(store),
            "--out",
            str(out),
            "--domains",
            "in1k",
            "--shots",
            "2,all",
            "--seeds",
            "22,37",
            "--trials",
            "3",
            "--epochs",
            "4",
            "--device",
            "cpu",
            "--quiet",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "IN-1K" in printed and "N=2" in printed
    assert len((out / "runs.jsonl").read_text().splitlines()) == 4

    plots = tmp_path / "plots"
    assert (
        main(
            [
                "report",
                str(out),
                "--reference",
                "paper",
                "--models",
                "s-DINO,a-DeiT-S",
                "--plot",
                str(plots),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Your model among 4 models" in printed
    # A 3-concept run is never ranked bare: a banner on top, ranks in parentheses.
    assert printed.startswith("Your model among 4 models")
    banner = next(b for b in printed.split("\n\n") if b.startswith("!!! NOT COMPARABLE"))
    assert banner.startswith("!!! NOT COMPARABLE with the paper: resnet18-random !!!")
    # The decisive reason first: the random weights, then the concept subset.
    assert banner.splitlines()[1].startswith("  - random-initialised weights")
    assert banner.splitlines()[2].startswith("  - IN-1K: subsets of 3 concepts")
    assert main(["report", str(out), "--reference", "paper", "--strict"]) == 2
    assert "NOT COMPARABLE" in capsys.readouterr().err
    assert "resnet18-random rank" in printed and "vs ResNet50" in printed
    assert "2 seeds per cell instead of the paper's 5" in printed
    assert "Comparable with the paper means" in printed
    assert {p.name for p in plots.iterdir()} == {
        "levels_absolute.png",
        "levels_relative.png",
        "fewshot.png",
        "fewshot_relative.png",
    }
    assert main(["report", str(out), "--format", "csv"]) == 0
    # The verdict travels with the numbers: two columns after the counts.
    assert capsys.readouterr().out.startswith(
        "model,domain,shots,metric,mean,std,n,comparable,deviations\n"
    )
    assert main(["report", str(out), "--baseline", "nope"]) == 2
    assert "baseline 'nope'" in capsys.readouterr().err


def test_evaluate_extracts_first_from_a_model_spec(tmp_path):
    from imagefiles import write_in1k

    wnids, _ = write_in1k(tmp_path / "in1k", n_classes=3, n_train=10, n_val=2)
    options = {"wnids": wnids, "preprocessing": {"size": 32}, "batch_size": 8, "progress": False}
    with pytest.raises(ValueError, match="give data="):
        evaluate("torchvision:resnet18", domains=("in1k",), **FAST)
    res = evaluate(
        "torchvision:resnet18",
        data={"in1k": tmp_path / "in1k"},
        store=tmp_path / "features",
        domains=("in1k",),
        shots=("all",),
        seeds=(22,),
        extract_options=options,
        **FAST,
    )
    assert res.models == ["resnet18-random"]  # the default name: short
    assert (tmp_path / "features" / "in1k" / "train" / "manifest.json").is_file()
    assert (tmp_path / "features" / "in1k" / "test" / "manifest.json").is_file()
    assert res.records[0]["n_classes"] == 3


def test_a_group_cut_between_its_appends_resumes_to_the_same_records(tmp_path):
    # A kill can land after the first seed of a lockstep group is written. The resumed
    # group must train with all its seeds again, as the uninterrupted run did.
    feats = {"L1": synthetic_features()["L1"]}
    kw = {"domains": ("L1",), "shots": (1, "all"), "seeds": (22, 37)}
    full = evaluate(feats, out=tmp_path / "full", **kw, **FAST)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "config.json").write_bytes((tmp_path / "full" / "config.json").read_bytes())
    lines = (tmp_path / "full" / "runs.jsonl").read_text().splitlines()
    kept = [x for x in lines if not (json.loads(x)["shots"] == 1 and json.loads(x)["seed"] == 37)]
    (cut / "runs.jsonl").write_text("\n".join(kept) + "\n")
    resumed = evaluate(feats, out=cut, **kw, **FAST)

    def key(r):
        return (str(r["shots"]), r["seed"])

    assert len((cut / "runs.jsonl").read_text().splitlines()) == 4  # only the missing cell added
    got = sorted(map(strip_timings, resumed.records), key=key)
    assert got == sorted(map(strip_timings, full.records), key=key)
    assert all(r["searches_in_lockstep"] == 2 for r in got)


# ------------------------------------------- settings checked before writing
def _tiny(n_classes=3, n_train=10):
    return {"L1": synthetic_domain(1.5, n_classes=n_classes, n_train=n_train, n_test=4)}


def _with(feats, **parts):
    X, y, Xt, yt = feats["L1"]
    got = {"X": X, "y": y, "Xt": Xt, "yt": yt, **parts}
    return {"L1": (got["X"], got["y"], got["Xt"], got["yt"])}


@pytest.mark.parametrize(
    ("feats", "kw", "message"),
    [
        (None, {"n_trials": 0}, r"n_trials must be an integer >= 1, got 0"),
        (None, {"batch_size": -5}, r"batch_size must be an integer >= 1, got -5"),
        (None, {"epochs": 0}, r"epochs must be an integer >= 1, got 0"),
        (None, {"trials_per_batch": 0}, r"trials_per_batch must be an integer >= 1"),
        (None, {"device": "tpu:7"}, r"device 'tpu:7' is not a device name: use 'cpu', "),
        (None, {"mixed_precision": "fp8"}, r"mixed_precision must be None, 'tf32' or 'bf16'"),
        (None, {"normalize": "no"}, r"normalize must be True or False"),
        (None, {"compile": "yes"}, r"compile must be 'auto', True or False, got 'yes'"),
        (
            lambda f: _with(f, y=np.full(30, "n00000001"), yt=np.full(12, "n00000001")),
            {},
            r"L1: the training set has a single class \('n00000001'\)",
        ),
        (lambda f: _with(f, y=f["L1"][1][:, None]), {}, r"L1: y_train must be 1-d .*\(30, 1\)"),
        (
            lambda f: _with(f, X=f["L1"][0][::3], y=f["L1"][1][::3]),
            {},
            r"L1: no class has the 5 training images needed to hold out 20% .*largest has 4",
        ),
        (
            lambda f: _with(f, X=f["L1"][0] + 1j),
            {},
            r"L1: X_train holds complex64 values \(complex\)",
        ),
        (
            lambda f: _with(f, Xt=f["L1"][2].astype(str)),
            {},
            r"L1: X_test holds <U\d+ values \(not real",
        ),
    ],
)
def test_bad_settings_are_refused_before_any_file(tmp_path, feats, kw, message):
    data = _tiny() if feats is None else feats(_tiny())
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        evaluate(data, domains=("L1",), shots=("all",), seeds=(22,), out=out, **{**FAST, **kw})
    assert not out.exists()


def test_a_corrected_rerun_after_a_refused_one_runs(tmp_path):
    out = tmp_path / "run"
    kw = {"domains": ("L1",), "shots": ("all",), "seeds": (22,), "out": out}
    with pytest.raises(ValueError, match="n_trials"):
        evaluate(_tiny(), **kw, **{**FAST, "n_trials": 0})
    res = evaluate(_tiny(), **kw, **FAST)
    assert len(res.records) == 1 and np.isfinite(res.records[0]["top1"])


def test_each_record_says_which_step_trained_its_unit(tmp_path, monkeypatch):
    import torch

    from imagenet_cog._train import fused as _fused

    monkeypatch.setattr(_fused, "_FAILED", {}, raising=False)
    monkeypatch.setattr(_fused, "_COMPILED", {}, raising=False)
    feats = {d: synthetic_domain(SEPARATION[d], seed=i) for i, d in enumerate(DOMAINS[:2])}
    kw = {"domains": DOMAINS[:2], "shots": ("all",), "seeds": (22, 37), **FAST}
    res = evaluate(feats, out=tmp_path / "eager", **kw)
    # 2 rounds of trials (the 2 startup trials, then 1) and the finals: 3 fits per unit.
    for rec in res.records:
        assert rec["step_paths"] == {"eager": 3}
        assert rec["step_check_max_diff"] is None and rec["step_fallbacks"] == []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    res = evaluate(feats, out=tmp_path / "compiled", compile=True, **kw)
    lines = (tmp_path / "compiled" / "runs.jsonl").read_text().splitlines()
    for rec in map(json.loads, lines):
        assert rec["step_paths"] == {"compiled": 3} and rec["step_fallbacks"] == []
        assert 0 <= rec["step_check_max_diff"] < _fused.CHECK_TOLERANCE


# ------------------------------------------------------- l2 normalisation
def test_features_are_l2_normalised_by_default_on_arrays(tmp_path):
    unit = {"L1": synthetic_domain(0.8, n_classes=3, n_train=10, n_test=4)}
    X, y, Xt, yt = unit["L1"]
    big = {"L1": (X * 50.0, y, Xt * 50.0, yt)}
    kw = {"domains": ("L1",), "shots": ("all",), "seeds": (22, 37), **FAST}

    def scores(res):
        return [r[k] for r in res.records for k in ("lr", "wd", "top1", "val_top1")]

    a = evaluate(unit, **kw)
    b = evaluate(big, **kw)
    assert scores(b) == pytest.approx(scores(a), abs=1e-6)
    np.testing.assert_array_equal(big["L1"][0], X * 50.0)  # the caller's arrays untouched
    raw = evaluate(big, normalize=False, out=tmp_path / "raw", **kw)
    assert scores(raw) != pytest.approx(scores(a), abs=1e-6)
    config = json.loads((tmp_path / "raw" / "config.json").read_text())
    assert config["protocol"]["normalize"] is False


def test_l2_normalize_copies_only_when_needed():
    import torch

    from imagenet_cog._feature_source import l2_normalize

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 8)).astype(np.float32)
    X[7] = 0
    out = l2_normalize(X, chunk=64)
    assert out is not X and out.dtype == np.float32
    norms = np.linalg.norm(out, axis=1)
    assert np.allclose(np.delete(norms, 7), 1, atol=1e-6) and norms[7] == 0
    assert l2_normalize(out) is out  # already unit-norm: used as it is
    mine = X.copy()
    assert l2_normalize(mine, copy=False, chunk=64) is mine  # owned: in place
    np.testing.assert_allclose(mine, out, atol=1e-7)
    ints = l2_normalize(np.array([[3, 4]]))
    assert ints.dtype == np.float32 and ints.tolist() == [[0.6000000238418579, 0.800000011920929]]
    t = l2_normalize(torch.tensor([[3.0, 4.0]]))
    assert torch.allclose(t, torch.tensor([[0.6, 0.8]]))


# --------------------------------------------------- what config.json records
def test_config_records_concepts_counts_normalisation_and_versions(tmp_path):
    import optuna
    import torch

    evaluate(_tiny(), domains=("L1",), shots=("all",), seeds=(22,), out=tmp_path / "r", **FAST)
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    from imagenet_cog._comparability import concepts_checksum

    assert config["data"]["L1"] == {
        "n_classes": 3,
        "classes_sha256": concepts_checksum(["n00000000", "n00000001", "n00000002"]),
        "wnid_labels": True,
        "n_train": 30,
        "n_test": 12,
        # Arrays carry no record of their extraction or images.
        "extraction": None,
        "train_ids_sha256": None,
        "test_ids_sha256": None,
    }
    assert config["protocol"]["normalize"] is True
    assert config["versions"]["optuna"] == optuna.__version__
    assert config["versions"]["torch"] == torch.__version__
    loaded = Results.load(tmp_path / "r")
    assert loaded.meta["protocol"]["model"]["data"]["L1"]["n_classes"] == 3
    assert loaded.meta["protocol"]["model"]["versions"]["optuna"] == optuna.__version__


# ------------------------------------------------------------ runs.jsonl
def test_trial_floats_are_stored_exactly(tmp_path):
    evaluate(
        _tiny(),
        domains=("L1",),
        shots=("all",),
        seeds=(22,),
        out=tmp_path / "r",
        **{**FAST, "n_trials": 6, "n_startup_trials": 6},
    )
    rec = _lines(tmp_path / "r" / "runs.jsonl")[0]
    wds = [t["wd"] for t in rec["trials"]]
    assert all(1e-12 <= w <= 1e-4 for w in wds), wds  # none rounded to 0.0
    assert rec["wd"] in wds and rec["lr"] in [t["lr"] for t in rec["trials"]]


def test_a_garbled_line_of_runs_jsonl_is_named(tmp_path):
    out = tmp_path / "r"
    kw = {"domains": ("L1",), "shots": (2, "all"), "seeds": (22,), "out": out, **FAST}
    evaluate(_tiny(), **kw)
    lines = (out / "runs.jsonl").read_text().splitlines()
    (out / "runs.jsonl").write_text(lines[0] + "\n{garbage\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"runs\.jsonl:2: not a JSON line"):
        evaluate(_tiny(), **kw)
    # A JSON line that is not a record is named too, on resume as in Results.load.
    (out / "runs.jsonl").write_text(lines[0] + "\n[1, 2]\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"runs\.jsonl:2: not a result record"):
        evaluate(_tiny(), **kw)


HOLDER = """
import sys, time
from imagenet_cog._fileio import FolderLock
with FolderLock(sys.argv[1], what="run folder"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_run_on_a_busy_folder_is_refused(tmp_path):
    from imagenet_cog._fileio import FolderLockedError

    out = tmp_path / "run"
    env = subprocess_env()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        kw = {"domains": ("L1",), "shots": ("all",), "seeds": (22,), "out": out, **FAST}
        with pytest.raises(
            FolderLockedError, match=rf"run folder .*run is in use .*PID {holder.pid}"
        ):
            evaluate(_tiny(), **kw)
        assert not (out / "config.json").exists() and not (out / "runs.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # The OS let go with the killed holder: the folder is free again.
    assert len(evaluate(_tiny(), **kw).records) == 1


#: Both processes wait here, their imports and data loaded, until both have arrived.
START_BARRIER = """
import os, time
_here = os.environ["START_BARRIER"]
open(os.path.join(_here, str(os.getpid())), "w").close()
while len(os.listdir(_here)) < 2:
    time.sleep(0.005)
"""


@pytest.mark.slow
def test_two_runs_started_together_never_mix(tmp_path):
    cmd, env = _runner(tmp_path)
    script = tmp_path / "race.py"
    script.write_text(RUNNER.replace("evaluate(feats,", START_BARRIER + "evaluate(feats,"))
    (tmp_path / "barrier").mkdir()
    env = {**env, "START_BARRIER": str(tmp_path / "barrier")}
    out = tmp_path / "shared"
    procs = [
        subprocess.Popen(
            [cmd[0], str(script), cmd[2], str(out)], env=env, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    codes, errs = zip(*[(p.wait(timeout=600), p.stderr.read()) for p in procs])
    for p in procs:
        p.stderr.close()
    # Started together, one runs and the other is refused at the lock. Should the first
    # finish before the second reaches the lock (a loaded machine), the second resumes a
    # finished folder and adds nothing. Never both running: every cell is there once.
    assert sorted(codes) in ([0, 1], [0, 0]), errs
    if 1 in codes:
        assert "in use by another process" in errs[codes.index(1)]
    records = _lines(out / "runs.jsonl")
    cells = [(r["domain"], str(r["shots"]), r["seed"]) for r in records]
    assert len(cells) == len(set(cells)) == 6 * 3 * 2  # every cell once
    assert len({r["config_hash"] for r in records}) == 1


# ------------------------------------------------------- lockstep and torchrun
def test_all_domains_in_lockstep_equal_one_group_at_a_time():
    from imagenet_cog import run_searches

    feats = {d: synthetic_features()[d] for d in ("L1", "L4")}
    kw = {"domains": ("L1", "L4"), "shots": (2, "all"), "seeds": (22, 37)}
    res = evaluate(feats, **kw, **FAST)
    assert {r["searches_in_lockstep"] for r in res.records} == {4}  # 2 domains x 2 seeds
    for domain in kw["domains"]:
        X_tr, y_tr, X_te, y_te = feats[domain]
        for n in kw["shots"]:
            specs = [
                make_search_spec(y_tr, s, n_shots=None if n == "all" else n) for s in kw["seeds"]
            ]
            alone = run_searches(
                X_tr,
                y_tr,
                specs,
                X_test=X_te,
                y_test=y_te,
                n_trials=3,
                n_startup_trials=2,
                trials_per_batch=1,
                epochs=6,
                batch_size=64,
                device="cpu",
            )
            for seed, a in zip(kw["seeds"], alone):
                (r,) = [
                    r
                    for r in res.records
                    if (r["domain"], r["shots"], r["seed"]) == (domain, n, seed)
                ]
                assert r["lr"] == pytest.approx(a.best_params["lr"], rel=1e-5)
                assert r["wd"] == pytest.approx(a.best_params["wd"], rel=1e-5)
                assert r["val_top1"] == pytest.approx(100 * a.best_score, abs=1e-5)
                assert r["top1"] == pytest.approx(100 * a.test_top1, abs=1e-5)


def test_saved_predictions_equal_a_linear_probe_refitted_from_the_record(tmp_path):
    # The predictions come from the finals' own last evaluation, not from a second pass: they
    # must be those of a LinearProbe refitted with the record's lr, wd and seed on the final
    # training set of the cell, for every cell of a lockstep unit.
    from imagenet_cog import LinearProbe

    feats = {d: synthetic_features()[d] for d in ("L1", "L4")}
    res = evaluate(
        feats,
        domains=("L1", "L4"),
        shots=(2, "all"),
        seeds=(22, 37),
        out=tmp_path,
        save_predictions=True,
        normalize=False,
        **FAST,
    )
    assert len(res.records) == 8
    for rec in res.records:
        X_tr, y_tr, X_te, y_te = feats[rec["domain"]]
        n = rec["shots"]
        spec = make_search_spec(y_tr, rec["seed"], n_shots=None if n == "all" else n)
        assert rec["n_train"] == len(spec.final_idx)
        probe = LinearProbe(
            lr=rec["lr"],
            weight_decay=rec["wd"],
            epochs=FAST["epochs"],
            batch_size=FAST["batch_size"],
            device="cpu",
            random_state=rec["seed"],
        ).fit(X_tr[spec.final_idx], y_tr[spec.final_idx])
        with np.load(tmp_path / rec["predictions"], allow_pickle=False) as z:
            classes, y_true, y_pred, top5 = z["classes"], z["y_true"], z["y_pred"], z["top5"]
        np.testing.assert_array_equal(classes, probe.classes_.astype(str))
        np.testing.assert_array_equal(y_true, y_te.astype(str))
        np.testing.assert_array_equal(y_pred, probe.predict(X_te).astype(str))
        scores = probe.decision_function(X_te)
        best = np.argsort(-scores, axis=1, kind="stable")[:, :5]
        np.testing.assert_array_equal(top5, best)
        assert 100 * np.mean(y_pred == y_true) == pytest.approx(rec["top1"], abs=1e-9)


TORCHRUN = """
import sys, numpy as np, torch
torch.set_num_threads(1)
from imagenet_cog import evaluate
data = np.load(sys.argv[1])
feats = {d: (data[d + "_Xtr"], data[d + "_ytr"], data[d + "_Xte"], data[d + "_yte"])
         for d in ("in1k", "L1")}
evaluate(feats, domains=("in1k", "L1"), shots=(1, "all"), seeds=(22, 37, 45), out=sys.argv[2],
         n_trials=3, n_startup_trials=2, epochs=6, batch_size=64, device="cpu", progress=False)
"""


@pytest.mark.slow
def test_torchrun_splits_the_cells_across_two_processes(tmp_path):
    cmd, env = _runner(tmp_path)
    script = tmp_path / "dist.py"
    script.write_text(TORCHRUN)
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    done = subprocess.run(
        [*launcher, str(script), cmd[2], str(tmp_path / "two")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    subprocess.run(
        [cmd[0], str(script), cmd[2], str(tmp_path / "one")], env=env, check=True, timeout=600
    )
    two, one = _lines(tmp_path / "two" / "runs.jsonl"), _lines(tmp_path / "one" / "runs.jsonl")
    key = lambda r: (r["domain"], str(r["shots"]), r["seed"])
    assert len(two) == len({key(r) for r in two}) == 2 * 2 * 3  # every cell, none twice
    assert {r["searches_in_lockstep"] for r in two} == {3}  # 6 cells a unit, 3 per rank
    for a, b in zip(sorted(two, key=key), sorted(one, key=key)):
        assert key(a) == key(b)
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-5)
        assert a["top1"] == pytest.approx(b["top1"], abs=1e-5)


@pytest.mark.slow
def test_every_rank_stops_when_rank_0_cannot_open_the_run_folder(tmp_path):
    # Two processes of one Gloo group, started as torchrun starts them but without its agent
    # (which would kill the second one for us): rank 0 finds another configuration in the
    # folder; rank 1 must stop with an error saying so (before, it waited at a barrier: for
    # ever under NCCL, until Gloo saw the connection drop).
    import socket

    cmd, env = _runner(tmp_path)
    script = tmp_path / "dist.py"
    script.write_text(TORCHRUN)
    out = tmp_path / "other"
    out.mkdir()
    (out / "config.json").write_text(
        json.dumps({"model": "another run", "format": FORMAT, "format_version": FORMAT_VERSION})
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        dist_env = {
            **env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [cmd[0], str(script), cmd[2], str(out)],
                env=dist_env,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        errors = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0 and "different configuration" in errors[0], errors[0][-2000:]
    assert procs[1].returncode != 0, errors[1][-2000:]
    assert "rank 0 could not open the run folder" in errors[1], errors[1][-2000:]


def test_a_unit_norm_store_is_checked_once_across_lockstep_units(monkeypatch, tmp_path):
    from imagenet_cog import _feature_source as fs

    rng = np.random.default_rng(0)
    unit = rng.normal(size=(6, 4)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    raw = (unit * 3).astype(np.float32)
    arrays = {
        "unit": (unit, np.arange(6), unit[:2], np.arange(2)),
        "raw": (raw, np.arange(6), raw[:2], np.arange(2)),
    }
    source = fs.StoreFeatures(tmp_path, normalize=True)
    monkeypatch.setattr(source, "load", lambda domain, mmap=False: arrays[domain])
    calls = []
    real = fs.l2_normalize
    monkeypatch.setattr(fs, "l2_normalize", lambda X, **kw: calls.append(1) or real(X, **kw))
    for _ in range(3):  # one call per lockstep unit
        X_train = source.training("unit")[0]
        assert X_train is unit
    assert len(calls) == 2  # train and test, checked once
    for _ in range(2):  # features that are not unit-norm are normalised every time
        X_train = source.training("raw")[0]
        np.testing.assert_allclose(np.linalg.norm(X_train, axis=1), 1, rtol=1e-6)
    assert len(calls) == 6


@pytest.mark.parametrize(
    ("feats", "kw", "what"),
    [
        (_tiny(), {"model": "mine\x1b[31m"}, "model name 'mine\\x1b[31m'"),
        ({"L1\n": _tiny()["L1"]}, {"domains": ("L1\n",)}, "domain name 'L1\\n'"),
    ],
    ids=["model", "domain"],
)
def test_a_name_with_a_control_character_is_refused_before_the_first_cell(
    tmp_path, monkeypatch, feats, kw, what
):
    # Before: every cell trained, and the name was refused only when the results were read.
    from imagenet_cog._train import search

    trained, real = [], search.search_in_lockstep
    monkeypatch.setattr(
        search, "search_in_lockstep", lambda *a, **k: trained.append(1) or real(*a, **k)
    )
    out = tmp_path / "run"
    settings = {"domains": ("L1",), "shots": ("all",), "seeds": (22,), **FAST, **kw}
    with pytest.raises(ValueError, match="holds a control character") as info:
        evaluate(feats, out=out, **settings)
    assert what in str(info.value)
    assert not trained and not out.exists()


def test_a_domains_rows_stay_resident_across_the_units_that_use_them(monkeypatch):
    # Each shots value is a unit of the same cells; their all-data unit is resident, so the
    # domains go to the device whole once and every unit trains on them: the training rows
    # are uploaded once instead of once a unit, and every number of the records is the same.
    from imagenet_cog._train import feed
    from imagenet_cog._train import memplan as _memplan

    domains = {"in1k": synthetic_domain(2.0, seed=1), "L1": synthetic_domain(1.5, seed=2)}
    kw = {
        "domains": ("in1k", "L1"),
        "shots": (1, 2, "all"),
        "seeds": (22, 37),
        "n_trials": 3,
        "n_startup_trials": 2,
        "epochs": 2,
        "device": "cpu",
    }
    uploads = []
    upload = feed.HostRows.upload

    def counted(self, *args, **kwargs):
        uploads.append(self.shape[0])
        return upload(self, *args, **kwargs)

    monkeypatch.setattr(feed.HostRows, "upload", counted)
    kept = evaluate(domains, **kw).records
    n_train, n_test = 2 * 8 * 30, 2 * 8 * 40
    assert uploads == [n_train, n_test]  # the whole domains, once
    uploads.clear()
    unit_data = _memplan.unit_data
    monkeypatch.setattr(_memplan, "unit_data", lambda *a, keep=None, **k: unit_data(*a, **k))
    each = evaluate(domains, **kw).records
    # Each unit its own rows: the few-shot units fewer, the all-data unit all of them.
    assert uploads[1::2] == [n_test] * 3
    assert max(uploads[0:4:2]) < n_train == uploads[4]
    fields = ("domain", "shots", "seed", "top1", "top5", "lr", "wd", "trials", "n_train")
    assert [{f: r[f] for f in fields} for r in kept] == [{f: r[f] for f in fields} for r in each]
    assert all(r["features_resident"] for r in kept + each)
