"""User-facing text cites the paper and our docs, never the internal spec."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
USER_FACING = ["README.rst", "src", "docs", "examples", "benchmarks"]
SUFFIXES = {".py", ".rst", ".txt", ".sh"}


def _files():
    for name in USER_FACING:
        path = ROOT / name
        if path.is_file():
            yield path
        else:
            yield from (
                p for p in path.rglob("*") if p.suffix in SUFFIXES and "_build" not in p.parts
            )


#: A claim of the official trial sequence: Optuna >= 3.4 suggests other trials than the
#: official code's Optuna 2.3.0 after the startup ones (docs/guide/official.rst).
_SEQUENCE_CLAIM = re.compile(
    r"(?:exact(?:ly)? (?:the )?(?:official )?TPE sequence|keeps the official TPE sequence"
    r"|exactly that of the official|exact official sequence)",
    flags=re.IGNORECASE,
)


def _offences(path):
    """``["file:line: why: text"]`` of one file: a citation of the internal spec, a claim of
    the official trial sequence (matched across line breaks, named by its first line)."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT)
    found = [
        f"{name}:{i}: cites the internal spec: {line.strip()}"
        for i, line in enumerate(text.splitlines(), 1)
        if re.search(r"\bSPEC\b", line)
    ]
    # Words joined by single spaces, and where each word of the text starts and its line.
    words = [(m.start(), m.group()) for m in re.finditer(r"\S+", text)]
    joined, starts = "", []
    for start, word in words:
        starts.append((len(joined), start))
        joined += word + " "
    for m in _SEQUENCE_CLAIM.finditer(joined):
        at = max(orig for pos, orig in starts if pos <= m.start())
        line = text.count("\n", 0, at) + 1
        found.append(f"{name}:{line}: claims the official trial sequence: {m.group()!r}")
    return found


def test_user_text_cites_no_spec_and_claims_no_official_trial_sequence():
    """One pass over every user-facing file, listing every offending line at once."""
    files = sorted(_files())
    assert len(files) > 50  # the walk found the package, the docs, the benchmarks...
    found = [hit for path in files for hit in _offences(path)]
    assert not found, "\n".join(found)


def test_cli_help_cites_no_spec():
    from imagenet_cog.cli import build_parser

    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions:
        texts += [sub.format_help() for sub in action.choices.values()]
    assert texts and not any("SPEC" in t for t in texts)
