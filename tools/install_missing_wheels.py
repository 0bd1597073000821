"""Install from a folder of wheels the distributions this Python lacks, without network.

Used by the GPU acceptance (``tools/gpu-acceptance.sh`` and ``nox -s gpu``) on a GPU machine
that has torch but not the rest: the wheels come from ``nox -s gpu_wheels``. A distribution
already installed (in this Python or in the target folder) is kept as it is, so the machine's
own torch, NumPy and friends are never replaced. Nothing is resolved: the folder holds every
wheel that may be needed.

    python tools/install_missing_wheels.py WHEELS TARGET
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path


def distribution_name(wheel: Path) -> str:
    """The normalised distribution name of a wheel file (PEP 503)."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheels", type=Path, help="the folder of wheels (from nox -s gpu_wheels)")
    p.add_argument("target", type=Path, help="where to install (put it on PYTHONPATH)")
    args = p.parse_args(argv)
    wheels = sorted(args.wheels.glob("*.whl"))
    if not wheels:
        print(
            f"no wheels in {args.wheels}: run 'nox -s gpu_wheels' on a machine with network "
            "and copy the folder beside the tree"
        )
        return 1
    # The target's earlier installs count as installed.
    sys.path.insert(0, str(args.target))
    importlib.invalidate_caches()
    missing = [w for w in wheels if not installed(distribution_name(w))]
    if not missing:
        print(f"every distribution of {args.wheels} is already installed")
        return 0
    names = ", ".join(distribution_name(w) for w in missing)
    print(f"installing {len(missing)} missing distribution(s) into {args.target}: {names}")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--disable-pip-version-check", "--target", str(args.target)]
    return subprocess.call([*cmd, *map(str, missing)])


if __name__ == "__main__":
    sys.exit(main())
