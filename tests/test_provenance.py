"""Every number traceable from image to ranking: what evaluate reads from the feature stores
and records in config.json, the stores it refuses, the levels it takes from them, random
weights, TF32 on a CPU, and the stores and run folders of another format version it refuses."""

import hashlib
import json
import logging
import shutil

import pytest
from helpers import strip_timings
from imagefiles import plain_concepts, write_concepts

from imagenet_cog import Levels, comparability, evaluate, extract_all
from imagenet_cog.cli import main

FAST = {
    "n_trials": 2,
    "n_startup_trials": 2,
    "epochs": 3,
    "batch_size": 64,
    "device": "cpu",
    "progress": False,
}
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
    extract_all(
        "torchvision:resnet18:none", {"in21k": root / "in21k"}, store, str(levels), **EXTRACT
    )
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
        (
            "torchvision:resnet34:none",
            "model 'torchvision:resnet34:none', where L1/train has 'torchvision:resnet18:none'",
        ),
        ("torchvision:mobilenet_v3_small:none", "dim 1024, where L1/train has 512"),
    ],
)
def test_a_store_of_another_model_in_the_folder_is_refused(world, tmp_path, spec, expect):
    store = _copy(world, tmp_path)
    other = tmp_path / "other"
    extract_all(
        spec,
        {"in21k": world["root"] / "in21k"},
        other,
        str(world["levels"]),
        domains=["L2"],
        **EXTRACT,
    )
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
    argv = [
        "evaluate",
        str(world["store"]),
        "--domains",
        "L1,L2",
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
    ]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    config = _config(out)
    assert config["levels"] == str(world["levels"])  # not "official"
    assert config["levels_sha256"] == Levels.load(world["levels"]).checksum
    # The tables carry the banner: random weights, 2 concepts, the preprocessing...
    assert printed.startswith("!!! NOT COMPARABLE with the paper: resnet18-random !!!")
    assert "random-initialised weights" in printed.split("\n\n")[0]
    # --levels is accepted and checked against the stores, by content.
    copy = tmp_path / "levels_copy"
    shutil.copytree(world["levels"], copy)
    assert main([*argv, "--out", str(tmp_path / "run2"), "--levels", str(copy)]) == 0
    assert _config(tmp_path / "run2")["levels"] == str(world["levels"])
    # Given, or taken from the stores, the levels are kept in the run folder, bound to it
    # (verify checks them).
    for run in (out, tmp_path / "run2"):
        assert Levels.load(run / "levels").checksum == config["levels_sha256"]
    # Taken from the stores when they are no longer where the stores name them, none is kept,
    # and verify says so.
    moved = tmp_path / "levels_moved"
    world["levels"].rename(moved)
    try:
        assert main([*argv, "--out", str(tmp_path / "run4")]) == 0
    finally:
        moved.rename(world["levels"])
    assert not (tmp_path / "run4" / "levels").exists()
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "run2"), str(out), str(tmp_path / "run4")]) == 0
    said = capsys.readouterr().out.splitlines()
    line = (
        f"  not checked: no copy of the levels {str(world['levels'])!r} in "
        f"{tmp_path / 'run4' / 'levels'} (a run of an earlier version, or made when they were "
        "no longer where its stores name them): report --html and analyze --concepts need "
        "them given with --levels"
    )
    assert [x for x in said if "not checked" in x] == [line]
    assert main([*argv, "--out", str(tmp_path / "run3"), "--levels", "official"]) == 2
    err = capsys.readouterr().err
    assert "levels='official' are not the levels the stores" in err and "lv_cog" in err
    with pytest.raises(ValueError, match="are not the levels the stores"):
        evaluate(world["store"], levels="official", **RUN)


def test_stores_of_another_format_version_are_refused_before_anything_is_written(world, tmp_path):
    store = _copy(world, tmp_path)
    for manifest in store.glob("*/*/manifest.json"):  # as the first format wrote them
        data = json.loads(manifest.read_text())
        data["format_version"] = 1
        manifest.write_text(json.dumps(data))
    out = tmp_path / "a"
    with pytest.raises(ValueError) as err:
        evaluate(store, out=out, **RUN)
    assert str(err.value) == (
        f"{store / 'L1' / 'train' / 'manifest.json'}: not a imagenet_cog.features v2 manifest "
        "(a store of format version 1, which this version of imagenet_cog does not read); "
        "extract these features again, into a new folder or with overwrite=True (--overwrite)"
    )
    assert not out.exists()


def test_evaluate_reads_each_store_manifest_once(world, tmp_path, monkeypatch):
    # The checks, the levels, the fingerprints, the provenance, the memory plan and each
    # lockstep unit all ask the feature source; each manifest is read once for all of them.
    from collections import Counter

    from imagenet_cog import _storecheck, store

    reads = Counter()
    read = _storecheck.read_manifest

    def counted(path, *args):
        reads[str(path)] += 1
        return read(path, *args)

    monkeypatch.setattr(_storecheck, "read_manifest", counted)
    monkeypatch.setattr(store, "read_manifest", counted)
    evaluate(
        world["store"], out=tmp_path / "run", **{**RUN, "shots": (1, "all"), "seeds": (22, 37)}
    )
    manifests = sorted(str(p) for p in world["store"].glob("*/*/manifest.json"))
    assert len(manifests) == 4
    assert sorted(reads) == manifests
    assert set(reads.values()) == {1}


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
        assert data["split"] == {
            "seed": 0,
            "cap": 1300,
            "n_test": 2,
            "official_test_lists": 0,
            "n_concepts": 2,
        }
        assert data["levels"] == {
            "name": str(world["levels"]),
            "sha256": Levels.load(world["levels"]).checksum,
        }
    found = comparability(res, by_model=True)["resnet18-random"]["deviations"]
    assert "random-initialised weights: 'torchvision:resnet18:none' names no weights" in found
    assert any(
        x.startswith(
            "extracted with preprocessing crop=16, resize=16 instead of the "
            "preset's crop=224, resize=224"
        )
        for x in found
    )
    assert "levels" in res.meta["protocol"]["resnet18-random"]
    assert res.meta["protocol"]["resnet18-random"]["data"] == config["data"]


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
    assert said[0].startswith(
        "imagenet_cog: 'torchvision:resnet18' names no weights: the "
        "network keeps its random initialisation"
    )
    assert origin == {
        "weights": "random",
        "differs_from_preset": {"preprocessing": origin["differs_from_preset"]["preprocessing"]},
        "loader": "imagenet_cog._models.torchvision_source:load",
        "weights_files": [],
    }
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
        "loader": "imagenet_cog._models.torchvision_source:load",
        "weights_files": [
            {
                "name": "resnet18.pth",
                "bytes": file.stat().st_size,
                "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
            }
        ],
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


# ------------------------------------------- a run folder of another format version
def test_a_run_folder_of_another_format_version_is_refused_in_one_line(tmp_path):
    from test_protocol import synthetic_features

    from imagenet_cog import Results
    from imagenet_cog._runfolder import FORMAT_VERSION

    feats = {"L1": synthetic_features()["L1"]}
    out = tmp_path / "run"
    kw = {"domains": ("L1",), "shots": ("all",), **FAST}
    evaluate(feats, out=out, seeds=(22,), **kw)
    config = _config(out)
    assert (config["format"], config["format_version"]) == ("imagenet_cog.run", FORMAT_VERSION)
    before = (out / "runs.jsonl").read_bytes()
    for key in ("format", "format_version"):  # as the first format wrote it
        del config[key]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    expect = (
        f"{out / 'config.json'}: written in format version 1, and this version of imagenet_cog "
        f"reads format version {FORMAT_VERSION} only; run evaluate again into a new out folder "
        "to get results it reads"
    )
    with pytest.raises(ValueError) as err:
        evaluate(feats, out=out, seeds=(22, 37), **kw)
    assert str(err.value) == expect
    assert (out / "runs.jsonl").read_bytes() == before  # nothing appended
    with pytest.raises(ValueError) as err:
        Results.load(out)
    assert str(err.value) == expect
    assert main(["report", str(out)]) == 2


def test_an_analysis_file_of_another_format_version_is_refused(tmp_path):
    from imagenet_cog._runfolder import read_analysis, write_analysis

    path = write_analysis(tmp_path / "analysis.json", {"model": "m", "domains": {}})
    assert read_analysis(path) == {"model": "m", "domains": {}}
    path.write_text(json.dumps({"model": "m", "domains": {}}))  # as the first format wrote it
    with pytest.raises(
        ValueError,
        match=r"analysis\.json: written in format version 1, .*; "
        "run analyze again to write one it reads$",
    ):
        read_analysis(path)


# ------------------------------------------------------- the weights, by file and by tensors
def test_the_weights_file_s_sha256_is_recorded_beside_the_state_dict_s(world, tmp_path):
    """A user's ``sha256sum`` of the weights file is what the manifest, config.json and the
    reports show as the file's sha256; the state dict's digest, the store key's
    ``weights_sha256``, is shown apart, named for what it is, and the key is the one stores
    were made with before."""
    import torch
    import torchvision

    from imagenet_cog._reporting.html import _provenance
    from imagenet_cog.features import weights_sha256
    from imagenet_cog.store import open_store

    net = torchvision.models.resnet18()
    torch.save(net.state_dict(), tmp_path / "r18.pth")
    data = (tmp_path / "r18.pth").read_bytes()
    file_sha = hashlib.sha256(data).hexdigest()
    spec = f"torchvision:resnet18:{tmp_path / 'r18.pth'}"
    store = tmp_path / "features"
    extract_all(spec, {"in21k": world["root"] / "in21k"}, store, str(world["levels"]), **EXTRACT)
    manifest = open_store(store / "L1" / "train").manifest
    tensors = weights_sha256(net)
    assert manifest["origin"]["weights_files"] == [
        {"name": "r18.pth", "bytes": len(data), "sha256": file_sha}
    ]
    # The key is unchanged: the state dict's digest, the spec by that digest.
    assert manifest["key"]["weights_sha256"] == tensors != file_sha
    assert manifest["key"]["model"] == f"torchvision:resnet18:sha256-{tensors[:16]}"
    out = tmp_path / "run"
    results = evaluate(store, out=out, **RUN)
    extraction = _config(out)["data"]["L1"]["extraction"]
    assert extraction["weights_files"] == manifest["origin"]["weights_files"]
    assert extraction["weights_sha256"] == tensors
    page = _provenance(results, results.models)  # the HTML report's "what made the numbers"
    assert f"<dt>weights file sha256</dt><dd>{file_sha} (r18.pth, {len(data):,} bytes" in page
    assert f"<dt>weights&#x27; state dict sha256</dt><dd>{tensors} (" in page
    assert "<dt>weights sha256</dt>" not in page
    # Random weights read no file: none is recorded.
    none = open_store(world["store"] / "L1" / "train").manifest
    assert none["origin"]["weights_files"] == []
