"""Whether a function's text may write in place (TD213, TD215): the answer of each rule's
regex, found faster. The regexes' `[a-z]_\\(` alternative is tried at every letter of the
text; here `_(` is found with `str.find` and its letter checked, and the regex keeps only
the alternatives that start with a symbol."""

from __future__ import annotations

import re
import string

# TD213: `w -= ...`, `w.add_(...)`, `w[i] = ...`: any in-place write at all
LEAF_WRITE = re.compile(r"[-+*/@]=|[a-z]_\(|\]\s*=[^=]")
_LEAF_SYMBOLS = re.compile(r"[-+*/@]=|\]\s*=[^=]")

# TD215: `x += y`, `x.mul_(` (not `__init__(`), `inplace=True`, `x[i] = v`
SAVED_WRITE = re.compile(r"(?:[-+*/@%&|^]|//|\*\*|<<|>>)=|[a-z0-9]_\(|inplace|\]\s*=(?!=)")
_SAVED_SYMBOLS = re.compile(r"(?:[-+*/@%&|^]|//|\*\*|<<|>>)=|\]\s*=(?!=)")

_LOWER = frozenset(string.ascii_lowercase)
_LOWER_OR_DIGIT = _LOWER | frozenset(string.digits)


def _call_of_underscored(text: str, before: frozenset[str]) -> bool:
    """`_(` right after one of the characters `before`."""
    at = text.find("_(")
    while at >= 0:
        if at and text[at - 1] in before:
            return True
        at = text.find("_(", at + 1)
    return False


def may_write_leaf(text: str) -> bool:
    """`LEAF_WRITE.search(text) is not None`."""
    return _LEAF_SYMBOLS.search(text) is not None or _call_of_underscored(text, _LOWER)


def may_write_saved(text: str) -> bool:
    """`SAVED_WRITE.search(text) is not None`."""
    return (
        "inplace" in text
        or _SAVED_SYMBOLS.search(text) is not None
        or _call_of_underscored(text, _LOWER_OR_DIGIT)
    )
