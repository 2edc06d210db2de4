"""Settings of an object (`self.method`, `self.with_focal_loss`) and which of their
combinations the code allows.

Two tests on different settings are independent (the lead's policy): a user may set any
combination, so a method that returns a sigmoid under `if self.method == "binary":` gives
one to a loss called under `if self.with_focal_loss:`. A combination is ruled out only by
the code itself:

- a setting the class only ever assigns constants that fail the test
  (`self.squashed = False` and nothing else: `if self.squashed:` never runs), or
- an `if <combination>: raise ...` in the class, on the settings or on the parameters the
  method stores in them (`if focal and method != "binary": raise ValueError(...)` before
  `self.method = method`).

`self.training` is no setting: the mode goes with where the code runs (a training step).
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.path_guards import TRUTHY, Cond, compatible, conds_of
from torchdoctor.check.tree_walk import walk

MODE = "self.training"


def settable(cls: ast.ClassDef, conds: list[Cond]) -> bool:
    """Whether the class lets `conds` (tests on `self.<x>`) hold at once."""
    if any(c.subject == MODE for c in conds):
        return False
    if not all(_may_hold(cls, c) for c in conds):
        return False
    return not any(_implies(conds, forbidden) for forbidden in _forbidden(cls))


def describe(conds: list[Cond]) -> str:
    """`self.method == 'binary'`, `not self.flag`, joined with "and"."""
    parts = []
    for c in conds:
        if c.value is TRUTHY:
            parts.append(f"`{c.subject}`" if c.equal else f"`not {c.subject}`")
        else:
            parts.append(f"`{c.subject} {'==' if c.equal else '!='} {c.value!r}`")
    return " and ".join(parts)


def _may_hold(cls: ast.ClassDef, cond: Cond) -> bool:
    """Not when every assignment of the setting in the class is a constant that fails
    the test (`self.sigmoid = False`)."""
    attr = cond.subject.removeprefix("self.")
    values: list[ast.expr] = []
    for node in walk(cls):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr == attr:
                    values.append(node.value)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and (
            isinstance(node.target, ast.Attribute) and node.target.attr == attr
        ):
            return True
    if not values or not all(isinstance(v, ast.Constant) for v in values):
        return True  # set from outside (an argument, a config): any value
    return any(
        compatible([Cond(cond.subject, v.value, True)], [cond])
        for v in values
        if isinstance(v, ast.Constant)
    )


def _forbidden(cls: ast.ClassDef) -> list[list[Cond]]:
    """The combinations an `if <test>: raise` of a method of the class refuses, on
    `self.<x>` or on a parameter the method stores as `self.<x> = param`."""
    found: list[list[Cond]] = []
    for func in cls.body:
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        stored: dict[str, str] = {}  # parameter -> the setting it is stored in
        raises: list[ast.If] = []
        for node in walk(func):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.targets[0].value, ast.Name)
                and node.targets[0].value.id == "self"
                and isinstance(node.value, ast.Name)
            ):
                stored[node.value.id] = f"self.{node.targets[0].attr}"
            elif isinstance(node, ast.If) and node.body and isinstance(node.body[0], ast.Raise):
                raises.append(node)
        for node in raises:
            if not _understood(node.test):
                continue  # `if focal and check(x): raise`: refuses less than `focal`
            conds = [
                Cond(stored.get(c.subject, c.subject), c.value, c.equal)
                for c in conds_of(node.test, True)
            ]
            if conds and all(c.subject.startswith("self.") for c in conds):
                found.append(conds)
    return found


def _understood(test: ast.expr) -> bool:
    """A conjunction of tests `conds_of` reads whole (`a and not b and x == "c"`)."""
    if isinstance(test, ast.BoolOp):
        return isinstance(test.op, ast.And) and all(_understood(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return isinstance(test.operand, ast.Name | ast.Attribute | ast.Compare) and (
            _understood(test.operand)
        )
    return bool(conds_of(test, True))


def _implies(conds: list[Cond], forbidden: list[Cond]) -> bool:
    """Whether `conds` holding makes every test of `forbidden` hold."""
    return all(any(_implies_one(c, f) for c in conds) for f in forbidden)


def _implies_one(c: Cond, f: Cond) -> bool:
    if c.subject != f.subject:
        return False
    if c.value is TRUTHY or f.value is TRUTHY:
        if c.value is TRUTHY and f.value is TRUTHY:
            return c.equal == f.equal
        if f.value is TRUTHY and c.equal and c.value is not TRUTHY:
            return bool(c.value) == f.equal  # `x == "a"` makes `x` truthy
        return False
    if c.equal:
        return (c.value == f.value) == f.equal  # `x == a`: `x == a` holds, `x != b` holds
    return not f.equal and c.value == f.value  # `x != a` makes only `x != a` hold
