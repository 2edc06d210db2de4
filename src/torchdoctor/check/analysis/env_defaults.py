"""The path where the environment leaves a variable unset: the program's default run.

`trace_level = int(os.getenv("TRACE_LEVEL", "0"))` gives `trace_level == 0` whenever the
user sets no `TRACE_LEVEL`, so `if trace_level > 0: batch = batch.to(device)` leaves the
batch on the CPU in a plain run. Like a parameter the caller leaves out
(default_path.py), the test is decided there, and what its default branch leaves on the
CPU stays a fact (`Value.default_of` = "$TRACE_LEVEL", for the messages).

What counts: a read of a variable named by a string constant (`os.getenv("K", d)`,
`os.environ.get("K", d)` with a constant or no default, optionally converted by
`int`/`float`/`str`/`bool`; `"K" in os.environ`), inline in a test or in a local name.
A local name's value at a test is known when each of its bindings before the test is a
plain assignment of a constant or such a read, outside loops and `try`, each under `if`s
the default run decides (`n = 0` then `if os.getenv("N") is not None: n = int(...)`:
still 0). Only a test such values decide (`level > 0`, `not debug`, `mode == "sync"`,
and/or of such) is decided; anything else is not.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchdoctor.check.analysis.values import ScopeNode
from torchdoctor.check.tree_walk import child_statements, walk

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# What a scope's text must hold to read the environment (the gate: others pay nothing).
ENV_WORDS = ("getenv", "environ")


def reads_environment(ctx: FileContext) -> bool:
    """Whether the file's text may read the environment (asked once per file)."""
    return any(ctx.holds(w) for w in ENV_WORDS)


_READS = frozenset({"os.getenv", "os.environ.get"})
_CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_LOOPS_AND_TRIES = (ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith)
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

# A value where the environment is unset: ("VARIABLE" or "" for a plain constant, value).
Known = tuple[str, object]
_UNKNOWN = None


class EnvDefaults:
    """The tests of one scope that the default run decides (built on request)."""

    def __init__(self, scope: ScopeNode, qualname: Callable[[ast.AST], str | None]) -> None:
        self._qualname = qualname
        self._scope = scope
        self._bindings: dict[str, list[ast.stmt]] = {}  # name -> nodes binding it
        self._parents: dict[ast.stmt, ast.AST] = {}
        self._nested: set[str] = set()  # names a nested def or class binds too
        todo: list[tuple[ast.AST, list[ast.stmt]]] = [(scope, scope.body)]
        while todo:  # the scope's statements, not those of nested defs and classes
            parent, body = todo.pop()
            for stmt in body:
                self._parents[stmt] = parent
                if isinstance(stmt, _NESTED):
                    self._nested.update(
                        n.id
                        for n in walk(stmt)
                        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
                    )
                    continue
                todo.append((stmt, child_statements(stmt)))
        for stmt in self._parents:
            if isinstance(stmt, _NESTED):
                self._bind(stmt.name, stmt)
                continue
            if isinstance(stmt, ast.Global | ast.Nonlocal):
                for name in stmt.names:
                    self._bind(name, stmt)
                continue
            for part in _own_nodes(stmt):
                if isinstance(part, ast.Name) and not isinstance(part.ctx, ast.Load):
                    self._bind(part.id, stmt)

        for stmts in self._bindings.values():
            stmts.sort(key=lambda s: (s.lineno, s.col_offset))

    def _bind(self, name: str, stmt: ast.stmt) -> None:
        found = self._bindings.setdefault(name, [])
        if stmt not in found:
            found.append(stmt)

    def when_unset(self, test: ast.expr) -> tuple[str, bool] | None:
        """("$VARIABLE", the test's truth) in the default run, if that decides `test`."""
        found = self._truth(test)
        if found is _UNKNOWN or not found[0]:
            return None
        return f"${found[0]}", bool(found[1])

    # -- evaluation at the default run ---------------------------------------------------
    def _truth(self, test: ast.expr) -> Known | None:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._truth(test.operand)
            return _UNKNOWN if inner is _UNKNOWN else (inner[0], not inner[1])
        if isinstance(test, ast.BoolOp):
            # `a and b` is false when one part is; `a or b` true when one part is
            deciding = isinstance(test.op, ast.Or)
            for part in test.values:
                found = self._truth(part)
                if found is not _UNKNOWN and bool(found[1]) is deciding:
                    return found
            return _UNKNOWN
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            return self._compare(test)
        found = self._value(test)
        return _UNKNOWN if found is _UNKNOWN else (found[0], bool(found[1]))

    def _compare(self, test: ast.Compare) -> Known | None:
        op, right = test.ops[0], test.comparators[0]
        if isinstance(op, ast.In | ast.NotIn):
            # `"K" in os.environ`: not in the default run
            if (
                isinstance(test.left, ast.Constant)
                and isinstance(test.left.value, str)
                and self._qualname(right) == "os.environ"
            ):
                return test.left.value, isinstance(op, ast.NotIn)
            return _UNKNOWN
        compare = _COMPARE.get(type(op))
        left_value, right_value = self._value(test.left), self._value(right)
        if compare is None or left_value is _UNKNOWN or right_value is _UNKNOWN:
            return _UNKNOWN
        variable = left_value[0] or right_value[0]
        try:
            return variable, bool(compare(left_value[1], right_value[1]))
        except TypeError:  # `None > 0`: the default run raises there
            return _UNKNOWN

    def _value(self, node: ast.expr) -> Known | None:
        if isinstance(node, ast.Constant):
            return "", node.value
        if isinstance(node, ast.Name):
            return self._name_value(node)
        return self._read(node)

    def _read(self, expr: ast.expr) -> Known | None:
        """An environment read, and what it gives where the variable is unset."""
        convert: Callable[[Any], Any] | None = None
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
            return _UNKNOWN
        key = expr.args[0]
        if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
            return _UNKNOWN
        default = expr.args[1] if len(expr.args) == 2 else ast.Constant(None)
        if not isinstance(default, ast.Constant) or self._qualname(expr.func) not in _READS:
            return _UNKNOWN
        value: object = default.value
        if convert is not None:
            try:
                value = convert(value)
            except (TypeError, ValueError):
                return _UNKNOWN  # the default run raises there: no path to speak of
        return key.value, value

    def _name_value(self, use: ast.Name) -> Known | None:
        """The value of a local name at `use` in the default run: the last of its
        bindings before `use` that the default run executes."""
        name = use.id
        if name in self._nested:
            return _UNKNOWN
        variable = ""  # the variable an `if` around a skipped or run binding reads
        found: Known | None = _UNKNOWN
        for stmt in self._bindings.get(name, ()):
            if stmt.lineno >= use.lineno:
                return _UNKNOWN  # bound after (a loop may run it first): not decided
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                return _UNKNOWN
            if not isinstance(stmt.targets[0], ast.Name):
                return _UNKNOWN
            runs = self._runs(stmt, use)
            if runs is _UNKNOWN:
                return _UNKNOWN
            variable = variable or runs[0]
            if not runs[1]:
                continue
            found = self._value(stmt.value)
            if found is _UNKNOWN:
                return _UNKNOWN
        if found is _UNKNOWN:
            return _UNKNOWN  # never bound here on that path: a parameter, a global
        return found[0] or variable, found[1]

    def _runs(self, stmt: ast.stmt, use: ast.AST) -> Known | None:
        """Whether the default run executes `stmt` when it reaches `use` (the `if`s
        around `stmt` that are not around `use` decide it; a loop or `try` does not)."""
        around_use = self._ancestors(use)
        variable = ""
        child: ast.AST = stmt
        parent = self._parents.get(stmt)
        while parent is not None and parent not in around_use:
            if isinstance(parent, _LOOPS_AND_TRIES) or not isinstance(parent, ast.If):
                return _UNKNOWN
            decided = self._truth(parent.test)
            if decided is _UNKNOWN:
                return _UNKNOWN
            variable = variable or decided[0]
            if bool(decided[1]) != (child in parent.body):
                return variable, False
            child, parent = parent, self._parents.get(parent)  # type: ignore[arg-type]
        if parent is None or parent is self._scope:
            return variable, True
        # around both: the same block of it, or `if` branches that exclude each other
        block = _block_of(parent, child)
        line = use.lineno  # type: ignore[attr-defined]
        if block and block[0].lineno <= line <= (block[-1].end_lineno or block[-1].lineno):
            return variable, True
        return (variable, False) if isinstance(parent, ast.If) else _UNKNOWN

    def _ancestors(self, node: ast.AST) -> set[ast.AST]:
        """The compound statements around `node` (those spanning its line), and the scope."""
        line = node.lineno  # type: ignore[attr-defined]
        found: set[ast.AST] = {self._scope}
        for stmt in self._parents:
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno) and child_statements(stmt):
                found.add(stmt)
        return found


def _block_of(parent: ast.AST, child: ast.AST) -> list[ast.stmt]:
    """The statement list of `parent` that holds `child`."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and child in block:
            return block
    for holder in (*getattr(parent, "handlers", ()), *getattr(parent, "cases", ())):
        if child in holder.body:
            return list(holder.body)
    return []


def _own_nodes(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of `stmt` itself, not of the statements nested in it."""
    nested = set(child_statements(stmt))
    found: list[ast.AST] = []
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            if child not in nested:
                todo.append(child)
    return found
