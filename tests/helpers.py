"""Test helpers shared between test modules."""

import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from imagenet_cog._optional_dependencies import EXTRAS, INSTALLED

#: This checkout's package sources, for the Python processes a test starts.
SRC = str(Path(__file__).resolve().parents[1] / "src")


def subprocess_env(**extra):
    """The environment of a Python process a test starts: this checkout's package first on
    ``PYTHONPATH``, plus ``extra`` variables (such as ``OMP_NUM_THREADS="1"``)."""
    return {
        **os.environ,
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        **extra,
    }


def needs(name, module_level=False):
    """The optional library ``name`` (or one of its modules) imported, as the package's table
    of optional libraries finds it; the test (with ``module_level``, the module) is skipped
    where it is not installed."""
    library = name.split(".")[0]
    if not INSTALLED[library]:
        pytest.skip(
            f"needs {library}: pip install '{EXTRAS[library][1]}'",
            allow_module_level=module_level,
        )
    return importlib.import_module(name)


#: Fields of a runs.jsonl record that vary from one identical run to the next: the timings,
#: and the record's checksum, which covers them.
TIMING_FIELDS = ("time_total_s", "finished_at", "record_sha256")


def strip_timings(record):
    """A record without the fields that change between identical runs."""
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}


def tiny_taxonomy():
    """A hand-made taxonomy whose numbers are worked out in the tests.

    ::

        n00000001 root
        ├── n00000002 animal
        │   ├── n00000004 cat
        │   │   ├── n00000006 tiger cat
        │   │   └── n00000007 house cat
        │   └── n00000005 dog
        └── n00000003 artifact
            └── n00000008 toy
                └── n00000009 toy dog   (also an instance of dog)
    """
    from imagenet_cog.taxonomy import Taxonomy

    rows = {
        "n00000001": ([], []),
        "n00000002": (["n00000001"], []),
        "n00000003": (["n00000001"], []),
        "n00000004": (["n00000002"], []),
        "n00000005": (["n00000002"], []),
        "n00000006": (["n00000004"], []),
        "n00000007": (["n00000004"], []),
        "n00000008": (["n00000003"], []),
        "n00000009": (["n00000008"], ["n00000005"]),
    }
    names = ["root", "animal", "artifact", "cat", "dog", "tiger_cat", "house_cat", "toy", "toy_dog"]
    wnids = list(rows)
    return Taxonomy(
        wnids=wnids,
        names=[f"{x}.n.01" for x in names],
        lemmas=[[x] for x in names],
        glosses=[f"a {x.replace('_', ' ')}" for x in names],
        hypernyms=[rows[w][0] for w in wnids],
        instance_hypernyms=[rows[w][1] for w in wnids],
        source="tiny test taxonomy",
    )


def two_ranks(script, *args):
    """Run ``script`` in two processes started with torchrun's variables but by no torchrun (as
    srun does); ``(exit codes, stderr texts)``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = subprocess_env(
            OMP_NUM_THREADS="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *map(str, args)],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        errors = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [p.returncode for p in procs], errors


def write_run_folder(folder, config, records):
    """A run folder as ``evaluate`` writes one: ``config.json`` with the format, the
    configuration hash and its checksum, and ``runs.jsonl`` with each record bound to that
    hash and carrying its own checksum. Returns ``folder``."""
    from imagenet_cog._runfolder import (
        CONFIG_CHECKSUM,
        FORMAT,
        FORMAT_VERSION,
        RECORD_CHECKSUM,
        config_checksum,
        hash_config,
        record_checksum,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**config, "format": FORMAT, "format_version": FORMAT_VERSION}
    config["config_hash"] = hash_config(config)
    config[CONFIG_CHECKSUM] = config_checksum(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    lines = []
    for record in records:
        record = {**record, "config_hash": config["config_hash"]}
        record[RECORD_CHECKSUM] = record_checksum(record)
        lines.append(json.dumps(record, sort_keys=True) + "\n")
    (folder / "runs.jsonl").write_text("".join(lines))
    return folder
