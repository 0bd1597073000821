"""The memory plan of evaluate, bounded streaming, the device budget and the epoch index.

No GPU here: CUDA conditions are simulated (device budgets, device indices, dtypes).
"""

import json
import subprocess
import sys
import threading
import tracemalloc
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from imagenet_cog import _device, evaluate, protocol
from imagenet_cog._grid import PAPER_PROTOCOL, Protocol
from imagenet_cog._train import engine as _engine
from imagenet_cog._train import feed as _feed
from imagenet_cog._train import memplan as _memplan
from imagenet_cog._train.engine import DeviceData, TrainConfig, train_many
from imagenet_cog._train.feed import ChunkStream, EpochIndex, HostRows
from imagenet_cog._train.memplan import DomainSize, describe_plan, plan_run, unit_memory

CPU = torch.device("cpu")
GB = 10**9
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import strip_timings, subprocess_env, two_ranks
from test_protocol import FAST, synthetic_domain, synthetic_features, write_synthetic_npz

# ------------------------------------------------------- the reference protocol
#: The official training rows (the paper, Sec. 3 and supplement A); 50,000 test rows each.
TRAIN_ROWS = {
    "in1k": 1_281_167,
    "L1": 1_118_804,
    "L2": 1_115_788,
    "L3": 1_095_203,
    "L4": 1_107_128,
    "L5": 1_091_654,
}
SEEDS = (22, 37, 45, 77, 93)
SHOTS = (1, 2, 4, 8, 16, 32, 64, 128, "all")


def reference_sizes():
    """The six domains at their official sizes: 1000 classes, 2048-d (ResNet-50)."""
    sizes = {}
    for domain, n in TRAIN_ROWS.items():
        counts = np.full(1000, n // 1000) + (np.arange(1000) < n % 1000)
        y = np.repeat(np.arange(1000), counts)
        X_train = types.SimpleNamespace(shape=(n, 2048))
        X_test = types.SimpleNamespace(shape=(50_000, 2048))
        sizes[domain] = DomainSize.of(X_train, y, X_test)
    return sizes


def reference_protocol(precision, shots=SHOTS, seeds=SEEDS):
    """The paper's protocol with ``precision``, over ``shots`` and ``seeds``."""
    return PAPER_PROTOCOL.replace(mixed_precision=precision, shots=shots, seeds=seeds)


def reference_plan(budget, precision):
    sizes = reference_sizes()
    units = plan_run(list(TRAIN_ROWS), sizes, budget, reference_protocol(precision))
    cells = [(u.shots, d, s) for u in units for d, s in u.cells]
    assert sorted(cells, key=str) == sorted(
        ((n, d, s) for n in SHOTS for d in TRAIN_ROWS for s in SEEDS), key=str
    )  # every cell exactly once
    assert all(u.bytes <= budget for u in units)
    for u in units:  # a domain's cells (and rows) are never split across units of one shots
        for d in {d for d, _ in u.cells}:
            assert sum(1 for v in units if v.shots == u.shots for e, _ in v.cells if e == d) == 5
            assert sum(1 for e, _ in u.cells if e == d) == 5
    return units


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_the_reference_protocol_stays_resident_on_80_gb(precision):
    units = reference_plan(80 * GB, precision)
    # One unit per shots value, all 30 searches together, every row on the device.
    assert [u.shots for u in units] == list(SHOTS)
    assert all(u.resident and len(u.cells) == 30 for u in units)
    assert all(u.rows == sum(TRAIN_ROWS.values()) and u.test_rows == 300_000 for u in units)
    full = max(units, key=lambda u: u.bytes)
    assert full.shots == "all"
    # float32: 7.11M rows x 2048 x 4 B of features alone are 58.2 GB.
    assert full.bytes > (58 if precision is None else 29) * GB


def test_on_24_gb_the_units_split_by_domain_and_none_streams():
    fp32 = reference_plan(24 * GB, None)
    assert len(fp32) == 6 * 9  # one domain (its 5 seeds) a unit
    assert all(u.resident and len({d for d, _ in u.cells}) == 1 for u in fp32)
    bf16 = reference_plan(24 * GB, "bf16")
    assert len(bf16) == 3 * 9  # two domains a unit
    assert all(u.resident and len({d for d, _ in u.cells}) == 2 for u in bf16)
    # Half the features and the same weights: a bfloat16 unit of one domain is smaller.
    assert min(u.bytes for u in bf16) > max(u.bytes for u in fp32) / 2


def test_a_domain_too_large_for_the_device_streams_and_a_search_too_large_is_refused():
    # On 15 GB (float32), IN-1K alone does not fit (1.33M rows: 10.9 GB of features, 15.4 GB
    # with its 5 searches' buffers): it streams; each other domain stays resident alone.
    units = reference_plan(15 * GB, None)
    assert len(units) == 6 * 9
    assert all(u.resident != (u.cells[0][0] == "in1k") for u in units)
    # Streamed, features take no room: three domains fit a unit on 12 GB, two on 10 GB, one on
    # 8 GB.
    assert all(not u.resident and len(u.cells) == 15 for u in reference_plan(12 * GB, None))
    assert all(not u.resident and len(u.cells) == 10 for u in reference_plan(10 * GB, None))
    assert all(not u.resident and len(u.cells) == 5 for u in reference_plan(8 * GB, None))
    with pytest.raises(ValueError, match=r"in1k N=1 seed=22: one search needs .* GB"):
        reference_plan(2 * GB, None)


def test_the_docs_table_of_plans_is_what_the_planner_computes():
    # docs/guide/protocol.rst's table of the reference protocol's plans, figure by figure.
    docs = Path(__file__).resolve().parents[1] / "docs" / "guide" / "protocol.rst"
    table = " ".join(docs.read_text(encoding="utf-8").split())
    for budget, precision in ((80, None), (80, "bf16"), (24, None), (24, "bf16"), (15, "bf16")):
        units = reference_plan(budget * GB, precision)
        assert all(u.resident for u in units)
        assert f"most {max(u.bytes for u in units) / GB:.1f} GB" in table, (budget, precision)
    assert "12 GB 18 units of three domains, all streamed" in table
    assert len(reference_plan(12 * GB, None)) == 18


def test_the_plan_counts_everything_the_unit_puts_on_the_device():
    sizes = reference_sizes()
    cells = [(d, s) for d in TRAIN_ROWS for s in SEEDS]
    mem = unit_memory(sizes, cells, "all", reference_protocol(None), resident=True)
    assert mem["features"] == (sum(TRAIN_ROWS.values()) + 300_000) * 2048 * 4
    G, d, KC = 30, 2048, 10 * 1000  # the startup round: 10 trials of 30 searches
    # Weights, momentum, evaluation copy: the steps add the weights' gradient straight into
    # the momentum (tests/test_fused.py shows no step makes a weight-sized tensor); biases
    # with their gradient.
    assert mem["weights"] == 3 * G * d * KC * 4 + 4 * G * KC * 4
    assert mem["logits"] >= 2 * G * 1024 * KC * 4
    assert mem["epoch index"] > 0 and mem["batches"] > 0 and mem["evaluation"] > 0
    # The fused step's check: copies of the weights and momentum while the step runs, one
    # weight-sized tensor more than the three above (the evaluation's copy is not alive then).
    assert G * d * KC * 4 <= mem["self-check"] < 2 * G * d * KC * 4
    assert mem["slack"] >= 1 << 30
    parts = sum(v for k, v in mem.items() if k not in ("total", "rows", "test_rows"))
    assert mem["total"] == parts
    streamed = unit_memory(sizes, cells, "all", reference_protocol(None), resident=False)
    assert "features" not in streamed and streamed["stream buffers"] <= 4 * _feed.CHUNK_BYTES


def test_the_plan_print_states_units_rows_memory_and_precision():
    units = reference_plan(24 * GB, "bf16")
    text = describe_plan(units, 24 * GB, "cuda:0", reference_protocol("bf16"))
    assert "27 lockstep unit(s) on cuda:0, 24.0 GB usable" in text
    assert "bfloat16 features, float32 weights" in text
    assert "in1k L1 (5 seeds each)" in text and "resident" in text
    assert "float32 matmuls (no TF32)" in describe_plan(
        units, None, "cpu", reference_protocol(None)
    )
    host = describe_plan(units, 6 * GB, "cpu", reference_protocol(None), host=True)
    assert "on cpu, 6.0 GB of host memory for copies of the features (the rest streams" in host


def test_on_the_cpu_the_budget_only_decides_what_streams():
    # IN-1K and the five levels at CoG's size, 30 searches: over a 6 GB host budget they stream,
    # all together as one unit, instead of being split or refused as on a GPU.
    sizes, protocol = reference_sizes(), reference_protocol(None, shots=["all"])
    units = plan_run(list(sizes), sizes, 6 * GB, protocol, host=True)
    assert len(units) == 1 and not units[0].resident and len(units[0].cells) == 30
    (fits,) = plan_run(list(sizes), sizes, 10**15, protocol, host=True)
    assert fits.resident and len(fits.cells) == 30


# ------------------------------------------------------- the rows a unit uploads
def test_a_unit_uploads_only_the_rows_its_cells_use(monkeypatch):
    sizes = []
    real = DeviceData.__init__

    def spy(self, X, y, **kw):
        sizes.append(int(X.shape[0]))
        real(self, X, y, **kw)

    monkeypatch.setattr(DeviceData, "__init__", spy)
    feats = {
        d: synthetic_domain(1.5, n_classes=6, n_train=40, n_test=5, seed=i)
        for i, d in enumerate(("L1", "L2"))
    }
    evaluate(feats, domains=("L1", "L2"), shots=(1,), seeds=(22,), **FAST)
    # Training side: each domain's 20% holdout (8 per class) and 2 shots (search and final)
    # of 6 classes, of its 240 rows; then the test rows.
    assert sizes[0] <= 2 * 6 * (8 + 2) < 2 * 240
    assert sizes[1] == 2 * 6 * 5


# ------------------------------------------------------------ bounded streaming
def _memmaps(tmp_path, n_parts=3, rows=4000, d=64):
    rng = np.random.default_rng(0)
    parts = []
    for i in range(n_parts):
        np.save(tmp_path / f"part{i}.npy", rng.normal(size=(rows, d)).astype(np.float32))
        parts.append(np.load(tmp_path / f"part{i}.npy", mmap_mode="r"))
    return parts


def test_streaming_reuses_two_host_and_two_device_buffers_of_one_chunk(tmp_path):
    parts = _memmaps(tmp_path)
    source = HostRows([(parts[0], None), (parts[1], np.arange(0, 4000, 2)), (parts[2], None)])
    reference = np.concatenate([parts[0], parts[1][::2], parts[2]])
    stream = ChunkStream(source, CPU, torch.float32, rows_per_chunk=500, staged=True)
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(12):
        idx = rng.integers(0, source.shape[0], size=rng.integers(1, 501))
        chunk = stream.fetch(idx)
        np.testing.assert_array_equal(chunk.numpy(), reference[idx])
        seen.add(chunk.data_ptr())
    assert len(seen) == 2  # two device slots, alternating
    chunk_bytes = 500 * 64 * 4
    assert sorted(stream.allocated) == [("device", chunk_bytes)] * 2 + [("host", chunk_bytes)] * 2
    assert buffer_bytes(stream) == (2 * chunk_bytes, 2 * chunk_bytes)


def buffer_bytes(stream):
    """Bytes held now by a stream's host slots and by its device slots: ``(host, device)``."""
    return (
        sum(t.numel() * t.element_size() for t in stream.host),
        sum(t.numel() * t.element_size() for t in stream.dev),
    )


def test_an_upload_gathers_the_rows_of_every_part_a_block_at_a_time(tmp_path, monkeypatch):
    parts = _memmaps(tmp_path, rows=300, d=8)
    keep = np.arange(1, 300, 3)
    source = HostRows([(parts[0], keep), (parts[1], None), (parts[2], keep)])
    reference = np.concatenate([parts[0][keep], parts[1], parts[2][keep]])
    monkeypatch.setattr(_feed, "GATHER_ROWS", 16)  # blocks of 64 rows, through 2 buffers
    for staged in (False, True):
        got = source.upload(CPU, torch.bfloat16, staged=staged)
        np.testing.assert_array_equal(
            got.float().numpy(), torch.from_numpy(reference).bfloat16().float().numpy()
        )


def stacked(parts, y, **kw):
    """One DeviceData over feature arrays stacked by rows, read from the parts themselves."""
    return DeviceData(HostRows([(X, None) for X in parts]), y, **kw)


def test_streamed_training_holds_a_bounded_amount_of_host_memory(tmp_path):
    parts = _memmaps(tmp_path)
    total = sum(p.nbytes for p in parts)  # 3 MB
    y = np.tile(np.arange(4), 3000)
    configs = [TrainConfig(0.5, 0.0, seed=s, train_idx=np.arange(s, 12000, 3)) for s in (1, 2)]
    kw = {"n_classes": 4, "protocol": Protocol(epochs=2, batch_size=256)}
    tracemalloc.start()
    try:
        data = stacked(parts, y, device=CPU, memory_budget=64 << 10)
        assert not data.resident
        streamed = train_many(data, configs, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < total / 3, f"{peak} bytes of host arrays for {total} bytes of features"
    resident = train_many(stacked(parts, y, device=CPU), configs, **kw)
    for a, b in zip(streamed, resident):
        np.testing.assert_array_equal(a.coef, b.coef)


def test_bfloat16_tensors_stream_when_they_do_not_fit():
    rng = np.random.default_rng(0)
    parts = [
        torch.from_numpy(rng.normal(size=(300, 8)).astype(np.float32)).bfloat16() for _ in range(2)
    ]
    y = np.tile(np.arange(3), 200)
    data = stacked(parts, y, device=CPU, dtype=torch.bfloat16, memory_budget=1024)
    assert not data.resident
    configs = [TrainConfig(1.0, 0.0, seed=0, eval_idx=np.arange(600))]
    kw = {"n_classes": 3, "protocol": Protocol(epochs=2, batch_size=64)}
    streamed = train_many(data, configs, **kw)
    resident = train_many(stacked(parts, y, device=CPU, dtype=torch.bfloat16), configs, **kw)
    np.testing.assert_array_equal(streamed[0].coef, resident[0].coef)
    assert streamed[0].top1 == resident[0].top1


# --------------------------------------------------------------- the device budget
def _fake_cuda(monkeypatch, free, reserved=0, allocated=0):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)


def test_the_budget_counts_torchs_cached_blocks_as_free(monkeypatch):
    _fake_cuda(monkeypatch, free=10 * GB, reserved=30 * GB, allocated=5 * GB)
    assert _device.default_budget(torch.device("cuda", 0)) == int(0.6 * 35 * GB)


def test_the_run_is_planned_once_and_resumes_on_its_recorded_plan(monkeypatch, tmp_path):
    feats = {d: synthetic_features()[d] for d in ("L1", "L2", "L3")}
    kw = {"domains": ("L1", "L2", "L3"), "shots": ("all",), "seeds": (22, 37), **FAST}
    sizes = {d: DomainSize.of(*feats[d][:3]) for d in feats}
    protocol = Protocol(n_trials=3, n_startup_trials=2, batch_size=64)
    two = [("L1", 22), ("L1", 37), ("L2", 22), ("L2", 37)]
    three = [*two, ("L3", 22), ("L3", 37)]
    # Room for two domains of a unit, not three: the units split.
    budget = max(unit_memory(sizes, two, n, protocol, True)["total"] for n in kw["shots"])
    assert budget < min(unit_memory(sizes, three, n, protocol, True)["total"] for n in kw["shots"])
    calls = []

    def usable(device):
        calls.append(device)
        return budget

    monkeypatch.setattr(_device, "usable_bytes", usable)
    full = evaluate(feats, out=tmp_path / "full", **kw)
    assert len(calls) == 1  # once for the whole run
    together = {tuple(map(tuple, r["lockstep_cells"])) for r in full.records}
    assert together == {tuple(two), (("L3", 22), ("L3", 37))}
    assert all(r["features_resident"] and r["world_size"] == 1 for r in full.records)
    plan = json.loads((tmp_path / "full" / "plan.json").read_text())
    assert [len(u["cells"]) for u in plan["units"]] == [4, 2]

    # A resumed run on a device with more memory follows the recorded plan.
    cut = tmp_path / "cut"
    cut.mkdir()
    for name in ("config.json", "plan.json"):
        (cut / name).write_bytes((tmp_path / "full" / name).read_bytes())
    lines = (tmp_path / "full" / "runs.jsonl").read_text().splitlines()
    (cut / "runs.jsonl").write_text("\n".join(lines[:3]) + "\n")
    budget = 10**15
    resumed = evaluate(feats, out=cut, **kw)

    def key(r):
        return (r["domain"], str(r["shots"]), r["seed"])

    assert sorted(map(strip_timings, resumed.records), key=key) == sorted(
        map(strip_timings, full.records), key=key
    )


def test_a_recorded_resident_unit_that_no_longer_fits_streams_with_a_warning(monkeypatch, tmp_path):
    feats = {"L1": synthetic_features()["L1"]}
    kw = {"domains": ("L1",), "shots": ("all",), "seeds": (22,), **FAST}
    evaluate(feats, out=tmp_path, **kw)
    (tmp_path / "runs.jsonl").unlink()
    monkeypatch.setattr(_device, "usable_bytes", lambda device: 1 << 20)
    with pytest.warns(RuntimeWarning, match="the recorded plan keeps N=all"):
        res = evaluate(feats, out=tmp_path, **kw)
    assert [r["features_resident"] for r in res.records] == [False]


def test_features_given_on_the_device_are_counted_as_taken(monkeypatch):
    feats = {
        "L1": tuple(
            torch.from_numpy(a) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
            for a in synthetic_features()["L1"]
        )
    }
    given = feats["L1"][0].nbytes + feats["L1"][2].nbytes
    monkeypatch.setattr(_device, "usable_bytes", lambda device: 100 * GB)
    budgets = []
    real = _memplan.plan_run
    monkeypatch.setattr(_memplan, "plan_run", lambda *a, **k: budgets.append(a[2]) or real(*a, **k))
    evaluate(feats, domains=("L1",), shots=("all",), seeds=(22,), **FAST)
    assert budgets == [100 * GB - given]


def test_the_plan_is_printed_with_the_precision(capsys):
    feats = {"L1": synthetic_features()["L1"]}
    evaluate(feats, domains=("L1",), shots=("all",), seeds=(22,), **{**FAST, "progress": True})
    out = capsys.readouterr().out
    assert "Memory plan: 1 lockstep unit(s) on cpu" in out
    assert "float32 features and weights, float32 matmuls (no TF32)" in out
    assert "resident   L1 (1 seed each)" in out


# ---------------------------------------------------------- the device of a tensor
def test_a_tensor_on_the_current_cuda_device_is_used_where_it_is(monkeypatch):
    # torch.device("cuda") != torch.device("cuda", 0): compared as given, a tensor on the
    # current CUDA device looked like one elsewhere, and was copied (to the host, streamed).
    _fake_cuda(monkeypatch, free=10)
    moved = []

    class OnCuda(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", 0)

        def cpu(self):
            moved.append("cpu")
            return self.as_subclass(torch.Tensor)

        def to(self, *args, **kwargs):
            moved.append(("to", args, kwargs))
            return self

    X = torch.randn(20, 3).as_subclass(OnCuda)
    y = torch.zeros(20, dtype=torch.int64).as_subclass(OnCuda)
    data = DeviceData(X, y, device=_device.resolve_device("cuda"))
    assert data.resident and data.X is X
    assert moved == [("to", (), {"device": torch.device("cuda", 0), "dtype": torch.int64})]


# --------------------------------------------------------------------- torchrun
def test_a_rank_loads_and_records_only_its_own_cells(monkeypatch, tmp_path):
    from imagenet_cog import _feature_source as fs

    def as_rank_1(self):
        self.rank, self.world = 1, 2
        return self

    monkeypatch.setattr(protocol._Ranks, "start", as_rank_1)
    loaded = []
    real = fs.ArrayFeatures.training
    monkeypatch.setattr(
        fs.ArrayFeatures, "training", lambda self, d: loaded.append(d) or real(self, d)
    )
    res = evaluate(synthetic_features(), shots=(1,), seeds=(22, 37), out=tmp_path, **FAST)
    assert set(loaded) == {"L3", "L4", "L5"}  # the second half of the 12 cells
    mine = [[d, s] for d in ("L3", "L4", "L5") for s in (22, 37)]
    rank_1 = [r for r in res.records if [r["domain"], r["seed"]] in mine]
    assert len(rank_1) == 6
    assert all(r["world_size"] == 2 and r["lockstep_cells"] == mine for r in rank_1)


WAIT = """
import datetime, sys, time
import numpy as np, torch
import torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
from imagenet_cog import evaluate, protocol
if dist.get_rank() == 1:  # this rank's remaining work outlasts the group's timeout
    real = protocol._run_unit
    def slow(*args, **kwargs):
        time.sleep(16)
        return real(*args, **kwargs)
    protocol._run_unit = slow
data = np.load(sys.argv[1])
feats = {d: (data[d + "_Xtr"], data[d + "_ytr"], data[d + "_Xte"], data[d + "_yte"])
         for d in ("in1k", "L1")}
evaluate(feats, domains=("in1k", "L1"), shots=("all",), seeds=(22, 37), out=sys.argv[2],
         n_trials=2, n_startup_trials=1, epochs=2, batch_size=64, device="cpu", progress=False)
"""


@pytest.mark.slow
def test_a_rank_done_early_waits_for_the_others_without_a_timeout(tmp_path):
    write_synthetic_npz(tmp_path / "feats.npz")
    script = tmp_path / "wait.py"
    script.write_text(WAIT)
    env = subprocess_env(OMP_NUM_THREADS="1")
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    done = subprocess.run(
        [*launcher, str(script), str(tmp_path / "feats.npz"), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(x) for x in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["world_size"] for r in records} == {2}


FAIL = WAIT.replace(
    'dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))', ""
).replace("time.sleep(16)", "raise RuntimeError('rank 1 fails')")


@pytest.mark.slow
def test_a_waiting_rank_stops_when_another_fails(tmp_path):
    # Started as torchrun starts them but without its agent (which would end the others).

    write_synthetic_npz(tmp_path / "feats.npz")
    script = tmp_path / "fail.py"
    script.write_text(
        FAIL.replace("if dist.get_rank() == 1", "if os.environ['RANK'] == '1'").replace(
            "import datetime, sys, time", "import datetime, os, sys, time"
        )
    )
    codes, errors = two_ranks(script, tmp_path / "feats.npz", tmp_path / "out")
    assert codes[1] != 0 and "rank 1 fails" in errors[1], errors[1][-2000:]
    assert codes[0] != 0, errors[0][-2000:]
    assert "another process of this run failed" in errors[0], errors[0][-2000:]


# ------------------------------------------------------------------ the epoch index
def reference_epoch_index(groups, gens, sizes, steps, bsz):
    """The index as it was built before: a fresh int64 array per epoch."""
    S, Bm = max(steps), max(bsz)
    idx = np.zeros((S, len(groups), Bm), dtype=np.int64)
    for g, rows in enumerate(groups):
        perm = torch.randperm(sizes[g], generator=gens[g]).numpy()
        flat = np.zeros(steps[g] * bsz[g], dtype=np.int64)
        flat[: sizes[g]] = rows[perm]
        idx[: steps[g], g, : bsz[g]] = flat.reshape(steps[g], bsz[g])
    return idx


def test_the_epoch_index_draws_exactly_as_before_in_reused_int32_buffers():
    rng = np.random.default_rng(0)
    sizes = [1000, 700, 64, 5]
    groups = [np.sort(rng.choice(5000, n, replace=False)) for n in sizes]
    bsz = [min(128, n) for n in sizes]
    steps = [-(-n // b) for n, b in zip(sizes, bsz)]
    index = EpochIndex(
        groups,
        [torch.Generator().manual_seed(s) for s in range(4)],
        sizes,
        steps,
        bsz,
        5000,
        epochs=5,
    )
    ref_gens = [torch.Generator().manual_seed(s) for s in range(4)]
    buffers = set()
    for _ in range(5):
        got = index.next()
        assert got.dtype == np.int32
        buffers.add(got.ctypes.data)
        np.testing.assert_array_equal(
            got, reference_epoch_index(groups, ref_gens, sizes, steps, bsz)
        )
    index.close()
    assert len(buffers) == 2
    # In the dtype of the device buffer they go to (the fused step's is int64).
    wide = EpochIndex(
        groups,
        [torch.Generator().manual_seed(s) for s in range(4)],
        sizes,
        steps,
        bsz,
        5000,
        epochs=1,
        dtype=torch.int64,
    )
    first = wide.next()
    wide.close()
    ref_gens = [torch.Generator().manual_seed(s) for s in range(4)]
    assert first.dtype == np.int64
    np.testing.assert_array_equal(first, reference_epoch_index(groups, ref_gens, sizes, steps, bsz))


def test_the_next_epochs_rows_are_drawn_in_the_background_as_int32(monkeypatch):
    threads, dtypes = set(), set()
    real_randperm, real_batches = torch.randperm, _engine._batches
    monkeypatch.setattr(
        torch,
        "randperm",
        lambda *a, **k: threads.add(threading.current_thread().name) or real_randperm(*a, **k),
    )
    monkeypatch.setattr(
        _engine,
        "_batches",
        lambda data, idx, *a: dtypes.add(idx.dtype) or real_batches(data, idx, *a),
    )
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(300, 6)).astype(np.float32), np.tile(np.arange(3), 100)
    train_many(
        DeviceData(X, y, device=CPU),
        [TrainConfig(0.5, seed=1)],
        n_classes=3,
        protocol=Protocol(epochs=3, batch_size=64),
        compile=False,
    )
    assert threads and threading.main_thread().name not in threads
    assert dtypes == {np.dtype(np.int32)}
