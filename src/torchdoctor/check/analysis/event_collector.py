"""Collecting a function's training-loop events in program order."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.events import (
    BACKWARD,
    CALL,
    CLIP,
    SCALER_STEP,
    SCALER_UPDATE,
    STEP,
    UNSCALE,
    ZERO,
    Branch,
    Event,
)
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import (
    is_no_grad_decorated,
    post_order_calls,
    with_item_context,
)
from torchdoctor.check.analysis.mode_state import LoopFacts
from torchdoctor.check.analysis.names import LoopNode, is_optimizerish, is_scalerish
from torchdoctor.check.analysis.syntax import dotted, last_part
from torchdoctor.check.context import (
    FileContext,
)

if TYPE_CHECKING:
    pass


def classify_call(ctx: FileContext, call: ast.Call) -> tuple[str, dict[str, object]]:
    """(kind, details) of a call that matters to training loops; kind CALL otherwise."""
    func = call.func
    if isinstance(func, ast.Attribute):
        attr = func.attr
        owner = dotted(func.value)
        if attr == "backward":
            if len(call.args) > 1:
                return CALL, {}  # Function.backward(ctx, grad): a definition's helper
            if owner is not None and (
                (last_part(owner) in ("accelerator", "fabric", "self") and call.args)
                or owner.endswith(("accelerator", "fabric"))
            ):
                return BACKWARD, {"expr": call.args[0] if call.args else None, "subject": owner}
            if owner == "torch.autograd" and call.args:
                return BACKWARD, {"expr": call.args[0]}
            if call.args and owner is not None and not call.keywords:
                # engine.backward(loss) (DeepSpeed-style) -- still a backward of that loss
                return BACKWARD, {"expr": call.args[0], "subject": owner}
            loss = func.value
            scaler = None
            if (
                isinstance(loss, ast.Call)
                and isinstance(loss.func, ast.Attribute)
                and loss.func.attr == "scale"
                and len(loss.args) == 1
            ):
                scaler = dotted(loss.func.value)
                loss = loss.args[0]
            return BACKWARD, {"expr": loss, "scaler": scaler}
        if attr == "manual_backward" and call.args:
            return BACKWARD, {"expr": call.args[0]}
        if attr == "zero_grad":
            return ZERO, {"subject": owner}
        if owner is not None and attr == "zero_" and owner.endswith((".grad", ".grad.data")):
            return ZERO, {"subject": None}
        if attr == "step" and owner is not None:
            if is_scalerish(owner) and call.args:
                return SCALER_STEP, {"subject": owner, "target": dotted(call.args[0])}
            if is_optimizerish(owner) and len(call.args) <= 1:
                return STEP, {"subject": owner}
            return CALL, {}
        if attr == "update" and owner is not None and is_scalerish(owner) and not call.args:
            return SCALER_UPDATE, {"subject": owner}
        if attr == "unscale_" and owner is not None:
            return UNSCALE, {
                "subject": owner,
                "target": dotted(call.args[0]) if call.args else None,
            }
        if attr in ("clip_grad_norm_", "clip_grad_value_"):
            if owner is not None and last_part(owner) in ("accelerator", "fabric"):
                return CALL, {}  # these unscale first themselves
            return CLIP, {}
    else:
        name = ctx.qualname(func) or ""
        if name in ("torch.autograd.backward", "backward") and call.args:
            return BACKWARD, {"expr": call.args[0]}
        if name.endswith(
            ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "dispatch_clip_grad")
        ):
            return CLIP, {}
    return CALL, {}


class _EventCollector:
    """One syntactic pass over a function collecting events with their context."""

    def __init__(self, fl: LoopFacts, fi: FunctionInfo) -> None:
        self.fl = fl
        self.ctx = fl.ctx
        self.fi = fi
        self.events: list[Event] = []
        self.autocast_names = fl.autocast_names()
        # calls of this file's functions that run backward() on what they are given
        self.helpers = "backward(" in self.ctx.source

    def _helper_backward(
        self, call: ast.Call, kind: str, info: dict[str, object]
    ) -> tuple[str, dict[str, object]]:
        """`self._backward(loss, opt)` whose body runs `loss.backward()`: a backward of the
        argument here (the training loop is split across the two functions)."""
        resolved = self.fl.resolve(self.fi, call, other_files=False)
        if resolved is None or resolved[0] is self.fi:
            return kind, info
        callee = resolved[0]
        wanted = self.fl.backward_params(callee)
        if not wanted:
            return kind, info
        for name, arg in zip(callee.params(), call.args, strict=False):
            if isinstance(arg, ast.Starred):
                break
            if name in wanted:
                return BACKWARD, {"expr": arg, "via": callee.label}
        for kw in call.keywords:
            if kw.arg in wanted:
                return BACKWARD, {"expr": kw.value, "via": callee.label}
        return kind, info

    def run(self) -> list[Event]:
        no_grad = not self.fi.is_module and is_no_grad_decorated(self.ctx, self.fi.node)  # type: ignore[arg-type]
        self._block(self.fi.body, (), no_grad, None)
        self.events.sort(key=lambda e: e.order)
        return self.events

    def _block(
        self,
        stmts: list[ast.stmt],
        chain: tuple[Branch, ...],
        no_grad: bool,
        autocast: ast.AST | None,
    ) -> None:
        if (
            chain
            and not isinstance(chain[-1].node, LoopNode)
            and any(isinstance(s, _JUMPS) for s in stmts)
        ):
            last = chain[-1]
            chain = (*chain[:-1], Branch(last.node, last.label, True))
        for stmt in stmts:
            self._stmt(stmt, chain, no_grad, autocast)

    def _exprs(
        self,
        nodes: Iterable[ast.AST | None],
        chain: tuple[Branch, ...],
        no_grad: bool,
        autocast: ast.AST | None,
    ) -> None:
        for node in nodes:
            if node is None:
                continue
            for call in post_order_calls(node):
                kind, info = classify_call(self.ctx, call)
                if kind == CALL and self.helpers:
                    kind, info = self._helper_backward(call, kind, info)
                self.events.append(
                    Event(
                        kind,
                        call,
                        chain,
                        subject=info.get("subject"),  # type: ignore[arg-type]
                        expr=info.get("expr"),  # type: ignore[arg-type]
                        scaler=info.get("scaler"),  # type: ignore[arg-type]
                        target=info.get("target"),  # type: ignore[arg-type]
                        no_grad=no_grad,
                        autocast=autocast,
                        via=info.get("via"),  # type: ignore[arg-type]
                    )
                )

    def _stmt(
        self, stmt: ast.stmt, chain: tuple[Branch, ...], no_grad: bool, autocast: ast.AST | None
    ) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(stmt, ast.If):
            self._exprs([stmt.test], chain, no_grad, autocast)
            self._block(stmt.body, (*chain, Branch(stmt, "body")), no_grad, autocast)
            self._block(stmt.orelse, (*chain, Branch(stmt, "orelse")), no_grad, autocast)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            self._exprs([stmt.iter], chain, no_grad, autocast)
            self._block(stmt.body, (*chain, Branch(stmt, "body")), no_grad, autocast)
            self._block(stmt.orelse, (*chain, Branch(stmt, "orelse")), no_grad, autocast)
        elif isinstance(stmt, ast.While):
            inner = (*chain, Branch(stmt, "body"))
            self._exprs([stmt.test], inner, no_grad, autocast)
            self._block(stmt.body, inner, no_grad, autocast)
            self._block(stmt.orelse, (*chain, Branch(stmt, "orelse")), no_grad, autocast)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            self._exprs([i.context_expr for i in stmt.items], chain, no_grad, autocast)
            inner_no_grad, inner_autocast = no_grad, autocast
            for item in stmt.items:
                gc = with_item_context(self.ctx, item.context_expr, self.autocast_names)
                if gc.no_grad:
                    inner_no_grad = True
                elif gc.grad_switch:
                    inner_no_grad = False
                if gc.autocast:
                    inner_autocast = stmt
                elif gc.autocast_off:
                    inner_autocast = None
            self._block(stmt.body, (*chain, Branch(stmt, "body")), inner_no_grad, inner_autocast)
        elif _is_try(stmt):
            body, handlers, orelse, finalbody = _try_parts(stmt)
            self._block(body, (*chain, Branch(stmt, "body")), no_grad, autocast)
            for i, handler in enumerate(handlers):
                self._block(handler.body, (*chain, Branch(stmt, f"handler{i}")), no_grad, autocast)
            self._block(orelse, (*chain, Branch(stmt, "orelse")), no_grad, autocast)
            self._block(finalbody, (*chain, Branch(stmt, "finalbody")), no_grad, autocast)
        elif isinstance(stmt, ast.Match):
            self._exprs([stmt.subject], chain, no_grad, autocast)
            for i, case in enumerate(stmt.cases):
                self._block(case.body, (*chain, Branch(stmt, f"case{i}")), no_grad, autocast)
        else:
            self._exprs([stmt], chain, no_grad, autocast)
            if _sets_grad_none(stmt):
                self.events.append(Event(ZERO, stmt, chain, no_grad=no_grad, autocast=autocast))


_JUMPS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _is_try(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar"


def _try_parts(
    stmt: ast.stmt,
) -> tuple[list[ast.stmt], list[ast.ExceptHandler], list[ast.stmt], list[ast.stmt]]:
    """body, handlers, orelse, finalbody of a `try` (or `try`/`except*`)."""
    return (
        getattr(stmt, "body", []),
        getattr(stmt, "handlers", []),
        getattr(stmt, "orelse", []),
        getattr(stmt, "finalbody", []),
    )


def _sets_grad_none(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Assign):
        return any(
            isinstance(t, ast.Attribute) and t.attr == "grad" for t in stmt.targets
        ) and isinstance(stmt.value, ast.Constant)
    if isinstance(stmt, ast.Delete):
        return any(isinstance(t, ast.Attribute) and t.attr == "grad" for t in stmt.targets)
    return False
