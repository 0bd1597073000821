"""The fused (compiled, graph-captured) SGD step against the eager one, and its self-checks.

No GPU here: CUDA graphs and streams are simulated on the CPU (``fakecuda``), with the rules
that decide whether a capture records the step (devices, streams, what runs during a capture).
"""

import contextlib
import importlib.util
import math
import warnings

import numpy as np
import pytest
import torch
from fakecuda import NOT_PERMITTED, FakeCuda
from sklearn.datasets import make_blobs
from sklearn.preprocessing import normalize
from torch.utils._python_dispatch import TorchDispatchMode

from imagenet_cog._grid import Protocol
from imagenet_cog._train import fused as _fused
from imagenet_cog._train.engine import DeviceData, TrainConfig, forced_step, train_many

CPU = torch.device("cpu")


@pytest.fixture
def simulated_cuda(monkeypatch):
    """``start(tensor_device, **options)``: the weights' device is a simulated CUDA device.

    ``torch.compile`` returns the function itself, so the graphs record the plain functions.
    """
    with contextlib.ExitStack() as stack:

        def start(tensor_device=0, **options):
            fake = FakeCuda(tensor_device=tensor_device, **options)
            monkeypatch.setattr(_fused, "_cuda_index", lambda device: tensor_device, raising=False)
            monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
            stack.enter_context(fake.install(monkeypatch))
            return fake

        yield start


def problem(n=400, d=12, classes=5):
    X, y = make_blobs(n_samples=n, centers=classes, n_features=d, random_state=0)
    rng = np.random.default_rng(1)
    sub = np.sort(rng.choice(n, 90, replace=False))
    ev = np.arange(0, n, 3)
    configs = [
        TrainConfig(0.5, 1e-4, seed=1, eval_idx=ev),
        TrainConfig(2.0, 0.0, seed=1, eval_idx=ev),
        TrainConfig(1.0, 1e-3, seed=2, train_idx=sub, eval_idx=np.arange(5)),  # fewer steps
    ]
    return normalize(X).astype(np.float32), y, configs


# 7 steps per epoch: 2 groups take the first 2 steps, 1 group the other 5.
KW = {"n_classes": 5, "protocol": Protocol(epochs=5, batch_size=64)}


def assert_same(a, b, atol=1e-5):
    for x, z in zip(a, b):
        assert not x.diverged and not z.diverged and x.n_epochs == z.n_epochs
        np.testing.assert_allclose(x.coef, z.coef, atol=atol)
        np.testing.assert_allclose(x.intercept, z.intercept, atol=atol)
        np.testing.assert_allclose(x.loss_curve, z.loss_curve, atol=atol)
        np.testing.assert_allclose(x.top1, z.top1, atol=1e-9)


def train_as(mode, *args, **kw):
    """train_many with the step ``mode`` where it would pick another."""
    with forced_step(mode):
        return train_many(*args, **kw)


def fit(data, configs, mode=None, **kw):
    stats = {}
    with forced_step(mode) if mode else contextlib.nullcontext():
        return train_many(data, configs, **KW, stats=stats, **kw), stats


def test_device_side_indices_and_hyper_parameters_equal_the_eager_step():
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    fused = train_as("fused", data, configs, **KW)
    assert_same(eager, fused)


def test_a_diverging_configuration_is_frozen_alone_in_the_fused_step():
    X, y, _ = problem()
    data = DeviceData(X * 1e10, y, device=CPU)
    configs = [TrainConfig(1e-9, 0.0, seed=0), TrainConfig(1e30, 0.0, seed=0)]
    eager = train_many(data, configs, **KW, compile=False)
    fused = train_as("fused", data, configs, **KW)  # a warning would fail the test
    assert fused[1].diverged and not fused[0].diverged
    assert np.isnan(fused[1].coef).all()
    assert fused[1].n_epochs == eager[1].n_epochs
    np.testing.assert_allclose(fused[0].coef, eager[0].coef, atol=1e-5)


def test_compile_auto_is_eager_on_the_cpu_and_bad_values_are_refused():
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    a, stats = fit(data, configs)
    b = train_many(data, configs, **KW, compile=False)
    for x, z in zip(a, b):
        np.testing.assert_array_equal(x.coef, z.coef)
    assert stats == {"step_paths": {"eager": 1}, "step_check_max_diff": None, "step_fallbacks": []}
    with pytest.raises(ValueError, match="compile must be"):
        train_many(data, configs, **KW, compile="yes")


# ------------------------------------------------------------------ the checks
def test_each_new_variant_is_checked_and_the_fit_says_how_it_trained():
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    got, stats = fit(data, configs, mode="fused")
    assert_same(eager, got)
    assert stats["step_paths"] == {"fused": 1} and stats["step_fallbacks"] == []
    # Checked, and the same arithmetic: rounding apart, far below the tolerance.
    assert 0 <= stats["step_check_max_diff"] < _fused.CHECK_TOLERANCE / 100
    train_as("fused", data, configs, **KW, stats=stats)  # one dict gathers fits
    assert stats["step_paths"] == {"fused": 2}


@pytest.fixture
def miscompiled(monkeypatch):
    """``torch.compile`` returns a wrong SGD update, as a miscompiled kernel would."""
    right = _fused.sgd_update

    def wrong(W, buf_W, g_W, b, buf_b, g_b, wd, neg_lr, momentum, W_low=None):
        right(W, buf_W, g_W, b, buf_b, g_b, wd, neg_lr, momentum * 1.01, W_low)  # 1% off

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: wrong if "update" in fn.__name__ else fn)


def test_a_miscompiled_step_is_caught_warned_once_and_the_fits_train_eagerly(miscompiled):
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    with pytest.warns(RuntimeWarning, match=r"SGD step \(compiled\) is wrong: its first run"):
        got, stats = fit(data, configs, compile=True)
    assert_same(eager, got)  # the step the check caught counts once, as the eager one
    assert stats["step_paths"] == {"eager": 1}
    assert stats["step_check_max_diff"] > _fused.CHECK_TOLERANCE
    assert "is wrong" in stats["step_fallbacks"][0]
    # The next fit of the same kind trains eagerly from the start, without a second warning.
    again, stats = fit(data, configs, compile=True)
    assert stats["step_paths"] == {"eager": 1} and stats["step_check_max_diff"] is None
    for x, z in zip(eager, again):
        np.testing.assert_array_equal(x.coef, z.coef)


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"replays_that_work": 0}, "first replay with"),  # an empty graph
        ({"stale": {"index_select"}}, "first replay with"),  # a batch never gathered again
    ],
)
def test_a_graph_that_replays_other_work_is_caught(simulated_cuda, option, match):
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    simulated_cuda(**option)
    with pytest.warns(RuntimeWarning, match=match):
        got, stats = fit(data, configs, mode="graph")
    assert_same(eager, got)
    assert stats["step_paths"] == {"eager": 1}


def test_the_epoch_end_step_counter_catches_replays_that_stop_working(simulated_cuda):
    # Each graph's first replay works (and passes its check); later ones do nothing.
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    simulated_cuda(replays_that_work=1)
    with pytest.warns(RuntimeWarning, match="ran 4 of the epoch's 7 steps"):
        got, stats = fit(data, configs, mode="graph")
    for x, z in zip(eager, got):  # trained again from the start, eagerly: the eager fit
        np.testing.assert_array_equal(x.coef, z.coef)
        np.testing.assert_array_equal(x.loss_curve, z.loss_curve)
    assert stats["step_paths"] == {"eager": 1}
    assert "ran 4 of the epoch's 7 steps" in stats["step_fallbacks"][0]


# ------------------------------------------------------------------ graphs, simulated
@pytest.mark.parametrize(
    ("features", "weights"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_graph_replays_equal_the_eager_step(simulated_cuda, features, weights):
    low = features == torch.bfloat16
    tolerance = _fused.CHECK_TOLERANCE_LOW if low else _fused.CHECK_TOLERANCE
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU, dtype=features)
    eager = train_many(data, configs, **KW, dtype=weights, compile=False)
    fake = simulated_cuda()
    got, stats = fit(data, configs, mode="graph", dtype=weights)
    assert_same(eager, got, atol=5e-3 if low else 1e-5)
    assert stats["step_paths"] == {"compiled+graph": 1} and stats["step_fallbacks"] == []
    assert stats["step_check_max_diff"] < tolerance / 10
    # One graph per number of groups taking a step (2, then 1), each recording the step.
    assert len(fake.captures) == 2 and all(len(g.ops) > 20 for g in fake.captures)
    assert all(g.replays > 0 for g in fake.captures)


def test_the_capture_follows_the_weights_device_not_the_current_one(simulated_cuda):
    # The weights on cuda:1, the current device cuda:0 (no torchrun to set it).
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    fake = simulated_cuda(tensor_device=1)
    got, stats = fit(data, configs, mode="graph")
    assert_same(eager, got)
    assert stats["step_paths"] == {"compiled+graph": 1}
    assert [g.device for g in fake.captures] == [1, 1]
    assert all(len(g.ops) > 20 for g in fake.captures)
    assert fake.current == 0 and not fake.capturing_anywhere()


def test_a_capture_on_another_device_is_caught(simulated_cuda, monkeypatch):
    # Were the step to capture on the current device (0) while the weights live on 1, the
    # capture would run the step instead of recording it: caught, and undone.
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    fake = simulated_cuda(tensor_device=1)
    monkeypatch.setattr(_fused, "_cuda_index", lambda device: 0)
    with pytest.warns(RuntimeWarning, match="capture ran the step instead of recording it"):
        got, stats = fit(data, configs, mode="graph")
    assert_same(eager, got)
    assert stats["step_paths"] == {"compiled": 1}
    assert all(not g.captured for g in fake.captures)


def test_capturing_keeps_the_allocator_cache(simulated_cuda):
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    fake = simulated_cuda()
    fit(data, configs, mode="graph")
    assert len(fake.captures) == 2 and fake.empty_cache_calls == 0


# ------------------------------------------------------------------ failures
@pytest.mark.parametrize("where", ["an operation", "a compiled function"])
def test_an_error_inside_a_capture_is_a_capture_failure_and_leaves_no_capture(
    simulated_cuda, monkeypatch, where
):
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    if where == "an operation":
        # The 5th operation of a capture is one CUDA does not allow: the capture is
        # invalidated, and any further work on its stream would raise.
        fake = simulated_cuda(fail_capture_at=5)
        cause = NOT_PERMITTED
    else:
        # A compiled function that works, except inside a capture (a recompilation there).
        fake = simulated_cuda()
        cause = "no compiling while capturing"

        def compiled(fn, **kw):
            def run(*args):
                if torch.cuda.is_current_stream_capturing():
                    raise RuntimeError(cause)
                return fn(*args)

            return run

        monkeypatch.setattr(torch, "compile", compiled)
    with pytest.warns(RuntimeWarning) as warned:
        got, stats = fit(data, configs, mode="graph")
    assert len(warned) == 1
    message = str(warned[0].message)
    assert message.startswith("capturing the SGD step in a CUDA graph failed")
    assert cause in message
    assert_same(eager, got)
    assert stats["step_paths"] == {"compiled": 1}  # compiled, without graphs
    assert not fake.capturing_anywhere() and fake.current_stream().default
    # Not tried again in this process.
    got, stats = fit(data, configs, mode="graph")
    assert len(fake.captures) == 1 and stats["step_paths"] == {"compiled": 1}


def test_a_failed_compile_warns_once_per_kind_and_is_not_retried(monkeypatch):
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    attempts = []

    def broken(fn, **kw):
        attempts.append(fn)
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(RuntimeWarning, match="compiling the SGD step failed.*no compiler here"):
        got, stats = fit(data, configs, compile=True)
    assert_same(eager, got)
    assert stats["step_paths"] == {"fused": 1}  # uncompiled, still checked
    for _ in range(3):  # evaluate makes hundreds of such fits
        got, stats = fit(data, configs, compile=True)
        assert stats["step_paths"] == {"fused": 1}
    assert len(attempts) == 1


def test_a_compiled_function_failing_at_its_first_call_falls_back(monkeypatch):
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)

    def fails_when_called(fn, **kw):
        def run(*args):
            raise RuntimeError("inductor failed")

        return run

    monkeypatch.setattr(torch, "compile", fails_when_called)
    with pytest.warns(RuntimeWarning, match="inductor failed") as record:
        got = train_many(data, configs, **KW, compile=True)
    assert len(record) == 1  # once, then never again
    assert_same(eager, got)


@pytest.mark.parametrize("which", ["grad_logits", "sgd_update"])
def test_a_compiled_step_failing_half_way_counts_once(monkeypatch, which):
    # The compiled function does its work (adds the loss, or updates the weights in place),
    # then fails, as when a later kernel of it fails: the retry must not do it twice.
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)

    def half_way(fn, **kw):
        if not fn.__name__.startswith(which):
            return fn

        def run(*args):
            fn(*args)
            raise RuntimeError("a later kernel failed")

        return run

    monkeypatch.setattr(torch, "compile", half_way)
    with pytest.warns(RuntimeWarning, match="a later kernel failed"):
        got = train_many(data, configs, **KW, compile=True)
    assert_same(eager, got)


# ------------------------------------------------------------------ where users set it
@pytest.fixture
def compiles(monkeypatch):
    """Counts the functions ``torch.compile`` is given (and returns them unchanged)."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(fn.__name__) or fn)
    return seen


def test_linear_probe_passes_compile_on(compiles):
    from imagenet_cog import LinearProbe

    X, y, _ = problem()
    plain = LinearProbe(epochs=3, batch_size=64, device="cpu", random_state=0).fit(X, y)
    assert compiles == []  # "auto" on the CPU: the eager step
    probe = LinearProbe(epochs=3, batch_size=64, device="cpu", random_state=0, compile=True)
    probe.fit(X, y)
    assert len(compiles) == 2  # the two fused functions
    np.testing.assert_allclose(probe.coef_, plain.coef_, atol=1e-5)
    with pytest.raises(ValueError, match="compile must be 'auto', True or False, got 'on'"):
        LinearProbe(device="cpu", compile="on").fit(X, y)


def test_linear_probe_cv_passes_compile_on(compiles):
    from imagenet_cog import LinearProbeCV

    X, y, _ = problem()
    cv = LinearProbeCV(
        n_trials=2, n_startup_trials=1, epochs=2, device="cpu", random_state=0, compile=True
    ).fit(X, y)
    assert len(compiles) >= 2 and cv.best_estimator_.compile is True
    with pytest.raises(TypeError, match="compile must be 'auto', True or False, got None"):
        LinearProbeCV(device="cpu", compile=None).fit(X, y)


@pytest.mark.parametrize(
    ("option", "value"), [([], "auto"), (["--compile", "on"], True), (["--compile", "off"], False)]
)
def test_the_evaluate_command_passes_compile_on(monkeypatch, tmp_path, option, value):
    from imagenet_cog import protocol
    from imagenet_cog.cli import main

    got = {}

    class Done:
        def report(self):
            return "report"

    monkeypatch.setattr(protocol, "evaluate", lambda *a, **kw: got.update(kw) or Done())
    assert main(["evaluate", str(tmp_path), "--out", str(tmp_path / "run"), *option]) == 0
    assert got["compile"] is value or got["compile"] == value


def _inductor_works():
    if importlib.util.find_spec("torch._inductor") is None:
        return False
    try:
        return bool(torch._dynamo.is_dynamo_supported())
    except Exception:  # noqa: BLE001
        return False


needs_dynamo = pytest.mark.skipif(not _inductor_works(), reason="torch.compile is not available")


@pytest.fixture
def counted_compiles(monkeypatch):
    """Real dynamo (tracing, guards, recompilations), with a backend that counts its runs."""
    real = torch.compile
    runs = {"compiled": 0, "graphs": 0}

    def backend(gm, example_inputs):
        runs["graphs"] += 1

        def run(*args):
            runs["compiled"] += 1
            return gm.forward(*args)

        return run

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=backend, **kw))
    torch._dynamo.reset()
    yield runs
    torch._dynamo.reset()


@pytest.mark.slow
@needs_dynamo
def test_mixing_dtypes_and_sizes_keeps_every_fit_compiled(counted_compiles):
    # float32, bfloat16 and float64, 1 or 2 configurations per group, 7 or 5 classes, in one
    # process: more variants of the step than dynamo's recompile limit (8) allows a function.
    X, y = make_blobs(n_samples=200, centers=7, n_features=12, random_state=0)
    X = normalize(X).astype(np.float32)
    dtypes = [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float64, torch.float64),
        (torch.bfloat16, torch.float64),
    ]
    for C in (7, 5):
        for features, weights in dtypes:
            data = DeviceData(X, y % C, device=CPU, dtype=features)
            for K in (1, 2):
                configs = [TrainConfig(0.5 + k, 1e-4, seed=1) for k in range(K)]
                before = counted_compiles["compiled"]
                train_many(
                    data,
                    configs,
                    n_classes=C,
                    protocol=Protocol(epochs=2, batch_size=64),
                    dtype=weights,
                    compile=True,
                )
                assert counted_compiles["compiled"] > before, (C, features, K)  # compiled ran


@pytest.mark.slow
@needs_dynamo
def test_reaching_the_recompile_limit_is_said_and_not_retried(counted_compiles):
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    eager = train_many(data, configs, **KW, compile=False)
    with torch._dynamo.config.patch(recompile_limit=1):
        # Groups of 2, then 1: a second variant of the same function, over the limit of 1.
        with pytest.warns(RuntimeWarning, match="recompile limit"):
            got, stats = fit(data, configs, compile=True)
        assert_same(eager, got)
        assert stats["step_paths"] == {"fused": 1}
        graphs = counted_compiles["graphs"]
        fit(data, configs, compile=True)
        assert counted_compiles["graphs"] == graphs


@pytest.mark.slow
@needs_dynamo
def test_compiled_elementwise_functions_equal_the_plain_ones():
    # The two fused functions, compiled by inductor for the CPU (C++), against themselves
    # uncompiled: the same numbers up to the rounding of fused operations.
    torch.manual_seed(0)
    n, Bm, K, C, d = 3, 16, 2, 5, 8
    z = torch.randn(n, Bm, K * C)
    b = torch.randn(n, 1, K * C)
    y = torch.randint(0, C, (n, Bm))
    w = torch.full((n, Bm), 1 / Bm)
    w[2, 10:] = 0  # padding rows
    loss_a, loss_b = torch.zeros(n, K), torch.zeros(n, K)
    ga, gba = _fused.grad_logits(z, b, y, w, loss_a, K, C)
    gb, gbb = torch.compile(_fused.grad_logits)(z, b, y, w, loss_b, K, C)
    torch.testing.assert_close(ga, gb, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gba, gbb, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(loss_a, loss_b, atol=1e-6, rtol=1e-5)

    state = [torch.randn(n, d, K * C), torch.randn(n, d, K * C), torch.randn(n, d, K * C)]
    state += [torch.randn(n, 1, K * C), torch.randn(n, 1, K * C), torch.randn(n, 1, K * C)]
    wd, neg_lr = torch.rand(n, 1, K, 1) * 1e-3, -torch.rand(n, 1, K, 1)
    plain = [t.clone() for t in state]
    compiled = [t.clone() for t in state]
    low_a = torch.empty(n, d, K * C, dtype=torch.bfloat16)
    low_b = torch.empty_like(low_a)
    _fused.sgd_update(*plain, wd, neg_lr, 0.9, low_a)
    torch.compile(_fused.sgd_update)(*compiled, wd, neg_lr, 0.9, low_b)
    for a, c in zip(plain, compiled):
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-5)
    assert not torch.equal(plain[0], state[0])  # it did update in place
    torch.testing.assert_close(low_a.float(), low_b.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", [torch.float32, torch.bfloat16])
def test_graph_step_equals_the_eager_step_on_cuda(precision):
    X, y, configs = problem()
    cuda = torch.device("cuda")
    data = DeviceData(X, y, device=cuda, dtype=precision)
    eager = train_many(data, configs, **KW, compile=False)
    stats = {}
    graph = train_many(data, configs, **KW, compile="auto", stats=stats)  # a warning fails it
    assert stats["step_paths"] == {"compiled+graph": 1}
    # bfloat16 products: one rounding flipped by a fused operation moves a weight by an ulp
    # of bfloat16, which then travels; float32 must agree to 1e-5.
    assert_same(eager, graph, atol=1e-5 if precision == torch.float32 else 5e-3)


def test_torch_deprecations_while_compiling_are_not_a_failed_compile(monkeypatch):
    # torch 2.11's compiler imports torch.utils.mkldnn, which warns that torch.jit.script_method
    # is deprecated, when torch.compile is first called; its compiled code may warn too. Under
    # -W error (this suite's setting) neither may send the step to the eager path.
    def warn():
        warnings.warn("`torch.jit.script_method` is deprecated", DeprecationWarning, stacklevel=1)

    def compile_that_warns(fn, **kwargs):
        warn()

        def compiled(*args):
            warn()
            return fn(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", compile_that_warns)
    step = _fused._compiled(lambda a, b: a + b, "cpu", ("test", 1))
    assert step(1, 2) == 3


# ------------------------------------------------------------------ at the floor
class _WeightSized(TorchDispatchMode):
    """Records every operation that returns a new tensor of a weight's shape (groups,
    features, configurations x classes), or of its per-configuration view (groups, features,
    configurations, classes)."""

    def __init__(self, trailing):
        super().__init__()
        self.features, self.per_group = trailing[0], trailing[0] * trailing[1]
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        in_place = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        view = any(r.alias_info is not None for r in schema.returns)
        made = isinstance(out, torch.Tensor) and not (in_place or view)
        shape = tuple(out.shape) if made else ()
        if len(shape) >= 3 and shape[1] == self.features and math.prod(shape[1:]) == self.per_group:
            self.made.append(func.__name__)
        return out


@pytest.mark.parametrize("precision", [torch.float32, torch.bfloat16])
def test_the_fused_step_accumulates_the_weight_gradient_into_the_momentum(monkeypatch, precision):
    # float32: the gradient of the weights goes straight into the momentum buffer, as in the
    # eager step; no weight-sized tensor is made by a step (the checks' copies apart), not even
    # by the update uncompiled. bfloat16: the gradient's product in bfloat16 alone (what the
    # memory plan counts), added into the momentum in place.
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU, dtype=precision)
    eager = train_many(data, configs, **KW, compile=False)
    mode = _WeightSized((X.shape[1], 2 * KW["n_classes"]))
    body = _fused.FusedStep._body

    def watched(self, n):
        with mode:
            return body(self, n)

    monkeypatch.setattr(_fused.FusedStep, "_body", watched)
    got, stats = fit(data, configs, mode="fused")
    assert_same(eager, got, atol=1e-5 if precision == torch.float32 else 5e-3)
    assert stats["step_paths"] == {"fused": 1}
    assert set(mode.made) == (set() if precision == torch.float32 else {"bmm.default"})


def test_a_shape_is_made_and_checked_once_and_reused_across_calls(simulated_cuda, monkeypatch):
    # The calls of one search (the rounds after the startup one) have one shape: the step is
    # made, compiled, captured and checked by the first call, and replayed by the others, with
    # each call's own hyper-parameters and initial weights.
    X, y, _ = problem()
    data = DeviceData(X, y, device=CPU)
    sub = np.sort(np.random.default_rng(1).choice(len(y), 90, replace=False))
    rounds = [
        [TrainConfig(lr, wd, seed=1), TrainConfig(lr * 2, 0.0, seed=2, train_idx=sub)]
        for lr, wd in ((0.5, 1e-4), (1.5, 0.0), (0.2, 1e-3))
    ]
    eager = [train_many(data, cs, **KW, compile=False) for cs in rounds]
    fake = simulated_cuda()
    checks = []
    reference = _fused.FusedStep._reference
    monkeypatch.setattr(
        _fused.FusedStep, "_reference", lambda self, *a: checks.append(a) or reference(self, *a)
    )
    stats = {}
    for cs, want in zip(rounds, eager):
        got, one = fit(data, cs, mode="graph")
        assert_same(want, got)
        assert one["step_paths"] == {"compiled+graph": 1} and one["step_fallbacks"] == []
        stats.setdefault("n_checks", []).append(len(checks))
    assert len(fake.captures) == 2  # one graph per number of groups, in the first call only
    # Two runs and the first replay of each graph, all in the first call.
    assert stats["n_checks"][0] > 0 and stats["n_checks"] == [stats["n_checks"][0]] * 3


def test_another_shape_or_other_data_makes_a_new_step(simulated_cuda):
    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    other = DeviceData(X[::-1].copy(), y[::-1].copy(), device=CPU)
    fake = simulated_cuda()
    for d, cs in ((data, configs), (data, configs[:2]), (other, configs[:2]), (data, configs)):
        want = train_many(d, cs, **KW, compile=False)
        got, _ = fit(d, cs, mode="graph")
        assert_same(want, got)
    # 2 graphs (2 then 1 groups taking a step), 1 (one group), 1 (other data), 2 again: only the
    # step last used is kept, so the first shape was made again.
    assert len(fake.captures) == 6


def test_a_kept_step_does_not_keep_its_data_alive():
    import gc
    import weakref

    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    fit(data, configs, mode="fused")
    assert _fused._STEPS
    features = weakref.ref(data.X)
    del data
    gc.collect()
    assert features() is None and not _fused._STEPS


def test_initial_weights_are_drawn_once_per_seed_and_shape(monkeypatch):
    # The protocol's rounds start every trial of a search from the same weights (the seed's
    # nn.Linear initialisation): drawn once on the host and kept on the device, with the same
    # numbers and the same generator state for the shuffles after them.
    from imagenet_cog._train import engine

    X, y, configs = problem()
    data = DeviceData(X, y, device=CPU)
    engine._INITIAL.clear()
    cold = train_many(data, configs, **KW, compile=False)
    draws = []

    class Draws(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith("uniform_"):
                draws.append(func)
            return func(*args, **(kwargs or {}))

    with Draws():
        warm = train_many(data, configs, **KW, compile=False)
    assert draws == []
    for a, b in zip(cold, warm):
        np.testing.assert_array_equal(a.coef, b.coef)
        np.testing.assert_array_equal(a.loss_curve, b.loss_curve)
    engine._INITIAL.clear()
    with Draws():
        train_many(data, configs, **KW, compile=False)
    assert len(draws) == 4  # weight and bias of the 2 seeds
