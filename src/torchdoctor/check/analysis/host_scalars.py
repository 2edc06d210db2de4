"""Whether a tensor expression ends as a Python number on the host.

`acc = torch.sum(pred == y).type(torch.FloatTensor) / y.size(0)` then only
`print("%.2f" % acc)`, or `total += torch.mean(eq.type(torch.FloatTensor)).item()`:
whatever device the tensor was on, its value leaves torch as a number for printing or
summing, so moving it to the CPU on the way can neither meet a device tensor nor slow
any later tensor work. Followed upward from the expression through reductions
(`torch.mean`, `.sum()`), arithmetic with sizes and literals, and one assignment to a
name whose every later use in the scope is printed, formatted or converted.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk

# Methods and functions that reduce a tensor to a smaller tensor where it is.
_REDUCING_METHODS = frozenset({"mean", "sum", "float", "double", "max", "min", "all", "any"})
_REDUCING_FUNCTIONS = frozenset({"torch.mean", "torch.sum"})
# What turns a (one-element) tensor into a Python value, or only shows it.
_TO_HOST_METHODS = frozenset({"item", "tolist"})
_TO_HOST_FUNCTIONS = frozenset({"float", "int", "round", "str", "print", "format"})
# Operands that are Python numbers: a literal, `len(x)`, `x.size(0)`, `x.numel()`.
_SIZE_METHODS = frozenset({"size", "numel", "dim"})
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)


def ends_on_host(ctx: FileContext, node: ast.expr, ancestors: Sequence[ast.AST]) -> bool:
    """`node` (with `ancestors`, nearest last) only ever becomes a host number."""
    for parent in reversed(ancestors):
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue  # a method of it: decided at the call below
        if isinstance(parent, ast.Call):
            func = parent.func
            if isinstance(func, ast.Attribute) and func.value is node:
                if func.attr in _TO_HOST_METHODS:
                    return True
                if func.attr not in _REDUCING_METHODS or parent.args:
                    return False
            elif node in parent.args:
                name = ctx.call_name(parent) or ""
                if name in _TO_HOST_FUNCTIONS:
                    return True
                if name not in _REDUCING_FUNCTIONS or len(parent.args) != 1:
                    return False
            else:
                return False
        elif isinstance(parent, ast.BinOp):
            other = parent.right if parent.left is node else parent.left
            if not _a_number(other):
                return False
        elif isinstance(parent, ast.Assign):
            target = parent.targets[0] if len(parent.targets) == 1 else None
            if not isinstance(target, ast.Name):
                return False
            scope = next((a for a in reversed(ancestors) if isinstance(a, _SCOPES)), ctx.tree)
            return _only_shown(scope, target.id, parent)
        else:
            return False
        node = parent  # type: ignore[assignment]  # an expression: see the branches above
    return False


def _a_number(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id == "len"
        return isinstance(func, ast.Attribute) and func.attr in _SIZE_METHODS
    return False


def _only_shown(scope: ast.AST, name: str, assign: ast.Assign) -> bool:
    """Every other use of `name` in `scope` prints, formats or converts it, and nothing
    else binds it (a rebinding elsewhere could be a tensor used as one)."""
    for node in walk(scope):
        if node is assign:
            continue
        for child in ast.iter_child_nodes(node):
            if not (isinstance(child, ast.Name) and child.id == name):
                continue
            if isinstance(child.ctx, ast.Store | ast.Del) or not _shows(node, child):
                return False
    return True


def _shows(parent: ast.AST, use: ast.Name) -> bool:
    """`use` is printed or converted by `parent`: `print(x)`, `float(x)`, `f"{x}"`,
    `"%.2f" % x`, `"{}".format(x)`, `x.item()`."""
    if isinstance(parent, ast.FormattedValue):
        return True
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod):
        return isinstance(parent.left, ast.Constant) and isinstance(parent.left.value, str)
    if isinstance(parent, ast.Tuple):
        return False  # `"%d %f" % (a, x)`: not followed
    if isinstance(parent, ast.Call) and use in parent.args:
        func = parent.func
        if isinstance(func, ast.Name):
            return func.id in _TO_HOST_FUNCTIONS
        return isinstance(func, ast.Attribute) and func.attr == "format"
    if isinstance(parent, ast.Attribute):
        return parent.attr in _TO_HOST_METHODS
    return False
