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
    "sphinx_gallery.gen_gallery",
]
sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": "/plot_",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "show_memory": False,
    "remove_config_comments": True,
}
autosummary_generate = True
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
templates_path = ["_templates"]
exclude_patterns = ["_build", "generated/*.examples"]
html_theme = "pydata_sphinx_theme"
html_title = "imagenet_cog"
# No intersphinx: the docs must build offline, and CI machines have no internet.
