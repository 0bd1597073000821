"""Every public function and class has a numpydoc docstring with an example.

The public objects are those of the API reference (docs/api.rst), which must
also cover everything ``imagenet_cog`` exports. The examples themselves run as
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
    # Attributes of the package first: ``imagenet_cog.similarity`` is the
    # function, while ``imagenet_cog.similarity.max_similarity`` is in the module.
    obj = imagenet_cog
    try:
        for attr in path.split(".")[1:]:
            obj = getattr(obj, attr)
        return obj
    except AttributeError:
        module, _, attr = path.rpartition(".")
        return getattr(importlib.import_module(module), attr)


API_NAMES = _api_names()


def test_the_api_reference_covers_every_export():
    documented = {name.rsplit(".", 1)[-1] for name in API_NAMES}
    missing = [n for n in imagenet_cog.__all__ if n != "__version__" and n not in documented]
    assert not missing, f"exported but not in docs/api.rst: {missing}"
    assert len(API_NAMES) > 60


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
