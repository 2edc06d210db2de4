"""The loss a function's parameter holds, from the calls of the function (TD301, TD302).

`def train(model, loader, criterion): ... criterion(model(x), y)`: `criterion` is a
cross-entropy loss when every call of `train` seen (in this file, and in the project's
files that name a torch loss: `ProjectIndex.loss_arguments_for`) passes one. A call that
passes anything else, leaves the parameter out or passes `*args` / `**kwargs` leaves it
unknown: a different loss on one path makes no claim on the others.

Not a rule (the leading underscore keeps the registry away).
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.class_calls import argument_for
from torchdoctor.check.analysis.file_loops import FileLoops
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.loss_arguments import names_a_loss, torch_loss_kind
from torchdoctor.check.context import FileContext
from torchdoctor.check.rules._activation_facts import _last_binding

_LOSS_CLASS = {
    "cross_entropy": "nn.CrossEntropyLoss",
    "nll_loss": "nn.NLLLoss",
    "binary_cross_entropy": "nn.BCELoss",
    "binary_cross_entropy_with_logits": "nn.BCEWithLogitsLoss",
}


def may_hold_losses(ctx: FileContext) -> bool:
    """Whether a parameter here can be shown to hold a loss: this file names one, or
    another project file that does may call a function this one defines (by the texts)."""
    return ctx.shared("may_hold_losses", _may_hold)


def _may_hold(ctx: FileContext) -> bool:
    return names_a_loss(ctx.source) or bool(_called_from_loss_files(ctx))


def loss_parameters(fl: FileLoops) -> dict[ast.AST, list[str]]:
    """Function node -> the parameters it calls that its callers may pass a loss for:
    any function's where this file names a loss, else the top-level functions' that a
    file handing on a loss may call."""
    ctx = fl.ctx
    if names_a_loss(ctx.source):
        functions = fl.functions
    else:
        called = _called_from_loss_files(ctx)
        functions = [f for f in fl.functions if f.parent is None and f.cls is None]
        functions = [f for f in functions if f.name in called]
    found = {fi.node: called_parameters(fi) for fi in functions}
    return {node: params for node, params in found.items() if params}


def _called_from_loss_files(ctx: FileContext) -> frozenset[str]:
    """The top-level functions here that call a parameter (`criterion(`, read from the
    text first) and that a file handing on a loss may call."""
    return ctx.shared("loss_callees", _loss_callees)


def _loss_callees(ctx: FileContext) -> frozenset[str]:
    if ctx.project.loss_build is None:
        return frozenset()
    calling = []
    for stmt in ctx.tree.body:
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = stmt.args
        params = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
        if not params:
            continue
        text = ctx.segment(stmt)
        if any(f"{p}(" in text for p in params):
            calling.append(stmt.name)
    return ctx.project.loss_callees_among(calling)


def called_parameters(fi: FunctionInfo) -> list[str]:
    """Parameters `fi` calls (`criterion(`), never rebound in it."""
    if fi.is_module:
        return []
    return [
        p
        for p in (*fi.params(), *fi.keyword_params())
        if f"{p}(" in fi.text and _last_binding(fi, p, 1 << 30) is None
    ]


def parameter_loss(fl: FileLoops, fi: FunctionInfo, param: str) -> tuple[str, str] | None:
    """(kind, where) when every call of `fi` seen passes a torch loss of one kind for
    `param`; None when one passes anything else or none is seen."""
    found: list[tuple[str, str]] = []
    for caller, event in fl.callers(fi):
        call = event.node
        if not isinstance(call, ast.Call):
            return None
        arg = argument_for(fi, call, param)
        kind = torch_loss_kind(fl, caller, arg) if arg is not None else ""
        if not kind:
            return None
        found.append((kind, f"that `{caller.name}` passes, line {call.lineno}"))
    if fi.parent is None and fi.cls is None:
        params = fi.params()
        slot = str(params.index(param)) if param in params else None
        for other in fl.ctx.project.loss_arguments_for(fi.name, fl.ctx.path):
            if other.opaque:
                return None
            slots = dict(other.slots)
            kind = slots.get(param, "") or (slots.get(slot, "") if slot is not None else "")
            if not kind:
                return None
            where = other.path.replace("\\", "/").rsplit("/", 1)[-1]
            found.append((kind, f"that `{other.caller}` passes, {where}:{other.line}"))
    kinds = {kind for kind, _ in found}
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    return kind, f"the `{_LOSS_CLASS[kind]}` {found[0][1]}"
