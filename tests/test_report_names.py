"""What a reader reads in a report: a checkpoint's model by its architecture and file stem
(its hash only where two files would get one name), the decisive reason of a verdict first
and short, one way of saying the change from L1 to L5."""

import json

import pytest
from official_run import paper_like

from imagenet_cog import Results, reference_results
from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def checkpoint_runs(tmp_path_factory):
    """Two runs of resnet18 checkpoints with one file name and different weights, and one of
    the first named by the user; 3 IN-1K concepts, 32-pixel images, the default shots."""
    import torchvision
    from imagefiles import write_in1k

    from imagenet_cog import evaluate, extract

    root = tmp_path_factory.mktemp("checkpoints")
    wnids, _ = write_in1k(root / "in1k", n_classes=3, n_train=8, n_val=2)
    runs = {}
    for which, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        file = root / which / "resnet18-f37072fd.pth"
        file.parent.mkdir()
        torch.save(torchvision.models.resnet18().state_dict(), file)
        features = root / which / "features"
        for split in ("train", "test"):
            extract(
                f"torchvision:resnet18:{file}",
                root / "in1k",
                "in1k",
                split,
                features,
                wnids=wnids,
                preprocessing={"size": 32},
                batch_size=8,
                progress=False,
            )
        kw = {"n_trials": 2, "n_startup_trials": 1, "epochs": 2, "batch_size": 8}
        evaluate(
            features,
            domains=["in1k"],
            shots=[1, "all"],
            seeds=[22, 37],
            device="cpu",
            progress=False,
            out=root / which / "run",
            **kw,
        )
        runs[which] = root / which / "run"
    return runs


def test_a_checkpoint_is_named_by_its_architecture_and_file_stem(checkpoint_runs, capsys):
    from imagenet_cog.cli import main

    run = Results.load(checkpoint_runs["a"])
    assert run.models == ["resnet18-f37072fd"]
    # Its identity is the weights' sha256, in the provenance.
    ext = run.meta["protocol"]["resnet18-f37072fd"]["data"]["in1k"]["extraction"]
    assert ext["model"].startswith("torchvision:resnet18:sha256-") and len(ext["weights_sha256"])
    assert main(["report", str(checkpoint_runs["a"]), "--reference", "paper"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[2].startswith("resnet18-f37072fd rank")
    assert "sha256-" not in printed.split("!!!")[0]
    tex = run.to_latex()
    assert "resnet18-f37072fd" in tex and "sha256" not in tex


def test_two_files_with_one_name_are_told_apart_by_their_hash(checkpoint_runs):
    a, b = checkpoint_runs["a"], checkpoint_runs["b"]
    shas = {
        k: Results.load(p).meta["protocol"]["resnet18-f37072fd"]["data"]["in1k"]["extraction"][
            "weights_sha256"
        ]
        for k, p in checkpoint_runs.items()
    }
    expected = [f"resnet18-f37072fd-{shas['a'][:8]}", f"resnet18-f37072fd-{shas['b'][:8]}"]
    assert Results.load(a, b).models == expected
    assert Results.load(a).merge(Results.load(b)).models == expected
    # Names the user gave are theirs: a clash of those is refused, as before.
    with pytest.raises(ValueError, match="appear in both results"):
        Results.load(a, model="mine").merge(Results.load(b, model="mine"))
    # One file's runs (seeds run apart) keep their one name.
    assert Results.load(a, a).models == ["resnet18-f37072fd"]


def test_the_name_travels_to_the_figures(checkpoint_runs):
    both = Results.load(checkpoint_runs["a"]).compare(reference_results(), models=["s-DINO"])
    figs = both.figures(baseline="ResNet50", highlight=["resnet18-f37072fd"])
    labels = [t.get_text() for t in figs["levels_absolute"].legends[0].get_texts()]
    assert "resnet18-f37072fd (not comparable)" in labels
    import matplotlib.pyplot as plt

    plt.close("all")


# -------------------------------------------------- the decisive reason first, short
def _subset_random_run(tmp_path):
    """A random-weights run on 3-4 concepts per domain, with short searches: the verdict's
    17 deviations of the issue, in the order the checks find them."""
    run = paper_like(
        model="resnet18-random",
        ext_weights="random",
        ext_model="torchvision:resnet18",
        epochs=2,
        n_trials=3,
        batch_size=64,
        n_startup_trials=2,
    )
    for i, d in enumerate(DOMAINS):
        info = run.meta["protocol"]["resnet18-random"]["data"][d]
        info.update({"n_classes": 3 + i % 2, "n_test": 24 + 25 * i, "classes_sha256": "0" * 64})
    return run


def test_the_banner_says_the_weights_first_and_each_repeat_once():
    run = _subset_random_run(None)
    banner = run.report().split("\n\n")[0].splitlines()
    assert banner[0] == "!!! NOT COMPARABLE with the paper: resnet18-random !!!"
    assert banner[1] == "  - random-initialised weights: 'torchvision:resnet18' names no weights"
    assert banner[2] == (
        "  - IN-1K, L1-L5: subsets of 3-4 concepts and 24-149 test images instead of the "
        "paper's 1,000 and 50,000"
    )
    assert banner[3].startswith("  - protocol constants: epochs 2 instead of 100")
    # The model's name is the banner's head, not every line's.
    assert sum("resnet18-random" in line for line in banner) == 1


def test_the_figure_footnote_reaches_the_weights():
    from imagenet_cog._comparability import not_comparable
    from imagenet_cog._figures import footnote_text

    note = footnote_text(not_comparable(_subset_random_run(None)))
    assert note.startswith(
        "(not comparable) resnet18-random: random-initialised weights: 'torchvision:resnet18' "
        "names no weights; IN-1K, L1-L5: subsets of 3-4 concepts"
    )
    assert note.endswith("(+1 more)")


def test_a_tables_footnote_names_its_own_domain_only():
    tex = _subset_random_run(None).to_latex()
    l5 = tex.split("\\label{tab:cog-l5}")[1].split("\\end{table}")[0]
    footnote = next(line for line in l5.splitlines() if "Not comparable" in line)
    assert "random-initialised weights" in footnote.split("Not comparable")[1][:80]
    assert "L5: subsets of 4 concepts and 149 test images" in footnote
    assert "IN-1K" not in footnote and "L1" not in footnote


def test_a_copy_caveat_on_every_level_is_said_once():
    from imagenet_cog._reporting.verdict import caveat_lines

    run = paper_like()
    copy = {"processed": True, "name": "ImageNet-21K-P", "layout": "folders", "resized": 10}
    for d in DOMAINS[1:]:
        run.meta["protocol"]["mine"]["data"][d]["split"]["copy"] = dict(copy, samples=1000)
    lines = caveat_lines(run)
    copies = [line for line in lines if "copy" in line]
    assert len(copies) == 1 and copies[0].startswith("    - L1-L5: images from the ImageNet-21K-P")


# ------------------------------------------------------ one way of saying the change
def _user_run(name, l1, l5):
    return Results(
        [
            {"model": name, "domain": d, "shots": n, "seed": s, "top1": v}
            for d, v in (("in1k", 70.0), ("L1", l1), ("L5", l5))
            for n in SHOTS
            for s in SEEDS
        ]
    )


def test_the_change_from_l1_to_l5_has_its_sign_and_the_count_its_number(
    tmp_path, capsys, monkeypatch
):
    from imagenet_cog.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    falls, rises = _user_run("falls", 62.0, 46.5), _user_run("rises", 50.0, 61.2)
    for name, res in (("falls", falls), ("rises", rises)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "runs.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in res.records)
        )
    assert main(["report", str(tmp_path / "falls"), "--reference", "paper"]) == 0
    one = capsys.readouterr().out.splitlines()
    assert one[0] == "Your model among the paper's 31 models (all training images; rank 1 = best)"
    argv = ["report", str(tmp_path / "falls"), str(tmp_path / "rises"), "--reference", "paper"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "Your 2 models, each ranked among the paper's 31 models only (all training images; "
        "rank 1 = best)"
    )
    fall = next(x for x in lines if x.startswith("falls: L1 -> L5"))
    rise = next(x for x in lines if x.startswith("rises: L1 -> L5"))
    assert fall.startswith("falls: L1 -> L5 relative change -25.0% (the other 31 models: -29.")
    assert rise.startswith("rises: L1 -> L5 relative change +22.4% (the other 31 models:")
    assert rise.endswith("; 31 of them fall further)")
    assert not any("drop" in x for x in lines)


# ------------------------------------------- a name shown never touches what a checksum covers
def _no_edit_flagged(results):
    from imagenet_cog import comparability

    found = comparability(results, by_model=True)
    return not any("edited" in d for v in found.values() for d in v["deviations"])


def test_checkpoints_told_apart_keep_their_records_as_written(checkpoint_runs, capsys):
    # Two checkpoint files with one stem get names told apart by their weights' sha256: the
    # names are shown, and the records keep the name they were written with, so their
    # checksums still match: no "edited after it was written" anywhere.
    from imagenet_cog._runfolder import RECORD_CHECKSUM, as_recorded, record_checksum
    from imagenet_cog.cli import main

    a, b = checkpoint_runs["a"], checkpoint_runs["b"]
    for both in (Results.load(a, b), Results.load(a).merge(Results.load(b))):
        assert len(both.models) == 2 and all(
            m.startswith("resnet18-f37072fd-") for m in both.models
        )
        assert _no_edit_flagged(both)
        assert {as_recorded(r)["model"] for r in both.records} == {"resnet18-f37072fd"}
        assert all(r[RECORD_CHECKSUM] == record_checksum(as_recorded(r)) for r in both.records)
        assert "edited after" not in both.to_html()
        assert "edited after" not in both.to_csv() + both.to_latex() + both.to_json()
    assert main(["report", str(a), str(b), "--reference", "paper"]) == 0
    assert "edited after" not in capsys.readouterr().out
    assert main(["verify", str(a), str(b)]) == 0


def _named_runs(tmp_path):
    """Two runs of one model (one checkpoint) made with other protocol constants: 2 and 3
    epochs, the default shots and seeds on IN-1K and L5."""
    from helpers import write_run_folder

    folders = []
    for epochs in (2, 3):
        cells = [
            {
                "model": "mobilenet_v2-b0353104",
                "domain": d,
                "shots": n,
                "seed": s,
                "top1": 50.0 + epochs + 0.1 * k,
            }
            for d in ("in1k", "L5")
            for n in SHOTS
            for k, s in enumerate(SEEDS)
        ]
        config = {"levels": "official", "protocol": {"epochs": epochs, "normalize": True}}
        folders.append(write_run_folder(tmp_path / f"epochs{epochs}", config, cells))
    return folders


def test_report_names_a_run_and_its_files_stay_as_written(tmp_path, capsys, monkeypatch):
    from imagenet_cog.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    short, long = _named_runs(tmp_path)
    written = {f: (f / "runs.jsonl").read_bytes() for f in (short, long)}
    # Two runs of one checkpoint with different settings: one line that says how to name them.
    assert main(["report", str(short), str(long)]) == 2
    err = capsys.readouterr().err
    assert "--name" in err and "rename one" not in err
    names = ["--name", f"{short}=2 epochs", "--name", f"{long}=3 epochs"]
    html = tmp_path / "r.html"
    assert main(["report", str(short), str(long), *names, "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "2 epochs" in out and "3 epochs" in out and "mobilenet_v2-b0353104" not in out
    assert "edited after" not in out and "edited after" not in html.read_text()
    page = html.read_text()
    assert page.count(">2 epochs</text>") + page.count(">2 epochs (not comparable)</text>") >= 1
    for form in ("csv", "latex", "md", "json"):
        assert main(["report", str(short), str(long), *names, "--format", form]) == 0
        printed = capsys.readouterr().out
        assert "3 epochs" in printed and "edited after" not in printed
    # The files and their checksums are as the runs wrote them.
    assert {f: (f / "runs.jsonl").read_bytes() for f in (short, long)} == written
    assert main(["verify", str(short), str(long)]) == 0
    # One name for one of the folders given; a folder not given is refused in one line.
    assert main(["report", str(short), "--name", f"{tmp_path / 'other'}=x"]) == 2
    assert "--name" in capsys.readouterr().err


def test_results_load_names_runs_as_report_does(tmp_path):
    short, long = _named_runs(tmp_path)
    both = Results.load(short, long, names={short: "short", str(long): "long"})
    assert both.models == ["short", "long"]
    assert _no_edit_flagged(both)
    assert both.meta["run_folders"] == {"short": [str(short)], "long": [str(long)]}


# ---------------------------------------------- ranks among the paper's published models only
def test_each_model_is_ranked_among_the_papers_models_only(tmp_path, capsys, monkeypatch):
    # "second" is above every published model on every level and below "first": among the
    # paper's models it is first, whatever the user's other model scores.
    from imagenet_cog.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    first, second = _user_run("first", 95.0, 90.0), _user_run("second", 92.0, 85.0)
    for name, res in (("first", first), ("second", second)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "runs.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in res.records)
        )
    argv = ["report", str(tmp_path / "first"), str(tmp_path / "second"), "--reference", "paper"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "Your 2 models, each ranked among the paper's 31 models only (all training images; "
        "rank 1 = best)"
    )
    for name in ("first", "second"):
        ranks = next(x for x in lines if x.startswith(f"{name} rank")).split()[2:]
        assert [ranks[1], ranks[5]] == ["(1)*/32"] * 2, (name, ranks)  # L1, L5 (IN-1K: lower)
    both = Results(first.records + second.records).compare(reference_results())
    page = both.to_html()
    assert "Your 2 models, each ranked among the paper&#x27;s 31 models only" in page
    assert page.count("(1)*/32") == 4 and "/33" not in page
    # Results.ranks says the same, asked for the paper's models.
    among = both.ranks(among=both.reference_models())
    assert among["second"]["L1"] == among["second"]["L5"] == 1
    assert both.ranks()["second"]["L5"] == 2


# ------------------------------------------------ a reason the models share, said once
def test_a_reason_the_flagged_models_share_is_said_once_under_a_figure():
    from imagenet_cog._comparability import not_comparable
    from imagenet_cog._figures import footnote_text

    cells = [
        {"model": m, "domain": d, "shots": n, "seed": 22, "top1": 50.0}
        for m in ("a", "b", "c")
        for d in ("in1k", "L5")
        for n in (["all", 3] if m == "c" else ["all"])
    ]
    flagged = not_comparable(Results(cells))
    assert flagged["a"] == flagged["b"] and len(flagged["c"]) == 3
    note = footnote_text(flagged)
    assert note == (
        "(not comparable) a, b, c: 1 seed per cell instead of the paper's 5; its protocol "
        "settings are unknown (no config.json) | c also: shots [3] are not among the paper's "
        "[1, 2, 4, 8, 16, 32, 64, 128, 'all']"
    )
    for reason in flagged["a"]:
        assert note.count(reason) == 1


# ------------------------------- caveats under a NOT COMPARABLE banner never say "comparable"
def test_the_caveats_of_a_model_not_comparable_do_not_call_its_cells_comparable():
    from imagenet_cog._reporting.verdict import caveat_lines

    bad = paper_like("bad", epochs=2, versions={"optuna": "4.0.0"})
    lines = caveat_lines(bad)
    assert not any("stay comparable" in x for x in lines)
    assert lines[0] == "Caveats of the models not comparable, beside their deviations above:"
    assert lines[1] == "  bad:" and lines[2].startswith("    - Optuna 4.0.0 instead of")
    page = bad.to_html(reference=False)
    verdict = page[page.index('<section id="verdict"') : page.index('<section id="figures"')]
    assert "NOT COMPARABLE with the paper: bad" in verdict and "stay comparable" not in verdict
    assert "<summary>Caveats of the models not comparable, beside their deviations above" in verdict
    # A comparable model's caveats keep saying its cells stay comparable, apart.
    both = bad.merge(paper_like("good", versions={"optuna": "4.0.0"}))
    lines = caveat_lines(both)
    head = lines.index("Caveats (the cells shown stay comparable with the paper):")
    assert lines[head + 1] == "  good:" and "  bad:" not in lines[head : head + 3]
    page = both.to_html(reference=False)
    assert "<summary>Caveats (the cells shown stay comparable)</summary>" in page
