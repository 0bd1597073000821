"""Sphinx configuration."""

import imagenet_cog

project = "imagenet_cog"
author = "imagenet_cog developers"
copyright = "2026, imagenet_cog developers"
release = imagenet_cog.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
]
autosummary_generate = True
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
templates_path = ["_templates"]
exclude_patterns = ["_build", "generated/*.examples"]
html_theme = "pydata_sphinx_theme"
html_title = "imagenet_cog"
# No intersphinx: the docs must build offline, and CI machines have no internet.
