"""Keys (names, `self.x` in `__init__`) that are unbound until the scope binds them.

`if space == "sphere": self.doas = sphere()` with no else: after the `if`, `self.doas`
holds the sphere or is not set at all. A use of an unset name or attribute raises
(NameError, AttributeError) instead of running with some other value, so every use that
runs sees the value the branch set: the join keeps it. That holds only for a key
nothing bound before the branch: a local name of a function (not a parameter, not
declared `global`/`nonlocal`), a module-level name of a file without star imports or
`global` statements, and a `self.x` that `__init__` of a class with no base of its own
(`nn.Module`, `object`) sets first, which no class attribute, other method, `setattr`
or function handed `self` may set. The interpreter tells which keys it bound before
the branch (`ScopeCore._first`, `_last`); this module says which keys can be unbound at all.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable

from torchdoctor.check.analysis.values import ScopeNode
from torchdoctor.check.tree_walk import walk, walk_statements

# the keyword of a `global`/`nonlocal` statement; it counts at the start of a line or
# after `;` or `:` (the words alone are common in comments and docstrings). A pattern
# led by the words is found by a fast scan; one led by `^` was tried at every position.
_DECLARATION_WORD = re.compile(r"(?:global|nonlocal)[ \t]")

# the bases whose `__init__` sets no attribute the class's own code reads back
_PLAIN_BASES = frozenset(
    {"object", "torch.nn.Module", "torch.nn.modules.module.Module", "nn.Module", "Module"}
)


@functools.lru_cache(maxsize=4)
def _declares(source: str) -> bool:
    """Whether the file holds a `global`/`nonlocal` statement (asked once per file: the
    text is scanned only when it holds the word)."""
    if "global" not in source and "nonlocal" not in source:
        return False
    for match in _DECLARATION_WORD.finditer(source):
        start = match.start()
        opening = max(source.rfind(sep, 0, start) for sep in "\n;:") + 1
        if not source[opening:start].strip(" \t"):
            return True
    return False


def unbindable(
    node: ScopeNode,
    cls: ast.ClassDef | None,
    self_name: str,
    qualname: Callable[[ast.expr], str | None],
    source: str,
) -> Callable[[str], bool]:
    """A test of whether a key can be unbound in `node` before the scope binds it (its
    facts found on first need: most joins ask about no key at all)."""
    declared: set[str] | None = None
    attrs: list[frozenset[str] | None] = []

    def is_declared(key: str) -> bool:
        nonlocal declared
        if declared is None:
            declared = set()
            if _declares(source):
                tops = node.body if isinstance(node, ast.Module) else [node]
                for top in tops:
                    for sub in walk_statements(top):
                        if isinstance(sub, ast.Global | ast.Nonlocal):
                            declared.update(sub.names)
        return key in declared

    if isinstance(node, ast.Module):
        if "import *" in source or re.search(r"^\s*global\s", source, re.M):
            return lambda key: False  # a star import, or functions that set globals

        return lambda key: "." not in key and not is_declared(key)

    def function_key(key: str) -> bool:
        if "." not in key:
            return not is_declared(key)
        head, _, attr = key.partition(".")
        if head != self_name or "." in attr:
            return False
        if not attrs:
            attrs.append(_init_attributes(node, cls, self_name, qualname))
        found = attrs[0]
        return found is not None and attr in found

    return function_key


def _init_attributes(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
    cls: ast.ClassDef | None,
    self_name: str,
    qualname: Callable[[ast.expr], str | None],
) -> frozenset[str] | None:
    """The attributes `x` that only `__init__` (this function) sets as `self.x = ...`,
    on a class with plain bases that nothing else may set them on first."""
    if cls is None or func.name != "__init__":
        return None
    for base in cls.bases:
        if (qualname(base) or ast.unparse(base)) not in _PLAIN_BASES:
            return None
    if cls.keywords:
        return None  # a metaclass may set anything
    class_level: set[str] = set()
    others: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for sub in walk(target):
                    if isinstance(sub, ast.Name):
                        class_level.add(sub.id)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt is not func:
            others |= _attrs_set(stmt, None)
            if others is _ANY:
                return None
    mine = _attrs_set(func, self_name)
    if mine is _ANY:
        return None
    return frozenset(mine - class_level - others)


_ANY: set[str] = {"*"}


def _attrs_set(func: ast.FunctionDef | ast.AsyncFunctionDef, self_name: str | None) -> set[str]:
    """`x` of every `<first parameter>.x = ...` in `func` (`_ANY` when `setattr`, or a
    call handed the object itself, may set any attribute)."""
    params = [*func.args.posonlyargs, *func.args.args]
    me = self_name or (params[0].arg if params else "")
    found: set[str] = set()
    for sub in walk(func):
        if isinstance(sub, ast.Attribute) and not isinstance(sub.ctx, ast.Load):
            if isinstance(sub.value, ast.Name) and sub.value.id == me:
                found.add(sub.attr)
        elif isinstance(sub, ast.Call):
            callee = sub.func
            if isinstance(callee, ast.Name) and callee.id in ("setattr", "vars"):
                return _ANY
            if isinstance(callee, ast.Name) and callee.id == "super":
                continue  # `super(Cls, self)`: the plain base's __init__
            handed = [*sub.args, *(k.value for k in sub.keywords)]
            if any(isinstance(a, ast.Name) and a.id == me for a in handed):
                return _ANY
        if isinstance(sub, ast.Attribute) and sub.attr == "__dict__":
            return _ANY
    return found
