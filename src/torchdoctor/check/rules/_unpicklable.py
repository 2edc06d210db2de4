"""What pickle cannot store: lambdas and functions defined inside other functions.

Pickle stores a function by its import path (`module.name`); a lambda has none
(`<lambda>`) and a nested function's path (`f.<locals>.g`) cannot be imported back,
so both fail with `Can't pickle local object` / `attribute lookup <lambda> failed`.
Shared by the rules on things that get pickled: whole-model saves (TD405) and
DataLoader workers under spawn (TD503).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from torchdoctor.check.analysis.scope_index import assignments
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import child_statements, parameter_defaults, walk

# Callees that store the functions they are given: class constructors and these.
_STORING = frozenset({"partial", "functools.partial"})


@dataclass(frozen=True)
class Unpicklable:
    node: ast.AST  # the lambda, or the name of the local function
    what: str  # "a lambda", "the local function `collate`"


def local_functions(scope: ast.AST) -> set[str]:
    """Functions defined inside the function `scope` (not at module or class level)."""
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    return {
        node.name
        for node in walk(scope)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node is not scope
    }


def module_lambdas(tree: ast.Module) -> set[str]:
    """Module-level names bound to a lambda (`act = lambda x: x`): no importable name."""
    return {
        target.id
        for stmt in tree.body
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Lambda)
        for target in stmt.targets
        if isinstance(target, ast.Name)
    }


class Finder:
    """Finds unpicklable callables a value holds, in one function (or the module)."""

    def __init__(self, ctx: FileContext, scope: ast.AST) -> None:
        self.ctx = ctx
        self.scope = scope

    @functools.cached_property
    def locals(self) -> set[str]:
        return local_functions(self.scope)

    @functools.cached_property
    def lambdas(self) -> set[str]:
        return self.ctx.shared("unpicklable.module_lambdas", lambda c: module_lambdas(c.tree))

    def find(self, expr: ast.expr | None, before: int, depth: int = 6) -> list[Unpicklable]:
        """What `expr` (evaluated at line `before`) holds that pickle cannot store: itself,
        the items of a list/tuple/dict, the arguments of a constructor (`Lambda(...)`,
        `Compose([...])`, `MyDataset(transform=...)`) or of `partial`, and what a name
        was last bound to in this scope."""
        if expr is None or depth < 0:
            return []
        if isinstance(expr, ast.Lambda):
            return [Unpicklable(expr, "a lambda")]
        if isinstance(expr, ast.Name):
            if expr.id in self.locals:
                return [Unpicklable(expr, f"the local function `{expr.id}`")]
            if expr.id in self.lambdas:
                return [Unpicklable(expr, f"`{expr.id}`, a lambda")]
            bound = self.binding(expr.id, before)
            return self.find(bound, before, depth - 1) if bound is not None else []
        if isinstance(expr, ast.List | ast.Tuple | ast.Set):
            return [u for e in expr.elts for u in self.find(e, before, depth)]
        if isinstance(expr, ast.Dict):
            return [u for v in expr.values for u in self.find(v, before, depth)]
        if isinstance(expr, ast.Call) and self.stores_arguments(expr):
            values = [*expr.args, *(k.value for k in expr.keywords)]
            return [u for v in values for u in self.find(v, before, depth - 1)]
        return []

    def stores_arguments(self, call: ast.Call) -> bool:
        name = self.ctx.qualname(call.func) or ""
        last = name.rsplit(".", 1)[-1]
        return name in _STORING or last[:1].isupper()

    def binding(self, name: str, before: int) -> ast.expr | None:
        """The value of the latest plain `name = value` before line `before` in scope
        (`name` may be `self.attr`)."""
        latest: ast.expr | None = None
        latest_line = -1
        for node in assignments(self.ctx, self.scope).get(name, ()):
            if latest_line < node.lineno < before and node.value is not None:
                latest, latest_line = node.value, node.lineno
        return latest

    def default(self, name: str) -> ast.expr | None:
        """The default value of the scope's parameter `name`, if it has one."""
        if not isinstance(self.scope, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        return next((d for a, d in parameter_defaults(self.scope.args) if a.arg == name), None)


def statements(node: ast.Module | ast.FunctionDef) -> Iterator[ast.stmt]:
    """Every statement under `node`, nested functions' and classes' too (what a walk of
    the tree finds of classes and assignments, without visiting any expression)."""
    todo = list(node.body)
    while todo:
        stmt = todo.pop()
        yield stmt
        todo.extend(child_statements(stmt))


def self_attribute(target: ast.expr) -> str | None:
    """`x` for a target `self.x`."""
    if (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    ):
        return target.attr
    return None


@dataclass
class Stored:
    """What a class's methods store on `self` that pickle cannot store."""

    found: list[tuple[Unpicklable, str]] = field(default_factory=list)  # (what, attribute)
    # `__init__` parameters stored on self as they are: parameter -> attribute
    params: dict[str, str] = field(default_factory=dict)


def stored_on_self(ctx: FileContext, cls: ast.ClassDef) -> Stored:
    """The lambdas and local functions `cls`'s methods assign to `self` attributes, and
    the constructor parameters `__init__` stores (a caller's lambda for one ends up
    on the object)."""
    stored = Stored()
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef):
            continue
        finder = Finder(ctx, method)
        params = {a.arg for a in (*method.args.args, *method.args.kwonlyargs)}
        for node in statements(method):
            if not isinstance(node, ast.Assign):
                continue
            for attr, value in _attribute_values(node):
                stored.found += [(u, attr) for u in finder.find(value, node.lineno)]
                if method.name == "__init__" and isinstance(value, ast.Name) and value.id in params:
                    stored.params[value.id] = attr
    return stored


def _attribute_values(node: ast.Assign) -> list[tuple[str, ast.expr]]:
    """(attribute, value) for each `self.attribute` the assignment sets: `self.a = v`,
    and each element of `self.a, self.b = v, w`."""
    found: list[tuple[str, ast.expr]] = []
    for target in node.targets:
        attr = self_attribute(target)
        if attr is not None:
            found.append((attr, node.value))
        elif (
            isinstance(target, ast.Tuple)
            and isinstance(node.value, ast.Tuple)
            and len(target.elts) == len(node.value.elts)
        ):
            for element, value in zip(target.elts, node.value.elts, strict=True):
                attr = self_attribute(element)
                if attr is not None:
                    found.append((attr, value))
    return found[:1] if len(node.targets) > 1 else found
