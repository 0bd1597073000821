"""Temperature-weighted votes of the nearest neighbours (DINO's k-NN classifier).

Each of a row's ``k`` nearest training rows votes for its class with weight
``exp(similarity / T)``; a class's score is the sum of its votes, normalised to sum 1 over
the classes (what scikit-learn's ``KNeighborsClassifier.predict_proba`` gives with that weight
function). The weights are computed as ``exp((s - s_1) / T)``, ``s_1`` the row's highest
similarity: the same scores after normalisation, and no overflow at any temperature.

Several ``k`` come from one neighbour list (the largest ``k``'s): the votes of the first
``k`` neighbours are summed in order, nearest first, and each ``k`` adds to the previous one.
Ties between classes go to the class that comes first in ``classes_`` (as ``numpy.argmax``
and scikit-learn decide them); a ranking of classes orders equal scores the same way.

Imports nothing from the package, and torch only when it votes (the command line reads DINO's
settings from here to show its defaults).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DINO_KS", "DINO_TEMPERATURE", "class_votes", "ranked_classes"]

#: DINO's evaluation (Caron et al., 2021, ``eval_knn.py``): 20 neighbours reported, 10, 20,
#: 100 and 200 computed, temperature 0.07.
DINO_KS = (10, 20, 100, 200)
DINO_TEMPERATURE = 0.07
#: Query rows whose class scores are held at once.
_ROWS = 4096


def _scores(values, labels, n_classes, temperature, stops):
    """Yield ``(k, scores)`` for each ``k`` of ``stops`` (ascending): the float64 class scores
    of the first ``k`` neighbours, shape ``(n_rows, n_classes)``, updated in place."""
    import torch

    v = torch.as_tensor(np.asarray(values, dtype=np.float64))
    weights = torch.exp((v - v[:, :1]) / float(temperature))
    scores = torch.zeros((v.shape[0], n_classes), dtype=torch.float64)
    labels = torch.as_tensor(labels)
    done = 0
    for k in stops:
        scores.scatter_add_(1, labels[:, done:k], weights[:, done:k])
        done = k
        yield k, scores


def class_votes(values, rows, y_codes, n_classes, k, temperature):
    """Normalised class scores of each query row from its first ``k`` neighbours.

    Parameters
    ----------
    values, rows : ndarray of shape (n_queries, >= k)
        From :func:`~imagenet_cog._neighbors.search.cosine_topk`.
    y_codes : ndarray of int
        Class index of each training row.
    n_classes : int
    k : int
    temperature : float

    Returns
    -------
    ndarray of float64, shape (n_queries, n_classes)
        Rows sum to 1.

    Examples
    --------
    >>> import numpy as np
    >>> votes = class_votes(np.array([[0.9, 0.8, 0.1]]), np.array([[0, 1, 2]]),
    ...                     np.array([1, 0, 0]), 2, k=3, temperature=1.0)
    >>> votes.round(3).tolist()
    [[0.575, 0.425]]
    """
    out = np.empty((len(values), n_classes))
    for r0 in range(0, len(values), _ROWS):
        labels = np.asarray(y_codes)[rows[r0 : r0 + _ROWS, :k]]
        block = values[r0 : r0 + _ROWS, :k]
        for _, scores in _scores(block, labels, n_classes, temperature, [k]):
            out[r0 : r0 + len(labels)] = (scores / scores.sum(1, keepdim=True)).numpy()
    return out


def ranked_classes(values, rows, y_codes, n_classes, ks, temperature, top=5):
    """The ``top`` most voted classes of each query row, for each ``k`` of ``ks``, from one
    neighbour list.

    Parameters
    ----------
    values, rows : ndarray of shape (n_queries, >= max(ks))
    y_codes : ndarray of int
    n_classes : int
    ks : sequence of int
    temperature : float
    top : int
        Classes ranked (at most ``n_classes``).

    Returns
    -------
    dict
        ``{k: ndarray of int64, shape (n_queries, top)}``: class indices, most voted first;
        equal scores in class order.

    Examples
    --------
    >>> import numpy as np
    >>> values = np.array([[0.9, 0.8, 0.7]])
    >>> ranked = ranked_classes(values, np.array([[0, 1, 2]]), np.array([2, 0, 0]), 3,
    ...                         ks=(1, 3), temperature=1.0, top=2)
    >>> ranked[1].tolist(), ranked[3].tolist()
    ([[2, 0]], [[0, 2]])
    """
    import torch

    ks = sorted({int(k) for k in ks})
    top = min(int(top), n_classes)
    out = {k: np.empty((len(values), top), dtype=np.int64) for k in ks}
    for r0 in range(0, len(values), _ROWS):
        labels = np.asarray(y_codes)[rows[r0 : r0 + _ROWS, : ks[-1]]]
        block = values[r0 : r0 + _ROWS, : ks[-1]]
        for k, scores in _scores(block, labels, n_classes, temperature, ks):
            # A stable sort keeps equal scores in class order.
            order = torch.sort(scores, dim=1, descending=True, stable=True).indices
            out[k][r0 : r0 + len(labels)] = order[:, :top].numpy()
    return out
