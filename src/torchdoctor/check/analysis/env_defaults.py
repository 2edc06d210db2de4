"""The path where the environment leaves a variable unset: the program's default run.

`trace_level = int(os.getenv("TRACE_LEVEL", "0"))` gives `trace_level == 0` whenever the
user sets no `TRACE_LEVEL`, so `if trace_level > 0: batch = batch.to(device)` leaves the
batch on the CPU in a plain run. Like a parameter the caller leaves out
(default_path.py), the test is decided there, and what its default branch leaves on the
CPU stays a fact (`Value.default_of` = "$TRACE_LEVEL", for the messages).

Only a local name the scope binds once, from one read of a variable named by a string
constant with a constant default (`os.getenv`, `os.environ.get`, optionally converted by
`int`/`float`/`str`/`bool`), counts; and only a test that this value decides
(`level > 0`, `not debug`, `mode == "sync"`, and/or of such). Anything else: undecided.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

from torchdoctor.check.analysis.values import ScopeNode
from torchdoctor.check.tree_walk import walk

# What a function's text must hold to read the environment (the gate: others pay nothing).
ENV_WORDS = ("getenv", "environ")

_READS = frozenset({"os.getenv", "os.environ.get"})
_CONVERSIONS: dict[str, Callable[[object], object]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
}
_COMPARE: dict[type[ast.cmpop], Callable[[object, object], object]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_UNDECIDED = object()


def env_defaults(
    scope: ScopeNode, qualname: Callable[[ast.AST], str | None]
) -> dict[str, tuple[str, int, object]]:
    """Local name -> (variable, line bound, value where the variable is unset), for the
    names `scope` binds exactly once, by an environment read with a constant default."""
    reads: dict[str, tuple[str, int, object]] = {}
    bindings: dict[str, int] = {}
    for node in walk(scope):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bindings[node.id] = bindings.get(node.id, 0) + 1
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for name in node.names:
                bindings[name] = bindings.get(name, 0) + 2  # bound elsewhere too
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            found = _unset_value(node.value, qualname)
            if found is not None:
                reads[node.targets[0].id] = (found[0], node.lineno, found[1])
    return {name: read for name, read in reads.items() if bindings.get(name) == 1}


def _unset_value(
    expr: ast.expr, qualname: Callable[[ast.AST], str | None]
) -> tuple[str, object] | None:
    """(variable, value) of `expr` where the variable is unset; None: not such a read."""
    convert: Callable[[object], object] | None = None
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id in _CONVERSIONS
        and len(expr.args) == 1
        and not expr.keywords
    ):
        convert = _CONVERSIONS[expr.func.id]
        expr = expr.args[0]
    if not isinstance(expr, ast.Call) or expr.keywords or not 1 <= len(expr.args) <= 2:
        return None
    if qualname(expr.func) not in _READS:
        return None
    key = expr.args[0]
    if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
        return None
    default = expr.args[1] if len(expr.args) == 2 else ast.Constant(None)
    if not isinstance(default, ast.Constant):
        return None
    value: object = default.value
    if convert is not None:
        try:
            value = convert(value)
        except (TypeError, ValueError):
            return None  # the default run raises there: no path to speak of
    return key.value, value


def when_unset(
    test: ast.expr, defaults: dict[str, tuple[str, int, object]]
) -> tuple[str, bool] | None:
    """("$VARIABLE", the test's truth) when the environment leaves a variable unset, if
    that decides `test` (evaluated after the read)."""
    found = _decide(test, defaults)
    if found is _UNDECIDED:
        return None
    variable, truth = found  # type: ignore[misc]
    return f"${variable}", bool(truth)


def _decide(test: ast.expr, defaults: dict[str, tuple[str, int, object]]) -> object:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _decide(test.operand, defaults)
        return inner if inner is _UNDECIDED else (inner[0], not inner[1])  # type: ignore[index]
    if isinstance(test, ast.BoolOp):
        # `a and b` is false when one part is; `a or b` true when one part is
        deciding = isinstance(test.op, ast.Or)
        for part in test.values:
            found = _decide(part, defaults)
            if found is not _UNDECIDED and bool(found[1]) is deciding:  # type: ignore[index]
                return found
        return _UNDECIDED
    if isinstance(test, ast.Name):
        read = _read_before(test, defaults)
        return _UNDECIDED if read is None else (read[0], bool(read[2]))
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return _UNDECIDED
    left, right = test.left, test.comparators[0]
    compare = _COMPARE.get(type(test.ops[0]))
    if compare is None:
        return _UNDECIDED
    try:
        if isinstance(left, ast.Name) and isinstance(right, ast.Constant):
            read = _read_before(left, defaults)
            if read is not None:
                return read[0], bool(compare(read[2], right.value))
        if isinstance(right, ast.Name) and isinstance(left, ast.Constant):
            read = _read_before(right, defaults)
            if read is not None:
                return read[0], bool(compare(left.value, read[2]))
    except TypeError:  # `None > 0`: the default run raises there
        pass
    return _UNDECIDED


def _read_before(
    name: ast.Name, defaults: dict[str, tuple[str, int, object]]
) -> tuple[str, int, object] | None:
    read = defaults.get(name.id)
    return read if read is not None and read[1] < name.lineno else None
