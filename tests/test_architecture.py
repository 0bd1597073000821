"""The package's shape: the import graph follows the pipeline, and modules stay small.

The stated order (the package docstring) is taxonomy → measures → levels → datasets →
features/store → probe → results → protocol → analysis, with the command line on top. A
module may import its own stage and the stages before it, never a later one, so there is
no circle; helpers that import nothing from the package serve every stage.

When a module nears the cap of 1,000 lines, the rule is: a stage that needs more than its
face module gets a private wing (``_train`` for the probes' training, ``_models`` for the
feature stage's models, ``_protocol`` for the protocol), and a piece cut off to stay under
the cap goes into its stage's wing, named for what it is. No new flat module: the flat ones
are listed in :data:`FLAT`, and a new one fails the test that names this rule.

The package is walked once: every test reads the same module list and the same parsed
imports.
"""

import ast
import functools
import pathlib

import pytest
from helpers import subprocess_env

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "imagenet_cog"

# Modules that import nothing from the package (or only one another): any stage may use them.
BASE = {
    "_version",
    "_fileio",
    "_grid",
    "_validation",
    "_device",
    "_train.engine",
    "_train.fused",
    "_distributed",
    "_runfolder",
    "_train.feed",
    "_train.memplan",
    "_train",
    "_models",
    "_optional_dependencies",
    "_data",
    "_features",
    "_sharded",
    "_plugins",
}
# Stage of every other module, in pipeline order.
STAGES = {
    "_base": 1,
    "taxonomy": 1,
    "measures": 2,
    "levels": 3,
    # The one listing of a copy and its readers come before the levels, which count the
    # images a copy holds (count_images); the datasets cut their splits from the same listing.
    "_data.sources": 3,
    "_data.tar": 3,
    "_data.labels": 3,
    "_data.folders": 3,
    "_data.copies": 3,
    "_data.shards": 3,
    "_data.parquet": 3,
    "_data.listing": 3,
    "datasets": 4,
    "_data.pillow_decode": 4,
    "_data.pillow_resize": 4,
    "_data.tensor_decode": 4,
    "_data.file_split": 4,
    "_data.jpeg_markers": 4,
    "_data.worker_images": 4,
    "_data.batched_resize": 4,
    "_data.device_feed": 4,
    "_data.network_inputs": 4,
    "_models.spec": 5,
    "_models.weights": 5,
    "_models.untrained": 5,
    "_models.classifier_input": 5,
    "_models.registry": 5,
    "_models.torchvision_source": 5,
    "_models.timm_source": 5,
    "_models.open_clip_source": 5,
    "_models.hf_source": 5,
    "_models.torchhub_source": 5,
    "_models.presets": 5,
    "_models.text_towers": 5,
    "_models.pretraining": 5,
    "_features.settings": 5,
    "features": 5,
    "store": 5,
    "_storecheck": 5,
    "_extract_all": 5,
    "_onepass": 5,
    "_coverage": 7,
    "_selftest": 5,
    "_feature_source": 5,
    "_provenance": 5,
    "_train.search": 6,
    "_classifier": 6,
    "probe": 6,
    "_neighbors": 6,
    "_neighbors.search": 6,
    "_neighbors.votes": 6,
    "_neighbors.estimator": 6,
    "results": 7,
    "_comparability": 7,
    "_paired": 7,
    "_exports": 7,
    "_figures": 7,
    "_tables": 7,
    "_reporting": 7,
    "_reporting.verdict": 7,
    "_reporting.names": 7,
    "_reporting.answer": 7,
    "_reporting.concepts": 7,
    "_reporting.html": 7,
    "_reporting.page": 7,
    "_reporting.protocols": 7,
    "_reporting.cells": 7,
    # The analysis wing sits with the results: its table of analyses is what the readers of
    # results show (the analysis table, the HTML report), and its analyses read features,
    # probes and saved predictions, all of earlier stages. ``analysis``, its face, runs them.
    "_analysis": 7,
    "protocol": 8,
    "_protocol": 8,
    "_protocol.checks": 8,
    "_protocol.plan": 8,
    "_protocol.parts": 8,
    "_protocol.cluster": 8,
    "analysis": 9,
    "cli": 10,
    "_cli_results": 10,
    "_cli": 10,
    "_cli.submit": 10,
    "_cli.data": 10,
    "__main__": 10,
    "__init__": 10,
}
MAX_LINES = 1000
#: The flat private modules there are. A new piece goes into its stage's wing (see the module
#: docstring); only a helper that every stage shares (one of BASE) joins this list.
FLAT = {
    "_base",
    "_classifier",
    "_cli_results",
    "_comparability",
    "_coverage",
    "_device",
    "_distributed",
    "_exports",
    "_extract_all",
    "_feature_source",
    "_figures",
    "_fileio",
    "_grid",
    "_onepass",
    "_optional_dependencies",
    "_paired",
    "_plugins",
    "_provenance",
    "_runfolder",
    "_selftest",
    "_sharded",
    "_storecheck",
    "_tables",
    "_validation",
    "_version",
}


def _path(name):
    """The file of a module named relative to the package (``_train.engine``, ``_train``)."""
    base = PACKAGE.joinpath(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _walk():
    names = []
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        names.append(".".join(parts))
    return tuple(sorted(names))


#: Every module of the package, found by the one walk of its folder.
MODULES = _walk()
_KNOWN = frozenset(MODULES)
# A new analysis is its module and its row of the table of analyses: the analysis wing's
# modules take the wing's stage.
STAGES.update({m: STAGES["_analysis"] for m in MODULES if m.startswith("_analysis.")})


def _modules():
    return list(MODULES)


def _known(name):
    return name in _KNOWN


@functools.cache
def _imports(name):
    """(imported module, imported names) for every package-internal import of a module."""
    path = _path(name)
    tree = ast.parse(path.read_text())
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("imagenet_cog."):
                mod = node.module[len("imagenet_cog.") :]
            else:
                continue
            names = tuple(a.name for a in node.names)
            subs = [f"{mod}.{n}" if mod else n for n in names]
            if any(_known(s) for s in subs):  # from .wing import module
                found += [(s, ()) for s in subs if _known(s)]
            elif mod:
                found.append((mod, names))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("imagenet_cog."):
                    found.append((alias.name[len("imagenet_cog.") :], ()))
    return tuple((mod, names) for mod, names in found if _known(mod) and mod != name)


def test_every_module_has_a_stage():
    unknown = [m for m in _modules() if m not in BASE and m not in STAGES]
    assert not unknown, f"give these modules a stage in {__name__}: {unknown}"


@pytest.mark.parametrize("name", sorted(BASE))
def test_base_modules_import_only_base_modules(name):
    if not _known(name):
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
            if any(part.startswith("_") for part in mod.split(".")):
                continue
            private = [n for n in names if n.startswith("_")]
            if private:
                bad.append(f"{name} imports {private} from public module {mod}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", _modules())
def test_module_is_small_and_says_what_it_is_for(name):
    text = _path(name).read_text()
    assert len(text.splitlines()) <= MAX_LINES, (
        f"{name}.py has more than {MAX_LINES} lines: cut a piece off into its stage's wing "
        "(a new private package if the stage has none), named for what it is"
    )
    if name not in ("_version", "__main__"):
        assert ast.get_docstring(ast.parse(text)), f"{name}.py opens with no docstring"


def test_no_new_flat_module():
    flat = {m for m in _modules() if "." not in m and m.startswith("_") and not m.startswith("__")}
    new = sorted(flat - FLAT - set(WING_FACES))
    assert not new, (
        f"new flat modules {new}: a piece of a stage goes into its stage's wing, named for what "
        "it is (the rule of this module's docstring); a helper that every stage shares goes "
        "into BASE and FLAT"
    )


def test_the_test_sees_real_imports():
    # Guards the checker itself: protocol does import probe's search and the grid.
    mods = {mod for mod, _ in _imports("protocol")}
    assert {"_grid", "_version"} <= mods


def test_the_first_stages_import_nothing_from_training():
    # The taxonomy, the measures and the levels need WordNet and files, never the SGD engine.
    graph = {name: {mod for mod, _ in _imports(name)} for name in _modules()}
    for start in ("taxonomy", "measures", "levels"):
        seen, todo = set(), [start]
        while todo:
            for mod in graph[todo.pop()] - seen:
                seen.add(mod)
                todo.append(mod)
        training = sorted(
            m for m in seen if m in ("_validation", "_train") or m.startswith("_train.")
        )
        assert not training, f"{start} imports {training}"


# The wings: a few modules are their faces; the rest is theirs alone.
WING_FACES = {
    "_train": {
        "_train.search",
        "_train.engine",
        "_train.memplan",
    },
    "_models": {
        "_models.registry",
        "_models.spec",
        "_models.weights",
        "_models.presets",
        "_models.untrained",
        "_models.classifier_input",
        "_models.text_towers",
        "_models.pretraining",
    },
    # The readers (tar, folders, shards, parquet) are reached through the one listing.
    "_data": {
        "_data.sources",
        "_data.listing",
        "_data.copies",
        "_data.labels",
        "_data.pillow_decode",
        "_data.tensor_decode",
        "_data.file_split",
        "_data.network_inputs",
    },
    # The probe stage's k-NN: the search and the votes serve the grid, the estimator users.
    "_neighbors": {"_neighbors.search", "_neighbors.votes", "_neighbors.estimator"},
    # The features stage's own wing: how an extraction runs (its decoder, resize, workers and
    # arithmetic per device); the stores read its settings too (see WING_ENTRANTS).
    "_features": {"_features.settings"},
    # A stage's own wing: only its face module uses it (see WING_ENTRANTS).
    "_protocol": set(),
    "_cli": set(),
    # The analysis wing: the readers of results read its table of analyses; the rest is
    # reached through imagenet_cog.analysis (see WING_ENTRANTS).
    "_analysis": {"_analysis.table", "_analysis.evaluation_figures", "_analysis.evaluations"},
    # What a reader reads of results: the verdict's text, the names, the answer first, the
    # HTML report; its other modules are the HTML report's own.
    "_reporting": {
        "_reporting.verdict",
        "_reporting.names",
        "_reporting.answer",
        "_reporting.concepts",
        "_reporting.html",
        "_reporting.protocols",
        "_reporting.cells",
    },
}
#: Who may train: the probe, protocol and analysis stages and the self-test.
TRAINERS = {
    "probe",
    "protocol",
    "_protocol.plan",
    "_analysis.mlp",
    "_analysis.probes",
    # The k-NN grid trains nothing: it takes the searches' own few-shot draws.
    "_analysis.knn_grid",
    "analysis",
    "_selftest",
    "__init__",
}
#: The wall of every wing: the modules outside it that may import its modules (its faces, see
#: WING_FACES). Everything else reaches a wing through them. A stage's own wing has its face
#: module alone; where the work runs (``_device``) is a base module, so no one enters the
#: training wing but to train.
WING_ENTRANTS = {
    "_train": TRAINERS,
    "_models": {
        "features",
        "_feature_source",
        "_analysis.zeroshot_domain",
        "_comparability",
        "_reporting.names",
        "_selftest",
        "cli",
    },
    "_data": {
        "datasets",
        "features",
        "store",
        "_onepass",
        "_extract_all",
        "_coverage",
        "_comparability",
        "levels",
    },
    "_features": {"features", "store"},
    "_protocol": {"protocol"},
    "_cli": {"cli"},
    # The probe stage's k-NN: the package exports its estimator; the evaluations use its search.
    "_neighbors": {
        "__init__",
        "protocol",
        "analysis",
        "_analysis.knn_grid",
        "_analysis.evaluations",
    },
    # The analysis wing: its face, and the readers of results that show its table.
    "_analysis": {
        "analysis",
        "results",
        "_tables",
        "_reporting.html",
        "_reporting.protocols",
        "cli",
    },
    "_reporting": {
        "results",
        "_exports",
        "_figures",
        "_cli_results",
        "_analysis.concept_accuracy",
        "analysis",
    },
}


#: A stage's own wing and its face module, to which the whole wing is open.
STAGE_WING_FACES = {
    "_features": "features",
    "_protocol": "protocol",
    "_analysis": "analysis",
    "_cli": "cli",
}


def _wing(name):
    return next((w for w in WING_FACES if name == w or name.startswith(w + ".")), None)


def test_nothing_outside_a_wing_imports_its_internals():
    bad = []
    for name in _modules():
        for mod, _ in _imports(name):
            wing = _wing(mod)
            if not wing or _wing(name) == wing or mod == wing or mod in WING_FACES[wing]:
                continue
            if name == STAGE_WING_FACES.get(wing):
                continue  # a stage's own wing is all face to its face module
            bad.append(f"{name} imports {mod}, an internal module of {wing}")
    assert not bad, "\n".join(bad)


def test_every_wing_has_a_wall():
    wings = {m for m in _modules() if "." not in m and _path(m).name == "__init__.py"} - {
        "__init__"
    }
    assert wings == set(WING_FACES) == set(WING_ENTRANTS), (
        "give every wing its faces (WING_FACES) and the modules that may enter it "
        f"(WING_ENTRANTS): wings {sorted(wings)}, faces {sorted(WING_FACES)}, "
        f"entrants {sorted(WING_ENTRANTS)}"
    )


def test_only_a_wings_entrants_enter_it():
    bad = []
    for name in _modules():
        for mod, _ in _imports(name):
            wing = _wing(mod)
            if wing and _wing(name) != wing and name not in WING_ENTRANTS[wing]:
                bad.append(
                    f"{name} imports {mod}, but only {sorted(WING_ENTRANTS[wing])} enter {wing}"
                )
    assert not bad, "\n".join(bad)


def test_nothing_runs_back_up_into_the_training_wing():
    # The parameter checks and where the work runs are base modules every stage uses: they
    # import nothing from the wing that trains, and the checks load no torch.
    import subprocess
    import sys

    for name in ("_validation", "_device"):
        assert not [m for m, _ in _imports(name) if _wing(m) == "_train"], name
    code = "import sys, imagenet_cog._validation; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert out.stdout.strip() == "False", out.stderr


def test_only_the_trainers_import_the_searches_and_the_engine():
    bad = []
    for name in _modules():
        if _wing(name) == "_train":
            continue
        for mod, _ in _imports(name):
            if mod in ("_train.search", "_train.engine") and name not in TRAINERS:
                bad.append(f"{name} imports {mod}")
            if mod == "_train.memplan" and name != "protocol":
                bad.append(f"{name} imports the memory plan, which only evaluate makes")
    assert not bad, "\n".join(bad)
