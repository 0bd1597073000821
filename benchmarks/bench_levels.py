"""Time every similarity measure over IN-21K x IN-1K against NLTK's per-pair loop.

    python benchmarks/bench_levels.py [--sample 1000] [--json out.json]

For each measure it times our full matrix over the whole candidate pool (the
20,842 IN-21K concepts that are not IN-1K classes) against the 1000 IN-1K
classes, about 20.8M pairs, and NLTK's per-pair function on a random sample of
pairs, extrapolated to all pairs. It prints the ratio. word2vec has no NLTK
counterpart: its baseline is a per-pair cosine loop over the same embeddings,
with a synthetic 300-d vector table. Finally it times ``build_levels()`` end
to end in a fresh process (taxonomy loading included).

Targets on a 2-core machine: Lin under 5 s and at least 50x NLTK;
Wu-Palmer at least 1000x NLTK; build_levels() under 10 s.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from imagenet_cog import imagenet1k_wnids, imagenet21k_wnids, load_taxonomy
from imagenet_cog.measures import max_similarity, similarity


def _nltk_functions(tax):
    from imagenet_cog.taxonomy import nltk_wordnet

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wn = nltk_wordnet()
    ic = tax.information_content()
    g = np.flatnonzero(~np.isnan(ic))
    counts = np.rint(np.exp(-ic[g]) * len(g)).astype(int)
    icd = {"n": {int(tax.wnids[i][1:]): int(c) for i, c in zip(g, counts)} | {0: len(g)}}
    return wn, {
        "lin": lambda x, y: x.lin_similarity(y, icd),
        "jcn": lambda x, y: x.jcn_similarity(y, icd),
        "wup": lambda x, y: x.wup_similarity(y),
        "path": lambda x, y: x.path_similarity(y),
        "lch": lambda x, y: x.lch_similarity(y),
    }


def _vector_file(tax, pool, seen, dim=300):
    from imagenet_cog.measures import _tokens

    words = set()
    for w in pool + seen:
        words.update(_tokens(tax.gloss(w)))
        for lemma in tax.lemma_names(w):
            words.update(_tokens(lemma.replace("_", " ")))
    rng = np.random.default_rng(0)
    path = Path(tempfile.mkdtemp()) / "vectors.txt"
    with open(path, "w") as f:
        f.write(f"{len(words)} {dim}\n")
        f.writelines(
            word + " " + " ".join(f"{x:.4f}" for x in rng.normal(size=dim)) + "\n"
            for word in sorted(words)
        )
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sample", type=int, default=1000, help="pairs timed with NLTK per measure"
    )
    parser.add_argument("--measures", default="lin,wup,jcn,path,lch,w2v")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    tax = load_taxonomy()
    seen = list(imagenet1k_wnids())
    pool = sorted(set(imagenet21k_wnids()) - set(seen))
    n_pairs = len(pool) * len(seen)
    rng = np.random.default_rng(0)
    sample_a = [pool[i] for i in rng.integers(0, len(pool), args.sample)]
    sample_b = [seen[i] for i in rng.integers(0, len(seen), args.sample)]
    try:
        wn, nltk_fns = _nltk_functions(tax)
    except LookupError as exc:
        print(f"NLTK WordNet unavailable ({exc}); timing ours only", file=sys.stderr)
        wn, nltk_fns = None, {}

    rows = []
    for name in args.measures.split(","):
        kwargs = {}
        if name == "w2v":
            kwargs["vectors"] = _vector_file(tax, pool, seen)
            # Build the embeddings once, outside the timing, as NLTK's reader is.
            similarity("w2v", pool[:1], seen[:1], **kwargs)
        start = time.perf_counter()
        max_similarity(name, pool, seen, **kwargs)
        ours = time.perf_counter() - start
        base_name, base_per_pair = None, None
        if name in nltk_fns and wn is not None:
            fn = nltk_fns[name]
            syn = {
                w: wn.synset_from_pos_and_offset("n", int(w[1:])) for w in set(sample_a + sample_b)
            }
            # A warm-up pass fills NLTK's per-synset caches (hypernym sets, depths,
            # the lch depth constant): the timed pass is NLTK at its fastest.
            for x, y in zip(sample_a, sample_b):
                fn(syn[x], syn[y])
            start = time.perf_counter()
            for x, y in zip(sample_a, sample_b):
                fn(syn[x], syn[y])
            base_per_pair = (time.perf_counter() - start) / args.sample
            base_name = f"nltk {name}_similarity"
        elif name == "w2v":
            from imagenet_cog.measures import _EMBEDDINGS

            emb = next(iter(_EMBEDDINGS.values()))
            ea, eb = emb.embed(sample_a), emb.embed(sample_b)
            start = time.perf_counter()
            for x, y in zip(ea, eb):
                float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
            base_per_pair = (time.perf_counter() - start) / args.sample
            base_name = "per-pair cosine loop"
        row = {"measure": name, "pairs": n_pairs, "ours_s": round(ours, 3)}
        if base_per_pair is not None:
            row |= {
                "baseline": base_name,
                "baseline_us_per_pair": round(base_per_pair * 1e6, 2),
                "baseline_all_pairs_s": round(base_per_pair * n_pairs, 1),
                "speedup": round(base_per_pair * n_pairs / ours, 1),
            }
        rows.append(row)

    code = "import warnings, time; t=time.perf_counter(); import imagenet_cog as ic\n"
    code += "warnings.simplefilter('ignore'); ic.build_levels(); print(time.perf_counter()-t)"
    start = time.perf_counter()
    inner = float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    wall = time.perf_counter() - start

    print(
        f"{'measure':<8} {'pairs':>11} {'ours (s)':>9} {'baseline':<22} {'us/pair':>8} "
        f"{'all pairs (s)':>14} {'speedup':>9}"
    )
    for r in rows:
        print(
            f"{r['measure']:<8} {r['pairs']:>11,} {r['ours_s']:>9.2f} {r.get('baseline', '-'):<22} "
            f"{r.get('baseline_us_per_pair', float('nan')):>8.1f} "
            f"{r.get('baseline_all_pairs_s', float('nan')):>14.1f} {r.get('speedup', float('nan')):>8.0f}x"
        )
    print(
        f"\nbuild_levels() end to end: {inner:.2f} s in a fresh process ({wall:.2f} s with start-up)"
    )
    result = {
        "measures": rows,
        "build_levels_s": round(inner, 2),
        "build_levels_process_s": round(wall, 2),
    }
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
