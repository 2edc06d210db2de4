"""The requirements a setup.py declares, read from its syntax tree (never run).

`setup(install_requires=..., extras_require=...)` as a literal list or dict, a name
bound to one (`install_requires = [...]`, extended with `+=`, `.append`, `.extend`),
sums, `list(...)`, or lines read from requirements files: a call or expression that
names `.txt` files (`parse_requirements("requirements.txt")`, a helper whose body
opens one, `f.read().splitlines()` under `with open("requirements.txt") as f`).
Anything else is unknown: the caller then assumes any torch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

_KEYWORDS = ("install_requires", "extras_require")
_MAX_DEPTH = 12  # names bound to names bound to ...: enough for real files
_COPIES = frozenset({"list", "sorted", "set", "tuple", "dict", "frozenset"})
_VIEWS = frozenset({"values", "keys", "copy"})

# (requirement texts, requirements files named), or None when unknown
Requirements = tuple[list[str], list[str]] | None


def setup_py_requirements(text: str) -> Requirements:
    """What `setup()` in this setup.py's text is given to install, or None (unknown)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    reader = _Reader(tree)
    texts: list[str] = []
    files: list[str] = []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or not _is_setup(call.func):
            continue
        for keyword in call.keywords:
            if keyword.arg is None:  # setup(**config)
                value = reader.keyword_of(keyword.value)
                if value is None:
                    return None
                found = [reader.values(v, 0) for v in value]
            elif keyword.arg in _KEYWORDS:
                found = [reader.values(keyword.value, 0)]
            else:
                continue
            for result in found:
                if result is None:
                    return None
                texts += result[0]
                files += result[1]
    return texts, list(dict.fromkeys(files))


def _is_setup(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id == "setup"
    return isinstance(func, ast.Attribute) and func.attr == "setup"


class _Reader:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        # name -> the values bound to it anywhere (`def main(): reqs = [...]; setup(...)`
        # too: one name's bindings in several functions only add strings), each with the
        # `with` statements around the binding
        self.bindings: dict[str, list[tuple[ast.expr, list[ast.With]]]] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self._resolving: set[str] = set()
        self._collect(tree.body, [])

    def _collect(self, body: list[ast.stmt], withs: list[ast.With]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef):
                self.functions[stmt.name] = stmt
                self._collect(stmt.body, [])
                continue
            if isinstance(stmt, ast.ClassDef | ast.AsyncFunctionDef):
                continue
            self._bind(stmt, withs)
            inner = [*withs, stmt] if isinstance(stmt, ast.With) else withs
            for field in ("body", "orelse", "finalbody"):
                self._collect(getattr(stmt, field, []), inner)
            for handler in getattr(stmt, "handlers", []):
                self._collect(handler.body, inner)

    def _bind(self, stmt: ast.stmt, withs: list[ast.With]) -> None:
        def add(target: ast.expr, value: ast.expr) -> None:
            while isinstance(target, ast.Subscript):  # extras["gpu"] = [...]
                target = target.value
            if isinstance(target, ast.Name):
                self.bindings.setdefault(target.id, []).append((value, withs))

        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                add(target, stmt.value)
        elif isinstance(stmt, ast.AugAssign | ast.AnnAssign) and stmt.value is not None:
            add(stmt.target, stmt.value)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func  # reqs.append("x"), reqs.extend([...]), extras.update(...)
            if isinstance(func, ast.Attribute) and func.attr in ("append", "extend", "update"):
                for arg in stmt.value.args:
                    add(func.value, arg)

    def keyword_of(self, expr: ast.expr) -> list[ast.expr] | None:
        """The install_requires / extras_require values of `setup(**config)`."""
        if isinstance(expr, ast.Dict):
            return [
                v
                for k, v in zip(expr.keys, expr.values, strict=True)
                if not isinstance(k, ast.Constant) or k.value in _KEYWORDS
            ]
        if isinstance(expr, ast.Name) and expr.id in self.bindings:
            found: list[ast.expr] = []
            for value, _ in self.bindings[expr.id]:
                inner = self.keyword_of(value)
                if inner is None:
                    return None
                found += inner
            return found
        return None

    def values(self, expr: ast.expr, depth: int) -> Requirements:
        """The strings `expr` may hold, or the `.txt` files it reads; None if neither."""
        found = self._parts(expr, depth)
        if found is not None:
            return found
        files = list(self._files(expr, 0, set()))
        return ([], files) if files else None

    def _parts(self, expr: ast.expr, depth: int) -> Requirements:
        if depth > _MAX_DEPTH:
            return None
        if isinstance(expr, ast.Constant):
            return ([expr.value] if isinstance(expr.value, str) else []), []
        if isinstance(expr, ast.JoinedStr):  # f"torch>={MIN}": torch, of a version unknown
            pieces = [v.value if isinstance(v, ast.Constant) else "*" for v in expr.values]
            return ["".join(str(piece) for piece in pieces)], []
        parts: list[ast.expr] | None = None
        if isinstance(expr, ast.List | ast.Tuple | ast.Set):
            parts = list(expr.elts)
        elif isinstance(expr, ast.Dict):
            parts = list(expr.values)
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add | ast.BitOr):
            parts = [expr.left, expr.right]
        elif isinstance(expr, ast.Starred | ast.Subscript):
            parts = [expr.value]
        elif isinstance(expr, ast.Call) and not expr.keywords:
            func = expr.func
            if isinstance(func, ast.Name) and func.id in _COPIES:
                parts = list(expr.args)  # list(reqs), sorted(set(a + b))
            elif isinstance(func, ast.Attribute) and func.attr in _VIEWS and not expr.args:
                parts = [func.value]  # extras.values(), reqs.copy()
        elif isinstance(expr, ast.ListComp | ast.SetComp | ast.GeneratorExp):
            # `set(dep for deps in extras.values() for dep in deps)`: the element is
            # (a method of) a loop variable, so the strings come from the iterables
            element = _called_on(expr.elt)
            targets = {
                n.id for g in expr.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)
            }
            if isinstance(element, ast.Name) and element.id in targets:
                parts = [
                    g.iter
                    for g in expr.generators
                    if not (isinstance(g.iter, ast.Name) and g.iter.id in targets)
                ]
        elif isinstance(expr, ast.Name):
            if expr.id in self._resolving:
                return [], []  # its other bindings are read already
            bound = self.bindings.get(expr.id)
            if not bound:
                return None
            self._resolving.add(expr.id)
            try:
                return self._join([value for value, _ in bound], depth)
            finally:
                self._resolving.discard(expr.id)
        return None if parts is None else self._join(parts, depth)

    def _join(self, parts: list[ast.expr], depth: int) -> Requirements:
        texts: list[str] = []
        files: list[str] = []
        for part in parts:
            found = self.values(part, depth + 1)
            if found is None:
                return None
            texts += found[0]
            files += found[1]
        return texts, files

    def _files(self, expr: ast.AST, depth: int, seen: set[str]) -> Iterator[str]:
        """`.txt` names in a computed value, the functions it calls and the `with`
        statements around the names it reads."""
        if depth > _MAX_DEPTH:
            return
        for node in ast.walk(expr):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.endswith(".txt"):
                    yield node.value.removeprefix("./")
            elif isinstance(node, ast.Name) and node.id not in seen:
                seen.add(node.id)
                function = self.functions.get(node.id)
                if function is not None:
                    yield from self._files(function, depth + 1, seen)
                for value, withs in self.bindings.get(node.id, []):
                    yield from self._files(value, depth + 1, seen)
                    for statement in withs:
                        for item in statement.items:
                            yield from self._files(item.context_expr, depth + 1, seen)


def _called_on(node: ast.expr) -> ast.expr:
    """`r` of `r.strip()` (a method called on a plain name), else the node itself."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
    ):
        return node.func.value
    return node
