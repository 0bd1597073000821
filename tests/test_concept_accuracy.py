"""Accuracy per concept on the default protocol's shape (every shots value beside "all", five
seeds), with each concept's similarity from the levels the run itself was made with, and its
name printed beside its wnid."""

import json
import warnings

import numpy as np
import pytest

from imagenet_cog import Results, load_levels
from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS
from imagenet_cog._runfolder import PREDICTIONS_DIR, write_predictions
from imagenet_cog.analysis import concept_accuracy


def _default_shape_predictions(folder, per_level=4, written=None):
    """Saved predictions of every domain, shots value and seed: concept ``i`` of a level is
    right on ``i + 1`` of its 10 test images with all the images, and on none with fewer.
    ``written`` (a dict) receives, per ``(domain, shots, seed)``, the fields a record takes
    to name its file (``write_predictions``' return)."""
    levels = load_levels("official")
    concepts = {d: levels[d][:per_level] for d in DOMAINS if d != "in1k"}
    concepts["in1k"] = ["n01440764", "n01443537"]
    for domain, wnids in concepts.items():
        for shots in SHOTS:
            for seed in SEEDS:
                y_true, y_pred = [], []
                for i, w in enumerate(wnids):
                    right = i % 10 + 1 if shots == "all" else 0
                    y_true += [w] * 10
                    y_pred += [w] * right + [wnids[(i + 1) % len(wnids)]] * (10 - right)
                index = {w: i for i, w in enumerate(wnids)}
                fields = write_predictions(
                    folder / PREDICTIONS_DIR,
                    domain,
                    shots,
                    seed,
                    y_true=np.array(y_true),
                    y_pred=np.array(y_pred),
                    top5=np.array([[index[p]] for p in y_pred], dtype=np.int32),
                    classes=np.array(wnids),
                )
                if written is not None:
                    written[(domain, shots, seed)] = fields
    return concepts


def test_concept_accuracy_reads_the_default_protocols_shape(tmp_path):
    concepts = _default_shape_predictions(tmp_path)
    found = concept_accuracy(tmp_path)
    assert found.seeds == SEEDS and found.shots == "all"
    assert len(found.wnids) == 5 * 4 and "in1k" not in set(found.domains)
    got = dict(zip(found.wnids, found.accuracy))
    assert [got[w] for w in concepts["L3"]] == [10.0, 20.0, 30.0, 40.0]
    few = concept_accuracy(tmp_path, shots=8)
    assert few.shots == 8 and set(few.accuracy) == {0.0}
    assert np.isnan(few.spearman)  # nothing varies: no correlation, and no warning


def test_analyze_concepts_on_the_default_shape_prints_names_beside_wnids(tmp_path, capsys):
    from imagenet_cog.cli import main

    concepts = _default_shape_predictions(tmp_path / "run")
    code = main(["analyze", str(tmp_path / "run"), "--analyses", "semantic", "--concepts"])
    assert code in (0, None)
    printed = capsys.readouterr().out
    assert "accuracy of 20 concepts (N=all, seeds 22, 37, 45, 77, 93)" in printed
    table = printed.split("most similar first:\n", 1)[1].splitlines()
    assert table[0].split()[:3] == ["concept", "name", "level"]
    first = concepts["L1"][0]  # the most similar concept of the lot
    row = next(line for line in table if line.startswith(first))
    assert row.split()[1] == load_levels_name(first)
    csv_head = (tmp_path / "run" / "concepts.csv").read_text().splitlines()[0]
    assert csv_head == "wnid,name,level,similarity,top1,std,n_test"


def load_levels_name(wnid):
    from imagenet_cog.taxonomy import load_taxonomy

    return load_taxonomy().lemma_names(wnid)[0].replace("_", " ").split()[0]


# -------------------------------------------------------- the run's own levels
@pytest.fixture(scope="module")
def wup_run(tmp_path_factory):
    """A run made with Wu-Palmer levels (6 official concepts per level, re-ranked), its
    predictions saved."""
    from imagenet_cog import build_levels, evaluate
    from imagenet_cog.levels import UnofficialLevelsWarning

    root = tmp_path_factory.mktemp("wup")
    official = load_levels("official")
    pool = [w for level in official.levels for w in level[:: len(level) // 6][:6]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnofficialLevelsWarning)
        levels = build_levels(measure="wup", candidates=pool, level_size=6, blocklist=None)
    levels.save(root / "wup")
    rng = np.random.default_rng(0)
    features = {}
    for name, wnids in zip(levels.names, levels.levels):
        means = rng.normal(size=(len(wnids), 8)) * 2
        y_train, y_test = np.repeat(wnids, 12), np.repeat(wnids, 6)
        x_train = means.repeat(12, axis=0) + rng.normal(size=(len(y_train), 8))
        x_test = means.repeat(6, axis=0) + rng.normal(size=(len(y_test), 8))
        features[name] = (x_train.astype(np.float32), y_train, x_test.astype(np.float32), y_test)
    evaluate(
        features,
        levels=root / "wup",
        domains=levels.names,
        shots=[1, "all"],
        seeds=[22, 37],
        n_trials=2,
        n_startup_trials=1,
        epochs=2,
        batch_size=32,
        device="cpu",
        progress=False,
        out=root / "run",
        save_predictions=True,
    )
    return root / "run", levels


def test_each_concepts_similarity_comes_from_the_runs_own_levels(wup_run):
    # Saved beside the run, not in its folder: read from the copy evaluate kept in it.
    run, levels = wup_run
    found = concept_accuracy(run)
    sims = dict(zip(found.wnids, found.similarity))
    assert sims == {w: pytest.approx(levels.scores[w]) for w in sims}
    official = load_levels("official").scores
    assert any(abs(sims[w] - official[w]) > 0.05 for w in sims)
    assert found.spearman == pytest.approx(
        __import__("scipy").stats.spearmanr(found.similarity, found.accuracy)[0]
    )


def test_levels_that_are_not_the_runs_are_refused_in_one_line(wup_run, tmp_path, capsys):
    from imagenet_cog.cli import main

    run, _ = wup_run
    with pytest.raises(ValueError, match=r"are not those the run in .* was made with"):
        concept_accuracy(run, levels="official")
    code = main(
        ["analyze", str(run), "--analyses", "semantic", "--concepts", "--levels", "official"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("imagenet-cog: error: the levels given (official)")
    # Moved away, the run's levels are asked for by name.
    config = json.loads((run / "config.json").read_text())
    assert str(config["levels"]).endswith("wup")


def test_the_html_report_shows_the_runs_levels_and_what_made_the_numbers(wup_run):
    import re

    run, levels = wup_run
    page = Results.load(run).to_html(reference=False)
    wnid = levels["L3"][0]
    row = re.search(rf'<tr data-level="L3"[^>]*><td class="text">{wnid}</td>.*?</tr>', page)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row[0])
    assert cells[3] == f"{levels.scores[wnid]:.3f}"
    config = json.loads((run / "config.json").read_text())
    assert config["config_sha256"] in page and "with their own sha256" in page


def test_the_html_report_stands_when_the_runs_levels_moved(wup_run):
    # Moved, the levels are read from the run's copy; without the copy (a folder of an
    # earlier version), the page stands without the similarity, and says how to give them.
    run, levels = wup_run
    folder = run.parent / "wup"
    folder.rename(run.parent / "moved")
    try:
        kept = Results.load(run).to_html(reference=False)
        (run / "levels").rename(run.parent / "copy")
        page = Results.load(run).to_html(reference=False)
    finally:
        (run.parent / "moved").rename(folder)
        if (run.parent / "copy").exists():
            (run.parent / "copy").rename(run / "levels")
    wnid = levels["L2"][0]
    assert f">{levels.scores[wnid]:.3f}</td>" in kept and "no similarity is shown" not in kept
    assert "give them with levels= (--levels); no similarity is shown" in page
    assert f">{levels.scores[wnid]:.3f}</td>" not in page
    assert page.count('<tr data-level="') == 30
