"""k-NN and zero-shot on the levels as rows of the table of analyses: the k-NN grid on the
linear protocol's own draws (every shots value, five seeds), recorded, resumed and bound by
checksum; and what every report shows of them, each named by its protocol, never ranked with
the paper's linear-probe numbers."""

import hashlib
import json
import re

import numpy as np
import pytest
from test_knn import brute_force
from test_zeroshot import clip_arch, clip_weights  # noqa: F401 - the fixtures

from imagenet_cog import Results, evaluate, imagenet1k_wnids, make_search_spec, reference_results
from imagenet_cog._analysis import knn_grid
from imagenet_cog._grid import SEEDS, SHOTS
from imagenet_cog._neighbors.votes import DINO_KS, DINO_TEMPERATURE
from imagenet_cog._runfolder import read_analysis
from imagenet_cog.analysis import analyze, plan_knn
from imagenet_cog.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

#: Real IN-1K wnids: the reports name the concepts.
WNIDS = list(imagenet1k_wnids())[:6]


def domain(sep, seed, per_class=161, n_test=5, dim=16):
    """Gaussian classes with enough images per class for N = 128 (the search's 80% holds
    128 of 161) and k = 200 in the all-data cell."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(WNIDS), dim)) * sep
    i_tr = np.repeat(np.arange(len(WNIDS)), per_class)
    i_te = np.repeat(np.arange(len(WNIDS)), n_test)
    X_tr = (centers[i_tr] + rng.normal(size=(i_tr.size, dim))).astype(np.float32)
    X_te = (centers[i_te] + rng.normal(size=(i_te.size, dim))).astype(np.float32)
    return X_tr, np.asarray(WNIDS)[i_tr], X_te, np.asarray(WNIDS)[i_te]


FEATURES = {"L1": domain(1.2, 0), "L5": domain(0.5, 1)}
FAST = {"knn_shots": (1, 4, "all"), "knn_seeds": (22, 37), "device": "cpu"}


def _records(folder):
    return [json.loads(line) for line in (folder / "knn.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------ the grid itself
def test_every_cell_searches_the_linear_protocols_draw_and_equals_the_brute_force(tmp_path):
    # The default protocol's shape: every shots value beside "all", the five seeds.
    report = analyze(FEATURES, out=tmp_path, analyses=["knn"], device="cpu")
    records = _records(tmp_path)
    for name, (X, y, X_test, y_test) in FEATURES.items():
        mine = [r for r in records if r["domain"] == name]
        few = {(r["shots"], r["seed"]) for r in mine if r["shots"] != "all"}
        assert few == {(n, s) for n in SHOTS if n != "all" for s in SEEDS}
        # The all-data cell does not depend on the seed: computed and recorded once.
        assert [r["seed"] for r in mine if r["shots"] == "all"] == [None]
        classes, codes = np.unique(y, return_inverse=True)
        truth = np.searchsorted(classes, y_test)
        for r in mine:
            assert r["settings"]["ks"] == list(DINO_KS)
            assert r["settings"]["temperature"] == DINO_TEMPERATURE
            if r["shots"] == "all":
                idx = np.arange(len(y))
                assert r["draw_sha256"] is None and r["draw"] == "all training images"
            else:
                idx = make_search_spec(y, r["seed"], n_shots=r["shots"]).final_idx
                digest = hashlib.sha256(idx.astype(np.int64).tobytes()).hexdigest()
                assert r["draw_sha256"] == digest
            assert r["n_train"] == len(idx) and r["k_searched"] == min(200, len(idx))
            ks = [min(k, len(idx)) for k in DINO_KS]
            _, _, probas = brute_force(X[idx], codes[idx], X_test, set(ks), DINO_TEMPERATURE, 6)
            for k, used in zip(DINO_KS, ks):
                ranked = np.argsort(-probas[used], axis=1, kind="stable")[:, :5]
                top1 = 100 * np.mean(ranked[:, 0] == truth)
                top5 = 100 * np.mean((ranked == truth[:, None]).any(axis=1))
                assert r["top1"][str(k)] == pytest.approx(top1), (name, r["shots"], r["seed"], k)
                assert r["top5"][str(k)] == pytest.approx(top5)
                hits = np.bincount(truth, weights=ranked[:, 0] == truth, minlength=6)
                assert r["concept_hits"][str(k)] == hits.astype(int).tolist()
        # The domain's row: the all-data cell at each k; the grid: each N's mean over seeds.
        whole = next(r for r in mine if r["shots"] == "all")
        row = report.domains[name]
        assert row["knn20_top1"] == whole["top1"]["20"]
        assert row["knn200_top5"] == whole["top5"]["200"]
        grid = {c["shots"]: c for c in report.to_dict()["knn"][name]["grid"]}
        eight = [r["top1"]["10"] for r in mine if r["shots"] == 8]
        assert grid[8]["top1"]["10"]["mean"] == pytest.approx(np.mean(eight))
        assert grid[8]["top1"]["10"]["std"] == pytest.approx(np.std(eight))
        assert grid[8]["seeds"] == list(SEEDS) and grid["all"]["seeds"] is None
    saved = json.loads((tmp_path / "analysis.json").read_text())
    digest = hashlib.sha256((tmp_path / "knn.jsonl").read_bytes()).hexdigest()
    assert saved["inputs"]["records"] == {"knn.jsonl": digest}
    assert saved["settings"]["knn"]["draws"] == knn_grid.DRAW_RULE


def test_a_shots_value_a_class_cannot_give_is_skipped_and_said(tmp_path):
    small = {"L1": domain(1.0, 2, per_class=12)}
    report = analyze(small, out=tmp_path, analyses=["knn"], device="cpu", knn_seeds=(22,))
    skipped = report.to_dict()["knn"]["L1"]["skipped"]
    assert sorted(skipped, key=int) == ["16", "32", "64", "128"]
    assert "fewer than 16" in skipped["16"] or "16" in skipped["16"]
    assert {r["shots"] for r in _records(tmp_path)} == {1, 2, 4, 8, "all"}


# ------------------------------------------------------------------------ resumed, bound
def test_a_rerun_reads_every_cell_back_and_a_killed_run_computes_only_its_last_cell(
    tmp_path, monkeypatch
):
    first = analyze(FEATURES, out=tmp_path, analyses=["knn"], **FAST)
    text = (tmp_path / "knn.jsonl").read_text()
    assert len(text.splitlines()) == 2 * (2 * 2 + 1)
    calls = []
    real = knn_grid.knn_cell
    monkeypatch.setattr(knn_grid, "knn_cell", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = analyze(FEATURES, out=tmp_path, analyses=["knn"], **FAST)
    assert calls == [] and again.domains == first.domains
    assert (tmp_path / "knn.jsonl").read_text() == text
    # Killed while writing its last cell: that line is half there.
    lines = text.splitlines(keepends=True)
    (tmp_path / "knn.jsonl").write_text("".join(lines[:-1]) + lines[-1][:50])
    with pytest.warns(RuntimeWarning, match="dropping an unfinished last line"):
        third = analyze(FEATURES, out=tmp_path, analyses=["knn"], **FAST)
    assert len(calls) == 1 and third.domains == first.domains
    assert (tmp_path / "knn.jsonl").read_text().splitlines()[:-1] == text.splitlines()[:-1]
    assert (
        json.loads((tmp_path / "knn.jsonl").read_text().splitlines()[-1])["top1"]
        == (json.loads(lines[-1])["top1"])
    )


def test_an_edited_record_other_settings_and_other_features_are_refused(tmp_path):
    analyze(FEATURES, out=tmp_path, analyses=["knn"], **FAST)
    path = tmp_path / "knn.jsonl"
    text = path.read_text()
    # Another k, or another temperature: other settings, never mixed in.
    with pytest.raises(ValueError, match=r"knn.jsonl holds knn cells of other settings \(ks: "):
        analyze(FEATURES, out=tmp_path, analyses=["knn"], knn_k=(10, 20), **FAST)
    with pytest.raises(ValueError, match=r"temperature: 0\.07 → 0\.1"):
        analyze(FEATURES, out=tmp_path, analyses=["knn"], knn_temperature=0.1, **FAST)
    # The features of a domain changed since its cells were computed.
    X, y, X_test, y_test = FEATURES["L5"]
    other = {**FEATURES, "L5": (X + 1, y, X_test, y_test)}
    with pytest.raises(ValueError, match=r"knn.jsonl:\d+ \(L5, 1, 22\) was computed from other"):
        analyze(other, out=tmp_path, analyses=["knn"], **FAST)
    # An accuracy edited by hand.
    lines = text.splitlines(keepends=True)
    edited = json.loads(lines[0])
    edited["top1"]["10"] += 1
    path.write_text(json.dumps(edited, sort_keys=True) + "\n" + "".join(lines[1:]))
    with pytest.raises(ValueError, match=r"knn.jsonl:1: edited after it was written"):
        analyze(FEATURES, out=tmp_path, analyses=["knn"], **FAST)
    path.write_text(text)
    # analysis.json is bound to the records it was made from.
    analyze(FEATURES, out=tmp_path, analyses=["knn"], **FAST)
    read_analysis(tmp_path / "analysis.json")
    path.write_text(text + text.splitlines(keepends=True)[0])
    with pytest.raises(ValueError, match=r"computed from another knn\.jsonl than the folder holds"):
        read_analysis(tmp_path / "analysis.json")


def test_the_plan_counts_every_cell_and_computes_nothing(tmp_path, capsys, monkeypatch):
    def no_search(*a, **k):
        raise AssertionError("the plan computed a cell")

    monkeypatch.setattr(knn_grid, "knn_cell", no_search)
    plan = plan_knn(FEATURES, device="cpu")
    assert [r["cells"] for r in plan.rows] == [41, 41]
    n_test, d = 30, 16
    rows = sum(n * 6 for n in SHOTS if n != "all") * len(SEEDS) + 6 * 161
    assert plan.rows[0]["flop"] == 2 * n_test * rows * d
    assert plan.flop == 2 * plan.rows[0]["flop"] and plan.seconds > 0
    assert 0 < plan.peak_bytes < 1e8
    text = plan.table()
    assert text.startswith("k-NN plan on cpu: k = 10, 20, 100, 200, N = 1, 2, 4, 8, 16, 32, 64")
    assert "total" in text and "GFLOP/s" in text
    # A small grid in units that fit it: no 0.000x TFLOP, no "0 s".
    head = text.splitlines()[1].split()
    assert head[5:8] == ["MFLOP", "peak", "kB"], head
    assert "0.000" not in text and " 0 s" not in text


# ------------------------------------------------------------------------ what is shown
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A linear-probe run with saved predictions, and the k-NN grid beside it."""
    out = tmp_path_factory.mktemp("run")
    evaluate(
        FEATURES,
        domains=("L1", "L5"),
        shots=(1, 4, "all"),
        seeds=(22, 37),
        n_trials=2,
        n_startup_trials=1,
        epochs=2,
        device="cpu",
        out=out,
        model="toy",
        progress=False,
        save_predictions=True,
    )
    analyze(FEATURES, out=out, analyses=["alignment", "knn"], model="toy", **FAST)
    return out


def test_the_report_shows_each_protocol_by_name_with_its_change_from_l1_to_l5(run, capsys):
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    results = Results.load(run)
    knn = json.loads((run / "analysis.json").read_text())["domains"]
    linear = (
        100 * (results.mean("toy", "L5") - results.mean("toy", "L1")) / results.mean("toy", "L1")
    )
    change = 100 * (knn["L5"]["knn20_top1"] - knn["L1"]["knn20_top1"]) / knn["L1"]["knn20_top1"]
    block = out[out.index("toy: top-1 (%) under each protocol") :]
    lines = block.splitlines()
    assert lines[1].split() == ["protocol", "L1", "L5", "L1→L5"]
    assert lines[2].startswith("linear probe (the paper's protocol)")
    assert lines[2].endswith(f"{linear:+.1f}%")
    assert lines[3].startswith("k-NN, k = 20, T = 0.07")
    assert lines[3].endswith(f"{change:+.1f}%")
    assert f"{knn['L5']['knn20_top1']:.1f}" in lines[3]
    assert (
        "(k-NN is another protocol than the paper's linear probe: shown beside it, never "
        "ranked with the paper's numbers.)" in out
    )
    # The analysis table heads its columns by protocol; the caveats say what they are.
    assert "k-NN@10  k-NN@20  k-NN@100  k-NN@200" in out
    assert "its k-NN accuracies (analysis.json) are not the paper's protocol" in out


def test_among_the_papers_models_only_the_linear_probe_is_ranked(run, capsys):
    results = Results.load(run).compare(reference_results())
    assert len(results.models) == 32  # the paper's 31 and the run's linear probe
    assert all("k-NN" not in m and "knn" not in m.lower() for m in results.models)
    ranks = results.ranks()
    assert set(ranks) == set(results.models)
    assert main(["report", str(run), "--reference", "paper"]) == 0
    out = capsys.readouterr().out
    answer = out[: out.index("toy: top-1 (%) under each protocol")]
    assert "k-NN" not in answer.split("Caveats")[0]
    assert "k-NN, k = 20, T = 0.07" in out


def test_the_exports_carry_the_evaluations_and_their_label(run):
    results = Results.load(run)
    exported = json.loads(results.to_json())
    payload = exported["meta"]["analysis"]["toy"]
    assert payload["settings"]["knn"]["protocol"] == "k-NN"
    assert {c["shots"] for c in payload["knn"]["L5"]["grid"]} == {1, 4, "all"}
    caveats = exported["verdict"]["caveats"]["toy"]
    assert any("k-NN accuracies (analysis.json) are not the paper's protocol" in c for c in caveats)
    assert "k-NN accuracies" in results.to_markdown()


def test_the_html_page_shows_the_protocols_side_by_side_the_curves_and_each_concept(run):
    results = Results.load(run)
    page = results.to_html(reference=False)
    assert '<a href="#protocols">protocols</a>' in page
    section = re.search(r'<section id="protocols">.*?</section>', page, re.DOTALL)[0]
    assert "Under each protocol: the linear probe, k-NN</h2>" in section
    assert "k-NN is another protocol than the paper&#x27;s linear probe" in section
    assert "zero-shot" not in section  # a run without zero-shot does not mention it
    assert section.count("<tr>") == 3  # a head, the linear probe, the k-NN
    assert (
        '<td class="text" title="all training images (one cell, no seed)">k-NN, k = 20' in section
    )
    assert "<svg" in section  # the protocols side by side, as Figure 3a
    answer = re.search(r'<section id="answer".*?</section>', page, re.DOTALL)[0]
    assert "k-NN" not in answer  # the answer and its ranks are the linear probe's
    analyses = re.search(r'<section id="analyses">.*?</section>', page, re.DOTALL)[0]
    assert ">k-NN@20</th>" in analyses and 'id="figure-knn"' in analyses  # the few-shot curves
    concepts = re.search(r'<section id="concepts">.*?</section>', page, re.DOTALL)[0]
    payload = json.loads((run / "analysis.json").read_text())
    per = payload["knn"]["L5"]["concepts"]
    assert "toy: k-NN, k = 20, T = 0.07 top-1 (%)" in concepts
    assert (
        "The k-NN columns: top-1 on the concept's test images (k-NN with all the training "
        "images), another protocol than the linear probe." in concepts
    )
    assert "zero-shot" not in concepts
    value = per["top1"]["20"][0]
    assert f'<td data-sort="{round(value, 4)}">{value:.1f}</td>' in concepts


def test_the_few_shot_figure_draws_a_line_per_k_in_each_domain(run, tmp_path):
    from imagenet_cog._analysis.evaluation_figures import knn_fewshot_figure

    payload = json.loads((run / "analysis.json").read_text())
    fig = knn_fewshot_figure(payload, "toy")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
    assert [ax.get_title() for ax in panels] == ["L1", "L5"]
    grid = {c["shots"]: c for c in payload["knn"]["L5"]["grid"]}
    line = panels[1].lines[1]  # k = 20
    np.testing.assert_allclose(
        line.get_ydata(), [grid[s]["top1"]["20"]["mean"] for s in (1, 4, "all")]
    )
    assert "another protocol than the paper's linear probe" in fig._suptitle.get_text()
    fig.savefig(tmp_path / "knn.png")


# ------------------------------------------------------------------------ zero-shot
def _clip_store(spec, tmp_path):
    """An IN-1K store of 3 concepts extracted with an OpenCLIP spec: its image embeddings."""
    from imagefiles import write_in1k

    from imagenet_cog import extract

    wnids, _ = write_in1k(tmp_path / "in1k", n_classes=3, n_train=4, n_val=2)
    for split in ("train", "test"):
        extract(
            spec,
            tmp_path / "in1k",
            "in1k",
            split,
            tmp_path / "store",
            wnids=wnids,
            batch_size=8,
            progress=False,
        )
    return tmp_path / "store", sorted(wnids)


def _other_weights(spec, tmp_path):
    """The same architecture with other image-tower weights, in another file."""
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(spec.rsplit(":", 1)[1])
    key = next(k for k in state if k.startswith("visual.") and state[k].ndim >= 2)
    state[key] = state[key] + torch.ones_like(state[key])
    path = tmp_path / "other.safetensors"
    save_file(state, str(path))
    return f"{spec.rsplit(':', 1)[0]}:{path}"


TEMPLATES = ["a photo of a {c}.", "art of the {c}."]


def test_zero_shot_on_a_store_is_bound_to_its_image_tower_recorded_and_resumed(
    clip_weights,  # noqa: F811 - the fixture
    tmp_path,
    monkeypatch,
):
    from imagenet_cog._analysis import zeroshot_domain
    from imagenet_cog._analysis.classnames import shipped_class_names
    from imagenet_cog._analysis.zeroshot import class_embeddings, zero_shot_top
    from imagenet_cog._models.text_towers import load_text_tower
    from imagenet_cog.store import load_domain, open_store

    spec, _ = clip_weights
    store, wnids = _clip_store(spec, tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    kw = {"analyses": ["zeroshot"], "templates": TEMPLATES, "device": "cpu"}
    report = analyze(store, out=out, embeddings_cache=cache, **kw)
    # The same numbers as the text tower's embeddings of the package's names give.
    _, _, X_test, y_test = load_domain(store, "in1k")
    names = [shipped_class_names()[w] for w in wnids]
    emb, _ = class_embeddings(load_text_tower(spec), names, TEMPLATES, cache_dir=False)
    top = zero_shot_top(X_test, emb, top=3)
    truth = np.searchsorted(wnids, y_test)
    row = report.domains["in1k"]
    assert row["zeroshot_top1"] == pytest.approx(100 * np.mean(top[:, 0] == truth))
    assert row["zeroshot_top5"] == pytest.approx(100.0)  # 3 concepts: always in the top 5
    (record,) = [json.loads(x) for x in (out / "zeroshot.jsonl").read_text().splitlines()]
    image = open_store(store / "in1k" / "test").key
    # The text tower's identity is bound to the store's image tower, both from one spec.
    assert record["settings"]["image_tower"] == {
        "weights_sha256": image["weights_sha256"],
        "layer": "feature:image_embedding",
    }
    assert record["settings"]["text_tower"]["spec"] == spec  # the file the store recorded
    assert record["settings"]["templates"]["n"] == 2
    assert record["inputs"]["classnames"]["source"].startswith("imagenet_cog data/")
    hits = np.bincount(truth, weights=top[:, 0] == truth, minlength=3).astype(int).tolist()
    assert record["concept_hits"] == hits and record["concepts"] == wnids
    section = report.to_dict()["zeroshot"]["in1k"]["concepts"]
    assert section["wnids"] == wnids and section["top1"] == [50.0 * h for h in hits]

    def no_embeddings(*a, **k):
        raise AssertionError("the domain was computed again")

    with monkeypatch.context() as patched:
        patched.setattr(zeroshot_domain, "class_embeddings", no_embeddings)
        again = analyze(store, out=out, embeddings_cache=cache, **kw)
        assert again.domains == report.domains
        with pytest.raises(
            ValueError, match=r"zeroshot.jsonl holds zeroshot cells of other settings"
        ):
            analyze(store, out=out, analyses=["zeroshot"], templates=TEMPLATES[:1], device="cpu")
    # A text tower of another model is refused: it does not belong to the store's image tower.
    other = _other_weights(spec, tmp_path)
    with pytest.raises(
        ValueError, match=r"the text tower of .* does not belong to the image tower"
    ):
        analyze(store, analyses=["zeroshot"], text_tower=other, templates=TEMPLATES, device="cpu")
    # Names: a file that misses a concept is refused; OpenAI's IN-1K names are recorded so.
    names_file = tmp_path / "names.tsv"
    names_file.write_text(f"{wnids[0]}\tfirst\n{wnids[1]}\tsecond\n")
    with pytest.raises(ValueError, match=rf"name no concept {wnids[2]} of in1k .*--classnames"):
        analyze(
            store, analyses=["zeroshot"], classnames=names_file, templates=TEMPLATES, device="cpu"
        )
    openai = analyze(
        store,
        out=tmp_path / "openai",
        analyses=["zeroshot"],
        classnames="openai",
        templates=TEMPLATES,
        device="cpu",
        embeddings_cache=cache,
    )
    source = openai.to_dict()["zeroshot"]["in1k"]["classnames"]["source"]
    assert "IMAGENET_CLASSNAMES" in source and openai.settings["zeroshot"]["classnames"] == "openai"


def test_the_command_line_plans_and_runs_both_evaluations(
    clip_weights,  # noqa: F811 - the fixture
    tmp_path,
    capsys,
):
    spec, _ = clip_weights
    store, _ = _clip_store(spec, tmp_path)
    templates = tmp_path / "templates.txt"
    templates.write_text("# mine\na photo of a {c}.\n")
    grid = ["--knn-shots", "1,2,all", "--knn-seeds", "22,37", "--knn-k", "1,3"]
    assert (
        main(["analyze", str(store), "--analyses", "knn", "--plan", "--device", "cpu", *grid]) == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("k-NN plan on cpu: k = 1, 3, N = 1, 2, All, seeds 22, 37")
    assert not (store / "analysis.json").exists() and not (store / "knn.jsonl").exists()
    out = tmp_path / "out"
    args = ["analyze", str(store), "--analyses", "knn,zeroshot", "--out", str(out)]
    args += ["--templates", str(templates), "--device", "cpu", *grid]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[1].split() == [
        "domain",
        "k-NN@1",
        "k-NN@3",
        "zero-shot",
        "zero-shot@5",
    ]
    payload = json.loads((out / "analysis.json").read_text())
    assert payload["settings"]["knn"]["ks"] == [1, 3]
    assert payload["settings"]["zeroshot"]["templates"]["source"] == "file templates.txt"
    assert set(payload["inputs"]["records"]) == {"knn.jsonl", "zeroshot.jsonl"}
    stores = payload["inputs"]["stores"]  # both splits' manifests, by sha256
    assert sorted(stores) == [str(store / "in1k" / s / "manifest.json") for s in ("test", "train")]
    assert main(["analyze", str(store), "--analyses", "knn", "--plan", "--knn-k", "x"]) == 2
    assert "--knn-k takes comma-separated integers" in capsys.readouterr().err
