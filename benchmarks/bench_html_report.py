"""The size and the time of the HTML report at the benchmark's full size.

    python benchmarks/bench_html_report.py [--models 4] [--concepts 1000] [--json out.json]

Writes runs of ``--models`` models on the default protocol's shape (every domain, every shots
value, five seeds) whose saved predictions hold ``--concepts`` concepts per level with 50 test
images each, as ``evaluate --save-predictions`` writes them (1,000 per level: the whole
benchmark's 5,000 concepts), about 75% of them right and the errors on other concepts of the
level; then ``Results.to_html`` among the paper's 31 models, with the concept explorer. It
prints the file's size, each section's share, and the time to make it.

It never asserts a size: it prints a table and one JSON line.
"""

import argparse
import itertools
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_runs(root, n_models, per_level, seed=0):
    """The runs' folders: ``runs.jsonl`` of the default shape and, for N=all, the test
    predictions of every level and seed."""
    from imagenet_cog import load_levels
    from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS
    from imagenet_cog._runfolder import PREDICTIONS_DIR, write_predictions

    levels = load_levels("official")
    rng = np.random.default_rng(seed)
    folders = []
    for k in range(n_models):
        name = f"model-{k + 1}"
        run = root / name
        for domain, wnids in zip(levels.names, levels.levels):
            wnids = np.array(wnids[:per_level])
            y_true = np.repeat(wnids, 50)
            for s in SEEDS:
                wrong = rng.uniform(size=len(y_true)) > 0.75 - 0.05 * k
                y_pred = y_true.copy()
                y_pred[wrong] = wnids[rng.integers(0, len(wnids), wrong.sum())]
                index = {w: i for i, w in enumerate(wnids.tolist())}
                write_predictions(
                    run / PREDICTIONS_DIR,
                    domain,
                    "all",
                    s,
                    y_true=y_true,
                    y_pred=y_pred,
                    top5=np.array([[index[p]] for p in y_pred], dtype=np.int32),
                    classes=wnids,
                )
        cells = [
            {
                "model": name,
                "domain": d,
                "shots": n,
                "seed": s,
                "top1": 70.0 - 3 * k - 4 * i - 3 * (8 - j) + 0.2 * q,
            }
            for i, d in enumerate(DOMAINS)
            for j, n in enumerate(SHOTS)
            for q, s in enumerate(SEEDS)
        ]
        (run / "runs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
        folders.append(run)
    return folders


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4, help="models in the report (4)")
    parser.add_argument("--concepts", type=int, default=1000, help="concepts per level (1000)")
    parser.add_argument("--tmp", default=None, help="where the runs are written")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    from imagenet_cog import Results

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        folders = write_runs(root, args.models, args.concepts)
        written = time.perf_counter() - start
        results = Results.load(*folders)
        start = time.perf_counter()
        page = results.to_html(root / "report.html", compare=results.models[:2])
        made = time.perf_counter() - start
    size = len(page.encode("utf-8"))
    starts = [(m.group(1), m.start()) for m in re.finditer(r'<section id="([\w-]+)"', page)]
    starts.append(("end", len(page)))
    sections = {a: j - i for (a, i), (_, j) in itertools.pairwise(starts)}
    concepts = 5 * args.concepts
    print(f"HTML report: {args.models} models x {concepts:,} concepts")
    print(
        f"  size          {size / 1e6:8.2f} MB ({size / concepts / args.models:.0f} B a concept a model)"
    )
    for name, n in sections.items():
        print(f"  {name:<13} {n / 1e6:8.2f} MB")
    print(f"  made in       {made:8.1f} s (the runs written in {written:.1f} s)")
    found = {
        "models": args.models,
        "concepts": concepts,
        "bytes": size,
        "sections": sections,
        "seconds": round(made, 2),
    }
    print(json.dumps(found))
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
