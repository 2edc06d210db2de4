"""A loop's second iteration, for the meetings of devices it can show.

The scope interpreter runs a loop to a fixpoint: the state at its head joins the state
before the loop with the state each iteration leaves, so a value on the device before the
loop and rebound on the CPU in its body (`masks = torch.FloatTensor(...)` at the end of a
rollout step) is unknown at the head. Meetings are recorded on the first iteration (from the
state before the loop) and on the second, run from the state the first one leaves: there the
value is on the CPU on every path, and what it meets on the device is a crash from the
second iteration on. These helpers say when that second run is worth doing and which of its
meetings stand.
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.syntax import encloses, loop_counter
from torchdoctor.check.analysis.values import Env, Kind, Mismatch, Place
from torchdoctor.check.tree_walk import walk

# what a loop's second iteration can newly meet: tensors and modules on a known place
_CARRIED = frozenset({Kind.TENSOR, Kind.BATCH, Kind.MODULE})


def carries_new_place(entry: Env, second: Env) -> bool:
    """Whether the first iteration leaves some tensor or module on a known place it did
    not have before the loop (otherwise the second iteration meets nothing new)."""
    for key, value in second.items():
        if value.place is Place.UNKNOWN or value.kind not in _CARRIED:
            continue
        held = entry.get(key)
        if held is None or held.place is not value.place:
            return True
    return False


def runs_once(loop: ast.stmt) -> bool:
    """A `for` over a literal of at most one element, or `range(1)`: no second iteration."""
    if not isinstance(loop, ast.For | ast.AsyncFor):
        return False
    it = loop.iter
    if isinstance(it, ast.List | ast.Tuple | ast.Set):
        return len(it.elts) <= 1
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "range"
        and len(it.args) == 1
        and isinstance(it.args[0], ast.Constant)
    ):
        return isinstance(it.args[0].value, int) and it.args[0].value <= 1
    return False


def one_pass_branches(loop: ast.stmt) -> list[ast.stmt]:
    """Statements of the loop body that run on one pass only: the body of an
    `if i == c:` (or `if not i:`) on the loop's counter (`for i in range(n)`,
    `for i, b in enumerate(...)`) that nothing else in the loop rebinds."""
    counter = loop_counter(loop)
    if counter is None or not isinstance(loop, ast.For | ast.AsyncFor):
        return []
    found: list[ast.stmt] = []
    for node in walk(loop):
        if (
            isinstance(node, ast.Name)
            and node.id == counter
            and isinstance(node.ctx, ast.Store)
            and not any(node is part for part in walk(loop.target))
        ):
            return []  # rebound in the body: not a counter
        if isinstance(node, ast.If) and _pins(node.test, counter):
            found.extend(node.body)
    return found


def _pins(test: ast.expr, counter: str) -> bool:
    """`i == c`, `c == i` or `not i`: true on one value of the counter only."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return isinstance(test.operand, ast.Name) and test.operand.id == counter
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = (test.left, test.comparators[0])
    return any(isinstance(s, ast.Name) and s.id == counter for s in sides) and any(
        isinstance(s, ast.Constant) for s in sides
    )


def stands(m: Mismatch, skipped: list[ast.stmt]) -> bool:
    """A meeting of the second iteration that does not lie in a one-pass branch."""
    return not any(encloses(stmt, m.site) for stmt in skipped)
