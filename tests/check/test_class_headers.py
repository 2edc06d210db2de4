"""The project index's class-header scan (`project.class_headers`) finds exactly what
the plain line-anchored pattern finds, which it replaces for speed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchdoctor.check.lines import as_lf
from torchdoctor.check.project import class_headers

# The reference: a class header at a line's start, after blanks only.
ANY_CLASS = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*(?:\(([^()]*)\)|:)", re.MULTILINE)

FIXTURES = Path(__file__).parent / "fixtures"

TRICKY = [
    "class A(nn.Module):\n    pass\n",
    "  class B:\n",
    "x = 1  # class C(Base):\nclass D(\n    Base,\n    Other,\n):\n",
    'doc = """\nclass E(F):\n"""\n',  # a header in a string still matches the pattern
    "subclass G(H):\nmyclass = 1\nclass\tI\t:\n",
    "class J(K)class L(M):\n",  # a second match on the same line is not at a line start
    "class N(Base[int]):\n",  # nested brackets: no match, as with the pattern
    "\r\nclass O(P):\r\n\tclass Q:\r\n",
    "",
]


def _expected(source: str) -> list[tuple[int, int, str, str | None]]:
    text = as_lf(source)
    found = []
    for match in ANY_CLASS.finditer(text):
        start = match.start(1) - len(text[match.start() : match.start(1)].lstrip(" \t"))
        line = text.rfind("\n", 0, start) + 1
        found.append((start - line, match.end(), match.group(1), match.group(2)))
    return found


def _sources() -> list[str]:
    files = sorted(FIXTURES.rglob("*.py"))
    return TRICKY + [f.read_text(encoding="utf-8") for f in files]


@pytest.mark.parametrize("source", _sources())
def test_class_headers_match_the_line_anchored_pattern(source: str) -> None:
    text, found = class_headers(source)
    assert text == as_lf(source)
    assert found == _expected(source)


def test_the_fixtures_hold_class_headers() -> None:
    # the comparison above would pass vacuously on texts without classes
    assert sum(len(class_headers(s)[1]) for s in _sources()) > 100
