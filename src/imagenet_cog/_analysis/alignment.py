"""Alignment and uniformity of a feature space (Wang & Isola, 2020), per domain.

Public names are re-exported by :mod:`imagenet_cog.analysis`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .._device import resolve_analysis_device
from .checks import (
    _as_tensor,
    _check_labels,
    _finite_float_features,
    _float_dtype,
    _json_float,
    _torch,
)
from .kmeans import _sq_norms


# ------------------------------------------------- alignment and uniformity
@dataclass(frozen=True)
class AlignmentUniformity:
    """What :func:`alignment_uniformity` returns.

    Attributes
    ----------
    alignment : float
        Mean squared distance between distinct samples of the same concept
        (lower: tighter concepts).
    uniformity : float
        ``log`` of the mean of ``exp(-t·d²)`` over pairs of distinct samples
        (lower, i.e. more negative: more uniformly spread).
    n_samples : int
    n_positive_pairs : int
        Unordered same-concept pairs behind the alignment.
    t : float
    normalized : bool
        Whether the features were l2-normalised first.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import alignment_uniformity
    >>> au = alignment_uniformity(np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]]), [0, 0, 1, 1])
    >>> au.alignment, au.n_samples, au.n_positive_pairs
    (2.0, 4, 2)
    """

    alignment: float
    uniformity: float
    n_samples: int
    n_positive_pairs: int
    t: float
    normalized: bool

    def to_dict(self):
        """The fields, JSON-safe."""
        return {
            "alignment": _json_float(self.alignment),
            "uniformity": _json_float(self.uniformity),
            "n_samples": self.n_samples,
            "n_positive_pairs": self.n_positive_pairs,
            "t": self.t,
            "normalized": self.normalized,
        }


def alignment_uniformity(X, y, *, t=2.0, normalize=True, device=None, chunk_size=None):
    """Alignment and uniformity of features (Wang & Isola, 2020; the paper's first version, Sec. 4.3).

    - alignment: the mean of ``||f(x) - f(y)||²`` over pairs of distinct
      samples x ≠ y of the same concept. Every pair weighs the same, so a
      concept with more samples weighs more (with the benchmark's 50 test
      images per concept, this is also the mean of per-concept alignments).
      It is computed exactly without forming pairs:
      ``Σ_{i,j∈c} ||x_i - x_j||² = 2 n_c Σ_{i∈c} ||x_i - μ_c||²``.
    - uniformity: ``log mean exp(-t ||f(x) - f(y)||²)`` over the
      ``n(n-1)/2`` pairs of distinct samples ``i < j``, exactly what Wang &
      Isola's reference code computes,
      ``torch.pdist(x).pow(2).mul(-t).exp().mean().log()`` (``pdist`` yields
      the distinct pairs only); the mean over ordered pairs ``i ≠ j`` is the
      same. The diagonal ``i = j`` is left out: each of its ``n`` terms is
      ``exp(0) = 1`` whatever the features, which would pull small sets
      towards 0 (less uniform). Two different samples with equal features do
      count. The sum runs over blocks of pairs with a log-sum-exp, so 50,000
      samples fit in memory and far-apart features do not underflow to
      ``log(0)``.

    The CoG paper's Fig. 10 appears to plot ``-uniformity`` (positive values
    from 1.8 to 3.1); this function returns the quantity as defined above.

    Parameters
    ----------
    X : array-like or torch.Tensor, shape (n_samples, n_features)
    y : array-like, shape (n_samples,)
        Concept labels.
    t : float
        Temperature of the uniformity kernel (2 in the paper).
    normalize : bool
        l2-normalise the features first, as the benchmark does before any
        classifier and as Wang & Isola assume (features on the hypersphere).
    device : str or torch.device, optional
        Defaults to CUDA when available, else the CPU. The ``n²/2`` dot
        products dominate: 50,000 × 2048 features take one to a few minutes
        on 2 CPU cores, seconds on a GPU.
    chunk_size : int, optional
        Rows per block of pairs (default 8192 on a GPU, 4096 on the CPU:
        a few 64 MB blocks at a time in float32).

    Returns
    -------
    AlignmentUniformity

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import alignment_uniformity
    >>> X = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]])
    >>> au = alignment_uniformity(X, [0, 0, 1, 1], device="cpu")
    >>> au.alignment  # both same-concept pairs are at distance² 2
    2.0
    >>> # 4 pairs at distance² 2 and 2 at distance² 4
    >>> bool(np.isclose(au.uniformity, np.log((4 * np.exp(-4) + 2 * np.exp(-8)) / 6)))
    True
    """
    torch = _torch()
    X = _finite_float_features(X, "X")
    n = X.shape[0]
    y = _check_labels(y, n, "y", "X")
    if n < 2:
        raise ValueError("alignment and uniformity need at least 2 samples")
    if not t > 0:
        raise ValueError(f"t must be positive, got {t}")
    _, codes, sizes = np.unique(y, return_inverse=True, return_counts=True)
    n_pos = int((sizes * (sizes - 1) // 2).sum())
    if n_pos == 0:
        raise ValueError("no concept has 2 samples: alignment needs same-concept pairs")
    dev = resolve_analysis_device(device)
    with torch.no_grad():
        Xt = _as_tensor(X, dev, _float_dtype(X, None))
        if normalize:
            norms = torch.linalg.vector_norm(Xt, dim=1, keepdim=True)
            if bool((norms == 0).any()):
                raise ValueError("X has all-zero rows, which cannot be l2-normalised")
            Xt = Xt / norms
        rows = int(chunk_size) if chunk_size else (8192 if dev.type == "cuda" else 4096)
        if rows < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        # Alignment from per-concept scatter around the concept mean, in float64
        # and by blocks of rows (two passes: the means, then the scatter).
        codes_t = torch.as_tensor(codes, device=dev)
        sizes_t = torch.as_tensor(sizes, dtype=torch.float64, device=dev)
        means = torch.zeros((len(sizes), Xt.shape[1]), dtype=torch.float64, device=dev)
        for s in range(0, n, rows):
            means.index_add_(0, codes_t[s : s + rows], Xt[s : s + rows].double())
        means /= sizes_t[:, None]
        sse = torch.zeros(len(sizes), dtype=torch.float64, device=dev)
        for s in range(0, n, rows):
            c = codes_t[s : s + rows]
            sse.index_add_(0, c, ((Xt[s : s + rows].double() - means[c]) ** 2).sum(1))
        alignment = float((2 * sizes_t * sse).sum() / (sizes_t * (sizes_t - 1)).sum())
        # Uniformity over the blocks of the upper triangle; an off-diagonal
        # block stands for both (i, j) and (j, i), hence its + log 2.
        sq = _sq_norms(Xt, rows)
        parts = []
        for i in range(0, n, rows):
            xi, si = Xt[i : i + rows], sq[i : i + rows]
            for j in range(i, n, rows):
                d2 = torch.addmm(
                    si[:, None] + sq[None, j : j + rows], xi, Xt[j : j + rows].T, alpha=-2
                ).clamp_min_(0)
                v = d2.mul_(-t)
                if i == j:
                    v.fill_diagonal_(-math.inf)
                lse = torch.logsumexp(v.flatten(), 0).double()
                parts.append(lse if i == j else lse + math.log(2))
        uniformity = float(torch.logsumexp(torch.stack(parts), 0)) - math.log(n * (n - 1))
    return AlignmentUniformity(
        alignment=alignment,
        uniformity=uniformity,
        n_samples=n,
        n_positive_pairs=n_pos,
        t=float(t),
        normalized=bool(normalize),
    )


def alignment_uniformity_per_domain(domains, **kwargs):
    """:func:`alignment_uniformity` of each domain, as plain dictionaries.

    Parameters
    ----------
    domains : mapping of str to (X, y)
        E.g. ``{"in1k": (X, y), "l1": (X1, y1), ...}`` with test features.
    **kwargs
        Passed to :func:`alignment_uniformity`.

    Returns
    -------
    dict of str to dict
        ``{domain: {"alignment": ..., "uniformity": ..., ...}}`` in the
        order given, ready for :func:`relative_to` and :func:`plot_analysis`.

    Examples
    --------
    >>> import numpy as np
    >>> from imagenet_cog.analysis import alignment_uniformity_per_domain, relative_to
    >>> square = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]])
    >>> scores = alignment_uniformity_per_domain(
    ...     {"in1k": (square, [0, 1, 0, 1]), "l1": (square, [0, 0, 1, 1])}, device="cpu")
    >>> scores["in1k"]["alignment"], scores["l1"]["alignment"]  # opposite vs adjacent pairs
    (4.0, 2.0)
    >>> relative_to(scores, metrics=["alignment"])["l1"]
    {'alignment': -2.0}
    """
    if not isinstance(domains, Mapping) or not domains:
        raise ValueError("domains must be a non-empty mapping {domain: (X, y)}")
    out = {}
    for name, pair in domains.items():
        try:
            X, y = pair
        except (TypeError, ValueError):
            raise ValueError(f"domain {name!r}: expected a pair (X, y)") from None
        out[name] = alignment_uniformity(X, y, **kwargs).to_dict()
    return out
