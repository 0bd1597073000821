import math

import numpy as np
import pytest
from helpers import tiny_taxonomy

from imagenet_cog.taxonomy import (
    ROOT_WNID,
    Taxonomy,
    imagenet1k_wnids,
    imagenet21k_wnids,
    load_taxonomy,
)


def test_bundled_lists_are_the_imagenet_facts():
    in1k, in21k = imagenet1k_wnids(), imagenet21k_wnids()
    assert len(in1k) == len(set(in1k)) == 1000
    assert len(in21k) == len(set(in21k)) == 21841
    assert "n04399382" in in1k and "n04399382" not in in21k  # teddy bear
    assert len(set(in21k) - set(in1k)) == 20842
    tax = load_taxonomy()
    assert all(w in tax for w in in1k + in21k)


def test_bundled_taxonomy_shape():
    tax = load_taxonomy()
    assert len(tax) == 82115
    assert tax.lch_depth == 19
    assert tax.name("n02123159") == "tiger_cat.n.02"  # the IN-1K class, not tiger_cat.n.01
    assert tax.name(ROOT_WNID) == "entity.n.01"
    assert tax.min_depth[tax.index[ROOT_WNID]] == 0
    ic = tax.information_content()
    assert (
        np.count_nonzero(~np.isnan(ic)) == 23547
    )  # |G| for IN-21K ∪ IN-1K (the paper, supplement A.2)
    assert ic[tax.index[ROOT_WNID]] == 0.0
    g = ~np.isnan(ic)
    assert ic[g].max() == pytest.approx(math.log(23547))


def test_unknown_and_malformed_wnids_are_named():
    tax = load_taxonomy()
    with pytest.raises(ValueError, match=r"unknown wnid 'n99999999'"):
        tax.indices(["n02123159", "n99999999"])
    with pytest.raises(ValueError, match=r"malformed wnid 'tiger'"):
        tax.indices(["tiger"])


def test_tiny_taxonomy_information_content_by_hand():
    tax = tiny_taxonomy()
    # Universe {tiger cat, dog}: G = {root, animal, cat, tiger cat, dog}, |G| = 5.
    ic = tax.information_content(["n00000006", "n00000005"])
    expect = {
        "n00000001": 0.0,
        "n00000002": -math.log(4 / 5),  # animal, cat, tiger cat, dog
        "n00000004": -math.log(2 / 5),  # cat, tiger cat
        "n00000006": -math.log(1 / 5),
        "n00000005": -math.log(1 / 5),
    }
    for wnid, value in expect.items():
        assert ic[tax.index[wnid]] == pytest.approx(value, abs=1e-15)
    outside = [tax.index[w] for w in ("n00000003", "n00000007", "n00000008", "n00000009")]
    assert np.isnan(ic[outside]).all()
    # The toy dog is an instance of dog: it counts among dog's descendants.
    ic2 = tax.information_content(["n00000009"])
    assert ic2[tax.index["n00000005"]] == pytest.approx(-math.log(2 / 6))


def test_tiny_taxonomy_graph_arrays():
    tax = tiny_taxonomy()
    assert tax.parents("n00000009") == ["n00000008", "n00000005"]
    assert sorted(tax.ancestors(["n00000009"]).tolist()) == [
        "n00000001",
        "n00000002",
        "n00000003",
        "n00000005",
        "n00000008",
        "n00000009",
    ]
    assert tax.min_depth[tax.index["n00000009"]] == 3
    assert tax.max_depth[tax.index["n00000009"]] == 3
    anc = tax.ancestor_matrix
    i = tax.index["n00000009"]
    row = dict(zip(tax.wnids[anc[i].indices].tolist(), (anc[i].data - 1).tolist()))
    assert row == {
        "n00000009": 0,
        "n00000008": 1,
        "n00000005": 1,
        "n00000003": 2,
        "n00000002": 2,
        "n00000001": 3,
    }
    desc = tax.descendant_mask(["n00000002"], include_self=False)
    assert sorted(tax.wnids[desc].tolist()) == [
        "n00000004",
        "n00000005",
        "n00000006",
        "n00000007",
        "n00000009",
    ]


def test_save_load_round_trip(tmp_path):
    tax = tiny_taxonomy()
    path = tmp_path / "tiny.tsv.gz"
    tax.save(path)
    back = Taxonomy.load(path)
    assert back.wnids.tolist() == tax.wnids.tolist()
    assert back.parents("n00000009") == tax.parents("n00000009")
    assert back.parent_is_instance.tolist() == tax.parent_is_instance.tolist()
    assert [back.lemma_names(w) for w in back.wnids] == [tax.lemma_names(w) for w in tax.wnids]
    tax.save(tmp_path / "again.tsv.gz")
    assert (tmp_path / "again.tsv.gz").read_bytes() == path.read_bytes()


@pytest.mark.wordnet
def test_bundled_taxonomy_equals_nltk(wordnet):
    tax = load_taxonomy()
    rng = np.random.default_rng(0)
    for i in rng.choice(len(tax), 2000, replace=False).tolist():
        wnid = tax.wnids[i]
        s = wordnet.synset_from_pos_and_offset("n", int(wnid[1:]))
        assert tax.name(wnid) == s.name()
        assert list(tax.lemma_names(wnid)) == s.lemma_names()
        assert tax.gloss(wnid) == s.definition()
        # NLTK's pointer order changes between processes; ours is sorted by wnid.
        hyp = sorted(f"n{h.offset():08d}" for h in s.hypernyms())
        inst = sorted(f"n{h.offset():08d}" for h in s.instance_hypernyms())
        assert tax.parents(wnid) == hyp + inst
        assert tax.min_depth[i] == s.min_depth()
        assert tax.max_depth[i] == s.max_depth()
        dist = {f"n{k.offset():08d}": d for k, d in s._shortest_hypernym_paths(False).items()}
        row = tax.ancestor_matrix[i]
        assert dict(zip(tax.wnids[row.indices].tolist(), (row.data - 1).tolist())) == dist


@pytest.mark.wordnet
def test_from_nltk_subset_is_closed_upwards(wordnet):
    sub = Taxonomy.from_nltk(wordnet, synsets=["n02123159"])
    full = load_taxonomy()
    assert sorted(sub.wnids.tolist()) == sorted(full.ancestors(["n02123159"]).tolist())
    assert sub.lch_depth == 19
    assert sub.parents("n02123159") == full.parents("n02123159")
