"""Benchmark the linear probe against its baselines, measured in the same run.

Three measurements, each printed as a table row with its ratio, then all as one JSON line:

``lbfgs``
    ``LinearProbe(solver="lbfgs")`` against scikit-learn's ``LogisticRegression`` (lbfgs) on
    the same problem (``weight_decay = 1 / (C * n_samples)``, same ``tol`` and iteration cap):
    fit time and test accuracy, with float32 features and with ``mixed_precision="bf16"``
    (bfloat16 products, float32 everything else; fast on CPUs with AVX512-BF16 or AMX).
``search``
    A 30-trial official search (the paper, supplement B.2) with batched trials (``run_searches``: the 10 startup trials in
    one pass, then batches of ``--trials-per-batch``) against the same 30 ``(lr, wd)`` trials
    trained one after another, as the official code does; both then retrain the best. Two
    baselines: our engine one trial per pass (what batching alone gains), and the official
    code's loop (``benchmarks/_official.py``: an ``nn.Linear`` and ``torch.optim.SGD`` per
    trial), which is what users run without this library.
``lockstep`` (``--lockstep``)
    Five seeds' searches in lockstep against the five searches one after another.

On the CPU the default size is 50,000 x 512 features with 100 classes. With ``--device cuda``
it is CoG's full scale: 1.1M x 2048 features, 1000 classes, 30 trials of 100 epochs and the
retrain (``--epochs 10`` keeps the whole script within 10 minutes on one H100: see
docs/guide/cost.rst); the features are generated on the GPU, and the sequential baselines are
timed on ``--baseline-trials`` trials and scaled to 30 (marked as extrapolated). On CUDA the
30-trial search runs once (after a one-epoch warm-up search that pays for compiling and
capturing the step); on the CPU it runs once as the warm-up and again interleaved with the
one-per-pass baseline, keeping the faster. Each row is printed as soon as its phase ends;
progress bars (stderr) show the search and the baselines as they run, and a line every 20 s
says that a long phase is still going. ``--quick`` runs a tiny
CPU version in seconds, so the script itself stays tested.

Precision: the search runs with ``--precision`` (default ``fp32``: float32 features and
products, no TF32, ``compile="auto"``, as ``evaluate`` and ``LinearProbeCV`` by default);
``tf32`` and ``bf16`` are opt-in and printed as such. The baselines run in float32. The
L-BFGS row also reports a bf16 fit, labelled.

The data is an isotropic Gaussian mixture, l2-normalised like CoG features. Times are wall
clock on whatever else the machine is doing; nothing here asserts a time.

Examples::

    python benchmarks/bench_probe.py                 # CPU, 10 epochs per trial
    python benchmarks/bench_probe.py --epochs 100    # CPU, the protocol's epochs (slow)
    python benchmarks/bench_probe.py --device cuda --epochs 10
    python benchmarks/bench_probe.py --device cuda --epochs 10 --precision bf16
    python benchmarks/bench_probe.py --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import sys
import time
import warnings

import numpy as np
import torch
from _heartbeat import heartbeat

# Each phase's figures appear as soon as it ends, so a run cut short still gives them.
print = functools.partial(print, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--quick", action="store_true", help="tiny CPU run that takes seconds")
    p.add_argument("--n-samples", type=int, help="training rows (default: by device)")
    p.add_argument("--n-features", type=int)
    p.add_argument("--n-classes", type=int)
    p.add_argument("--n-test", type=int, help="test rows (default: 50 per class)")
    p.add_argument("--epochs", type=int, help="SGD epochs per trial (CPU 10, CUDA 100)")
    p.add_argument("--n-trials", type=int, default=30)
    p.add_argument("--trials-per-batch", type=int, default=5)
    p.add_argument(
        "--precision",
        choices=["fp32", "tf32", "bf16"],
        default=None,
        help="precision of the search (default: fp32, evaluate's default)",
    )
    p.add_argument(
        "--baseline-trials",
        type=int,
        default=None,
        help="sequential trials actually timed (default: all on CPU, 2 on CUDA)",
    )
    p.add_argument("--C", type=float, default=1.0, help="LogisticRegression C for --bench lbfgs")
    p.add_argument("--max-iter", type=int, default=200, help="L-BFGS iteration cap (both)")
    p.add_argument("--lockstep", action="store_true", help="also time 5 seeds in lockstep")
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["lbfgs", "search", "sequential", "official"],
        help="measurements to leave out",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="time each side this many times, interleaved, and keep the fastest",
    )
    p.add_argument("--json", help="also write the JSON to this file")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def settings(args):
    cuda = args.device.startswith("cuda")
    if args.quick:
        base = {"n": 3000, "d": 64, "c": 20, "epochs": 3, "trials": 6}
    elif cuda:
        base = {"n": 1_100_000, "d": 2048, "c": 1000, "epochs": 100, "trials": args.n_trials}
    else:
        base = {"n": 50_000, "d": 512, "c": 100, "epochs": 10, "trials": args.n_trials}
    n = args.n_samples or base["n"]
    c = args.n_classes or base["c"]
    return {
        "device": args.device,
        "n": n,
        "d": args.n_features or base["d"],
        "c": c,
        "n_test": args.n_test or 50 * c,
        "epochs": args.epochs or base["epochs"],
        "trials": base["trials"],
        "precision": args.precision or "fp32",
        "baseline_trials": args.baseline_trials or (2 if cuda else base["trials"]),
    }


def mixture(n, d, c, n_test, seed, device, sep=0.2):
    """Train and test draws of an l2-normalised Gaussian mixture (torch, on ``device``)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    means = torch.randn(c, d, generator=gen, device=device)
    means *= sep / means.norm(dim=1, keepdim=True)  # class separation relative to unit noise

    def draw(rows):
        y = torch.randint(0, c, (rows,), generator=gen, device=device)
        X = torch.empty(rows, d, device=device)
        for s in range(0, rows, 65536):  # in blocks: no full-size temporaries
            part = torch.randn(min(65536, rows - s), d, generator=gen, device=device)
            part /= math.sqrt(d)
            part += means[y[s : s + len(part)]]
            X[s : s + len(part)] = part / part.norm(dim=1, keepdim=True)
        return X, y.cpu().numpy()

    return draw(n), draw(n_test)


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device, repeat=1):
    """Fastest of ``repeat`` wall-clock runs of ``fn`` and its last output."""
    best = math.inf
    for _ in range(repeat):
        sync(device)
        t = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best, out


def timed_pair(fn_a, fn_b, device, repeat):
    """Time two functions alternately (a, b, a, b, ...): shared load hits both alike."""
    ta = tb = math.inf
    for _ in range(repeat):
        t, out_a = timed(fn_a, device)
        ta = min(ta, t)
        t, out_b = timed(fn_b, device)
        tb = min(tb, t)
    return (ta, out_a), (tb, out_b)


def bench_lbfgs(cfg, args, X, y, Xt, yt):
    from sklearn.linear_model import LogisticRegression

    from imagenet_cog import LinearProbe

    Xn, Xtn = (a.cpu().numpy() if isinstance(a, torch.Tensor) else a for a in (X, Xt))
    wd = 1.0 / (args.C * len(y))
    probe = LinearProbe(
        solver="lbfgs", weight_decay=wd, epochs=args.max_iter, tol=1e-4, device=cfg["device"]
    )
    sk = LogisticRegression(C=args.C, tol=1e-4, max_iter=args.max_iter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a ConvergenceWarning is reported as n_iter below
        # warm-up: torch's first calls pay one-off initialisation costs
        LinearProbe(solver="lbfgs", epochs=2, device=cfg["device"]).fit(Xn[:200], y[:200])
        (t_probe, _), (t_sk, _) = timed_pair(
            lambda: probe.fit(Xn, y), lambda: sk.fit(Xn, y), cfg["device"], args.repeat
        )
        # bf16 features: the two products of each evaluation in bfloat16, the rest float32
        probe16 = LinearProbe(
            solver="lbfgs",
            weight_decay=wd,
            epochs=args.max_iter,
            tol=1e-4,
            device=cfg["device"],
            mixed_precision="bf16",
        )
        t_probe16, _ = timed(lambda: probe16.fit(Xn, y), cfg["device"], args.repeat)
        # features stored as float64 (NumPy's default): scikit-learn then works in float64
        X64 = Xn.astype(np.float64)
        sk64 = LogisticRegression(C=args.C, tol=1e-4, max_iter=args.max_iter)
        t_sk64, _ = timed(lambda: sk64.fit(X64, y), "cpu", args.repeat)
    acc_probe, acc_sk = probe.score(Xtn, yt), sk.score(Xtn, yt)
    return {
        "time_probe_bf16_s": t_probe16,
        "speedup_bf16": t_sk / t_probe16,
        "test_acc_probe_bf16": probe16.score(Xtn, yt),
        "baseline": "sklearn LogisticRegression(lbfgs)",
        "time_probe_s": t_probe,
        "time_sklearn_s": t_sk,
        "speedup": t_sk / t_probe,
        "time_sklearn_float64_s": t_sk64,
        "speedup_vs_sklearn_float64": t_sk64 / t_probe,
        "test_acc_sklearn_float64": sk64.score(Xtn, yt),
        "test_acc_probe": acc_probe,
        "test_acc_sklearn": acc_sk,
        "acc_delta_points": 100 * (acc_probe - acc_sk),
        "n_iter_probe": int(probe.n_iter_),
        "n_iter_sklearn": int(sk.n_iter_[0]),
        "C": args.C,
    }


def bench_search(cfg, args, X, y, Xt, yt, emit, seeds=(22,)):
    from imagenet_cog import make_search_spec, run_searches
    from imagenet_cog._device import precisions as _precisions
    from imagenet_cog._device import resolve_device
    from imagenet_cog._grid import Protocol
    from imagenet_cog._train.engine import DeviceData, TrainConfig, train_many

    mixed = {"fp32": None, "tf32": "tf32", "bf16": "bf16"}[cfg["precision"]]
    specs = [make_search_spec(y, s) for s in seeds]
    kw = {"epochs": cfg["epochs"], "device": cfg["device"], "mixed_precision": mixed}

    def batched(epochs=cfg["epochs"]):
        return run_searches(
            X,
            y,
            specs,
            n_trials=cfg["trials"],
            X_test=Xt,
            y_test=yt,
            trials_per_batch=args.trials_per_batch,
            progress="batched search",
            **(kw | {"epochs": epochs}),
        )

    cuda = cfg["device"].startswith("cuda")
    if cuda:
        # At full scale the search takes minutes: run it once, after a one-epoch search of the
        # same shapes that pays for compiling and capturing the step.
        batched(epochs=1)
    t_first, results = timed(batched, cfg["device"])  # on the CPU also the warm-up
    passes = len({t["round"] for t in results[0].trials}) + 1
    out = {
        "baseline": "the same trials one after another (one engine pass each) + retrain",
        "time_batched_s": t_first,
        "engine_passes_batched": passes,
        "engine_passes_sequential": cfg["trials"] + 1,
        "best_params": results[0].best_params,
        "best_val_top1": results[0].best_score,
        "test_top1": [r.test_top1 for r in results],
        "test_top5": [r.test_top5 for r in results],
        "failed_trials": sum(t["state"] == "FAIL" for r in results for t in r.trials),
    }
    if cuda:
        print(f"30-trial search + retrain, batched: {t_first:.2f} s ({passes} engine passes)")

    # Baseline: the same trials, one engine pass each, then the retrain, as the official loop.
    device = resolve_device(cfg["device"])
    wdt, fdt, tf32 = _precisions("float32", mixed)

    def sequential(n_trials):
        from tqdm.auto import tqdm

        data = DeviceData(X, y, device=device, dtype=fdt)
        test = DeviceData(Xt, yt, device=device, dtype=fdt)
        scores = []
        bar = tqdm(
            total=len(specs) * (n_trials + 1), desc="one trial per pass", unit="fit", mininterval=5
        )
        with bar:
            for spec, res in zip(specs, results):
                for t in res.trials[:n_trials]:
                    cfg_t = TrainConfig(t["lr"], t["wd"], spec.seed, spec.train_idx, spec.val_idx)
                    (r,) = train_many(
                        data,
                        [cfg_t],
                        n_classes=cfg["c"],
                        protocol=Protocol(epochs=cfg["epochs"]),
                        dtype=wdt,
                        tf32=tf32,
                    )
                    scores.append(r.top1)
                    bar.update()
                best = res.best_params
                final = TrainConfig(
                    best["lr"], best["wd"], spec.seed, spec.final_idx, np.arange(len(yt))
                )
                train_many(
                    data,
                    [final],
                    n_classes=cfg["c"],
                    protocol=Protocol(epochs=cfg["epochs"]),
                    dtype=wdt,
                    tf32=tf32,
                    eval_data=test,
                )
                bar.update()
        return scores

    n_base = min(cfg["baseline_trials"], cfg["trials"])
    extrapolated = n_base < cfg["trials"]
    out["sequential_extrapolated_from_trials"] = n_base if extrapolated else None
    note = f"{passes} vs {cfg['trials'] + 1} passes"
    if extrapolated:
        note += f", baseline scaled from {n_base} trials"
    if "sequential" not in args.skip:
        if cuda:  # the batched search is not run a second time
            t_seq, scores = timed(lambda: sequential(n_base), cfg["device"], args.repeat)
        else:  # interleaved with a second batched run, as the figures on file were measured
            (t_seq, scores), (t_batched, _) = timed_pair(
                lambda: sequential(n_base), batched, cfg["device"], args.repeat
            )
            out["time_batched_s"] = min(t_batched, t_first)
        if extrapolated:  # scale the trial part; the retrain is one more trial's worth
            t_seq = t_seq / (n_base + 1) * (cfg["trials"] + 1)
        batched_scores = [t["val_top1"] for r in results for t in r.trials[:n_base]]
        out |= {
            "time_sequential_s": t_seq,
            "speedup": t_seq / out["time_batched_s"],
            "max_val_top1_diff_batched_vs_sequential": float(
                np.nanmax(np.abs(np.array(batched_scores) - np.array(scores)))
            ),
        }
        emit("30-trial search", out["time_batched_s"], t_seq, out["speedup"], note)
    elif not cuda:
        emit("30-trial search", out["time_batched_s"], math.nan, math.nan, "baseline skipped")
    if "official" in args.skip:
        return out

    # Second baseline: the same trials through the official code's loop (an nn.Linear and
    # torch.optim.SGD per trial, one after another), which is what the batching replaces.
    from _official import official_train, progress_bar

    Xo = torch.as_tensor(X, device=device).float()
    yo = torch.as_tensor(y, device=device).long()
    Xto, yto = torch.as_tensor(Xt, device=device).float(), torch.as_tensor(yt, device=device).long()

    def official(n_trials):
        steps = sum(
            cfg["epochs"]
            * (
                n_trials * math.ceil(len(spec.train_idx) / 1024)
                + math.ceil(len(spec.final_idx) / 1024)
            )
            for spec in specs
        )
        with progress_bar(steps, "official loop") as bar:
            for spec, res in zip(specs, results):
                gen = torch.Generator().manual_seed(spec.seed)
                train, val = torch.as_tensor(spec.train_idx), torch.as_tensor(spec.val_idx)
                for t in res.trials[:n_trials]:
                    official_train(
                        Xo,
                        yo,
                        train,
                        Xo[val],
                        yo[val],
                        t["lr"],
                        t["wd"],
                        cfg["epochs"],
                        gen,
                        bar=bar,
                    )
                best = res.best_params
                official_train(
                    Xo,
                    yo,
                    torch.as_tensor(spec.final_idx),
                    Xto,
                    yto,
                    best["lr"],
                    best["wd"],
                    cfg["epochs"],
                    gen,
                    bar=bar,
                )

    t_official, _ = timed(lambda: official(n_base), cfg["device"])
    if extrapolated:
        t_official = t_official / (n_base + 1) * (cfg["trials"] + 1)
    out |= {
        "official_loop_s": t_official,
        "speedup_vs_official_loop": t_official / out["time_batched_s"],
    }
    note = "nn.Linear + SGD per trial, sequential"
    if extrapolated:
        note += f", scaled from {n_base} trials"
    emit(
        "  vs official loop",
        out["time_batched_s"],
        t_official,
        out["speedup_vs_official_loop"],
        note,
    )
    return out


def bench_lockstep(cfg, args, X, y, Xt, yt):
    from imagenet_cog import make_search_spec, run_searches

    seeds = (22, 37, 45, 77, 93)
    mixed = {"fp32": None, "tf32": "tf32", "bf16": "bf16"}[cfg["precision"]]
    kw = {
        "n_trials": cfg["trials"],
        "epochs": cfg["epochs"],
        "device": cfg["device"],
        "mixed_precision": mixed,
        "trials_per_batch": args.trials_per_batch,
        "X_test": Xt,
        "y_test": yt,
    }
    specs = [make_search_spec(y, s) for s in seeds]
    t_lock, _ = timed(lambda: run_searches(X, y, specs, **kw), cfg["device"])
    t_one, _ = timed(lambda: [run_searches(X, y, [s], **kw) for s in specs], cfg["device"])
    return {
        "baseline": "the 5 searches one after another (each batched)",
        "time_lockstep_s": t_lock,
        "time_one_by_one_s": t_one,
        "speedup": t_one / t_lock,
    }


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = settings(args)
    if cfg["device"].startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    t0 = time.perf_counter()
    (X, y), (Xt, yt) = mixture(
        cfg["n"], cfg["d"], cfg["c"], cfg["n_test"], args.seed, cfg["device"]
    )
    if not cfg["device"].startswith("cuda"):
        X, Xt = X.numpy(), Xt.numpy()
    report = {
        "settings": cfg,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if cfg["device"].startswith("cuda") else None,
        },
        "data_s": time.perf_counter() - t0,
    }
    print(
        f"imagenet_cog linear probe benchmark: {cfg['n']} x {cfg['d']}, {cfg['c']} classes, "
        f"{cfg['epochs']} epochs, device {cfg['device']}, {torch.get_num_threads()} CPU threads"
    )
    default = cfg["precision"] == "fp32"
    print(
        f"search: precision {cfg['precision']} "
        + (
            "(evaluate's defaults: float32 features, no TF32, compile='auto')"
            if default
            else "(opt-in, not evaluate's default)"
        )
        + f", {args.trials_per_batch} trials per batch after the 10 startup trials; "
        "baselines: float32"
    )
    print(f"{'measurement':<18} {'ours (s)':>10} {'baseline (s)':>13} {'ratio':>7}  note")

    def emit(name, ours, base, ratio, note):  # one table row, as soon as it is measured
        print(f"{name:<18} {ours:>10.2f} {base:>13.2f} {ratio:>6.2f}x  {note}")

    if "lbfgs" not in args.skip:
        data = (X, y), (Xt, yt)
        if cfg["n"] * cfg["d"] * cfg["c"] > 1e10:
            # scikit-learn at CoG's full scale would take hours: use the CPU default size
            data = mixture(50_000, 512, 100, 5000, args.seed, "cpu")
            report["lbfgs_size"] = [50_000, 512, 100]
        (Xs, ys), (Xst, yst) = data
        with heartbeat("lbfgs fits"):
            r = report["lbfgs"] = bench_lbfgs(cfg, args, Xs, ys, Xst, yst)
        emit(
            "lbfgs fit",
            r["time_probe_s"],
            r["time_sklearn_s"],
            r["speedup"],
            f"acc {r['test_acc_probe']:.4f} vs {r['test_acc_sklearn']:.4f}",
        )
        emit(
            "  bf16 features",
            r["time_probe_bf16_s"],
            r["time_sklearn_s"],
            r["speedup_bf16"],
            f"acc {r['test_acc_probe_bf16']:.4f} vs {r['test_acc_sklearn']:.4f}",
        )
        emit(
            "  vs float64 input",
            r["time_probe_s"],
            r["time_sklearn_float64_s"],
            r["speedup_vs_sklearn_float64"],
            f"acc {r['test_acc_probe']:.4f} vs {r['test_acc_sklearn_float64']:.4f}",
        )
    if "search" not in args.skip:
        with heartbeat("search and its baselines"):
            report["search"] = bench_search(cfg, args, X, y, Xt, yt, emit)
    if args.lockstep:
        with heartbeat("5 seeds lockstep"):
            r = report["lockstep"] = bench_lockstep(cfg, args, X, y, Xt, yt)
        emit(
            "5 seeds lockstep",
            r["time_lockstep_s"],
            r["time_one_by_one_s"],
            r["speedup"],
            "5 searches",
        )
    if "search" in report and cfg["epochs"] < 100 and not args.quick:
        # The SGD work grows with the epochs; the per-trial costs (Optuna, the evaluations)
        # do not, so this is an upper bound.
        t = report["search"]["time_batched_s"] * 100 / cfg["epochs"]
        print(
            f"EXTRAPOLATION (not a measurement): the batched search + retrain at the "
            f"protocol's 100 epochs would take about {t:.0f} s (x{100 / cfg['epochs']:.3g} epochs)"
        )
    text = json.dumps(report, default=float)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return report


if __name__ == "__main__":
    main()
