"""`made_results.TextDefs` finds the same top-level functions and bodies as the
multi-line patterns it replaces for speed (`DEF_LINE`, and `^[^\\s#)]` for a body's end)."""

from __future__ import annotations

import re

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.analysis.made_results import DEF_LINE, TextDefs, top_level_defs
from torchdoctor.check.lines import as_lf

DEF = re.compile(DEF_LINE, re.M)
TOPLEVEL = re.compile(r"^[^\s#)]", re.M)

TRICKY = [
    "def f(x):\n    return x\n\ndef g(\n    y,\n):\n    return y\n",
    "async def h():\n    pass\nclass C:\n    def m(self):\n        pass\n",
    "async\t def k (a):\n  pass\n# comment\n)\nx = 1\n",
    "undefined = 1\n  def indented(): pass\ndefault(x)\ndef\tl\t(\n",
    "def",
    "\ndef f(",
    "",
]


def _expected(text: str) -> dict[str, str]:
    bodies: dict[str, str] = {}
    for match in DEF.finditer(text):
        end = TOPLEVEL.search(text, match.end())
        bodies.setdefault(match.group(1), text[match.end() : end.start() if end else len(text)])
    return bodies


def _check(source: str) -> None:
    text = as_lf(source)
    assert [(m.group(1), m.end()) for m in top_level_defs(text)] == [
        (m.group(1), m.end()) for m in DEF.finditer(text)
    ]
    assert TextDefs(source)._defs() == _expected(text)


@pytest.mark.parametrize("source", TRICKY)
def test_tricky_texts(source: str) -> None:
    _check(source)


def test_random_texts() -> None:
    pieces = ["def", "async", " ", "\t", "\n", "f", "(", ")", "#", ":", "x", "é", "\r\n"]
    for text in random_texts(pieces, seed=5, longest=14, count=8_000):
        _check(text)


def test_fixtures() -> None:
    for _, source in fixture_texts():
        _check(source)
