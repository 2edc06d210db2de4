"""Whether a `model.train()` inside evaluation code is there on purpose.

Monte-Carlo dropout sets training mode and then samples the model several times over the
same input; a function serving both phases picks the mode from a flag (`if train:
model.train()`). A `model.train()` that overrides the function's own `model.eval()` and
runs unconditionally right before a single run per batch shows neither intent: it is a
line copied from the training loop.
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.tree_walk import walk

_BRANCHES = (ast.If, ast.Match, ast.IfExp, ast.Try)
_REPEATS = (
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def train_on_purpose(
    function: ast.AST, region: ast.AST, train: ast.AST, forward: ast.AST, key: str
) -> bool:
    """`train` (a `key.train()` inside the evaluation `region`) is deliberate unless the
    code shows otherwise: `function` set `key` to eval mode before it, no branch chooses
    the mode (every `if` around the train() also holds the run), and the run is not
    repeated after one train() (no loop or comprehension around the run alone)."""
    to_train = _path(region, train)
    to_forward = _path(region, forward)
    if to_train is None or to_forward is None:
        return True
    for step in to_train:
        if isinstance(step[0], _BRANCHES) and step not in to_forward:
            return True  # `if training: model.train()`: a flag picks the mode
    for step in to_forward:
        if isinstance(step[0], _REPEATS) and step not in to_train:
            return True  # sampled again and again after one train(): MC dropout
    line = getattr(train, "lineno", 0)
    return not any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "eval"
        and not node.args
        and dotted(node.func.value) == key
        and node.lineno < line
        for node in walk(function)
    )


def _path(root: ast.AST, target: ast.AST) -> list[tuple[ast.AST, str]] | None:
    """The (node, field) steps from `root` down to `target`; None if it is not inside."""
    stack: list[tuple[ast.AST, list[tuple[ast.AST, str]]]] = [(root, [])]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, ast.AST):
                    stack.append((child, [*path, (node, field)]))
    return None


def flag_phases(
    function: ast.FunctionDef | ast.AsyncFunctionDef, train: ast.AST, evaluate: ast.AST
) -> tuple[ast.If, str] | None:
    """`if is_train: model.train() else: model.eval()` in a function that serves both
    phases: the `if` and the label of its training side, when the test reads only
    parameters the function never rebinds (the same on every pass of any loop)."""
    params = {a.arg for a in (*function.args.posonlyargs, *function.args.args)}
    params |= {a.arg for a in function.args.kwonlyargs}
    for node in walk(function):
        if not isinstance(node, ast.If):
            continue
        for side, other in (("body", "orelse"), ("orelse", "body")):
            if _holds(getattr(node, side), train) and _holds(getattr(node, other), evaluate):
                names = {n.id for n in walk(node.test) if isinstance(n, ast.Name)}
                if not names or not names <= params or _rebinds(function, names):
                    return None
                if any(isinstance(n, ast.Call) for n in walk(node.test)):
                    return None
                return node, side
    return None


def same_side(branch_node: ast.AST, label: str, phases: tuple[ast.If, str]) -> bool:
    """`branch_node` (an `if` around an event, entered through `label`) tests what the
    phase `if` tests and leads to the same side."""
    test, side = phases
    return (
        isinstance(branch_node, ast.If)
        and ast.unparse(branch_node.test) == ast.unparse(test.test)
        and label == side
    )


def _holds(block: list[ast.stmt], target: ast.AST) -> bool:
    return any(node is target for stmt in block for node in walk(stmt))


def _rebinds(function: ast.AST, names: set[str]) -> bool:
    for node in walk(function):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.NamedExpr):
            targets = [node.target]
        if any(isinstance(n, ast.Name) and n.id in names for t in targets for n in walk(t)):
            return True
    return False
