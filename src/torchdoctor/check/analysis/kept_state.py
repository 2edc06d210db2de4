"""Objects that keep what their methods are given: `meter.update(loss)` sums `loss` into
the meter's own state (`self.sum += val`), so the meter holds it, and whatever it holds
(a graph, a device tensor), after the call and across calls.

A method keeps a parameter when it adds it up into `self`'s state: `self.total += v`,
`self.sums[i] = self.sums[i] * n + v`, `self.values[key].append(v)`, also through a loop
over the parameter (`for i, v in enumerate(values): self.sum[i] += v`). A plain store
(`self.last = v`) keeps one value only and is not an accumulation.

The receiver's class is found where the code shows it: a local name every assignment of
which builds the same class (`meter = AverageMeter()`), or `self.meter` that every
method of the class sets to one (`None` aside). The class is looked up in the file, then
in the project's files that define a class of that name (`ProjectIndex.class_files`,
read on demand), along its bases; every definition found must keep the parameter.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.check.analysis.file_loops import project_file
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk

FuncDef = ast.FunctionDef | ast.AsyncFunctionDef

_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div)


def kept_arguments(ctx: FileContext, fi: FunctionInfo, call: ast.Call) -> list[ast.expr]:
    """The arguments of `recv.method(...)` that the receiver's method keeps in its state."""
    if not isinstance(call.func, ast.Attribute):
        return []
    cls = receiver_class(ctx, fi, call.func.value)
    if cls is None:
        return []
    defs = list(_methods(ctx, cls, call.func.attr))
    if not defs:
        return []
    kept: list[ast.expr] | None = None
    for method in defs:
        here = _bound_arguments(call, method, kept_parameters(method))
        kept = here if kept is None else [a for a in kept if any(a is b for b in here)]
    return kept or []


def kept_parameters(method: FuncDef) -> frozenset[str]:
    """The parameters (not `self`) that `method` adds up into `self`'s state."""
    args = method.args
    params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)][1:]
    if not params:
        return frozenset()
    origin = {p: p for p in params}  # loop variables over a parameter -> the parameter
    for node in walk(method):
        if isinstance(node, ast.For):
            source = _iterated(node.iter)
            if source in params:
                for target in _element_targets(node.target, node.iter):
                    origin.setdefault(target, source)
    kept: set[str] = set()
    for node in walk(method):
        for value in _accumulated(node):
            kept |= {origin[n] for n in _arithmetic_names(value) if n in origin}
    return frozenset(kept)


def receiver_class(ctx: FileContext, fi: FunctionInfo, recv: ast.expr) -> str | None:
    """The class every binding of `recv` builds (its last dotted part), if one does."""
    key = dotted(recv)
    if key is None:
        return None
    if isinstance(recv, ast.Name):
        if key in fi.params():
            return parameter_class(ctx, fi, key)
        return _one_class(_bindings(ctx, fi.node, key), ctx)
    if key.count(".") == 1 and key.startswith("self.") and fi.cls is not None:
        return _one_class(_bindings(ctx, fi.cls, key), ctx)
    return None


def stored_and_kept(ctx: FileContext, fi: FunctionInfo, stmt: ast.stmt) -> ast.expr | None:
    """The value of `recv[key] = value` when the receiver's class keeps it: its
    `__setitem__` adds its value up in its state (`self.values[key].append(value)`)."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        return None
    target = stmt.targets[0]
    if not isinstance(target, ast.Subscript):
        return None
    cls = receiver_class(ctx, fi, target.value)
    if cls is None:
        return None
    defs = list(_methods(ctx, cls, "__setitem__"))
    for method in defs:
        params = [a.arg for a in (*method.args.posonlyargs, *method.args.args)]
        if len(params) != 3 or params[2] not in kept_parameters(method):
            return None
    return stmt.value if defs else None


# `:type stat_col: StatisticsCollector` (Sphinx), the class in ``x``, `x` or :class:`x`
_DOC_TYPE = r":type\s+{}\s*:\s*(?::class:)?`*~?([A-Za-z_][\w.]*)`*\s*$"


def parameter_class(ctx: FileContext, fi: FunctionInfo, name: str) -> str | None:
    """The project class a parameter is annotated with, or its docstring's `:type name:`
    field names: the one class the author says it holds (None, Optional aside)."""
    node = fi.node
    if not isinstance(node, FuncDef):  # type: ignore[arg-type]
        return None
    args = node.args  # type: ignore[union-attr]
    found: str | None = None
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
        if arg.arg == name and arg.annotation is not None:
            annotation = arg.annotation
            if isinstance(annotation, ast.Subscript) and dotted(annotation.value) in (
                "Optional",
                "typing.Optional",
            ):
                annotation = annotation.slice
            found = dotted(annotation)
    if found is None:
        doc = ast.get_docstring(node) or ""  # type: ignore[arg-type]
        if ":type" not in doc:
            return None
        match = re.search(_DOC_TYPE.format(re.escape(name)), doc, re.MULTILINE)
        found = match.group(1) if match else None
    if found is None:
        return None
    cls = found.rsplit(".", 1)[-1]
    known = cls in ctx.project.class_files or any(
        isinstance(n, ast.ClassDef) and n.name == cls for n in ctx.tree.body
    )
    return cls if known else None


def _one_class(values: list[ast.expr], ctx: FileContext) -> str | None:
    found: set[str] = set()
    for value in values:
        if isinstance(value, ast.Constant) and value.value is None:
            continue
        if not isinstance(value, ast.Call):
            return None
        name = dotted(value.func)
        if name is None:
            return None
        found.add(name.rsplit(".", 1)[-1])
    if len(found) != 1:
        return None
    (cls,) = found
    known = cls in ctx.project.class_files or any(
        isinstance(n, ast.ClassDef) and n.name == cls for n in ctx.tree.body
    )
    return cls if known else None


def _bindings(ctx: FileContext, scope: ast.AST, key: str) -> list[ast.expr]:
    """The values assigned to `key` in `scope` (an unknown one for other bindings)."""
    indexes: dict[int, dict[str, list[ast.expr]]] = ctx.shared("kept_bindings", lambda c: {})
    index = indexes.get(id(scope))
    if index is None:  # every key of the scope in one walk: a class may be asked often
        index = indexes[id(scope)] = _binding_index(scope)
    return index.get(key, [])


def _binding_index(scope: ast.AST) -> dict[str, list[ast.expr]]:
    index: dict[str, list[ast.expr]] = {}

    def bind(key: str | None, value: ast.expr) -> None:
        if key is not None:
            index.setdefault(key, []).append(value)

    def unpacked(bound: ast.AST, value: ast.expr) -> None:
        # each name bound inside `bound` once (`a, (b, a) = ...` binds `a` once here)
        for key in dict.fromkeys(dotted(t) for t in walk(bound)):
            bind(key, value)

    for node in walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple | ast.List):
                    unpacked(target, target)  # unpacked: not a class built here
                else:
                    bind(dotted(target), node.value)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            bind(dotted(node.target), node.value if node.value is not None else node.target)
        elif isinstance(node, ast.For | ast.With | ast.comprehension | ast.NamedExpr):
            bound = [node.target] if hasattr(node, "target") else []
            bound += [i.optional_vars for i in getattr(node, "items", []) if i.optional_vars]
            if bound:
                keys = dict.fromkeys(dotted(t) for b in bound for t in walk(b))
                for key in keys:
                    bind(key, bound[0])
    return index


def _methods(ctx: FileContext, cls: str, name: str, depth: int = 0) -> Iterator[FuncDef]:
    """`cls.name` in each definition of `cls` (this file's first), along its bases."""
    if depth > 4:
        return
    here = [n for n in ctx.tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    trees: list[tuple[FileContext, ast.ClassDef]] = [(ctx, c) for c in here]
    if not here:
        for path in ctx.project.class_files.get(cls, ()):
            other = project_file(ctx, path)
            if other is None:
                continue
            trees += [
                (other.ctx, c)
                for c in other.ctx.tree.body
                if isinstance(c, ast.ClassDef) and c.name == cls
            ]
    for owner, node in trees:
        method = next(
            (m for m in node.body if isinstance(m, FuncDef) and m.name == name),  # type: ignore[arg-type]
            None,
        )
        if method is not None:
            yield method  # type: ignore[misc]
            continue
        for base in node.bases:
            base_name = dotted(base)
            if base_name is not None:
                yield from _methods(owner, base_name.rsplit(".", 1)[-1], name, depth + 1)


def _bound_arguments(call: ast.Call, method: FuncDef, kept: frozenset[str]) -> list[ast.expr]:
    """The arguments of `call` that fill the parameters `kept` of `method`."""
    if not kept:
        return []
    args = method.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)][1:]
    found: list[ast.expr] = []
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            break
        if i < len(positional) and positional[i] in kept:
            found.append(arg)
    found += [k.value for k in call.keywords if k.arg in kept]
    return found


def _accumulated(node: ast.AST) -> list[ast.expr]:
    """What `node` adds up into `self`'s state: `self.a += v`, `self.a[k] = self.a[k] + v`
    (`= 0.9 * self.a.get(k, 0) + v`: the new value is arithmetic of the old one),
    `self.a.append(v)`, `self.a.setdefault(k, []).append(v)`."""
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
        return [node.value] if _state(node.target) else []
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        state = _state(node.targets[0])
        if state and any(_state(t) == state for t in _arithmetic_terms(node.value)):
            return [node.value]
        return []
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("append", "extend")
        and len(node.args) == 1
        and _state(node.func.value)
    ):
        return [node.args[0]]
    return []


def _state(node: ast.expr) -> str | None:
    """`self.a` for `self.a`, `self.a[k]`, `self.a.b[k]`, `self.a.get(k)`,
    `self.a.setdefault(k, [])`: the attribute of the object it reads or writes."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return node.attr
            node = node.value
        else:
            return None


def _arithmetic_terms(node: ast.expr) -> Iterator[ast.expr]:
    """The operands of a sum/product/quotient, down to its leaves."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITHMETIC):
        yield from _arithmetic_terms(node.left)
        yield from _arithmetic_terms(node.right)
    elif isinstance(node, ast.UnaryOp):
        yield from _arithmetic_terms(node.operand)
    elif isinstance(node, ast.List | ast.Tuple):
        for element in node.elts:
            yield from _arithmetic_terms(element)
    else:
        yield node


def _arithmetic_names(node: ast.expr) -> set[str]:
    """The names a value is plain arithmetic of (`0.01 * v` -> v; `v.item()` -> none)."""
    return {t.id for t in _arithmetic_terms(node) if isinstance(t, ast.Name)}


def _iterated(node: ast.expr) -> str | None:
    """`p` for `p`, `enumerate(p)`, `p.items()`, `p.values()`, `zip(p, ...)`."""
    if isinstance(node, ast.Name):
        return node.id
    if not isinstance(node, ast.Call):
        return None
    func, args = node.func, node.args
    if (
        isinstance(func, ast.Attribute)
        and not args
        and func.attr in ("items", "values")
        and isinstance(func.value, ast.Name)
    ):
        return func.value.id
    if isinstance(func, ast.Name) and func.id == "enumerate" and args:
        return args[0].id if isinstance(args[0], ast.Name) else None
    return None


def _element_targets(target: ast.expr, iterable: ast.expr) -> list[str]:
    """The loop variables that take the parameter's elements (`v` in `for i, v in
    enumerate(p)`, `for k, v in p.items()`; `v` in `for v in p`)."""
    pairs = isinstance(iterable, ast.Call) and (
        (isinstance(iterable.func, ast.Name) and iterable.func.id == "enumerate")
        or (isinstance(iterable.func, ast.Attribute) and iterable.func.attr == "items")
    )
    if pairs:
        if isinstance(target, ast.Tuple) and len(target.elts) == 2:
            second = target.elts[1]
            return [second.id] if isinstance(second, ast.Name) else []
        return []
    return [target.id] if isinstance(target, ast.Name) else []
