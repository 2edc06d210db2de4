"""Functions that register gradient hooks which clamp or clip each gradient.

`enable_gradient_clipping(model, limit)` in one file registers, on every parameter,
`p.register_hook(lambda grad: clamp(grad, -limit, limit))`: the hook runs while
backward computes the gradient, so under a `GradScaler` it clamps gradients still
multiplied by the scale factor. TD606 asks, in the file that calls such a function
(`ProjectIndex.clamping_hooks`, from `clamping_hooks` over the files whose text
registers a hook and mentions clamping).
"""

from __future__ import annotations

import ast
import re

from torchdoctor.check.parsed_trees import parse_kept
from torchdoctor.check.tree_walk import walk

# Callees that bound a gradient's values: `grad.clamp(...)`, `torch.clamp`, `clip_grad_value_`,
# a project helper named for it (`clamp_tensor`).
_BOUNDS = re.compile(r"clamp|clip", re.IGNORECASE)


def may_register_clamps(source: str) -> bool:
    """A cheap gate: the text registers a hook and mentions clamping or clipping."""
    return "register_hook(" in source and ("clamp" in source or "clip" in source)


def clamping_hooks(path: str, source: str) -> dict[str, str]:
    """Module-level function name -> "path:line" of the `register_hook(...)` in it whose
    hook (a lambda, or a function defined in it) calls a clamping callee."""
    try:
        tree = parse_kept(path, source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return {}
    found: dict[str, str] = {}
    for func in tree.body:
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        local = {
            node.name: node
            for node in walk(func)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node is not func
        }
        for call in walk(func):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "register_hook"
                and len(call.args) == 1
            ):
                continue
            hook: ast.AST | None = call.args[0]
            if isinstance(hook, ast.Name):
                hook = local.get(hook.id)
            if isinstance(hook, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef) and _clamps(
                hook
            ):
                found.setdefault(func.name, f"{path}:{call.lineno}")
    return found


def _clamps(hook: ast.AST) -> bool:
    for node in walk(hook):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            name = name or (node.func.id if isinstance(node.func, ast.Name) else "")
            if _BOUNDS.search(name):
                return True
    return False
