"""k-NN on the levels: DINO's weighted k-NN over the linear protocol's grid of shots and seeds.

For each domain and each cell of the grid (N = 1 ... 128 images per concept and each seed, and
all the training images), the test images' nearest training rows are searched once, at the
largest k, on the cell's training rows, and the classes ranked at every k
(:func:`~imagenet_cog._neighbors.votes.ranked_classes`). The few-shot cells train on the very
rows the linear protocol's final model trains on: ``make_search_spec(y_train, seed,
n_shots=N, val_fraction=0.2).final_idx``, searched in place (``cosine_topk(...,
key_rows=idx)``: no copy of the draw). The all-data cell does not depend on the seed: it is
computed once and recorded with ``"seed": null``.

Each cell is a record of ``knn.jsonl`` in the analysis folder (:mod:`.records`): k, T, the
draw's sha256, top-1 and top-5 at every k, per concept too; a resumed run reads back the cells
already there.

This is another evaluation than the paper's linear probe: its numbers are labelled k-NN
everywhere and never ranked with linear-probe numbers.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

import numpy as np

from .._grid import SHOTS, VAL_FRACTION, display_shots, shot_key
from .._neighbors.search import plan_neighbors
from .._version import __version__

__all__ = [
    "DRAW_RULE",
    "KNNPlan",
    "grid_cells",
    "knn_cell",
    "knn_settings",
    "plan_knn",
    "run_knn_domain",
]

#: How a few-shot cell's training rows are drawn: the linear protocol's own final draw.
DRAW_RULE = "make_search_spec(y_train, seed, n_shots=N, val_fraction=0.2).final_idx"
#: The version of how the cells are computed and recorded.
KNN_FORMAT = 1
#: Classes ranked per test row: top-1 and top-5.
_TOP = 5


def knn_settings(ks, temperature):
    """What shapes every k-NN cell, as ``knn.jsonl`` records it."""
    return {
        "format": KNN_FORMAT,
        "ks": sorted(int(k) for k in ks),
        "temperature": float(temperature),
        "similarity": "cosine of l2-normalised features",
        "votes": "exp(similarity / temperature), summed per class",
        "draws": DRAW_RULE,
        "val_fraction": VAL_FRACTION,
        "dtype": "float32",
    }


def _draw_sha256(idx):
    return hashlib.sha256(np.ascontiguousarray(idx, dtype=np.int64).tobytes()).hexdigest()


def grid_cells(y_train, shots, seeds):
    """``(cells, skipped)``: the grid's cells of a domain, in the grid's order, and the
    shots values it cannot draw.

    Each cell is ``(shots, seed, idx)``: ``idx`` the training rows of a few-shot cell (the
    linear protocol's final draw), None for the all-data cell (one cell, ``seed`` None).
    ``skipped`` is ``{shots: why}`` for a shots value larger than a class holds.
    """
    from .._train.search import make_search_spec

    cells, skipped = [], {}
    for n in sorted(shots, key=shot_key):
        if n == "all":
            cells.append(("all", None, None))
            continue
        drawn = []
        try:
            for seed in seeds:
                spec = make_search_spec(
                    y_train, int(seed), n_shots=int(n), val_fraction=VAL_FRACTION
                )
                drawn.append((int(n), int(seed), spec.final_idx))
        except ValueError as exc:  # a class holds fewer than N images
            skipped[n] = str(exc)
            continue
        cells += drawn
    return cells, skipped


def knn_cell(X_train, codes, n_classes, X_test, y_codes, idx, ks, temperature, place, progress):
    """Top-1 and top-5 at every k of one cell, and each test concept's hits.

    Parameters
    ----------
    X_train, X_test : array-like
        Memory maps are read a block at a time.
    codes : ndarray of int
        Class index of each training row.
    n_classes : int
    y_codes : ndarray of int
        Class index of each test row.
    idx : ndarray of int or None
        The cell's training rows (None: all).
    ks : sequence of int
    temperature : float
    place : Placement
    progress : bool or str

    Returns
    -------
    dict
        ``k_searched`` (the largest k, at most the cell's training rows), and per k (as a
        str): ``top1`` and ``top5`` (%), ``hits`` (right top-1 per test row, bool).
    """
    import torch

    from .._neighbors.search import cosine_topk
    from .._neighbors.votes import ranked_classes

    n_keys = len(idx) if idx is not None else len(X_train)
    searched = min(max(ks), n_keys)
    values, rows = cosine_topk(
        X_test,
        X_train,
        searched,
        device=place.device,
        dtype=torch.float32,
        key_rows=idx,
        progress=progress,
    )
    labels = codes if idx is None else codes[idx]
    used = {int(k): min(int(k), searched) for k in ks}
    ranked = ranked_classes(
        values, rows, labels, n_classes, sorted(set(used.values())), temperature, top=_TOP
    )
    out = {"k_searched": int(searched), "top1": {}, "top5": {}, "hits": {}}
    for k, k_used in used.items():
        top = ranked[k_used]
        right = top == y_codes[:, None]
        out["hits"][str(k)] = right[:, 0]
        out["top1"][str(k)] = 100.0 * float(right[:, 0].mean())
        out["top5"][str(k)] = 100.0 * float(right.any(axis=1).mean())
    return out


def _concept_hits(hits, concept_index, n_concepts):
    return np.bincount(concept_index, weights=hits, minlength=n_concepts).astype(int).tolist()


def run_knn_domain(
    domain,
    arrays,
    *,
    ks,
    temperature,
    shots,
    seeds,
    place,
    records,
    inputs,
    model,
    say=print,
    progress=False,
):
    """Every cell of one domain: read back from ``records`` where there, else computed and
    appended.

    Returns
    -------
    cells : list of dict
        The records of the domain's cells, in the grid's order.
    skipped : dict
        ``{shots: why}`` of the shots values the domain's classes cannot draw.
    concepts : list of str
        The test concepts, in the order of each record's ``concept_hits``.
    """
    X_train, y_train, X_test, y_test = arrays
    classes, codes = np.unique(np.asarray(y_train), return_inverse=True)
    codes = codes.astype(np.int64).ravel()
    y_test = np.asarray(y_test)
    y_codes = np.searchsorted(classes, y_test)
    unknown = (y_codes >= len(classes)) | (classes[np.minimum(y_codes, len(classes) - 1)] != y_test)
    if unknown.any():
        missing = sorted(set(y_test[unknown].tolist()))
        raise ValueError(
            f"{domain}: test labels {missing[:3]} are not in the training set: the k-NN "
            "cannot predict them"
        )
    concepts, concept_index, images = np.unique(y_test, return_inverse=True, return_counts=True)
    cells, skipped = grid_cells(y_train, shots, seeds)
    out = []
    for n, seed, idx in cells:
        key = (domain, n, seed)
        record = records.find(key, inputs) if records is not None else None
        if record is not None:
            out.append(record)
            continue
        which = f"{domain} N={display_shots(n)}" + (f" seed {seed}" if seed is not None else "")
        say(f"{which}: k-NN over {len(idx) if idx is not None else len(X_train)} training rows")
        start = time.perf_counter()
        found = knn_cell(
            X_train,
            codes,
            len(classes),
            X_test,
            y_codes,
            idx,
            ks,
            temperature,
            place,
            f"k-NN {which}" if progress else False,
        )
        record = {
            "model": model,
            "domain": domain,
            "shots": n,
            "seed": seed,
            "inputs": inputs,
            "k_searched": found["k_searched"],
            "top1": found["top1"],
            "top5": found["top5"],
            "n_train": int(len(idx) if idx is not None else len(X_train)),
            "n_test": len(y_test),
            "n_classes": len(classes),
            "n_features": int(X_test.shape[1]),
            "draw": "all training images" if idx is None else DRAW_RULE,
            "draw_sha256": None if idx is None else _draw_sha256(idx),
            "concepts_sha256": hashlib.sha256("\n".join(concepts.tolist()).encode()).hexdigest(),
            "concept_images": images.astype(int).tolist(),
            "concept_hits": {
                k: _concept_hits(h, concept_index, len(concepts)) for k, h in found["hits"].items()
            },
            "device": str(place.device),
            "time_s": round(time.perf_counter() - start, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "library_version": __version__,
        }
        out.append(records.append(record) if records is not None else record)
    return out, skipped, concepts.tolist()


# ------------------------------------------------------------------ what analysis.json holds
def _stats(values):
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std()), "n": int(arr.size)}


def summarize(cells, concepts, ks, temperature):
    """A domain's k-NN details for ``analysis.json``: the grid (per shots value, each k's
    top-1 and top-5 mean and std over the seeds, the seeds and the records' checksums) and
    the all-data cell's accuracy per concept."""
    grid = []
    for n in sorted({c["shots"] for c in cells}, key=shot_key):
        mine = [c for c in cells if c["shots"] == n]
        grid.append(
            {
                "shots": n,
                "seeds": None if n == "all" else [int(c["seed"]) for c in mine],
                "n_train": mine[0]["n_train"],
                "k_searched": mine[0]["k_searched"],
                "top1": {str(k): _stats([c["top1"][str(k)] for c in mine]) for k in ks},
                "top5": {str(k): _stats([c["top5"][str(k)] for c in mine]) for k in ks},
                "records": [c.get("record_sha256") for c in mine],
            }
        )
    details = {"ks": [int(k) for k in ks], "temperature": float(temperature), "grid": grid}
    whole = next((c for c in cells if c["shots"] == "all"), None)
    if whole is not None:
        images = np.asarray(whole["concept_images"], dtype=float)
        details["concepts"] = {
            "wnids": list(concepts),
            "images": whole["concept_images"],
            "top1": {
                k: [round(float(x), 4) for x in 100.0 * np.asarray(h) / np.maximum(images, 1)]
                for k, h in whole["concept_hits"].items()
            },
        }
    return details


def domain_measures(cells, ks):
    """The domain's row of ``analysis.json``: top-1 and top-5 of the all-data cell at each k
    (``knn<k>_top1``, ``knn<k>_top5``, in %)."""
    whole = next((c for c in cells if c["shots"] == "all"), None)
    if whole is None:
        return {}
    out = {f"knn{k}_top1": whole["top1"][str(k)] for k in ks}
    out |= {f"knn{k}_top5": whole["top5"][str(k)] for k in ks}
    return out


# ------------------------------------------------------------------ the plan
@dataclass
class KNNPlan:
    """What the k-NN grid costs: per domain, its cells' searches, FLOP and memory, and the
    time predicted from a search timed on the device.

    Attributes
    ----------
    rows : list of dict
        One per domain: ``cells``, ``n_test``, ``n_features``, ``flop``, ``peak_bytes``,
        ``seconds``, ``skipped``.
    flop : int
    peak_bytes : int
    seconds : float
    flop_per_s : float
        Measured here, on a search of the run's width.
    device : str
    ks, shots, seeds : tuple
    """

    rows: list
    flop: int
    peak_bytes: int
    seconds: float
    flop_per_s: float
    device: str
    ks: tuple
    shots: tuple
    seeds: tuple

    def to_dict(self):
        """Everything, JSON-safe."""
        return {
            "rows": self.rows,
            "flop": self.flop,
            "peak_bytes": self.peak_bytes,
            "seconds": self.seconds,
            "flop_per_s": self.flop_per_s,
            "device": self.device,
            "ks": list(self.ks),
            "shots": list(self.shots),
            "seeds": list(self.seeds),
        }

    def table(self):
        """The plan for a person: a row per domain, then the total."""
        from .._grid import display_domain

        flop_unit, flop_scale = _unit(self.flop, "FLOP")
        byte_unit, byte_scale = _unit(self.peak_bytes, "B")
        head = ["domain", "cells", "test rows", "features", flop_unit, f"peak {byte_unit}", "time"]
        rows = [head]
        for r in self.rows:
            rows.append(
                [
                    display_domain(r["domain"]),
                    str(r["cells"]),
                    str(r["n_test"]),
                    str(r["n_features"]),
                    f"{r['flop'] / flop_scale:.3g}",
                    f"{r['peak_bytes'] / byte_scale:.3g}",
                    _duration(r["seconds"]),
                ]
            )
        rows.append(
            [
                "total",
                str(sum(r["cells"] for r in self.rows)),
                "",
                "",
                f"{self.flop / flop_scale:.3g}",
                f"{self.peak_bytes / byte_scale:.3g}",
                _duration(self.seconds),
            ]
        )
        lines = [
            (
                f"k-NN plan on {self.device}: k = {', '.join(map(str, self.ks))}, N = "
                f"{', '.join(display_shots(s) for s in self.shots)}, seeds "
                f"{', '.join(map(str, self.seeds))} (the all-data cell once)"
            ),
            *_columns(rows),
            (
                f"time predicted from a search timed here ({self.flop_per_s / 1e9:.1f} GFLOP/s of "
                "products); peak: the most bytes one search holds on the device"
            ),
        ]
        for r in self.rows:
            for n, why in r["skipped"].items():
                lines.append(f"{display_domain(r['domain'])} N={n} skipped: {why}")
        return "\n".join(lines)


def _columns(rows):
    """Lines of ``rows``, each column as wide as its widest cell (the first to the left)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join([r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:]))])
        for r in rows
    ]


def _unit(total, name):
    """``(unit, scale)`` for numbers up to ``total``: the largest of T, G, M and k of ``name``
    that ``total`` reaches, so a small grid reads 5.6 GFLOP, not 0.00056 TFLOP."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if total >= scale:
            return prefix + name, scale
    return name, 1.0


def _duration(seconds):
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _measure_rate(n_features, device):
    """FLOP per second of a neighbour search of ``n_features`` on ``device``, timed here on
    random rows (a second run, after a warm-up)."""
    import torch

    from .._neighbors.search import cosine_topk

    n_q, n_k = (8192, 65536) if device.type == "cuda" else (1024, 16384)
    gen = np.random.default_rng(0)
    queries = gen.standard_normal((n_q, n_features), dtype=np.float32)
    keys = gen.standard_normal((n_k, n_features), dtype=np.float32)
    seconds = math.inf
    for _ in range(2):
        start = time.perf_counter()
        cosine_topk(queries, keys, 200, device=device, dtype=torch.float32)
        seconds = time.perf_counter() - start
    return 2.0 * n_q * n_k * n_features / seconds


def plan_knn(source, domains, *, ks, shots, seeds, device):
    """The :class:`KNNPlan` of the k-NN grid of ``domains`` (a feature source) on ``device``
    (a resolved ``torch.device``): reads labels, not features."""
    import torch

    rows, widths = [], set()
    shots = tuple(shots) or SHOTS
    for domain in domains:
        X_train, y_train, X_test, _ = source.load(domain, mmap=True)
        cells, skipped = grid_cells(np.asarray(y_train), shots, seeds)
        n_test, d = int(X_test.shape[0]), int(X_test.shape[1])
        widths.add(d)
        flop, peak = 0, 0
        for _, _, idx in cells:
            n_keys = len(idx) if idx is not None else int(X_train.shape[0])
            plan = plan_neighbors(
                n_test, n_keys, d, min(max(ks), n_keys), device=device, dtype=torch.float32
            )
            flop += plan.flop
            peak = max(peak, plan.peak_bytes)
        rows.append(
            {
                "domain": domain,
                "cells": len(cells),
                "n_test": n_test,
                "n_features": d,
                "flop": int(flop),
                "peak_bytes": int(peak),
                "skipped": {str(n): why for n, why in skipped.items()},
            }
        )
    rate = _measure_rate(max(widths), device) if widths else math.inf
    for r in rows:
        r["seconds"] = r["flop"] / rate
    return KNNPlan(
        rows=rows,
        flop=sum(r["flop"] for r in rows),
        peak_bytes=max((r["peak_bytes"] for r in rows), default=0),
        seconds=sum(r["seconds"] for r in rows),
        flop_per_s=rate,
        device=str(device),
        ks=tuple(sorted(int(k) for k in ks)),
        shots=shots,
        seeds=tuple(int(s) for s in seeds),
    )
