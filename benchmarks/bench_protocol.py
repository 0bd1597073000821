"""Time the whole ImageNet-CoG protocol against a sequential version of the official loop.

On the CPU (default) both run on the same synthetic features, at reduced scale,
with the same settings: every domain x shots x seed cell, a 30-trial TPE search
and the final retrain. The baseline is a plain re-implementation of the official
``logreg.py`` loop: one ``nn.Linear`` + ``torch.optim.SGD`` at a time, trials run
one after another by ``study.optimize``, features shuffled by a ``randperm`` per
epoch, the cosine step after each epoch. Ours is :func:`imagenet_cog.evaluate`
(five seeds' searches in lockstep, the official TPE sequence kept). It prints
both times, their ratio, and the mean top-1 of each (they agree up to the
randomness of the splits, which the two implementations draw differently).

With ``--device cuda`` it runs ours alone at full scale: 6 domains of 1.1M x 2048
features (generated on the GPU, one domain at a time), 1000 classes, all shots,
5 seeds, 30 trials of 100 epochs. The official all-data runs alone took about
37.5 V100-hours per model (75 V100-minutes per level and seed, the paper, supplement B.2);
the script prints our time against that figure. Nothing here asserts a time.

Examples::

    python benchmarks/bench_protocol.py                  # CPU, reduced scale (~11 min, most of it the baseline)
    python benchmarks/bench_protocol.py --quick          # seconds
    python benchmarks/bench_protocol.py --device cuda    # full scale, one GPU
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
import warnings
from collections.abc import Mapping

import numpy as np
import torch

# Each phase's figures appear as soon as it ends, so a run cut short still gives them.
print = functools.partial(print, flush=True)
from _official import official_fewshot, official_split, official_train

DOMAINS = ("in1k", "L1", "L2", "L3", "L4", "L5")
SEPARATION = dict(zip(DOMAINS, (0.45, 0.38, 0.33, 0.29, 0.26, 0.23)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="a tiny run that takes seconds")
    p.add_argument("--n-classes", type=int)
    p.add_argument("--n-features", type=int)
    p.add_argument("--n-train", type=int, help="training images per class")
    p.add_argument("--n-test", type=int, default=None, help="test images per class")
    p.add_argument("--epochs", type=int)
    p.add_argument("--n-trials", type=int, default=30)
    p.add_argument("--seeds", default="22,37,45,77,93")
    p.add_argument("--shots", default=None, help="comma-separated, e.g. 1,8,all")
    p.add_argument("--domains", default=",".join(DOMAINS))
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if args.quick:
        defaults = {"n_classes": 10, "n_features": 32, "n_train": 30, "epochs": 3}
        args.n_trials = min(args.n_trials, 4)
        args.domains = "in1k,L5"
        args.seeds = "22,37"
        args.shots = args.shots or "2,all"
    elif cuda:
        defaults = {"n_classes": 1000, "n_features": 2048, "n_train": 1100, "epochs": 100}
    else:
        defaults = {"n_classes": 100, "n_features": 256, "n_train": 60, "epochs": 10}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.n_test = args.n_test or (50 if cuda else 10)
    args.shots = args.shots or ("1,2,4,8,16,32,64,128,all" if cuda else "1,8,all")
    args.precision = args.precision or ("bf16" if cuda else "fp32")
    return args


class SyntheticDomains(Mapping):
    """Gaussian classes, l2-normalised, built on first access of each domain.

    Separation falls from IN-1K to L5, as accuracy does on CoG. Deterministic:
    the same domain is the same data every time it is built.
    """

    def __init__(self, domains, n_classes, n_features, n_train, n_test, device, dtype):
        self.domains = list(domains)
        self.shape = (n_classes, n_features, n_train, n_test)
        self.device, self.dtype = torch.device(device), dtype

    def __len__(self):
        return len(self.domains)

    def __iter__(self):
        return iter(self.domains)

    def __getitem__(self, domain):
        if domain not in self.domains:
            raise KeyError(domain)
        c, d, n_train, n_test = self.shape
        gen = torch.Generator(device=self.device).manual_seed(DOMAINS.index(domain) + 1)
        means = (
            torch.randn(c, d, generator=gen, device=self.device) * SEPARATION[domain] / math.sqrt(d)
        )

        def draw(n_per_class):
            y = torch.arange(c, device=self.device).repeat_interleave(n_per_class)
            x = means[y] + torch.randn(len(y), d, generator=gen, device=self.device) / math.sqrt(d)
            x = torch.nn.functional.normalize(x, dim=1).to(self.dtype)
            return x, y.cpu().numpy()

        X_train, y_train = draw(n_train)
        X_test, y_test = draw(n_test)
        if self.device.type == "cpu":
            return X_train.numpy(), y_train, X_test.numpy(), y_test
        return X_train, y_train, X_test, y_test


def official_protocol(domains, shots, seeds, n_trials, epochs):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    top1 = {}
    for domain, (X_train, y_train, X_test, y_test) in domains.items():
        X, y = torch.as_tensor(X_train).float(), torch.as_tensor(y_train)
        Xt, yt = torch.as_tensor(X_test).float(), torch.as_tensor(y_test)
        for n in shots:
            for seed in seeds:
                gen = torch.Generator().manual_seed(seed)
                n_shots = None if n == "all" else int(n)
                train, val = official_split(y_train, seed, n_shots, gen)

                def objective(trial, X=X, y=y, train=train, val=val, gen=gen):
                    lr = trial.suggest_float("lr", 0.1, 100, log=True)
                    wd = trial.suggest_float("wd", 1e-12, 1e-4, log=True)
                    return official_train(X, y, train, X[val], y[val], lr, wd, epochs, gen)

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    sampler = optuna.samplers.TPESampler(multivariate=True, seed=seed)
                study = optuna.create_study(direction="maximize", sampler=sampler)
                study.optimize(objective, n_trials=n_trials)
                final = (
                    torch.arange(len(y))
                    if n_shots is None
                    else official_fewshot(y_train, torch.arange(len(y)), n_shots, gen)
                )
                best = study.best_params
                top1[(domain, n, seed)] = official_train(
                    X, y, final, Xt, yt, best["lr"], best["wd"], epochs, gen
                )
    return top1


def main(argv=None):
    args = parse_args(argv)
    from imagenet_cog import evaluate

    domains = [d for d in args.domains.split(",") if d]
    seeds = [int(s) for s in args.seeds.split(",")]
    shots = [s if s == "all" else int(s) for s in args.shots.split(",")]
    dtype = torch.bfloat16 if args.precision == "bf16" and args.device != "cpu" else torch.float32
    data = SyntheticDomains(domains, args.n_classes, args.n_features, args.n_train, args.n_test,
                            args.device, dtype)  # fmt: skip
    print(
        f"ImageNet-CoG protocol: {len(domains)} domains x {len(shots)} shots x {len(seeds)} seeds, "
        f"{args.n_classes} classes x {args.n_train} train images, {args.n_features}-d, "
        f"{args.n_trials} trials x {args.epochs} epochs, device {args.device}"
    )
    start = time.perf_counter()
    ours = evaluate(
        data, domains=domains, shots=shots, seeds=seeds, n_trials=args.n_trials, epochs=args.epochs,
        device=args.device, mixed_precision="bf16" if dtype == torch.bfloat16 else None, progress=True,
    )  # fmt: skip
    t_ours = time.perf_counter() - start
    print(f"imagenet_cog.evaluate: {t_ours:.1f} s")
    result = {"settings": vars(args), "ours_s": round(t_ours, 2)}
    # Extrapolated, not measured: time scales with cells and epochs.
    full = 6 * 9 * 5 * 100
    share = len(domains) * len(shots) * len(seeds) * args.epochs
    print(
        f"EXTRAPOLATION (not a measurement): 6 domains x 9 shots x 5 seeds x 100 epochs "
        f"would take about {t_ours * full / share / 3600:.2f} h at this rate (x{full / share:.1f})"
    )
    mean_ours = float(np.mean([r["top1"] for r in ours.records]))
    print(ours.table())

    if args.device == "cpu":
        cpu = {d: data[d] for d in domains}
        start = time.perf_counter()
        base = official_protocol(cpu, shots, seeds, args.n_trials, args.epochs)
        t_base = time.perf_counter() - start
        mean_base = float(np.mean(list(base.values())))
        result |= {"baseline_s": round(t_base, 2), "speedup": round(t_base / t_ours, 2),
                   "mean_top1_ours": round(mean_ours, 2), "mean_top1_baseline": round(mean_base, 2)}  # fmt: skip
        print(f"\n{'':<38}{'time (s)':>10}{'mean top-1':>12}")
        print(f"{'official loop, sequential (baseline)':<38}{t_base:>10.1f}{mean_base:>12.2f}")
        print(f"{'imagenet_cog.evaluate':<38}{t_ours:>10.1f}{mean_ours:>12.2f}")
        print(f"speed-up: {t_base / t_ours:.2f}x")
    else:
        official_s = 37.5 * 3600
        result |= {
            "official_all_data_v100_s": official_s,
            "ratio_vs_official_v100": round(official_s / t_ours, 1),
        }
        print(f"\nwhole protocol: {t_ours / 3600:.2f} h on {torch.cuda.get_device_name()}; the official "
              f"all-data runs alone: ~37.5 V100-hours ({official_s / t_ours:.0f}x)")  # fmt: skip
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
