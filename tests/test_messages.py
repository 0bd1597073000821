"""What a new user reads: every message says what happened and what to do, in one line.

Each test runs the command of one mistake (or of Ctrl-C) on a small fake tree and checks the
text a user sees; tables and plots show a missing cell or measure as missing.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import subprocess_env
from imagefiles import plain_concepts, write_concepts, write_in1k

import imagenet_cog
from imagenet_cog import Levels, Results, evaluate, extract_all, load_levels, reference_results
from imagenet_cog.cli import main
from imagenet_cog.store import list_domains

C1, C2, C3 = "n00000001", "n00000002", "n00000003"
LEVELS = Levels([[C1, C2], [C3, "n00000004"]])
EXTRACT = {"n_test": 1, "preprocessing": {"size": 16}, "batch_size": 8}
FAST = ["--trials", "2", "--epochs", "2", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A fake ImageNet-1K (2 classes) and ImageNet-21K (4 concepts of 6 images), extracted."""
    base = tmp_path_factory.mktemp("tree")
    in1k_wnids, _ = write_in1k(base / "in1k", n_classes=2, n_train=6, n_val=2)
    write_concepts(base / "in21k", plain_concepts([C1, C2, C3, "n00000004"], 6))
    data = {"in1k": base / "in1k", "in21k": base / "in21k"}
    store = base / "features" / "tiny"
    extract_all(
        "torchvision:resnet18",
        data,
        store,
        LEVELS,
        wnids={"in1k": in1k_wnids},
        progress=False,
        **EXTRACT,
    )
    return {"data": data, "store": store, "in1k_wnids": in1k_wnids, "base": base}


def _error(capsys):
    """The one line a failed command printed on stderr."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("imagenet-cog: error: ")
    return lines[0].removeprefix("imagenet-cog: error: ")


def _env():
    return subprocess_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


#: ``python -m imagenet_cog``, with Ctrl-C raising KeyboardInterrupt as in a terminal (a shell
#: may start a background job with SIGINT ignored, and Python then keeps it ignored).
ENTRY = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'imagenet-cog'; runpy.run_module('imagenet_cog', run_name='__main__')"
)


def _interrupt(argv, ready, cwd):
    """Run ``imagenet-cog argv``, send it SIGINT once ``ready()`` holds; (rc, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, *argv],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while proc.poll() is None and not ready() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the command finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


# -------------------------------------------------------------------- 1. Ctrl-C
@pytest.mark.slow
def test_ctrl_c_in_evaluate_prints_one_line_exits_130_and_the_same_command_resumes(tree, tmp_path):
    out = tmp_path / "run"
    runs = out / "runs.jsonl"
    argv = [
        "evaluate",
        str(tree["store"]),
        "--out",
        str(out),
        "--domains",
        "in1k,L1,L2",
        "--shots",
        "1,2,all",
        "--seeds",
        "22,37",
        "--trials",
        "3",
        "--epochs",
        "300",
        "--device",
        "cpu",
    ]
    code, err = _interrupt(
        argv, lambda: runs.is_file() and runs.read_bytes().count(b"\n"), tmp_path
    )
    assert code == 130, err
    assert "Traceback" not in err
    n = runs.read_bytes().count(b"\n")
    assert 1 <= n < 18
    assert err.splitlines()[-1] == (
        f"imagenet-cog: interrupted; {n} finished cell{'s' * (n > 1)} saved in {runs}; the same "
        "command resumes with the others"
    )
    done = subprocess.run(
        [sys.executable, "-m", "imagenet_cog", *argv, "--quiet"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    cells = [json.loads(x) for x in runs.read_text().splitlines()]
    assert len({(c["domain"], str(c["shots"]), c["seed"]) for c in cells}) == len(cells) == 18


@pytest.mark.slow
def test_ctrl_c_in_extract_says_what_is_saved_and_resumes(tree, tmp_path):
    out = tmp_path / "features"
    LEVELS.save(tmp_path / "levels")
    argv = [
        "extract",
        "torchvision:resnet18",
        "--in21k",
        str(tree["data"]["in21k"]),
        "--levels",
        str(tmp_path / "levels"),
        "--out",
        str(out),
        "--n-test",
        "1",
        "--preprocessing",
        '{"size": 16}',
        "--batch-size",
        "1",
        "--shard-size",
        "1",
        "--device",
        "cpu",
    ]
    code, err = _interrupt(argv, lambda: len(list(out.glob("*/*/shard-*.json"))) >= 2, tmp_path)
    assert code == 130, err
    assert "Traceback" not in err
    line = err.splitlines()[-1]
    assert line.startswith(f"imagenet-cog: interrupted; saved in {out}: ")
    assert line.endswith("; the same command resumes from there")
    assert "finished shard" in line or "finished store" in line
    done = subprocess.run(
        [sys.executable, "-m", "imagenet_cog", *argv, "--quiet"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert list_domains(out) == ["L1", "L2"]


def test_ctrl_c_with_traceback_shows_the_traceback(tree, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("imagenet_cog.protocol.evaluate", interrupted)
    argv = ["evaluate", str(tree["store"]), "--out", str(tmp_path / "r"), *FAST]
    try:
        code = main(argv)
    except KeyboardInterrupt:  # not as a user's Ctrl-C of pytest itself
        pytest.fail("Ctrl-C came out of main() as a traceback")
    assert code == 130
    with pytest.raises(KeyboardInterrupt):
        main(["--traceback", *argv])


def test_output_piped_into_head_ends_quietly(tmp_path):
    # `imagenet-cog report ... | head -3`: the reader leaves early, which is no error.
    import fcntl

    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("needs Linux's F_SETPIPE_SZ")
    read_end, write_end = os.pipe()
    # A pipe smaller than the report: the command is still writing when the reader leaves.
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    argv = [sys.executable, "-m", "imagenet_cog", "report", "--reference", "paper"]
    proc = subprocess.Popen(
        argv, stdout=write_end, stderr=subprocess.PIPE, env=_env(), cwd=tmp_path
    )
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.readline().startswith(b"top-1")
    err = proc.communicate(timeout=600)[1].decode()
    assert err == "" and proc.returncode == 1


# ------------------------------------------- 2. resuming with other settings
def test_a_resume_with_other_settings_names_only_what_differs(tree, tmp_path, capsys):
    argv = [
        "evaluate",
        str(tree["store"]),
        "--out",
        str(tmp_path / "r"),
        "--domains",
        "in1k",
        "--shots",
        "all",
        "--seeds",
        "22",
        *FAST,
    ]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--trials", "3"]) == 2
    message = _error(capsys)
    assert (
        f"{tmp_path / 'r'} holds results of a different configuration (protocol.n_trials: 2 → 3)"
        in message
    )
    assert "epochs" not in message and "{" not in message


# --------------------------------------------- 3, 4. a path that holds no store
def test_a_mistyped_features_path_says_there_is_no_store_there(tmp_path, capsys):
    missing = tmp_path / "nonexistent" / "features"
    assert main(["evaluate", str(missing), "--out", str(tmp_path / "m2")]) == 2
    message = _error(capsys)
    assert message.startswith(f"no feature store at {missing}: no such folder")
    assert "model spec" not in message and "data=" not in message and "store=" not in message
    assert not (tmp_path / "m2").exists()


def test_the_wrong_folder_says_what_is_there_and_suggests_the_store(tree, tmp_path, capsys):
    store = tree["store"]
    # The parent of the store (a folder of stores, one per model).
    assert main(["evaluate", str(store.parent), "--out", str(tmp_path / "a")]) == 2
    assert _error(capsys).endswith(f"did you mean {store}?")
    # A domain folder inside the store.
    assert main(["evaluate", str(store / "L1"), "--out", str(tmp_path / "a")]) == 2
    message = _error(capsys)
    assert "a domain folder of a store" in message and message.endswith(f"did you mean {store}?")
    # An evaluate output folder.
    run = tmp_path / "results"
    assert (
        main(
            [
                "evaluate",
                str(store),
                "--out",
                str(run),
                "--domains",
                "in1k",
                "--shots",
                "all",
                "--seeds",
                "22",
                *FAST,
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["evaluate", str(run), "--out", str(tmp_path / "b")]) == 2
    assert "is an evaluate output folder (runs.jsonl), not a feature store" in _error(capsys)
    # A store root with an unfinished store.
    partial = tmp_path / "partial"
    (partial / "L1" / "train").mkdir(parents=True)
    (partial / "L1" / "train" / "run.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"unfinished stores \(L1/train\): run the same"):
        evaluate(partial, domains=("L1",))


def test_the_guide_uses_one_layout_a_store_folder_per_model():
    root = Path(__file__).resolve().parents[1]
    texts = [(root / "README.rst").read_text()] + [
        p.read_text() for p in (root / "docs").rglob("*.rst") if "_build" not in p.parts
    ]
    for text in texts:
        # evaluate and analyze read one model's store folder, never the folder above it.
        assert 'evaluate("features/"' not in text and "evaluate features/ " not in text
        assert 'analyze("features/"' not in text and "analyze features/ " not in text
        assert not any(line.rstrip().endswith("--out features/") for line in text.splitlines())


# ---------------------------------------------------- 5. values a flag refuses
def test_shots_0_says_what_is_allowed(tree, tmp_path, capsys):
    argv = ["evaluate", str(tree["store"]), "--out", str(tmp_path / "r")]
    assert main([*argv, "--shots", "0"]) == 2
    assert _error(capsys) == "shots must be a positive number of images per class or 'all', got 0"
    assert main([*argv, "--shots", "1,many"]) == 2
    assert _error(capsys).endswith("or 'all', got 'many'")
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------ 6. report's baseline
def test_a_paper_baseline_without_the_paper_hints_at_reference_paper(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    cells = [
        {"model": "mine", "domain": d, "shots": "all", "seed": 22, "top1": 60.0}
        for d in ("in1k", "L5")
    ]
    (run / "runs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    assert main(["report", str(run), "--baseline", "ResNet50"]) == 2
    message = _error(capsys)
    assert message.endswith("ResNet50 is one of the paper's models: add --reference paper")
    assert main(["report", str(run), "--baseline", "nobody"]) == 2
    assert "--reference" not in _error(capsys)


# ----------------------------------------------------------------- 7, 8. levels
def _pool(tmp_path, n=40):
    pool = load_levels("official").levels[0][:n]
    (tmp_path / "pool.txt").write_text("\n".join(pool) + "\n")
    return pool, [
        "levels",
        "--candidates",
        str(tmp_path / "pool.txt"),
        "--n-levels",
        "2",
        "--level-size",
        "10",
        "--out",
        str(tmp_path / "out"),
    ]


def test_levels_without_counts_says_it_once_with_the_command_line_options(tmp_path, capsys):
    _, argv = _pool(tmp_path)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.count("warning") == 0 and "image_counts" not in captured.out
    said = [x for x in captured.out.splitlines() if "min-images filter" in x]
    assert len(said) == 1 and "--images ROOT" in said[0] and "--counts FILE" in said[0]


def test_levels_from_a_partial_copy_names_the_filter_that_removed_the_concepts(tmp_path, capsys):
    pool, argv = _pool(tmp_path)
    counts = tmp_path / "counts.tsv"  # what a copy holding only three concepts counts
    counts.write_text("".join(f"{w}\t900\n" for w in pool[:3]))
    assert main([*argv, "--counts", str(counts)]) == 2
    message = _error(capsys)
    assert message.startswith(
        "3 eligible concepts remain after the filters, fewer than the 2 "
        "levels x 10 concepts asked for (20): the min_images filter"
    )
    assert "removed 37 of 40, 37 of them absent from the image counts" in message
    assert message.endswith(
        "Removed by each filter: seen 0, min_images 37, exclude 0, leaves 0, blocklist 0"
    )


# -------------------------------------------------------------- 9. no model
def test_extract_without_a_model_says_so(tmp_path, capsys):
    assert main(["extract", "--in1k", str(tmp_path), "--out", str(tmp_path / "f")]) == 2
    message = _error(capsys)
    assert message.startswith("no model given: name the network") and "once" not in message
    assert (
        main(
            [
                "extract",
                "torchvision:resnet18",
                "--model",
                "torchvision:resnet50",
                "--in1k",
                str(tmp_path),
                "--out",
                str(tmp_path / "f"),
            ]
        )
        == 2
    )
    assert _error(capsys).startswith("two models given, torchvision:resnet18 and --model ")


# ------------------------------------------------- 11. missing cells in a table
def test_the_rank_table_shows_missing_domains_as_missing():
    mine = Results(
        [
            {"model": "mine", "domain": d, "shots": "all", "seed": s, "top1": 60.0}
            for d in ("in1k", "L5")
            for s in (22, 37, 45, 77, 93)
        ]
    )
    text = mine.compare(reference_results(), models=["s-DINO"]).comparison_report()
    assert "nan" not in text
    rows = {
        line.split("  ")[0]: line.split()[-6:]
        for line in text.splitlines()
        if line.startswith("mine ")
    }
    assert rows["mine rank"][1:5] == rows["mine top-1"][1:5] == ["-"] * 4
    assert rows["mine vs ResNet50"][1:5] == ["-"] * 4
    assert rows["mine rank"][0].endswith("/3") and rows["mine top-1"][0] == "60.0"


# ---------------------------------------------------- 12. a probe without errors
def test_analyze_says_there_are_no_errors_and_draws_no_empty_panel(tmp_path, capsys):
    from imagenet_cog._runfolder import write_predictions
    from imagenet_cog.analysis import plot_analysis

    wnids = np.asarray(list(imagenet_cog.imagenet1k_wnids())[:4])
    y = np.repeat(wnids, 3)
    top = np.searchsorted(wnids, y)[:, None]
    write_predictions(
        tmp_path / "run" / "predictions",
        "in1k",
        "all",
        22,
        y_true=y,
        y_pred=y,
        top5=top,
        classes=wnids,
    )
    png = tmp_path / "a.png"
    assert main(["analyze", str(tmp_path / "run"), "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    assert "in1k: no errors in 12 test predictions (N=all, seed 22)" in captured.out
    assert "most frequent confusions" not in captured.out
    assert "no plot: no value to plot" in captured.err and not png.exists()

    nan = math.nan
    scores = {
        "IN-1K": {"nmi": 0.6, "purity": 0.7, "wup": nan, "path": None},
        "L5": {"nmi": 0.4, "purity": 0.5, "wup": nan, "path": None},
    }
    fig = plot_analysis(scores, metrics=["purity", "nmi", "path", "wup"])
    drawn = [ax for ax in fig.axes if ax.get_visible()]
    assert len(drawn) == 2 and all(ax.get_title() for ax in drawn)
    assert "not drawn, no value in any domain: Path similarity" in fig.get_supxlabel()


# ---------------------------------------------------------- 13. progress bars
def test_progress_false_hides_the_extraction_bars_too(tree, tmp_path, capsys):
    kw = {"shots": ("all",), "seeds": (22,), "n_trials": 2, "epochs": 2, "device": "cpu"}
    res = evaluate(
        "torchvision:resnet18",
        data={"in21k": tree["data"]["in21k"]},
        store=tmp_path / "f",
        levels=LEVELS,
        domains=("L1",),
        progress=False,
        extract_options=EXTRACT,
        **kw,
    )
    assert res.models == ["resnet18-random"]
    assert capsys.readouterr().err == ""


def test_a_finished_extract_shows_no_empty_bars(tree, capsys):
    again = extract_all(
        "torchvision:resnet18",
        tree["data"],
        tree["store"],
        LEVELS,
        wnids={"in1k": tree["in1k_wnids"]},
        **EXTRACT,
    )
    assert again == tree["store"]
    assert capsys.readouterr().err == ""


def test_the_command_leaves_at_once_after_ctrl_c_and_returns_other_codes(monkeypatch):
    from imagenet_cog import cli

    left = []

    def leave(code):  # os._exit, which would end the test process
        left.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", leave)
    monkeypatch.setattr(cli, "main", lambda: cli.INTERRUPTED)
    with pytest.raises(SystemExit):
        cli.run()
    assert left == [130]
    monkeypatch.setattr(cli, "main", lambda: 2)
    assert cli.run() == 2
    assert left == [130]


# ------------------------------------------------- one line where a traceback was
def _extract_argv(tree, tmp_path, *extra):
    LEVELS.save(tmp_path / "levels")
    return [
        "extract",
        *extra,
        "--in21k",
        str(tree["data"]["in21k"]),
        "--levels",
        str(tmp_path / "levels"),
        "--out",
        str(tmp_path / "features"),
        "--n-test",
        "1",
        "--preprocessing",
        '{"size": 16}',
        "--quiet",
    ]


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "device 'tpu' is not a device name: use 'cpu', 'cuda' or 'cuda:N'"),
        ("cuda:-1", "device 'cuda:-1' is not a device name: use 'cpu', 'cuda' or 'cuda:N'"),
        ("mps", "device='mps', but torch sees no Apple GPU (MPS) here: use 'cpu'"),
    ],
)
def test_extract_on_a_device_that_is_not_here_says_so_in_one_line(
    tree, tmp_path, capsys, device, message
):
    import torch

    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has an Apple GPU")
    argv = _extract_argv(tree, tmp_path, "torchvision:resnet18:none", "--device", device)
    assert main(argv) == 2
    assert _error(capsys) == message


def test_a_checkpoint_with_many_keys_of_another_shape_is_one_line(tree, tmp_path, capsys):
    import torch
    import torchvision

    narrow = {  # every convolution one input channel short: 20 keys of another shape
        k: v[:, :-1] if k.endswith(("conv1.weight", "conv2.weight")) else v
        for k, v in torchvision.models.resnet18().state_dict().items()
    }
    torch.save(narrow, tmp_path / "narrow.pth")
    argv = _extract_argv(tree, tmp_path, f"torchvision:resnet18:{tmp_path / 'narrow.pth'}")
    assert main(argv) == 2
    message = _error(capsys)
    assert message.startswith(
        f"{tmp_path / 'narrow.pth'}: 17 weights of the file differ in shape from the network's, "
        "e.g. conv1.weight ((64, 2, 7, 7) vs (64, 3, 7, 7)), "
    )
    assert message.endswith(", and 12 more: it was made for another architecture or width")


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0, reason="mounts a tmpfs (root)"
)
def test_evaluate_on_a_full_disk_names_the_file_it_could_not_write(tree, tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(full)]
    if subprocess.run(mount, check=False, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (full / "run").mkdir()
        fd = os.open(full / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            for _ in range(100):  # until not one byte more fits
                os.write(fd, b"x" * 1024)
        except OSError:
            pass
        finally:
            os.close(fd)
        argv = ["evaluate", str(tree["store"]), "--out", str(full / "run"), "--shots", "all"]
        assert main([*argv, *FAST]) == 2
        assert _error(capsys) == (f"[Errno 28] No space left on device: '{full / 'run' / '.lock'}'")
    finally:
        subprocess.run(["umount", str(full)], check=False)


def test_selftest_of_a_model_that_resizes_both_sides_checks_the_tensor_path(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "vit"
    transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    ).save_pretrained(folder)
    processor = {"image_processor_type": "ViTImageProcessor", "size": {"height": 224, "width": 224}}
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    code = main(
        ["selftest", "--device", "cpu", "--only", "decoder", "--model", f"hf:{folder}:none"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "decoder='pil'" not in captured.out + captured.err
    # The tensor path resizes both sides as Pillow does: the row compares, and they agree.
    row = next(line for line in captured.out.splitlines() if "tensor decoder vs Pillow" in line)
    assert " ok " in row and "pixels: mean |d| 0.00, max 0 of 255" in row
