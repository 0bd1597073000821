"""What comparability flags, from a run's recorded provenance: each deviation and caveat,
what it stops flagging, merges of runs, and the marks that travel with tables and figures."""

import json

import pytest
from helpers import write_run_folder
from official_run import paper_like

from imagenet_cog import Results, comparability, reference_results
from imagenet_cog._reporting.verdict import not_comparable_banner


def _found(run):
    return comparability(run, by_model=True)["mine"]


# ------------------------------------------------------------------ deviations
@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"data_n_train": 5_000}, "L2: 5,000 training images instead of the paper's 1,115,788"),
        ({"data_n_train": 1_500_000}, "L2: 1,500,000 training images instead of the paper's"),
        ({"data_test_ids_sha256": "1" * 64}, "L2: the test images are not the official test lists"),
        (
            {"data_test_ids_sha256": "1" * 64, "data_split": {"official_test_lists": 0}},
            "L2: the test images are not the official test lists (extracted with official_test=False",
        ),
        ({"data_split": {"seed": 1, "cap": 1300}}, "L2: training images chosen with seed=1"),
        ({"data_split": {"seed": 0, "cap": 500}}, "L2: training images chosen with cap=500"),
        ({"ext_weights": "random"}, "random-initialised weights"),
        ({"ext_amp": "bf16"}, "extracted with amp='bf16' instead of float32"),
        (
            {
                "ext_differs_from_preset": {
                    "preprocessing": {
                        "used": {"resize": 160, "crop": 160, "interpolation": "bicubic"},
                        "preset": {"resize": 224, "crop": 224, "interpolation": "bicubic"},
                    }
                }
            },
            (
                "extracted with preprocessing crop=160, resize=160 instead of the preset's crop=224, "
                "resize=224"
            ),
        ),
        (
            {"ext_differs_from_preset": {"layer": {"used": "output:layer3", "preset": "input:fc"}}},
            "extracted with layer 'output:layer3' instead of the preset 'input:fc'",
        ),
    ],
)
def test_each_new_deviation_makes_a_run_not_comparable(change, expect):
    run = paper_like(**change)
    found = _found(run)["deviations"]
    assert len(found) == 1 and found[0].startswith(expect), found
    assert not_comparable_banner(run).startswith("!!! NOT COMPARABLE with the paper: mine !!!")


def test_in1k_test_images_are_the_ilsvrc_validation_set():
    run = paper_like()
    run.meta["protocol"]["mine"]["data"]["in1k"]["test_ids_sha256"] = "2" * 64
    assert _found(run)["deviations"] == [
        "IN-1K: the test images are not the 50,000 ILSVRC-2012 validation images"
    ]


def test_repeated_seeds_in_a_cell_are_a_deviation():
    found = _found(paper_like(seeds=(22, 22, 37, 45, 77)))["deviations"]
    assert "4 seeds per cell instead of the paper's 5" in found
    assert any(
        x.startswith("repeated seeds in 54 cell(s), e.g. IN-1K N=1: seeds [22, 22, 37, 45, 77]")
        for x in found
    ), found


def test_cells_of_several_configurations_are_a_deviation():
    run = paper_like()
    for i, rec in enumerate(run.records):
        rec["config_hash"] = "aaaa" if i % 2 else "bbbb"
    found = _found(run)["deviations"]
    assert found == [
        "its cells come from 2 runs with different configurations (config_hash aaaa, bbbb)"
    ]


def test_features_of_different_extractions_are_a_deviation():
    run = paper_like()
    run.meta["protocol"]["mine"]["data"]["L3"]["extraction"]["weights_sha256"] = "cd" * 32
    assert _found(run)["deviations"] == ["its domains' features come from 2 different extractions"]


# -------------------------------------------------------------------- caveats
@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"ext_decoder": "torchvision"}, "features decoded by the tensor JPEG decoder"),
        ({"versions": {"optuna": "2.4.0"}}, "Optuna 2.4.0 instead of the official code's 2.3.0"),
        ({"data_n_train": 1_115_700}, "L2: 1,115,700 training images instead of the paper's"),
        ({"ext_differs_from_preset": None}, "the network was given as a module"),
    ],
)
def test_new_caveats_are_listed_but_leave_the_ranks(change, expect):
    found = _found(paper_like(**change))
    assert found["deviations"] == [] and any(c.startswith(expect) for c in found["caveats"]), found
    assert "measured" in " ".join(found["caveats"]) or "module" in expect or "training" in expect


def test_the_caveats_quote_where_the_measured_effect_is():
    from imagenet_cog._comparability import DECODER_CAVEAT, OPTUNA_CAVEAT

    assert "docs/guide/features.rst, section 'The tensor path'" in DECODER_CAVEAT
    assert "0.01 points" in OPTUNA_CAVEAT and "docs/guide/official.rst" in OPTUNA_CAVEAT


def test_features_given_as_arrays_say_what_is_unknown():
    from imagenet_cog._comparability import ARRAYS_CAVEAT

    run = paper_like()
    for info in run.meta["protocol"]["mine"]["data"].values():
        info.update(extraction=None, train_ids_sha256=None, test_ids_sha256=None)
        info.pop("split", None), info.pop("levels", None)
    found = _found(run)
    assert found["deviations"] == []
    assert found["caveats"] == [ARRAYS_CAVEAT]
    assert ARRAYS_CAVEAT == (
        "features given as arrays: their model, weights, extraction settings and images are not "
        "recorded, so only the concepts (from wnid labels), the image counts and the protocol "
        "are checked"
    )


def test_a_protocol_that_does_not_record_its_extraction_says_it_is_not_checked():
    run = paper_like()
    for info in run.meta["protocol"]["mine"]["data"].values():
        for key in ("extraction", "train_ids_sha256", "test_ids_sha256", "split", "levels"):
            info.pop(key, None)
    del run.meta["protocol"]["mine"]["levels_sha256"]
    found = _found(run)
    assert found["deviations"] == []
    unrecorded = (
        "the extraction (model, weights, settings) and the image lists are not recorded: they "
        "are not checked"
    )
    assert [c for c in found["caveats"] if "not recorded" in c] == [unrecorded]


# ---------------------------------------------------------------------- levels
def test_a_levels_path_whose_contents_are_official_is_not_flagged():
    run = paper_like(levels="/data/my_copy_of_the_official_levels")
    assert comparability(run) == []


def test_levels_of_other_contents_are_flagged():
    run = paper_like(levels="mylevels/", levels_sha256="0" * 64, data_classes_sha256="0" * 64)
    assert _found(run)["deviations"] == [
        "L2: 1000 concepts, but not the official L2 list",
        "levels 'mylevels/' are not the official ones (their contents differ)",
    ]
    # Other levels whose evaluated levels hold the official concepts: a caveat.
    found = _found(paper_like(levels="mine/", levels_sha256="0" * 64))
    assert found["deviations"] == []
    assert (
        "levels 'mine/' are not the official ones, but each level evaluated holds the "
        "official concepts" in found["caveats"]
    )


def test_levels_named_otherwise_without_any_record_of_the_data_stay_a_deviation():
    run = paper_like(levels="mylevels/")
    proto = run.meta["protocol"]["mine"]
    del proto["data"], proto["levels_sha256"]
    assert "levels 'mylevels/' instead of the official ones" in _found(run)["deviations"]


# ---------------------------------------------------------------- Results.load
def _run_folder(folder, seeds, epochs=100, optuna="2.3.0", model="mine"):
    run = paper_like(model, seeds=seeds, shots=("all",))
    proto = run.meta["protocol"][model]
    config = {
        "levels": proto["levels"],
        "levels_sha256": proto["levels_sha256"],
        "data": proto["data"],
        "versions": {"optuna": optuna},
        "protocol": {
            k: v
            for k, v in proto.items()
            if k not in ("levels", "levels_sha256", "data", "versions")
        },
    }
    config["protocol"]["epochs"] = epochs
    return write_run_folder(folder, config, run.records)


def test_load_refuses_one_model_from_runs_of_different_configurations(tmp_path):
    default = _run_folder(tmp_path / "a", (22, 37, 45))
    short = _run_folder(tmp_path / "b", (77, 93), epochs=3)
    for first, second in ((default, short), (short, default)):
        with pytest.raises(
            ValueError,
            match=r"both hold cells of model 'mine', made with "
            r"different configurations \(epochs: (100 → 3|3 → 100)\)",
        ):
            Results.load(first, second)


def test_load_joins_runs_of_one_configuration(tmp_path):
    first = _run_folder(tmp_path / "a", (22, 37, 45))
    rest = _run_folder(tmp_path / "b", (77, 93), optuna="4.5.0")
    both = Results.load(first, rest)
    assert both.summary()[0]["n"] == 5
    found = _found(both)
    assert found["deviations"] == []
    assert any(c.startswith("Optuna 2.3.0 and 4.5.0 instead of") for c in found["caveats"])


# -------------------------------------------------- marks that travel with the numbers
def test_report_tables_carry_the_banner():
    run = paper_like(epochs=10)
    text = run.report()
    # The model named once, over its reasons.
    assert text.startswith("!!! NOT COMPARABLE with the paper: mine !!!\n  - epochs: 10")
    assert not paper_like().report().startswith("!!!")
    assert not run.report(banner=False).startswith("!!!")


def test_the_comparison_report_names_each_reason_once():
    both = paper_like(epochs=10, domains=("in1k", "L1")).compare(reference_results())
    text = both.comparison_report()
    assert text.count("NOT COMPARABLE") == 1 and text.count("epochs: 10 instead of 100") == 1
    assert "\n  mine:\n    - no results for L2, L3, L4, L5\n" in text
    assert "NOT COMPARABLE" not in both.comparison_report(banner=False)


def test_figures_mark_a_non_comparable_model_in_the_legend_and_a_footnote():
    import matplotlib.pyplot as plt

    both = paper_like(epochs=10).compare(reference_results(), models=["s-DINO"])
    figures = both.figures(baseline="ResNet50", highlight=["mine"])
    try:
        for name, fig in figures.items():
            legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
            labels = [t.get_text() for legend in legends for t in legend.get_texts()]
            assert "mine (not comparable)" in labels, (name, labels)
            note = fig._supxlabel.get_text()
            assert note.startswith("(not comparable) mine: epochs: 10 instead of 100"), note
            assert note.count("not comparable") == 1
        clean = paper_like().compare(reference_results(), models=["s-DINO"]).figures()
        texts = [t.get_text() for fig in clean.values() for t in fig.texts]
        texts += [fig._supxlabel.get_text() for fig in clean.values() if fig._supxlabel]
        assert not any("comparable" in t for t in texts), texts
    finally:
        plt.close("all")


def test_report_command_with_the_paper_names_the_banner_and_each_reason_once(tmp_path, capsys):
    from imagenet_cog.cli import main

    run = _run_folder(tmp_path / "a", (22, 37), epochs=3)
    assert main(["report", str(run), "--reference", "paper", "--models", "s-DINO"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Your model among the paper's 2 models")
    assert "\n\n!!! NOT COMPARABLE with the paper: mine !!!" in printed
    assert printed.count("NOT COMPARABLE with the paper") == 1
    assert printed.count("epochs: 3 instead of 100") == 1
    assert printed.count("2 seeds per cell instead of the paper's 5") == 1
    assert "(1)*/3" in printed or "(2)*/3" in printed or "(3)*/3" in printed
    assert main(["report", str(run)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("NOT COMPARABLE") == 1 and printed.count("epochs: 3 instead") == 1


def test_the_official_split_and_sizes_are_the_librarys_defaults_and_the_papers():
    from imagenet_cog._comparability import OFFICIAL_SPLIT, PAPER_TRAIN_IMAGES
    from imagenet_cog.datasets import SPLIT_SEED, TRAIN_CAP

    assert OFFICIAL_SPLIT == {"seed": SPLIT_SEED, "cap": TRAIN_CAP}
    assert sum(v for k, v in PAPER_TRAIN_IMAGES.items() if k != "in1k") == 5_528_577


# ------------------------------------------------------ a name is never provenance
def test_a_run_named_as_a_paper_model_is_checked_never_taken_for_it(tmp_path, capsys):
    from imagenet_cog.cli import main

    # A short test run (2 seeds, 2 epochs) that its author called s-DINO.
    run = _run_folder(tmp_path / "run", (22, 37), epochs=2, model="s-DINO")
    both = Results.load(run).compare(reference_results(), models=["ResNet50"])
    assert both.reference_models() == ["ResNet50"]
    assert both.meta["protocol"]["s-DINO"]["epochs"] == 2  # its own, not the paper's 100
    deviations = comparability(both, by_model=True)["s-DINO"]["deviations"]
    assert "epochs: 2 instead of 100" in deviations
    assert json.loads(both.to_json())["verdict"]["comparable"] == {
        "s-DINO": "no",
        "ResNet50": "reference",
    }
    args = ["report", str(run), "--reference", "paper", "--models", "ResNet50"]
    assert main([*args, "--format", "json"]) == 0
    printed = capsys.readouterr()
    exported = json.loads(printed.out)
    assert exported["verdict"]["comparable"] == {"s-DINO": "no", "ResNet50": "reference"}
    assert exported["meta"]["protocol"]["s-DINO"]["epochs"] == 2
    assert printed.err.startswith("!!! NOT COMPARABLE with the paper: s-DINO !!!")
    # Beside the published s-DINO, it would take its place: refused, in one line.
    assert main(["report", str(run), "--reference", "paper", "--models", "s-DINO"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        (
            "imagenet-cog: error: your results hold a model named 's-DINO', as one of the "
            "reference models they are compared with: its cells would stand for the published "
            "ones. Load them under another name (Results.load(path, model=...), report --name "
            "FOLDER=NAME), or leave "
            "'s-DINO' out of the reference models (models=, report --models)"
        )
    ]
