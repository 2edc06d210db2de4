"""The constructor calls whose objects a loop's name can hold.

`for loss_func in [ContrastiveLoss(), TripletLoss()]:` (or `[loss_a, loss_b]`, each
bound once to a constructor call): whatever pass runs, `loss_func` holds one of those
objects, so what holds for the `forward` of every one of their classes holds for the
call `loss_func(...)`. Only where the function binds the name nowhere else (no other
assignment, parameter, `global`/`nonlocal`, import, `except ... as`, nested definition):
otherwise the analysis cannot tell, and the caller stays quiet.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk


@dataclass
class _Bindings:
    stores: dict[str, int] = field(default_factory=dict)  # Name stores/deletes, by name
    other: set[str] = field(default_factory=set)  # bound some other way: not known
    loops: dict[str, ast.For | ast.AsyncFor] = field(default_factory=dict)
    assigns: dict[str, ast.Call] = field(default_factory=dict)  # `name = Call(...)`


def loop_builds(ctx: FileContext, func: ast.AST, name: str) -> list[ast.Call] | None:
    """The calls that built the objects `name` can hold in the function `func`, when
    its only binding is the target of a `for` over a list/tuple display (None: not known)."""
    cache: dict[ast.AST, _Bindings] = ctx.shared("loop_builds", lambda _: {})
    found = cache.get(func)
    if found is None:
        found = cache[func] = _bindings(func)
    loop = found.loops.get(name) if _once(found, name) else None
    if loop is None or not isinstance(loop.iter, ast.List | ast.Tuple):
        return None
    index = _position(loop.target, name)
    if index == -1:
        return None
    builds: list[ast.Call] = []
    for elt in loop.iter.elts:
        if index is not None:
            if not isinstance(elt, ast.List | ast.Tuple) or len(elt.elts) != _width(loop):
                return None
            elt = elt.elts[index]
        if isinstance(elt, ast.Name) and _once(found, elt.id):
            built: ast.expr | None = found.assigns.get(elt.id)
        else:
            built = elt
        if not isinstance(built, ast.Call):
            return None
        builds.append(built)
    return builds or None


def _once(found: _Bindings, name: str) -> bool:
    return found.stores.get(name) == 1 and name not in found.other


def _width(loop: ast.For | ast.AsyncFor) -> int:
    return len(loop.target.elts) if isinstance(loop.target, ast.Tuple | ast.List) else 0


def _position(target: ast.expr, name: str) -> int | None:
    """None: the target is `name` itself; its index in a flat tuple of names; else -1."""
    if isinstance(target, ast.Tuple | ast.List):
        names = [e.id if isinstance(e, ast.Name) else "" for e in target.elts]
        return names.index(name) if name in names and "" not in names else -1
    return None


def _bindings(func: ast.AST) -> _Bindings:
    found = _Bindings()
    for node in walk(func):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            found.stores[node.id] = found.stores.get(node.id, 0) + 1
        elif isinstance(node, ast.arg):
            found.other.add(node.arg)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            found.other.update(node.names)
        elif isinstance(node, ast.alias):
            found.other.add((node.asname or node.name).partition(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.other.add(node.name)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node is not func:
                found.other.add(node.name)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            found.other.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            found.other.add(node.rest)
        elif isinstance(node, ast.For | ast.AsyncFor):
            for target in walk(node.target):
                if isinstance(target, ast.Name):
                    found.loops[target.id] = node
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
        ):
            found.assigns[node.targets[0].id] = node.value
    return found
