"""Statistics a reviewer accepts: the verdict of ``compare_models`` and ``report --compare`` and
its bound say the same thing at the same level, the table names its test and what the test is
over, and runs of different protocols are flagged, under the comparability verdict."""

import json
import math
import re

import numpy as np
import pytest
from scipy import stats

from imagenet_cog import Results, reference_results
from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS

#: How the difference of the issue's example was spread over the seeds: mean +0.20, a
#: two-sided 95% interval of about [-0.04, +0.44] and a one-sided p of about 0.04.
SPREAD = 0.2 + 0.9 * np.array([0.25, -0.25, 0.1, -0.2, 0.1])


def _default_shape(diff=None, rng=None):
    """Two models on the default protocol's shape (every domain, every shots value beside
    "all", five seeds); ``diff`` sets A - B on L5 with all the images, seed by seed."""
    rng = rng or np.random.default_rng(0)
    cells = []
    for d, domain in enumerate(DOMAINS):
        for shots in SHOTS:
            base = 70.0 - 5 * d - (0 if shots == "all" else 20 / math.log2(2 * shots))
            b = base + rng.normal(0, 0.3, size=5)
            gap = rng.normal(0.1, 0.3, size=5)
            if diff is not None and (domain, shots) == ("L5", "all"):
                gap = np.asarray(diff)
            for i, seed in enumerate(SEEDS):
                cells.append(
                    {
                        "model": "A",
                        "domain": domain,
                        "shots": shots,
                        "seed": seed,
                        "top1": b[i] + gap[i],
                    }
                )
                cells.append(
                    {"model": "B", "domain": domain, "shots": shots, "seed": seed, "top1": b[i]}
                )
    return Results(cells)


def _rows(text):
    """``{domain: {column: cell}}`` of a compare_models table."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("domain"))
    header = re.split(r"\s{2,}", lines[at].strip())
    rows = {}
    for line in lines[at + 1 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if not cells or cells[0] not in ("IN-1K", "L1", "L2", "L3", "L4", "L5"):
            break
        rows[cells[0]] = dict(zip([*header, "verdict"], cells))
    return rows


def _bound(cell):
    return 0.0 if cell == "> 0" else float(cell)


def test_a_one_sided_p_below_alpha_comes_with_a_bound_above_zero():
    # The row: "A better" beside a two-sided interval holding 0.
    res = _default_shape(diff=SPREAD).subset(domains=["L5"])
    a = [r["top1"] for r in res.records if r["model"] == "A" and r["shots"] == "all"]
    b = [r["top1"] for r in res.records if r["model"] == "B" and r["shots"] == "all"]
    assert stats.ttest_rel(a, b, alternative="greater").pvalue < 0.05
    assert stats.ttest_rel(a, b).confidence_interval(0.95).low < 0
    row = _rows(res.compare_models("A", "B"))["L5"]
    assert row["verdict"] == "A better"
    assert _bound(row["95% bound"]) > 0
    one_sided = stats.ttest_rel(a, b, alternative="greater").confidence_interval(0.95)
    assert float(row["95% bound"]) == pytest.approx(one_sided.low, abs=0.006)


@pytest.mark.parametrize("draw", range(40))
def test_every_rows_verdict_and_bound_agree(draw):
    rng = np.random.default_rng(draw)
    res = _default_shape(rng=rng)
    for shots in ("all", 1):
        rows = _rows(res.compare_models("A", "B", shots=shots))
        assert len(rows) == 6
        for domain, row in rows.items():
            better = row["verdict"] == "A better"
            assert better == (row["95% bound"] == "> 0" or _bound(row["95% bound"]) > 0), (
                domain,
                row,
            )
            assert better == (float(row["p Holm"]) < 0.05), row


def test_the_bounds_hold_together_at_their_level():
    # No true difference anywhere: the six bounds are above 0 together in at most about
    # 5% of repeated experiments (here 2,000 of them).
    from imagenet_cog._paired import PairedComparison, holm_bounds

    rng = np.random.default_rng(1)
    misses = 0
    for _ in range(2000):
        found = []
        for _domain in range(6):
            d = rng.normal(0, 1, size=5)
            se = d.std(ddof=1) / math.sqrt(5)
            p = stats.ttest_1samp(d, 0, alternative="greater").pvalue
            found.append(
                PairedComparison(
                    "A", "B", "L5", "all", "top1", "paired", (), (), d.mean(), 0.0, math.inf,
                    0.95, p, math.nan, se, 4.0,
                )
            )  # fmt: skip
        misses += any(bound > 0 for bound, _ in holm_bounds(found, 0.05))
    assert misses / 2000 < 0.065


def test_the_title_names_the_test_its_side_and_level():
    text = _default_shape().compare_models("A", "B")
    title = text.splitlines()[0]
    assert "one-sided test of 'A better' (paired t-test over 5 seeds)" in title
    assert "Holm-adjusted over 6 domains at alpha 0.05" in title
    assert "simultaneous one-sided 95% lower bound compatible with Holm" in title
    welch = reference_results(["ResNet50", "s-DINO"]).compare_models("s-DINO", "ResNet50")
    assert "(Welch's t-test from the published mean ± std)" in welch.splitlines()[0]
    assert not any(line.startswith("The sign-flip") for line in welch.splitlines())


def test_the_table_says_what_the_test_is_over_and_that_sign_flips_cannot_pass():
    lines = _default_shape().compare_models("A", "B").splitlines()
    assert (
        "Over the seeds: a seed fixes the validation split, the few-shot draw and the search; "
        "the test images are fixed, the same for both models."
    ) in lines
    assert (
        "The sign-flip test cannot pass here: with 5 seeds its smallest p is 1/32 = 0.031, "
        "0.19 after Holm over 6 domains, above alpha 0.05; the verdict is the t-test's."
    ) in lines


def test_paired_difference_gives_the_one_sided_bound_of_its_test():
    res = _default_shape(diff=SPREAD)
    c = res.paired_difference("A", "B", "L5")
    ref = stats.ttest_rel(
        [r["top1"] for r in res.records if (r["model"], r["domain"], r["shots"]) == ("A", "L5", "all")],
        [r["top1"] for r in res.records if (r["model"], r["domain"], r["shots"]) == ("B", "L5", "all")],
        alternative="greater",
    )  # fmt: skip
    ci = ref.confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low), math.inf)
    assert (c.p_value < 0.05) == (c.ci_low > 0)


# ------------------------------------------------------- runs of different protocols
def _run(folder, model, epochs, shift=0.0):
    from test_protocol import synthetic_features

    from imagenet_cog import evaluate

    features = {d: synthetic_features()[d] for d in ("L1", "L5")}
    evaluate(
        features,
        domains=["L1", "L5"],
        shots=[1, "all"],
        seeds=[22, 37, 45],
        n_trials=2,
        n_startup_trials=2,
        epochs=epochs,
        batch_size=64,
        device="cpu",
        progress=False,
        out=folder,
        model=model,
    )
    return folder


@pytest.fixture(scope="module")
def two_protocols(tmp_path_factory):
    root = tmp_path_factory.mktemp("protocols")
    return _run(root / "short", "short", 2), _run(root / "long", "long", 5)


def test_runs_of_different_protocols_are_flagged_when_paired(two_protocols):
    short, long = two_protocols
    both = Results.load(short).merge(Results.load(long))
    text = both.compare_models("short", "long", shots=1)
    assert (
        "!!! short and long were run with different protocols (epochs 2 (short) vs 5 (long)): "
        "the differences below mix the models with the protocols !!!"
    ) in text.splitlines()
    same = Results.load(short).merge(Results.load(short, model="again"))
    assert "different protocols" not in same.compare_models("short", "again")


def test_report_compare_prints_the_verdict_and_the_protocol_flag(two_protocols, capsys):
    from imagenet_cog.cli import main

    short, long = two_protocols
    assert main(["report", str(short), str(long), "--compare", "short,long"]) in (0, None)
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0] == "!!! NOT COMPARABLE with the paper: short, long !!!"
    assert any(line.startswith("short vs long, top-1 (points), N=All: one-sided") for line in lines)
    assert any("different protocols (epochs 2 (short) vs 5 (long))" in line for line in lines)
    assert "Caveats of the models not comparable, beside their deviations above:" in printed
    assert "stay comparable" not in printed


def test_report_compare_of_runs_made_alike_has_no_flag(tmp_path, capsys):
    from imagenet_cog.cli import main

    res = _default_shape()
    out = tmp_path / "run"
    out.mkdir()
    (out / "runs.jsonl").write_text("\n".join(json.dumps(r) for r in res.records) + "\n")
    assert main(["report", str(out), "--compare", "A,B", "--shots", "8"]) in (0, None)
    printed = capsys.readouterr().out
    assert "A vs B, top-1 (points), N=8" in printed
    assert "different protocols" not in printed
    assert printed.startswith("!!! NOT COMPARABLE with the paper: A, B !!!")


def test_with_every_domain_found_better_a_floored_bound_says_why():
    # Five clear domains and one (L5) whose p (about 0.04) passes Holm's last step only.
    rng = np.random.default_rng(3)
    cells = []
    for domain in DOMAINS:
        gaps = SPREAD if domain == "L5" else 2.0 + rng.normal(0, 0.1, size=5)
        for seed, gap in zip(SEEDS, gaps):
            cells.append(
                {"model": "A", "domain": domain, "shots": "all", "seed": seed, "top1": 50 + gap}
            )
            cells.append(
                {"model": "B", "domain": domain, "shots": "all", "seed": seed, "top1": 50.0}
            )
    text = Results(cells).compare_models("A", "B")
    rows = _rows(text)
    assert all(r["verdict"] == "A better" for r in rows.values())
    assert rows["L5"]["95% bound"] == "> 0"
    assert (
        "'> 0': Holm finds A better there and claims no more: with every domain found better, "
        "each bound is its t-test's at level alpha/6, floored at 0."
    ) in text.splitlines()


@pytest.mark.parametrize("p", [0.04996, 0.049951, 0.05004, 0.050049])
def test_a_p_value_at_the_rounding_boundary_is_printed_on_its_verdicts_side(p):
    # One domain (Holm leaves p as it is) whose p rounds to 0.05 at three digits: the
    # printed p and the verdict never contradict each other.
    z = np.array([1.0, -1.0, 0.5, -0.5, 0.0])
    se = z.std(ddof=1) / math.sqrt(5)
    mean = stats.t.isf(p, 4) * se
    cells = [
        {"model": m, "domain": "L5", "shots": "all", "seed": s, "top1": 50.0 + v}
        for s, gap in zip(SEEDS, mean + z)
        for m, v in (("A", gap), ("B", 0.0))
    ]
    res = Results(cells)
    exact = res.paired_difference("A", "B", "L5").p_value
    assert exact == pytest.approx(p, rel=1e-6) and f"{exact:.3g}" == "0.05"
    row = _rows(res.compare_models("A", "B"))["L5"]
    better = row["verdict"] == "A better"
    assert better == (exact < 0.05)
    for column in ("p (t)", "p Holm"):
        assert (float(row[column]) < 0.05) == better, row
    assert better == (row["95% bound"] == "> 0" or _bound(row["95% bound"]) > 0), row


def _subset_folder(folder, model, n_classes, n_test, top1, classes="0"):
    """A run of the default seeds on every domain with all the images, on a subset of
    ``n_classes`` concepts and ``n_test`` test images per domain, as its config.json says."""
    from helpers import write_run_folder

    cells = [
        {"model": model, "domain": d, "shots": "all", "seed": s, "top1": top1 + 0.1 * k}
        for d in DOMAINS
        for k, s in enumerate(SEEDS)
    ]
    data = {
        d: {
            "n_classes": n_classes,
            "n_test": n_test,
            "classes_sha256": classes * 64,
            "wnid_labels": True,
            "n_train": 30,
        }
        for d in DOMAINS
    }
    config = {"levels": "official", "data": data, "protocol": {"normalize": True}}
    return write_run_folder(folder, config, cells)


def test_compare_on_another_test_set_gives_no_verdict_and_names_the_subset(tmp_path, capsys):
    # 3 concepts against the paper's 1,000: every row said "tiny better" (99% against 60%);
    # the seeds' test cannot compare models tested on different images.
    from imagenet_cog.cli import main

    run = _subset_folder(tmp_path / "tiny", "tiny", 3, 6, 99.0)
    argv = ["report", str(run), "--reference", "paper", "--compare", "tiny,s-DINO"]
    assert main(argv) in (0, None)
    lines = capsys.readouterr().out.splitlines()
    flag = next(x for x in lines if x.startswith("!!! tiny and s-DINO were tested on"))
    assert flag == (
        "!!! tiny and s-DINO were tested on different test sets (IN-1K, L1-L5: 3 concepts "
        "and 6 test images (tiny) against the paper's 1,000 and 50,000 (s-DINO)): a test "
        "over the seeds does not compare them there, and gives no verdict !!!"
    )
    rows = _rows("\n".join(lines))
    assert len(rows) == 6
    for row in rows.values():
        assert row["verdict"] == "no verdict: other test set", row
        assert row["p Holm"] == "-" and row["95% bound"] == "-"
    assert not any("tiny better" in x for x in lines)


def test_compare_of_two_runs_on_other_concepts_of_one_count_gives_no_verdict(tmp_path):
    a = _subset_folder(tmp_path / "a", "a", 4, 8, 70.0, classes="a")
    b = _subset_folder(tmp_path / "b", "b", 4, 8, 60.0, classes="b")
    both = Results.load(a, b)
    text = both.compare_models("a", "b")
    assert "!!! a and b were tested on different test sets (IN-1K, L1-L5: other concepts" in text
    assert all(r["verdict"] == "no verdict: other test set" for r in _rows(text).values())
    same = Results.load(a, _subset_folder(tmp_path / "c", "c", 4, 8, 60.0, classes="a"))
    rows = _rows(same.compare_models("a", "c"))
    assert all(r["verdict"] == "a better" for r in rows.values())
