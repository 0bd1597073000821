"""The paper's protocol as one frozen object: its defaults, its record, its checks, and a new
setting that reaches every place that records, compares or shows the protocol by itself."""

import dataclasses
import json
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from test_protocol import FAST, synthetic_domain

from imagenet_cog import Results, comparability, evaluate
from imagenet_cog import _grid as grid
from imagenet_cog._grid import PAPER_PROTOCOL, SEEDS, SHOTS, Protocol, Seeds, Shots
from imagenet_cog._paired import protocol_mismatch
from imagenet_cog._validation import Param

PINNED = Path(__file__).resolve().parent / "data" / "protocol_pin"


def test_the_papers_protocol_records_what_evaluate_always_recorded():
    pinned = json.loads((PINNED / "default_config.json").read_text())["protocol"]
    assert PAPER_PROTOCOL.record() == pinned
    assert Protocol.from_record(pinned) == PAPER_PROTOCOL
    assert PAPER_PROTOCOL.shots == SHOTS and PAPER_PROTOCOL.seeds == SEEDS


def test_a_record_reads_back_into_the_protocol_that_wrote_it():
    run = Protocol(epochs=5, batch_size=16, mixed_precision="bf16", normalize=False)
    assert Protocol.from_record(json.loads(json.dumps(run.record()))) == run
    with pytest.raises(ValueError, match=r"lacks \['epochs'\]"):
        Protocol.from_record({k: v for k, v in run.record().items() if k != "epochs"})
    with pytest.raises(ValueError, match=r"unknown \['warmup'\]"):
        Protocol.from_record({**run.record(), "warmup": 5})


def test_every_setting_has_one_constraint_and_the_table_refuses_in_one_line():
    names = {f.name for f in dataclasses.fields(Protocol)}
    assert names == set(Protocol._parameter_constraints)
    for kw, message in [
        ({"n_trials": 0}, "n_trials must be an integer >= 1, got 0"),
        ({"n_startup_trials": -1}, "n_startup_trials must be an integer >= 0, got -1"),
        ({"epochs": 2.5}, "epochs must be an integer >= 1, got 2.5"),
        ({"mixed_precision": "fp8"}, "mixed_precision must be None, 'tf32' or 'bf16'"),
        ({"normalize": "no"}, "normalize must be True or False, got 'no'"),
        ({"lr_range": (10, 1)}, r"lr_range must be \(low, high\) with 0 < low < high"),
        ({"lr_range": (1, 2, 3)}, r"lr_range must be \(low, high\)"),
        ({"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\), got 1.0"),
        ({"shots": [1, "1"]}, r"shots repeat: \[1, 1\]"),
        ({"shots": [0]}, "shots must be a positive number of images per class or 'all'"),
        ({"seeds": [22, -1]}, r"seeds must be >= 0 \(numpy's generator refuses others\)"),
        ({"seeds": ["x"]}, "seeds must be integers"),
        ({"seeds": [22, 2**32]}, r"seeds must be below 2\*\*32 \(Optuna's sampler refuses"),
        ({"seeds": []}, "shots and seeds must not be empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            Protocol(**kw)
    # A value that passes is kept as the type the protocol holds.
    run = Protocol(shots=["16", "All"], seeds=22, lr_range=[1, 10], normalize=np.bool_(True))
    assert run.shots == (16, "all") and isinstance(run.shots, Shots)
    assert run.seeds == (22,) and isinstance(run.seeds, Seeds)
    assert run.lr_range == (1.0, 10.0) and run.record()["lr_range"] == [1.0, 10.0]
    assert run.normalize is True


def test_the_one_comparison_skips_settings_a_record_does_not_hold():
    old = {k: v for k, v in Protocol(epochs=5).record().items() if k != "normalize"}
    new = Protocol(normalize=False).record()
    assert Protocol.differences(old, new) == [("epochs", 5, 100)]
    # Neither the constants no run changes nor the grid are compared.
    assert set(Protocol.compared()).isdisjoint({"momentum", "schedule", "sampler", "shots"})
    assert Protocol.rows(old)[:2] == [("epochs", 5), ("batch_size", 1024)]


def test_tf32_off_cuda_is_the_default_run():
    import torch

    run = Protocol(mixed_precision="tf32")
    assert run.on(torch.device("cpu")).mixed_precision is None
    assert run.on(torch.device("cuda", 0)).mixed_precision == "tf32"


# ------------------------------------------------- a new setting, with no other edit
def _smoothing(default):
    """A protocol with one more setting, ``label_smoothing``, as a developer would add it."""

    @dataclasses.dataclass(frozen=True)
    class Smoothed(Protocol):
        label_smoothing: float = default

        _parameter_constraints: ClassVar[dict] = {
            **Protocol._parameter_constraints,
            "label_smoothing": Param(None, lambda v: 0 <= v < 1, "in [0, 1)", convert=float),
        }

    return Smoothed


def _swap(monkeypatch, cls, paper):
    """``cls`` wherever the package holds the protocol's class, ``paper`` wherever it holds
    the paper's protocol: the test's stand-in for an edit of the class itself."""
    swaps = {id(grid.Protocol): cls, id(grid.PAPER_PROTOCOL): paper}
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("imagenet_cog"):
            continue
        for name, value in list(vars(module).items()):
            if id(value) in swaps:
                monkeypatch.setattr(module, name, swaps[id(value)])


def test_a_new_setting_is_recorded_compared_and_shown(tmp_path, monkeypatch):
    paper_class, run_class = _smoothing(0.0), _smoothing(0.1)
    feats = {"L1": synthetic_domain(1.5, n_classes=4, n_train=20, n_test=5, dim=8, seed=3)}
    kw = {"domains": ("L1",), "shots": ("all",), "seeds": (22,), **FAST}
    with monkeypatch.context() as patch:  # a run of the paper's value
        _swap(patch, paper_class, paper_class())
        evaluate(feats, out=tmp_path / "paper", model="paper", **kw)
    _swap(monkeypatch, run_class, paper_class())  # a run of another value
    evaluate(feats, out=tmp_path / "smoothed", model="smoothed", **kw)

    # Recorded in config.json, and read back.
    config = json.loads((tmp_path / "smoothed" / "config.json").read_text())
    assert config["protocol"]["label_smoothing"] == 0.1
    assert run_class.from_record(config["protocol"]).label_smoothing == 0.1
    # Compared in the comparability verdict, against the paper's value...
    results = Results.load(tmp_path / "paper", tmp_path / "smoothed")
    verdict = comparability(results, by_model=True)
    assert "label_smoothing: 0.1 instead of 0.0" in verdict["smoothed"]["deviations"]
    assert not any("label_smoothing" in d for d in verdict["paper"]["deviations"])
    # ... and between two runs, in the paired test.
    assert "label_smoothing 0.0 (paper) vs 0.1 (smoothed)" in protocol_mismatch(
        results, "paper", "smoothed"
    )
    # Shown in the HTML report's protocol row.
    page = Results.load(tmp_path / "smoothed").to_html(reference=False)
    row = next(line for line in page.split("<dt>") if line.startswith("protocol</dt>"))
    assert row.split("</dd>")[0].endswith("normalize True, label_smoothing 0.1")
