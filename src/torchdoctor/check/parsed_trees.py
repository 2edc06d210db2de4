"""Syntax trees parsed before the engine checks their file, kept for that check.

Building the project's facts (analysis/project_facts.py: call facts, classes whose
device defaults to CUDA, clamping hooks, module pickles, ...) and reading a file as
another file's sibling (file_loops) parse some files before the engine checks them;
the engine then takes the tree (`take`) instead of parsing the same text again. The
analyses only read trees, so one tree serves both. At most `KEPT_CHARACTERS` of source
text are kept (a tree takes some 25-75 bytes per character of its text): the oldest
trees go first, and a tree taken is no longer kept.
"""

from __future__ import annotations

import ast
import os
from collections import OrderedDict

KEPT_CHARACTERS = 3_000_000

_KEPT: OrderedDict[str, tuple[str, ast.Module]] = OrderedDict()
_size = 0  # characters of the texts in _KEPT


def keep(path: str, source: str, tree: ast.Module) -> None:
    """Keep `tree`, parsed from `source` at `path`, for the check of that file."""
    global _size
    if not path:
        return
    key = os.path.abspath(path)
    old = _KEPT.pop(key, None)
    if old is not None:
        _size -= len(old[0])
    if len(source) > KEPT_CHARACTERS:
        return
    _KEPT[key] = (source, tree)
    _size += len(source)
    while _size > KEPT_CHARACTERS:
        _, (text, _) = _KEPT.popitem(last=False)
        _size -= len(text)


def take(path: str, source: str) -> ast.Module | None:
    """The kept tree of `source` at `path` (no longer kept), or None."""
    global _size
    if not _KEPT or not path:
        return None
    entry = _KEPT.pop(os.path.abspath(path), None)
    if entry is None:
        return None
    _size -= len(entry[0])
    text, tree = entry
    return tree if text is source or text == source else None


def parse_kept(path: str, source: str) -> ast.Module:
    """`ast.parse(source)`, or the tree kept for it; kept (again) for the file's check."""
    tree = take(path, source) or ast.parse(source)
    keep(path, source, tree)
    return tree


def forget() -> None:
    """Drop every kept tree (a new run's project index starts)."""
    global _size
    _KEPT.clear()
    _size = 0
