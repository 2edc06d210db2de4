"""`FileContext.lines_holding` searches needles that start alike with one pattern; it
finds the same lines as one `str.find` scan per needle, on varied texts and needles."""

from __future__ import annotations

import ast
import bisect
import random

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.context import FileContext, words_of
from torchdoctor.check.lines import line_starts
from torchdoctor.check.project import ProjectIndex

NEEDLES = [
    ".to(", ".cuda(", ".t", "to", "tor", "(", "((", "cuda", "a.b", "é", "éa", "_c",
    "3d", "\n", "\r\n", "x\r", ".", "..", "to(x)", "ab", "a", "b(", "b",
]  # fmt: skip


def _plain(text: str, needles: list[str]) -> list[int]:
    """The lines where a needle starts, one `str.find` scan per needle."""
    starts, found = line_starts(text), set()
    for needle in filter(None, needles):
        at = text.find(needle)
        while at >= 0:
            found.add(bisect.bisect_right(starts, at))
            at = text.find(needle, at + 1)
    return sorted(found)


def _check(text: str, needles: list[str], rng: random.Random, times: int) -> None:
    ctx = FileContext("x.py", text, ast.Module(body=[], type_ignores=[]), ProjectIndex())
    for _ in range(times):
        chosen = rng.sample(needles, rng.randint(0, len(needles)))
        assert ctx.lines_holding(chosen) == _plain(text, chosen), (text, chosen)


def test_random_texts() -> None:
    pieces = ["to", ".", "(", ")", "x", " ", "\n", "\r", "\r\n", "cuda", "a", "b", "3d", "_c"]
    rng = random.Random(5)
    for text in random_texts([*pieces, "é", "\x0c"], seed=13, longest=16, count=4_000):
        _check(text, NEEDLES, rng, 3)


def test_fixture_texts() -> None:
    rng = random.Random(9)
    for _path, text in fixture_texts():
        words = rng.sample(sorted(words_of(text)), min(12, len(words_of(text))))
        needles = [*NEEDLES, *words, *(f".{w}(" for w in words), *(f"{w}(" for w in words)]
        needles += ["torch.", "np.", "self.", "import", "[0]", "# "]
        _check(text, needles, rng, 6)
