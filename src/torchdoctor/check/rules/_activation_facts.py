"""Facts the activation walk (`_activations.py`) reads off one function: the activation
vocabularies, what a name or attribute was last bound to, the `if` tests that hold at a
call, the constants a call passes, and the forward of a module class.

Not a rule (the leading underscore keeps the registry away).
"""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.file_loops import FileLoops, project_file, sibling_file
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.path_guards import Cond, conditions_at, subjects_assigned
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk

SOFTMAX = "softmax"


LOG_SOFTMAX = "log_softmax"


SIGMOID = "sigmoid"


_FUNCTIONS = {
    "torch.softmax": SOFTMAX,
    "torch.nn.functional.softmax": SOFTMAX,
    "torch.special.softmax": SOFTMAX,
    "torch.log_softmax": LOG_SOFTMAX,
    "torch.nn.functional.log_softmax": LOG_SOFTMAX,
    "torch.special.log_softmax": LOG_SOFTMAX,
    "torch.sigmoid": SIGMOID,
    "torch.nn.functional.sigmoid": SIGMOID,
    "torch.special.expit": SIGMOID,
}


_MODULES = {
    "torch.nn.Softmax": SOFTMAX,
    "torch.nn.LogSoftmax": LOG_SOFTMAX,
    "torch.nn.Sigmoid": SIGMOID,
}


_METHODS = {"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX, "sigmoid": SIGMOID}


def assigned_calls(fl: FileLoops, fi: FunctionInfo, key: str) -> list[ast.Call]:
    """The calls `key` is assigned from: in `fi`, at module level, or `self.x` in the class."""
    scopes: list[FunctionInfo] = [fi]
    if key.startswith("self.") and fi.cls is not None:
        scopes = list(fl.methods.get(fi.cls.name, {}).values())
    elif key not in fi.local_names():
        scopes = [fl.module]
    found: list[ast.Call] = []
    for scope in scopes:
        for stmt in scope.own_statements():
            if isinstance(stmt, ast.Assign) and any(dotted(t) == key for t in stmt.targets):
                value = stmt.value
                while (
                    isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Attribute)
                    and value.func.attr in ("to", "cuda", "cpu")
                ):
                    value = value.func.value
                if not isinstance(value, ast.Call):
                    return []  # assigned something we do not follow
                found.append(value)
    return found


# Tensor methods that keep the values (only their layout or dtype changes).


# Tensor methods that keep the values (only their layout or dtype changes).
_SAME_VALUES = frozenset(
    {
        "permute", "reshape", "view", "view_as", "reshape_as", "transpose", "unsqueeze",
        "squeeze", "contiguous", "flatten", "float", "double", "half", "clone", "to", "cuda",
    }
)  # fmt: skip


_EMPTY_FACTORIES = frozenset({"torch.tensor", "torch.Tensor", "torch.empty", "torch.zeros"})


def _param_conds(fi: FunctionInfo, expr: ast.AST) -> list[Cond]:
    """The tests on `fi`'s parameters (never reassigned) that hold where `expr` runs."""
    params = set(fi.params()) | set(fi.keyword_params())
    if not params:
        return []
    conds = [c for c in conditions_at(fi.node, expr) if c.subject in params]
    return [c for c in conds if not subjects_assigned(fi.node, {c.subject})]


def _self_conds(fi: FunctionInfo, expr: ast.AST) -> list[Cond]:
    """The `self.<x> == c` tests that hold where `expr` runs in `fi` (none assigned in `fi`)."""
    if fi.cls is None or "self." not in fi.text:
        return []
    conds = [c for c in conditions_at(fi.node, expr) if c.subject.startswith("self.")]
    if conds and subjects_assigned(fi.node, {c.subject for c in conds}):
        return []
    return conds


def _where(fl: FileLoops, owner: FileLoops) -> str:
    return "" if owner is fl else f" in {owner.ctx.path.rsplit('/', 1)[-1]}"


def _is_empty(call: ast.Call) -> bool:
    """`torch.tensor([])`, `torch.Tensor()`, `torch.empty(0)`, `torch.zeros(0)`."""
    if not call.args:
        return True
    first = call.args[0]
    if isinstance(first, ast.List | ast.Tuple):
        return not first.elts
    return isinstance(first, ast.Constant) and first.value == 0 and len(call.args) == 1


def _binds(stmt: ast.stmt, name: str) -> bool:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For):
        targets = [stmt.target]
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in walk(t))


_CLASS_OF = {SOFTMAX: "Softmax", LOG_SOFTMAX: "LogSoftmax", SIGMOID: "Sigmoid"}


def _module_activation(fl: FileLoops, ctor: ast.Call) -> str | None:
    name = fl.ctx.qualname(ctor.func) or ""
    if name in _MODULES:
        return _MODULES[name]
    if name == "torch.nn.Sequential" and ctor.args:
        last = ctor.args[-1]
        if isinstance(last, ast.Call):
            return _module_activation(fl, last)
    return None


def _class_forward(fl: FileLoops, cls: str) -> tuple[FileLoops, FunctionInfo] | None:
    forward = fl.methods.get(cls, {}).get("forward")
    if forward is not None:
        return fl, forward
    target = fl.ctx.imports.get(cls)
    if target and "." in target.lstrip("."):
        module, _, name = target.rpartition(".")
        other = sibling_file(fl.ctx, module)
        if other is not None:
            forward = other.methods.get(name, {}).get("forward")
            if forward is not None:
                return other, forward
        return None
    # a model a caller in another file built (`fit(Net(), ...)`): the one project file
    # that defines a class of that name
    files = fl.ctx.project.class_files.get(cls, ())
    if target is None and len(files) == 1 and cls in fl.ctx.project.module_classes:
        other = project_file(fl.ctx, files[0])
        if other is not None:
            forward = other.methods.get(cls, {}).get("forward")
            if forward is not None:
                return other, forward
    return None


def _last_binding(fi: FunctionInfo, name: str, line: int) -> ast.stmt | None:
    """The last statement above `line` that binds `name` in `fi` (None: none)."""
    last: ast.stmt | None = None
    for stmt in fi.own_statements():
        if stmt.lineno >= line or isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        binds = _binds(stmt, name) or (
            isinstance(stmt, ast.With)
            and any(
                isinstance(n, ast.Name) and n.id == name
                for i in stmt.items
                if i.optional_vars is not None
                for n in walk(i.optional_vars)
            )
        )
        if binds and (last is None or stmt.lineno >= last.lineno):
            last = stmt
    return last


def _short(ctx: FileContext, node: ast.AST) -> str:
    text = re.sub(r"\s+", " ", ctx.segment(node))
    return text if len(text) <= 50 else text[:47] + "..."


_DICT_WRITES = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"})


def str_key(node: ast.expr) -> str | None:
    """`"logits"` of `out["logits"]`: a string item, so `out` holds a dict, not a tensor."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
    return None


def is_item(node: ast.expr, name: str, key: str) -> bool:
    """`node` is `name[key]`."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
        and str_key(node) == key
    )


def item_binding(fi: FunctionInfo, name: str, key: str, line: int) -> ast.stmt | None:
    """The last statement above `line` in `fi` that binds `name` or its item `key`
    (`ret = {}`, `ret["p"] = ...`, `ret["p"], ret["q"] = pair`); None: none."""
    last: ast.stmt | None = None
    for stmt in fi.own_statements():
        if stmt.lineno >= line or isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = list(stmt.targets)
        elif isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For | ast.Delete):
            targets = list(stmt.targets) if isinstance(stmt, ast.Delete) else [stmt.target]
        hit = False
        for target in targets:
            parts = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
            for part in parts:
                if is_item(part, name, key) or (isinstance(part, ast.Name) and part.id == name):
                    hit = True
                elif (
                    isinstance(part, ast.Subscript)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == name
                    and str_key(part) is None
                ):
                    hit = True  # `ret[k] = ...`: any item, maybe this one (not understood)
                elif isinstance(part, ast.Starred | ast.Tuple | ast.List) and _binds(stmt, name):
                    hit = True
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute)
            and isinstance(stmt.value.func.value, ast.Name)
            and stmt.value.func.value.id == name
            and stmt.value.func.attr in _DICT_WRITES
        ):
            hit = True  # `ret.update(...)`: not understood
        if hit and (last is None or stmt.lineno >= last.lineno):
            last = stmt
    return last


def str_key_of(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _function_called(fl: FileLoops, fi: FunctionInfo, call: ast.Call) -> FunctionInfo | None:
    """The plain function `f(...)` runs: the file's own, or one a sibling module defines
    and this file imports (`from .utils import predict`, `utils.predict(...)`)."""
    func = call.func
    if isinstance(func, ast.Name) and func.id in fi.local_names():
        return None
    found = fl.resolve(fi, call)
    if found is None or found[1] or found[0].cls is not None:
        return None
    return found[0]
