"""A function's training-loop events with the events of the file's functions it calls
put in place of each call: a loop split across methods (`self._start_update()` zeroes,
`self.run_batch(batch)` runs backward(), `self._finish_update()` steps) read as one."""

from __future__ import annotations

import ast
import dataclasses

from torchdoctor.check.analysis.events import CALL, Branch, Event
from torchdoctor.check.analysis.file_loops import FileLoops
from torchdoctor.check.analysis.functions import FunctionInfo

_DEPTH = 3  # calls followed below the function itself
_BUDGET = 400  # events per function at most: a huge call tree is not inlined


def inlined_events(fl: FileLoops, fi: FunctionInfo) -> list[Event]:
    """`fl.events(fi)` where each call of a function of this file is replaced by that
    function's events (recursively, `_DEPTH` deep, never re-entering a function on the
    path). An inlined event keeps its own `node` (for its text) and gets `site`, the call
    in `fi` it runs under (for where to report), and the chain of the call before its
    own, so loops and `if`s around the call enclose it."""
    return inlined_events_with(fl, fi)[0]


def inlined_events_with(fl: FileLoops, fi: FunctionInfo) -> tuple[list[Event], list[FunctionInfo]]:
    """`inlined_events` and the functions whose events were put in place (what a test in
    the loop reads may be assigned in them too)."""
    out: list[Event] = []
    callees: list[FunctionInfo] = []
    if not _inline(fl, fi, (), None, (fi,), out, callees):
        return fl.events(fi), []
    return out, callees


def _inline(
    fl: FileLoops,
    fi: FunctionInfo,
    prefix: tuple[Branch, ...],
    site: ast.AST | None,
    path: tuple[FunctionInfo, ...],
    out: list[Event],
    callees: list[FunctionInfo],
) -> bool:
    for event in fl.events(fi):
        if len(out) > _BUDGET:
            return False
        chain = (*prefix, *event.chain)
        callee = _callee(fl, fi, event, path)
        if callee is not None:
            if callee not in callees:
                callees.append(callee)
            if not _inline(fl, callee, chain, site or event.node, (*path, callee), out, callees):
                return False
            continue
        if site is None:
            out.append(event)
        else:
            out.append(dataclasses.replace(event, chain=chain, site=site, rank=len(out)))
    return True


def _callee(
    fl: FileLoops, fi: FunctionInfo, event: Event, path: tuple[FunctionInfo, ...]
) -> FunctionInfo | None:
    if event.kind != CALL or not isinstance(event.node, ast.Call) or len(path) > _DEPTH:
        return None
    resolved = fl.resolve(fi, event.node, other_files=False)
    if resolved is None or resolved[0] in path or resolved[0].is_module:
        return None
    return resolved[0]
