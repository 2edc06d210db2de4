"""Syntax trees parsed before the engine checks their file, kept for that check.

Building the project's facts (analysis/project_facts.py: call facts, classes whose
device defaults to CUDA, clamping hooks, module pickles, ...) and reading a file as
another file's sibling (file_loops) parse some files before the engine checks them;
the engine then takes the tree (`take`) instead of parsing the same text again. The
analyses only read trees, so one tree serves both. At most `KEPT_CHARACTERS` of source
text are kept (a tree takes some 25-75 bytes per character of its text).

Which trees go when that is full: the project index names the files in the order the
run checks them (`plan`), and the engine says which file it checks (`take_for_check`),
so the trees no check will take (a file outside the run; with workers, a file another
process checked) go first, oldest first, then the trees whose check comes last (the
one whose use lies furthest ahead goes: fewest trees parsed twice). A tree taken is no
longer kept, and none is kept for a file already checked (read again as a sibling: no
check would take it).

The checks start with the files whose trees are kept then (`checks_first`): those are
the index's trees, taken before the trees that later sibling reads and facts built on
demand keep push them out (on torch's tree, half the time spent parsing a file again).
"""

from __future__ import annotations

import ast
import gc
import os
from collections import OrderedDict
from collections.abc import Sequence

KEPT_CHARACTERS = 3_000_000

_KEPT: OrderedDict[str, tuple[str, ast.Module]] = OrderedDict()
_size = 0  # characters of the texts in _KEPT
# The run's files (absolute paths) -> their place in the order of checks; files before
# `_checked` have been checked (by this process or, with workers, by another one).
_RANK: dict[str, int] = {}
_checked = 0
# Whether a tree kept during a run's checks is frozen (`gc.freeze`): set by
# `parallel.run_tasks`, which collects the young garbage after each file and unfreezes
# at the end. A tree parsed while checking another file (a sibling read, a fact built on
# demand) lives on until its own check: the collection after the file would walk every
# node of it (0.25 s of a 21 s run on torch's tree) to find no garbage.
_freeze_kept = False


def freeze_kept(on: bool) -> None:
    """Freeze the trees `keep` keeps from now on (True), or no longer (False)."""
    global _freeze_kept
    _freeze_kept = on


def plan(path: str) -> None:
    """`path` is the next file the run checks (after those planned before it)."""
    if path:
        _RANK.setdefault(os.path.abspath(path), len(_RANK))


def keep(path: str, source: str, tree: ast.Module) -> None:
    """Keep `tree`, parsed from `source` at `path`, for the check of that file."""
    global _size
    if not path:
        return
    key = os.path.abspath(path)
    old = _KEPT.pop(key, None)
    if old is not None:
        _size -= len(old[0])
    if len(source) > KEPT_CHARACTERS or _RANK.get(key, _checked) < _checked:
        return
    _KEPT[key] = (source, tree)
    _size += len(source)
    if _freeze_kept:
        # (the file being checked is frozen with it: checks leave no reference cycles
        # for the collector, tests/check/test_memory.py)
        gc.freeze()
    while _size > KEPT_CHARACTERS:
        _, (text, _) = _KEPT.popitem(last=False) if not _RANK else _evict()
        _size -= len(text)


def _evict() -> tuple[str, tuple[str, ast.Module]]:
    """The kept tree to drop: the oldest one no check takes, else the one checked last."""
    last, last_rank = "", -1
    for key in _KEPT:
        rank = _RANK.get(key, -1)
        if rank < _checked:
            last = key
            break
        if rank > last_rank:
            last, last_rank = key, rank
    return last, _KEPT.pop(last)


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


def take_for_check(path: str, source: str) -> ast.Module | None:
    """`take`, by the engine about to check `path`: the files planned before it are done."""
    global _checked
    if _RANK and path:
        rank = _RANK.get(os.path.abspath(path))
        if rank is not None and rank >= _checked:
            _checked = rank + 1
    return take(path, source)


def checks_first(paths: Sequence[str]) -> list[int]:
    """The order to check `paths` in (their indices): first the files whose tree is kept,
    then the others, each in the given order. It becomes the plan."""
    kept = [bool(path) and os.path.abspath(path) in _KEPT for path in paths]
    order = [i for i, k in enumerate(kept) if k] + [i for i, k in enumerate(kept) if not k]
    _RANK.clear()
    for i in order:
        plan(paths[i])
    return order


def parse_kept(path: str, source: str) -> ast.Module:
    """`ast.parse(source)`, or the tree kept for it; kept (again) for the file's check."""
    tree = take(path, source) or ast.parse(source)
    keep(path, source, tree)
    return tree


def forget() -> None:
    """Drop every kept tree and the plan (a new run's project index starts)."""
    global _size, _checked
    _KEPT.clear()
    _RANK.clear()
    _size = 0
    _checked = 0
