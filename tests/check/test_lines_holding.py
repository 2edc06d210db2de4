"""`FileContext.lines_holding` searches needles that start alike with one pattern, and a
file cut into chunks only in the chunks with a word that holds the needle's longest
word; it finds the same lines as one `str.find` scan of the whole text per needle, on
varied texts and needles, with chunks of one line or a few. The chunks' words are the
text's words."""

from __future__ import annotations

import ast
import bisect
import random

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check import line_search
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


def _check(
    text: str, needles: list[str], rng: random.Random, times: int, chunked: int | None
) -> None:
    ctx = FileContext("x.py", text, ast.Module(body=[], type_ignores=[]), ProjectIndex())
    if chunked:
        chunks = line_search.Chunks(text)
        assert chunks.all_words == words_of(text)
        ctx.share_words(chunks.all_words, "\n".join(chunks.all_words), chunks)
    for _ in range(times):
        chosen = rng.sample(needles, rng.randint(0, len(needles)))
        assert ctx.lines_holding(chosen) == _plain(text, chosen), (text, chosen)


@pytest.fixture(params=[None, 1, 4, 30], ids=["whole", "chunk1", "chunk4", "chunk30"])
def chunk_chars(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int | None:
    """Search the whole text, or chunks of at least 1, 4, 30 characters."""
    if request.param is not None:
        monkeypatch.setattr(line_search, "FEWEST_CHUNKS", 1)
        monkeypatch.setattr(line_search, "CHUNK_CHARS", request.param)
    return request.param


def test_random_texts(chunk_chars: int | None) -> None:
    pieces = ["to", ".", "(", ")", "x", " ", "\n", "\r", "\r\n", "cuda", "a", "b", "3d", "_c"]
    rng = random.Random(5)
    for text in random_texts([*pieces, "é", "\x0c"], seed=13, longest=16, count=2_000):
        _check(text, NEEDLES, rng, 3, chunk_chars)


def test_fixture_texts(chunk_chars: int | None) -> None:
    rng = random.Random(9)
    for _path, text in fixture_texts():
        words = rng.sample(sorted(words_of(text)), min(12, len(words_of(text))))
        needles = [*NEEDLES, *words, *(f".{w}(" for w in words), *(f"{w}(" for w in words)]
        needles += ["torch.", "np.", "self.", "import", "[0]", "# "]
        _check(text, needles, rng, 6, chunk_chars)
