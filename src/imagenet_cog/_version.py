__version__ = "0.1.0"


def package_versions(*names):
    """``{package: version}`` of this library, of ``names`` (those installed) and of Python.

    What a stored number depends on: the feature stores record torch's, Pillow's...; the
    protocol's records Optuna's TPE, torch's SGD and numpy's draws.
    """
    import importlib
    import platform

    out = {"imagenet_cog": __version__}
    for name in names:
        try:
            out[name] = importlib.import_module({"pillow": "PIL"}.get(name, name)).__version__
        except ImportError:  # pragma: no cover - every name given is a dependency
            continue
    out["python"] = platform.python_version()
    return out
