"""Faults of an ``evaluate`` run: a rank killed outside torchrun's agent, a damaged plan.json."""

import json

import pytest
from helpers import two_ranks
from test_protocol import FAST, synthetic_features, write_synthetic_npz

from imagenet_cog import evaluate
from imagenet_cog._train.memplan import plan_run, unit_memory

KILLED = """
import os, signal, sys
import numpy as np, torch
torch.set_num_threads(1)
from imagenet_cog import evaluate, protocol
from imagenet_cog import _distributed as torchrun
torchrun.BEAT_S, torchrun.SILENCE_S = 0.2, 4.0
if os.environ["RANK"] == "1" and sys.argv[3] == "kill":
    def killed(*args, **kwargs):  # killed by something other than torchrun's agent
        os.kill(os.getpid(), signal.SIGKILL)
    protocol._run_unit = killed
data = np.load(sys.argv[1])
feats = {d: (data[d + "_Xtr"], data[d + "_ytr"], data[d + "_Xte"], data[d + "_yte"])
         for d in ("in1k", "L1")}
evaluate(feats, domains=("in1k", "L1"), shots=("all",), seeds=(22, 37), out=sys.argv[2],
         n_trials=2, n_startup_trials=1, epochs=2, batch_size=64, device="cpu", progress=False)
"""


@pytest.mark.slow
def test_a_rank_killed_outside_torchrun_is_named_and_a_rerun_resumes(tmp_path):
    write_synthetic_npz(tmp_path / "feats.npz")
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    out = tmp_path / "out"
    codes, errors = two_ranks(script, tmp_path / "feats.npz", out, "kill")
    assert codes[1] == -9
    assert codes[0] not in (0, None), errors[0][-2000:]
    last = errors[0].strip().splitlines()[-1]
    assert "rank 1 did not report for 4 s" in last and "run again to resume" in last, last
    first = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert len(first) == 2  # rank 0's cells
    codes, errors = two_ranks(script, tmp_path / "feats.npz", out, "resume")
    assert codes == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    records = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert records[:2] == first
    assert sorted((r["domain"], r["seed"]) for r in records) == [
        ("L1", 22),
        ("L1", 37),
        ("in1k", 22),
        ("in1k", 37),
    ]


# ------------------------------------------------------------------ plan.json
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run folder of two domains, and the arguments that made it."""
    out = tmp_path_factory.mktemp("run")
    kw = {"domains": ("L1", "L2"), "shots": ("all",), "seeds": (22, 37), **FAST}
    feats = {d: synthetic_features()[d] for d in kw["domains"]}
    evaluate(feats, out=out, **kw)
    return out, feats, kw


def _edited(finished, tmp_path, edit):
    out, feats, kw = finished
    for name in ("config.json", "plan.json", "runs.jsonl"):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    plan = json.loads((tmp_path / "plan.json").read_text())
    edit(plan["units"])
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return feats, kw


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda units: units.append(dict(units[0])), r"the cell L1 N=all seed=22 is listed twice"),
        (lambda units: units[0]["cells"].append(units[0]["cells"][0]), r"listed twice"),
        (
            lambda units: units[0]["cells"][0].__setitem__(0, "L9"),
            r"unit 1 names the domain 'L9', which this run has no features for \(it has L1, L2\)",
        ),
        (lambda units: units[0].__setitem__("shots", 0), r"unit 1 has shots 0"),
        (lambda units: units[0].__setitem__("rank", 2), r"unit 1 is for rank 2 of 1 processes"),
    ],
)
def test_a_plan_that_does_not_fit_the_run_is_refused_naming_the_file(
    finished, tmp_path, edit, message
):
    feats, kw = _edited(finished, tmp_path, edit)
    before = (tmp_path / "runs.jsonl").read_bytes()
    with pytest.raises(ValueError, match=rf"{tmp_path / 'plan.json'}: .*{message}.*delete it"):
        evaluate(feats, out=tmp_path, **kw)
    assert (tmp_path / "runs.jsonl").read_bytes() == before


def test_a_plan_listing_a_unit_twice_trains_nothing_twice(finished, tmp_path):
    # Before: the repeated unit trained again and appended its cells a second time.
    feats, kw = _edited(finished, tmp_path, lambda units: units.append(dict(units[0])))
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    (tmp_path / "runs.jsonl").write_text(lines[0] + "\n")  # the other cells still to run
    with pytest.raises(ValueError, match="listed twice"):
        evaluate(feats, out=tmp_path, **kw)
    assert (tmp_path / "runs.jsonl").read_text().splitlines() == lines[:1]


# ------------------------------------------------------------------ the GB message
def test_a_search_that_does_not_fit_by_a_little_says_two_different_sizes():
    from test_memplan import TRAIN_ROWS, reference_protocol, reference_sizes

    sizes, protocol = reference_sizes(), reference_protocol(None)
    need = unit_memory(sizes, [("in1k", 22)], 1, protocol, False)["total"]
    with pytest.raises(ValueError, match=r"one search needs") as info:
        plan_run(list(TRAIN_ROWS), sizes, need - 1_000_000, protocol)
    needed, usable = (
        x.split(" GB")[0].split()[-1]
        for x in str(info.value).split("are usable")[0].split(", but ")
    )
    assert float(needed) > float(usable), str(info.value)


# ------------------------------------------------------------------ hostile JSON, one line
DEEP = "[" * 100_000 + "]" * 100_000
CLI_FAST = ["--trials", "2", "--startup-trials", "1", "--epochs", "2", "--device", "cpu"]
CLI_FAST += ["--quiet", "--shots", "all", "--seeds", "22"]


def _one_error(capsys, argv):
    from imagenet_cog.cli import main

    code = main([str(a) for a in argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (argv, code, lines[-3:])
    return lines[0]


def test_json_nested_100000_deep_is_one_line_naming_the_file(tiny_in1k_store, tmp_path, capsys):
    # Before: a RecursionError traceback in verify, report, evaluate, --plan and analyze.
    from imagenet_cog.cli import main

    store = tiny_in1k_store().store
    run = tmp_path / "run"
    assert main(["evaluate", str(store), "--out", str(run), *CLI_FAST]) == 0
    with open(run / "runs.jsonl", "a", encoding="utf-8") as f:
        f.write(DEEP + "\n")
    said = f"imagenet-cog: error: {run / 'runs.jsonl'}:2: not a JSON line (nested deeper than "
    for argv in (
        ["verify", run],
        ["report", run],
        ["evaluate", store, "--out", run, *CLI_FAST],
    ):
        assert _one_error(capsys, argv).startswith(said), argv
    manifest = store / "in1k" / "train" / "manifest.json"
    manifest.write_text(DEEP)
    said = f"imagenet-cog: error: {manifest}: not valid JSON (nested deeper than 64 levels"
    for argv in (
        ["evaluate", store, "--out", tmp_path / "other", *CLI_FAST],
        ["evaluate", store, "--out", tmp_path / "other", "--plan", *CLI_FAST],
        ["analyze", store, "--out", tmp_path / "analysis"],
    ):
        assert _one_error(capsys, argv).startswith(said), argv


@pytest.mark.parametrize(
    ("field", "value", "types"),
    [
        ("n_classes", "1000", "an integer or null"),
        ("n_test", "50000", "an integer or null"),
        ("split", 7, "an object"),
        ("extraction", ["x"], "an object"),
    ],
)
def test_a_config_field_of_another_type_is_one_line_in_every_report(
    finished, tmp_path, capsys, field, value, types
):
    # Before: a count recorded as a string (the folder's checksums recomputed, as anyone can)
    # ended every report in a TypeError (or an AttributeError for an object that is not one).
    from helpers import write_run_folder

    from imagenet_cog._runfolder import CONFIG_CHECKSUM, RECORD_CHECKSUM

    out = finished[0]
    config = json.loads((out / "config.json").read_text())
    for key in ("format", "format_version", "config_hash", CONFIG_CHECKSUM):
        config.pop(key)
    config["data"]["L1"][field] = value
    records = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    for r in records:
        del r[RECORD_CHECKSUM], r["config_hash"]
    run = write_run_folder(tmp_path / "run", config, records)
    said = (
        f"imagenet-cog: error: {run / 'config.json'}: data.L1.{field} is {value!r}, not {types}; "
        "evaluate never writes that: rerun evaluate"
    )
    for extra in ([], ["--reference", "paper"], ["--format", "csv"], ["--html", tmp_path / "p"]):
        assert _one_error(capsys, ["report", run, *extra]) == said, extra
    assert _one_error(capsys, ["verify", run]) == said
