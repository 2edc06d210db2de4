"""A loop's value that its first iteration hands a moved model on the device and its next
ones on the CPU.

The scope interpreter runs a loop's first iteration from the state before the loop and
its second from the state the first leaves (scope_loops.py). A variable bound on the
device before a rollout loop (`masks = torch.zeros(n, 1, device=device)`), passed to a
method of a model moved to the device (`policy.act(obs, masks)`) and rebound at the end
of the body by a factory without `device=` (`masks = torch.FloatTensor(...)`) is on the
device at that call on the first iteration and on the CPU from the second on. What the
method does with it is read elsewhere (another file's class) or not at all, so no meeting
of devices is proven; the author's own first binding says where the value belongs, and
the rebinding breaks it. Where the join at the loop head makes such a value unknown,
these logs keep the two sides apart: the values each use sees on the first pass, and on
the second.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from torchdoctor.check.analysis.syntax import encloses
from torchdoctor.check.analysis.torch_api import _MODULE_SELF_METHODS, MODULE_OWN_METHODS
from torchdoctor.check.analysis.values import Kind, Mismatch, Place, Value, join, proven_module

# a model's own methods take no tensors that meet its parameters
_NOT_USES = _MODULE_SELF_METHODS | MODULE_OWN_METHODS

_Use = tuple[ast.Call, ast.expr, Value, Value]  # the call, the argument, its value, the model


@dataclass(frozen=True)
class LoopSplit:
    """A variable the loop's first iteration passes to a moved model's method on the
    device, and every later one as a tensor the loop made on the CPU."""

    loop: ast.stmt
    site: ast.Call  # the method call (`policy.act(obs, masks)`)
    node: ast.expr  # the argument (`masks`)
    entry: Value  # what the first iteration passes: on the device
    carried: Value  # what the next ones pass: made on the CPU in the loop (`source`)
    model: Value  # the model whose method it is, moved to the device


class UseLog:
    """What each argument of a moved model's method call holds on a loop's first pass
    (phase 1) and on its second (phase 2), joined over the times a pass runs the call."""

    __slots__ = ("first", "loop", "phase", "second")

    def __init__(self, loop: ast.stmt) -> None:
        self.loop = loop
        self.phase = 0  # 0: not logging (the silent passes, the recording pass)
        self.first: dict[tuple[int, int], _Use] = {}
        self.second: dict[tuple[int, int], _Use] = {}

    def add(self, site: ast.Call, node: ast.expr, value: Value, model: Value) -> None:
        if not self.phase:
            return
        book = self.first if self.phase == 1 else self.second
        key = (id(site), id(node))
        held = book.get(key)
        book[key] = (site, node, value if held is None else join(held[2], value), model)


def method_uses(
    node: ast.Call, recv: Value, args: list[Value], keywords: list[Value]
) -> list[tuple[ast.expr, Value]]:
    """The variables a call of a moved model's method passes: (argument, value) pairs."""
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr in _NOT_USES or not proven_module(recv):
        return []
    given = [*zip(node.args, args, strict=False)]
    given += zip((kw.value for kw in node.keywords), keywords, strict=False)
    return [(n, v) for n, v in given if isinstance(n, ast.Name | ast.Attribute)]


def splits(
    log: UseLog, mismatches: dict[tuple[int, int], Mismatch], skipped: list[ast.stmt]
) -> list[LoopSplit]:
    """The uses the two passes see on two places: on the device first, on the CPU after
    (not where a meeting is already recorded, nor in a branch one pass only runs)."""
    found = []
    for key, (site, node, carried, model) in log.second.items():
        first = log.first.get(key)
        if first is None or key in mismatches or not _made_on_cpu(carried, log.loop):
            continue
        entry = first[2]
        if entry.kind is not Kind.TENSOR or entry.place is not Place.DEVICE:
            continue
        if entry.assumed or entry.maybe or entry.is_input:
            continue
        if any(encloses(stmt, site) for stmt in skipped):
            continue
        found.append(LoopSplit(log.loop, site, node, entry, carried, model))
    return found


def _made_on_cpu(value: Value, loop: ast.stmt) -> bool:
    """A tensor a factory without `device=` made in the loop's body (not moved since)."""
    return (
        value.kind is Kind.TENSOR
        and value.place is Place.CPU
        and not (value.assumed or value.is_input or value.scalar or value.maybe)
        and isinstance(value.source, ast.Call)
        and encloses(loop, value.source)
    )
