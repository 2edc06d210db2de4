"""Shared helpers for the data-driven rule fixtures (`# expect: TD101` markers)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.context import FileContext
from torchdoctor.check.engine import RunOptions, check_text
from torchdoctor.check.lines import NEWLINE, split_lines
from torchdoctor.check.registry import rules_by_code
from torchdoctor.check.rule import FixAvailability
from torchdoctor.check.source_text import decode_source
from torchdoctor.check.torch_pins import PinsFinder

FIXTURES = Path(__file__).parent / "fixtures"
_EXPECT = re.compile(r"#.*?expect:\s*(?P<codes>TD\d{3}(?:\s*,\s*TD\d{3})*)")


def fixture_cases() -> list[Path]:
    """`TD101.py`, `TD101_more.py` files and `TD112_project/` folders (not `*.fixed.py`)."""
    cases = []
    for path in sorted(FIXTURES.iterdir()):
        if not path.name.startswith("TD") or path.name.endswith(".fixed.py"):
            continue
        if path.is_dir() or path.suffix == ".py":
            cases.append(path)
    return cases


def case_files(case: Path) -> list[Path]:
    return sorted(case.rglob("*.py")) if case.is_dir() else [case]


def read_fixture(path: Path, newline: str = "\n") -> str:
    """The fixture's text with its line ends as written (or all made `newline`)."""
    text = decode_source(path.read_bytes())
    return text if newline == "\n" else NEWLINE.sub(newline, text)


def expected(path: Path, code: str) -> set[tuple[str, int, str]]:
    found = set()
    for lineno, line in enumerate(split_lines(read_fixture(path)), start=1):
        match = _EXPECT.search(line)
        if match:
            for c in re.split(r"\s*,\s*", match.group("codes")):
                if c == code:
                    found.add((path.name, lineno, c))
    return found


def run_rule(
    case: Path, code: str, *, fix: bool = False, newline: str = "\n"
) -> dict[Path, tuple[set[tuple[str, int, str]], str]]:
    """Run one rule over a fixture case; returns file -> (found (file, line, code), text).

    `newline`: check the files with every line end made `\r\n` or `\r` instead.
    """
    rule = rules_by_code()[code]
    files = case_files(case)
    sources = {f: read_fixture(f, newline) for f in files}
    project = build_project((str(f), text) for f, text in sources.items())
    if case.is_dir():  # a project fixture: its folder is the checked project
        project.root = str(case.resolve())
    options = RunOptions(
        enabled=frozenset({code}),
        fix=fix,
        unsafe_fixes=rule.fix_availability is FixAvailability.UNSAFE,
    )
    out = {}
    pins = PinsFinder()  # a project fixture's dependency files pin torch as a project's do
    for f, text in sources.items():
        ceiling = pins.ceiling_for(str(f))
        findings, new_text, _ = check_text(text, str(f), [rule], project, options, ceiling)
        out[f] = ({(f.name, x.line, x.code) for x in findings}, new_text)
    return out


def fixture_contexts(extra: list[str]) -> Iterator[FileContext]:
    """A context for `extra` (named `x.py`) and every fixture file that parses (at its
    path), all in one project: the real code a shortcut of the analysis is compared with
    the code it replaces on."""
    files = [("x.py", text) for text in extra]
    files += [(str(p), p.read_text(encoding="utf-8")) for p in sorted(FIXTURES.rglob("*.py"))]
    project = build_project([source for _, source in files])
    for path, source in files:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        yield FileContext(path, source, tree, project)
