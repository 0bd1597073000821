"""Time the whole ImageNet-CoG protocol against a sequential version of the official loop.

On the CPU (default) both run on the same synthetic features, at reduced scale,
with the same settings: every domain x shots x seed cell, a 30-trial TPE search
and the final retrain. The baseline is a plain re-implementation of the official
``logreg.py`` loop: one ``nn.Linear`` + ``torch.optim.SGD`` at a time, trials run
one after another by ``study.optimize``, features shuffled by a ``randperm`` per
epoch, the cosine step after each epoch. Ours is :func:`imagenet_cog.evaluate`
with its defaults (the searches of every domain and seed for one number of shots
trained in lockstep, each search asking for its trials one at a time). It prints
both times, their ratio, and the mean top-1 of each (they agree up to the
randomness of the splits, which the two implementations draw differently).

Precision: ``--precision fp32`` (the default on every device) is ``evaluate``'s
defaults: float32 features and products, no TF32, ``compile="auto"`` (on CUDA the
compiled step replayed from CUDA graphs). ``tf32`` and ``bf16`` (bfloat16 features
and products, float32 weights) are opt-in and labelled as such in the output. The
official loop always runs in float32, as the official code does.

With ``--device cuda`` both run on the GPU at CoG's size: domains of 1.1M x 2048
features (generated on the GPU, one domain at a time), 1000 classes, all shots,
5 seeds, 30 trials; ``--domains`` and ``--epochs`` set how much of the protocol
runs (all six domains at 100 epochs take hours; docs/guide/cost.rst lists the
commands that fit in 10 minutes on one H100). The official loop would take days
there, so it runs on a subset: ``--official-cells`` cells (default on CUDA: 1),
taken largest training set first (all-data cells, then the most shots), each with
``--official-trials`` trials (default on CUDA: 2) and its retrain. Its time is
printed as soon as it is measured, with its seconds per SGD step, and
extrapolated to every cell of the run by the number of SGD steps (marked as an
extrapolation, with the cells, trainings and steps it comes from; the per-trial
overheads, Optuna's and the evaluation's, are scaled with the steps, which at full
scale they are a small part of). Progress bars show both sides as they run, and a line
every 20 s says that a long engine pass is still going.

The floor: the matrix products of one step of every search in lockstep (one trial each, the
shape of the rounds after the startup one), timed alone in the same run on the same device and
in the same precision (``_floor.py``). The run prints each shots value's SGD products, its
time (its cells' share of their lockstep unit), its rate and that rate as a fraction of the
floor's, and the same for the all-data cells and the few-shot cells together. With
``--domains in1k,L1,L2,L3,L4,L5`` (6 domains x 5 seeds) the searches of a shots value are 30,
as in the paper's protocol.

The official README (github.com/naver/cog, step 3) says that each all-data
experiment "takes ~75min using a V100 GPU and 8 CPU cores"; read as one run of
``logreg.py`` (one domain and seed), the 30 all-data runs of one model take about
37.5 V100-hours. On CUDA the script prints its time against that figure, scaled
to the domains and epochs it ran. ``--only ours`` or ``--only official`` runs one
side. Nothing here asserts a time.

Examples::

    python benchmarks/bench_protocol.py                  # CPU, reduced scale (a few minutes)
    python benchmarks/bench_protocol.py --quick          # seconds
    python benchmarks/bench_protocol.py --device cuda --domains in1k --epochs 4
    python benchmarks/bench_protocol.py --device cuda --domains in1k --epochs 10 --precision bf16
    python benchmarks/bench_protocol.py --device cuda    # the whole protocol: hours
    python benchmarks/bench_protocol.py --device cuda --domains in1k,L1,L2,L3,L4,L5 \
        --n-train 100 --epochs 10 --shots 1,8,all --only ours   # 30 searches, 10 epochs
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
from _floor import step_products_ms
from _heartbeat import heartbeat
from _official import official_fewshot, official_split, official_train, progress_bar

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
    p.add_argument(
        "--precision",
        choices=["fp32", "tf32", "bf16"],
        default="fp32",
        help="evaluate's precision (default fp32: evaluate's defaults)",
    )
    p.add_argument(
        "--official-cells",
        type=int,
        default=None,
        help="cells the official loop runs, largest first (default: all on CPU, 1 on CUDA)",
    )
    p.add_argument(
        "--official-trials",
        type=int,
        default=None,
        help="trials per official cell (default: --n-trials on CPU, 2 on CUDA)",
    )
    p.add_argument(
        "--only",
        choices=["ours", "official"],
        default=None,
        help="run one side only (default: both)",
    )
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
    if args.official_trials is None:
        args.official_trials = 2 if cuda else args.n_trials
    args.official_trials = min(args.official_trials, args.n_trials)
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


def cell_rows(n_train, n_shots):
    """Rows per class of one cell's search trainings and of its retrain (the official splits).

    The synthetic classes all have ``n_train`` images: 20% of each is validation, the
    few-shot draws take ``n_shots`` of the rest (the retrain: of all ``n_train``).
    """
    search = n_train - int(0.2 * n_train)
    if n_shots is None:
        return search, n_train
    return min(n_shots, search), min(n_shots, n_train)


def cell_steps(n_classes, n_train, n, n_trials, epochs, batch_size=1024):
    """SGD steps of one cell in the official loop: ``n_trials`` trainings and the retrain."""
    search, final = cell_rows(n_train, None if n == "all" else int(n))

    def steps(rows):
        return epochs * math.ceil(rows / min(batch_size, rows))

    return n_trials * steps(search * n_classes) + steps(final * n_classes)


def cell_flop(n_classes, n_features, n_train, n, n_trials, epochs):
    """Floating-point operations of one cell's SGD: each row of each epoch of the ``n_trials``
    trainings and the retrain costs the logits and the weight gradient, 2 x 2 x d x classes."""
    search, final = cell_rows(n_train, None if n == "all" else int(n))
    rows = epochs * (n_trials * search + final) * n_classes
    return 4 * n_features * n_classes * rows


def pick_official_cells(cells, n_train, k):
    """The ``k`` cells with the most training rows (all-data first), in the run's order."""
    if k is None or k >= len(cells):
        return list(cells)
    size = {c: cell_rows(n_train, None if c[1] == "all" else int(c[1]))[0] for c in cells}
    chosen = set(sorted(cells, key=lambda c: -size[c])[:k])  # stable: earlier cells first
    return [c for c in cells if c in chosen]


def rates_against_floor(args, domains, seeds, shots, by_shots):
    """Each shots value's SGD rate, and the all-data and few-shot cells', against the floor:
    the products of one step of the lockstep searches, timed now on the same device."""
    searches = len(domains) * len(seeds)
    _, floor_ms, floor_tflops = step_products_ms(
        args.device, searches, 1, args.n_features, args.n_classes, args.precision
    )
    print(
        f"floor: the products of one step of {searches} searches in lockstep ({args.precision}, "
        f"1024 x {args.n_features} by {args.n_features} x {args.n_classes} each), timed in this "
        f"run: {floor_tflops:.3g} TFLOP/s ({floor_ms:.4f} ms per trial-step)"
    )
    rows = {}
    for n in shots:
        flop = (
            cell_flop(args.n_classes, args.n_features, args.n_train, n, args.n_trials, args.epochs)
            * len(domains)
            * len(seeds)
        )
        rows[str(n)] = (flop, by_shots[str(n)])
    few = [k for k in rows if k != "all"]
    groups = {k: [k] for k in rows}
    if "all" in rows:
        groups["all-data cells"] = ["all"]
    if few:
        groups["few-shot cells"] = few
    print(f"{'shots':<16}{'PFLOP':>9}{'seconds':>10}{'TFLOP/s':>10}{'of floor':>10}")
    out = {}
    for name, keys in groups.items():
        flop = sum(rows[k][0] for k in keys)
        seconds = sum(rows[k][1] for k in keys)
        rate = flop / seconds / 1e12 if seconds else float("nan")
        print(
            f"{name:<16}{flop / 1e15:>9.3g}{seconds:>10.1f}{rate:>10.3g}"
            f"{rate / floor_tflops:>10.2f}"
        )
        out[name] = {
            "flop": flop,
            "seconds": round(seconds, 2),
            "tflops": float(f"{rate:.4g}"),
            "of_floor": round(rate / floor_tflops, 3),
        }
    return {
        "searches_in_lockstep": searches,
        "floor_tflops": float(f"{floor_tflops:.4g}"),
        "floor_ms_per_trial_step": round(floor_ms, 5),
        "rates": out,
    }


def official_protocol(domains, cells, n_trials, epochs, bar=None):
    """The official loop over ``cells`` (domain, shots, seed), on the domains' device.

    ``bar`` (a tqdm bar, optional) advances by the SGD steps of each epoch.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    top1 = {}
    for domain in dict.fromkeys(c[0] for c in cells):  # each domain built once
        X_train, y_train, X_test, y_test = domains[domain]
        X, Xt = torch.as_tensor(X_train).float(), torch.as_tensor(X_test).float()
        y = torch.as_tensor(y_train, device=X.device)
        yt = torch.as_tensor(y_test, device=X.device)
        for _, n, seed in (c for c in cells if c[0] == domain):
            gen = torch.Generator().manual_seed(seed)
            n_shots = None if n == "all" else int(n)
            train, val = official_split(y_train, seed, n_shots, gen)

            def objective(trial, X=X, y=y, train=train, val=val, gen=gen):
                lr = trial.suggest_float("lr", 0.1, 100, log=True)
                wd = trial.suggest_float("wd", 1e-12, 1e-4, log=True)
                return official_train(X, y, train, X[val], y[val], lr, wd, epochs, gen, bar=bar)

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
                X, y, final, Xt, yt, best["lr"], best["wd"], epochs, gen, bar=bar
            )
    return top1


PRECISIONS = {
    "fp32": (None, "float32 features, no TF32, compile='auto' (evaluate's defaults)"),
    "tf32": ("tf32", "float32 features, TF32 products on CUDA (opt-in)"),
    "bf16": ("bf16", "bfloat16 features and products, float32 weights (opt-in)"),
}
#: The official README's time for one all-data run of logreg.py (one domain and seed).
OFFICIAL_V100_S = 75 * 60


def main(argv=None):
    args = parse_args(argv)
    from imagenet_cog import evaluate

    domains = [d for d in args.domains.split(",") if d]
    seeds = [int(s) for s in args.seeds.split(",")]
    shots = [s if s == "all" else int(s) for s in args.shots.split(",")]
    cuda = args.device.startswith("cuda")
    mixed, precision = PRECISIONS[args.precision]
    # bf16 features are stored as such on the GPU (half the memory); evaluate converts them
    # on the CPU.
    dtype = torch.bfloat16 if args.precision == "bf16" and cuda else torch.float32
    data = SyntheticDomains(
        domains, args.n_classes, args.n_features, args.n_train, args.n_test, args.device, dtype
    )
    print(
        f"ImageNet-CoG protocol: {len(domains)} domains x {len(shots)} shots x {len(seeds)} seeds, "
        f"{args.n_classes} classes x {args.n_train} train images, {args.n_features}-d, "
        f"{args.n_trials} trials x {args.epochs} epochs, device {args.device}"
    )
    print(f"precision of evaluate: {args.precision}: {precision}; the official loop: float32")
    result = {"settings": vars(args), "precision": precision}
    t_ours = None
    if args.only != "official":
        start = time.perf_counter()
        with heartbeat("imagenet_cog.evaluate"):
            ours = evaluate(
                data,
                domains=domains,
                shots=shots,
                seeds=seeds,
                n_trials=args.n_trials,
                epochs=args.epochs,
                device=args.device,
                mixed_precision=mixed,
                progress=True,
            )
            if cuda:
                torch.cuda.synchronize()
        t_ours = time.perf_counter() - start
        flop = sum(
            cell_flop(args.n_classes, args.n_features, args.n_train, n, args.n_trials, args.epochs)
            for n in shots
        ) * (len(domains) * len(seeds))
        print(
            f"imagenet_cog.evaluate: {t_ours:.1f} s ({flop / 1e15:.2f} PFLOP of SGD products, "
            f"computed: {flop / t_ours / 1e12:.1f} TFLOP/s)"
        )
        result |= {"ours_s": round(t_ours, 2), "sgd_flop": flop}
        if args.n_classes == 1000 and len(shots) == 9 and len(seeds) == 5 and args.n_trials == 30:
            # Every domain has the same size here, and the SGD work grows with the epochs; the
            # fixed costs (compiling, Optuna, the evaluations) do not, so this is an upper bound.
            scale = 6 / len(domains) * 100 / args.epochs
            print(
                f"EXTRAPOLATION (not a measurement): the whole protocol (6 domains, 100 epochs) "
                f"would take at most {t_ours * scale / 3600:.2f} h at this rate (x{scale:.1f}: "
                f"x{6 / len(domains):g} domains, x{100 / args.epochs:g} epochs; an upper bound)"
            )
        # Where the time went, per shots value (each cell's share of its lockstep unit), and
        # the whole protocol computed from its work at the rate of the all-data cells: their
        # SGD grows with the epochs, the few-shot cells' fixed costs (compiling, Optuna, the
        # evaluations) do not.
        by_shots = {}
        for r in ours.records:
            by_shots[str(r["shots"])] = by_shots.get(str(r["shots"]), 0.0) + r["time_total_s"]
        result["seconds_by_shots"] = {k: round(v, 2) for k, v in by_shots.items()}
        print(
            "time by shots value (s): " + ", ".join(f"N={k} {v:.1f}" for k, v in by_shots.items())
        )
        if "all" in by_shots and args.n_classes == 1000 and len(seeds) == 5 and args.n_trials == 30:
            flop = {
                str(n): cell_flop(
                    args.n_classes, args.n_features, args.n_train, n, args.n_trials, args.epochs
                )
                * len(domains)
                * len(seeds)
                for n in shots
            }
            rate = flop["all"] / by_shots["all"]
            few = [k for k in flop if k != "all"]
            fixed = sum(max(0.0, by_shots[k] - flop[k] / rate) for k in few)
            whole = (sum(flop.values()) * 100 / args.epochs / rate + fixed) * 6 / len(domains)
            result |= {"all_data_tflops": round(rate / 1e12, 2), "whole_protocol_s": round(whole)}
            print(
                f"COMPUTED (an extrapolation): the whole protocol (6 domains, 100 epochs) is "
                f"{sum(flop.values()) * 100 / args.epochs * 6 / len(domains) / 1e15:.0f} PFLOP "
                f"of SGD products; at the all-data cells' {rate / 1e12:.1f} TFLOP/s, plus the "
                f"few-shot cells' fixed costs ({fixed:.0f} s here), about {whole / 3600:.1f} h"
            )
        result |= rates_against_floor(args, domains, seeds, shots, by_shots)
        top1_ours = {(r["domain"], r["shots"], int(r["seed"])): r["top1"] for r in ours.records}
        result["mean_top1_ours"] = round(float(np.mean(list(top1_ours.values()))), 2)
        print(ours.table())

    if args.only != "ours":
        cells = [(d, n, s) for d in domains for n in shots for s in seeds]
        run = pick_official_cells(
            cells,
            args.n_train,
            args.official_cells if args.official_cells is not None else (1 if cuda else None),
        )
        trials = args.official_trials
        steps_run = sum(
            cell_steps(args.n_classes, args.n_train, n, trials, args.epochs) for _, n, _ in run
        )
        steps_all = sum(
            cell_steps(args.n_classes, args.n_train, n, args.n_trials, args.epochs)
            for _, n, _ in cells
        )
        subset = len(run) < len(cells) or trials < args.n_trials
        print(
            f"official loop: {len(run)} of {len(cells)} cells, {trials} trials + retrain each, "
            f"{steps_run} SGD steps, float32, device {args.device}"
        )
        # On the CPU the data is built before the clock starts; on CUDA one domain at a time
        # (its generation, well under a second, is inside the time).
        src = data if cuda else {d: data[d] for d in dict.fromkeys(c[0] for c in run)}
        start = time.perf_counter()
        with progress_bar(steps_run, "official loop") as bar, heartbeat("official loop"):
            base = official_protocol(src, run, trials, args.epochs, bar=bar)
            if cuda:
                torch.cuda.synchronize()
        t_run = time.perf_counter() - start
        t_base = t_run * steps_all / steps_run  # equal to t_run when every cell and trial ran
        print(
            f"official loop, measured: {t_run:.1f} s ({1e3 * t_run / steps_run:.3f} ms per SGD step)"
        )
        result |= {
            "official_measured_s": round(t_run, 2),
            "official_cells_measured": len(run),
            "official_trials_per_cell": trials,
            "official_steps_measured": steps_run,
            "official_steps_all": steps_all,
            "baseline_extrapolated": subset,
            "baseline_s": round(t_base, 2),
        }
        if subset:
            print(
                f"EXTRAPOLATION (not a measurement): the official loop over all {len(cells)} cells "
                f"of this run ({steps_all} SGD steps) would take about {t_base:.0f} s "
                f"({t_base / 3600:.2f} h), scaled by SGD steps from the {len(run)} cell(s) and "
                f"{len(run) * (trials + 1)} trainings measured"
            )
        mean_base = float(np.mean(list(base.values())))
        result["mean_top1_baseline"] = round(mean_base, 2)
        label = "official loop" + (" (extrapolated)" if subset else ", sequential (baseline)")
        print(f"\n{'':<38}{'time (s)':>10}{'mean top-1':>12}")
        print(f"{label:<38}{t_base:>10.1f}{mean_base:>12.2f}")
        if t_ours is not None:
            mean_same = float(
                np.mean([top1_ours[c] for c in base])
            )  # the same cells as the baseline
            result |= {"speedup": round(t_base / t_ours, 2), "mean_top1_ours": round(mean_same, 2)}
            print(
                f"{'imagenet_cog.evaluate (' + args.precision + ')':<38}{t_ours:>10.1f}"
                f"{mean_same:>12.2f}"
            )
            print(
                f"speed-up: {t_base / t_ours:.2f}x"
                + (" (against the extrapolation)" if subset else "")
            )
    if cuda and t_ours is not None and "all" in shots:
        # Computed from the official README's figure, not measured: its all-data cells only,
        # scaled to the domains, seeds and epochs of this run; other hardware (a V100).
        official_s = OFFICIAL_V100_S * len(domains) * len(seeds) * args.epochs / 100
        result |= {"official_all_data_v100_s": official_s}
        print(
            f"\nthis run: {t_ours / 3600:.2f} h on {torch.cuda.get_device_name()} (every shots "
            f"value); COMPUTED from the official README (~75 min per domain and seed on a "
            f"V100 at 100 epochs), its all-data cells alone at this size: "
            f"{official_s / 3600:.2f} V100-hours"
        )
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
