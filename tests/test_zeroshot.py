"""Zero-shot classification's core: the class names and templates, the text towers, the cached
class embeddings and the logits, against OpenCLIP's and transformers' own."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imagenet_cog import FeatureExtractor
from imagenet_cog._analysis.classnames import (
    CLASSNAMES_FILE,
    TEMPLATES_FILE,
    ambiguity_counts,
    class_names,
    default_templates,
    official_domains,
    official_header,
    prompt,
    read_class_names,
    read_templates,
    render_class_names,
    shipped_class_names,
)
from imagenet_cog._analysis.zeroshot import (
    class_embeddings,
    zero_shot_logits,
    zero_shot_top,
)
from imagenet_cog._base import data_path
from imagenet_cog._models.text_towers import load_text_tower, tokenizer_sha256

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------ class names
@pytest.fixture(scope="module")
def official_rows():
    return class_names(official_domains())


def test_the_shipped_class_names_are_what_the_code_makes(official_rows):
    shipped = data_path(CLASSNAMES_FILE).read_text(encoding="utf-8")
    assert shipped == render_class_names(official_rows, official_header(official_rows))
    names = shipped_class_names()
    assert len(names) == 6000 == len({r["wnid"] for r in official_rows})
    assert names == {r["wnid"]: r["name"] for r in official_rows}


def test_every_domain_has_distinct_names_and_the_shared_ones_are_told_apart(official_rows):
    by_domain = {}
    for r in official_rows:
        by_domain.setdefault(r["domain"], []).append(r)
    assert sorted(by_domain) == ["L1", "L2", "L3", "L4", "L5", "in1k"]
    for rows in by_domain.values():
        assert len(rows) == 1000
        assert len({r["name"].lower() for r in rows}) == 1000
    names = {r["wnid"]: r for r in official_rows}
    # IN-1K's three shared names, each pair told apart by its parent in WordNet.
    assert names["n02012849"]["name"] == "crane (wading bird)"
    assert names["n03126707"]["name"] == "crane (lifting device)"
    assert names["n02113186"]["name"] == "Cardigan (corgi)"  # WordNet's capital kept
    assert names["n02963159"]["name"] == "cardigan (sweater)"
    assert names["n03710637"]["name"] == "maillot (tights)"
    assert names["n01440764"] == {
        "wnid": "n01440764",
        "domain": "in1k",
        "name": "tench",
        "lemma": "tench",
        "told_apart_by": "",
    }
    assert names["n02085620"]["name"] == "Chihuahua"
    # Same parent: the scientific name; same parent and no other lemma: the definition.
    assert names["n02457945"]["name"] == "two-toed sloth (Choloepus didactylus)"
    assert names["n04334599"]["told_apart_by"] == "definition"
    assert names["n04334599"]["name"].startswith("street (a thoroughfare")
    counts = ambiguity_counts(official_rows)
    assert counts["in1k"] == {"names": 3, "concepts": 6, "hypernym": 6}
    assert [counts[d]["names"] for d in ("L1", "L2", "L3", "L4", "L5")] == [8, 12, 15, 18, 30]
    assert sum(c["concepts"] for c in counts.values()) == 177


def test_a_name_told_apart_by_nothing_else_gets_its_wnid():
    from imagenet_cog import Taxonomy

    # Three "bank" concepts under one parent, two of them with the same definition and no
    # other lemma: those two keep apart by their wnids only; the third by its other lemma.
    wnids = ["n00000001", "n00000002", "n00000003", "n00000004"]
    tax = Taxonomy(
        wnids,
        ["root.n.01", "bank.n.01", "bank.n.02", "bank.n.03"],
        [("root",), ("bank",), ("bank",), ("bank", "river_bank")],
        ["", "a slope", "a slope", "the side of a river"],
        [[], [wnids[0]], [wnids[0]], [wnids[0]]],
        [[], [], [], []],
    )
    rows = class_names({"d": wnids[1:]}, tax)
    assert [(r["name"], r["told_apart_by"]) for r in rows] == [
        ("bank (n00000002)", "wnid"),
        ("bank (n00000003)", "wnid"),
        ("bank (river bank)", "lemma"),
    ]
    with pytest.raises(ValueError, match="domain 'd' lists n00000002 more than once"):
        class_names({"d": [wnids[1], wnids[1]]}, tax)


def test_a_class_names_file_is_read_as_a_user_writes_it(tmp_path):
    path = tmp_path / "names.tsv"
    path.write_text(
        "# my names\nwnid\tname\nn02012849\tcrane bird\textra column\n\nn03126707\tbuilding crane\n"
    )
    assert read_class_names(path) == {"n02012849": "crane bird", "n03126707": "building crane"}
    path.write_text("wnid\tlevel\tname\nn02012849\tL1\tcrane bird\n")  # the header says where
    assert read_class_names(path) == {"n02012849": "crane bird"}
    path.write_text("n02012849 crane\n")
    with pytest.raises(
        ValueError,
        match=r"names.tsv, line 1: expected a wnid, a tab and a class name.*--classnames",
    ):
        read_class_names(path)
    path.write_text("n02012849\tcrane\nn02012849\tbird\n")
    with pytest.raises(ValueError, match=r"line 2: n02012849 is named twice"):
        read_class_names(path)


# -------------------------------------------------------------------------------- templates
def test_the_default_templates_are_openclips_and_the_shipped_copy_equals_them():
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    templates, source = default_templates()
    assert source.startswith("open_clip ") and len(templates) == 80
    for made, template in zip(OPENAI_IMAGENET_TEMPLATES, templates):
        assert prompt(template, "crane (wading bird)") == made("crane (wading bird)")
    assert read_templates(data_path(TEMPLATES_FILE)) == templates


def test_a_templates_file_needs_one_placeholder_per_line(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("# mine\na photo of a {c}.\n\nart of the {c}\n")
    assert read_templates(path) == ["a photo of a {c}.", "art of the {c}"]
    path.write_text("a photo of a {}.\n")
    with pytest.raises(
        ValueError, match=r"t.txt, line 1: a template holds \{c\} once.*--templates"
    ):
        read_templates(path)
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no template"):
        read_templates(path)


# ---------------------------------------------------------------------------------- models
@pytest.fixture
def clip_arch(tmp_path, monkeypatch):
    """A small OpenCLIP architecture with CLIP's real tokenizer (its 49,408-token vocabulary)."""
    open_clip = pytest.importorskip("open_clip")
    from open_clip import factory

    name = "imagenet-cog-zeroshot-ViT"
    config = {
        "embed_dim": 24,
        "vision_cfg": {
            "image_size": 32,
            "layers": 1,
            "width": 32,
            "head_width": 16,
            "patch_size": 8,
        },
        "text_cfg": {
            "context_length": 77,
            "vocab_size": 49408,
            "width": 16,
            "heads": 2,
            "layers": 1,
        },
    }
    (tmp_path / f"{name}.json").write_text(json.dumps(config))
    monkeypatch.setattr(factory, "_MODEL_CONFIGS", dict(factory._MODEL_CONFIGS))
    open_clip.add_model_config(tmp_path / f"{name}.json")
    return name


def spread(model, norms=("ln", "norm")):
    """Weights spread out so that the embeddings are far from one another (a freshly
    initialised tower maps every input nearly alike): matrices with a large gain, no biases,
    the norms and the logit scale and bias as they are."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(n in name for n in norms) or name.startswith("logit_"):
                continue
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 3 / p.shape[-1] ** 0.5)
            else:
                p.zero_()
    return model


@pytest.fixture
def clip_weights(clip_arch, tmp_path):
    """A checkpoint file of the whole model, its weights spread out (:func:`spread`)."""
    import open_clip
    from safetensors.torch import save_file

    model = spread(open_clip.create_model(clip_arch))
    path = tmp_path / "clip.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return f"open_clip:{clip_arch}:{path}", model.eval()


def in1k_names():
    names = shipped_class_names()
    return [names[w] for w in official_domains()["in1k"]]


def images(n=24, size=40):
    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 256, (size, size + 8, 3), dtype=np.uint8)) for _ in range(n)
    ]


def test_logits_equal_openclips_zero_shot_classifier(clip_arch, clip_weights, tmp_path):
    import open_clip
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    spec, model = clip_weights  # the same weights, read from the file by the library
    names = in1k_names()  # IN-1K: 1000 classes, crane and cardigan told apart
    templates = default_templates()[0][:3]
    ext = FeatureExtractor(spec, batch_size=8)
    pictures = images()
    X = ext.transform(pictures)
    tower = load_text_tower(spec)
    emb, key = class_embeddings(tower, names, templates, cache_dir=tmp_path)
    ours = zero_shot_logits(X, emb, tower.logit_scale, tower.logit_bias)
    # OpenCLIP's own classifier, with its own templates (functions) and tokenizer.
    tokenizer = open_clip.get_tokenizer(clip_arch)
    x = torch.stack([ext.make_transform()(p) for p in pictures])
    with torch.no_grad():
        classifier = open_clip.build_zero_shot_classifier(
            model, tokenizer, names, OPENAI_IMAGENET_TEMPLATES[:3], num_classes_per_batch=10
        )
        image = model.encode_image(x, normalize=True)
        theirs = (model.logit_scale.exp() * image @ classifier).numpy()
        as_open_clip_train = (100.0 * image @ classifier).numpy()  # its zero-shot evaluation
    np.testing.assert_allclose(emb, classifier.T.numpy(), atol=1e-6)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(zero_shot_logits(X, emb), as_open_clip_train, rtol=1e-4, atol=1e-3)
    top = zero_shot_top(X, emb, top=5)
    np.testing.assert_array_equal(top[:, 0], theirs.argmax(1))
    assert len(set(top[:, 0].tolist())) > 5  # not one class for every image
    assert key["cached"] is False and Path(key["file"]).is_file()


def test_class_embeddings_are_cached_by_content(clip_arch, tmp_path):
    spec = f"open_clip:{clip_arch}:none"
    tower = load_text_tower(spec)
    names, templates = (
        ["crane (wading bird)", "crane (lifting device)", "tench"],
        ["a {c}.", "the {c}"],
    )
    cache = tmp_path / "cache"
    first, key = class_embeddings(tower, names, templates, cache_dir=cache)
    assert [p.name for p in cache.iterdir()] == [Path(key["file"]).name]  # no temp file left

    def no_forward(tokens):
        raise AssertionError("the text tower ran although the embeddings are cached")

    tower.encode = no_forward
    again, key_again = class_embeddings(tower, names, templates, cache_dir=cache)
    assert key_again["cached"] and key_again["file"] == key["file"]
    np.testing.assert_array_equal(first, again)
    del tower.encode
    # Anything that shapes them makes another file: names, templates, weights, tokenizer.
    files = {key["file"]}
    for other_names, other_templates in ((names[::-1], templates), (names, templates[:1])):
        files.add(class_embeddings(tower, other_names, other_templates, cache_dir=cache)[1]["file"])
    with torch.no_grad():
        tower.model.token_embedding.weight[0, 0] += 1
    changed = load_text_tower(spec)
    changed.weights_sha256 = "other weights"
    files.add(class_embeddings(changed, names, templates, cache_dir=cache)[1]["file"])
    changed.tokenizer_sha256 = "another vocabulary"
    files.add(class_embeddings(changed, names, templates, cache_dir=cache)[1]["file"])
    assert len(files) == 5
    # A damaged file is computed again, not trusted.
    Path(key["file"]).write_bytes(b"not an npz")
    recomputed, key3 = class_embeddings(tower, names, templates, cache_dir=cache)
    assert not key3["cached"]
    np.testing.assert_allclose(recomputed, first, atol=1e-6)
    with np.load(key3["file"], allow_pickle=False) as f:  # no pickle needed to read it
        assert json.loads(str(f["key"]))["names_sha256"] == key["names_sha256"]


def test_the_tokenizer_is_identified_by_its_vocabulary():
    import open_clip

    a = open_clip.get_tokenizer("ViT-B-32")
    b = open_clip.get_tokenizer("ViT-B-32")
    assert tokenizer_sha256(a) == tokenizer_sha256(b)
    b.encoder = dict(b.encoder, extra=1)
    assert tokenizer_sha256(a) != tokenizer_sha256(b)
    assert tokenizer_sha256(object()) is None


def save_hf_clip(folder, family):
    """A small transformers CLIP-family model, saved whole with CLIP's tokenizer."""
    import open_clip.tokenizer
    import transformers as tf

    bpe = open_clip.tokenizer.SimpleTokenizer()
    vocab = dict(bpe.encoder)
    vocab["<|startoftext|>"] = vocab.pop(bpe.decoder[bpe.sot_token_id])
    vocab["<|endoftext|>"] = vocab.pop(bpe.decoder[bpe.eot_token_id])
    merges = [pair for pair, _ in sorted(bpe.bpe_ranks.items(), key=lambda kv: kv[1])]
    length = 64 if family == "siglip" else 77
    tokenizer = tf.CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=length)
    vision = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "image_size": 32,
        "patch_size": 8,
    }
    text = {
        "hidden_size": 32 if family == "siglip" else 16,  # SigLIP has no projection
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "vocab_size": 49408,
        "max_position_embeddings": length,
        "bos_token_id": 49406,
        "eos_token_id": 49407,
        "pad_token_id": 49407,
    }
    with torch.random.fork_rng():
        torch.manual_seed(3)
        if family == "clip":
            config = tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=24)
            model = tf.CLIPModel(config)
        else:
            model = tf.SiglipModel(tf.SiglipConfig(text_config=text, vision_config=vision))
            with torch.no_grad():
                model.logit_bias.fill_(-1.5)
    spread(model, norms=("norm", "embeddings.position"))
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (Path(folder) / "preprocessor_config.json").write_text(
        '{"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 36}, '
        '"crop_size": {"height": 32, "width": 32}, "do_center_crop": true, "resample": 3}'
    )
    return model, tokenizer


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_logits_equal_transformers_own(tmp_path, family):
    pytest.importorskip("transformers")
    model, tokenizer = save_hf_clip(tmp_path / family, family)
    spec = f"hf:{tmp_path / family}"
    names = in1k_names()
    template = "a photo of a {c}."
    ext = FeatureExtractor(spec, batch_size=8)
    pictures = images(12)
    X = ext.transform(pictures)
    tower = load_text_tower(spec)
    emb, _ = class_embeddings(tower, names, [template], cache_dir=False)
    ours = zero_shot_logits(X, emb, tower.logit_scale, tower.logit_bias)
    texts = [prompt(template, n) for n in names]
    padding = "max_length" if family == "siglip" else True
    batch = tokenizer(texts, padding=padding, truncation=True, return_tensors="pt")
    x = torch.stack([ext.make_transform()(p) for p in pictures])
    with torch.no_grad():
        theirs = model(**batch, pixel_values=x).logits_per_image.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    top1 = zero_shot_top(X, emb, top=1)[:, 0]
    np.testing.assert_array_equal(top1, theirs.argmax(1))
    assert len(set(top1.tolist())) > 3  # not one class for every image
    if family == "siglip":
        assert tower.logit_bias == pytest.approx(-1.5)


def test_a_model_without_a_text_tower_is_refused_in_one_line(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.Dinov2Model(
        transformers.Dinov2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    ).save_pretrained(tmp_path / "dino")
    with pytest.raises(ValueError, match="'dinov2' model, without a text tower"):
        load_text_tower(f"hf:{tmp_path / 'dino'}")
    with pytest.raises(ValueError, match="needs a model with a text tower"):
        load_text_tower("torchvision:resnet18")


def test_features_of_another_width_are_refused_in_one_line():
    with pytest.raises(
        ValueError, match="image features have 3 dimensions but the class embeddings 2"
    ):
        zero_shot_logits(np.ones((4, 3)), np.eye(2))


def test_equal_logits_rank_in_class_order():
    emb = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert zero_shot_top(np.array([[1.0, 0.0], [0.0, 1.0]]), emb, top=3).tolist() == [
        [0, 1, 2],
        [2, 0, 1],
    ]
