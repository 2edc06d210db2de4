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
from torchdoctor.check.tree_walk import block_of, child_statements, walk_lines

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# What a scope's text must hold to read the environment (the gate: others pay nothing).
ENV_WORDS = ("getenv", "environ")


def environment_lines(ctx: FileContext) -> list[int]:
    """The lines of the file that name the environment (asked once per file)."""
    return ctx.lines_holding(ENV_WORDS) if any(ctx.holds(w) for w in ENV_WORDS) else []


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

    def __init__(
        self,
        scope: ScopeNode,
        qualname: Callable[[ast.AST], str | None],
        lines_holding: Callable[[tuple[str, ...]], list[int]],
        env_lines: list[int],
    ) -> None:
        self._qualname = qualname
        self._lines_holding = lines_holding  # the file's lines holding a text
        self._scope = scope
        self._env_lines = env_lines  # the scope's lines that name the environment
        self._env_names: set[str] | None = None
        self._parents: dict[ast.stmt, ast.AST] | None = None
        self._bindings: dict[str, list[ast.stmt] | None] = {}  # None: not known

    def _assigned_on_env_lines(self) -> set[str]:
        """Names assigned on a line that names the environment or under an `if` testing
        it: the only ones a test may be decided by (the rest pay nothing)."""
        if self._env_names is None:
            names: set[str] = set()
            for node in walk_lines(self._scope, self._env_lines):
                # `n = int(os.getenv(...))`, and `if "N" in os.environ: n = 1`
                block = [*node.body, *node.orelse] if isinstance(node, ast.If) else [node]
                names.update(
                    target.id
                    for stmt in block
                    if isinstance(stmt, ast.Assign)
                    for target in stmt.targets
                    if isinstance(target, ast.Name)
                )
            self._env_names = names
        return self._env_names

    def _statements(self) -> dict[ast.stmt, ast.AST]:
        """Each statement of the scope (not of nested defs and classes) -> its parent."""
        if self._parents is None:
            self._parents = {}
            todo: list[tuple[ast.AST, list[ast.stmt]]] = [(self._scope, self._scope.body)]
            while todo:
                parent, body = todo.pop()
                for stmt in body:
                    self._parents[stmt] = parent
                    if not isinstance(stmt, _NESTED):
                        todo.append((stmt, child_statements(stmt)))
        return self._parents

    def _lines_naming(self, name: str) -> list[int]:
        lines = self._lines_holding((name,))
        if isinstance(self._scope, ast.Module):
            return lines
        end = self._scope.end_lineno or self._scope.lineno
        return [n for n in lines if self._scope.lineno <= n <= end]

    def _innermost(self, line: int) -> ast.stmt | None:
        """The innermost statement of the scope (a nested def or class as a whole)
        spanning `line`."""
        found: ast.stmt | None = None
        for stmt in self._statements():
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno) and (
                found is None or stmt.lineno >= found.lineno
            ):
                found = stmt
        return found

    def _bindings_of(self, name: str) -> list[ast.stmt] | None:
        """The statements binding `name` in source order; None where a nested def or
        class binds it too (it may run between them)."""
        if name in self._bindings:
            return self._bindings[name]
        binding: list[ast.stmt] = []
        found: list[ast.stmt] | None = binding
        statements = self._statements()
        for node in walk_lines(self._scope, self._lines_naming(name)):
            if isinstance(node, (*_NESTED, ast.Global, ast.Nonlocal)):
                named = [node.name] if isinstance(node, _NESTED) else node.names
                if name in named and node in statements:
                    binding.append(node)
                continue
            if not _binds(node, name):
                continue
            stmt = self._innermost(node.lineno)  # type: ignore[attr-defined]
            if stmt is None or isinstance(stmt, _NESTED):
                found = None  # bound inside a nested def or class: may run in between
                break
            if stmt not in binding:
                binding.append(stmt)
        binding.sort(key=lambda s: (s.lineno, s.col_offset))
        self._bindings[name] = found
        return found

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
        if use.id not in self._assigned_on_env_lines():
            return _UNKNOWN
        bindings = self._bindings_of(use.id)
        if bindings is None:
            return _UNKNOWN
        variable = ""  # the variable an `if` around a skipped or run binding reads
        found: Known | None = _UNKNOWN
        for stmt in bindings:
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
        parents = self._statements()
        parent = parents.get(stmt)
        while parent is not None and parent not in around_use:
            if isinstance(parent, _LOOPS_AND_TRIES) or not isinstance(parent, ast.If):
                return _UNKNOWN
            decided = self._truth(parent.test)
            if decided is _UNKNOWN:
                return _UNKNOWN
            variable = variable or decided[0]
            if bool(decided[1]) != (child in parent.body):
                return variable, False
            child, parent = parent, parents.get(parent)  # type: ignore[call-overload]
        if parent is None or parent is self._scope:
            return variable, True
        # around both: the same block of it, or `if` branches that exclude each other
        block = block_of(parent, child)
        line = use.lineno  # type: ignore[attr-defined]
        if block and block[0].lineno <= line <= (block[-1].end_lineno or block[-1].lineno):
            return variable, True
        return (variable, False) if isinstance(parent, ast.If) else _UNKNOWN

    def _ancestors(self, node: ast.AST) -> set[ast.AST]:
        """The compound statements around `node` (those spanning its line), and the scope."""
        line = node.lineno  # type: ignore[attr-defined]
        found: set[ast.AST] = {self._scope}
        for stmt in self._statements():
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno) and child_statements(stmt):
                found.add(stmt)
        return found


def _binds(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load)
