"""What a run writes, pinned: ``config.json`` and its ``config_hash``, and a folder a killed run
left, resumed.

The expected files under ``tests/data/protocol_pin/`` were written by the code as it was before
the protocol's settings became one object; this module checks that a run today writes the same
bytes and the same hash, and that today's code resumes that folder into the records the
uninterrupted run wrote then, number for number. ``python tests/test_protocol_pin.py`` writes
them again (do that only on purpose: it re-pins).

The fields that depend on the machine (the package versions, hence ``config.json``'s own
checksum) are compared by what they must be, not by the pinned bytes: the versions are this
process's, and the checksum that of the file's other fields.
"""

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import strip_timings
from test_protocol import FAST, synthetic_domain

from imagenet_cog import Results, evaluate
from imagenet_cog._runfolder import config_checksum, hash_config

PINNED = Path(__file__).resolve().parent / "data" / "protocol_pin"
#: Fields of config.json that depend on the machine that wrote it.
MACHINE = ("library_version", "versions", "config_sha256")
#: The settings of the changed run: every recorded setting away from the paper's.
CHANGED = {
    "n_trials": 4,
    "n_startup_trials": 2,
    "trials_per_batch": 2,
    "epochs": 7,
    "batch_size": 16,
    "mixed_precision": "bf16",
    "normalize": False,
}
#: The resumed folder's run.
RESUMED = {"domains": ("L1",), "shots": (2, "all"), "seeds": (22, 37), **FAST}


def _features():
    return {"L1": synthetic_domain(1.5, n_classes=4, n_train=20, n_test=5, dim=8, seed=3)}


class _Stop(Exception):
    """Raised where the first unit would train: config.json is written by then."""


def _config_of(out, **settings):
    """The config.json text a run with ``settings`` writes into ``out`` (nothing trains: the
    run stops where its first unit would train, after config.json is written)."""
    from unittest import mock

    from imagenet_cog._train import search

    with mock.patch.object(search, "search_in_lockstep", side_effect=_Stop):
        try:
            evaluate(
                _features(),
                domains=("L1",),
                shots=("all",),
                seeds=(22,),
                device="cpu",
                progress=False,
                out=out,
                **settings,
            )
        except _Stop:
            pass
        else:
            raise AssertionError("the run trained nothing, yet did not stop")
    return (Path(out) / "config.json").read_text()


def _machine_free(text):
    config = json.loads(text)
    return {k: v for k, v in config.items() if k not in MACHINE}


@pytest.mark.parametrize(
    ("name", "settings"), [("default", {}), ("changed", CHANGED)], ids=["default", "changed"]
)
def test_config_json_is_the_pinned_one_byte_for_byte(tmp_path, name, settings):
    got = _config_of(tmp_path / "run", **settings)
    pinned = (PINNED / f"{name}_config.json").read_text()
    config, want = json.loads(got), json.loads(pinned)
    # Its configuration hash, and everything but the machine's versions, as pinned.
    assert config["config_hash"] == want["config_hash"] == hash_config(config)
    assert _machine_free(got) == _machine_free(pinned)
    # The bytes: the pinned file with this machine's versions, and its checksum then.
    want = {**want, **{k: config[k] for k in ("library_version", "versions")}}
    want.pop("config_sha256")
    want["config_sha256"] = config_checksum(want)
    assert got == json.dumps(want, indent=2, sort_keys=True) + "\n"


def test_the_default_run_is_hashed_as_pinned(tmp_path):
    # The paper's protocol, on the pinned features: the hash every record of such a run carries.
    got = json.loads(_config_of(tmp_path / "run"))
    assert got["config_hash"] == "fe4342463089"
    assert got["protocol"] == {
        "batch_size": 1024,
        "epochs": 100,
        "lr_range": [0.1, 100.0],
        "mixed_precision": None,
        "momentum": 0.9,
        "n_startup_trials": 10,
        "n_trials": 30,
        "normalize": True,
        "sampler": "optuna TPE multivariate, seeded",
        "schedule": "cosine",
        "trials_per_batch": 1,
        "val_fraction": 0.2,
        "wd_range": [1e-12, 0.0001],
    }


def _records(folder):
    lines = (Path(folder) / "runs.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def _key(rec):
    return (str(rec["shots"]), rec["seed"])


@pytest.fixture
def plenty_of_memory(monkeypatch):
    """Host memory as a machine with room for the recorded plan's units (the pinned plan keeps
    them resident; a busy machine would stream them, with a warning)."""
    from imagenet_cog import _device

    monkeypatch.setattr(_device, "host_available_bytes", lambda: 64 * 10**9)


def _resume_into(tmp_path):
    folder = tmp_path / "resumed"
    shutil.copytree(PINNED / "killed_run", folder)
    with warnings.catch_warnings():
        # The folder was written with this machine's versions; another machine's say so.
        warnings.filterwarnings("ignore", "resuming with other versions", UserWarning)
        res = evaluate(_features(), out=folder, **RESUMED)
    return folder, res


def test_a_folder_killed_under_the_old_code_resumes_into_the_pinned_records(
    tmp_path, plenty_of_memory
):
    config_before = (PINNED / "killed_run" / "config.json").read_bytes()
    kept = _records(PINNED / "killed_run")
    folder, res = _resume_into(tmp_path)
    # The configuration is the one the folder holds: accepted, not rewritten.
    assert (folder / "config.json").read_bytes() == config_before
    records = _records(folder)
    assert records[: len(kept)] == kept  # the finished cells stay as they were written
    assert len(records) == 4
    # The cells the resumed run trained are those the uninterrupted run wrote, number for number.
    full = {_key(r): strip_timings(r) for r in _records(PINNED / "full_run")}
    got = {_key(r): strip_timings(r) for r in records}
    for rec in (*full.values(), *got.values()):
        rec.pop("versions")  # this machine's, not the pinned one's
        rec.pop("library_version")
    assert got == full
    assert sorted(map(_key, res.records)) == sorted(full)
    assert {r["config_hash"] for r in records} == {json.loads(config_before)["config_hash"]}


def test_the_resumed_folder_reads_and_verifies(tmp_path, plenty_of_memory, capsys):
    from imagenet_cog.cli import main

    folder, _ = _resume_into(tmp_path)
    assert main(["verify", str(folder)]) == 0
    loaded = Results.load(folder)
    assert len(loaded.records) == 4
    assert np.isfinite(loaded.mean("model", "L1", "all"))


#: What the verdict and the HTML report said of the pinned run before the change.
PINNED_DEVIATIONS = [
    "2 seeds per cell instead of the paper's 5",
    "epochs: 6 instead of 100",
    "batch_size: 64 instead of 1024",
    "n_trials: 3 instead of 30",
    "n_startup_trials: 2 instead of 10",
    "L1: 4 concepts instead of the paper's 1000 (a subset)",
    "L1: 20 test images instead of the paper's 50000",
]
PINNED_PROTOCOL_ROW = (
    "<dt>protocol</dt><dd>epochs 6, batch_size 64, n_trials 3, n_startup_trials 2, "
    "trials_per_batch 1, lr_range [0.1, 100.0], wd_range [1e-12, 0.0001], val_fraction 0.2, "
    "mixed_precision None, normalize True</dd>"
)


def test_the_verdict_and_the_page_say_what_they_said_of_the_pinned_run():
    from imagenet_cog import comparability

    results = Results.load(PINNED / "full_run")
    assert comparability(results, by_model=True)["model"]["deviations"] == PINNED_DEVIATIONS
    page = results.to_html(reference=False)
    assert page.count("<dt>protocol</dt>") == 1
    assert PINNED_PROTOCOL_ROW in page


def _write_pinned():
    """Write the pinned files again with the code checked out (re-pins: on purpose only)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, settings in (("default", {}), ("changed", CHANGED)):
            _config_of(tmp / name, **settings)
            shutil.copy(tmp / name / "config.json", PINNED / f"{name}_config.json")
        for old in ("full_run", "killed_run"):
            shutil.rmtree(PINNED / old, ignore_errors=True)
        evaluate(_features(), out=PINNED / "full_run", **RESUMED)
        (PINNED / "full_run" / ".lock").unlink()
        shutil.copytree(PINNED / "full_run", PINNED / "killed_run")
        # A kill after the first cell of the last unit: its other cell is missing.
        lines = (PINNED / "killed_run" / "runs.jsonl").read_text().splitlines(keepends=True)
        (PINNED / "killed_run" / "runs.jsonl").write_text("".join(lines[:-1]))
        (PINNED / "full_run" / "plan.json").unlink()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _write_pinned()
