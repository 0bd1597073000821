"""The training wing's device module: each entry point resolves its device once."""

import dataclasses

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs
from test_protocol import FAST, synthetic_features

from imagenet_cog import (
    LinearProbe,
    LinearProbeCV,
    _device,
    evaluate,
    make_search_spec,
    run_searches,
)
from imagenet_cog.analysis import MLPProbe


@pytest.fixture
def resolutions(monkeypatch):
    """The calls of the one device resolver, counted."""
    calls = []
    real = _device.resolve_device

    def counted(device):
        calls.append(device)
        return real(device)

    monkeypatch.setattr(_device, "resolve_device", counted)
    return calls


def test_evaluate_resolves_the_device_once(resolutions, tmp_path):
    feats = {d: synthetic_features()[d] for d in ("in1k", "L1", "L5")}
    res = evaluate(
        feats,
        domains=("in1k", "L1", "L5"),
        shots=(2, "all"),
        seeds=(22, 37),
        out=tmp_path,
        save_predictions=True,
        **FAST,
    )
    assert len(res.records) == 12
    assert resolutions == ["cpu"]


def test_run_searches_and_each_fit_resolve_the_device_once(resolutions):
    X, y = make_blobs(n_samples=120, centers=3, n_features=4, random_state=0)
    specs = [make_search_spec(y, seed) for seed in (22, 37)]
    run_searches(
        X, y, specs, n_trials=2, n_startup_trials=2, epochs=2, device="cpu", X_test=X, y_test=y
    )
    assert resolutions == ["cpu"]
    for est in (
        LinearProbe(epochs=2, device="cpu"),
        LinearProbe(epochs=200, solver="lbfgs", weight_decay=1e-2, device="cpu"),
        LinearProbeCV(n_trials=2, n_startup_trials=2, epochs=2, device="cpu"),
        MLPProbe(hidden_layer_sizes=(4,), epochs=2, device="cpu"),
    ):
        resolutions.clear()
        est.fit(X, y)
        assert resolutions == ["cpu"], type(est).__name__


def test_a_placement_holds_what_the_parameters_ask():
    place = _device.placement("cpu", "float32", "bf16")
    assert place == _device.Placement(torch.device("cpu"), torch.float32, torch.bfloat16, False)
    assert _device.placement("cpu", "float32", "tf32").tf32
    with pytest.raises(ValueError, match="mixed_precision='tf32' needs dtype='float32'"):
        _device.placement("cpu", "float64", "tf32")
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'float64'"):
        _device.placement("cpu", "float16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        place.tf32 = True


def test_device_type_answers_without_resolving(resolutions, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _device.device_type(None) == "cpu"
    assert _device.device_type("cpu") == "cpu"
    assert _device.device_type("cuda:1") == "cuda:1"  # not available: the name as given
    assert _device.device_type("nonsense") == "nonsense"
    assert resolutions == []
    assert LinearProbe(device="cpu").__sklearn_tags__().non_deterministic is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _device.device_type(None) == "cuda"
    assert LinearProbe(device="cuda").__sklearn_tags__().non_deterministic is True
    assert resolutions == []


def test_bytes_on_counts_only_tensors_on_the_device():
    t = torch.zeros(4, 3)
    assert _device.bytes_on(torch.device("cpu"), t, np.zeros((4, 3))) == 48


def test_analyze_resolves_the_device_once(resolutions):
    from imagenet_cog.analysis import analyze

    feats = {d: synthetic_features()[d] for d in ("in1k", "L5")}
    report = analyze(
        feats,
        analyses=("clusters", "alignment", "pca", "mlp"),
        device="cpu",
        probe_seeds=(22,),
        pca_components=(2, 4),
        probe_kw={"n_trials": 2, "n_startup_trials": 2, "epochs": 2},
    )
    assert set(report.domains) == {"in1k", "L5"}
    assert resolutions == ["cpu"]
