"""Write the texts zero-shot classification reads by default into the package data.

Run by a maintainer after a change to the class-name rules or the levels::

    python tools/build_zeroshot_texts.py

* ``zeroshot_classnames.tsv``: the names of the 6,000 concepts of IN-1K and the official
  levels, made from the package's WordNet by ``class_names`` (the tests check that the file
  is what the code makes);
* ``zeroshot_templates_imagenet.txt``: OpenAI's 80 ImageNet prompt templates, copied from
  the installed OpenCLIP's zero-shot metadata (MIT licence), for installs without OpenCLIP.
"""

from pathlib import Path

from imagenet_cog._analysis.classnames import (
    CLASSNAMES_FILE,
    TEMPLATES_FILE,
    ambiguity_counts,
    class_names,
    default_templates,
    official_domains,
    official_header,
    write_class_names,
)
from imagenet_cog._fileio import atomic_write_text

DATA = Path(__file__).resolve().parents[1] / "src" / "imagenet_cog" / "data"


def main():
    rows = class_names(official_domains())
    write_class_names(DATA / CLASSNAMES_FILE, rows, official_header(rows))
    print(f"{CLASSNAMES_FILE}: {len(rows)} names; shared within a domain: {ambiguity_counts(rows)}")
    templates, source = default_templates()
    if not source.startswith("open_clip"):
        raise SystemExit("install open_clip_torch: the templates are copied from it")
    header = [
        "# OpenAI's 80 ImageNet prompt templates for zero-shot classification ({c}: the class",
        f"# name), as {source} lists them (MIT licence).",
    ]
    atomic_write_text(DATA / TEMPLATES_FILE, "\n".join([*header, *templates]) + "\n")
    print(f"{TEMPLATES_FILE}: {len(templates)} templates from {source}")


if __name__ == "__main__":
    main()
