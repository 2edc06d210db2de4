"""`wrapped.mentions_wrapper` answers as `_MENTION.search`, the pattern (tried at every
line start) it replaces for speed."""

from __future__ import annotations

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.analysis.wrapped import _MENTION, mentions_wrapper
from torchdoctor.check.lines import as_lf

TRICKY = [
    "f = functools.lru_cache(g)\n",
    "f =\n  cache(g)\n",
    "f\n=\ncache(g)",
    " f = cache(g)\n",
    "f = xcache(g)\nf = lru_cache (g)\n",
    "f == cache(g)\n",
    "é = cache(g)\n3 = a.b.cache(\n",
    "f = .wraps(",
    "",
]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_texts(text: str) -> None:
    assert mentions_wrapper(text) == bool(_MENTION.search(text))


def test_random_texts() -> None:
    pieces = [
        "f",
        "=",
        " ",
        "\n",
        ".",
        "cache",
        "lru_",
        "(",
        "x",
        "é",
        "\t",
        "wraps(",
        "3",
        "\nf =",
        "a.",
    ]
    for text in random_texts(pieces, seed=9, longest=12):
        assert mentions_wrapper(text) == bool(_MENTION.search(text)), text


def test_fixture_texts() -> None:
    for path, source in fixture_texts():
        text = as_lf(source)
        assert mentions_wrapper(text) == bool(_MENTION.search(text)), path
