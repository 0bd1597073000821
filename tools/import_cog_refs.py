"""Copy the ImageNet-CoG reference lists into the package data.

Run once, by a maintainer, with the project's reference folder at hand::

    python tools/import_cog_refs.py ../shared/refs/cog

It checks every file against ``SHA256SUMS.txt`` and the facts the lists must
satisfy (5 disjoint levels of 1000 wnids, 50 test images each, labels equal to
the index of the wnid among the level's sorted wnids, no ImageNet-1K class),
then writes:

- ``cog_levels.tsv``: ``level``, ``label``, ``wnid``, one row per concept;
- ``cog_test_images.tsv.gz``: ``level``, ``wnid``, ``path``, one row per test image,
  in the order of the source files;
- ``imagenet1k_val_labels.tsv.gz``: ``file``, ``wnid`` for the 50,000 ILSVRC-2012
  validation images;
- ``cog_blocklist_70.txt``: the 70 wnids of the paper's Table 2.
"""

import argparse
import gzip
import hashlib
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "src" / "imagenet_cog" / "data"


def _write_gz(path, text):
    path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("refs", type=Path, help="the refs/cog folder")
    args = parser.parse_args()
    refs = args.refs
    for line in (refs / "SHA256SUMS.txt").read_text().splitlines():
        digest, name = line.split()
        if hashlib.sha256((refs / name).read_bytes()).hexdigest() != digest:
            raise SystemExit(f"checksum mismatch: {name}")

    in1k = {
        line.strip()
        for line in (DATA / "imagenet1k_wnids.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert len(in1k) == 1000
    level_rows, image_rows, seen = [], [], set()
    for level in range(1, 6):
        lines = (refs / "hth_syuan8889" / f"cog_val_level{level}.txt").read_text().splitlines()
        pairs = [line.split() for line in lines if line.strip()]
        wnids = sorted({p.split("/")[0] for p, _ in pairs})
        assert len(wnids) == 1000, level
        label_of = {w: i for i, w in enumerate(wnids)}
        counts = dict.fromkeys(wnids, 0)
        for path, label in pairs:
            wnid = path.split("/")[0]
            assert int(label) == label_of[wnid], (level, path)
            counts[wnid] += 1
            image_rows.append(f"{level}\t{wnid}\t{path}")
        assert set(counts.values()) == {50}, level
        assert not (set(wnids) & seen) and not (set(wnids) & in1k), level
        seen |= set(wnids)
        level_rows += [f"{level}\t{i}\t{w}" for i, w in enumerate(wnids)]

    source = "github.com/syuan8889/HTH@15d0fc5a (MIT), imagenet_cog/cog_val_level{1..5}.txt"
    (DATA / "cog_levels.tsv").write_text(
        f"# ImageNet-CoG levels L1..L5 (1000 wnids each). Source: {source}\n"
        "level\tlabel\twnid\n" + "\n".join(level_rows) + "\n"
    )
    _write_gz(
        DATA / "cog_test_images.tsv.gz",
        f"# ImageNet-CoG test images (50 per concept). Source: {source}\n"
        "level\twnid\tpath\n" + "\n".join(image_rows) + "\n",
    )

    wnids_1k = sorted(in1k)
    val_rows = []
    for line in (refs / "hth_syuan8889" / "cog_val_level0.txt").read_text().splitlines():
        if line.strip():
            path, label = line.split()
            val_rows.append(f"{path.rsplit('/', 1)[-1]}\t{wnids_1k[int(label)]}")
    assert len(val_rows) == 50000
    _write_gz(
        DATA / "imagenet1k_val_labels.tsv.gz",
        "# ILSVRC-2012 validation labels. Source: github.com/syuan8889/HTH@15d0fc5a (MIT), "
        "imagenet_cog/cog_val_level0.txt (label = index among the sorted IN-1K wnids)\n"
        "file\twnid\n" + "\n".join(val_rows) + "\n",
    )

    block = (refs / "blocklist_70.txt").read_text().split()
    assert len(block) == 70 == len(set(block))
    (DATA / "cog_blocklist_70.txt").write_text(
        "# The 70 concepts manually discarded by ImageNet-CoG (paper supplement, Table 2).\n"
        + "\n".join(block)
        + "\n"
    )
    (DATA / "LICENSE.HTH-MIT.txt").write_bytes(
        (refs / "hth_syuan8889" / "LICENSE.HTH-MIT.txt").read_bytes()
    )
    print(f"{len(level_rows)} concepts, {len(image_rows)} test images, {len(val_rows)} val labels")


if __name__ == "__main__":
    main()
