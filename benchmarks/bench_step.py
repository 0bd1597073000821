"""Per-step time of ``train_many``, eager against the fused (compiled, graph-captured) step.

Four shapes, as in the lockstep protocol: 1 trial; 5 seeds x 1 trial (what ``evaluate`` runs
after the startup round); 5 seeds x 10 trials (the startup round); 30 searches x 1 trial (6
domains x 5 seeds). For each it prints ms per step and per trial-step as soon as it is
measured. On the CPU the default size is small; ``--device cuda`` uses CoG's scale (1.1M x
2048 bfloat16 features, 1000 classes). Nothing here asserts a time.

Examples::

    python benchmarks/bench_step.py --quick
    python benchmarks/bench_step.py --device cuda
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

print = functools.partial(print, flush=True)

SHAPES = (("1 trial", 1, 1), ("5 seeds x 1 trial", 5, 1), ("5 seeds x 10 trials", 5, 10),
          ("30 searches x 1 trial", 30, 1))  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    from imagenet_cog._engine import DeviceData, TrainConfig, train_many

    cuda = args.device.startswith("cuda")
    n, d, c = (1_100_000, 2048, 1000) if cuda else (20_000, 256, 100)
    if args.quick:
        n, d, c = 2048, 32, 10
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, device=device), dim=1)
    y = torch.randint(0, c, (n,), generator=gen, device=device)
    dtype = torch.bfloat16 if cuda else torch.float32
    data = DeviceData(X.to(dtype), y, device=device, dtype=dtype)
    steps = args.epochs * -(-n // 1024)
    modes = [("eager", False)] + ([("compiled+graphs", "auto")] if cuda else [])
    print(
        f"train_many, {n} x {d}, {c} classes, {args.epochs} epochs ({steps} steps), {args.device}"
    )
    for label, seeds, trials in SHAPES:
        configs = [TrainConfig(1.0, 1e-6, seed=s) for s in range(seeds) for _ in range(trials)]
        for name, compile in modes:
            kw = {"n_classes": c, "epochs": args.epochs, "compile": compile}
            train_many(data, configs, **{**kw, "epochs": 1})  # warm-up (and compile)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            train_many(data, configs, **kw)
            if cuda:
                torch.cuda.synchronize()
            ms = 1000 * (time.perf_counter() - start) / steps
            print(f"{label:<24}{name:<18}{ms:9.3f} ms/step {ms / len(configs):9.4f} ms/trial-step")


if __name__ == "__main__":
    main()
