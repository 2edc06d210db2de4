"""What reaches a loss function: softmax, log-softmax and sigmoid outputs (TD301, TD302).

Not a rule (the leading underscore keeps the registry away): shared by the two
rules that check a loss against the activation of its input.
"""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.class_calls import project_class
from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.loss_arguments import (
    BCE,
    BCE_LOGITS,
    CROSS_ENTROPY,
    LOSS_FUNCTIONS,
    LOSS_MODULES,
    NLL,
)
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.context import FileContext
from torchdoctor.check.rules._activation_facts import (
    LOG_SOFTMAX,
    SIGMOID,
    SOFTMAX,
    assigned_calls,
)
from torchdoctor.check.rules._activations import activation
from torchdoctor.check.rules._loss_params import loss_parameters, may_hold_losses, parameter_loss
from torchdoctor.check.tree_walk import iter_children, spans_a_line, statement_expressions, walk

__all__ = [
    "BCE",
    "BCE_LOGITS",
    "CROSS_ENTROPY",
    "LOG_SOFTMAX",
    "NLL",
    "SIGMOID",
    "SOFTMAX",
    "activation",
    "built_logit_losses",
    "loss_calls",
    "loss_kind",
    "loss_name",
]

_LOSS_FUNCTION_NAMES = frozenset(LOSS_FUNCTIONS)


def loss_calls(ctx: FileContext, kinds: frozenset[str]) -> list[tuple[FunctionInfo, ast.Call, str]]:
    """Every call of a loss of one of `kinds` in the file: (function, call, kind)."""
    return [found for found in ctx.shared("loss_calls", _loss_calls) if found[2] in kinds]


def loss_origins(ctx: FileContext) -> dict[ast.Call, str]:
    """Loss call -> where its loss comes from, for a parameter called as one."""
    return ctx.shared("loss_origins", lambda _: {})


def loss_name(ctx: FileContext, call: ast.Call) -> str:
    """How messages name the loss `call` runs: `criterion` (the `nn.CrossEntropyLoss`
    that `main` passes (main.py:12))."""
    origin = loss_origins(ctx).get(call)
    text = f"`{ctx.segment(call.func)}`"
    return f"{text} ({origin})" if origin else text


def _loss_calls(ctx: FileContext) -> list[tuple[FunctionInfo, ast.Call, str]]:
    """Every call of a loss the file shows the kind of (found once for the loss rules)."""
    fl = analysis(ctx)
    # names assigned a loss module somewhere (`criterion = nn.CrossEntropyLoss()`)
    instances = (
        {m.group(1) for m in _LOSS_INSTANCE.finditer(ctx.source)}
        if "Loss(" in ctx.source
        else set()
    )
    instances |= _user_loss_instances(fl)
    # `FocalLoss(a, g)(pred, y)`: a project loss built and called at once
    built = tuple(f"{c}(" for c in built_logit_losses(ctx))
    # a loss call's text names the loss, an instance of it or an import alias of it: only
    # statements on such lines are searched for calls
    needles = (*_LOSS_WORDS, *instances, *built, *ctx.call_needles(_LOSS_FUNCTION_NAMES))
    # parameters called like a loss (`criterion(out, y)`): their callers may pass one
    param_calls = loss_parameters(fl) if may_hold_losses(ctx) else {}
    params = {p for called in param_calls.values() for p in called}
    lines = ctx.lines_holding((*needles, *(f"{p}(" for p in params)))
    found = []
    for fi in fl.all_functions():
        called = param_calls.get(fi.node, [])
        if (
            not called
            and not any(w in fi.text for w in _LOSS_WORDS)
            and not any(i in fi.text for i in instances)
            and not any(b in fi.text for b in built)
        ):
            continue
        for stmt in fi.own_statements():
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if not spans_a_line(stmt, lines):
                continue
            for node in _shallow_calls(stmt, lines):
                if isinstance(node.func, ast.Name) and node.func.id in called:
                    # a loss takes (input, target); its callers are read only where
                    # the input is an activation's output (cheaper: asked first)
                    if len(node.args) >= 2 and activation(fl, fi, node.args[0]) is not None:
                        held = parameter_loss(fl, fi, node.func.id)
                        if held is not None:
                            found.append((fi, node, held[0]))
                            loss_origins(ctx)[node] = held[1]
                    continue
                key = dotted(node.func)
                if key is not None and key.rsplit(".", 1)[-1] not in instances:
                    name = ctx.qualname(node.func) or ""
                    if name not in LOSS_FUNCTIONS:
                        continue
                kind = loss_kind(fl, fi, node)
                if kind is not None:
                    found.append((fi, node, kind))
    return found


_LOSS_WORDS = ("cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss", "BCE")
_LOSS_INSTANCE = re.compile(
    r"(\w+)\s*=\s*(?:[\w.]+\.)?(?:CrossEntropyLoss|NLLLoss|BCELoss|BCEWithLogitsLoss)\("
)


def _shallow_calls(stmt: ast.stmt, lines: list[int]) -> list[ast.Call]:
    """Calls in this statement itself (not in the statements nested in it) whose text
    spans one of `lines` (a loss call spans the line its callee is named on): the parts
    of a long statement (a table of test cases) that span none are not entered."""
    out: list[ast.Call] = []
    todo = statement_expressions(stmt)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Lambda):
            continue
        if hasattr(node, "lineno") and not spans_a_line(node, lines):  # type: ignore[arg-type]
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        todo.extend(iter_children(node))
    return out


def loss_kind(fl: FileLoops, fi: FunctionInfo, call: ast.Call) -> str | None:
    ctx = fl.ctx
    name = ctx.qualname(call.func) or ""
    if name in LOSS_FUNCTIONS:
        return LOSS_FUNCTIONS[name]
    if isinstance(call.func, ast.Call):  # `nn.BCEWithLogitsLoss()(x, y)`, `FocalLoss()(x, y)`
        kind = LOSS_MODULES.get(ctx.qualname(call.func.func) or "")
        return kind or user_loss_kind(fl, call.func.func)
    key = dotted(call.func)
    if key is None:
        return None
    kinds = {
        LOSS_MODULES.get(ctx.qualname(v.func) or "") or user_loss_kind(fl, v.func)
        for v in assigned_calls(fl, fi, key)
    }
    if len(kinds) == 1:
        return kinds.pop()
    return None


# `criterion = FocalLoss(gamma=2)`: an instance of a class (maybe a user loss)
_BUILT_CLASS = re.compile(r"=\s*((?:\w+\.)*[A-Z]\w*)\(")
# What a loss class's forward hands its input to: these take logits.
_TAKES_LOGITS = {
    "torch.nn.functional.log_softmax": CROSS_ENTROPY,
    "torch.log_softmax": CROSS_ENTROPY,
    "torch.nn.functional.cross_entropy": CROSS_ENTROPY,
    "torch.nn.functional.binary_cross_entropy_with_logits": BCE_LOGITS,
}
_TAKES_LOGITS_MODULES = {
    "torch.nn.CrossEntropyLoss": CROSS_ENTROPY,
    "torch.nn.BCEWithLogitsLoss": BCE_LOGITS,
}
_RESHAPES = frozenset({"permute", "reshape", "view", "transpose", "contiguous", "flatten", "float"})


def built_logit_losses(ctx: FileContext) -> list[str]:
    """The project's module classes whose body names a loss taking logits that this file
    calls by name (text only: the class is read when a call of it is looked at)."""
    return [c for c in ctx.project.logit_losses if f"{c}(" in ctx.source]


def _user_loss_instances(fl: FileLoops) -> set[str]:
    """Names assigned an instance of a project class that is a loss taking logits."""
    source = fl.ctx.source
    project = fl.ctx.project.module_classes
    # cheap first: the project's module classes the file builds (anchored on the call)
    built = {m.group(1) for m in _BUILT_CLASS.finditer(source)}
    losses = {c for c in built if c.rsplit(".", 1)[-1] in project and _class_kind(fl, c)}
    found = set()
    for cls in losses:
        found |= set(re.findall(rf"(\w+)\s*=\s*{re.escape(cls)}\(", source))
    return found


def user_loss_kind(fl: FileLoops, func: ast.expr) -> str | None:
    """CROSS_ENTROPY / BCE_LOGITS when `func(...)` builds a project module class whose
    `forward` hands its first input, at most reshaped, to log_softmax or cross_entropy
    (or to binary_cross_entropy_with_logits): a loss that takes logits, like
    `FocalLoss` built on `F.log_softmax(x)` + NLL."""
    name = dotted(func)
    if not name or name.rsplit(".", 1)[-1] not in fl.ctx.project.module_classes:
        return None  # not a module class of the project (cheap: before any lookup)
    return _class_kind(fl, name)


def _class_kind(fl: FileLoops, name: str) -> str | None:
    found = project_class(fl, name)
    if found is None:
        return None
    owner, cls = found
    forward = owner.methods.get(cls.name, {}).get("forward")
    if forward is None or not forward.params():
        return None
    x = forward.params()[0]
    for stmt in forward.own_statements():  # `x` keeps the input's values, reshaped at most
        if isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For) and _names(stmt.target, x):
            return None
        if (
            isinstance(stmt, ast.Assign)
            and any(_names(t, x) for t in stmt.targets)
            and (len(stmt.targets) != 1 or not _carried(owner.ctx, stmt.value, x))
        ):
            return None
    kinds = set()
    for node in walk(forward.node):
        if not isinstance(node, ast.Call):
            continue
        kind = _TAKES_LOGITS.get(owner.ctx.qualname(node.func) or "")
        arg = node.args[0] if node.args else None
        func = node.func
        if kind is None and isinstance(func, ast.Attribute) and func.attr == "log_softmax":
            kind, arg = CROSS_ENTROPY, func.value
        elif kind is None and (attr := dotted(func) or "").startswith("self."):
            # `self.ce(x, y)` with `self.ce = nn.CrossEntropyLoss()` in the class
            built = {
                _TAKES_LOGITS_MODULES.get(owner.ctx.qualname(c.func) or "")
                for c in assigned_calls(owner, forward, attr)
            }
            kind = built.pop() if len(built) == 1 else None
        if kind is not None and arg is not None and _reshaped(arg, x):
            kinds.add(kind)
    return kinds.pop() if len(kinds) == 1 else None


def _names(target: ast.expr, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in walk(target))


def _carried(ctx: FileContext, expr: ast.expr, name: str) -> bool:
    """`name`'s values, reshaped at most, or joined with others into one tensor
    (`torch.cat([1 - x, x], 1)`: the two-class form of a binary input still holds
    every value of `x` as it was)."""
    if _reshaped(expr, name):
        return True
    if not (isinstance(expr, ast.Call) and expr.args):
        return False
    if ctx.qualname(expr.func) not in ("torch.cat", "torch.stack", "torch.concat"):
        return False
    seq = expr.args[0]
    return isinstance(seq, ast.List | ast.Tuple) and any(_reshaped(e, name) for e in seq.elts)


def _reshaped(expr: ast.expr, name: str) -> bool:
    """`x`, `x.permute(...).reshape(-1, c)`: the values of `name`, reshaped at most."""
    while (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr in _RESHAPES
    ):
        expr = expr.func.value
    return isinstance(expr, ast.Name) and expr.id == name
