"""Statistics between two models: is a difference larger than the seed-to-seed spread?

Stage "results". The protocol runs every cell with the same five seeds for every model, and a
seed fixes the same things for each: the validation split, the few-shot draw and the search's
sampler. Two models' scores are therefore *paired* by seed, and the paired difference removes
the part of the spread the seeds share. With per-seed records for both models this module
reports the mean paired difference, a Student-t confidence interval over the seeds and the
one-sided paired t-test of "A beats B" (both ``scipy.stats.ttest_rel``), and the exact
sign-flip (permutation) test, which
assumes nothing about the shape of the differences (with 5 seeds its smallest p-value is
1/32 = 0.031). Where one side has only published means and standard deviations (the paper's
models), the seeds cannot be paired: Welch's unpaired t-test from the summaries is used
(``scipy.stats.ttest_ind_from_stats``; a printed std below 0.05, such as the paper's many
0.0, read as 0.05), and the result says so. Across domains, p-values are adjusted with Holm's
step-down method.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass

import numpy as np

from ._grid import display_domain, display_shots, normalize_shots

__all__ = ["PairedComparison", "compare_models", "holm", "paired_comparison"]

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
        The two-sided confidence interval of the mean difference at ``confidence``.
    confidence : float
    p_value : float
        One-sided p-value of "a scores higher than b" (t-test).
    p_sign_flip : float
        One-sided exact sign-flip p-value (``nan`` for ``"welch"``).

    Examples
    --------
    >>> from imagenet_cog import Results
    >>> cells = [{"model": m, "domain": "L5", "shots": "all", "seed": s, "top1": base + d}
    ...          for m, base, noise in [("A", 51.0, (0.1, -0.2, 0.0, 0.2, -0.1)),
    ...                             ("B", 50.0, (0.0, 0.1, -0.1, 0.1, 0.0))]
    ...          for s, d in zip((22, 37, 45, 77, 93), noise)]
    >>> c = Results(cells).paired_difference("A", "B", "L5")
    >>> round(c.mean, 2), c.test, round(c.p_sign_flip, 3)
    (0.98, 'paired', 0.031)
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

    @property
    def n(self):
        """Number of paired seeds (0 for Welch's test)."""
        return len(self.seeds)


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
        if not d.std():  # every seed differs by as much: the t statistic is undefined
            p = 0.0 if mean > 0 else (1.0 if mean < 0 else 0.5)
            low = high = mean
        else:
            with warnings.catch_warnings():
                # Differences equal but for rounding make scipy warn of precision loss; their
                # tiny spread is the seeds' spread all the same, and gives the test.
                warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
                p = float(stats.ttest_rel(scores_a, scores_b, alternative="greater").pvalue)
                ci = stats.ttest_rel(scores_a, scores_b).confidence_interval(confidence)
            low, high = float(ci.low), float(ci.high)
        return PairedComparison(
            a,
            b,
            domain,
            shots,
            metric,
            "paired",
            tuple(common),
            tuple(float(x) for x in d),
            mean,
            low,
            high,
            confidence,
            p,
            sign_flip_p(d),
        )
    # One side (or both) published as mean ± std: Welch's test from the summaries.
    rows = [results._summary().get((m, domain, shots, metric)) for m in (a, b)]
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
    if se == 0:
        p, low, high = (0.0 if mean > 0 else 1.0 if mean < 0 else 0.5), mean, mean
    else:
        welch = stats.ttest_ind_from_stats(
            ma, sa, na, mb, sb, nb, equal_var=False, alternative="greater"
        )
        p = float(welch.pvalue)
        # The interval from the same summaries, on Welch-Satterthwaite's degrees of freedom
        # (scipy gives none from summaries).
        df = (va_n + vb_n) ** 2 / (va_n**2 / (na - 1) + vb_n**2 / (nb - 1))
        t_crit = float(stats.t.ppf(0.5 + confidence / 2, df))
        low, high = mean - t_crit * se, mean + t_crit * se
    return PairedComparison(
        a, b, domain, shots, metric, "welch", (), (), mean, low, high, confidence, p, math.nan
    )


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


def compare_models(results, a, b, shots="all", metric="top1", confidence=0.95, alpha=0.05):
    """The table of :meth:`Results.compare_models`: one row per domain both models have."""
    shots = normalize_shots(shots)
    domains = [
        d
        for d in results.domains
        if all(results._summary().get((m, d, shots, metric)) for m in (a, b))
    ]
    if not domains:
        raise ValueError(
            f"{a} and {b} share no domain with N={display_shots(shots)} ({metric}); "
            "give other --shots"
        )
    found = [paired_comparison(results, a, b, d, shots, metric, confidence) for d in domains]
    adjusted = holm([c.p_value for c in found])
    pct = f"{100 * confidence:g}%"
    header = ["domain", f"{a} - {b}", f"{pct} CI", "seeds", "p (t)", "p (sign-flip)", "p Holm", ""]
    rows = [header]
    for c, p_adj in zip(found, adjusted):
        verdict = f"{a} better" if p_adj < alpha else f"no evidence that {a} is better"
        flip = "-" if math.isnan(c.p_sign_flip) else f"{c.p_sign_flip:.3f}"
        rows.append(
            [
                display_domain(c.domain),
                f"{c.mean:+.2f}",
                f"[{c.ci_low:+.2f}, {c.ci_high:+.2f}]",
                str(c.n) if c.test == "paired" else "Welch",
                f"{c.p_value:.3g}",
                flip,
                f"{p_adj:.3g}",
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
    kind = {c.test for c in found}
    how = (
        "paired by seed: one-sided paired t-test and exact sign-flip test"
        if kind == {"paired"}
        else "Welch's unpaired t-test from mean ± std where a model has no per-seed records"
    )
    title = (
        f"{a} vs {b}, {metric.replace('top', 'top-')} (points), "
        f"N={display_shots(shots)}; {how}; Holm-adjusted over {len(found)} domain(s), "
        f"alpha {alpha:g}"
    )
    return title + "\n" + "\n".join(lines)
