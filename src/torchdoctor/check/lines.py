"""The one line model of the checker: lines as Python's tokenizer splits them.

A physical line ends at `\\r\\n`, `\\r` or `\\n`, and nowhere else: not at a form
feed, `\\x1c`-`\\x1e`, `\\x85`, `\\u2028` or `\\u2029`, where `str.splitlines()`
would split (and move every later line number). Line numbers of findings, the
start of the line a position is on, and the lines `# noqa` comments sit on all
come from here, so they agree with the line numbers `ast` reports.
"""

from __future__ import annotations

import itertools
import re

NEWLINE = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """The lines of `text` without their ends; a final line end gives a last `""`."""
    if "\r" not in text:
        return text.split("\n")
    return NEWLINE.split(text)


def line_starts(text: str, lines: list[str] | None = None) -> list[int]:
    """The offset at which each line starts (index 0 is line 1)."""
    if "\r" in text:
        return [0, *(m.end() for m in NEWLINE.finditer(text))]
    sizes = map(len, (lines if lines is not None else text.split("\n"))[:-1])
    return list(itertools.accumulate(map((1).__add__, sizes), initial=0))


def as_lf(text: str) -> str:
    """`text` with every line end made `\n`: for `^`/`$` patterns (Python's `re` knows
    no other line end). Line numbers stay the same; offsets do not."""
    return NEWLINE.sub("\n", text) if "\r" in text else text


def line_start(text: str, offset: int) -> int:
    """The offset of the start of the line that holds `offset`."""
    return max(text.rfind("\n", 0, offset), text.rfind("\r", 0, offset)) + 1


def line_end(text: str, offset: int) -> int:
    """The offset of the end of the line that holds `offset` (its line break, or the end)."""
    end = len(text)
    for newline in ("\n", "\r"):
        at = text.find(newline, offset, end)
        if at >= 0:
            end = at
    return end


def row_col(text: str, offset: int) -> tuple[int, int]:
    """(line, column), both 1-based, of a character offset."""
    start = line_start(text, offset)
    line = text.count("\n", 0, start) + text.count("\r", 0, start) - text.count("\r\n", 0, start)
    return line + 1, offset - start + 1
