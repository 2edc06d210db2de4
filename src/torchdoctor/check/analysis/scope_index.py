"""Each scope's own nodes: what a module or function holds outside the functions and
classes defined inside it, built in one pass per file and shared by the rules that
look at calls or assignments scope by scope (TD216, TD406, TD503, and the pickling
`Finder`); and the calls, with their scopes, of just the lines that hold a word
(`calls_on_lines`: TD113, TD405), which leaves the rest of the tree unvisited.
"""

from __future__ import annotations

import ast

from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import child_fields, iter_children, spans_a_line, walk

_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def own_nodes(ctx: FileContext, scope: ast.AST) -> list[ast.AST]:
    """The nodes of `scope`, not those of the functions and classes defined inside it
    (operators and contexts such as `Load` left out: no caller looks for them)."""
    return ctx.shared("scope_index.scopes", _every_scope)[id(scope)]


def _every_scope(ctx: FileContext) -> dict[int, list[ast.AST]]:
    """id(scope) -> its own nodes, for every scope of the file: each scope's own walk,
    every node of the file visited once."""
    found: dict[int, list[ast.AST]] = {}
    todo: list[ast.AST] = [ctx.tree]
    while todo:
        scope = todo.pop()
        nodes = found[id(scope)] = _own_walk(scope)
        todo.extend(node for node in nodes if isinstance(node, _SCOPES))
    return found


def scope_nodes(ctx: FileContext, scope: ast.AST) -> list[ast.AST]:
    """`own_nodes(ctx, scope)`, for a caller that asks of few scopes: from the index if
    a rule has built it, else the scope's own walk (not a walk of the whole file)."""
    index = ctx.built("scope_index.scopes")
    return index[id(scope)] if isinstance(index, dict) else _own_walk(scope)


def _own_walk(scope: ast.AST) -> list[ast.AST]:
    """The nodes of `scope` itself (a nested function or class is one of them, its
    insides are not), depth first."""
    table = child_fields(want_operators=False)
    found: list[ast.AST] = []
    todo = iter_children(scope, operators=False)
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, _SCOPES):
            continue  # a nested scope's nodes are its own
        # `iter_children(node, operators=False)` inlined: a call per node costs a third more
        fields = table.get(node.__class__)
        if fields is None:
            todo.extend(iter_children(node, operators=False))
            continue
        for name in fields:
            value = getattr(node, name, None)
            if value.__class__ is list:
                todo.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                todo.append(value)
    return found


def own_calls(ctx: FileContext, scope: ast.AST) -> list[ast.Call]:
    """The calls of `scope` itself (see `own_nodes`)."""
    return [n for n in own_nodes(ctx, scope) if isinstance(n, ast.Call)]


def calls_on_lines(
    ctx: FileContext, lines: list[int], *, spanning: bool = False
) -> list[tuple[ast.AST, ast.Call]]:
    """(scope, call) for each call of the statements that span one of `lines`
    (ascending), its scope the module or the function it is written in (calls of a
    class body itself are left out); module scope first, then functions in source
    order. For a rule whose calls hold a word (`lines = ctx.lines_holding(words)`):
    the rest of the tree is never visited. With `spanning`, only the calls that span
    one of `lines` themselves (a call whose name holds the word does): the rest of a
    long statement, a table of thousands of lines, is not entered either."""
    found: list[tuple[ast.AST, ast.Call]] = []
    _calls_of(ctx.tree, ctx.tree, lines, found, spanning)
    rank = {id(ctx.tree): (0, 0)}
    for scope, _ in found:
        if scope is not ctx.tree:
            rank[id(scope)] = (scope.lineno, scope.col_offset)  # type: ignore[attr-defined]
    found.sort(key=lambda item: (rank[id(item[0])], item[1].lineno, item[1].col_offset))
    return found


def calls_in(node: ast.AST, lines: list[int]) -> list[ast.Call]:
    """`calls_on_lines(ctx, lines, spanning=True)`'s calls that lie in the function
    `node` (its decorators and defaults included; those of a class body defined in it
    left out), found without walking the rest of the file: for a question about one
    function, asked of few."""
    found: list[tuple[ast.AST, ast.Call]] = []
    _calls_of(node, node, lines, found, True)
    return [call for _, call in found]


def _calls_of(
    node: ast.AST,
    scope: ast.AST | None,
    lines: list[int],
    out: list[tuple[ast.AST, ast.Call]],
    spanning: bool,
) -> None:
    """The calls under `node` on `lines`, each with its module or function scope (None:
    a class body, whose own calls are left out)."""
    for _, value in ast.iter_fields(node):
        parts = value if value.__class__ is list else [value]
        for part in parts:
            if isinstance(part, ast.stmt):
                if not spans_a_line(part, lines):
                    continue
                if isinstance(part, ast.FunctionDef | ast.AsyncFunctionDef):
                    _calls_of(part, part, lines, out, spanning)  # its decorators and defaults too
                elif isinstance(part, ast.ClassDef):
                    _calls_of(part, None, lines, out, spanning)
                else:
                    _calls_of(part, scope, lines, out, spanning)
            elif isinstance(part, ast.excepthandler | ast.match_case):
                _calls_of(part, scope, lines, out, spanning)
            elif isinstance(part, ast.AST) and scope is not None:
                nodes = nodes_spanning(part, lines) if spanning else walk(part)
                out.extend((scope, n) for n in nodes if isinstance(n, ast.Call))


def nodes_spanning(node: ast.AST, lines: list[int]) -> list[ast.AST]:
    """The nodes under `node` (itself included) whose text spans one of `lines`
    (ascending), and those without a position (keywords' parents decide); a subtree
    that spans none of `lines` is not entered."""
    found: list[ast.AST] = []
    todo = [node]
    while todo:
        part = todo.pop()
        if hasattr(part, "lineno") and not spans_a_line(part, lines):  # type: ignore[arg-type]
            continue
        found.append(part)
        todo.extend(iter_children(part))
    return found


def assignments(ctx: FileContext, scope: ast.AST) -> dict[str, list[ast.Assign | ast.AnnAssign]]:
    """Plain `name = value` (and `name: T = value`) statements of `scope`, by name; and
    `self.attr = value` ones by `self.attr` (once per scope and file)."""
    cache: dict[int, dict[str, list[ast.Assign | ast.AnnAssign]]] = ctx.shared(
        "scope_index.assignments", lambda _: {}
    )
    found = cache.get(id(scope))
    if found is None:
        found = cache[id(scope)] = {}
        for node in scope_nodes(ctx, scope):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node)
                elif (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    found.setdefault(f"self.{target.attr}", []).append(node)
    return found


def binding(ctx: FileContext, scope: ast.AST, name: str, before: int) -> ast.expr | None:
    """The value of the latest plain `name = value` before line `before` in `scope`
    (`name` may be `self.attr`)."""
    latest: ast.expr | None = None
    latest_line = -1
    for node in assignments(ctx, scope).get(name, ()):
        if latest_line < node.lineno < before and node.value is not None:
            latest, latest_line = node.value, node.lineno
    return latest
