"""One line model: lines end at `\\n`, `\\r\\n` and `\\r` only, as Python's tokenizer says.

Every rule fixture is checked again with CRLF and with CR-only line ends and must give
the same (line, code) findings; `# noqa` and finding positions must not move when a
comment holds a character `str.splitlines()` would split at (form feed and friends).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.check.rule_fixtures import expected, fixture_cases, run_rule
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.engine import RunOptions, check_text
from torchdoctor.check.lines import line_end, line_start, line_starts, row_col, split_lines
from torchdoctor.check.registry import rule_classes

CASES = fixture_cases()


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["crlf", "cr"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture_findings_do_not_depend_on_line_ends(case: Path, newline: str) -> None:
    code = case.name[:5]
    for file, (found, _) in run_rule(case, code, newline=newline).items():
        assert found == expected(file, code), f"{file.name} with {newline!r} line ends"


# Characters `str.splitlines()` splits at but Python's tokenizer does not.
NOT_LINE_ENDS = ["\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("char", NOT_LINE_ENDS, ids=[f"U+{ord(c):04X}" for c in NOT_LINE_ENDS])
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_noqa_and_positions_stay_on_the_tokenizer_lines(char: str, newline: str) -> None:
    source = newline.join(
        [
            "import torch",
            f"# part one{char}part two of the same comment line",
            "\x0c",  # a page break: a line holding only a form feed
            'a = torch.load("a.pt")  # noqa: TD402',
            'b = torch.load("b.pt")',
            "",
        ]
    )
    rules = list(rule_classes())
    options = RunOptions(enabled=frozenset({"TD402"}))
    findings, _, _ = check_text(source, "m.py", rules, build_project([source]), options)
    assert [(f.code, f.line, f.column) for f in findings] == [("TD402", 5, 5)]


def test_line_helpers_split_where_the_tokenizer_does() -> None:
    text = "a\r\nb\rc\nd\x0ce\u2028f"
    assert split_lines(text) == ["a", "b", "c", "d\x0ce\u2028f"]
    assert line_starts(text) == [0, 3, 5, 7]
    assert [line_start(text, i) for i in (0, 3, 5, 9)] == [0, 3, 5, 7]
    assert [line_end(text, i) for i in (0, 3, 5, 7)] == [1, 4, 6, len(text)]
    assert [row_col(text, i) for i in (0, 3, 5, 9)] == [(1, 1), (2, 1), (3, 1), (4, 3)]
