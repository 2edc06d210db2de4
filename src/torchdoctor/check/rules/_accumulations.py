"""Accumulations in a loop or a method (`a += v`, `a = a + v`, `a.append(v)`) and the
syntax that tells whether the accumulator outlives an iteration (TD206)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.tree_walk import walk


def accumulations(
    loop: ast.AST, kept: Callable[[ast.Call], list[ast.expr]] | None = None
) -> list[tuple[ast.stmt, str, ast.expr]]:
    """(statement, accumulator, added value) for `a += v`, `a = a + v`, `a.append(v)`,
    and with `kept`, `a.update(v)` of an object whose method adds `v` up in its state."""
    found: list[tuple[ast.stmt, str, ast.expr]] = []
    todo: list[ast.stmt] = list(getattr(loop, "body", []))
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        for name in ("body", "orelse", "finalbody"):
            todo.extend(getattr(stmt, name, []) or [])
        for holder in getattr(stmt, "handlers", []) or []:
            todo.extend(holder.body)
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
            acc = dotted(stmt.target)
            if acc is not None:
                found.append((stmt, acc, stmt.value))
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            acc = dotted(stmt.targets[0])
            value = stmt.value
            if acc and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
                if dotted(value.left) == acc:
                    found.append((stmt, acc, value.right))
                elif dotted(value.right) == acc:
                    found.append((stmt, acc, value.left))
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            if (
                isinstance(call.func, ast.Attribute)
                and call.func.attr == "append"
                and len(call.args) == 1
                and not call.keywords
            ):
                acc = dotted(call.func.value)
                if acc is not None:
                    found.append((stmt, acc, call.args[0]))
            elif kept is not None and isinstance(call.func, ast.Attribute):
                acc = dotted(call.func.value)
                if acc is not None:
                    found += [(stmt, acc, arg) for arg in kept(call)]
    return found


def reset_inside(loop: ast.AST, acc: str, stmt: ast.stmt) -> bool:
    """`acc` is (re)bound inside the loop, so it does not outlive an iteration."""
    for node in walk(loop):
        if (
            isinstance(node, ast.Assign)
            and node is not stmt
            and any(dotted(t) == acc for target in node.targets for t in _unpacked(target))
            and not _adds_to(node.value, acc)
        ):
            return True
        if isinstance(node, ast.For | ast.comprehension) and dotted(node.target) == acc:
            return True
    return False


def _unpacked(target: ast.expr) -> list[ast.expr]:
    """The targets `a, (b, c) = ...` binds: a, b, c (a plain target itself)."""
    if isinstance(target, ast.Tuple | ast.List):
        return [t for e in target.elts for t in _unpacked(e)]
    return [target.value if isinstance(target, ast.Starred) else target]


def plain_number_accumulator(fi: FunctionInfo, acc: str) -> bool:
    """`acc = 0` / `acc = 0.0` before, and never used as a tensor (`acc.item()`)."""
    if "." in acc or re.search(r"\b" + re.escape(acc) + r"\s*\.", fi.text):
        return False
    for stmt in fi.own_statements():
        if isinstance(stmt, ast.Assign) and any(dotted(t) == acc for t in stmt.targets):
            value = stmt.value
            number = isinstance(value, ast.Constant) and isinstance(value.value, int | float)
            if not number and not _adds_to(value, acc):
                return False
    return True


def _adds_to(value: ast.expr, acc: str) -> bool:
    """`acc + x` / `x + acc`: the accumulation itself, not a reset."""
    return isinstance(value, ast.BinOp) and acc in {dotted(value.left), dotted(value.right)}
