"""A results folder received from someone else, or caught half written: the readers (``report
--html``, ``analyze``, ``analyze --concepts``) read only what is inside it and finished, never
a file its ``config.json`` names elsewhere, and say in one line what they left out."""

import json
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


@pytest.mark.parametrize("named", ["absolute", "relative"])
def test_a_levels_path_named_outside_the_folder_is_never_read(
    made, tmp_path, capsys, monkeypatch, named
):
    # A received folder names a file of the reader's as its levels (absolute, or relative to
    # the folder the reader works in): nothing reads it, and no line of it reaches an output.
    secret = tmp_path / "private" / "notes.tsv"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\nmore\n")
    reader = tmp_path / "reader"
    reader.mkdir()
    monkeypatch.chdir(reader)
    run = _received(
        made, reader / "received", secret if named == "absolute" else "../private/notes.tsv"
    )
    capsys.readouterr()
    assert main(["report", str(run), "--html", str(reader / "report.html")]) in (0, None)
    page = (reader / "report.html").read_text()
    assert "sk-0123456789abcdef" not in page and "api_key" not in page
    assert page.count('<tr data-level="') == 5 * PER_LEVEL
    assert "folder, is not read unless given: give them with levels= (--levels)" in page
    code = main(["analyze", str(run), "--analyses", "semantic", "--concepts"])
    printed = capsys.readouterr()
    assert code == 2 and "sk-0123456789abcdef" not in printed.out + printed.err
    assert printed.err.strip().endswith("give them with levels= (--levels)"), printed.err


def test_levels_the_reader_gives_or_inside_the_folder_are_read(made, tmp_path, capsys):
    levels = made[2]
    wnid = levels["L3"][0]
    shown = f'<td class="text">{wnid}</td><td class="text">'
    given = tmp_path / "given"
    levels.save(given)
    run = _received(made, tmp_path / "run", given)
    # Named outside the folder: read when the reader gives them.
    out = tmp_path / "report.html"
    assert main(["report", str(run), "--html", str(out), "--levels", str(given)]) in (0, None)
    page = out.read_text()
    assert "is not read unless given" not in page
    row = page[page.index(shown) :].split("</tr>", 1)[0]
    assert f">{levels.scores[wnid]:.3f}</td>" in row
    capsys.readouterr()
    assert main(["analyze", str(run), "--concepts", "--levels", str(given)]) in (0, None)
    assert "accuracy of 20 concepts" in capsys.readouterr().out
    # Levels the other's run does not name are refused, in one line.
    with pytest.raises(ValueError, match="are not those the run in"):
        Results.load(run).to_html(reference=False, levels="official")
    # Inside the folder they are read as they are.
    inside = tmp_path / "inside"
    levels.save(inside / "levels")
    page = Results.load(_received(made, inside, inside / "levels")).to_html(reference=False)
    row = page[page.index(shown) :].split("</tr>", 1)[0]
    assert f">{levels.scores[wnid]:.3f}</td>" in row and "is not read unless" not in page


# ------------------------------------------------------------ cells not finished
def test_prediction_files_no_record_names_are_left_out_in_one_line(made, tmp_path, capsys):
    # evaluate killed between a lockstep group's prediction files and their records (or read
    # while it writes them): every reader reads the finished cells and says which are not.
    unfinished = {("L5", "all", s) for s in SEEDS[2:]} | {("L2", 1, SEEDS[0])}
    kept = [r for r in made[1] if (r["domain"], r["shots"], r["seed"]) not in unfinished]
    made[2].save(tmp_path / "run" / "levels")
    run = _received(made, tmp_path / "run", tmp_path / "run" / "levels", records=kept)
    line = (
        f"4 prediction files in {run / 'predictions'} are named by no record (cells that did "
        "not finish, or are still being written): not read: L2 N=1 seed 22; L5 N=All seeds "
        "45, 77, 93"
    )
    assert main(["verify", str(run)]) == 0
    assert capsys.readouterr().out.count("is named by no record (a cell that did not") == 4
    assert main(["analyze", str(run), "--analyses", "semantic", "--concepts"]) in (0, None)
    printed = capsys.readouterr()
    assert [x for x in printed.err.splitlines() if "named by no record" in x] == [
        f"skipped unfinished cells: {line}"
    ]
    assert "accuracy of 20 concepts (N=all, seeds 22, 37, 45, 77, 93)" in printed.out
    page = Results.load(run).to_html(reference=False)
    assert page.count('<tr data-level="') == 5 * PER_LEVEL
    assert page.count("named by no record") == 1 and line in page


def test_an_analysis_json_naming_a_file_outside_its_folder_is_refused_unread(made, tmp_path):
    # analysis.json binds the prediction files it was computed from by name and sha256: a
    # name that leaves the folder is refused, never read (nor is a file of the reader's
    # checked against a digest the sender chose).
    import hashlib

    from imagenet_cog._runfolder import ANALYSIS_CHECKSUM, _content_sha256

    made[2].save(tmp_path / "run" / "levels")
    run = _received(made, tmp_path / "run", tmp_path / "run" / "levels")
    assert main(["analyze", str(run), "--analyses", "semantic"]) in (0, None)
    secret = tmp_path / "secret.npz"
    secret.write_bytes(SECRET.encode())
    analysis = json.loads((run / "analysis.json").read_text())
    analysis["inputs"]["predictions"] = {
        "../secret.npz": hashlib.sha256(secret.read_bytes()).hexdigest()
    }
    analysis[ANALYSIS_CHECKSUM] = _content_sha256(analysis, (ANALYSIS_CHECKSUM,))
    (run / "analysis.json").write_text(json.dumps(analysis))
    with pytest.raises(ValueError, match=r"names '\.\./secret\.npz', outside its folder: not read"):
        Results.load(run)
