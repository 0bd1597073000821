"""Every number traceable from image to ranking: what evaluate reads from the feature stores
and records in config.json, the stores it refuses, the levels it takes from them, random
weights, TF32 on a CPU, and run folders started by an earlier version."""

import hashlib
import json
import logging
import shutil

import pytest
from imagefiles import plain_concepts, write_concepts

from imagenet_cog import Levels, evaluate, extract_all
from imagenet_cog.cli import main
from imagenet_cog.protocol import strip_timings
from imagenet_cog.results import comparability

FAST = {"n_trials": 2, "n_startup_trials": 2, "epochs": 3, "batch_size": 64, "device": "cpu",
        "progress": False}  # fmt: skip
CONCEPTS = ["n00000001", "n00000002", "n00000003", "n00000004"]
EXTRACT = {"n_test": 2, "preprocessing": {"size": 16}, "batch_size": 16, "progress": False}
RUN = {"domains": ("L1", "L2"), "shots": ("all",), "seeds": (22,), **FAST}


def _sorted_sha(names):
    return hashlib.sha256("\n".join(sorted(set(names))).encode()).hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Images of 4 concepts, levels of 2 x 2 of them saved in a folder, and the stores of
    L1 and L2 extracted with a random ResNet-18 and those levels."""
    root = tmp_path_factory.mktemp("provenance")
    write_concepts(root / "in21k", plain_concepts(CONCEPTS, 8))
    levels = root / "lv_cog"
    Levels([CONCEPTS[:2], CONCEPTS[2:]]).save(levels)
    store = root / "features"
    extract_all("torchvision:resnet18:none", {"in21k": root / "in21k"}, store, str(levels),
                **EXTRACT)  # fmt: skip
    return {"root": root, "levels": levels, "store": store}


def _copy(world, tmp_path):
    copy = tmp_path / "features"
    shutil.copytree(world["store"], copy)
    return copy


def _config(out):
    return json.loads((out / "config.json").read_text())


# ------------------------------------------------------- stores that disagree
@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        ("torchvision:resnet34:none",
         "model 'torchvision:resnet34:none', where L1/train has 'torchvision:resnet18:none'"),
        ("torchvision:mobilenet_v3_small:none", "dim 1024, where L1/train has 512"),
    ],
)  # fmt: skip
def test_a_store_of_another_model_in_the_folder_is_refused(world, tmp_path, spec, expect):
    store = _copy(world, tmp_path)
    other = tmp_path / "other"
    extract_all(spec, {"in21k": world["root"] / "in21k"}, other, str(world["levels"]),
                domains=["L2"], **EXTRACT)  # fmt: skip
    shutil.rmtree(store / "L2")
    shutil.copytree(other / "L2", store / "L2")
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"the feature store .*L2/train was made differently") as e:
        evaluate(store, out=out, **RUN)
    assert expect in str(e.value) and "L1/train" in str(e.value)
    assert not out.exists()  # refused before anything is written
    assert main(["evaluate", str(store), "--out", str(out), "--domains", "L1,L2", "--quiet"]) == 2


# -------------------------------------------------------- levels from the stores
def test_cli_evaluate_takes_the_levels_from_the_stores_and_checks_levels(world, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["evaluate", str(world["store"]), "--domains", "L1,L2", "--shots", "all", "--seeds",
            "22", "--trials", "2", "--epochs", "3", "--device", "cpu", "--quiet"]  # fmt: skip
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    config = _config(out)
    assert config["levels"] == str(world["levels"])  # not "official"
    assert config["levels_sha256"] == Levels.load(world["levels"]).checksum
    # The tables carry the banner: random weights, 2 concepts, the preprocessing...
    assert printed.startswith("!!! NOT COMPARABLE with the paper: torchvision:resnet18:none !!!")
    assert "random-initialised weights" in printed.split("\n\n")[0]
    # --levels is accepted and checked against the stores, by content.
    copy = tmp_path / "levels_copy"
    shutil.copytree(world["levels"], copy)
    assert main([*argv, "--out", str(tmp_path / "run2"), "--levels", str(copy)]) == 0
    assert _config(tmp_path / "run2")["levels"] == str(world["levels"])
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "run3"), "--levels", "official"]) == 2
    err = capsys.readouterr().err
    assert "levels='official' are not the levels the stores" in err and "lv_cog" in err
    with pytest.raises(ValueError, match="are not the levels the stores"):
        evaluate(world["store"], levels="official", **RUN)


def test_stores_of_an_earlier_version_are_checked_by_their_concepts(world, tmp_path):
    store = _copy(world, tmp_path)
    for manifest in store.glob("*/*/manifest.json"):  # as an earlier version wrote them
        data = json.loads(manifest.read_text())
        del data["origin"], data["split"]["levels_sha256"]
        manifest.write_text(json.dumps(data))
    res = evaluate(store, out=tmp_path / "a", **RUN)
    assert _config(tmp_path / "a")["levels_sha256"] is None
    found = comparability(res, by_model=True)["torchvision:resnet18:none"]
    assert "random-initialised weights: 'torchvision:resnet18:none' names no weights" in found[
        "deviations"]  # the spec tells it  # fmt: skip
    assert any("not checked against the model's preset" in c for c in found["caveats"])
    evaluate(store, levels=str(world["levels"]), out=tmp_path / "b", **RUN)
    assert _config(tmp_path / "b")["levels_sha256"] == Levels.load(world["levels"]).checksum
    swapped = tmp_path / "swapped"
    Levels([CONCEPTS[2:], CONCEPTS[:2]]).save(swapped)
    with pytest.raises(ValueError, match="the concepts of L1 differ"):
        evaluate(store, levels=str(swapped), **RUN)


# ------------------------------------------------------------ config.json
def test_config_records_each_domains_provenance_and_comparability_reads_it(world, tmp_path):
    res = evaluate(world["store"], out=tmp_path / "run", **RUN)
    config = _config(tmp_path / "run")
    assert config["config_hash"] == res.records[0]["config_hash"]
    for domain, wnids in (("L1", CONCEPTS[:2]), ("L2", CONCEPTS[2:])):
        data = config["data"][domain]
        ext = data["extraction"]
        assert ext["model"] == "torchvision:resnet18:none" and ext["weights"] == "random"
        assert len(ext["weights_sha256"]) == 64 and ext["layer"] == "input:fc"
        assert ext["preprocessing"]["crop"] == 16 and ext["amp"] == "off"
        assert ext["decoder"] == "pil" and ext["normalize"] is True
        assert ext["differs_from_preset"]["preprocessing"]["preset"]["crop"] == 224
        for split in ("train", "test"):
            listed = (world["store"] / domain / split / "split.tsv").read_text().splitlines()[1:]
            ids = [line.split("\t")[0] for line in listed]
            assert data[f"{split}_ids_sha256"] == _sorted_sha(ids)
            assert all(i.split("/")[0] in wnids for i in ids)
        assert data["n_train"] == 12 and data["n_test"] == 4
        assert data["split"] == {"seed": 0, "cap": 1300, "n_test": 2, "official_test_lists": 0,
                                 "n_concepts": 2}  # fmt: skip
        assert data["levels"] == {"name": str(world["levels"]),
                                  "sha256": Levels.load(world["levels"]).checksum}  # fmt: skip
    found = comparability(res, by_model=True)["torchvision:resnet18:none"]["deviations"]
    assert "random-initialised weights: 'torchvision:resnet18:none' names no weights" in found
    assert any(x.startswith("extracted with preprocessing crop=16, resize=16 instead of the "
                            "preset's crop=224, resize=224") for x in found)  # fmt: skip
    assert "levels" in res.meta["protocol"]["torchvision:resnet18:none"]
    assert res.meta["protocol"]["torchvision:resnet18:none"]["data"] == config["data"]


# ----------------------------------------------------------------- random weights
def test_random_weights_are_said_in_one_line_and_recorded(tmp_path, caplog):
    import torch
    import torchvision

    from imagenet_cog import FeatureExtractor

    with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
        extractor = FeatureExtractor("torchvision:resnet18", preprocessing={"size": 16})
        origin = extractor._load()["origin"]
    said = [r.getMessage() for r in caplog.records if r.name == "imagenet_cog"]
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith("imagenet_cog: 'torchvision:resnet18' names no weights: the "
                              "network keeps its random initialisation")  # fmt: skip
    assert origin == {"weights": "random",
                      "differs_from_preset": {"preprocessing": origin["differs_from_preset"]
                                              ["preprocessing"]}}  # fmt: skip
    caplog.clear()
    file = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), file)
    with caplog.at_level(logging.WARNING, logger="imagenet_cog"):
        for spec in ("torchvision:resnet18:none", f"torchvision:resnet18:{file}"):
            loaded = FeatureExtractor(spec, layer="avgpool")._load()
    assert not [r for r in caplog.records if r.name == "imagenet_cog"]
    assert loaded["origin"] == {
        "weights": str(file),
        "differs_from_preset": {"layer": {"used": "output:avgpool", "preset": "input:fc"}},
    }


def test_a_store_records_the_weights_origin(world):
    manifest = json.loads((world["store"] / "L1" / "train" / "manifest.json").read_text())
    assert manifest["origin"]["weights"] == "random"
    assert set(manifest["origin"]["differs_from_preset"]) == {"preprocessing"}


# ----------------------------------------------------------------- TF32 on a CPU
def test_tf32_on_a_cpu_records_what_the_default_does(tmp_path):
    from test_protocol import synthetic_features

    feats = {"L1": synthetic_features()["L1"]}
    kw = {"domains": ("L1",), "shots": (2, "all"), "seeds": (22, 37), **FAST}
    default = evaluate(feats, out=tmp_path / "a", **kw)
    tf32 = evaluate(feats, out=tmp_path / "b", mixed_precision="tf32", **kw)
    assert [strip_timings(r) for r in tf32.records] == [strip_timings(r) for r in default.records]
    assert _config(tmp_path / "b")["protocol"]["mixed_precision"] is None
    assert not any("mixed precision" in n for n in comparability(tf32))
    # The two folders hold one configuration: a default run resumes the TF32 one.
    again = evaluate(feats, out=tmp_path / "b", **kw)
    assert len(again.records) == 4


# ------------------------------------------------ a run folder of an earlier version
def _as_an_earlier_version_wrote_it(out):
    """config.json and runs.jsonl as the version before the provenance fields wrote them."""
    from imagenet_cog._runfolder import hash_config

    config = _config(out)
    for key in ("levels_sha256", "config_hash", "config_sha256"):  # none of these written then
        del config[key]
    config["levels"] = "official"  # its default for arrays
    for info in config["data"].values():
        for key in ("extraction", "train_ids_sha256", "test_ids_sha256"):
            del info[key]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    old = hash_config(config)
    lines = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    lines = [{k: v for k, v in r.items() if k not in ("record_sha256", "versions")}
             for r in lines]  # fmt: skip
    (out / "runs.jsonl").write_text("".join(json.dumps({**r, "config_hash": old}) + "\n"
                                            for r in lines))  # fmt: skip
    return old


def test_a_folder_of_an_earlier_version_resumes_or_is_refused_naming_the_field(tmp_path):
    from test_protocol import synthetic_features

    from imagenet_cog import Results

    feats = {"L1": synthetic_features()["L1"]}
    out = tmp_path / "run"
    kw = {"domains": ("L1",), "shots": ("all",), **FAST}
    evaluate(feats, out=out, seeds=(22,), **kw)
    old = _as_an_earlier_version_wrote_it(out)
    # A field it records otherwise is refused, and named.
    with pytest.raises(ValueError, match=r"different configuration \(protocol.epochs: 3 → 4\)"):
        evaluate(feats, out=out, seeds=(22, 37), **{**kw, "epochs": 4})
    Levels([["n00000000", "n00000001"]]).save(tmp_path / "mine")
    with pytest.raises(ValueError, match=r"different configuration \(levels: 'official' → '/"):
        evaluate(feats, out=out, seeds=(22, 37), levels=str(tmp_path / "mine"), **kw)
    # Its "levels": "official" was written without knowing them: it agrees with None.
    res = evaluate(feats, out=out, seeds=(22, 37), **kw)
    assert {r["config_hash"] for r in res.records} == {old}  # the folder's hash, kept
    config = _config(out)
    assert config["config_hash"] == old and config["levels"] is None
    assert "levels_sha256" in config
    assert config["data"]["L1"]["extraction"] is None  # completed: arrays record none
    assert len(Results.load(out).records) == 2  # one configuration in runs.jsonl
    again = evaluate(feats, out=out, seeds=(22, 37), **kw)
    assert len(again.records) == 2
