"""Whether a loader's `collate_fn=` keeps its batches where the samples are.

A collate function may move what it stacks (`default_collate(b).to(device)`), so a
loader given one yields batches of unknown place. One the project defines whose code
moves nothing and calls nothing of the project (only torch, NumPy, builtins, methods
of its values: `torch.utils.data.default_collate(batch)`, `torch.stack(xs)`) returns
what the samples were: CPU tensors. Found in this file (a function, a class's
staticmethod `LazyDataset.collate`) or in the project file defining an imported class
or function, read without running an analysis of that file.
"""

from __future__ import annotations

import ast
import builtins

from torchdoctor.check.analysis.interfaces import FileFacts
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.tree_walk import walk

# code that may put a tensor on a device (or hand the batch to something that does)
_MOVE_WORDS = (".to(", ".cuda(", "device", "pin_memory", "non_blocking")
_LIBRARIES = ("torch.", "numpy.", "np.", "math.", "itertools.", "functools.", "collections.")
_BUILTINS = frozenset(dir(builtins))


def collate_keeps_place(ff: FileFacts, expr: ast.expr) -> bool:
    """True when the `collate_fn=` argument `expr` is a function of the project shown to
    move nothing (see the module doc); False when not known."""
    found = _function(ff, expr)
    if found is None:
        return False
    func, text, imports = found
    if any(word in text for word in _MOVE_WORDS):
        return False
    own = {a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]}
    for node in walk(func):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func
        if isinstance(callee, ast.Attribute):
            root = dotted(callee)
            if root is None:
                continue  # a method of a value (`x[0].size()`, `batch.append(y)`)
            base = root.split(".", 1)[0]
            qual = imports.get(base, "")
            if base in own or (not qual and base not in imports):
                continue  # a method of a parameter or a local value
            if not f"{qual}.".startswith(_LIBRARIES):
                return False  # a module of the project (or unknown): may move
        elif isinstance(callee, ast.Name):
            qual = imports.get(callee.id, "")
            if qual:
                if not f"{qual}.".startswith(_LIBRARIES):
                    return False
            elif callee.id not in _BUILTINS:
                return False  # a function of the file (or a local callable)
        else:
            return False
    return True


def _function(
    ff: FileFacts, expr: ast.expr
) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, str, dict[str, str]] | None:
    """The function `expr` names, its text and its file's imports."""
    if isinstance(expr, ast.Name):
        func = ff.toplevel_functions.get(expr.id)
        if func is not None and not ff.module_assigns(expr.id):
            return func, ff.text(func), ff.ctx.imports
        return _foreign(ff, expr.id, None)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        owner = expr.value.id
        cls = ff.classes.get(owner)
        if cls is not None:
            method = ff.methods(cls).get(expr.attr)
            if method is not None and _is_staticmethod(method):
                return method, ff.text(method), ff.ctx.imports
            return None
        return _foreign(ff, owner, expr.attr)
    return None


def _foreign(
    ff: FileFacts, name: str, attr: str | None
) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, str, dict[str, str]] | None:
    """`name` (a function, or a class with staticmethod `attr`) imported from the file of
    the project that defines it."""
    if attr is None:
        qual = ff.ctx.imports.get(name)
        found = ff.foreign_function(qual) if qual else None
        if found is None:
            return None
        flow, func = found
        return func, flow.text(func), flow.ctx.imports
    path = ff.project_class(name)
    if path is None:
        return None
    other = ff.sibling_flow(path)
    if other is None:
        return None
    cls = other.classes.get(name)
    method = other.methods(cls).get(attr) if cls is not None else None
    if method is None or not _is_staticmethod(method):
        return None
    return method, other.text(method), other.ctx.imports


def _is_staticmethod(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any((dotted(d) or "").endswith("staticmethod") for d in func.decorator_list)
