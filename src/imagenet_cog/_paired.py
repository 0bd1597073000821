"""Statistics between two models: is a difference larger than the seed-to-seed spread?

Stage "results". The protocol runs every cell with the same five seeds for every model, and a
seed fixes the same things for each: the validation split, the few-shot draw and the search's
sampler. Two models' scores are therefore *paired* by seed, and the paired difference removes
the part of the spread the seeds share. What varies between the seeds is the protocol's own
randomness; the test images are the same for every seed and every model, so the tests below
say how sure a difference is over that randomness, not over another draw of test images.

With per-seed records for both models this module reports the mean paired difference, the
one-sided paired t-test of "A beats B" (``scipy.stats.ttest_rel``) with the one-sided lower
confidence bound at the same level (the verdict and the bound agree: the bound is above 0
exactly when the test rejects), and the exact sign-flip (permutation) test, which assumes
nothing about the shape of the differences (with 5 seeds its smallest p-value is
1/32 = 0.031). Where one side has only published means and standard deviations (the paper's
models), the seeds cannot be paired: Welch's unpaired t-test from the summaries is used
(``scipy.stats.ttest_ind_from_stats``; a printed std below 0.05, such as the paper's many
0.0, read as 0.05), and the result says so.

Across domains, p-values are adjusted with Holm's step-down method, and the bounds are the
simultaneous lower confidence bounds compatible with it (Strassburger and Bretz, *Statistics
in Medicine* 27, 2008): a domain where Holm finds A better has the bound "above 0" (the
bound is informative only when every domain is found better), the others the bound of the
t-test at the level Holm left for them. The verdict of a row and its bound never disagree.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass

import numpy as np

from ._grid import Protocol, display_domain, display_shots, normalize_shots

__all__ = ["PairedComparison", "compare_models", "holm", "holm_bounds", "paired_comparison"]

#: The smallest standard deviation a summary (mean ± std) is read with: half the paper's
#: last printed digit, since a printed 0.0 means below 0.05.
PUBLISHED_STD_FLOOR = 0.05


@dataclass(frozen=True)
class PairedComparison:
    """How much model ``a`` beats model ``b`` in one cell, and how sure that is.

    Attributes
    ----------
    a, b : str
        The two models; differences are ``a - b``.
    domain : str
    shots : int or "all"
    metric : str
    test : {"paired", "welch"}
        ``"paired"``: per-seed records of both models, paired by seed; ``"welch"``: one side
        has only a published mean ± std, so the test is Welch's unpaired t-test.
    seeds : tuple of int
        The seeds both models share (empty for ``"welch"``).
    differences : tuple of float
        Per-seed differences ``a - b`` in points (empty for ``"welch"``).
    mean : float
        Mean difference in points.
    ci_low, ci_high : float
        The one-sided confidence interval of the mean difference at ``confidence``, the
        side of the test: ``ci_low`` is the lower bound, ``ci_high`` is ``inf``. ``ci_low``
        is above 0 exactly when ``p_value`` is below ``1 - confidence``.
    confidence : float
    p_value : float
        One-sided p-value of "a scores higher than b" (t-test).
    p_sign_flip : float
        One-sided exact sign-flip p-value (``nan`` for ``"welch"``).
    se : float
        Standard error of ``mean``.
    df : float
        Degrees of freedom of the t-test (Welch-Satterthwaite's for ``"welch"``).

    Examples
    --------
    >>> from imagenet_cog import Results
    >>> cells = [{"model": m, "domain": "L5", "shots": "all", "seed": s, "top1": base + d}
    ...          for m, base, noise in [("A", 51.0, (0.1, -0.2, 0.0, 0.2, -0.1)),
    ...                             ("B", 50.0, (0.0, 0.1, -0.1, 0.1, 0.0))]
    ...          for s, d in zip((22, 37, 45, 77, 93), noise)]
    >>> c = Results(cells).paired_difference("A", "B", "L5")
    >>> round(c.mean, 2), c.test, round(c.p_sign_flip, 3), round(c.ci_low, 2), c.ci_high
    (0.98, 'paired', 0.031, 0.81, inf)
    """

    a: str
    b: str
    domain: str
    shots: object
    metric: str
    test: str
    seeds: tuple
    differences: tuple
    mean: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    p_sign_flip: float
    se: float = math.nan
    df: float = math.nan

    @property
    def n(self):
        """Number of paired seeds (0 for Welch's test)."""
        return len(self.seeds)

    def lower_bound(self, confidence):
        """The one-sided lower confidence bound of the mean difference at ``confidence``."""
        from scipy import stats

        if not self.se > 0:  # every seed differs by as much: the difference is that
            return self.mean
        return self.mean - float(stats.t.ppf(confidence, self.df)) * self.se


def _per_seed(results, model, domain, shots, metric):
    values = {}
    for rec in results.records:
        if (rec["model"], rec["domain"], rec["shots"]) != (model, domain, shots):
            continue
        if rec.get(metric) is None or rec.get("seed") is None:
            continue
        if rec["seed"] in values:
            raise ValueError(
                f"{model} has seed {rec['seed']} twice on {display_domain(domain)}, "
                f"N={display_shots(shots)}: its cells cannot be paired by seed"
            )
        values[rec["seed"]] = float(rec[metric])
    return values


def sign_flip_p(differences):
    """Exact one-sided p-value of a mean difference above 0, by flipping signs.

    Every one of the ``2**n`` sign patterns is equally likely when the two models do not
    differ; the p-value is the share of patterns whose mean is at least the observed one.
    """
    d = np.asarray(differences, dtype=float)
    if len(d) > 20:  # 2**20 patterns is the most enumerated exactly
        raise ValueError("the exact sign-flip test enumerates at most 20 seeds")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    means = signs @ d / len(d)
    observed = d.mean()
    return float(np.mean(means >= observed - 1e-12 * max(1.0, abs(observed))))


def paired_comparison(results, a, b, domain, shots="all", metric="top1", confidence=0.95):
    """Compare two models on one cell; see :meth:`Results.paired_difference`."""
    from scipy import stats

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    shots = normalize_shots(shots)
    where = f"{display_domain(domain)}, N={display_shots(shots)}"
    for model in (a, b):
        if model not in results.models:
            raise ValueError(f"unknown model {model!r}; have {results.models}")
    va = _per_seed(results, a, domain, shots, metric)
    vb = _per_seed(results, b, domain, shots, metric)
    common = sorted(set(va) & set(vb))
    if va and vb:
        if len(common) < 2:
            raise ValueError(
                f"{a} and {b} share {len(common)} seed(s) on {where} "
                f"({a}: {sorted(va)}; {b}: {sorted(vb)}): pairing needs at least 2"
            )
        scores_a, scores_b = (np.array([v[s] for s in common]) for v in (va, vb))
        d = scores_a - scores_b
        mean = float(d.mean())
        se, df = float(d.std(ddof=1) / math.sqrt(len(d))), float(len(d) - 1)
        if not d.std():  # every seed differs by as much: the t statistic is undefined
            p, se = (0.0 if mean > 0 else (1.0 if mean < 0 else 0.5)), 0.0
        else:
            with warnings.catch_warnings():
                # Differences equal but for rounding make scipy warn of precision loss; their
                # tiny spread is the seeds' spread all the same, and gives the test.
                warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
                p = float(stats.ttest_rel(scores_a, scores_b, alternative="greater").pvalue)
        found = PairedComparison(
            a,
            b,
            domain,
            shots,
            metric,
            "paired",
            tuple(common),
            tuple(float(x) for x in d),
            mean,
            math.nan,
            math.inf,
            confidence,
            p,
            sign_flip_p(d),
            se,
            df,
        )
        return _with_bound(found)
    # One side (or both) published as mean ± std: Welch's test from the summaries.
    rows = [results.cell(m, domain, shots, metric) for m in (a, b)]
    for model, row in zip((a, b), rows):
        if row is None:
            raise ValueError(f"{model} has no {metric} score on {where}")
        if row["n"] < 2:
            raise ValueError(f"{model} has {row['n']} seed(s) on {where}: a test needs 2 or more")
    # Published stds are rounded to 0.1 (the paper prints many as 0.0): read each as at least
    # the rounding's bound, 0.05, so the test is conservative rather than certain. They are
    # population stds (ddof=0): correct to the sample ones.
    sa, sb = (max(r["std"], PUBLISHED_STD_FLOOR) * math.sqrt(r["n"] / (r["n"] - 1)) for r in rows)
    (ma, na), (mb, nb) = ((r["mean"], r["n"]) for r in rows)
    mean = ma - mb
    va_n, vb_n = sa**2 / na, sb**2 / nb
    se = math.sqrt(va_n + vb_n)
    # Welch-Satterthwaite's degrees of freedom, as scipy's test uses them.
    df = (va_n + vb_n) ** 2 / (va_n**2 / (na - 1) + vb_n**2 / (nb - 1))
    welch = stats.ttest_ind_from_stats(
        ma, sa, na, mb, sb, nb, equal_var=False, alternative="greater"
    )
    found = PairedComparison(
        a,
        b,
        domain,
        shots,
        metric,
        "welch",
        (),
        (),
        mean,
        math.nan,
        math.inf,
        confidence,
        float(welch.pvalue),
        math.nan,
        se,
        df,
    )
    return _with_bound(found)


def _with_bound(found):
    """``found`` with its one-sided lower bound at its own confidence."""
    import dataclasses

    return dataclasses.replace(found, ci_low=found.lower_bound(found.confidence))


def holm(p_values):
    """Holm's step-down adjustment of several p-values (controls the family-wise error).

    Examples
    --------
    >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03])]
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return [float(x) for x in adjusted]


def holm_bounds(found, alpha=0.05):
    """Simultaneous one-sided lower bounds compatible with Holm's procedure at ``alpha``.

    Strassburger and Bretz (2008): where Holm rejects some but not all of the hypotheses
    "a does not beat b", the rejected ones get the bound 0 (the difference is above 0, no
    more is claimed) and the others the bound of their test at level ``alpha / k``, ``k``
    the number not rejected; where Holm rejects every one, each gets its bound at level
    ``alpha / m``, floored at 0. The bounds hold together with probability ``1 - alpha``,
    and a bound is above 0 exactly where Holm rejects.

    Parameters
    ----------
    found : list of PairedComparison
    alpha : float

    Returns
    -------
    list of (float, bool)
        ``(bound, rejected)`` per comparison.

    Examples
    --------
    >>> from imagenet_cog._paired import PairedComparison, holm_bounds
    >>> def row(mean, p):
    ...     return PairedComparison("A", "B", "L5", "all", "top1", "paired", (), (), mean,
    ...                             0.0, float("inf"), 0.95, p, float("nan"), 0.1, 4.0)
    >>> [(round(b, 2), r) for b, r in holm_bounds([row(1.0, 0.0001), row(0.1, 0.2)])]
    [(0.0, True), (-0.11, False)]
    """
    m = len(found)
    adjusted = holm([c.p_value for c in found])
    rejected = [p < alpha for p in adjusted]
    if all(rejected):
        return [(max(0.0, c.lower_bound(1 - alpha / m)), True) for c in found]
    k = m - sum(rejected)
    return [
        (0.0, True) if r else (c.lower_bound(1 - alpha / k), False) for c, r in zip(found, rejected)
    ]


def protocol_mismatch(results, a, b):
    """``["setting: value (a) vs value (b)"]`` where the recorded protocols of ``a`` and ``b``
    differ (the settings two runs must share, :meth:`Protocol.compared
    <imagenet_cog._grid.Protocol.compared>`, and the concepts and test images of each domain
    both record); ``[]`` when they agree or are not recorded. The seeds are paired cell by
    cell."""
    protocols = results.meta.get("protocol") or {}
    pa, pb = protocols.get(a) or {}, protocols.get(b) or {}
    found = [f"{key} {x!r} ({a}) vs {y!r} ({b})" for key, x, y in Protocol.differences(pa, pb)]
    da, db = pa.get("data") or {}, pb.get("data") or {}
    for domain in sorted(set(da) & set(db)):
        for key, what in (("classes_sha256", "concepts"), ("test_ids_sha256", "test images")):
            x, y = (da[domain] or {}).get(key), (db[domain] or {}).get(key)
            if x is not None and y is not None and x != y:
                found.append(f"other {what} on {display_domain(domain)}")
    return found


def compare_models(results, a, b, shots="all", metric="top1", alpha=0.05):
    """The table of :meth:`Results.compare_models`: one row per domain both models have."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    shots = normalize_shots(shots)
    domains = [d for d in results.domains if all(results.cell(m, d, shots, metric) for m in (a, b))]
    if not domains:
        raise ValueError(
            f"{a} and {b} share no domain with N={display_shots(shots)} ({metric}); "
            "give other --shots"
        )
    found = [paired_comparison(results, a, b, d, shots, metric, 1 - alpha) for d in domains]
    adjusted = holm([c.p_value for c in found])
    bounds = holm_bounds(found, alpha)
    level = f"{100 * (1 - alpha):g}%"
    header = [
        "domain",
        f"{a} - {b}",
        f"{level} bound",
        "seeds",
        "p (t)",
        "p Holm",
        "p (sign-flip)",
        "",
    ]
    rows = [header]
    for c, p_adj, (bound, better) in zip(found, adjusted, bounds):
        verdict = f"{a} better" if better else f"no evidence that {a} is better"
        flip = "-" if math.isnan(c.p_sign_flip) else f"{c.p_sign_flip:.3f}"
        shown = "> 0" if better and bound == 0 else f"{bound:+.2f}"
        rows.append(
            [
                display_domain(c.domain),
                f"{c.mean:+.2f}",
                shown,
                str(c.n) if c.test == "paired" else "Welch",
                f"{c.p_value:.3g}",
                f"{p_adj:.3g}",
                flip,
                verdict,
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i in (0, 7) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]
    kinds = {c.test for c in found}
    if kinds == {"paired"}:
        seeds = sorted({c.n for c in found})
        test = f"paired t-test over {'/'.join(map(str, seeds))} seeds"
    elif kinds == {"welch"}:
        test = "Welch's t-test from the published mean ± std"
    else:
        test = "paired t-test, Welch's from mean ± std where a model has no seeds"
    title = (
        f"{a} vs {b}, {metric.replace('top', 'top-')} (points), N={display_shots(shots)}: "
        f"one-sided test of '{a} better' ({test}), Holm-adjusted over {len(found)} domain"
        f"{'s' * (len(found) != 1)} at alpha {alpha:g}; bound: simultaneous one-sided "
        f"{level} lower bound compatible with Holm"
    )
    notes = [
        (
            "Over the seeds: a seed fixes the validation split, the few-shot draw and the "
            "search; the test images are fixed, the same for both models."
        )
    ]
    if any(better and bound == 0 for bound, better in bounds):
        notes.append(
            f"'> 0': Holm finds {a} better there and claims no more: with every domain found "
            f"better, each bound is its t-test's at level alpha/{len(found)}, floored at 0."
            if all(better for _, better in bounds)
            else f"'> 0': where Holm finds {a} better in some domains but not all, the "
            "compatible bound of those domains is 0."
        )
    paired = [c for c in found if c.test == "paired"]
    if paired:
        n = min(c.n for c in paired)
        smallest = min(1.0, len(found) * 2.0**-n)
        if smallest >= alpha:
            notes.append(
                f"The sign-flip test cannot pass here: with {n} seeds its smallest p is "
                f"1/{2**n} = {2.0**-n:.3f}, {smallest:.2f} after Holm over {len(found)} "
                f"domains, above alpha {alpha:g}; the verdict is the t-test's."
            )
        else:
            notes.append(
                "The sign-flip p-values are shown unadjusted; the verdict is the t-test's."
            )
    mismatch = protocol_mismatch(results, a, b)
    parts = [title]
    if mismatch:
        parts.append(
            f"!!! {a} and {b} were run with different protocols ({'; '.join(mismatch)}): the "
            "differences below mix the models with the protocols !!!"
        )
    return "\n".join([*parts, *lines, *notes])
