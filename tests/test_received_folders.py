"""A results folder received from someone else, or caught half written: the readers (``report
--html``, ``analyze``, ``analyze --concepts``) read only what is inside it and finished, never
a file its ``config.json`` names elsewhere, and say in one line what they left out."""

import shutil

import pytest
from helpers import write_run_folder
from test_concept_accuracy import _default_shape_predictions

from imagenet_cog import Levels, Results
from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS
from imagenet_cog.cli import main

#: The first line of a file of the reader's that a received folder names as its levels.
SECRET = "api_key\tsk-0123456789abcdef"
PER_LEVEL = 4


def _levels_of(concepts):
    """Levels holding the concepts of the saved predictions, with scores of their own."""
    levels = [concepts[d] for d in DOMAINS if d != "in1k"]
    scores = {
        w: round(0.9 - 0.1 * i - 0.01 * j, 3)
        for i, lv in enumerate(levels)
        for j, w in enumerate(lv)
    }
    return Levels(levels, scores, {"name": "mine", "measure": "lin"})


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A run folder of the default protocol's shape with saved predictions, its records and
    the levels it was made with (not the official ones), and a function writing its
    ``config.json`` to name any levels path, resealed as anyone can reseal one."""
    root = tmp_path_factory.mktemp("made")
    bound = {}
    concepts = _default_shape_predictions(root / "run", per_level=PER_LEVEL, written=bound)
    records = [
        {
            "model": "theirs",
            "domain": d,
            "shots": n,
            "seed": s,
            "top1": 50.0 - i,
            **bound[(d, n, s)],
        }
        for i, d in enumerate(DOMAINS)
        for n in SHOTS
        for s in SEEDS
    ]
    return root / "run", records, _levels_of(concepts)


def _received(made, where, levels_path, records=None):
    """A copy of the run at ``where`` whose config.json names ``levels_path``."""
    run, all_records, levels = made
    shutil.copytree(run / "predictions", where / "predictions")
    config = {"model": "theirs", "levels": str(levels_path), "levels_sha256": levels.checksum}
    return write_run_folder(where, config, all_records if records is None else records)


# ----------------------------------------------------------- the levels it names
@pytest.mark.parametrize("emptied", ["beside", "inside"])
def test_an_emptied_levels_folder_leaves_the_page_standing_with_a_note(
    made, tmp_path, capsys, emptied
):
    # The levels folder still exists, without its levels.tsv: as with levels that moved, the
    # page stands, each concept without its similarity, and says how to give them.
    where = tmp_path / "run"
    folder = (where / "levels") if emptied == "inside" else (tmp_path / "levels")
    made[2].save(folder)
    run = _received(made, where, folder)
    (folder / "levels.tsv").unlink()
    page = Results.load(run).to_html(reference=False)
    assert page.count('<tr data-level="') == 5 * PER_LEVEL
    assert "give them with levels= (--levels); no similarity is shown" in page
    capsys.readouterr()
    code = main(["analyze", str(run), "--analyses", "semantic", "--concepts"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].endswith("give them with levels= (--levels)"), err
