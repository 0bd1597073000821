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
    apart = sum(plan.seconds[k] for k in ("setup", "read", "scans", "copies", "streaming"))
    assert plan.seconds["total"] == pytest.approx(
        sum(u["seconds"] for u in plan.units) + apart, abs=0.01
    )


def test_the_plan_times_the_run_s_width_and_reads_no_feature(features):
    plan = plan_evaluate(features, **{**SHAPE, "shots": ("all",)}, **SHORT)
    (unit,) = plan.units
    # 10 searches: the startup round trains 2 trials of each together, then 1, then retrains.
    assert [k for k, _ in unit["phases"]] == [20, 10, 10]
    assert set(plan.rates["ms_per_step"]) >= {"10", "20"}
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
    assert "PFLOP of SGD products" in out and "measured here: one SGD step" in out
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
