"""Measures and model sources of other packages: ``package.module:function`` on the command
line, and entry points of installed packages."""

import json
import textwrap
from pathlib import Path

import pytest

from imagenet_cog import PluginError, available_measures, available_model_sources, similarity
from imagenet_cog.cli import main

MEASURE = textwrap.dedent(
    """
    import numpy as np

    def depth_gap(a, b, *, taxonomy):
        depth = lambda ws: np.array([len(taxonomy.ancestors(w)) for w in ws], dtype=float)
        return -np.abs(depth(a)[:, None] - depth(b)[None, :])
    """
)
SOURCE = textwrap.dedent(
    """
    import torch
    from imagenet_cog import LoadedModel

    def load(name, weights, spec, *, load_weights=True):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(1))
        return LoadedModel(net, "random", {"size": 32}, "feature:pooled")

    def pretend(name, weights, spec, *, load_weights=True):
        # Any spec, even a torchvision one, gives this network, said to be pretrained.
        return LoadedModel(load(name, weights, spec).module, "pretrained", {"size": 32}, "feature:pooled")

    def module_only(name, weights, spec, *, load_weights=True):
        return load(name, weights, spec).module

    not_a_function = 3
    """
)
NO_TAXONOMY = textwrap.dedent(
    """
    import numpy as np

    def same(a, b):
        return np.zeros((len(a), len(b)))

    def infinite(a, b, *, taxonomy):
        return np.full((len(a), len(b)), np.inf)
    """
)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A package ``cogplug`` on sys.path, installed with entry points in both groups."""
    pkg = tmp_path / "cogplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "measures.py").write_text(MEASURE)
    (pkg / "sources.py").write_text(SOURCE)
    (pkg / "bad_measures.py").write_text(NO_TAXONOMY)
    dist = tmp_path / "cogplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cogplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[imagenet_cog.measures]\nplug-depth-gap = cogplug.measures:depth_gap\n\n"
        "[imagenet_cog.model_sources]\nplugnet = cogplug.sources:load\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # What the test registers (the plug-ins, once used) is gone after it.
    from imagenet_cog import measures
    from imagenet_cog._models import registry

    monkeypatch.setattr(measures, "_REGISTRY", measures._REGISTRY.copy())
    monkeypatch.setattr(registry, "_REGISTERED", registry._REGISTERED.copy())
    return tmp_path


def test_a_measure_named_by_its_module_path_and_by_an_entry_point(plugin):
    by_path = similarity("cogplug.measures:depth_gap", ["n02123159"], ["n02123045"])
    by_entry = similarity("plug-depth-gap", ["n02123159"], ["n02123045"])
    assert by_path.tolist() == by_entry.tolist() and by_path[0, 0] <= 0
    assert "plug-depth-gap" in available_measures()


def test_the_levels_command_takes_a_measure_of_another_package(plugin, tmp_path, capsys):
    out = tmp_path / "levels"
    args = ["levels", "--out", str(out), "--candidates", "cog", "--measure"]
    assert main([*args, "cogplug.measures:depth_gap"]) == 0
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["measure"] == "cogplug.measures:depth_gap"
    assert main([*args, "cogplug.measures:nope"]) == 2
    err = capsys.readouterr().err
    assert "module 'cogplug.measures' has no attribute 'nope'" in err


def test_unknown_measures_say_how_to_add_one(plugin):
    with pytest.raises(ValueError, match=r"package.module:function.*imagenet_cog.measures"):
        similarity("no-such-measure", ["n02123159"], ["n02123045"])


def test_a_model_source_from_an_entry_point_and_from_the_command_line(plugin):
    from imagenet_cog import FeatureExtractor

    assert "plugnet" in available_model_sources()
    extractor = FeatureExtractor("plugnet:tiny:none", device="cpu")
    assert extractor.get_preprocessing()["crop"] == 32
    from imagenet_cog.cli import build_parser

    args = build_parser().parse_args(["--source", "mine=cogplug.sources:load", "selftest"])
    assert args.source == ["mine=cogplug.sources:load"]
    from imagenet_cog.cli import _register_sources

    _register_sources(args.source)
    assert "mine" in available_model_sources()
    with pytest.raises(ValueError, match=r"use NAME=package\.module:function"):
        _register_sources(["cogplug.sources:load"])


# ------------------------------------------------------ which code loaded the network
def _extract_args(tmp_path, model):
    from imagefiles import plain_concepts, write_concepts

    from imagenet_cog import Levels

    wnids = ["n00000001", "n00000002"]
    write_concepts(tmp_path / "data", plain_concepts(wnids, 3))
    Levels([wnids]).save(tmp_path / "levels")
    return [
        "extract",
        "--model",
        model,
        "--data",
        str(tmp_path / "data"),
        "--domain",
        "L1",
        "--split",
        "train",
        "--out",
        str(tmp_path / "f"),
        "--levels",
        str(tmp_path / "levels"),
        "--n-test",
        "1",
        "--quiet",
    ]


def test_a_plug_in_in_a_built_in_sources_place_is_named_in_the_store(plugin, tmp_path):
    from official_run import paper_like

    from imagenet_cog import comparability
    from imagenet_cog.store import open_store

    spec = "torchvision:resnet50:IMAGENET1K_V1"
    args = ["--source", "torchvision=cogplug.sources:pretend", *_extract_args(tmp_path, spec)]
    assert main(args) == 0
    store = open_store(tmp_path / "f" / "L1" / "train")
    assert store.key["model"] == spec
    assert store.key["loader"] == "cogplug.sources:pretend"
    assert store.manifest["origin"]["loader"] == "cogplug.sources:pretend"
    run = paper_like(ext_loader="cogplug.sources:pretend")
    assert (
        "the network was loaded by cogplug.sources:pretend, a plug-in registered in place of the "
        f"library's 'torchvision' source: {spec!r} does not say which network and weights it "
        "holds, so they are not checked"
    ) in comparability(run, by_model=True)["mine"]["caveats"]


def test_the_librarys_own_source_is_named_in_the_manifest_not_the_key(tmp_path):
    from imagenet_cog.store import open_store

    assert main(_extract_args(tmp_path, "torchvision:resnet18:none")) == 0
    store = open_store(tmp_path / "f" / "L1" / "train")
    assert "loader" not in store.key  # stores made before keep their key
    assert store.manifest["origin"]["loader"] == "imagenet_cog._models.torchvision_source:load"


# ------------------------------------------------------------- contracts, in one line
def _one_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_plug_in_that_breaks_its_contract_is_said_in_one_line(plugin, tmp_path, capsys):
    args = ["--source", "plug=cogplug.sources:not_a_function", "selftest", "--only", "x"]
    assert main(args) == 2
    assert _one_line(capsys) == (
        "imagenet-cog: error: the loader of model source 'plug' is not callable"
    )
    args = ["--source", "plug=cogplug.sources:module_only", *_extract_args(tmp_path, "plug:x")]
    assert main(args) == 2
    assert _one_line(capsys) == (
        "imagenet-cog: error: the 'plug' model source returned a Sequential, not a LoadedModel "
        "(imagenet_cog.LoadedModel(module, weights, ...))"
    )
    levels = ["levels", "--out", str(tmp_path / "lv"), "--candidates", "cog", "--measure"]
    assert main([*levels, "cogplug.bad_measures:same"]) == 2
    assert _one_line(capsys) == (
        "imagenet-cog: error: measure 'cogplug.bad_measures:same' cannot be called as "
        "measure(wnids_a, wnids_b, taxonomy=...): got an unexpected keyword argument "
        "'taxonomy'; a measure takes two lists of wnids and the keyword argument taxonomy (see "
        "register_measure)"
    )
    with pytest.raises(PluginError):  # a TypeError, as the interface is a type contract
        similarity("cogplug.bad_measures:same", ["n02123159"], ["n02123045"])
    assert issubclass(PluginError, TypeError)


def test_a_measure_giving_infinity_is_refused_like_nan(plugin, tmp_path, capsys):
    levels = ["levels", "--out", str(tmp_path / "lv"), "--candidates", "cog", "--measure"]
    assert main([*levels, "cogplug.bad_measures:infinite"]) == 2
    line = _one_line(capsys)
    assert line.startswith(
        "imagenet-cog: error: measure 'cogplug.bad_measures:infinite' gave 5000 concept(s) a score "
        "that is not a finite number (NaN or infinity): "
    )
    assert line.endswith(" and 4995 more; levels rank the concepts by finite similarities")
    assert not (tmp_path / "lv").exists()


def test_a_measure_in_the_current_folder_says_it_needs_pythonpath(tmp_path, monkeypatch):
    # The imagenet-cog command does not search the current folder for modules: a measure
    # written there and named by its module path needs PYTHONPATH=., and says so, as the docs do.
    import sys

    from imagenet_cog._plugins import load_object

    (tmp_path / "my_cog_measures.py").write_text("def depth(a, b, *, taxonomy):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    here = {"", ".", str(tmp_path)}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    with pytest.raises(ValueError) as err:
        load_object("my_cog_measures:depth", "measure")
    assert "my_cog_measures.py is in the current folder" in str(err.value)
    assert "PYTHONPATH=." in str(err.value)
    with pytest.raises(ValueError) as err:
        load_object("no_such_cog_module:depth", "measure")
    assert "on PYTHONPATH" in str(err.value)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "measures.rst").read_text()
    assert "PYTHONPATH=. imagenet-cog levels" in docs
