"""Per-step time of ``train_many``, eager against the fused (compiled, graph-captured) step.

Four shapes, as in the lockstep protocol: 1 trial; 5 seeds x 1 trial (one domain's searches
after the startup round); 5 seeds x 10 trials (the startup round); 30 searches x 1 trial (6
domains x 5 seeds, what ``evaluate`` runs after the startup round). For each it prints ms per
step and per trial-step as soon as it is measured. On the CPU the default size is small;
``--device cuda`` uses CoG's scale (1.1M x 2048 features, 1000 classes, batches of 1024).

Precision: ``--precision`` takes one or more of ``fp32`` (``evaluate``'s default: float32
features and products, no TF32), ``tf32`` and ``bf16`` (bfloat16 features and products,
float32 weights), comma-separated; each row says which. The default is ``fp32`` on the CPU and
``fp32,bf16`` on CUDA. Before each timed run, a one-epoch run of the same shape on the same
features makes the step (compiles it, captures its CUDA graphs, checks it against the eager
step), which the timed run then replays, as ``evaluate``'s calls after the first of a shape
do. Each row's floor is the step's two matrix products alone at that shape and precision,
timed in the same run (``_floor.py``): the row prints the fraction of it the step reaches.
A line every 20 s (stderr) says that a long row is still going. Nothing here asserts a time.

Examples::

    python benchmarks/bench_step.py --quick
    python benchmarks/bench_step.py --device cuda        # within 10 minutes on one H100 (computed)
    python benchmarks/bench_step.py --device cuda --rows 131072 --epochs 10   # the acceptance's
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch
from _floor import step_products_ms
from _heartbeat import heartbeat

print = functools.partial(print, flush=True)

SHAPES = (
    ("1 trial", 1, 1),
    ("5 seeds x 1 trial", 5, 1),
    ("5 seeds x 10 trials", 5, 10),
    ("30 searches x 1 trial", 30, 1),
)
PRECISIONS = {  # feature dtype, TF32, label
    "fp32": (torch.float32, False, "fp32 (evaluate's default)"),
    "tf32": (torch.float32, True, "tf32 (opt-in)"),
    "bf16": (torch.bfloat16, False, "bf16 (opt-in)"),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="timed epochs per shape (default: 2 on the CPU, 10 on CUDA)",
    )
    p.add_argument("--rows", type=int, default=None, help="training rows (CPU 20,000, CUDA 1.1M)")
    p.add_argument(
        "--precision",
        default=None,
        help="comma-separated among fp32, tf32, bf16 (default: fp32 on the CPU, fp32,bf16 on CUDA)",
    )
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    n, d, c = (1_100_000, 2048, 1000) if cuda else (20_000, 256, 100)
    if args.quick:
        n, d, c = 2048, 32, 10
    n = args.rows or n
    args.epochs = args.epochs or (10 if cuda else 2)
    precisions = (args.precision or ("fp32,bf16" if cuda else "fp32")).split(",")
    unknown = set(precisions) - set(PRECISIONS)
    if unknown:
        p.error(f"unknown precision {sorted(unknown)}; choose among {sorted(PRECISIONS)}")
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, device=device), dim=1)
    y = torch.randint(0, c, (n,), generator=gen, device=device)
    steps = args.epochs * -(-n // 1024)
    modes = [("eager", False)] + ([("compiled+graphs", "auto")] if cuda else [])
    print(
        f"train_many, {n} x {d}, {c} classes, batch 1024, {args.epochs} epochs ({steps} steps), "
        f"{args.device}; weights float32"
    )
    print(
        f"{'shape':<24}{'precision':<27}{'step':<18}{'ms/step':>9} {'ms/trial-step':>14} "
        f"{'floor':>9} {'of floor':>8}"
    )
    with heartbeat("bench_step"):
        rows = run(precisions, X, y, c, args.epochs, steps, modes, cuda)
    result = {
        "device": torch.cuda.get_device_name(X.device) if cuda else "cpu",
        "rows": n,
        "features": d,
        "classes": c,
        "batch": 1024,
        "epochs": args.epochs,
        "steps": steps,
        # One trial-step: the logits and the weight gradient of a batch, 2 x 2 x 1024 x d x c.
        "flop_per_trial_step": 4 * 1024 * d * c,
        "timings": rows,
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


def run(precisions, X, y, c, epochs, steps, modes, cuda):
    from imagenet_cog._grid import Protocol
    from imagenet_cog._train.engine import DeviceData, TrainConfig, train_many

    device = X.device
    rows = []
    for precision in precisions:
        dtype, tf32, label = PRECISIONS[precision]
        data = DeviceData(X.to(dtype), y, device=device, dtype=dtype)
        for name, seeds, trials in SHAPES:
            configs = [TrainConfig(1.0, 1e-6, seed=s) for s in range(seeds) for _ in range(trials)]
            _, floor, _ = step_products_ms(device, seeds, trials, X.shape[1], c, precision)
            for mode, compile in modes:
                kw = {"n_classes": c, "compile": compile, "tf32": tf32}
                train_many(
                    data, configs, protocol=Protocol(epochs=1), **kw
                )  # makes the step of this shape
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                train_many(data, configs, protocol=Protocol(epochs=epochs), **kw)
                if cuda:
                    torch.cuda.synchronize()
                ms = 1000 * (time.perf_counter() - start) / steps
                per = ms / len(configs)
                print(
                    f"{name:<24}{label:<27}{mode:<18}{ms:9.3f} {per:14.4f} {floor:9.4f} "
                    f"{floor / per:8.2f}"
                )
                rows.append(
                    {
                        "shape": name,
                        "trials": len(configs),
                        "precision": precision,
                        "step": mode,
                        "ms_per_step": round(ms, 4),
                        "ms_per_trial_step": round(per, 5),
                        # The step's two products alone at this shape, timed in this run.
                        "floor_ms_per_trial_step": round(floor, 5),
                        "of_floor": round(floor / per, 3),
                    }
                )
        del data
    return rows


if __name__ == "__main__":
    main()
