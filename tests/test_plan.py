"""``plan_evaluate`` and ``imagenet-cog evaluate --plan``: what a run will take, before it runs."""

import json
import re

import numpy as np
import pytest
from test_protocol import synthetic_domain

from imagenet_cog import EvaluatePlan, _device, cli, evaluate, plan_evaluate
from imagenet_cog._grid import PAPER_PROTOCOL, SEEDS, SHOTS

# The default protocol's shape: every shots value and the five seeds, on two small domains.
SHAPE = {"domains": ("in1k", "L5"), "shots": SHOTS, "seeds": SEEDS, "device": "cpu"}
SHORT = {"n_trials": 3, "n_startup_trials": 2, "epochs": 2, "batch_size": 64}


@pytest.fixture(scope="module")
def features():
    # 3 classes of 170 images: 136 after the 20% holdout, enough for 128 shots.
    return {
        "in1k": synthetic_domain(3.0, n_classes=3, n_train=170, n_test=10, dim=8, seed=0),
        "L5": synthetic_domain(0.5, n_classes=3, n_train=170, n_test=10, dim=8, seed=1),
    }


@pytest.mark.slow
def test_the_plan_counts_what_evaluate_trains(features, capsys, monkeypatch):
    # The host's available memory, which sets a CPU run's budget, held still between the two.
    monkeypatch.setattr(_device, "host_available_bytes", lambda: 16 * 10**9)
    plan = plan_evaluate(features, **SHAPE, **SHORT)
    assert isinstance(plan, EvaluatePlan)
    assert [u["shots"] for u in plan.units] == list(SHOTS)
    results = evaluate(features, **SHAPE, **SHORT, progress=True)
    printed = capsys.readouterr().out
    # The memory plan is the one evaluate prints before it trains.
    assert plan.memory in printed
    # The rows each unit trains and evaluates, against the records of the run: the trials'
    # search rows and the retrain's, every epoch; each trial's validation rows and the test.
    for unit in plan.units:
        cells = {(d, s) for d, s in unit["cells"]}
        records = [r for r in results.records if (r["domain"], r["seed"]) in cells]
        records = [r for r in records if r["shots"] == unit["shots"]]
        assert len(records) == len(cells) == 10
        sgd = sum(SHORT["epochs"] * (3 * r["n_search_train"] + r["n_train"]) for r in records)
        evaluated = sum(3 * r["n_val"] + r["n_test"] for r in records)
        assert unit["sgd_rows"] == sgd and unit["eval_rows"] == evaluated
        assert unit["flop_sgd"] == 4 * 8 * 3 * sgd
    apart = ("setup", "read", "scans", "copies", "streaming", "command")
    apart = sum(plan.seconds[k] for k in apart)
    assert plan.seconds["total"] == pytest.approx(
        sum(u["seconds"] for u in plan.units) + apart, abs=0.01
    )


def test_the_plan_times_the_run_s_width_and_reads_no_feature(features):
    plan = plan_evaluate(features, **{**SHAPE, "shots": ("all",)}, **SHORT)
    (unit,) = plan.units
    # 10 searches: the startup round trains 2 trials of each together, then 1, then retrains.
    assert [(p["groups"], p["configs"]) for p in unit["phases"]] == [(10, 2), (10, 1), (10, 1)]
    assert {(s["groups"], s["configs"]) for s in plan.rates["steps"]} == {(10, 2), (10, 1)}
    assert all(s["width"] == [8, 3] for s in plan.rates["steps"])
    assert plan.rates["optuna_s_per_trial"] > 0
    assert plan.bytes_to_read == 0  # arrays in memory: no store to read
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["flop"]["sgd"] == unit["flop_sgd"] and data["seconds"]["total"] > 0


@pytest.mark.slow
def test_evaluate_plan_on_the_command_line(tiny_in1k_store, capsys):
    store = tiny_in1k_store()
    before = sorted(store.store.parent.rglob("*"))
    args = ["evaluate", str(store.store), "--plan", "--trials", "2", "--startup-trials", "1"]
    assert cli.main([*args, "--epochs", "2", "--shots", "1,all", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Nothing has been trained." in out and "Memory plan:" in out
    assert "PFLOP of SGD products" in out and "measured here: SGD steps at the run's" in out
    assert "GB of stores to read" in out and "predicted on this device" in out
    assert sorted(store.store.parent.rglob("*")) == before  # the plan writes nothing


def test_evaluate_without_out_or_plan_is_one_line(tmp_path, capsys):
    assert cli.main(["evaluate", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        (
            "imagenet-cog: error: evaluate needs an output folder: give --out RESULTS (or --plan "
            "to see what the run would take, without training)"
        )
    ]


def test_a_model_spec_cannot_be_planned():
    with pytest.raises(ValueError, match="plans the evaluation of features already extracted"):
        plan_evaluate("torchvision:resnet18", device="cpu")


def test_the_work_of_a_store_root_is_read_from_its_manifests(tiny_in1k_store):
    store = tiny_in1k_store()
    plan = plan_evaluate(store.store, domains=("in1k",), shots=("all",), seeds=(22,), **SHORT)
    files = sorted(store.store.rglob("shard-*.npy"))
    assert plan.bytes_to_read == sum(p.stat().st_size for p in files)
    assert plan.rates["read_bytes_per_s"] > 0
    labels = np.unique(
        [
            line.split("\t")[1]
            for line in (store.store / "in1k" / "train" / "rows.tsv").read_text().splitlines()[1:]
        ]
    )
    assert plan.units[0]["width"][1] == len(labels)
    # A resident unit takes every training row and every test row into memory once, copied
    # out of the memory maps at the rate measured on the first shard.
    tables = (store.store / "in1k").glob("*/rows.tsv")
    rows = sum(len(p.read_text().splitlines()) - 1 for p in tables)  # less each header
    assert plan.units[0]["resident"] and plan.units[0]["copy_rows"] == rows
    copied = rows * plan.units[0]["width"][0] * 4
    assert plan.seconds["copies"] == pytest.approx(
        copied / plan.rates["copy_bytes_per_s"], abs=1e-3
    )
    assert "copying rows into memory" in plan.table()


# ------------------------------------------------------------------ a step costed by its rows
def test_the_plan_times_steps_on_the_rows_they_train_on(monkeypatch):
    """A few-shot unit trains on a few rows a step, not a full batch: the plan times its
    steps there, with every search of the unit a group of its round's trials, as evaluate
    trains them."""
    from imagenet_cog._train import engine

    timed = []
    real = engine.train_many

    def recording(data, configs, **kw):
        if kw["n_classes"] != 4:  # the tiny run that times what a run costs beside its work
            return real(data, configs, **kw)
        sizes = {len(c.train_idx) for c in configs}
        groups = len({(c.seed, len(c.train_idx), bytes(c.train_idx)) for c in configs})
        rows = {min(kw["protocol"].batch_size, n) for n in sizes}
        timed.append((groups, len(configs) // groups, rows))
        return real(data, configs, **kw)

    monkeypatch.setattr(engine, "train_many", recording)
    features = {"L1": synthetic_domain(1.0, n_classes=4, n_train=30, n_test=10, dim=8, seed=0)}
    # 1 shot of 4 classes: each search trains on 4 rows a step; 2 seeds are 2 searches.
    plan = plan_evaluate(
        features, domains=("L1",), shots=(1,), seeds=(22, 37), n_trials=3,
        n_startup_trials=2, epochs=2, batch_size=1024, device="cpu",
    )  # fmt: skip
    assert timed and all(rows == {4} for _, _, rows in timed), timed
    assert {(g, k) for g, k, _ in timed} >= {(2, 2), (2, 1)}
    (unit,) = plan.units
    phases = unit["phases"]
    # The startup round (2 trials of each search), one more trial, the retrains: all on 4 rows.
    assert [(p["calls"], p["groups"], p["configs"], p["rows"]) for p in phases] == [
        (1, 2, 2, 4),
        (1, 2, 1, 4),
        (1, 2, 1, 4),
    ]
    # The unit's SGD is each phase's calls of its epochs of steps, at the step time measured
    # at its shape, and the call's own cost.
    shapes = {(s["groups"], s["configs"], s["rows"]): s for s in plan.rates["steps"]}
    sgd = 0.0
    for p in phases:
        s = shapes[(p["groups"], p["configs"], p["rows"])]
        steps = sum(active * n for active, n in p["steps"]) / p["groups"]
        sgd += p["calls"] * (s["call_ms"] + p["epochs"] * steps * s["step_ms"]) / 1e3
    assert plan.seconds["sgd"] == pytest.approx(sgd, abs=1e-3)
    # Each kind of pass is timed with its evaluation too: the searches' 6 validation rows of
    # each class, the retrains' 10 test rows of each class, their best classes kept.
    evals = {(e["configs"], tuple(e["eval_rows"]), e["final"]) for e in plan.rates["evals"]}
    assert evals == {(2, (24, 24), False), (1, (24, 24), False), (1, (40, 40), True)}
    # And what the command costs beside the run, in a fresh process: Python, the imports, the
    # report.
    assert plan.rates["command_s"] > 0 and plan.seconds["command"] == plan.rates["command_s"]


def test_a_timed_pass_trains_each_search_on_its_own_rows(monkeypatch):
    """A unit of a large domain beside small ones: each search of the timed pass trains on
    as many rows as it does in the run (a small domain's one partial batch, not a full one),
    so that the plan does not cost the small searches' steps at the large one's batch."""
    from imagenet_cog._train import engine

    timed = []
    real = engine.train_many

    def recording(data, configs, **kw):
        if kw["n_classes"] == 4:
            timed.append(sorted({len(c.train_idx) for c in configs}))
        return real(data, configs, **kw)

    monkeypatch.setattr(engine, "train_many", recording)
    features = {
        "in1k": synthetic_domain(1.0, n_classes=4, n_train=300, n_test=10, dim=8, seed=0),
        "L1": synthetic_domain(1.0, n_classes=4, n_train=30, n_test=10, dim=8, seed=1),
    }
    plan = plan_evaluate(
        features, domains=("in1k", "L1"), shots=("all",), seeds=(22,), n_trials=2,
        n_startup_trials=2, epochs=2, batch_size=64, device="cpu",
    )  # fmt: skip
    (unit,) = plan.units
    search = unit["phases"][0]
    # IN-1K's search: 960 rows, 15 steps of 64 rows (timed on 4 of them); L1's: 96 rows, 2.
    assert search["rows"] == 64 and search["steps"] == [[2, 2], [1, 13]]
    assert [256, 96] in [sorted(t, reverse=True) for t in timed], timed
    shape = next(s for s in plan.rates["steps"] if s["configs"] == 2)
    assert shape["timed_rows"] == [256, 96]


def test_a_unit_s_steps_count_only_the_searches_that_take_them():
    """A unit whose searches have different numbers of steps an epoch (a large domain beside
    small ones) steps only the searches whose epoch is not over, as the engine does."""
    from imagenet_cog._protocol.plan import count_work
    from imagenet_cog._train.memplan import Unit

    unit = Unit("all", (("in1k", 22), ("L1", 22), ("L2", 22)), True, 0)
    counts = {"in1k": np.full(5, 1300), "L1": np.full(5, 100), "L2": np.full(5, 100)}
    protocol = PAPER_PROTOCOL.replace(epochs=20)
    (work,) = count_work([unit], counts, dict.fromkeys(counts, 50), dict.fromkeys(counts, (8, 5)),
                         protocol)  # fmt: skip
    # 10 startup trials of each search, 20 more, the retrains: 20 epochs each.
    assert work["trial_steps"] == 20 * (10 * 8 + 20 * 8 + 9)
    startup, later, final = work["phases"]
    # IN-1K: 5,200 search rows, 6 steps of 1,024 rows; L1 and L2: 400 rows, one step.
    # Each search's trials are scored on its 20% validation rows.
    assert startup == {"calls": 1, "groups": 3, "configs": 10, "rows": 1024,
                       "steps": [[3, 1], [1, 5]], "group_rows": [5200, 400, 400], "epochs": 20,
                       "eval_rows": [1300, 100, 100],
                       "final": False}  # fmt: skip
    assert (later["calls"], later["configs"], later["steps"]) == (20, 1, [[3, 1], [1, 5]])
    # The retrains: 6,500 rows of IN-1K (7 steps), 500 of each level (one step).
    assert (final["calls"], final["configs"], final["steps"]) == (1, 1, [[3, 1], [1, 6]])
    assert final["eval_rows"] == [50, 50, 50] and final["final"]  # the test rows


def test_the_plan_times_a_small_optuna_study_whatever_the_trials(monkeypatch):
    """The plan's Optuna timing asks a small study of a fixed size and scales it: a hundred
    million trials are predicted, not run."""
    import optuna

    from imagenet_cog._protocol.plan import measure_optuna

    asked = []
    real = optuna.study.Study.ask

    def ask(self, *args, **kwargs):
        asked.append(1)
        if len(asked) > 1000:
            raise AssertionError("the plan's Optuna timing asked more than 1,000 trials")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(optuna.study.Study, "ask", ask)
    small = measure_optuna(30, 10)
    assert len(asked) == 30  # a study of the paper's size is timed whole
    asked.clear()
    huge = measure_optuna(100_000_000, 10)
    assert 0 < len(asked) <= 200
    # TPE's asking grows with the trials told: a long study costs more per trial.
    assert huge > small
    features = {"L1": synthetic_domain(1.0, n_classes=3, n_train=20, n_test=5, dim=4, seed=0)}
    asked.clear()
    plan = plan_evaluate(
        features, domains=("L1",), shots=("all",), seeds=(22,), n_trials=100_000_000,
        n_startup_trials=10, epochs=1, batch_size=64, device="cpu",
    )  # fmt: skip
    assert len(asked) <= 200
    assert plan.seconds["optuna"] == pytest.approx(100_000_000 * plan.rates["optuna_s_per_trial"])


# ------------------------------------------- the plan refuses what evaluate refuses
@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The stores of L1 and L2 (4 concepts of 8 images, 2 of them test images), extracted
    with a random ResNet-18 and levels of their own; and beside them a copy whose L2 was
    extracted with a random ResNet-34."""
    import shutil

    from imagefiles import plain_concepts, write_concepts

    from imagenet_cog import Levels, extract_all

    root = tmp_path_factory.mktemp("plan-stores")
    concepts = ["n00000001", "n00000002", "n00000003", "n00000004"]
    write_concepts(root / "in21k", plain_concepts(concepts, 8))
    Levels([concepts[:2], concepts[2:]]).save(root / "levels")
    kw = {"n_test": 2, "preprocessing": {"size": 16}, "batch_size": 16, "progress": False}
    images, levels = {"in21k": root / "in21k"}, str(root / "levels")
    extract_all("torchvision:resnet18:none", images, root / "features", levels, **kw)
    extract_all("torchvision:resnet34:none", images, root / "other", levels, domains=["L2"], **kw)
    shutil.copytree(root / "features", root / "mixed")
    shutil.rmtree(root / "mixed" / "L2")
    shutil.copytree(root / "other" / "L2", root / "mixed" / "L2")
    return root


RUN = ["--domains", "L1,L2", "--shots", "all", "--seeds", "22", "--device", "cpu"]
RUN += ["--trials", "2", "--startup-trials", "1", "--epochs", "2", "--quiet"]


@pytest.mark.parametrize(
    ("store", "options", "message"),
    [
        ("features", ["--levels", "official"], "are not the levels the stores in"),
        ("features", ["--seeds", str(2**32)], r"seeds must be below 2\*\*32"),
        ("features", ["--shots", "6"], "N=6 shots asked, but class 'n00000001' has 6 training"),
        ("features", ["--jobs", "0"], "n_jobs must be a nonzero integer"),
        ("mixed", [], r"the feature store .*L2/train was made differently"),
    ],
    ids=["levels", "seed", "shots", "jobs", "models"],
)
def test_the_plan_refuses_in_one_line_what_evaluate_refuses(
    stores, tmp_path, capsys, store, options, message
):
    # Before: the plan printed a plan (exit 0) for every one of these runs.
    out = tmp_path / "run"
    argv = ["evaluate", str(stores / store), *RUN, *options]
    assert cli.main([*argv, "--out", str(out)]) == 2
    refused = capsys.readouterr().err.strip()
    assert not out.exists()  # evaluate refused before writing anything
    assert cli.main([*argv, "--plan"]) == 2
    planned = capsys.readouterr()
    assert planned.err.strip() == refused and len(refused.splitlines()) == 1
    assert re.search(message, refused), refused
    assert "Nothing has been trained" not in planned.out


def test_the_cost_docs_give_the_plans_count_at_the_papers_sizes():
    # docs/guide/cost.rst computes the protocol's hours from its work: the figure must be the
    # plan's own count at the paper's sizes (IN-1K's 1,281,167 training images, L1..L5's).
    from pathlib import Path

    from imagenet_cog._protocol.plan import count_work
    from imagenet_cog._train.memplan import Unit

    sizes = {
        "in1k": 1_281_167,
        "L1": 1_118_804,
        "L2": 1_115_788,
        "L3": 1_095_203,
        "L4": 1_107_128,
        "L5": 1_091_654,
    }
    counts = {d: np.full(1000, n // 1000) + (np.arange(1000) < n % 1000) for d, n in sizes.items()}
    units = [Unit(n, tuple((d, s) for d in sizes for s in SEEDS), True) for n in SHOTS]
    work = count_work(
        units,
        counts,
        dict.fromkeys(sizes, 50_000),
        dict.fromkeys(sizes, (2048, 1000)),
        PAPER_PROTOCOL,
    )
    total = sum(u["flop_sgd"] for u in work) / 1e15
    all_data = next(u["flop_sgd"] for u in work if u["shots"] == "all") / 1e15
    docs = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "cost.rst").read_text()
    text = " ".join(docs.split())
    assert f"{total:.1f} PFLOP of SGD products in all" in text
    assert f"and {(total - all_data) / len(sizes):.1f} for the few-shot cells" in text


def test_the_commands_fixed_cost_keeps_the_imports_evaluate_makes():
    # The command's fixed cost is its time less its tiny run's: the imports evaluate makes
    # when it starts (torch, optuna: seconds) are the command's, so the tiny run makes none.
    import ast
    import subprocess
    import sys

    from helpers import subprocess_env

    from imagenet_cog._protocol import plan

    code = plan._COMMAND.replace(
        "trained = time.perf_counter()\n",
        "trained = time.perf_counter(); before = set(sys.modules)\n",
        1,
    ).replace(
        "print(trained)", "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=subprocess_env(),
    )
    imported = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert "torch" not in imported and "optuna" not in imported, imported
