"""`project_facts.hands_a_loader` answers exactly as a search for `LOADER_ARGUMENT`,
which it replaces for speed."""

from __future__ import annotations

import re

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.analysis.project_facts import LOADER_ARGUMENT, hands_a_loader

PATTERN = re.compile(LOADER_ARGUMENT)

TRICKY = [
    "evaluate(model, val_loader)\n",
    "evaluate (\n  model, loader)",  # the `(` on the line, its word on the line before
    "evaluate(\n    loader)\n",  # a line break between `(` and the word
    "f(g(x), loader)\n",  # a `)` after the last `(`
    "f(x)[loader]\n",
    "(loader)\n",  # no word before the bracket
    "  \n (loader)",
    "x = train_dl\nf(train_dl)\n",
    "f(train_dlx)\n",  # `_dl` inside a word
    "f(train_dl_2)\n",
    "é (Loader\r\n",
    "f\u00a0(loader",  # a non-ASCII blank before the bracket
    "f\x1c(loader",
    "",
]


@pytest.mark.parametrize("source", TRICKY)
def test_tricky_texts(source: str) -> None:
    assert hands_a_loader(source) == (PATTERN.search(source) is not None)


def test_random_texts() -> None:
    pieces = ["(", ")", " ", "\n", "\r", "\t", "a", "_", "1", ".", "é", "\u00a0", "\u2028"]
    pieces += ["loader", "Loader", "_dl", "dl", "_d", "\x1c"]
    for source in random_texts(pieces, seed=7, longest=12):
        assert hands_a_loader(source) == (PATTERN.search(source) is not None), repr(source)


def test_fixtures() -> None:
    for path, source in fixture_texts():
        assert hands_a_loader(source) == (PATTERN.search(source) is not None), path
