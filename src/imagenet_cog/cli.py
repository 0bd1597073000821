"""The ``imagenet-cog`` command line.

Each subcommand has an ``_add_<name>`` function that declares its arguments
and a ``_run_<name>`` function that does the work.
"""

from __future__ import annotations

import argparse
import sys

from ._version import __version__


def build_parser():
    """The argument parser of ``imagenet-cog``."""
    parser = argparse.ArgumentParser(
        prog="imagenet-cog",
        description="ImageNet-CoG: concept generalization levels, features, linear probes, reports.",
    )
    parser.add_argument("--version", action="version", version=f"imagenet-cog {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


_COMMANDS = []


def main(argv=None):
    """Entry point of ``imagenet-cog``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"imagenet-cog {args.command}: error: {exc}", file=sys.stderr)
        return 2
