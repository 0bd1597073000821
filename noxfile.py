"""Development sessions: ``nox -s tests``, ``nox -s lint``, ``nox -s docs``, ``nox -s bench``."""

import nox

nox.needs_version = ">=2025.2.9"
nox.options.sessions = ["lint", "tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (doctests included). Extra arguments go to pytest."""
    session.install("-e", ".[plot,pandas]", *nox.project.dependency_groups(PYPROJECT, "test"))
    # pytest exits with 5 when it collects no test; nox treats any non-zero
    # exit code, 5 included, as a failure.
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Run ruff's linter and formatter check."""
    session.install("ruff>=0.4")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the Sphinx documentation, warnings as errors."""
    session.install("-e", ".[plot,pandas]", *nox.project.dependency_groups(PYPROJECT, "docs"))
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark script; each prints its ratio against a baseline."""
    session.install("-e", ".[plot,pandas]", *nox.project.dependency_groups(PYPROJECT, "test"))
    scripts = session.posargs or sorted(
        str(p) for p in __import__("pathlib").Path("benchmarks").glob("bench_*.py")
    )
    for script in scripts:
        session.run("python", script)
