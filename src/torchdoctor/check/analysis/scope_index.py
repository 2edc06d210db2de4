"""Each scope's own nodes: what a module or function holds outside the functions and
classes defined inside it, built in one pass per file and shared by the rules that
look at calls or assignments scope by scope (TD113, TD216, TD405, TD406, TD503, and
the pickling `Finder`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from torchdoctor.check.context import FileContext, child_fields, iter_children

_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass
class _Scopes:
    nodes: dict[int, list[ast.AST]]  # id(scope) -> its own nodes
    inner: list[ast.AST]  # every function and class of the file


def own_nodes(ctx: FileContext, scope: ast.AST) -> list[ast.AST]:
    """The nodes of `scope`, not those of the functions and classes defined inside it
    (operators and contexts such as `Load` left out: no caller looks for them)."""
    return ctx.shared("scope_index.scopes", _every_scope).nodes[id(scope)]


def _every_scope(ctx: FileContext) -> _Scopes:
    """Every scope of the file and its own nodes, in one depth-first pass (each scope's
    nodes in the order a walk of that scope alone would give)."""
    table = child_fields(want_operators=False)
    found: dict[int, list[ast.AST]] = {id(ctx.tree): []}
    scopes: list[ast.AST] = []
    todo: list[tuple[ast.AST, list[ast.AST]]] = [
        (child, found[id(ctx.tree)]) for child in iter_children(ctx.tree, operators=False)
    ]
    while todo:
        node, owner = todo.pop()
        owner.append(node)
        if isinstance(node, _SCOPES):
            owner = found[id(node)] = []
            scopes.append(node)
        fields = table.get(node.__class__)
        if fields is None:
            todo.extend((c, owner) for c in iter_children(node, operators=False))
            continue
        for name in fields:
            value = getattr(node, name, None)
            if value.__class__ is list:
                todo.extend((item, owner) for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                todo.append((value, owner))
    return _Scopes(found, scopes)


def own_calls(ctx: FileContext, scope: ast.AST) -> list[ast.Call]:
    """The calls of `scope` itself (see `own_nodes`)."""
    return [n for n in own_nodes(ctx, scope) if isinstance(n, ast.Call)]


def scoped_calls(ctx: FileContext) -> list[tuple[ast.AST, ast.Call]]:
    """(scope, call) for every call of the file, its scope the module or the function
    it is written in (one pass per file, shared by the rules that ask)."""

    def build(ctx: FileContext) -> list[tuple[ast.AST, ast.Call]]:
        scopes = ctx.shared("scope_index.scopes", _every_scope).inner
        functions = [s for s in scopes if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
        functions.sort(key=lambda f: (f.lineno, f.col_offset))  # source order, as a walk
        return [(scope, call) for scope in [ctx.tree, *functions] for call in own_calls(ctx, scope)]

    return ctx.shared("scope_index.scoped_calls", build)


def assignments(ctx: FileContext, scope: ast.AST) -> dict[str, list[ast.Assign | ast.AnnAssign]]:
    """Plain `name = value` (and `name: T = value`) statements of `scope`, by name; and
    `self.attr = value` ones by `self.attr` (once per scope and file)."""
    cache: dict[int, dict[str, list[ast.Assign | ast.AnnAssign]]] = ctx.shared(
        "scope_index.assignments", lambda _: {}
    )
    found = cache.get(id(scope))
    if found is None:
        found = cache[id(scope)] = {}
        for node in own_nodes(ctx, scope):
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
