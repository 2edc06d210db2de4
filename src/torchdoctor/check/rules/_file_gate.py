"""Per-file gates for rules whose `triggers` (plain substrings) cannot say enough."""

from __future__ import annotations

import ast
import re

from torchdoctor.check.rule import Rule


def skip_visits(rule: Rule, keep: tuple[type[ast.AST], ...] = ()) -> None:
    """No node of `rule.node_types` except those of `keep` can be reported in this file:
    the engine, which reads `node_types` from the rule instance when it sets up the
    walk of a file, then calls `visit` for no others. (Called from a rule's `__init__`;
    `visit` must still give the same findings if called for the others.)"""
    vars(rule)["node_types"] = tuple(t for t in rule.node_types if t in keep)


def has_word(source: str, word: str) -> bool:
    """`word` occurs as a whole identifier-like word (`torch.save`, not `saved_tensors`)."""
    # A pattern that starts with the word is searched for fast (a lookbehind first is not).
    for match in re.finditer(rf"{re.escape(word)}(?!\w)", source):
        start = match.start()
        if start == 0 or not _WORD_CHAR.match(source, start - 1):
            return True
    return False


def words_starting_with(source: str, prefix: str) -> set[str]:
    """Every word (`\\w+` run) of `source` that starts with `prefix` in any case, and
    maybe some that merely contain it: `req` finds `require_grad` and `REQUIRES_GRAD`."""
    lowered = source.lower()
    pattern = rf"{re.escape(prefix.lower())}\w*"
    if len(lowered) != len(source):  # a few characters lengthen in lower case
        return set(re.findall(pattern, source, re.IGNORECASE))
    # search the lower-cased text (fast: a literal first), read the words from the source
    return {source[m.start() : m.end()] for m in re.finditer(pattern, lowered)}


_WORD_CHAR = re.compile(r"\w")
