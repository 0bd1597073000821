"""The optional libraries: which extra brings each one, whether it is installed, and the one
error that says how to install it.

The code imports an optional library only through :func:`require`, so every missing library
gets the same one-line message; the tests skip on the ``HAS_*`` flags. The hint is the extra's
own requirement (``pip install 'pandas>=2.0'``), which works from a checkout as from PyPI.
Imports nothing from the package.
"""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["EXTRAS", "HAS_MATPLOTLIB", "HAS_PANDAS", "require"]

#: Importable name -> (the extra of ``pyproject.toml`` that installs it, its requirement).
EXTRAS = {
    "matplotlib": ("plot", "matplotlib>=3.7"),
    "pandas": ("pandas", "pandas>=2.0"),
}


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken install
        return False


#: Whether the library is installed (found without importing it).
HAS_MATPLOTLIB = _installed("matplotlib")
HAS_PANDAS = _installed("pandas")


def require(name, feature, alternative=None):
    """Import and return the optional library ``name``, which ``feature`` needs.

    A missing library raises ``ImportError("<feature> needs <name>: pip install '<req>'")``,
    followed by `` (or <alternative>)`` when one is given.

    Examples
    --------
    >>> require("pandas", "to_frame()").__name__
    'pandas'
    """
    requirement = EXTRAS[name][1]
    try:
        return importlib.import_module(name)
    except ImportError:
        hint = f" (or {alternative})" if alternative else ""
        raise ImportError(f"{feature} needs {name}: pip install '{requirement}'{hint}") from None
