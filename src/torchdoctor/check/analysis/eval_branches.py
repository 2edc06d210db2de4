"""Code of a module's method that runs only in eval mode, and the layers it runs there.

`if not self.training: ... else: raise ValueError(...)` in a method of an nn.Module
class (also the `else` of `if self.training:`, and what follows an `if self.training:`
that raises or returns) is the module's inference path: the module's own test says it
runs only after `model.eval()`. Whether gradients are off there is up to the callers;
TD202 asks this where the project it checks never turns them off.

A layer run there is a call of an attribute the class builds (`self.head = Head(...)`,
`self.mask_head = get_func(name)(...)`): every assignment of it in the class is a call's
result (or None) -- of torch.nn, of the project's own code, or of a callable the code
computes (a registry lookup) -- and the class defines no method of that name. An object
of another library (a tokenizer, a NumPy generator) is no layer.
"""

from __future__ import annotations

import ast
import os

from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk

FuncDef = ast.FunctionDef | ast.AsyncFunctionDef


def eval_only_runs(
    ctx: FileContext, cls: ast.ClassDef, method: FuncDef
) -> list[tuple[ast.Call, str, ast.If]]:
    """(call, `self.attr`, the `if` that makes it eval-only) for each layer the class
    builds that `method` runs only in eval mode, first run of each attribute only."""
    built = _built_attributes(ctx, cls)
    if not built:
        return []
    found: list[tuple[ast.Call, str, ast.If]] = []
    seen: set[str] = set()
    for test, block in _eval_only_blocks(method.body):
        for stmt in block:
            for node in walk(stmt):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                if (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "self"
                    and func.attr in built
                    and func.attr not in seen
                ):
                    seen.add(func.attr)
                    found.append((node, f"self.{func.attr}", test))
    found.sort(key=lambda f: (f[0].lineno, f[0].col_offset))
    return found


def _is_training(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Attribute)
        and test.attr == "training"
        and isinstance(test.value, ast.Name)
        and test.value.id == "self"
    )


def _ends(block: list[ast.stmt]) -> bool:
    return bool(block) and isinstance(block[-1], ast.Raise | ast.Return)


def _eval_only_blocks(body: list[ast.stmt]) -> list[tuple[ast.If, list[ast.stmt]]]:
    """The statement lists of `body` (its nested blocks too) that run only when
    `self.training` is false, each with the `if` that says so."""
    found: list[tuple[ast.If, list[ast.stmt]]] = []
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.If):
            test = stmt.test
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                if _is_training(test.operand):
                    found.append((stmt, stmt.body))
                    continue
            elif _is_training(test):
                if stmt.orelse:
                    found.append((stmt, stmt.orelse))
                elif _ends(stmt.body):
                    found.append((stmt, body[i + 1 :]))
                    break
                continue
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue  # runs when called, not here
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                found += _eval_only_blocks(inner)
    return found


def _built_attributes(ctx: FileContext, cls: ast.ClassDef) -> frozenset[str]:
    """Attributes every assignment of which in the class is a call's result (or None)
    that may be a layer."""
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    built: set[str] = set()
    other: set[str] = set()
    for node in walk(cls):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if not (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                continue
            if isinstance(value, ast.Call) and _may_build_layer(ctx, value):
                built.add(target.attr)
            elif not (isinstance(value, ast.Constant) and value.value is None):
                other.add(target.attr)
    return frozenset(built - other - methods)


def _may_build_layer(ctx: FileContext, call: ast.Call) -> bool:
    """A call that may build a layer: torch.nn's, the project's own code (defined in the
    file or imported from a package of the project), or a callable the code computes."""
    name = ctx.qualname(call.func)
    if name is None:
        return True  # `get_func(cfg.HEAD)(...)`: what a registry hands back
    if name.startswith("torch."):
        return name.startswith("torch.nn.")
    root = call.func
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name) or root.id not in ctx.imports:
        return True  # a class or builder of this file, or an object it was given
    top = name.split(".", 1)[0]
    if not top:
        return True  # a relative import: the package's own code
    return any(
        top in os.path.dirname(p).split("/") or p.endswith(f"/{top}.py") for p in ctx.project.paths
    )
