"""The searches behind `FileContext.lines_holding`: which lines of a text hold a needle.

Rules ask a big file for a hundred needles or more, and a search of the whole text
for each costs more than the rest of the question. Two things cut it: needles that
start alike are searched together, by one pattern; and the words of each run of lines
(a chunk), found in the pass that finds the file's words, say where a needle can be: in
a file of `FEWEST_CHUNKS` chunks or more, it is searched only in the chunks with a word
that holds its longest word (`.to(` needs `to`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Callable

# characters per chunk (at least; it ends at a line start), and the fewest chunks a
# text needs for its needles to be searched chunk by chunk
CHUNK_CHARS = 8192
FEWEST_CHUNKS = 4

# bytes.translate table: ASCII letters, digits, `_` and every byte of a multi-byte
# UTF-8 character kept; any other byte becomes a space
_WORD_BYTES = bytes(
    i if (chr(i).isascii() and (chr(i).isalnum() or i == 95)) or i >= 128 else 32
    for i in range(256)
)


def word_characters(text: str) -> str:
    """`text` with every character that is no word character made a space (the same
    length: a character keeps its offset)."""
    scanned = text.encode("utf-8", "surrogatepass").translate(_WORD_BYTES)
    return scanned.decode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=4096)
def fewest_needles(needles: frozenset[str]) -> tuple[str, ...]:
    """`needles` less those that hold another of them (`.tensor(` beside `tensor(`): a
    line holding one holds the other, so the lines holding any are the same."""
    return tuple(n for n in needles if n and not any(o and o != n and o in n for o in needles))


@functools.lru_cache(maxsize=1024)
def alternatives(needles: tuple[str, ...]) -> re.Pattern[str]:
    """A pattern matching each of `needles` (none holds a line break)."""
    return re.compile("|".join(map(re.escape, needles)))


def match_at(pattern: re.Pattern[str], source: str, start: int, end: int) -> int:
    """Where the first match of `pattern` in `source[start:end]` begins, or -1."""
    match = pattern.search(source, start, end)
    return match.start() if match else -1


def add_lines(
    found: set[int], starts: list[int], first: Callable[[int, int], int], start: int, end: int
) -> None:
    """Add to `found` the lines (starting at `starts`) of the hits of `first` between
    offsets `start` and `end`: `first(a, b)` is where the first hit in `[a, b)` is, or
    -1. A line is searched up to its first hit, the next search starts on the next line."""
    at = first(start, end)
    while at >= 0:
        line = bisect.bisect_right(starts, at)
        found.add(line)
        at = first(starts[line], end) if line < len(starts) else -1


class Chunks:
    """The words of a text (`FileContext.words`), and of each chunk of about
    `CHUNK_CHARS` characters of it, cut at line starts (a line lies in one chunk).
    Found in the same pass: they cost little more than the words alone."""

    def __init__(self, source: str) -> None:
        scanned = word_characters(source)
        bounds, end = [0], len(source)
        while bounds[-1] < end:
            cut = source.find("\n", bounds[-1] + CHUNK_CHARS) + 1
            bounds.append(cut or end)
        self.bounds = bounds
        self.words = [frozenset(scanned[a:b].split()) for a, b in itertools.pairwise(bounds)]
        # (no word runs across a line break, so none across two chunks)
        self.all_words: frozenset[str] = frozenset().union(*self.words)

    def spans(self, holders: frozenset[str]) -> list[tuple[int, int]]:
        """(start, end) offsets of the runs of chunks with a word of `holders`."""
        spans: list[tuple[int, int]] = []
        bounds = self.bounds
        for i, words in enumerate(self.words):
            if not words.isdisjoint(holders):
                if spans and spans[-1][1] == bounds[i]:
                    spans[-1] = (spans[-1][0], bounds[i + 1])
                else:
                    spans.append((bounds[i], bounds[i + 1]))
        return spans


def words_holding(word_text: str, piece: str) -> frozenset[str]:
    """The words of `word_text` (words joined by newlines) that hold `piece`."""
    found = set()
    find, at = word_text.find, word_text.find(piece)
    while at >= 0:
        start = word_text.rfind("\n", 0, at) + 1
        end = find("\n", at)
        if end < 0:
            end = len(word_text)
        found.add(word_text[start:end])
        at = find(piece, end)
    return frozenset(found)
