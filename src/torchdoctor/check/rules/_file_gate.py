"""Per-file gates for rules whose `triggers` (plain substrings) cannot say enough."""

from __future__ import annotations

import re

from torchdoctor.check.rule import Rule


def skip_visits(rule: Rule) -> None:
    """Nothing in this file can be reported by `rule`: the engine, which reads
    `node_types` from the rule instance when it sets up the walk of a file, then calls
    no `visit` for it. (Called from a rule's `__init__`.)"""
    vars(rule)["node_types"] = ()


def has_word(source: str, word: str) -> bool:
    """`word` occurs as a whole identifier-like word (`torch.save`, not `saved_tensors`)."""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", source) is not None
