"""Every stage at the paper's scale on the host: the protocol ladder, the analyses ladder, and a
copy of 1.37 million samples.

The paper's job is large: a domain is 1.1 to 1.28 million training rows of 2,048 float32
features (about 10 GB) plus 50,000 test rows, and the Fall 2011 copy on the Hub is 13.7 million
samples. This script runs each stage at that size (or a tenth of it, extrapolated by the
measured exponent) and prints, per rung, what it cost:

``protocol``
    Synthetic features (1,000 classes with class-dependent means, so that accuracy is neither
    trivial nor chance) written through the library's own store writer into real feature
    stores, at 1%, 10% and 100% of IN-1K's 1,281,167 training rows, each with 50,000 test
    rows; then ``evaluate`` on that one domain, all-data cell, one seed, with ``--epochs``
    epochs and ``--trials`` trials and the retrain. Per rung: wall time, peak resident memory,
    bytes read from disk (the store is evicted from the page cache first), trial-steps per
    second and GFLOP/s against a matrix product of the step's shape timed in the same process.
    Then the fitted exponents of time and of memory against rows.
``analyses``
    ``analyze`` (k-means with k = 1000, alignment/uniformity, the knowledge-driven error
    analysis) on the 1% and 10% rungs' stores and predictions, extrapolated to 100% by the
    measured exponent.
``copies``
    A webdataset copy in timm's layout (``imagenet22k-train-0000.tar``...: ``<key>.jpg``,
    ``<key>.cls``, ``<key>.json``), written once and reused: the 5,000 official CoG concepts,
    each with its 50 official test images and 224 more, shuffled across shards, tiny JPEG
    payloads. ``imagenet-cog data`` on a tenth of it and on all of it, cold (an empty listing
    cache) and from the listing cache; the listing extrapolated to Fall 2011's 13.7M samples by
    the measured exponent; then ``extract_all``'s one pass reading about 100,000 of its images
    with a tiny network.

Every measured step runs in a fresh process, so that its peak memory and its reads are its
own. Progress is shown as it runs; nothing asserts a time. ``--quick`` runs every part at a
size that takes seconds.

    python benchmarks/bench_scale.py protocol            # the ladder, 1%, 10%, 100% (long)
    python benchmarks/bench_scale.py protocol --rungs 1,10
    python benchmarks/bench_scale.py analyses
    python benchmarks/bench_scale.py copies --samples 1370000
    python benchmarks/bench_scale.py all --quick
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

print = functools.partial(print, flush=True)

HERE = Path(__file__).resolve().parent
#: IN-1K's training images and the test rows of a domain.
IN1K_TRAIN, TEST_ROWS = 1_281_167, 50_000
FEATURES, CLASSES, BATCH = 2048, 1000, 1024
#: Fall 2011's samples on the Hub (timm's webdataset copy).
FALL2011_SAMPLES = 13_700_000


# ------------------------------------------------------------------ measuring a step
def _io_counters():
    """``(bytes read from storage, bytes read by system calls)`` of this process, or Nones."""
    try:
        fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return int(fields["read_bytes"]), int(fields["rchar"])
    except (OSError, KeyError, ValueError):
        return None, None


def _rss_now():
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _imports():
    """What every measured step imports first, outside its clock: the package, its command
    line and torch (their memory is reported apart, as ``base_rss``)."""
    import torch  # noqa: F401

    import imagenet_cog.cli
    import imagenet_cog.protocol  # noqa: F401


def _memory_now():
    """``(anonymous, file-backed)`` resident bytes of this process: a copy of the data is
    anonymous memory, pages of a memory-mapped store are file-backed (the kernel may drop them)."""
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(("RssAnon:", "RssFile:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out.get("RssAnon"), out.get("RssFile")


def _child(queue, target, args):
    import threading

    _imports()
    base_rss = _rss_now()
    peaks = {"anon": 0, "file": 0}
    stop = threading.Event()

    def sample():  # the kernel keeps the peak of the whole RSS only: sample its two parts
        while not stop.wait(0.2):
            anon, file = _memory_now()
            peaks["anon"] = max(peaks["anon"], anon or 0)
            peaks["file"] = max(peaks["file"], file or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load0 = os.getloadavg()[0]
    start = time.perf_counter()
    read0, rchar0 = _io_counters()
    try:
        result = target(*args)
        error = None
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        result, error = None, f"{type(exc).__name__}: {exc}"
    stop.set()
    sampler.join()
    read1, rchar1 = _io_counters()
    queue.put(
        {
            "result": result,
            "error": error,
            "seconds": time.perf_counter() - start,
            # Linux reports kilobytes.
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "base_rss_bytes": base_rss,
            # Sampled every 0.2 s: the anonymous memory (copies) and the mapped files' pages.
            "peak_anon_bytes": peaks["anon"],
            "peak_file_bytes": peaks["file"],
            "read_bytes": None if read0 is None else read1 - read0,
            "rchar": None if rchar0 is None else rchar1 - rchar0,
        }
    )


def measured(target, *args):
    """Run ``target(*args)`` in a fresh process; its result with its wall time (the imports
    of :func:`_imports` excluded), the process's peak resident memory (and what it held after
    those imports) and its reads."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, target, args))
    proc.start()
    out = queue.get()
    proc.join()
    if out["error"]:
        raise RuntimeError(f"{target.__name__}: {out['error']}")
    return out


def evict(paths):
    """Drop ``paths``' pages from the page cache, so that the next read comes from the disk
    (and counts in ``read_bytes``)."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def fitted_exponent(xs, ys):
    """The slope of log(y) against log(x), least squares: y grows as x to this power."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def gib(n):
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def table(rows, columns):
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def gemm_gflops(threads=None, device="cpu"):
    """GFLOP/s of one trial-step's products (1024 x 2048 by 2048 x 1000, float32, no TF32)
    on ``device``."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(BATCH, FEATURES, device=device)
    w = torch.randn(FEATURES, CLASSES, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        a @ w
    sync()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 2.0:
        a @ w
        n += 1
        if n % 50 == 0:
            sync()
    sync()
    return 2 * BATCH * FEATURES * CLASSES * n / (time.perf_counter() - start) / 1e9


# ------------------------------------------------------------------------ copies
def _tiny_jpegs(n=64, side=16, seed=0):
    """A pool of small distinct JPEG payloads (a few hundred bytes each)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=75)
        out.append(buf.getvalue())
    return out


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def copy_per_concept(n_samples):
    """Samples per concept: all 5,000 official concepts share ``n_samples`` (274 each at
    1.37M), but never fewer than 60 (the 50 official test images and 10 more): a small copy
    holds fewer concepts instead."""
    return max(60, n_samples // 5000)


def write_copy(root, n_samples, per_shard=10_000, seed=0):
    """A webdataset copy in timm's layout, shuffled across shards; reused when complete.

    The official CoG concepts, the same number from each level, each with its official test
    images and more (:func:`copy_per_concept`).
    """
    from imagenet_cog.levels import load_levels

    root = Path(root)
    done = root / "complete.json"
    wanted = {"samples": n_samples, "per_shard": per_shard, "seed": seed, "version": 2}
    if done.is_file() and json.loads(done.read_text()) == wanted:
        print(f"copy: reusing {root} ({n_samples:,} samples)")
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    levels = load_levels("official")
    per_concept = copy_per_concept(n_samples)
    per_level = min(1000, max(1, n_samples // (5 * per_concept)))
    concepts = [w for level in levels.levels for w in level[:per_level]]
    tests = levels.test_images
    keys = []
    for c, wnid in enumerate(concepts):
        official = [i.rpartition("/")[2].rpartition(".")[0] for i in tests.get(wnid, [])]
        taken = set(official[:per_concept])
        extra, k = [], 0
        while len(taken) + len(extra) < per_concept:
            key = f"{wnid}_{900000 + k}"
            k += 1
            if key not in taken:
                extra.append(key)
        keys += [(key, c) for key in [*sorted(taken), *extra]]
    keys = keys[:n_samples]
    order = np.random.default_rng(seed).permutation(len(keys))
    payloads = _tiny_jpegs()
    n_shards = -(-len(keys) // per_shard)
    start = last = time.perf_counter()
    for s in range(n_shards):
        path = root / f"imagenet22k-train-{s:04d}.tar"
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in order[s * per_shard : (s + 1) * per_shard]:
                key, c = keys[i]
                jpeg = payloads[i % len(payloads)]
                _add(tar, f"{key}.jpg", jpeg)
                _add(tar, f"{key}.cls", str(c).encode())
                meta = {"label": int(c), "width": 16, "height": 16}
                _add(tar, f"{key}.json", json.dumps(meta).encode())
        tmp.rename(path)
        if time.perf_counter() - last > 10 or s == n_shards - 1:
            last = time.perf_counter()
            print(f"copy: {s + 1}/{n_shards} shards written ({last - start:.0f} s)")
    done.write_text(json.dumps(wanted))
    return root


def _data_command(roots, cache, missing):
    """``imagenet-cog data ROOT...`` in this process, with ``cache`` as the listing cache."""
    os.environ["IMAGENET_COG_CACHE"] = str(cache)
    from imagenet_cog import cli

    with open(os.devnull, "w") as devnull:
        stdout, sys.stdout = sys.stdout, devnull
        try:
            code = cli.main(["data", *map(str, roots), "--missing", str(missing)])
        finally:
            sys.stdout = stdout
    return code


def _one_pass(root, out, wnids, cache):
    """``extract_all``'s one pass over the copy with a tiny network: the stores of ``wnids``."""
    os.environ["IMAGENET_COG_CACHE"] = str(cache)
    import torch

    from imagenet_cog import extract_all, list_domains, load_domain

    torch.manual_seed(0)
    tiny = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten())
    extract_all(
        tiny,
        {"in21k": root},
        out,
        wnids=wnids,
        preprocessing={"size": 16, "crop": 16},
        batch_size=256,
        num_workers=1,
        progress=True,
    )
    images = 0
    for domain in list_domains(out):
        _, y_train, _, y_test = load_domain(out, domain, mmap=True)
        images += len(y_train) + len(y_test)
    return images


def run_copies(args, work):
    from imagenet_cog.levels import load_levels

    root = write_copy(work / "copy", args.samples, per_shard=args.per_shard)
    shards = sorted(root.glob("imagenet22k-train-*.tar"))
    tenth = work / "copy-tenth"
    shutil.rmtree(tenth, ignore_errors=True)
    tenth.mkdir()
    for path in shards[: max(1, len(shards) // 10)]:
        (tenth / path.name).symlink_to(path)
    rows = []
    for name, data_root in (("a tenth", tenth), ("all", root)):
        n_shards = len(list(data_root.glob("*.tar")))
        samples = min(args.samples, n_shards * args.per_shard)
        cache = work / f"listing-cache-{name.replace(' ', '-')}"
        shutil.rmtree(cache, ignore_errors=True)
        evict([p.resolve() for p in data_root.glob("*.tar")])
        for state in ("cold", "cached"):
            print(f"copies: imagenet-cog data on {name} of the copy ({samples:,} samples), {state}")
            m = measured(_data_command, [data_root], cache, work / "missing.tsv")
            rows.append(
                {
                    "copy": name,
                    "samples": samples,
                    "listing": state,
                    "seconds": round(m["seconds"], 2),
                    "peak_rss": gib(m["peak_rss_bytes"]),
                    "after_imports": gib(m["base_rss_bytes"]),
                    "read": gib(m["read_bytes"]),
                    "_rss": m["peak_rss_bytes"] - (m["base_rss_bytes"] or 0),
                    "_rss_base": m["base_rss_bytes"] or 0,
                    "_exit": m["result"],
                }
            )
    cold = [r for r in rows if r["listing"] == "cold"]
    t_exp = fitted_exponent([r["samples"] for r in cold], [r["seconds"] for r in cold])
    m_exp = fitted_exponent([r["samples"] for r in cold], [r["_rss"] for r in cold])
    big = cold[-1]
    scale = FALL2011_SAMPLES / big["samples"]
    extrapolated = {
        "seconds": big["seconds"] * scale**t_exp,
        "peak_rss_bytes": big["_rss"] * scale**m_exp,
    }
    base = max(r["_rss_base"] for r in cold)
    print(
        table(rows, ["copy", "samples", "listing", "seconds", "peak_rss", "after_imports", "read"])
    )
    print(
        f"fitted exponents, cold listing against samples: time {t_exp:.2f}, peak memory above "
        f"the imports' {m_exp:.2f}"
    )
    print(
        f"EXTRAPOLATED to Fall 2011's {FALL2011_SAMPLES:,} samples (x{scale:.1f} by those "
        f"exponents): cold listing {extrapolated['seconds']:.0f} s, peak memory "
        f"{gib(base + extrapolated['peak_rss_bytes'])} ({gib(base)} of it the imports)"
    )
    # The one pass: about --pass-images images of the official concepts, shared out among the
    # five levels, read with a tiny network.
    levels = load_levels("official")
    per_concept = copy_per_concept(args.samples)
    per_level = min(1000, max(1, args.samples // (5 * per_concept)))
    n_concepts = max(5, args.pass_images // per_concept)
    wnids = [w for level in levels.levels for w in level[: min(per_level, -(-n_concepts // 5))]]
    out = work / "one-pass-stores"
    shutil.rmtree(out, ignore_errors=True)
    evict(list(shards))
    print(f"copies: extract_all's one pass, {len(wnids)} concepts of the five levels")
    m = measured(_one_pass, root, out, wnids, work / "listing-cache-all")
    images = m["result"]
    one_pass = {
        "images": images,
        "seconds": round(m["seconds"], 2),
        "images_per_s": round(images / m["seconds"], 1),
        "peak_rss": gib(m["peak_rss_bytes"]),
        "read": gib(m["read_bytes"]),
    }
    print(
        f"one pass: {images:,} images into {len(list(out.glob('*/*/manifest.json')))} stores in "
        f"{m['seconds']:.1f} s ({one_pass['images_per_s']:,} images/s, listing from the cache, "
        f"tiny network at 16 px, 1 worker), peak memory {one_pass['peak_rss']}, read "
        f"{one_pass['read']}"
    )
    return {
        "listing": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
        "exponents": {"time": t_exp, "memory": m_exp},
        "extrapolated_13_7M": extrapolated,
        "one_pass": one_pass,
    }


# ---------------------------------------------------------------------- protocol
#: The synthetic classes: a centre per class (norm about ``SEPARATION``) plus Gaussian noise of
#: norm about 1, then l2-normalised: separable in principle, yet one epoch of SGD on a tenth of
#: IN-1K's rows reaches a top-1 of about 26%, so the ladder's accuracies are neither chance nor
#: trivially 100%.
SEPARATION = 0.3


def _rung_rows(percent):
    return max(CLASSES, round(IN1K_TRAIN * percent / 100))


def _synthetic_labels(n):
    """Class indices of ``n`` rows, as even as can be, sorted (a split's order)."""
    return np.sort(np.arange(n) % CLASSES)


def _synthetic_chunks(n, seed, chunk=65_536, separation=None):
    """``(labels, features)`` chunks of ``n`` rows, ordered by class as a split is, drawn
    chunk by chunk (memory bounded by the chunk, whatever ``n``)."""
    centres = np.random.default_rng(12345).standard_normal((CLASSES, FEATURES), dtype=np.float32)
    centres *= (separation or SEPARATION) / np.sqrt(FEATURES)
    labels = _synthetic_labels(n)
    rng = np.random.default_rng(seed)
    for start in range(0, n, chunk):
        y = labels[start : start + chunk]
        X = rng.standard_normal((len(y), FEATURES), dtype=np.float32)
        X *= 1 / np.sqrt(FEATURES)
        X += centres[y]
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        yield y, X


def write_synthetic_store(root, split_name, n, seed, separation=None):
    """A feature store of ``n`` synthetic rows of IN-1K's 1,000 classes, written with the
    library's store writer (its shards, checksums and manifest)."""
    from _array_store import write_array_store

    from imagenet_cog.taxonomy import imagenet1k_wnids

    wnids = np.asarray(sorted(imagenet1k_wnids()))
    labels = wnids[_synthetic_labels(n)]
    return write_array_store(
        root,
        "in1k",
        split_name,
        labels,
        (X for _, X in _synthetic_chunks(n, seed, separation=separation)),
        model="synthetic:gaussian-classes",
    )


def _rung_run(epochs, trials, device):
    """The run of a rung, as ``evaluate`` and ``plan_evaluate`` both take it: IN-1K, the
    all-data cell, one seed, ``trials`` trials of ``epochs`` epochs."""
    return {
        "domains": ["in1k"],
        "shots": ["all"],
        "seeds": [22],
        "n_trials": trials,
        "n_startup_trials": 1,
        "epochs": epochs,
        "device": device,
    }


def _evaluate_rung(root, out, epochs, trials, threads, device="cpu"):
    import torch

    from imagenet_cog import evaluate

    torch.set_num_threads(threads)
    run = _rung_run(epochs, trials, device)
    results = evaluate(root, **run, out=out, save_predictions=True, progress=True)
    record = results.records[0]
    return {
        "top1": record["top1"],
        "n_train": record["n_train"],
        "n_search_train": record["n_search_train"],
        "n_val": record["n_val"],
        "n_test": record["n_test"],
        "features_resident": record["features_resident"],
    }


def _evaluate_plan(root, epochs, trials, threads, device="cpu"):
    """``plan_evaluate``'s prediction of the rung's run (its memory, work and time)."""
    import torch

    from imagenet_cog import plan_evaluate

    torch.set_num_threads(threads)
    plan = plan_evaluate(root, **_rung_run(epochs, trials, device))
    return {"seconds": plan.seconds, "table": plan.table()}


def run_protocol(args, work):
    threads = args.threads or len(os.sched_getaffinity(0))
    print(f"protocol: GEMM reference, {threads} thread(s), {args.device}")
    gflops = measured(gemm_gflops, threads, args.device)["result"]
    print(f"one trial-step's product (1024 x 2048 by 2048 x 1000, float32): {gflops:.1f} GFLOP/s")
    rows = []
    for percent in args.rungs:
        n = _rung_rows(percent)
        root = work / f"stores-{percent:g}pct"
        if not (root / "in1k" / "train" / "manifest.json").is_file():
            shutil.rmtree(root, ignore_errors=True)
            print(f"protocol: writing the {percent:g}% rung's stores ({n:,} + {TEST_ROWS:,} rows)")
            t = time.perf_counter()
            write_synthetic_store(root, "train", n, seed=1, separation=args.separation)
            write_synthetic_store(root, "test", TEST_ROWS, seed=2, separation=args.separation)
            print(f"  written in {time.perf_counter() - t:.0f} s")
        store_bytes = sum(p.stat().st_size for p in root.rglob("*.npy"))
        print(f"protocol: evaluate --plan on the {percent:g}% rung")
        plan = measured(_evaluate_plan, root, args.epochs, args.trials, threads, args.device)
        print(plan["result"]["table"])
        evict(list(root.rglob("*.npy")))
        out = work / f"results-{percent:g}pct"
        shutil.rmtree(out, ignore_errors=True)
        print(f"protocol: evaluate on the {percent:g}% rung ({n:,} training rows)")
        m = measured(_evaluate_rung, root, out, args.epochs, args.trials, threads, args.device)
        r = m["result"]
        # The SGD rows: each trial trains on the search split, the retrain on all of it.
        trained = args.epochs * (args.trials * r["n_search_train"] + r["n_train"])
        trial_steps = trained / BATCH
        flop = 4 * FEATURES * CLASSES * trained
        rows.append(
            {
                "percent": f"{percent:g}%",
                "rows": n,
                "store": gib(store_bytes),
                "seconds": round(m["seconds"], 1),
                "peak_rss": gib(m["peak_rss_bytes"]),
                "anon": gib(m["peak_anon_bytes"]),
                "mapped": gib(m["peak_file_bytes"]),
                "read": gib(m["read_bytes"]),
                "trial_steps_s": round(trial_steps / m["seconds"], 2),
                "gflops": round(flop / m["seconds"] / 1e9, 1),
                "of_gemm": round(flop / m["seconds"] / 1e9 / gflops, 2),
                "top1": round(r["top1"], 2),
                "resident": r["features_resident"],
                "load": "-".join(map(str, m["load"])),
                "predicted_s": round(plan["result"]["seconds"]["total"], 1),
                "predicted_vs_measured": round(
                    plan["result"]["seconds"]["total"] / m["seconds"], 2
                ),
                "_rss": m["peak_rss_bytes"],
                "_store": store_bytes,
            }
        )
        print(table(rows[-1:], [k for k in rows[-1] if not k.startswith("_")]))
        if not args.keep and percent != max(args.rungs) and percent > 10:
            shutil.rmtree(root, ignore_errors=True)
    columns = [k for k in rows[0] if not k.startswith("_")]
    print(table(rows, columns))
    out = {
        "gemm_gflops": gflops,
        "rungs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
    }
    if len(rows) > 1:
        xs = [r["rows"] for r in rows]
        out["exponents"] = {
            "time": fitted_exponent(xs, [r["seconds"] for r in rows]),
            "memory": fitted_exponent(xs, [r["_rss"] for r in rows]),
        }
        print(
            f"fitted exponents against rows: time {out['exponents']['time']:.2f}, peak memory "
            f"{out['exponents']['memory']:.2f} (the largest store: {gib(rows[-1]['_store'])}, "
            f"peak memory {gib(rows[-1]['_rss'])})"
        )
    return out


# ---------------------------------------------------------------------- analyses
ANALYSES = ("clusters", "alignment", "semantic")
ANALYSIS_COLUMNS = ["analysis", "percent", "rows", "seconds", "peak_rss", "anon", "load"]


def _analyze(root, results, analysis, threads):
    import torch

    from imagenet_cog.analysis import analyze

    torch.set_num_threads(threads)
    report = analyze(
        root, domains=["in1k"], analyses=(analysis,), predictions=results, device="cpu"
    )
    found = report.domains.get("in1k", {})
    return {k: v for k, v in found.items() if isinstance(v, (int, float))}


def run_analyses(args, work):
    """``analyze`` on the protocol ladder's stores (and its saved predictions), one analysis
    at a time, on the rungs up to 10%; extrapolated to 100% by the measured exponent."""
    threads = args.threads or len(os.sched_getaffinity(0))
    rungs = [p for p in args.rungs if p <= 10]
    rows = []
    for percent in rungs:
        root, results = work / f"stores-{percent:g}pct", work / f"results-{percent:g}pct"
        if not (results / "predictions").is_dir():
            raise SystemExit(f"run the protocol part for the {percent:g}% rung first ({results})")
        n = _rung_rows(percent)
        for analysis in ANALYSES:
            print(f"analyses: {analysis} on the {percent:g}% rung ({n:,} training rows)")
            m = measured(_analyze, root, results, analysis, threads)
            rows.append(
                {
                    "analysis": analysis,
                    "percent": f"{percent:g}%",
                    "rows": n,
                    "seconds": round(m["seconds"], 1),
                    "peak_rss": gib(m["peak_rss_bytes"]),
                    "anon": gib(m["peak_anon_bytes"]),
                    "load": "-".join(map(str, m["load"])),
                    "_rss": m["peak_rss_bytes"],
                    "_result": m["result"],
                }
            )
            print(table(rows[-1:], ANALYSIS_COLUMNS))
    out = {"rungs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]}
    print(table(rows, ANALYSIS_COLUMNS))
    if len(rungs) > 1:
        out["extrapolated_100"] = {}
        for analysis in ANALYSES:
            mine = [r for r in rows if r["analysis"] == analysis]
            xs = [r["rows"] for r in mine]
            exp_t = fitted_exponent(xs, [r["seconds"] for r in mine])
            exp_m = fitted_exponent(xs, [r["_rss"] for r in mine])
            scale = IN1K_TRAIN / xs[-1]
            seconds = mine[-1]["seconds"] * scale**exp_t
            rss = mine[-1]["_rss"] * scale**exp_m
            out["extrapolated_100"][analysis] = {
                "time_exponent": exp_t,
                "memory_exponent": exp_m,
                "seconds": seconds,
                "peak_rss_bytes": rss,
            }
            print(
                f"{analysis}: exponents time {exp_t:.2f}, peak memory {exp_m:.2f}; EXTRAPOLATED to "
                f"100% ({IN1K_TRAIN:,} rows): {seconds:.0f} s, peak memory {gib(rss)}"
            )
    return out


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["protocol", "analyses", "copies", "all"])
    p.add_argument("--quick", action="store_true", help="every part at a size of seconds")
    p.add_argument("--work", default=None, help="folder for stores and copies (default: a temp)")
    p.add_argument("--rungs", default="1,10,100", help="percent of IN-1K's training rows")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--samples", type=int, default=1_370_000, help="samples of the copy")
    p.add_argument("--per-shard", type=int, default=10_000, help="samples per shard")
    p.add_argument("--pass-images", type=int, default=100_000, help="images of the one pass")
    p.add_argument("--keep", action="store_true", help="keep the stores (the copy is kept)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="where the protocol ladder trains (cpu, cuda)")
    p.add_argument(
        "--separation",
        type=float,
        default=SEPARATION,
        help=f"norm of the class centres against noise of norm 1 (default {SEPARATION})",
    )
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.per_shard, args.pass_images = 20_000, 1_000, 2_000
        args.rungs = "0.5,1"
    args.rungs = [float(x) for x in args.rungs.split(",") if x.strip()]
    return args


def main(argv=None):
    args = parse_args(argv)
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="imagenet_cog_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}")
    result = {"settings": {k: v for k, v in vars(args).items() if k != "json"}}
    if args.part in ("protocol", "all"):
        result["protocol"] = run_protocol(args, work)
    if args.part in ("analyses", "all"):
        result["analyses"] = run_analyses(args, work)
    if args.part in ("copies", "all"):
        result["copies"] = run_copies(args, work)
    print(json.dumps(result, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
