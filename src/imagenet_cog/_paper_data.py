"""The paper's published results, bundled as package data.

``data/cog_paper_results.csv`` holds supplementary Tables 5-10 of Sariyildiz,
Kalantidis, Larlus and Alahari, *Concept Generalization in Visual
Representation Learning*, ICCV 2021 (arXiv 2012.05649): top-1 accuracy of
linear classifiers, mean and standard deviation over 5 seeds, for the 31 models
of Table 1, on IN-1K and the levels L1-L5, with N = 1, 2, 4, ..., 128 and all
training images per concept. ``tools/parse_paper_tables.py`` wrote it from the
paper text; ``PROVENANCE.rst`` in the data folder says more.
"""

from __future__ import annotations

import csv
import functools
from importlib import resources

# The domains (Tables 5-10) and the shots (their columns) are the protocol's own.
from ._grid import DOMAINS, SHOTS

__all__ = ["CATEGORY_NAMES", "DOMAINS", "SHOTS", "paper_models", "read_paper_results"]

#: Model category prefix -> the group name of the paper's Table 1 (lower case).
CATEGORY_NAMES = {
    "": "reference model",
    "a": "architecture",
    "s": "self-supervision",
    "r": "regularization",
    "d": "use of web data",
}

_FILE = "cog_paper_results.csv"


@functools.lru_cache(maxsize=1)
def _rows():
    text = resources.files("imagenet_cog").joinpath("data", _FILE).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    rows = []
    for row in csv.DictReader(lines):
        rows.append(
            {
                "model": row["model"],
                "model_as_printed": row["model_as_printed"],
                "category": row["category"],
                "category_name": row["category_name"],
                "table": int(row["table"]),
                "domain": row["domain"],
                "shots": "all" if row["shots"] == "all" else int(row["shots"]),
                "top1_mean": float(row["top1_mean"]),
                "top1_std": float(row["top1_std"]),
                "n_seeds": int(row["n_seeds"]),
            }
        )
    return tuple(rows)


def read_paper_results():
    """Read the paper's top-1 accuracies (supplementary Tables 5-10).

    The file is read once; each call returns fresh dicts, which the caller
    may modify.

    Returns
    -------
    list of dict
        One dict per (table, model, shots), 1674 in all (31 models x 6
        domains x 9 shot counts), in table order, models in Table 1 order,
        then by shots. Keys: ``model`` (the Table 1 name, e.g.
        ``"a-ResNet152"``), ``model_as_printed`` (the name as Tables 5-10
        print it, e.g. ``"a-ResNet-152"``), ``category`` (``"a"``, ``"s"``,
        ``"r"``, ``"d"``, or ``""`` for the reference ResNet50),
        ``category_name`` (see `CATEGORY_NAMES`), ``table`` (int, 5-10),
        ``domain`` (``"in1k"``, ``"L1"``, ..., ``"L5"``), ``shots`` (int
        images per concept, or ``"all"``), ``top1_mean`` and ``top1_std``
        (float, percent, as printed with one decimal) and ``n_seeds`` (int,
        5).

    See Also
    --------
    paper_models : the 31 models and their categories.

    Examples
    --------
    >>> from imagenet_cog._paper_data import read_paper_results
    >>> rows = read_paper_results()
    >>> len(rows)
    1674
    >>> [r["top1_mean"] for r in rows if r["model"] == "ResNet50" and r["shots"] == "all"]
    [75.8, 67.9, 63.1, 59.0, 58.1, 52.0]
    >>> row = rows[0]
    >>> row["model"], row["domain"], row["shots"], row["top1_mean"], row["top1_std"]
    ('ResNet50', 'in1k', 1, 45.0, 0.7)
    """
    return [dict(row) for row in _rows()]


def paper_models():
    """The 31 models of the paper's Table 1, in its order, with their categories.

    Returns
    -------
    dict
        ``{model: category}``: the Table 1 name and its category prefix
        (``"a"``, ``"s"``, ``"r"``, ``"d"``, or ``""`` for the reference
        ResNet50); `CATEGORY_NAMES` names the categories.

    See Also
    --------
    read_paper_results : their published top-1 accuracies.

    Examples
    --------
    >>> from imagenet_cog._paper_data import CATEGORY_NAMES, paper_models
    >>> models = paper_models()
    >>> len(models)
    31
    >>> list(models)[:4]
    ['ResNet50', 'a-T2T-ViT-t-14', 'a-DeiT-S', 'a-DeiT-S-distilled']
    >>> models["s-DINO"], CATEGORY_NAMES[models["s-DINO"]]
    ('s', 'self-supervision')
    """
    return {row["model"]: row["category"] for row in _rows()}
