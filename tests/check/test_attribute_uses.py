"""`syntax.attribute_uses` gives the matches of `_SELF_ATTRIBUTE_USE.finditer` whose
receiver is the given name, which it replaces for speed."""

from __future__ import annotations

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.analysis.syntax import _SELF_ATTRIBUTE_USE, attribute_uses

TRICKY = [
    "self.a = self.b(x)\n",
    "a.self.x\n",  # after a `.`: no match
    "myself.x\n",
    "f(self.x )(self.y (",
    "self.\nself.x",
    "aaa.x aa.y",
    "",
]


def _expected(text: str, name: str) -> list[tuple[tuple[int, int], tuple[str | None, ...]]]:
    return [(m.span(), m.groups()) for m in _SELF_ATTRIBUTE_USE.finditer(text) if m[1] == name]


def _found(text: str, name: str) -> list[tuple[tuple[int, int], tuple[str | None, ...]]]:
    return [(m.span(), m.groups()) for m in attribute_uses(text, name)]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_texts(text: str) -> None:
    for name in ("self", "aa"):
        assert _found(text, name) == _expected(text, name)


def test_random_texts() -> None:
    pieces = ["self.", "self", ".", "x", "y_", "(", " ", "\n", "my", "é", "1", "a.", "aa."]
    for text in random_texts(pieces, seed=29, longest=12):
        for name in ("self", "aa", "a"):
            assert _found(text, name) == _expected(text, name), repr(text)


def test_fixtures() -> None:
    for path, text in fixture_texts():
        assert _found(text, "self") == _expected(text, "self"), path
