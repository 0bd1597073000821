"""A results folder received from someone else, or caught half written: the readers (``report
--html``, ``analyze``, ``analyze --concepts``) read only what is inside it and finished, never
a file its ``config.json`` names elsewhere, and say in one line what they left out. A run of
one's own keeps a copy of its levels inside its folder, bound by checksum, so its readers show
each concept's similarity without being given the levels again."""

import json
import shutil

import numpy as np
import pytest
from helpers import write_run_folder
from test_concept_accuracy import _default_shape_predictions

from imagenet_cog import Levels, Results, evaluate
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
    assert "folder, is not read unless given (the folder keeps no copy of them): give" in page
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


# ------------------------------------------------- a run of one's own: its levels kept
@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """``evaluate`` on the default protocol's shape (every shots value, five seeds), its
    predictions saved, made with levels of one's own saved beside the run folder, not in
    it; and a function running it again into the same folder (a resume)."""
    from imagenet_cog import load_levels

    root = tmp_path_factory.mktemp("evaluated")
    official = load_levels("official")
    levels = _levels_of({d: official[d][:PER_LEVEL] for d in DOMAINS if d != "in1k"})
    levels.save(root / "mine")
    rng = np.random.default_rng(0)
    features = {}
    for name, wnids in zip(levels.names, levels.levels):
        means = rng.normal(size=(len(wnids), 8)) * 2
        y_train, y_test = np.repeat(wnids, 160), np.repeat(wnids, 10)
        x_train = means.repeat(160, axis=0) + rng.normal(size=(len(y_train), 8))
        x_test = means.repeat(10, axis=0) + rng.normal(size=(len(y_test), 8))
        features[name] = (x_train.astype(np.float32), y_train, x_test.astype(np.float32), y_test)
    settings = {
        "levels": root / "mine",
        "domains": levels.names,
        "shots": SHOTS,
        "seeds": SEEDS,
        "n_trials": 1,
        "n_startup_trials": 1,
        "epochs": 1,
        "batch_size": 64,
        "device": "cpu",
        "progress": False,
        "out": root / "run",
        "save_predictions": True,
    }
    evaluate(features, **settings)
    return root / "run", levels, lambda: evaluate(features, **settings, resume=True)


def _similarity_shown(page, levels, wnid):
    """Whether the page's row of ``wnid`` shows its similarity under ``levels``."""
    row = page[page.index(f'<td class="text">{wnid}</td><td class="text">') :]
    return f">{levels.scores[wnid]:.3f}</td>" in row.split("</tr>", 1)[0]


def test_a_run_of_ones_own_shows_each_concepts_similarity_without_levels_given(
    evaluated, tmp_path, capsys
):
    # evaluate --levels DIR --out RUN, then report --html RUN: the levels, outside the
    # folder, are not read; the copy evaluate kept inside it is, checked by its checksums.
    run, levels, _ = evaluated
    config = json.loads((run / "config.json").read_text())
    assert config["levels"] == str(run.parent / "mine")  # outside the folder, as given
    assert Levels.load(run / "levels").checksum == config["levels_sha256"]
    out = tmp_path / "report.html"
    assert main(["report", str(run), "--html", str(out)]) in (0, None)
    page = out.read_text()
    assert "no similarity is shown" not in page
    assert page.count('<tr data-level="') == 5 * PER_LEVEL
    assert all(_similarity_shown(page, levels, w) for lv in levels.levels for w in lv)
    capsys.readouterr()
    assert main(["analyze", str(run), "--analyses", "semantic", "--concepts"]) in (0, None)
    assert "accuracy of 20 concepts (N=all, seeds 22, 37, 45, 77, 93)" in capsys.readouterr().out
    rows = [r.split(",") for r in (run / "concepts.csv").read_text().splitlines()[1:]]
    assert {r[0]: float(r[3]) for r in rows} == {
        w: pytest.approx(levels.scores[w]) for lv in levels.levels for w in lv
    }
    assert main(["verify", str(run)]) == 0
    said = capsys.readouterr().out
    assert "match what made them" in said and "not checked" not in said


def test_a_run_resumed_without_its_copy_of_the_levels_writes_it_again(evaluated, capsys):
    run, levels, again = evaluated
    shutil.rmtree(run / "levels")
    assert main(["verify", str(run)]) == 0
    assert "not checked: no copy of the levels" in capsys.readouterr().out
    again()  # every cell is done: only the copy is written
    assert Levels.load(run / "levels").checksum == levels.checksum
    assert main(["verify", str(run)]) == 0
    assert "not checked" not in capsys.readouterr().out


@pytest.mark.parametrize("tampered", ["score", "levels", "linked"])
def test_a_tampered_copy_of_the_levels_is_a_note_never_read(evaluated, tmp_path, capsys, tampered):
    from imagenet_cog._runfolder import keep_levels

    made, levels, _ = evaluated
    run = tmp_path / "run"
    shutil.copytree(made, run, ignore=shutil.ignore_patterns(".lock", "concepts.csv"))
    tsv = run / "levels" / "levels.tsv"
    wnid, other = levels["L2"][0], levels["L4"][0]
    rows = [line.split("\t") for line in tsv.read_text().splitlines()]
    if tampered == "score":  # one similarity edited by hand
        rows = [[r[0], r[1], "0.987654" if r[1] == wnid else r[2]] for r in rows]
        tsv.write_text("\n".join("\t".join(r) for r in rows) + "\n")
    elif tampered == "levels":  # two concepts swapped between levels, the copy resealed
        swap = {wnid: other, other: wnid}
        rows = [[r[0], swap.get(r[1], r[1]), r[2]] for r in rows]
        tsv.write_text("\n".join("\t".join(r) for r in rows) + "\n")
        keep_levels(run, Levels.load(tsv), json.loads((run / "config.json").read_text()))
    else:  # the folder's levels/ a link to a folder of the reader's
        secret = tmp_path / "private"
        shutil.copytree(run / "levels", secret)
        (secret / "levels.tsv").write_text("level\twnid\tscore\n" + SECRET + "\n")
        shutil.rmtree(run / "levels")
        (run / "levels").symlink_to(secret, target_is_directory=True)
    page = Results.load(run).to_html(reference=False)
    assert "0.988" not in page and "sk-0123456789abcdef" not in page and "api_key" not in page
    assert page.count('<tr data-level="') == 5 * PER_LEVEL
    assert not any(_similarity_shown(page, levels, w) for lv in levels.levels for w in lv)
    assert "give them with levels= (--levels); no similarity is shown" in page
    capsys.readouterr()
    code = main(["analyze", str(run), "--analyses", "semantic", "--concepts"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].endswith("give them with levels= (--levels)") and "api_key" not in err[0], err
    assert main(["verify", str(run)]) == 1
    said = capsys.readouterr().out
    assert f"{run / 'levels'}" in said and "api_key" not in said
    # Given by the reader, the levels are read, checked by content, and shown.
    page = Results.load(run).to_html(reference=False, levels=made.parent / "mine")
    assert all(_similarity_shown(page, levels, w) for lv in levels.levels for w in lv)


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
