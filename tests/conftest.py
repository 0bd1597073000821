"""Shared fixtures."""

import os
import shutil
import warnings
from pathlib import Path
from typing import NamedTuple

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(autouse=True)
def new_process(monkeypatch):
    """Each test starts as a new process for the fused SGD step: no failure remembered (a
    test that breaks the step on purpose must not send later tests to the eager one),
    nothing compiled, no step or initial weights kept."""
    from imagenet_cog._train import engine as _engine
    from imagenet_cog._train import fused as _fused

    monkeypatch.setattr(_fused, "_FAILED", {})
    monkeypatch.setattr(_fused, "_COMPILED", {})
    monkeypatch.setattr(_fused, "_STEPS", {})
    monkeypatch.setattr(_engine, "_INITIAL", type(_engine._INITIAL)())


@pytest.fixture(scope="session")
def wordnet(tmp_path_factory):
    """NLTK's WordNet 3.0 reader, the independent reference for the measures.

    Skips when WordNet is missing, except in CI (``CI=true``), where a missing
    WordNet is a failure: CI installs Debian's ``wordnet-base``.
    """
    from imagenet_cog.taxonomy import nltk_wordnet

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return nltk_wordnet(data_home=tmp_path_factory.mktemp("nltk_data"))
    except LookupError as exc:
        if IN_CI:
            pytest.fail(f"WordNet 3.0 is required in CI: {exc}")
        pytest.skip(str(exc))


@pytest.fixture
def one_thread():
    """Torch on one CPU thread for the test, restored after.

    Tiny networks gain nothing from more threads on a shared 2-core machine, only
    synchronisation overhead.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class TinyStore(NamedTuple):
    """A tiny extracted store: its folder and its concepts."""

    store: Path
    wnids: list


@pytest.fixture(scope="session")
def _tiny_in1k_stores(tmp_path_factory):
    """Tiny IN-1K stores extracted once per session, one per set of options."""
    made = {}

    def extracted(n_train, batch_size, shard_size):
        key = (n_train, batch_size, shard_size)
        if key not in made:
            from imagefiles import write_in1k

            from imagenet_cog import extract

            root = tmp_path_factory.mktemp("tiny-in1k")
            wnids, _ = write_in1k(root / "in1k", n_classes=3, n_train=n_train, n_val=2)
            sharding = {} if shard_size is None else {"shard_size": shard_size}
            for split in ("train", "test"):
                extract(
                    "torchvision:resnet18",
                    root / "in1k",
                    "in1k",
                    split,
                    root / "features",
                    wnids=wnids,
                    preprocessing={"size": 32},
                    batch_size=batch_size,
                    progress=False,
                    **sharding,
                )
            made[key] = (root, wnids)
        return made[key]

    return extracted


@pytest.fixture
def tiny_in1k_store(_tiny_in1k_stores, tmp_path):
    """A tiny IN-1K feature store of resnet18 (random weights, 32-pixel images), made once.

    Call it as ``tiny_in1k_store(n_train=10, batch_size=8, shard_size=None)``: 3 concepts of
    ``n_train`` training and 2 validation images each, written under ``tmp_path / "in1k"``,
    and their train and test features under ``tmp_path / "features"``; it returns
    ``(store, wnids)``, the store's folder and the concepts. Each test gets its own copy,
    which it may change: the session extracts each set of options once.
    """

    def copy(n_train=10, batch_size=8, shard_size=None):
        root, wnids = _tiny_in1k_stores(n_train, batch_size, shard_size)
        shutil.copytree(root / "in1k", tmp_path / "in1k")
        shutil.copytree(root / "features", tmp_path / "features")
        return TinyStore(tmp_path / "features", wnids)

    return copy
