"""Copy the ImageNet wnid lists out of timm's wheel into the package data.

Run once, by a maintainer, on a machine that reaches PyPI::

    pip download timm --no-deps -d /tmp/timm
    python tools/import_imagenet_wnids.py /tmp/timm/timm-*.whl

The lists are facts about ImageNet (the class folders of the ILSVRC-2012 and
the Fall 2011 ImageNet-21K releases). timm ships them under the Apache-2.0
licence in ``timm/data/_info/``; each file we write names its source.
"""

import argparse
import zipfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "src" / "imagenet_cog" / "data"
FILES = {
    "imagenet_synsets.txt": ("imagenet1k_wnids.txt", 1000, "ImageNet-1K (ILSVRC-2012) classes"),
    "imagenet22k_synsets.txt": (
        "imagenet21k_fall2011_wnids.txt",
        21841,
        "ImageNet-21K Fall 2011 synsets",
    ),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    args = parser.parse_args()
    version = args.wheel.name.split("-")[1]
    with zipfile.ZipFile(args.wheel) as wheel:
        for src, (dst, expected, what) in FILES.items():
            wnids = wheel.read(f"timm/data/_info/{src}").decode().split()
            if len(wnids) != expected or len(set(wnids)) != expected or wnids != sorted(wnids):
                raise SystemExit(f"{src}: expected {expected} distinct sorted wnids")
            header = (
                f"# {what}: {expected} wnids, sorted.\n"
                f"# Source: timm {version} wheel (PyPI), timm/data/_info/{src}, Apache-2.0.\n"
            )
            (DATA / dst).write_text(header + "\n".join(wnids) + "\n")
            print(f"{dst}: {len(wnids)} wnids")


if __name__ == "__main__":
    main()
