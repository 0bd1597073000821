"""The optional libraries: which extra brings each one, whether it is installed, and the one
error that says how to install it.

The code imports an optional library only through :func:`require` (or, for a model spec's
library, :func:`require_for_spec`), so every missing library gets the same one-line message;
the tests skip on :data:`INSTALLED` (and the ``HAS_*`` flags). The hint of :func:`require` is
the extra's own requirement (``pip install 'pandas>=2.0'``), which works from a checkout as
from PyPI; a model spec's names the extra (``pip install 'imagenet_cog[timm]'``), as the model
zoo's page does. Imports nothing from the package.
"""

from __future__ import annotations

import importlib
import importlib.util
import re

__all__ = [
    "EXTRAS",
    "HAS_MATPLOTLIB",
    "HAS_PANDAS",
    "INSTALLED",
    "require",
    "require_for_spec",
]

#: Importable name -> (the extra of ``pyproject.toml`` that installs it, its requirement).
EXTRAS = {
    "matplotlib": ("plot", "matplotlib>=3.7"),
    "pandas": ("pandas", "pandas>=2.0"),
    "pyarrow": ("parquet", "pyarrow>=14"),
    "timm": ("timm", "timm>=1.0.15"),
    "open_clip": ("openclip", "open_clip_torch>=2.31"),
    "transformers": ("hf", "transformers>=4.56"),
    "faiss": ("faiss", "faiss-cpu>=1.8"),
}


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken install
        return False


#: Whether each library of :data:`EXTRAS` is installed (found without importing it).
INSTALLED = {name: _installed(name) for name in EXTRAS}
HAS_MATPLOTLIB = INSTALLED["matplotlib"]
HAS_PANDAS = INSTALLED["pandas"]


def _import(name):
    """``name`` (a library of :data:`EXTRAS` or one of its modules) imported, else None."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def require(name, feature, alternative=None):
    """Import and return the optional library ``name``, which ``feature`` needs.

    ``name`` is a library of :data:`EXTRAS` or one of its modules (``"pyarrow.parquet"``). A
    missing library raises ``ImportError("<feature> needs <library>: pip install '<req>'")``,
    followed by `` (or <alternative>)`` when one is given.

    Examples
    --------
    >>> require("pandas", "to_frame()").__name__
    'pandas'
    """
    library = name.split(".")[0]
    module = _import(name)
    if module is None:
        hint = f" (or {alternative})" if alternative else ""
        raise ImportError(
            f"{feature} needs {library}: pip install '{EXTRAS[library][1]}'{hint}"
        ) from None
    return module


def require_for_spec(name, spec):
    """Import and return the model library ``name``, which the model spec ``spec`` needs.

    A missing library raises ``ImportError("the model spec '<spec>' needs <package>, which is
    not installed: pip install 'imagenet_cog[<extra>]'")``, ``<package>`` being what pip
    installs (``open_clip_torch`` for ``open_clip``).
    """
    module = _import(name)
    if module is None:
        extra, requirement = EXTRAS[name.split(".")[0]]
        package = re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0]
        raise ImportError(
            f"the model spec {spec!r} needs {package}, which is not installed: "
            f"pip install 'imagenet_cog[{extra}]'"
        )
    return module
