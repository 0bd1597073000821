"""Checks shared by several stages: what a wnid looks like, which files are images.

Imports nothing from the package, so every stage can use it.
"""

from __future__ import annotations

import re
from importlib import resources

__all__ = ["IMAGE_SUFFIXES", "WNID_RE", "data_path"]

#: A WordNet noun synset id: ``n`` and the 8-digit synset offset.
WNID_RE = re.compile(r"^n\d{8}$")
#: File endings read as images (compared in lower case).
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


def data_path(name):
    """A file shipped in the package's ``data/`` folder (see ``data/PROVENANCE.rst``)."""
    return resources.files("imagenet_cog").joinpath("data", name)
