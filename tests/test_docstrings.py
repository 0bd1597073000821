"""Every public function and class has a numpydoc docstring with an example.

The public objects are those of the API reference (docs/api.rst), which lists
exactly the names ``imagenet_cog`` and ``imagenet_cog.analysis`` export. The examples themselves run as
doctests (``--doctest-modules`` in the pytest configuration).
"""

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

import imagenet_cog

validate = pytest.importorskip("numpydoc.validate").validate

API = Path(__file__).resolve().parents[1] / "docs" / "api.rst"
#: numpydoc checks that must pass: a docstring, documented parameters that
#: exist, a Returns section where something is returned, and an example.
CHECKS = {"GL08", "PR01", "PR02", "EX01", "RT01"}


def _api_names():
    names, module = [], "imagenet_cog"
    in_summary = False
    for line in API.read_text().splitlines():
        if m := re.match(r"\.\. currentmodule:: (\S+)", line):
            module = m.group(1)
        elif line.startswith(".. autosummary::"):
            in_summary = True
        elif in_summary and re.match(r"^   [A-Za-z_][\w.]*$", line):
            names.append(f"{module}.{line.strip()}")
        elif in_summary and line and not line.startswith(" "):
            in_summary = False
    return names


def _resolve(path):
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


#: The public modules besides the package and ``analysis``: they define names the package
#: exports, and export none themselves.
STAGE_MODULES = (
    "taxonomy",
    "measures",
    "levels",
    "datasets",
    "features",
    "store",
    "probe",
    "results",
    "protocol",
)


def _exported():
    """Every exported name, as ``module.name`` (``__version__`` is not documented)."""
    names = [f"imagenet_cog.{n}" for n in imagenet_cog.__all__ if n != "__version__"]
    for module in ("analysis", *STAGE_MODULES):
        mod = importlib.import_module(f"imagenet_cog.{module}")
        names += [f"imagenet_cog.{module}.{n}" for n in mod.__all__]
    return names


API_NAMES = _api_names()


def test_the_api_reference_lists_exactly_the_exported_names():
    exported = _exported()
    assert len(set(API_NAMES)) == len(API_NAMES), "a name is listed twice in docs/api.rst"
    missing = sorted(set(exported) - set(API_NAMES))
    assert not missing, f"exported but not in docs/api.rst: {missing}"
    extra = sorted(set(API_NAMES) - set(exported))
    assert not extra, f"in docs/api.rst but not exported: {extra}"


def test_every_public_object_has_one_home():
    # One name per object, exported from one place: the package, or its analysis namespace.
    objects = {}
    for name in _exported():
        objects.setdefault(id(_resolve(name)), []).append(name)
    twice = [names for names in objects.values() if len(names) > 1]
    assert not twice, f"exported more than once: {twice}"
    for module in STAGE_MODULES:
        mod = importlib.import_module(f"imagenet_cog.{module}")
        assert mod.__all__ == [], f"imagenet_cog.{module} exports {mod.__all__}"


#: A path into a stage module, which documents nothing of its own: the documented path of a
#: name is the package's (``imagenet_cog.make_split``, not ``imagenet_cog.datasets.make_split``).
_STAGE_PATH = re.compile(
    rf"imagenet_cog\.(?:{'|'.join(STAGE_MODULES)})\.[A-Za-z_]"
    rf"|from imagenet_cog\.(?:{'|'.join(STAGE_MODULES)}) import"
)
#: A cross-reference of a docstring (``:func:`~imagenet_cog.x```): what Sphinx would link.
_XREF = re.compile(r":(?:func|class|meth|attr|data|exc|obj):`[^`]*`")
ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_and_the_docstrings_name_only_documented_paths():
    # The stage modules export nothing, so the guide, the README, the examples, the
    # docstrings' examples and their cross-references reach every name through the package.
    bad = []
    user_facing = [
        ROOT / "README.rst",
        *(ROOT / "docs").rglob("*.rst"),
        *(ROOT / "examples").rglob("*.py"),
    ]
    for path in sorted(user_facing):
        if "generated" in path.parts or "_build" in path.parts:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _STAGE_PATH.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    for path in sorted((ROOT / "src" / "imagenet_cog").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            example = line.lstrip().startswith((">>>", "..."))
            shown = [line] if example else _XREF.findall(line)
            if any(_STAGE_PATH.search(text) for text in shown):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "undocumented paths:\n" + "\n".join(bad)


def test_a_module_is_not_shadowed_by_a_function():
    import imagenet_cog.measures as m

    assert inspect.ismodule(m)
    assert callable(imagenet_cog.similarity)


@pytest.mark.parametrize("name", API_NAMES)
def test_public_docstring(name):
    obj = _resolve(name)
    # numpydoc validates by import path; use the object's defining module.
    path = f"{obj.__module__}.{obj.__qualname__}"
    report = validate(path)
    # Result objects (made by a function, not by the user) document their fields under
    # Attributes rather than Parameters; estimators and everything else need Parameters.
    is_result = (
        inspect.isclass(obj)
        and not hasattr(obj, "fit")
        and (dataclasses.is_dataclass(obj) or "Attributes\n    ----------" in (obj.__doc__ or ""))
    )
    checks = CHECKS - {"PR01"} if is_result else CHECKS
    errors = [(code, msg) for code, msg in report["errors"] if code in checks]
    assert not errors, f"{name}: {errors}"
