"""Code of other packages that extends the library: ``package.module:name`` paths and entry points.

A measure or a model source may live outside the package. The command line names one as
``package.module:function`` (imported when used), and an installed package offers its own
through the entry-point groups :data:`MEASURES` and :data:`MODEL_SOURCES` of its metadata::

    [project.entry-points."imagenet_cog.measures"]
    depth-gap = "mypkg.measures:depth_gap"

Imports nothing from the package, so every stage can use it.
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata

__all__ = [
    "MEASURES",
    "MODEL_SOURCES",
    "PluginError",
    "entry_point",
    "entry_point_names",
    "load_object",
]

#: Entry-point group of the similarity measures installed packages offer.
MEASURES = "imagenet_cog.measures"
#: Entry-point group of the model sources installed packages offer.
MODEL_SOURCES = "imagenet_cog.model_sources"

_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class PluginError(TypeError):
    """A measure or model source that does not keep its side of the interface.

    Raised when what is registered or named (``package.module:function``, an entry point)
    is not callable, when a model source returns something other than a
    :class:`~imagenet_cog.LoadedModel`, or when a measure does not take the keyword
    argument ``taxonomy``. The error is in the plug-in's code, not in the library: the
    command line says it in one line. A ``TypeError``, as the interface is a type contract.

    Examples
    --------
    >>> from imagenet_cog import PluginError, register_measure
    >>> try:
    ...     register_measure("not-a-function", 3)
    ... except PluginError as exc:
    ...     print(exc)
    measure 'not-a-function' is not callable
    """


def is_object_path(text):
    """Whether ``text`` reads ``package.module:name``."""
    return isinstance(text, str) and bool(_PATH.match(text))


def load_object(path, what):
    """The object at ``package.module:name`` (``name`` may be dotted), or one line naming why not.

    Examples
    --------
    >>> load_object("os.path:join", "function").__name__
    'join'
    >>> load_object("os.path:nope", "measure")
    Traceback (most recent call last):
    ...
    ValueError: measure 'os.path:nope': module 'os.path' has no attribute 'nope'
    """
    if not is_object_path(path):
        raise ValueError(f"{what} {path!r} is not of the form package.module:function")
    module_name, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"{what} {path!r}: cannot import {module_name!r} ({exc}){_reach(module_name, exc)}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} {path!r}: module {module_name!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def _reach(module_name, exc):
    """How to make a module that cannot be imported importable: a module beside the user
    (the ``imagenet-cog`` command does not search the current folder) needs ``PYTHONPATH=.``;
    any other, its folder on ``PYTHONPATH`` or its package installed."""
    from pathlib import Path

    top = module_name.split(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or exc.name not in (top, module_name):
        return ""  # it was found, and failed inside: its own error says why
    here = Path.cwd()
    for found in (here / f"{top}.py", here / top):
        if found.exists():
            return (
                f"; {found.name} is in the current folder, which the imagenet-cog command "
                "does not search: run it as PYTHONPATH=. imagenet-cog ... (or install the "
                "package)"
            )
    return "; put its folder on PYTHONPATH, or install its package"


def _group(group):
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def entry_point_names(group):
    """Names the installed packages offer in an entry-point ``group``."""
    return sorted(_group(group))


def entry_point(group, name, what):
    """The object an installed package offers as ``name`` in ``group``, or None."""
    found = _group(group).get(name)
    if found is None:
        return None
    try:
        return found.load()
    except (ImportError, AttributeError, SyntaxError) as exc:  # a broken plug-in: one line
        raise ValueError(
            f"{what} {name!r} of the installed package {found.value!r} (entry point group "
            f"{group}) cannot be loaded: {exc}"
        ) from None
