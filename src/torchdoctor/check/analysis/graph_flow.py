"""What carries an autograd graph on from a tensor that has one.

A function whose every `return` gives a differentiable transform of one of its
parameters (`return scores.max(dim=1)[0].mean()`: tensor methods that keep the graph,
indexing, arithmetic with other values) gives back a tensor with the graph of what it is
passed there. Anything else (`.item()`, `.detach()`, a call we do not model, a
Python number) is not such a transform: the caller's value stays unknown.
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.tree_walk import walk

FuncDef = ast.FunctionDef | ast.AsyncFunctionDef

# Tensor methods (and `torch.<name>` functions) whose result keeps the input's graph.
_KEEPS_GRAPH = frozenset(
    {
        "abs", "amax", "amin", "clamp", "clone", "contiguous", "cuda", "double", "exp",
        "flatten", "float", "half", "log", "logsumexp", "max", "mean", "min", "norm",
        "permute", "pow", "prod", "reshape", "sigmoid", "softmax", "sqrt", "squeeze",
        "std", "sum", "tanh", "to", "transpose", "unsqueeze", "var", "view",
    }
)  # fmt: skip


def graph_passing_parameter(func: FuncDef) -> int | None:
    """The position (among all positional parameters, `self` too) of the parameter every
    `return` of `func` transforms differentiably."""
    args = func.args
    params = [a.arg for a in (*args.posonlyargs, *args.args)]
    found: set[str] = set()
    returns = [n for n in walk(func) if isinstance(n, ast.Return)]
    if not returns:
        return None
    for ret in returns:
        name = _transformed(ret.value) if ret.value is not None else None
        if name is None or name not in params:
            return None
        found.add(name)
    if len(found) != 1 or _rebound(func, *found):
        return None
    return params.index(found.pop())


def _transformed(node: ast.expr) -> str | None:
    """The name `node` is a differentiable transform of."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.BinOp) and isinstance(
            node.op, ast.Add | ast.Sub | ast.Mult | ast.Div | ast.Pow
        ):
            left, right = _transformed(node.left), _transformed(node.right)
            if left is not None and right is not None and left != right:
                return None  # two tensors: which one's graph is not one name
            return left or right
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr not in _KEEPS_GRAPH:
                return None
            torch_function = dotted(node.func.value) == "torch" and node.args  # torch.mean(x)
            node = node.args[0] if torch_function else node.func.value
        else:
            return None


def _rebound(func: FuncDef, name: str) -> bool:
    """`name` is assigned in `func` (it may no longer hold the parameter)."""
    for node in walk(func):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
    return False
