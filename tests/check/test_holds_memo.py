"""`FileContext.holds` and `_in_a_word` keep their answers per file (rules ask the same
needles again); asked in any order and again, they answer as a plain search does."""

from __future__ import annotations

import ast
import random

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.context import FileContext, words_of
from torchdoctor.check.project import ProjectIndex

NEEDLES = ["to", ".to(", "cuda", "a.b", "3d", "d_c", "(", "x ", "é", "éa", "_", "to(x)", "ab"]


def _context(text: str) -> FileContext:
    return FileContext("x.py", text, ast.Module(body=[], type_ignores=[]), ProjectIndex())


def _check(text: str, needles: list[str], rng: random.Random) -> None:
    ctx = _context(text)
    words = words_of(text)
    for needle in rng.sample(needles * 2, len(needles) * 2):
        assert ctx.holds(needle) == (needle in text), (text, needle)
        if needle.isidentifier():
            assert ctx._in_a_word(needle) == any(needle in w for w in words), (text, needle)


def test_random_texts() -> None:
    pieces = ["to", ".", "(", ")", "x", " ", "\n", "cuda", "a", "b", "3d", "_c", "é"]
    rng = random.Random(7)
    for text in random_texts(pieces, seed=11, longest=12, count=5_000):
        _check(text, NEEDLES, rng)


def test_fixture_texts() -> None:
    rng = random.Random(3)
    for _path, text in fixture_texts():
        words = sorted(words_of(text))
        needles = [*NEEDLES, *rng.sample(words, min(20, len(words)))]
        needles += [w[1:-1] for w in needles if len(w) > 3] + ["torch.", "backward()"]
        _check(text, needles, rng)
