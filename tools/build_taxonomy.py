"""Build the bundled WordNet 3.0 noun taxonomy from NLTK's WordNet reader.

Run once, by a maintainer, with WordNet 3.0 available to NLTK (Debian's
``wordnet-base`` is enough; see ``imagenet_cog.taxonomy.nltk_wordnet``)::

    python tools/build_taxonomy.py [--dict-dir /usr/share/wordnet]

It writes ``src/imagenet_cog/data/wordnet30_nouns.tsv.gz``, whose format is
documented in :meth:`imagenet_cog.Taxonomy.save`. The output is deterministic
(gzip mtime 0, rows sorted by offset), so a rebuild from the same WordNet gives
the same bytes.
"""

import argparse
import hashlib
import warnings
from pathlib import Path

from imagenet_cog.taxonomy import Taxonomy, nltk_wordnet

OUT = (
    Path(__file__).resolve().parents[1] / "src" / "imagenet_cog" / "data" / "wordnet30_nouns.tsv.gz"
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dict-dir",
        default=None,
        help="WordNet dict folder (default: NLTK's corpus or /usr/share/wordnet)",
    )
    parser.add_argument("--out", default=OUT, type=Path)
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = nltk_wordnet(args.dict_dir)
    if reader.get_version() != "3.0":
        raise SystemExit(f"need WordNet 3.0, got {reader.get_version()}")
    tax = Taxonomy.from_nltk(reader)
    tax.save(args.out)
    digest = hashlib.sha256(args.out.read_bytes()).hexdigest()
    print(f"{len(tax)} noun synsets, lch_depth {tax.lch_depth} -> {args.out} (sha256 {digest})")


if __name__ == "__main__":
    main()
