"""Tests that let a statement run on one pass of a loop only: `if i == 0:` where `i` is the
loop's counter (`for i, batch in enumerate(loader)`, `for i in range(n)`), directly or
through a copy the loop makes of it on every pass (`self.batch_index = i`, read by a method
the loop calls on `self`).

A counter takes a new value on every pass, so a test pinning it to one value holds on at
most one pass: a `zero_grad()` under it does not clear the gradients of the other passes.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from torchdoctor.check.analysis.events import Event, if_branches_within
from torchdoctor.check.analysis.path_guards import TRUTHY, conds_of
from torchdoctor.check.analysis.syntax import bound_keys, dotted, encloses, loop_counter
from torchdoctor.check.tree_walk import walk


def single_pass_guard(event: Event, loop: ast.AST, extra: Sequence[ast.AST] = ()) -> ast.If | None:
    """The `if` between `loop` and `event` whose test pins a counter of `loop` to one value
    (so `event` runs on one pass at most), or None. `extra`: the functions the loop's calls
    run in place (an inlined event's tests there may read `self.<copy>` only, `self` being
    the object whose method holds the loop)."""
    counters = loop_counters(loop, event, extra)
    if not counters:
        return None
    for b in if_branches_within(event, loop):
        assert isinstance(b.node, ast.If)
        in_loop = encloses(loop, b.node)
        for cond in conds_of(b.node.test, b.label == "body"):
            if cond.subject not in counters:
                continue
            if not in_loop and not cond.subject.startswith("self."):
                continue  # a name of the called function, not the loop's
            if cond.equal != (cond.value is TRUTHY):
                return b.node  # `i == c` (equal to a constant), `not i` (falsy: 0)
    return None


def loop_counters(loop: ast.AST, event: Event, extra: Sequence[ast.AST] = ()) -> set[str]:
    """The names holding `loop`'s counter on the pass `event` runs in: the `for` target
    of `range(...)` or the index of `enumerate(...)`, and what the loop body copies it
    into (`self.batch_index = i`, a statement of the body ahead of `event`), when nothing
    else in the loop or `extra` assigns them."""
    counter = loop_counter(loop) if isinstance(loop, ast.For) else None
    if counter is None or not isinstance(loop, ast.For):
        return set()
    found = {counter}
    at = event.site if event.site is not None else event.node
    line = getattr(at, "lineno", 0)
    for stmt in loop.body:
        if getattr(stmt, "end_lineno", 0) >= line:
            break
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.value, ast.Name)
            and stmt.value.id == counter
        ):
            copy = dotted(stmt.targets[0])
            if copy is not None:
                found.add(copy)
    assigned: dict[str, int] = {}
    for scope in (loop, *extra):
        for node in walk(scope):
            if scope is loop and node is loop:
                continue  # the `for` binds the counter itself
            for key in bound_keys(node):
                assigned[key] = assigned.get(key, 0) + 1
    # each copy is made once (the statement above); the counter is never reassigned
    return {n for n in found if assigned.get(n, 0) == (0 if n == counter else 1)}
