from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.events import (
    BACKWARD,
    SCALER_STEP,
    STEP,
    Event,
    counter_condition,
    is_accumulation,
    unconditional_in,
)
from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.names import is_torch_file
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

_ACCELERATOR_ACCUMULATES = re.compile(r"Accelerator\([^)]*gradient_accumulation_steps\s*=")
_SUM_REDUCTION = re.compile(r"reduction\s*=\s*['\"]sum['\"]|size_average\s*=\s*False")


class AccumulationNotScaled(Rule):
    """Gradient accumulation over k steps with a loss that is not divided by k.

    ## What it does
    Finds gradient accumulation -- `backward()` on every pass of a loop and
    `optimizer.step()` only every k passes (`if (i + 1) % accum == 0:`), or
    `backward()` inside a `for micro in range(accum):` loop with the step after
    it -- where the loss given to `backward()` is never divided (or multiplied by a
    factor) anywhere on its way. Losses built with `reduction="sum"` are left alone.

    ## Why is this bad?
    Gradients add up over the k backward passes. A mean-reduced loss gives the
    gradient of the *average* over one micro-batch; summing k of them gives k
    times the gradient of the average over the whole effective batch. Every step
    is therefore k times too large: with `accum = 8` and `lr = 1e-3` the model
    trains as if `lr = 8e-3`, which with Adam-style warmup schedules tuned for the
    large batch usually diverges or lands on a worse optimum, and any gradient
    clipping threshold is hit k times more often.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## References
    - https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-accumulation
    - https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation
    """

    code = "TD214"
    name = "accumulation-not-scaled"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("backward",)

    def finish(self) -> None:
        if not is_torch_file(self.ctx.source):
            return
        fl = analysis(self.ctx)
        for fi in fl.all_functions():
            text = fi.text
            if (
                "backward" not in text
                or ".step(" not in text
                or ("%" not in text and "range(" not in text)
            ):
                continue
            if _SUM_REDUCTION.search(text):
                continue
            accelerate_divides = bool(_ACCELERATOR_ACCUMULATES.search(self.ctx.source))
            # a helper's backward(): it may scale the loss itself (`loss *= 1 / k` inside)
            events = [e for e in fl.events(fi) if e.via is None]
            reported: set[int] = set()
            for step in events:
                if step.kind not in (STEP, SCALER_STEP):
                    continue
                for backward, k in self._accumulations(events, step):
                    if id(backward.node) in reported or backward.expr is None:
                        continue
                    if (
                        accelerate_divides
                        and backward.subject
                        and "accelerator" in backward.subject
                    ):
                        continue  # Accelerator(gradient_accumulation_steps=k) divides by k
                    if _scaled(fi, backward, k):
                        continue
                    reported.add(id(backward.node))
                    loss = ast.unparse(backward.expr)
                    self.report(
                        backward.node,
                        f"`{self.ctx.segment(backward.node)}` at line {backward.line} runs on "
                        f"every pass but `{self.ctx.segment(step.node)}` at line {step.line} "
                        f"only every `{k}`: the summed gradient of {k} mean losses makes each "
                        f"step `{k}` times too large",
                        hint=f"divide the loss by `{k}` before backward(): "
                        f"`({loss} / {k}).backward()`",
                    )

    def _accumulations(self, events: list[Event], step: Event) -> list[tuple[Event, str]]:
        found: list[tuple[Event, str]] = []
        # backward every pass, step under `if (i + 1) % k == 0:`
        for loop in reversed(step.loops()):
            counter = counter_condition(step, loop)
            if counter is None:
                continue
            if not is_accumulation(events, step, loop):
                break  # a GAN critic schedule, or a step with its own backward
            k = ast.unparse(counter.right)
            found.extend((e, k) for e in events if e.kind == BACKWARD and unconditional_in(e, loop))
            break
        # for micro in range(k): ... backward()   then step() after that loop
        for backward in events:
            if backward.kind != BACKWARD or backward.order > step.order:
                continue
            for inner in backward.loops():
                if step.in_loop(inner) or not isinstance(inner, ast.For):
                    continue
                count = _range_count(inner)
                if count is None or not unconditional_in(backward, inner):
                    continue
                if any(e.kind in (STEP, SCALER_STEP) and e.in_loop(inner) for e in events):
                    continue
                found.append((backward, count))
        return found


def _range_count(loop: ast.For) -> str | None:
    """`k` for `for _ in range(k)` with k not a literal."""
    it = loop.iter
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "range"
        and len(it.args) == 1
        and not isinstance(it.args[0], ast.Constant)
    ):
        return ast.unparse(it.args[0])
    return None


def _scaled(fi: FunctionInfo, backward: Event, k: str) -> bool:
    """Whether the loss reaching backward() was divided / multiplied by something."""
    expr = backward.expr
    assert expr is not None
    if _has_scaling(expr):
        return True
    key = dotted(expr)
    if key is None:
        return True  # a call or subscript we cannot follow
    head = key.split(".", 1)[0]
    loops = backward.loops()
    scope: list[ast.stmt] = list(loops[-1].body) if loops else list(fi.body)  # type: ignore[attr-defined]
    for stmt in _statements(scope):
        if stmt.lineno > backward.line:
            continue
        if isinstance(stmt, ast.AugAssign) and dotted(stmt.target) in (key, head):
            if isinstance(stmt.op, ast.Div | ast.Mult | ast.FloorDiv):
                return True
        elif (
            isinstance(stmt, ast.Assign)
            and any(dotted(t) in (key, head) or _binds(t, head) for t in stmt.targets)
            and (_has_scaling(stmt.value) or k in ast.unparse(stmt.value))
        ):
            return True
    return False


def _statements(stmts: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    todo = list(stmts)
    while todo:
        stmt = todo.pop()
        out.append(stmt)
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for name in ("body", "orelse", "finalbody"):
                todo.extend(getattr(stmt, name, []) or [])
            for holder in getattr(stmt, "handlers", []) or []:
                todo.extend(holder.body)
    return out


def _binds(target: ast.expr, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in walk(target))


def _has_scaling(expr: ast.AST) -> bool:
    for node in walk(expr):
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Div | ast.FloorDiv):
                return True
            if isinstance(node.op, ast.Mult) and not (
                isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant)
            ):
                return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("div", "div_", "mul", "mul_", "true_divide")
        ):
            return True
    return False
