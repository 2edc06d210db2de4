"""The method `self.m()` runs when the class's own `m` is abstract: the override of the one
subclass in the project that defines it.

`def evaluate(self, ...): raise NotImplementedError` in a base trainer says every real
trainer is a subclass that brings its own `evaluate`; `self.evaluate(...)` in the base's
`test()` runs that override. Where the project (`ProjectIndex.bases`, `class_files`)
shows exactly one subclass defining the method, the call is read as a call of it; with
none or several (which one runs depends on the object), the call stays unresolved.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Protocol

from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.project import ProjectIndex

_MAX_SUBCLASSES = 12  # a base with more subclasses than this is a framework's: not followed


class _Methods(Protocol):
    methods: dict[str, dict[str, FunctionInfo]]


def is_abstract(node: ast.AST) -> bool:
    """A method whose body (its docstring aside) only says it is not implemented: `raise
    NotImplementedError`, `return NotImplementedError(...)`, `pass`, `...`, or one
    decorated `@abstractmethod`."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    if any(
        (d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")) == "abstractmethod"
        for d in node.decorator_list
    ):
        return True
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    if len(body) != 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return stmt.value.value is Ellipsis
    value = stmt.exc if isinstance(stmt, ast.Raise) else getattr(stmt, "value", None)
    if not isinstance(stmt, ast.Raise | ast.Return) or value is None:
        return False
    if isinstance(value, ast.Call):
        value = value.func
    return isinstance(value, ast.Name) and value.id == "NotImplementedError"


def sole_override(
    fi: FunctionInfo,
    project: ProjectIndex,
    load: Callable[[str], _Methods | None],
    cache: dict[tuple[str, str], FunctionInfo | None],
) -> FunctionInfo | None:
    """The one definition of method `fi` (abstract) among the project's subclasses of its
    class, read from their files through `load`; None if there is none, or several."""
    if fi.cls is None or not is_abstract(fi.node):
        return None
    slot = (fi.cls.name, fi.name)
    if slot in cache:
        return cache[slot]
    cache[slot] = None
    subclasses = project.subclasses_of({fi.cls.name}) - {fi.cls.name}
    if not subclasses or len(subclasses) > _MAX_SUBCLASSES:
        return None
    found: list[FunctionInfo] = []
    for name in sorted(subclasses):
        for path in project.class_files.get(name, ()):
            other = load(path)
            method = None if other is None else other.methods.get(name, {}).get(fi.name)
            if method is not None and method.node is not fi.node and not is_abstract(method.node):
                found.append(method)
    if len(found) == 1:
        cache[slot] = found[0]
    return cache[slot]
