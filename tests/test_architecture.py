"""The package's shape: the import graph follows the pipeline, and modules stay small.

The stated order (the package docstring) is taxonomy → similarity → levels → datasets →
features/store → probe → results → protocol → analysis, with the command line on top. A
module may import its own stage and the stages before it, never a later one, so there is
no circle; helpers that import nothing from the package serve every stage.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "imagenet_cog"

# Modules that import nothing from the package (or only one another): any stage may use them.
BASE = {
    "_version", "_fileio", "_grid", "_arrays", "_validation", "_engine", "_fused", "_torchrun",
    "_runfolder", "_analysis_checks", "_feed", "_memplan",
}  # fmt: skip
# Stage of every other module, in pipeline order.
STAGES = {
    "taxonomy": 1,
    "similarity": 2,
    "measures": 2,
    "levels": 3,
    "datasets": 4,
    "_decode": 4,
    "_resample": 4,
    "_model_sources": 5,
    "_source_torchvision": 5,
    "_source_timm": 5,
    "_source_open_clip": 5,
    "_source_hf": 5,
    "_source_torchhub": 5,
    "_presets": 5,
    "features": 5,
    "store": 5,
    "_storecheck": 5,
    "_extract_all": 5,
    "_selftest": 5,
    "_feature_source": 5,
    "_provenance": 5,
    "_search": 6,
    "_schedule": 6,
    "_mlp": 6,
    "probe": 6,
    "_paper_data": 7,
    "results": 7,
    "_comparability": 7,
    "protocol": 8,
    "_kmeans": 9,
    "_alignment": 9,
    "_semantic_errors": 9,
    "_extra_probes": 9,
    "analysis": 9,
    "cli": 10,
    "__main__": 10,
    "__init__": 10,
}
MAX_LINES = 1000


def _modules():
    return sorted(p.stem for p in PACKAGE.glob("*.py"))


def _imports(name):
    """(imported module, imported names) for every package-internal import of a module."""
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module is None:  # from . import x
                    found += [(alias.name, ()) for alias in node.names]
                else:
                    found.append((node.module.split(".")[0], tuple(a.name for a in node.names)))
            elif node.level == 0 and (node.module or "").startswith("imagenet_cog."):
                mod = node.module.split(".")[1]
                found.append((mod, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("imagenet_cog."):
                    found.append((alias.name.split(".")[1], ()))
    return [(mod, names) for mod, names in found if (PACKAGE / f"{mod}.py").exists()]


def test_every_module_has_a_stage():
    unknown = [m for m in _modules() if m not in BASE and m not in STAGES]
    assert not unknown, f"give these modules a stage in {__name__}: {unknown}"


@pytest.mark.parametrize("name", sorted(BASE))
def test_base_modules_import_only_base_modules(name):
    if not (PACKAGE / f"{name}.py").exists():
        pytest.skip(f"{name} does not exist")
    bad = [mod for mod, _ in _imports(name) if mod not in BASE]
    assert not bad, f"{name} is a base module but imports {bad}"


def test_no_import_runs_against_the_pipeline():
    bad = []
    for name in _modules():
        if name in BASE:
            continue
        for mod, _ in _imports(name):
            if mod not in BASE and STAGES.get(mod, 0) > STAGES[name]:
                bad.append(f"{name} (stage {STAGES[name]}) imports {mod} (stage {STAGES[mod]})")
    assert not bad, "\n".join(bad)


def test_no_import_circle():
    graph = {name: {mod for mod, _ in _imports(name)} for name in _modules()}
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                raise AssertionError("import circle: " + " -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = "done"

    for name in graph:
        if name not in state:
            visit(name, [])


def test_no_private_name_from_a_public_module():
    bad = []
    for name in _modules():
        for mod, names in _imports(name):
            if mod.startswith("_"):
                continue
            private = [n for n in names if n.startswith("_")]
            if private:
                bad.append(f"{name} imports {private} from public module {mod}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", _modules())
def test_module_is_small_and_says_what_it_is_for(name):
    text = (PACKAGE / f"{name}.py").read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"{name}.py has more than {MAX_LINES} lines"
    if name not in ("_version", "__main__"):
        assert ast.get_docstring(ast.parse(text)), f"{name}.py opens with no docstring"


def test_the_test_sees_real_imports():
    # Guards the checker itself: protocol does import probe's search and the grid.
    mods = {mod for mod, _ in _imports("protocol")}
    assert {"_grid", "_version"} <= mods
