"""The optional libraries: one table, one message, and flags the tests skip on."""

import re
import sys
from pathlib import Path

import pytest

from imagenet_cog import Levels, reference_results
from imagenet_cog._optional_dependencies import EXTRAS, HAS_MATPLOTLIB, HAS_PANDAS, require
from imagenet_cog.analysis import kmeans, plot_analysis, semantic_errors

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_table_is_the_extras_of_pyproject():
    text = PYPROJECT.read_text()
    for name, (extra, requirement) in EXTRAS.items():
        (listed,) = re.findall(rf'^{extra} = \["([^"]+)"\]', text, flags=re.MULTILINE)
        assert listed == requirement, f"{name}: pyproject's {extra} extra says {listed}"


def test_flags_say_whether_the_library_is_there():
    import importlib

    def importable(name):
        try:
            importlib.import_module(name)
        except ImportError:
            return False
        return True

    assert importable("pandas") == HAS_PANDAS
    assert importable("matplotlib") == HAS_MATPLOTLIB


def _levels():
    return Levels([["n02123159"], ["n02123045"]], scores={"n02123159": 0.9, "n02123045": 0.5})


def _results():
    return reference_results(models=["ResNet50"])


# Every guard of the package, with the library it needs: the same message for each.
GUARDS = {
    "Levels.to_frame": ("pandas", lambda tmp: _levels().to_frame()),
    "Results.to_frame": ("pandas", lambda tmp: _results().to_frame()),
    "SemanticErrors.to_frame": (
        "pandas",
        lambda tmp: semantic_errors(["n02123159"], ["n02123045"]).to_frame(),
    ),
    "Results.plot": ("matplotlib", lambda tmp: _results().plot(tmp, baseline="ResNet50")),
    "plot_analysis": ("matplotlib", lambda tmp: plot_analysis({"in1k": {"nmi": 0.5}})),
    "kmeans(backend='faiss')": ("faiss", lambda tmp: kmeans([[0.0], [1.0]], 2, backend="faiss")),
}


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_a_missing_library_gets_one_message(guard, monkeypatch, tmp_path):
    name, call = GUARDS[guard]
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, name, None)
    requirement = EXTRAS[name][1]
    with pytest.raises(ImportError, match=rf"needs {name}: pip install '{re.escape(requirement)}'"):
        call(tmp_path)


def test_require_names_an_alternative(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    message = r"^f\(\) needs pandas: pip install 'pandas>=2\.0' \(or use g\(\)\)$"
    with pytest.raises(ImportError, match=message):
        require("pandas", "f()", alternative="use g()")
