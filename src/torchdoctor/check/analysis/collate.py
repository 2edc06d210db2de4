"""Whether a loader's `collate_fn=` keeps its batches where the samples are.

A collate function may move what it stacks (`default_collate(b).to(device)`), so a
loader given one yields batches of unknown place. One the project defines whose code
moves nothing and calls nothing of the project (only torch, NumPy, builtins, methods
of its values: `torch.utils.data.default_collate(batch)`, `torch.stack(xs)`) returns
what the samples were: CPU tensors -- where every `return` shows a torch call's result
(or a tuple of them, or None): lists it builds itself (`lengths.append(len(s))`) are
not tensors, and what a library object makes (`tokenizer.pad(...)`, a BatchEncoding
that `.to()` moves in place) is not a plain tensor either. Calls on names the function
neither receives, binds nor imports (a module-level `tokenizer`) may do anything.
Found in this file (a function, a class's staticmethod `LazyDataset.collate`) or in
the project file defining an imported class or function, read without running an
analysis of that file.
"""

from __future__ import annotations

import ast
import builtins

from torchdoctor.check.analysis.interfaces import FileFacts
from torchdoctor.check.analysis.syntax import dotted, is_staticmethod
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
    own |= {n.id for n in walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if not all(_torch_made(r.value, imports) for r in walk(func) if isinstance(r, ast.Return)):
        return False
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
            if base in own:
                continue  # a method of a parameter or a local value
            if base not in imports:
                return False  # a module-level object's method (`tokenizer.pad`): unknown
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


def _torch_made(value: ast.expr | None, imports: dict[str, str]) -> bool:
    """`value` (a returned expression) is None, a torch call's result
    (`default_collate(b)`, `torch.stack(xs)`), or a tuple/list/conditional of those."""
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return True
    if isinstance(value, ast.IfExp):
        return _torch_made(value.body, imports) and _torch_made(value.orelse, imports)
    if isinstance(value, ast.Tuple | ast.List):
        return bool(value.elts) and all(_torch_made(e, imports) for e in value.elts)
    if not isinstance(value, ast.Call):
        return False
    name = dotted(value.func)
    if name is None:
        return False
    base, _, rest = name.partition(".")
    qual = imports.get(base, "")
    return f"{qual}.{rest}".startswith("torch.") if rest else qual.startswith("torch.")


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
            if method is not None and is_staticmethod(method):
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
    if method is None or not is_staticmethod(method):
        return None
    return method, other.text(method), other.ctx.imports
