"""TD206 where the training step is split across methods: a method returns the loss its
callers give to backward() (`logits, loss = self.collect(model, batch, self.stats)`, then
`loss.backward()`, in a subclass's loop in another file) and stores it first into an
object it was given that keeps every value (`stats["loss"] = loss`, where the class's
`__setitem__` appends it). The object comes from the caller's own state (`self.stats`),
so it outlives the step, and each step adds another graph to it."""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.caller_backward import training_callers
from torchdoctor.check.analysis.class_calls import argument_for
from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.kept_state import receiver_class, stored_and_kept
from torchdoctor.check.analysis.syntax import bound_names, dotted, encloses
from torchdoctor.check.rule import Rule
from torchdoctor.check.tree_walk import walk

# `stats["loss"] = loss`: a plain name stored under a key of a plain name (any line end)
_STORE = re.compile(
    r"(?:^|[\r\n])[ \t]+\w+\[[^\]\r\n]+\][ \t]*=[ \t]*\w+[ \t]*(?:#[^\r\n]*)?(?=[\r\n]|\Z)"
)
# one line of it, and the piece every such line holds (`] =`): found first, by a regex
# with a literal head that skips to each `]`, while `_STORE` tries every character
_STORE_LINE = re.compile(r"[ \t]+\w+\[[^\]\r\n]+\][ \t]*=[ \t]*\w+[ \t]*(?:#[^\r\n]*)?")
_STORED_AT = re.compile(r"\][ \t]*=")


def has_store_line(source: str) -> bool:
    """Whether `_STORE` matches somewhere in `source`: some line (text between `\\r` /
    `\\n`) that `_STORE_LINE` matches whole."""
    for hit in _STORED_AT.finditer(source):
        at = hit.start()
        start = source.rfind("\n", 0, at)
        start = max(start, source.rfind("\r", start + 1, at)) + 1
        end = source.find("\n", at)
        if end < 0:
            end = len(source)
        cr = source.find("\r", at, end)
        if _STORE_LINE.fullmatch(source, start, cr if cr >= 0 else end):
            return True
    return False


def report_kept_for_callers(rule: Rule) -> None:
    ctx = rule.ctx
    source = ctx.source
    if "] =" not in source or "class " not in source or not ctx.project.class_files:
        return
    if not has_store_line(source):
        return
    fl = analysis(ctx)
    for fi in fl.all_functions():
        if fi.cls is None or fi.is_module:
            continue
        text = fi.text
        if "] =" not in text or "return" not in text or "backward(" in text:
            continue
        returned = _returned_names(fi)
        stores: list[tuple[ast.stmt, str, str]] = []  # (statement, receiver, value)
        for stmt in fi.own_statements():
            if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name)):
                continue
            if stmt.value.id not in returned or _bound_twice(fi, stmt.value.id):
                continue
            target = stmt.targets[0]
            if not isinstance(target, ast.Subscript) or not isinstance(target.value, ast.Name):
                continue
            if target.value.id in fi.params() and stored_and_kept(ctx, fi, stmt) is not None:
                stores.append((stmt, target.value.id, stmt.value.id))
        if not stores:
            continue
        callers = training_callers(fl, fi)
        for stmt, receiver, value in stores:
            for caller in callers:
                if caller.position not in returned[value]:
                    continue
                argument = argument_for(fi, caller.call, receiver)
                held = dotted(argument) if argument is not None else None
                if held is None or not held.startswith("self."):
                    continue  # an object the caller keeps: not one made for this call
                if _reset_each_pass(caller.caller, caller.call, held):
                    continue
                cls = receiver_class(ctx, fi, ast.Name(id=receiver))
                rule.report(
                    stmt,
                    f"`{ctx.segment(stmt)}` keeps `{value}` with its autograd graph in "
                    f"`{receiver}` ({cls}, whose `__setitem__` keeps every value it is "
                    f"given): {caller.caller.label} in {caller.file} passes `{held}` and runs "
                    f"`backward()` on the returned `{value}` (line {caller.backward_line}), "
                    "so every training step adds its graph: memory grows with every step",
                    hint=f"store `{value}.item()` (a float) or `{value}.detach()`",
                )
                break


_RESETS = frozenset({"clear", "reset", "empty", "reset_states", "zero_"})


def _reset_each_pass(caller: FunctionInfo, call: ast.Call, held: str) -> bool:
    """The innermost loop around `call` also empties or rebinds `held` (`self.stats =
    Stats()`, `self.stats.clear()`): it keeps one step's values at most."""
    loop: ast.AST | None = None
    for node in walk(caller.node):  # outer loops first: the last one found is innermost
        if isinstance(node, ast.For | ast.AsyncFor | ast.While) and encloses(node, call):
            loop = node
    if loop is None:
        return False
    for node in walk(loop):
        if isinstance(node, ast.Assign) and any(dotted(t) == held for t in node.targets):
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _RESETS
            and dotted(node.func.value) == held
        ):
            return True
    return False


def _returned_names(fi: FunctionInfo) -> dict[str, set[int | None]]:
    """Name -> the positions it is returned at (None: returned itself)."""
    found: dict[str, set[int | None]] = {}
    for stmt in fi.own_statements():
        if not isinstance(stmt, ast.Return) or stmt.value is None:
            continue
        value = stmt.value
        if isinstance(value, ast.Name):
            found.setdefault(value.id, set()).add(None)
        elif isinstance(value, ast.Tuple):
            for i, element in enumerate(value.elts):
                if isinstance(element, ast.Name):
                    found.setdefault(element.id, set()).add(i)
    return found


def _bound_twice(fi: FunctionInfo, name: str) -> bool:
    """`name` bound more than once (or as a parameter): the stored value and the one
    returned may differ (`loss = loss.item()` between them)."""
    if name in fi.params():
        return True
    return sum(bound_names(stmt).count(name) for stmt in fi.own_statements()) != 1
