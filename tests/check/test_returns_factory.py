"""`syntax.returns_factory` answers exactly as a search for `RETURNS_FACTORY` (after its
gate), which it replaces for speed."""

from __future__ import annotations

import re

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.analysis.syntax import RETURNS_FACTORY, returns_factory

PATTERN = re.compile(RETURNS_FACTORY)

TRICKY = [
    "x = torch.zeros(3)\nreturn x\n",
    "return torch.randn(3)\n",
    "return x\nx = torch.zeros(3)\n",
    "return (\n  torch.ones(2))\n",
    "mytorch.zeros(3)\nreturn x\n",
    "torch.zeros(3) returns\n",
    "torch.zeros (3)\nreturn x\n",
    "areturn torch.rand(2)\n",
    "",
]


def _expected(text: str) -> bool:
    return "return" in text and "torch." in text and PATTERN.search(text) is not None


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_texts(text: str) -> None:
    assert returns_factory(text) == _expected(text)


def test_random_texts() -> None:
    pieces = ["torch.", "zeros(", "randn(", "rand", "n(", "tensor(", "(", ".", "mytorch."]
    pieces += ["return", "areturn", "returns", " ", "\n", "\r", "x", "_", "é"]
    for text in random_texts(pieces, seed=17, longest=9):
        assert returns_factory(text) == _expected(text), repr(text)


def test_fixtures() -> None:
    for path, text in fixture_texts():
        assert returns_factory(text) == _expected(text), path
