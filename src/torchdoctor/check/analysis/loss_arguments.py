"""Which loss a parameter holds: the loss every call of its function passes for it.

`def train(model, loader, criterion): ... criterion(model(x), y)` with
`train(net, loader, nn.CrossEntropyLoss())` in main.py: `criterion` is a cross-entropy
loss. The project fact (`ProjectIndex.loss_arguments_for`, built on demand from the files
whose text names a torch loss) lists, per function name, the calls of it in such files
with the loss kind each passes per slot ("" for anything else). The callee's file joins
them with its own calls (TD301/TD302, rules/_loss_params.py): a kind only when every
call seen passes one, the same.
"""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.class_calls import passed_constant
from torchdoctor.check.analysis.file_loops import FileLoops, file_of
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.path_guards import (
    Cond,
    compatible,
    conditions_at,
    subjects_assigned,
)
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.context import FileContext
from torchdoctor.check.project import LossCall
from torchdoctor.check.tree_walk import statement_expressions

CROSS_ENTROPY = "cross_entropy"
NLL = "nll_loss"
BCE = "binary_cross_entropy"
BCE_LOGITS = "binary_cross_entropy_with_logits"
LOSS_FUNCTIONS = {
    "torch.nn.functional.cross_entropy": CROSS_ENTROPY,
    "torch.nn.functional.nll_loss": NLL,
    "torch.nn.functional.binary_cross_entropy": BCE,
    "torch.nn.functional.binary_cross_entropy_with_logits": BCE_LOGITS,
}
LOSS_MODULES = {
    "torch.nn.CrossEntropyLoss": CROSS_ENTROPY,
    "torch.nn.NLLLoss": NLL,
    "torch.nn.BCELoss": BCE,
    "torch.nn.BCEWithLogitsLoss": BCE_LOGITS,
}
# Text a file that builds or names a torch loss holds (the gate of the project fact).
LOSS_TEXT = (
    "CrossEntropyLoss",
    "NLLLoss",
    "BCELoss",
    "BCEWithLogitsLoss",
    "cross_entropy",
    "nll_loss",
)


# A torch loss built (`nn.CrossEntropyLoss(`) or named as a value (`F.cross_entropy,`):
# what a file that hands one to a function shows. `may_hand_losses` tries each part of
# the pattern where its name occurs (the whole is tried at every `.` of the text;
# tests/check/test_hands_loss.py: the same answers)
_LOSS_BUILT = r"(?:CrossEntropyLoss|NLLLoss|BCELoss|BCEWithLogitsLoss)\s*\("
_LOSS_VALUE = r"\.(?:cross_entropy|nll_loss|binary_cross_entropy(?:_with_logits)?)\b(?!\s*\()"
HANDS_LOSS = f"{_LOSS_BUILT}|{_LOSS_VALUE}"
_LOSS_CLASSES = ("CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss")
_CALLED = re.compile(r"\s*\(")
_FUNCTIONAL_LOSSES = (".cross_entropy", ".nll_loss", ".binary_cross_entropy")
_FUNCTIONAL_VALUE = re.compile(_LOSS_VALUE)


def names_a_loss(source: str) -> bool:
    # every word of LOSS_TEXT holds one of these three (fewer scans of the text)
    if "Loss" not in source and "cross_entropy" not in source and "nll_loss" not in source:
        return False
    return any(word in source for word in LOSS_TEXT)


def may_hand_losses(source: str) -> bool:
    """Whether the file builds a torch loss or names a functional one as a value."""
    if not names_a_loss(source):
        return False
    for name in _LOSS_CLASSES:
        at = source.find(name)
        while at >= 0:
            if _CALLED.match(source, at + len(name)):
                return True
            at = source.find(name, at + 1)
    for name in _FUNCTIONAL_LOSSES:
        at = source.find(name)
        while at >= 0:
            if _FUNCTIONAL_VALUE.match(source, at):
                return True
            at = source.find(name, at + 1)
    return False


def built_calls(fl: FileLoops, fi: FunctionInfo, key: str) -> list[ast.Call] | None:
    """The calls the name or attribute `key` is bound to in `fi` (a `self.x` in any method
    of the class, a name not bound in `fi` at module level); None when one binding is not
    a plain assignment of a call (a parameter, a loop target, `x = y`)."""
    scopes: list[FunctionInfo] = [fi]
    if key.startswith("self."):
        if fi.cls is None:
            return None
        scopes = list(fl.methods.get(fi.cls.name, {}).values())
    elif "." in key:
        return None
    elif key not in fi.local_names():
        scopes = [fl.module]
    elif key in fi.params() or key in fi.keyword_params():
        return None
    found: list[ast.Call] = []
    for scope in scopes:
        for stmt in scope.own_statements():
            targets: list[ast.expr] = []
            if isinstance(stmt, ast.Assign):
                targets = list(stmt.targets)
            elif isinstance(stmt, ast.AnnAssign | ast.AugAssign | ast.For):
                targets = [stmt.target]
            elif isinstance(stmt, ast.With):
                targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
            if not any(key == dotted(n) for t in targets for n in ast.walk(t)):
                continue
            if not (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and dotted(stmt.targets[0]) == key
                and isinstance(stmt.value, ast.Call)
            ):
                return None
            found.append(stmt.value)
    return found


def torch_loss_kind(fl: FileLoops, fi: FunctionInfo, expr: ast.expr) -> str:
    """The kind of torch loss `expr` holds in `fi` ("" when not shown): a loss module built
    there (`nn.CrossEntropyLoss()`), a name every binding of which builds one kind, or a
    functional loss passed by name (`F.cross_entropy`)."""
    ctx = fl.ctx
    if isinstance(expr, ast.Call):
        return LOSS_MODULES.get(ctx.qualname(expr.func) or "", "") or _returned_kind(fl, fi, expr)
    if not isinstance(expr, ast.Name | ast.Attribute):
        return ""
    name = ctx.qualname(expr) or ""
    if name in LOSS_FUNCTIONS:
        return LOSS_FUNCTIONS[name]
    key = dotted(expr)
    calls = built_calls(fl, fi, key) if key else None
    if not calls:
        return ""
    kinds = {torch_loss_kind(fl, fi, c) for c in calls}
    return kinds.pop() if len(kinds) == 1 else ""


def _returned_kind(fl: FileLoops, fi: FunctionInfo, call: ast.Call) -> str:
    """The loss a call of a plain function of the project returns (`make_loss("ce")`):
    every `return` it can run, given the constants the call passes for the parameters
    its `if` tests read, builds a loss of one kind."""
    found = fl.resolve(fi, call)
    if found is None or found[1] or found[0].cls is not None or found[0].is_module:
        return ""
    callee = found[0]
    if not any(word in callee.text for word in LOSS_TEXT):
        return ""  # names no loss: not a loss factory (cheap, before any walk)
    owner = file_of(callee)
    params = set(callee.params()) | set(callee.keyword_params())
    kinds: set[str] = set()
    for stmt in callee.own_statements():
        if not isinstance(stmt, ast.Return):
            continue
        conds = [c for c in conditions_at(callee.node, stmt) if c.subject in params]
        if conds and subjects_assigned(callee.node, {c.subject for c in conds}):
            return ""
        given = [
            Cond(c.subject, const.value, True)
            for c in conds
            if (const := passed_constant(callee, call, c.subject)) is not None
        ]
        if not compatible(given, conds):
            continue  # a branch the call's constants rule out
        value = stmt.value
        if not isinstance(value, ast.Call):
            return ""
        kind = LOSS_MODULES.get(owner.ctx.qualname(value.func) or "", "")
        if not kind:
            return ""
        kinds.add(kind)
    return kinds.pop() if len(kinds) == 1 else ""


def loss_calls_of_import(fl: FileLoops, name: str) -> list[LossCall]:
    """The calls in this file of the imported function `name`, with the loss kind each
    passes per slot (a position or a keyword; "" for anything else)."""
    ctx: FileContext = fl.ctx
    target = ctx.imports.get(name, "")
    if not target or target.startswith(("torch", "numpy", "os", "sys")):
        return []
    needle = f"{name}("
    found: list[LossCall] = []
    for fi in fl.all_functions():
        if needle not in fi.text or name in fi.local_names():
            continue
        for node in _own_nodes(fi):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == name
            ):
                continue
            slots = tuple(
                (str(i), torch_loss_kind(fl, fi, a))
                for i, a in enumerate(node.args)
                if not isinstance(a, ast.Starred)
            ) + tuple((k.arg, torch_loss_kind(fl, fi, k.value)) for k in node.keywords if k.arg)
            opaque = any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords
            )
            found.append(LossCall(target, ctx.path, node.lineno, fi.name, slots, opaque))
    return found


def _own_nodes(fi: FunctionInfo) -> list[ast.AST]:
    """The nodes of `fi`'s own statements (not of the defs nested in it)."""
    nodes: list[ast.AST] = []
    for stmt in fi.own_statements():
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        todo = statement_expressions(stmt)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Lambda):
                continue
            nodes.append(node)
            todo.extend(ast.iter_child_nodes(node))
    return nodes
