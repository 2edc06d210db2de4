"""`text_facts.moves_input` answers exactly as a search for `MOVES_INPUT`, which it
replaces for speed."""

from __future__ import annotations

import re

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.analysis.text_facts import MOVES_INPUT, moves_input

PATTERN = re.compile(MOVES_INPUT)

TRICKY = [
    "x = x.to(device)\n",
    "x = x . cuda()\n",
    "x =\n  x\n.to(d)",  # blanks, line breaks too, on each side
    "ab = xab.to(d)\n",  # not the same word
    "b = ab.to(d)\n",
    "x == x.to(d)\n",
    "a.x = x.to(d)\n",
    "x = x.proto(d)\n",
    "h.to(self.device)\n",
    "h.to( self.devices)\n",
    "é = é.to(d)\n",
    "x\u00a0=\u00a0x.to(d)",
    "=.to(",
    "",
]


@pytest.mark.parametrize("source", TRICKY)
def test_tricky_texts(source: str) -> None:
    assert moves_input(source) == (PATTERN.search(source) is not None)


def test_random_texts() -> None:
    pieces = ["x", "y", "xy", " ", "\n", "=", "==", ".", "(", "_", "1", "é", "\u00a0"]
    pieces += ["to(", "cuda(", "to", "self", ".device", "self.device"]
    for source in random_texts(pieces, seed=11, longest=12):
        assert moves_input(source) == (PATTERN.search(source) is not None), repr(source)


def test_fixtures() -> None:
    for path, source in fixture_texts():
        assert moves_input(source) == (PATTERN.search(source) is not None), path
