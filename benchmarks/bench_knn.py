"""Benchmark the k-NN probe against scikit-learn's KNeighborsClassifier, in the same run.

Both classify the same test rows with DINO's weighted k-NN (cosine similarity, votes
``exp(s / T)``, T = 0.07): ``KNNProbe`` searches the neighbours in torch, in blocks, and
scikit-learn's ``KNeighborsClassifier(metric="cosine", algorithm="brute",
weights=<exp(s / T)>)`` computes the same votes by brute force. Two rows, each with its ratio:

``k=20``
    One ``k`` (DINO's reported one): ``KNNProbe(n_neighbors=20).predict`` against
    ``KNeighborsClassifier(n_neighbors=20).predict``.
``k=10,20,100,200``
    DINO's four ``k``: ``KNNProbe.top_classes`` ranks them from one search at k = 200;
    scikit-learn predicts once per ``k``, as a user of it would.

Top-1 agreement between the two is printed for every ``k`` timed in full (it should be 1.0
up to near-ties in float32).

On the CPU the default size is 50,000 training rows × 5,000 test rows × 512 features, 100
classes. With ``--device cuda`` it is IN-1K's: 1,281,167 × 50,000 × 2,048, 1000 classes; the
features are made on the GPU and handed over in host memory (as a feature store's are), and
scikit-learn is timed on ``--baseline-queries`` test rows and scaled to all of them (marked
extrapolated: its cost is linear in the test rows). ``--quick`` runs a tiny CPU version in
seconds, so the script itself stays tested.

The data is a Gaussian mixture, one centre per class. Times are wall clock on whatever else
the machine is doing (``uptime``'s load is printed); nothing here asserts a time.

Examples::

    python benchmarks/bench_knn.py
    python benchmarks/bench_knn.py --device cuda --json knn.json
    python benchmarks/bench_knn.py --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch
from _heartbeat import heartbeat

print = functools.partial(print, flush=True)

KS = (10, 20, 100, 200)
TEMPERATURE = 0.07


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--quick", action="store_true", help="tiny CPU run that takes seconds")
    p.add_argument("--n-train", type=int, help="training rows (default: by device)")
    p.add_argument("--n-test", type=int, help="test rows (default: by device)")
    p.add_argument("--n-features", type=int)
    p.add_argument("--n-classes", type=int)
    p.add_argument(
        "--baseline-queries",
        type=int,
        help="test rows scikit-learn is timed on (default: all on the CPU, 500 on CUDA)",
    )
    p.add_argument("--precision", choices=["fp32", "tf32"], default="fp32")
    p.add_argument("--repeat", type=int, default=1, help="time each side this many times")
    p.add_argument("--json", help="also write the figures as JSON to this file")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def sizes(args):
    cuda = args.device.startswith("cuda")
    if args.quick:
        base = (3000, 300, 32, 20)
    elif cuda:
        base = (1_281_167, 50_000, 2048, 1000)
    else:
        base = (50_000, 5_000, 512, 100)
    n, n_test, d, c = (
        args.n_train or base[0],
        args.n_test or base[1],
        args.n_features or base[2],
        args.n_classes or base[3],
    )
    baseline = args.baseline_queries or (min(500, n_test) if cuda else n_test)
    return {"n_train": n, "n_test": n_test, "d": d, "classes": c, "baseline_queries": baseline}


def mixture(n, n_test, d, c, seed, device):
    """Host float32 features of a Gaussian mixture (made on ``device``), and int labels."""
    gen = torch.Generator(device=device).manual_seed(seed)
    centres = torch.randn(c, d, generator=gen, device=device)

    def draw(rows):
        y = torch.randint(0, c, (rows,), generator=gen, device=device)
        X = np.empty((rows, d), dtype=np.float32)
        for s in range(0, rows, 65536):  # in blocks: no full-size temporaries on the device
            part = torch.randn(min(65536, rows - s), d, generator=gen, device=device)
            part += 3 / math.sqrt(d) * centres[y[s : s + len(part)]]  # centres ~4.2 apart
            X[s : s + len(part)] = part.cpu().numpy()
        return X, y.cpu().numpy()

    return draw(n), draw(n_test)


def sklearn_knn(k):
    from sklearn.neighbors import KNeighborsClassifier

    return KNeighborsClassifier(
        n_neighbors=k,
        metric="cosine",
        algorithm="brute",
        weights=lambda dist: np.exp((1.0 - dist) / TEMPERATURE),
    )


def timed(fn, device, repeat=1):
    """Fastest of ``repeat`` wall-clock runs of ``fn``, and its last output."""
    best, out = math.inf, None
    for _ in range(repeat):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, out


def load():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def main(argv=None):
    from imagenet_cog import KNNProbe
    from imagenet_cog._device import resolve_device
    from imagenet_cog._neighbors.search import plan_neighbors

    args = parse_args(argv)
    cfg = sizes(args)
    device = args.device
    mixed = "tf32" if args.precision == "tf32" else None
    where = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor()
    print(
        f"k-NN benchmark: {cfg['n_train']:,} training rows x {cfg['n_test']:,} test rows x "
        f"{cfg['d']} features, {cfg['classes']} classes, on {device} ({where or 'CPU'}), "
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, load {load()}"
    )
    with heartbeat("making the features"):
        (X, y), (Xt, yt) = mixture(
            cfg["n_train"], cfg["n_test"], cfg["d"], cfg["classes"], args.seed, device
        )
    plan = plan_neighbors(len(Xt), len(X), X.shape[1], max(KS), device=resolve_device(device))
    print(
        f"plan: {plan.n_groups} query group(s), blocks of {plan.query_block} x "
        f"{plan.key_block} rows, peak {plan.peak_bytes / 1e9:.2f} GB, "
        f"{plan.flop / 1e12:.1f} TFLOP of products"
    )
    ours = functools.partial(KNNProbe, device=device, mixed_precision=mixed)
    # Warm-up: torch's first products and CUDA's context cost once, whichever side runs first.
    ours(n_neighbors=5).fit(X[:1000], y[:1000]).predict(Xt[:100])

    nq = cfg["baseline_queries"]
    scale = len(Xt) / nq
    rows, report = [], {"settings": cfg, "device": device, "where": where, "load_before": load()}

    def row(name, t_ours, t_sk, extra=""):
        ratio = t_sk / t_ours
        basis = "measured" if scale == 1 else f"extrapolated from {nq:,} test rows"
        rows.append((name, t_ours, t_sk, ratio, basis))
        print(
            f"{name:<16} KNNProbe {t_ours:8.2f} s   scikit-learn {t_sk:8.2f} s ({basis})   "
            f"ratio {ratio:6.1f}x{extra}"
        )
        return ratio

    # One k: DINO's reported k = 20.
    with heartbeat("KNNProbe, k=20"):
        t_ours, pred = timed(
            lambda: ours(n_neighbors=20).fit(X, y).predict(Xt), device, args.repeat
        )
    with heartbeat("scikit-learn, k=20"):
        t_sk, pred_sk = timed(
            lambda: sklearn_knn(20).fit(X, y).predict(Xt[:nq]), "cpu", args.repeat
        )
    agree = float((pred[:nq] == pred_sk).mean())
    report["k20"] = {
        "ours_s": t_ours,
        "sklearn_s": t_sk * scale,
        "ratio": row("k=20", t_ours, t_sk * scale, f"   top-1 agreement {agree:.4f}"),
        "top1_agreement": agree,
        "top1_ours": float((pred == yt).mean()),
    }

    # DINO's four k: one search for ours, one predict per k for scikit-learn.
    with heartbeat("KNNProbe, k=10,20,100,200"):
        t_ours, ranked = timed(
            lambda: ours(n_neighbors=max(KS)).fit(X, y).top_classes(Xt, n_neighbors=KS),
            device,
            args.repeat,
        )

    def sklearn_all():
        fitted = sklearn_knn(KS[0]).fit(X, y)
        return {k: fitted.set_params(n_neighbors=k).predict(Xt[:nq]) for k in KS}

    with heartbeat("scikit-learn, k=10,20,100,200"):
        t_sk, preds_sk = timed(sklearn_all, "cpu", args.repeat)
    agreement = {k: float((ranked[k][:nq, 0] == preds_sk[k]).mean()) for k in KS}
    report["k_all"] = {
        "ours_s": t_ours,
        "sklearn_s": t_sk * scale,
        "ratio": row("k=10,20,100,200", t_ours, t_sk * scale),
        "top1_agreement": agreement,
        "top1_ours": {k: float((ranked[k][:, 0] == yt).mean()) for k in KS},
        "top5_ours": {k: float((ranked[k] == yt[:, None]).any(1).mean()) for k in KS},
    }
    print(
        "top-1 agreement per k: "
        + ", ".join(f"k={k} {a:.4f}" for k, a in agreement.items())
        + "; our top-1 per k: "
        + ", ".join(f"k={k} {a:.3f}" for k, a in report["k_all"]["top1_ours"].items())
    )
    report["plan"] = {
        "n_groups": plan.n_groups,
        "query_block": plan.query_block,
        "key_block": plan.key_block,
        "peak_bytes": plan.peak_bytes,
        "flop": plan.flop,
    }
    report["tflops_ours"] = plan.flop / report["k_all"]["ours_s"] / 1e12
    report["load_after"] = load()
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"KNNProbe at k=200: {report['tflops_ours']:.2f} TFLOP/s of products; load "
        f"{report['load_before']} before, {report['load_after']} after"
    )
    print(json.dumps(report, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
