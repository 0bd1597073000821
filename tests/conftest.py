"""Shared fixtures."""

import os
import warnings

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(autouse=True)
def new_process(monkeypatch):
    """Each test starts as a new process for the fused SGD step: no failure remembered (a
    test that breaks the step on purpose must not send later tests to the eager one),
    nothing compiled."""
    from imagenet_cog._train import fused as _fused

    monkeypatch.setattr(_fused, "_FAILED", {})
    monkeypatch.setattr(_fused, "_COMPILED", {})


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
