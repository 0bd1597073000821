"""Does the Optuna version change the protocol's result? Optuna 2.3.0 (the official code's pin) vs now.

    python benchmarks/compare_optuna_versions.py run OUT.json [--epochs 15] [--n-trials 30]
    python benchmarks/compare_optuna_versions.py compare A.json B.json

``run`` performs the official search for each of the 5 seeds (22, 37, 45, 77, 93)
on one synthetic task with whatever Optuna is installed, and writes a JSON with,
per seed, every trial's ``(lr, wd, val top-1)``, the best ``(lr, wd)``, its val
top-1 and the test top-1 of the final model. Run it once in an environment with
``optuna==2.3.0`` and once with the current Optuna, then ``compare`` the two files:
it prints the per-seed table, how many trials of each seed drew the same
``(lr, wd)``, and the difference of the 5-seed mean test top-1 with the seeds'
standard deviation for scale.

The search is the official code's, run the way it runs it: a sequential
``study.optimize`` over 30 trials with ``TPESampler(multivariate=True, seed=seed)``
(10 random startup trials, TPE's default), ``lr`` then ``wd`` log-uniform in
[0.1, 100] and [1e-12, 1e-4]. Each trial trains our :class:`LinearProbe` (the
official SGD protocol) on the seed's search split from :func:`make_search_spec`
and scores its top-1 on the holdout; the best ``(lr, wd)`` is retrained on the
whole training set and scored on the test set. Only the Optuna version differs
between the two runs: same data, same splits, same training code, same seeds.
A diverged trial (non-finite loss) is a failed trial in both versions.

The files of one such pair of runs are in ``benchmarks/results/`` (Optuna 2.3.0
in a venv with ``optuna==2.3.0 sqlalchemy<1.4``, built with
``pip install --no-build-isolation`` and ``setuptools<70`` as its setup.py needs
``pkg_resources``; the rest, torch included, from the main environment).

The task is cheap on two CPU cores: 50 Gaussian classes in 64 dimensions,
l2-normalised, 60 training and 40 test samples per class, 15 epochs.
"""

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

SEEDS = (22, 37, 45, 77, 93)
LR_RANGE = (0.1, 100.0)
WD_RANGE = (1e-12, 1e-4)


def make_task(n_classes=50, dim=64, n_train=60, n_test=40, sep=0.9, seed=0):
    """l2-normalised Gaussian classes: hard enough that (lr, wd) matter."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim)) * sep / np.sqrt(dim) * 4

    def draw(n):
        y = np.repeat(np.arange(n_classes), n)
        X = means[y] + rng.normal(size=(y.size, dim))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        return X.astype(np.float32), y

    X, y = draw(n_train)
    X_test, y_test = draw(n_test)
    return X, y, X_test, y_test


def run(out, epochs, n_trials):
    import optuna
    import torch

    from imagenet_cog import LinearProbe, make_search_spec

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    X, y, X_test, y_test = make_task()
    kw = {"epochs": epochs, "batch_size": 1024, "device": "cpu"}
    rows, start = [], time.perf_counter()
    for seed in SEEDS:
        spec = make_search_spec(y, seed)

        def objective(trial, spec=spec, seed=seed):
            lr = trial.suggest_float("lr", *LR_RANGE, log=True)
            wd = trial.suggest_float("wd", *WD_RANGE, log=True)
            probe = LinearProbe(lr=lr, weight_decay=wd, random_state=seed, **kw)
            probe.fit(X[spec.train_idx], y[spec.train_idx])  # ValueError when it diverges
            return probe.score(X[spec.val_idx], y[spec.val_idx])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate TPE is flagged experimental
            sampler = optuna.samplers.TPESampler(multivariate=True, seed=seed)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(objective, n_trials=n_trials, n_jobs=1, catch=(ValueError,))
        best = study.best_params
        final = LinearProbe(lr=best["lr"], weight_decay=best["wd"], random_state=seed, **kw)
        final.fit(X[spec.final_idx], y[spec.final_idx])
        rows.append(
            {
                "seed": seed,
                "best_lr": best["lr"],
                "best_wd": best["wd"],
                "val_top1": 100 * study.best_value,
                "test_top1": 100 * final.score(X_test, y_test),
                "trials": [
                    [t.params.get("lr"), t.params.get("wd"), t.value, t.state.name]
                    for t in study.trials
                ],
            }
        )
        r = rows[-1]
        print(
            f"seed {seed}: best lr {r['best_lr']:.4g} wd {r['best_wd']:.3g}  "
            f"val {r['val_top1']:.2f}  test {r['test_top1']:.2f}",
            flush=True,
        )
    doc = {
        "optuna": optuna.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "epochs": epochs,
        "n_trials": n_trials,
        "seconds": round(time.perf_counter() - start, 1),
        "seeds": rows,
    }
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    tops = [r["test_top1"] for r in rows]
    print(f"optuna {optuna.__version__}: mean test top-1 {statistics.mean(tops):.2f}")


def _same(a, b):
    return a[0] is not None and b[0] is not None and np.allclose(a[:2], b[:2], rtol=1e-9)


def compare(path_a, path_b):
    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
    va, vb = a["optuna"], b["optuna"]
    print(f"A: optuna {va}   B: optuna {vb}   ({a['n_trials']} trials, {a['epochs']} epochs)")
    print(
        f"{'seed':>4} | {'A lr':>8} {'A wd':>9} {'A val':>6} {'A test':>6} | "
        f"{'B lr':>8} {'B wd':>9} {'B val':>6} {'B test':>6} | same trials  first diff"
    )
    summary = []
    for ra, rb in zip(a["seeds"], b["seeds"]):
        same = [_same(ta, tb) for ta, tb in zip(ra["trials"], rb["trials"])]
        first = same.index(False) if False in same else len(same)
        print(
            f"{ra['seed']:>4} | {ra['best_lr']:8.4g} {ra['best_wd']:9.3g} {ra['val_top1']:6.2f} "
            f"{ra['test_top1']:6.2f} | {rb['best_lr']:8.4g} {rb['best_wd']:9.3g} "
            f"{rb['val_top1']:6.2f} {rb['test_top1']:6.2f} | {sum(same):>5}/{len(same)}"
            f"  {first:>9}"
        )
        summary.append(
            {
                "seed": ra["seed"],
                "same_trials": sum(same),
                "first_difference": first,
                "same_best": _same([ra["best_lr"], ra["best_wd"]], [rb["best_lr"], rb["best_wd"]]),
            }
        )
    out = {"A": va, "B": vb, "per_seed": summary}
    for key in ("val_top1", "test_top1"):
        ta = [r[key] for r in a["seeds"]]
        tb = [r[key] for r in b["seeds"]]
        diffs = [x - y for x, y in zip(ta, tb)]
        out[key] = {
            "mean_A": statistics.mean(ta),
            "mean_B": statistics.mean(tb),
            "mean_diff_A_minus_B": statistics.mean(diffs),
            "seed_std_A": statistics.stdev(ta),
            "seed_std_B": statistics.stdev(tb),
        }
        o = out[key]
        print(
            f"{key}: mean A {o['mean_A']:.2f}, mean B {o['mean_B']:.2f}, A - B "
            f"{o['mean_diff_A_minus_B']:+.2f} points (seed std A {o['seed_std_A']:.2f}, "
            f"B {o['seed_std_B']:.2f})"
        )
    print(json.dumps(out))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the 5 searches with the installed Optuna")
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--n-trials", type=int, default=30)
    p = sub.add_parser("compare", help="compare two JSON files of `run`")
    p.add_argument("a")
    p.add_argument("b")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, args.epochs, args.n_trials)
    else:
        compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
