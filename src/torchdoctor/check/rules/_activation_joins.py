"""Activation outputs through `log`/`exp` and `torch.cat` joins (TD301, TD302, TD304).

Not a rule. The steps of the activation walk (`_activations.activation`) that combine
values: each follows its operands with the walk it is given (`follow`), so this module
needs nothing from the walk's own.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from torchdoctor.check.analysis.file_loops import FileLoops
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.rules._activation_facts import (
    _EMPTY_FACTORIES,
    LOG_SOFTMAX,
    SOFTMAX,
    _binds,
    _is_empty,
    _short,
)

# the walk: (file, function, expression, depth, walk state) -> (kind, proof) or None
Follow = Callable[[FileLoops, FunctionInfo, ast.expr, int, Any], tuple[str, str] | None]


def log_or_exp(
    follow: Follow,
    fl: FileLoops,
    fi: FunctionInfo,
    expr: ast.Call,
    inner_expr: ast.expr,
    is_log: bool,
    depth: int,
    walk_: Any,
) -> tuple[str, str] | None:
    """log of probabilities is log-probabilities; exp of log-probabilities is probabilities."""
    inner = follow(fl, fi, inner_expr, depth + 1, walk_)
    want, gives = (SOFTMAX, LOG_SOFTMAX) if is_log else (LOG_SOFTMAX, SOFTMAX)
    if inner is None or inner[0] != want:
        return None
    return gives, f"`{_short(fl.ctx, expr)}` (line {expr.lineno}) of {inner[1]}"


def joined(
    follow: Follow, fl: FileLoops, fi: FunctionInfo, expr: ast.Call, depth: int, walk_: Any
) -> tuple[str, str] | None:
    """`torch.cat([p1, p2])` of outputs of one activation: `acc = torch.cat((acc, p))` in a
    loop counts when every value `acc` is given is empty or such a join."""
    seq = expr.args[0]
    if not isinstance(seq, ast.Tuple | ast.List) or not seq.elts:
        return None
    kinds: set[str] = set()
    proof = ""
    for elt in seq.elts:
        if isinstance(elt, ast.Name) and _accumulator(follow, fl, fi, elt.id, depth, walk_):
            continue
        found = follow(fl, fi, elt, depth + 1, walk_)
        if found is None:
            return None
        kinds.add(found[0])
        proof = proof or found[1]
    if len(kinds) != 1:
        return None
    return kinds.pop(), f"`{_short(fl.ctx, expr)}` (line {expr.lineno}) of {proof}"


def _accumulator(
    follow: Follow, fl: FileLoops, fi: FunctionInfo, name: str, depth: int, walk_: Any
) -> bool:
    """Every value `name` is given in `fi` is an empty tensor or a `torch.cat` holding
    `name` itself whose other items are one activation's outputs."""
    values = []
    for stmt in fi.own_statements():
        if isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For) and _binds(stmt, name):
            return False
        if isinstance(stmt, ast.Assign) and _binds(stmt, name):
            if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                return False
            values.append(stmt.value)
    if not values or name in fi.params():
        return False
    joins = 0
    for value in values:
        if not isinstance(value, ast.Call):
            return False
        qual = fl.ctx.qualname(value.func) or ""
        if qual in _EMPTY_FACTORIES and _is_empty(value):
            continue
        if qual not in ("torch.cat", "torch.stack", "torch.concat") or not value.args:
            return False
        seq = value.args[0]
        if not isinstance(seq, ast.Tuple | ast.List):
            return False
        others = [e for e in seq.elts if not (isinstance(e, ast.Name) and e.id == name)]
        if len(others) == len(seq.elts) or not others:
            return False
        if any(follow(fl, fi, e, depth + 1, walk_) is None for e in others):
            return False
        joins += 1
    return joins > 0
