"""Module-level names bound to a wrapped function of the file (`f = cache(g)`).

`_load_cached = cachetools.cached(LRUCache(2))(_load)` or `fast = functools.lru_cache(f)`:
a call of the name runs the function (or hands back what an earlier call of it returned).
Which wrappers do that is library data (`library.toml` [wrappers]); anything else bound
at module level stays an unknown callable.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.torch_api import LIBRARY
from torchdoctor.check.analysis.values import UNKNOWN, AnyFunction, Kind, Value
from torchdoctor.check.context import FileContext
from torchdoctor.check.lines import as_lf, line_start

if TYPE_CHECKING:
    from torchdoctor.check.analysis.interfaces import FileFacts

_DIRECT = frozenset(LIBRARY["wrappers"]["direct"])
_FACTORY = frozenset(LIBRARY["wrappers"]["factory"])
_CACHED = frozenset(LIBRARY["wrappers"]["cached"])
# the text gate: a module-level line `name = ...W(` of a wrapper's last name (first the
# calls `W(` it needs, from the file's words; then `mentions_wrapper`)
_CALLS = tuple(f"{n}(" for n in sorted({n.rsplit(".", 1)[-1] for n in _DIRECT | _FACTORY}))
_MENTION = re.compile(
    r"^\w+\s*=\s*[\w.]*\b(?:" + "|".join(c[:-1] for c in _CALLS) + r")\(",
    re.MULTILINE,
)
# `_MENTION` read backwards from the `W(` it ends with: a pattern tried at every line
# start of a long text costs more than one match where each `W(` occurs
_MENTION_REVERSED = re.compile(
    r"\((?:" + "|".join(c[-2::-1] for c in _CALLS) + r")\b[\w.]*\s*=\s*\w+$",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class Wrapped:
    """`name = W(...)(function)`: the wrapped function's name, and whether `W` caches
    (its result is an object an earlier call returned)."""

    function: str
    cached: bool
    line: int  # the lines of the statement binding the name
    end: int


def wrapped_functions(ctx: FileContext) -> dict[str, Wrapped]:
    """The module-level names of the file bound once to a known wrapper of one of its
    top-level functions (built once per file)."""
    return ctx.shared("wrapped_functions", _find)


def mentions_wrapper(text: str) -> bool:
    """Whether `_MENTION` matches in `text`: each match ends with a `W(` of `_CALLS`, where
    the reversed pattern matches in the reversed text (`$` there is `^` here)."""
    backwards: str | None = None
    for call in _CALLS:
        at = text.find(call)
        while at >= 0:
            if backwards is None:
                backwards = text[::-1]
            if _MENTION_REVERSED.match(backwards, len(text) - at - len(call)):
                return True
            at = text.find(call, at + 1)
    return False


def _find(ctx: FileContext) -> dict[str, Wrapped]:
    # cheap first: a module-level `name = W(f)` `_wrapped` accepts (most files have none;
    # the text gate below scans the whole text for each `W(`)
    if not any(_wrapping(ctx, stmt) for stmt in ctx.tree.body):
        return {}
    return _find_wrapped(ctx)


def _wrapping(ctx: FileContext, stmt: ast.stmt) -> bool:
    """Whether `stmt` is one `_find_wrapped` may keep: `name = W(f)` of a known W."""
    return (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and _wrapped(ctx, stmt.value, 0, 0) is not None
    )


def _find_wrapped(ctx: FileContext) -> dict[str, Wrapped]:
    if not any(ctx.holds(call) for call in _CALLS) or not mentions_wrapper(as_lf(ctx.source)):
        return {}
    defined = {
        s.name for s in ctx.tree.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    found: dict[str, Wrapped] = {}
    bound: dict[str, int] = {}  # how often module level binds each name
    for stmt in ctx.tree.body:
        for name in _bound_names(stmt):
            bound[name] = bound.get(name, 0) + 1
        if not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            continue
        wrapped = _wrapped(ctx, stmt.value, stmt.lineno, stmt.end_lineno or stmt.lineno)
        if wrapped is not None and wrapped.function in defined:
            found[stmt.targets[0].id] = wrapped
    # a name bound again (or made `global` in a function) may hold something else
    return {
        name: w
        for name, w in found.items()
        if bound.get(name) == 1
        and name not in defined
        and not re.search(rf"\bglobal\b[^\n\r]*\b{re.escape(name)}\b", ctx.source)
    }


def _wrapped(ctx: FileContext, value: ast.expr, line: int, end: int) -> Wrapped | None:
    """`W(f, key=...)` or `W(...)(f)` of a known wrapper W."""
    if not isinstance(value, ast.Call) or not value.args:
        return None
    first = value.args[0]
    if isinstance(first, ast.Name):  # `W(f, ...)`
        qual = ctx.qualname(value.func) or ""
        if qual in _DIRECT and len(value.args) == 1:
            return Wrapped(first.id, qual in _CACHED, line, end)
    inner = value.func
    if isinstance(inner, ast.Call) and isinstance(first, ast.Name) and len(value.args) == 1:
        qual = ctx.qualname(inner.func) or ""  # `W(...)(f)`
        if qual in _FACTORY and not value.keywords:
            return Wrapped(first.id, qual in _CACHED, line, end)
    return None


def aliases(ctx: FileContext, function: str) -> list[str]:
    """The names bound to a wrapped `function` of the file."""
    return [name for name, w in wrapped_functions(ctx).items() if w.function == function]


def call_lines(ctx: FileContext, function: str) -> list[int] | None:
    """The lines calling the wrapped `function` by its own name; None when it is also
    used as a value elsewhere than in its wrapping (or named in prose): not every call
    of it is seen. Its `def` line and the lines wrapping it are not uses."""
    wrapping = {
        line
        for w in wrapped_functions(ctx).values()
        if w.function == function
        for line in range(w.line, w.end + 1)
    }
    lines: list[int] = []
    for m in re.finditer(rf"(?<![\w.]){re.escape(function)}\b", ctx.source):
        line = ctx.line_of_offset(m.start())
        head = ctx.source[line_start(ctx.source, m.start()) : m.start()]
        if line in wrapping or head.lstrip().startswith(("def ", "async def ")):
            continue
        if not re.match(r"\s*\(", ctx.source[m.end() : m.end() + 8]):
            return None
        lines.append(line)
    return lines


def _bound_names(stmt: ast.stmt) -> list[str]:
    """Names a module-level statement binds (defs, imports, assignments; nested
    statements of `if`/`try` blocks too)."""
    names: list[str] = []
    todo = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
            continue  # its body binds its own names
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.extend((a.asname or a.name).split(".", 1)[0] for a in node.names)
            continue
        for part in ast.iter_child_nodes(node):
            if isinstance(part, ast.stmt):
                todo.append(part)
            else:
                names.extend(
                    n.id
                    for n in ast.walk(part)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                )
    return names


def through_cache(facts: FileFacts, called: str, target: AnyFunction) -> bool:
    """Whether the name `called` runs `target` through a cache."""
    return called != target.name and any(
        facts.toplevel_functions.get(name) is target for name in facts.cached_results
    )


def shared_result(value: Value) -> Value:
    """What a cached call's result is known to be: an object an earlier call returned,
    which its caller may have moved or changed in place since; a tensor's place stays."""
    return value if value.kind in _UNCHANGED_KINDS else UNKNOWN


# results whose facts no holder can change in place
_UNCHANGED_KINDS = frozenset({Kind.TENSOR, Kind.PARAMETER, Kind.ARRAY, Kind.DEVICE, Kind.NONE})
