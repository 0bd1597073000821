"""extract_all and `imagenet-cog extract --in1k --in21k`: every store in one call."""

from pathlib import Path

import pytest
from imagefiles import plain_concepts, write_concepts, write_in1k

import imagenet_cog._extract_all as extract_all_module
import imagenet_cog.features as features_module
from imagenet_cog import Levels, extract, extract_all
from imagenet_cog.cli import main
from imagenet_cog.store import StoreMismatchError, list_domains, open_store

C1, C2, C3 = "n00000001", "n00000002", "n00000003"
LEVELS = Levels([[C1, C2], [C3]])
OPTS = {"n_test": 1, "preprocessing": {"size": 32}, "batch_size": 4, "shard_size": 3}
SPLITS = [(d, s) for d in ("in1k", "L1", "L2") for s in ("train", "test")]


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("data")
    in1k_wnids, _ = write_in1k(base / "in1k", n_classes=2, n_train=3, n_val=2)
    write_concepts(base / "in21k", plain_concepts([C1, C2, C3], 4, {C2: {2: "random"}}))
    return {"in1k": base / "in1k", "in21k": base / "in21k"}, in1k_wnids


def _shards(path):
    return {p.name: p.read_bytes() for p in sorted(Path(path).glob("shard-*"))}


def test_one_call_extracts_every_split_with_the_network_loaded_once(
    roots, tmp_path, monkeypatch, capsys
):
    data, in1k_wnids = roots
    loads = []
    real = features_module.load_source_model
    monkeypatch.setattr(
        features_module, "load_source_model", lambda spec: loads.append(spec) or real(spec)
    )
    wnids = {"in1k": in1k_wnids}
    out = extract_all("torchvision:resnet18", data, tmp_path / "all", LEVELS, wnids=wnids, **OPTS)
    assert out == tmp_path / "all"
    assert loads == ["torchvision:resnet18"]
    assert list_domains(out) == ["in1k", "L1", "L2"]
    # One bar over the images of all six splits (the listing bar counts splits).
    total = sum(open_store(out / d / s).manifest["n_images"] for d, s in SPLITS)
    err = capsys.readouterr().err
    assert f"{total}/{total}" in err and "6/6" in err
    # The stores are those of one extract() call per domain and split, byte for byte.
    for domain, split in SPLITS:
        root = data["in1k" if domain == "in1k" else "in21k"]
        path = extract(
            "torchvision:resnet18",
            root,
            domain,
            split,
            tmp_path / "one",
            LEVELS,
            wnids=wnids.get(domain),
            progress=False,
            **OPTS,
        )
        assert _shards(path) == _shards(out / domain / split), (domain, split)
        assert open_store(path).key == open_store(out / domain / split).key
    assert [s["id"] for s in open_store(out / "L1" / "train").skipped] == [f"{C2}/{C2}_2.JPEG"]


def test_a_rerun_skips_finished_splits_without_listing(roots, tmp_path, monkeypatch):
    data, in1k_wnids = roots
    wnids = {"in1k": in1k_wnids}
    out = tmp_path / "f"
    extract_all(
        "torchvision:resnet18", {"in21k": data["in21k"]}, out, LEVELS, progress=False, **OPTS
    )
    before = {(d, s): _shards(out / d / s) for d in ("L1", "L2") for s in ("train", "test")}
    listed = []
    real = extract_all_module.make_split
    monkeypatch.setattr(
        extract_all_module,
        "make_split",
        lambda root, d, s, *a, **k: listed.append((d, s)) or real(root, d, s, *a, **k),
    )
    # L1 and L2 are finished: only in1k's splits are listed and extracted.
    extract_all("torchvision:resnet18", data, out, LEVELS, wnids=wnids, progress=False, **OPTS)
    assert listed == [("in1k", "train"), ("in1k", "test")]
    assert {k: _shards(out / k[0] / k[1]) for k in before} == before
    listed.clear()
    extract_all("torchvision:resnet18", data, out, LEVELS, wnids=wnids, progress=False, **OPTS)
    assert listed == []
    # Other settings are never skipped silently.
    with pytest.raises(StoreMismatchError):
        extract_all(
            "torchvision:resnet18",
            data,
            out,
            LEVELS,
            wnids=wnids,
            progress=False,
            **{**OPTS, "preprocessing": {"size": 48}},
        )
    assert listed[:1] == [("in1k", "train")]


def test_bad_arguments(roots, tmp_path):
    data, _ = roots
    with pytest.raises(TypeError, match="mapping"):
        extract_all("torchvision:resnet18", data["in21k"], tmp_path, LEVELS)
    with pytest.raises(ValueError, match=r"keys must be 'in1k' and 'in21k'"):
        extract_all("torchvision:resnet18", {"imagenet": data["in1k"]}, tmp_path)
    with pytest.raises(ValueError, match=r"domain L1 needs data\['in21k'\]"):
        extract_all("torchvision:resnet18", {"in1k": data["in1k"]}, tmp_path, domains=["L1"])
    with pytest.raises(ValueError, match="none of the wnids given is a concept of L2"):
        extract_all("torchvision:resnet18", {"in21k": data["in21k"]}, tmp_path, LEVELS, wnids=[C1])


def test_cli_extracts_everything_in_one_command(roots, tmp_path, capsys):
    data, in1k_wnids = roots
    LEVELS.save(tmp_path / "levels")
    args = [
        "extract",
        "torchvision:resnet18",
        "--in1k",
        str(data["in1k"]),
        "--in21k",
        str(data["in21k"]),
        "--levels",
        str(tmp_path / "levels"),
        "--out",
        str(tmp_path / "f"),
        "--n-test",
        "1",
        "--preprocessing",
        '{"size": 32}',
        "--quiet",
        "--wnids",
        ",".join([*in1k_wnids, C1, C2, C3]),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert list_domains(tmp_path / "f") == ["in1k", "L1", "L2"]
    assert printed.count(" features, ") == 6
    assert f"{tmp_path / 'f' / 'L1' / 'train'}: 5 images x 512 features, 1 skipped" in printed
    # The levels again into the same root, without --in1k: its in1k stores are left alone.
    levels_only = [a for a in args if a not in ("--in1k", str(data["in1k"]))]
    assert main(levels_only) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert printed.count(" features, ") == 4 and "in1k" not in printed
    assert main(["extract", "--in21k", str(data["in21k"]), "--out", str(tmp_path)]) == 2
    assert "MODEL or --model" in capsys.readouterr().err
    assert main(["extract", "torchvision:resnet18", "--out", str(tmp_path)]) == 2
    assert "--in1k ROOT and/or --in21k ROOT" in capsys.readouterr().err
