"""The docs' code runs, their command lines parse, and the docs the code cites exist.

Every ``.. code-block:: python`` of README.rst and docs/ runs here, in a folder that holds a
small fake feature store at ``features/resnet50`` (and ``features/mine``), with
``X_train, y_train, X_test, y_test`` and ``my_module`` defined where a block uses them
unannounced. The protocol's long searches are shortened (fewer shots, seeds, trials and
epochs) by wrapping the functions a block calls; everything else is the real call. A block
that needs ImageNet, a GPU or downloaded weights is marked in the .rst source with a comment
on the line before it, ``.. skip-test: WHY``: it is not run, but its names are still checked
(every name it uses is imported or assigned in it). Every ``imagenet-cog`` command line the
docs show must parse with the real argument parser.
"""

import ast
import builtins
import functools
import re
import shlex
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"^\.\. skip-test: (.+)$")
#: Names a block may use without defining them: the reader's own data, set up by the test.
CONTEXT = {"X_train", "y_train", "X_test", "y_test", "my_module", "train_paths", "train_labels"}


def _doc_files():
    files = [ROOT / "README.rst"]
    files += sorted(
        p
        for p in (ROOT / "docs").rglob("*.rst")
        if not {"_build", "generated", "auto_examples"} & set(p.parts)
    )
    return files


def _literal_blocks(path):
    """``(line, directive, language, skip reason, code)`` of each literal block of a file.

    ``directive`` is ``"code-block"`` or ``"::"`` (a paragraph ending in ``::``).
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        m = re.match(r"^\.\. code-block::\s*(\S+)", stripped)
        if m:
            kind, language = "code-block", m.group(1)
        elif stripped.endswith("::") and not stripped.startswith(".. "):
            kind, language = "::", "text"
        else:
            continue
        indent = len(line) - len(line.lstrip())
        body, j = [], i + 1
        while j < len(lines) and (
            not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent
        ):
            body.append(lines[j])
            j += 1
        if kind == "code-block":  # options such as :caption: come first
            while body and body[0].strip().startswith(":"):
                body.pop(0)
        prev = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        reason = SKIP.match(prev)
        code = textwrap.dedent("\n".join(body)).strip("\n")
        if code:
            rel = f"{path.relative_to(ROOT)}:{i + 1}"
            blocks.append((rel, kind, language, reason.group(1) if reason else None, code))
    return blocks


PYTHON = [b for f in _doc_files() for b in _literal_blocks(f) if b[2] == "python"]


# ----------------------------------------------------------------- the setup
@pytest.fixture(scope="module")
def docs_setup(tmp_path_factory):
    """A feature store of every domain (real wnids, tiny images), and fast protocol calls."""
    from imagefiles import plain_concepts, write_concepts, write_in1k

    from imagenet_cog import Levels, extract_all, load_levels

    base = tmp_path_factory.mktemp("docs")
    in1k_wnids, _ = write_in1k(base / "in1k", n_classes=2, n_train=5, n_val=2)
    official = load_levels("official")
    levels = Levels([official[name][:2] for name in official.names])
    write_concepts(base / "in21k", plain_concepts([w for lv in levels.levels for w in lv], 7))
    store = base / "features" / "resnet50"
    extract_all(
        "torchvision:resnet18",
        {"in1k": base / "in1k", "in21k": base / "in21k"},
        store,
        levels,
        wnids={"in1k": in1k_wnids},
        n_test=2,
        official_test=False,
        preprocessing={"size": 16},
        batch_size=16,
        progress=False,
    )
    (base / "features" / "mine").symlink_to(store, target_is_directory=True)
    return base / "features"


def _with_defaults(function, **fast):
    @functools.wraps(function)
    def fast_call(*args, **kwargs):
        return function(*args, **{**fast, **kwargs})

    return fast_call


def _arrays(n_classes, n_train, n_test, dim, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim)) * 3 / np.sqrt(dim)
    y_train, y_test = (
        np.repeat(np.arange(n_classes), n_train),
        np.repeat(np.arange(n_classes), n_test),
    )
    X_train = (means[y_train] + rng.normal(size=(y_train.size, dim)) / np.sqrt(dim)).astype(
        np.float32
    )
    X_test = (means[y_test] + rng.normal(size=(y_test.size, dim)) / np.sqrt(dim)).astype(np.float32)
    return {"X_train": X_train, "y_train": y_train, "X_test": X_test, "y_test": y_test}


def _namespace(code, cwd):
    """The reader's context of a block: the names it uses without defining them."""
    import torch
    from PIL import Image

    names = {}
    if "X_train" in code:
        # The PCA probe's widths go up to 1024: it needs that many features and samples.
        names |= _arrays(4, 300, 20, 1024) if "pca_probe" in code else _arrays(4, 12, 6, 16)
    if "my_module" in code:
        names["my_module"] = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()
        )
        for name in ("img1.jpg", "img2.jpg"):
            Image.new("RGB", (40, 30), (200, 120, 40)).save(cwd / name)
    return names


@pytest.fixture
def fast_protocol(monkeypatch):
    """The protocol's searches, shortened: the same calls, with fewer shots, seeds and trials."""
    import imagenet_cog
    import imagenet_cog.analysis
    import imagenet_cog.protocol
    from imagenet_cog import measures

    fast = _with_defaults(
        imagenet_cog.protocol.evaluate,
        shots=(1, "all"),
        seeds=(22, 37),
        n_trials=2,
        epochs=2,
        device="cpu",
        progress=False,
    )
    monkeypatch.setattr(imagenet_cog, "evaluate", fast)
    monkeypatch.setattr(imagenet_cog.protocol, "evaluate", fast)
    for name in ("pca_probe", "mlp_probe"):
        real = getattr(imagenet_cog.analysis, name)
        short = {"seeds": (22,), "n_trials": 2, "epochs": 2, "device": "cpu"}
        if name == "mlp_probe":
            short["hidden_layer_sizes"] = (32, 32)
        monkeypatch.setattr(imagenet_cog.analysis, name, _with_defaults(real, **short))
    # A block may register a measure: the registry is restored after it.
    monkeypatch.setattr(measures, "_REGISTRY", measures._REGISTRY.copy())


# --------------------------------------------------------------- the blocks
def _undefined_names(code):
    """Names a block reads but neither imports nor assigns (nor Python provides)."""
    tree = ast.parse(code)
    bound, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else used).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return sorted(used - bound - set(dir(builtins)) - CONTEXT)


@pytest.mark.parametrize(
    ("where", "kind", "language", "skip", "code"), PYTHON, ids=[b[0] for b in PYTHON]
)
def test_every_python_block_uses_only_names_it_defines(where, kind, language, skip, code):
    assert not _undefined_names(code), f"{where}: undefined {_undefined_names(code)}"


@pytest.mark.slow
@pytest.mark.usefixtures("fast_protocol", "one_thread")
@pytest.mark.parametrize(
    ("where", "kind", "language", "skip", "code"), PYTHON, ids=[b[0] for b in PYTHON]
)
def test_every_python_block_runs(
    where, kind, language, skip, code, docs_setup, tmp_path, monkeypatch
):
    if skip:
        pytest.skip(f"{where}: {skip}")
    shutil.copytree(docs_setup, tmp_path / "features", symlinks=True)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__", **_namespace(code, tmp_path)}
    exec(compile(code, where, "exec"), namespace)  # noqa: S102 - running the docs' code is the test


def test_most_python_blocks_run_and_each_skip_says_why():
    ran = [b[0] for b in PYTHON if not b[3]]
    skipped = {b[0]: b[3] for b in PYTHON if b[3]}
    # Blocks that need ImageNet, a GPU or downloaded weights are the exception.
    print(f"{len(ran)} of {len(PYTHON)} Python blocks run; skipped: {skipped}")
    assert len(ran) >= 10 and len(ran) > len(skipped), (ran, skipped)
    for where, why in skipped.items():
        assert re.search(r"ImageNet|GPU|CUDA|weights|download", why), f"{where}: {why!r}"


# ------------------------------------------------------------- command lines
def _command_lines():
    """``(where, argv, whole)`` of every imagenet-cog command the docs show: ``whole`` for a
    block's command line, not for an inline mention (``imagenet-cog evaluate --verify``)."""
    found = []
    for path in _doc_files():
        for where, directive, language, _, code in _literal_blocks(path):
            # Python, or what a command printed (a ``.. code-block:: text``)
            if language == "python" or (directive, language) == ("code-block", "text"):
                continue
            text = code.replace("\\\n", " ")
            for line in text.splitlines():
                if language == "console":
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                found += [(where, part, True) for part in line.split("&&")]
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"``((?:imagenet-cog|torchrun) [^`]+)``", text):
            where = f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
            found.append((where, " ".join(m.group(1).split()), False))
    commands = []
    for where, line, whole in found:
        if "imagenet-cog" not in line and "imagenet_cog" not in line:
            continue
        words = shlex.split(line, comments=True)
        for start, word in enumerate(words):
            if word == "imagenet-cog" or (word == "imagenet_cog" and words[start - 1] == "-m"):
                commands.append((where, words[start + 1 :], whole))
                break
    return commands


COMMANDS = _command_lines()


def test_the_docs_show_whole_commands_of_every_subcommand():
    shown = {argv[0] for _, argv, whole in COMMANDS if argv and whole}
    assert {"levels", "extract", "evaluate", "report", "analyze"} <= shown


@pytest.mark.parametrize(
    ("where", "argv", "whole"), COMMANDS, ids=[f"{w} {' '.join(a)[:40]}" for w, a, _ in COMMANDS]
)
def test_every_command_line_of_the_docs_parses(where, argv, whole, capsys):
    import argparse

    from imagenet_cog.cli import build_parser

    parser = build_parser()
    if whole:
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: imagenet-cog {' '.join(argv)}: {capsys.readouterr().err}")
        return
    # An inline mention: the subcommand and every option it names exist.
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if not argv or argv[0].startswith("-"):
        options = parser._option_string_actions
    else:
        assert argv[0] in commands.choices, f"{where}: no subcommand {argv[0]!r}"
        options = commands.choices[argv[0]]._option_string_actions
    unknown = [w for w in argv if w.startswith("--") and w.split("=")[0] not in options]
    assert not unknown, f"{where}: imagenet-cog {' '.join(argv)}: no option {unknown}"


# ------------------------------------------------- docs references in messages
#: "docs/guide/X.rst" with an optional section, "see the docs, 'Section'".
REFERENCE = re.compile(r"(docs/[\w/.-]+\.rst|the docs)(?:, '([^']+)')?")


def _section_titles(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return {
        lines[i].strip()
        for i in range(len(lines) - 1)
        if lines[i].strip()
        and re.fullmatch(r"([=\-~^\"'`#*+<>])\1+", lines[i + 1].strip())
        and len(lines[i + 1].strip()) >= len(lines[i].strip())
    }


def _unresolved(text):
    """The docs references of ``text`` that name no file, or no section of it."""
    bad = []
    for m in REFERENCE.finditer(text):
        target, section = m.groups()
        if target == "the docs":
            files = _doc_files()
            if section is None:
                continue
        else:
            files = [ROOT / target]
            if not files[0].is_file():
                bad.append(f"{target}: no such file")
                continue
        if section is not None and not any(section in _section_titles(f) for f in files):
            bad.append(f"{target}, {section!r}: no such section")
    return bad


def _strings(path):
    """Every string literal of a module, implicit concatenations and f-strings joined."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            yield node.lineno, "".join(parts)


def test_every_docs_reference_in_the_code_resolves():
    refs, bad = 0, []
    for path in sorted((ROOT / "src").rglob("*.py")):
        for line, text in _strings(path):
            text = " ".join(text.split())
            refs += len(REFERENCE.findall(text))
            bad += [f"{path.relative_to(ROOT)}:{line}: {b}" for b in _unresolved(text)]
    assert refs >= 3
    assert not bad, "\n".join(bad)


def test_the_caveats_a_report_prints_cite_real_sections():
    from imagenet_cog import Results, comparability

    records = [
        {"model": "mine", "domain": "L5", "shots": "all", "seed": s, "top1": 50.0}
        for s in (22, 37, 45, 77, 93)
    ]
    protocol = {"versions": {"optuna": "5.0.0"}, "levels": "official"}
    results = Results(records, meta={"protocol": {"mine": protocol}})
    notes = "\n".join(comparability(results))
    assert "Optuna 5.0.0" in notes and REFERENCE.search(notes)
    assert not _unresolved(notes)
