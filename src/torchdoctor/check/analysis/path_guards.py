"""What the `if` tests around a statement say about a value: `self.method == "binary"`.

Two places of a program that branch on the same setting (`if self.task == "multiclass":`
in the method that picks the activation and in the one that picks the loss) run together
only where their tests agree. A rule that follows a value from one place to the other
uses this to drop the branches that cannot run together with the one it looks at.

Only equality tests of a name or attribute against a constant are understood; any other
test says nothing (it prunes no branch), so what is left is a superset of what can run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.tree_walk import walk

TRUTHY: object = object()  # Cond.value of `if flag:`: bool(subject) is `equal`


@dataclass(frozen=True)
class Cond:
    """`subject == value` (equal) or `subject != value` (not equal) holds; with value
    TRUTHY, `bool(subject) == equal`."""

    subject: str  # dotted text: `self.method`, `args.task`
    value: object  # a constant (str, int, bool, None)
    equal: bool


def _conds(test: ast.expr, holds: bool) -> list[Cond]:
    """What `test` evaluating to `holds` says (an empty list: nothing we understand)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _conds(test.operand, not holds)
    if isinstance(test, ast.BoolOp):
        # `a and b` true: both hold; `a or b` false: neither holds
        if isinstance(test.op, ast.And) == holds:
            return [c for v in test.values for c in _conds(v, holds)]
        return []
    if isinstance(test, ast.Name | ast.Attribute):
        subject = dotted(test)
        return [] if subject is None else [Cond(subject, TRUTHY, holds)]
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return []
    left, right, op = test.left, test.comparators[0], test.ops[0]
    if isinstance(left, ast.Constant):
        left, right = right, left
    subject = dotted(left)
    if subject is None or not isinstance(right, ast.Constant):
        return []
    if isinstance(op, ast.Eq | ast.Is):
        return [Cond(subject, right.value, holds)]
    if isinstance(op, ast.NotEq | ast.IsNot):
        return [Cond(subject, right.value, not holds)]
    return []


def conds_of(test: ast.expr, holds: bool) -> list[Cond]:
    """What `test` evaluating to `holds` says (an empty list: nothing we understand)."""
    return _conds(test, holds)


def _exits(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break)


def conditions_at(func: ast.AST, target: ast.AST) -> list[Cond]:
    """The tests known to hold where `target` (a node inside `func`'s body) runs: those of
    the `if`s it sits in, and `if x == c: return` above it in the same block (x != c)."""
    found: list[Cond] = []
    body = getattr(func, "body", None)
    stmts: list[ast.stmt] | None = body if isinstance(body, list) else None
    while stmts is not None:
        inner: list[ast.stmt] | None = None
        exits: list[Cond] = []
        for stmt in stmts:
            if not _contains(stmt, target):
                if isinstance(stmt, ast.If) and _exits(stmt.body) and not stmt.orelse:
                    exits.extend(_conds(stmt.test, False))
                continue
            found.extend(exits)
            if isinstance(stmt, ast.If):
                if any(_contains(s, target) for s in stmt.body):
                    found.extend(_conds(stmt.test, True))
                    inner = stmt.body
                elif any(_contains(s, target) for s in stmt.orelse):
                    found.extend(_conds(stmt.test, False))
                    inner = stmt.orelse
            elif not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = next(
                    (sub for sub in _blocks(stmt) if any(_contains(s, target) for s in sub)),
                    None,
                )
            break
        stmts = inner
    return found


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    out: list[list[ast.stmt]] = []
    for name in ("body", "orelse", "finalbody"):
        value = getattr(stmt, name, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            out.append(value)
    for handler in getattr(stmt, "handlers", []) or []:
        out.append(handler.body)
    for case in getattr(stmt, "cases", []) or []:
        out.append(case.body)
    return out


def _contains(node: ast.AST, target: ast.AST) -> bool:
    start, end = getattr(node, "lineno", 0), getattr(node, "end_lineno", 0) or 0
    line = getattr(target, "lineno", -1)
    if not start <= line <= end:
        return False
    return node is target or any(n is target for n in walk(node))


def compatible(a: list[Cond], b: list[Cond]) -> bool:
    """Whether both lists can hold at once (False: they test one subject against each
    other, `x == 1` with `x == 2`, `x == 1` with `x != 1`, `x` with `not x`, `x == 0`
    with `x`)."""
    return all(_agree(c, d) for c in a for d in b if c.subject == d.subject)


def _agree(c: Cond, d: Cond) -> bool:
    if c.value is TRUTHY and d.value is TRUTHY:
        return c.equal == d.equal
    if c.value is TRUTHY or d.value is TRUTHY:
        truth, other = (c, d) if c.value is TRUTHY else (d, c)
        return not other.equal or bool(other.value) == truth.equal
    if c.equal and d.equal:
        return bool(c.value == d.value)
    return c.equal == d.equal or c.value != d.value


def subjects_assigned(func: ast.AST, subjects: set[str]) -> bool:
    """Whether `func` assigns any of `subjects` (then its tests there may disagree)."""
    for node in walk(func):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            for n in walk(t):
                if isinstance(n, ast.Name | ast.Attribute) and dotted(n) in subjects:
                    return True
    return False
