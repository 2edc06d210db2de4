"""Whether a text writes a name right before a `(`, found where the name occurs.

`CALLED_NAME.findall(text)` gives the names a text may call; a pattern tried at every
position of a long text costs far more than a `str.find` of the few names asked about.
"""

from __future__ import annotations

import re

CALLED_NAME = re.compile(r"([A-Za-z_]\w*)\s*\(")
_NAME = re.compile(r"[A-Za-z_]\w*")
_TO_PAREN = re.compile(r"\s*\(")
_WORD_CHAR = re.compile(r"\w")
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")


def writes_call(text: str, name: str) -> bool:
    """Whether `name` is in `CALLED_NAME.findall(text)`.

    A match's name is the run of word characters before `\\s*(` from its first ASCII
    letter or `_` (the pattern cannot start at a digit or other letter, and shorter
    names are followed by a word character, not `\\s*(`). So `name` is found where it
    is followed by `\\s*(` and preceded only by such word characters, if any.
    """
    if not _NAME.fullmatch(name):
        return False
    at = text.find(name)
    while at >= 0:
        if _TO_PAREN.match(text, at + len(name)) and _starts_a_name(text, at):
            return True
        at = text.find(name, at + 1)
    return False


def _starts_a_name(text: str, at: int) -> bool:
    """Whether the pattern's name starts at `at` (a letter or `_` there)."""
    before = at - 1
    while before >= 0 and text[before] not in _NAME_START and _WORD_CHAR.match(text[before]):
        before -= 1
    return before < 0 or not _WORD_CHAR.match(text[before])
