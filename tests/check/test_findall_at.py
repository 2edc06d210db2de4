"""`syntax.findall_at` gives what `findall` gives for the patterns it stands in for."""

from __future__ import annotations

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.analysis.syntax import findall_at
from torchdoctor.check.rules.td215_inplace_on_saved_tensor import _SELF_ASSIGNED, _SELF_CALL

PATTERNS = [_SELF_CALL, _SELF_ASSIGNED]

TRICKY = [
    "self.run(x)\nself.x = 1\n",
    "self.self.x(",  # the call is the second `self.`
    "myself.x(1)\n",
    "self.x: self.T = 3\n",  # one match holds the next `self.`: findall skips it
    "self.x == 2\nself.y :int= 4\n",
    "",
]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_texts(text: str) -> None:
    for pattern in PATTERNS:
        assert findall_at(text, "self.", pattern) == pattern.findall(text)


def test_random_texts() -> None:
    pieces = ["self.", "self", ".", "x", "y_", "(", ":", "=", "==", " ", "\n", "my", "é", "1"]
    for text in random_texts(pieces, seed=19, longest=12):
        for pattern in PATTERNS:
            assert findall_at(text, "self.", pattern) == pattern.findall(text), repr(text)


def test_fixtures() -> None:
    for path, text in fixture_texts():
        for pattern in PATTERNS:
            assert findall_at(text, "self.", pattern) == pattern.findall(text), path
