from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.events import (
    BACKWARD,
    SCALER_STEP,
    STEP,
    ZERO,
    Event,
    can_follow,
    counter_condition,
    is_accumulation,
    unconditional_in,
    zero_passes,
)
from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.inline_events import inlined_events
from torchdoctor.check.analysis.names import is_torch_file
from torchdoctor.check.rule import Rule, Severity


class ZeroGradMisplaced(Rule):
    """`zero_grad()` between `backward()` and `step()`, or inside a gradient-accumulation loop.

    ## What it does
    Finds `zero_grad()` calls that throw away gradients before the optimizer uses
    them:

    - between `loss.backward()` and `optimizer.step()` for the same optimizer (or
      the model it optimizes), so the step sees zero gradients;
    - on every pass of a loop that only steps every k passes
      (`if (i + 1) % accum == 0: optimizer.step()`), or inside the micro-batch loop
      of an accumulation (`for micro in range(k): optimizer.zero_grad(); ...backward()`
      with the step after the loop), so nothing is accumulated;
    - on the stepping pass of an accumulation, before that pass's `backward()`
      (`if (i + 1) % k == 0: optimizer.zero_grad()` ahead of the backward, with the
      step under the same test), so each step uses one batch. The loop is read with
      the methods of the file it calls in place, so a training step split into
      `self._start_update()`, `self._backward(loss)` and `self._finish_update()` is
      understood; the report goes to the call in the loop.

    GAN loops with two optimizers are understood: `netG.zero_grad()` between the
    discriminator's `backward()` and `optimizerD.step()` is fine.

    ## Why is this bad?
    In the first case every update is zero (with `set_to_none=True`, the optimizer
    skips every parameter): the model never changes, and the loss stays flat while
    the training loop runs normally. With momentum or Adam, old state may still
    move the weights a little, which hides the problem. In the accumulation case
    only the last of every k micro-batches contributes, so the effective batch is
    k times smaller than configured and k-1 of every k forward/backward passes are
    wasted compute.

    ## Example
    ```python
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    ```

    ## Use instead
    ```python
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html
    - https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-accumulation
    """

    code = "TD205"
    name = "zero-grad-misplaced"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("zero_grad",)

    def finish(self) -> None:
        if not is_torch_file(self.ctx.source):
            return
        fl = analysis(self.ctx)
        split = "zero_grad" in self.ctx.source and "%" in self.ctx.source
        split_reported: set[int] = set()
        for fi in fl.all_functions():
            text = fi.text
            if split and "%" in text and ("for " in text or "while " in text):
                self._split_loop(fl, fi, split_reported)
            if "backward" not in text or "zero_grad" not in text:
                continue
            events = fl.events(fi)
            reported: set[int] = set()
            steps = [e for e in events if e.kind in (STEP, SCALER_STEP)]
            optimizers = {_optimizer_of(e) for e in steps} - {None}
            for step in steps:
                for zero, message in self._between(fi, events, step, optimizers):
                    if id(zero.node) not in reported:
                        reported.add(id(zero.node))
                        self.report(
                            zero.node,
                            message,
                            hint="zero the gradients before "
                            "`backward()` (or right after `step()`), never in between",
                        )
                for zero, message in self._accumulation(events, step, optimizers):
                    if id(zero.node) not in reported:
                        reported.add(id(zero.node))
                        self.report(
                            zero.node,
                            message,
                            hint="zero the gradients right after "
                            "the conditional `step()`, inside the same `if`",
                        )

    def _split_loop(self, fl: FileLoops, fi: FunctionInfo, reported: set[int]) -> None:
        """An accumulation loop whose zeroing runs on the stepping pass before that pass's
        backward(), read with the methods it calls in place (`self._start_update()` under
        `if (i + 1) % k == 0`, then `self.run_batch()`, then `self._finish_update()`)."""
        flat = inlined_events(fl, fi)
        if not any(e.kind == ZERO for e in flat):
            return
        steps = [e for e in flat if e.kind in (STEP, SCALER_STEP)]
        optimizers = {_optimizer_of(e) for e in steps} - {None}
        for step in steps:
            for zero, message in self._on_step_pass(fi, flat, step, optimizers):
                node = zero.site if zero.site is not None else zero.node
                if id(node) in reported:
                    continue
                reported.add(id(node))
                self.report(
                    node,
                    message,
                    hint="zero the gradients right after the conditional `step()` (or on "
                    "the first pass of each window), never before that pass's backward()",
                )

    def _on_step_pass(
        self, fi: FunctionInfo, events: list[Event], step: Event, optimizers: set[str | None]
    ) -> list[tuple[Event, str]]:
        optimizer = _optimizer_of(step)
        if optimizer is None:
            return []
        found: list[tuple[Event, str]] = []
        for loop in reversed(step.loops()):
            counters = zero_passes(step, loop)
            if not counters:
                continue
            for zero in events:
                if zero.kind != ZERO or not zero.in_loop(loop) or zero.order >= step.order:
                    continue
                if not self._zeroes_optimizer(fi, zero, optimizer, optimizers):
                    continue
                same = counters & zero_passes(zero, loop)
                if not same:
                    continue
                backward = next(
                    (
                        e
                        for e in events
                        if e.kind == BACKWARD
                        and zero.order < e.order < step.order
                        and unconditional_in(e, loop)
                    ),
                    None,
                )
                if backward is None:
                    continue
                counter = sorted(same)[0]
                found.append(
                    (
                        zero,
                        f"`{self.ctx.segment(zero.site or zero.node)}` at line "
                        f"{(zero.site or zero.node).lineno} zeroes the gradients on the pass where "  # type: ignore[attr-defined]
                        f"`{counter} == 0`, before that pass's "
                        f"`{self.ctx.segment(backward.node)}` and the "
                        f"`{self.ctx.segment(step.node)}` at line {step.line}: the gradients "
                        "the other passes accumulated are thrown away, so each step uses one "
                        "batch",
                    )
                )
            break
        return found

    def _between(
        self, fi: FunctionInfo, events: list[Event], step: Event, optimizers: set[str | None]
    ) -> list[tuple[Event, str]]:
        optimizer = _optimizer_of(step)
        backwards = [e for e in events if e.kind == BACKWARD and can_follow(e, step)]
        if not backwards or optimizer is None:
            return []
        last = backwards[-1]
        found = []
        for zero in events:
            if zero.kind != ZERO or not (can_follow(last, zero) and can_follow(zero, step)):
                continue
            if not self._zeroes_optimizer(fi, zero, optimizer, optimizers):
                continue
            found.append(
                (
                    zero,
                    f"`{self.ctx.segment(zero.node)}` at line {zero.line} clears the gradients "
                    f"that `{self.ctx.segment(last.node)}` at line {last.line} just computed, "
                    f"before `{self.ctx.segment(step.node)}` at line {step.line} uses them: "
                    "every update is zero",
                )
            )
        return found

    def _zeroes_optimizer(
        self, fi: FunctionInfo, zero: Event, optimizer: str, optimizers: set[str | None]
    ) -> bool:
        subject = zero.subject
        if subject is None:  # p.grad = None: which parameters? only sure with one optimizer
            return len(optimizers) == 1 and isinstance(zero.node, ast.Call)
        if subject == optimizer:
            return True
        if subject in optimizers:
            return False  # another optimizer's zero_grad (GAN loops)
        # model.zero_grad(): the model this optimizer was built on, or the only optimizer
        built_on = re.search(
            re.escape(optimizer) + r"\s*=\s*[\w.]+\(\s*" + re.escape(subject) + r"\.parameters\(",
            self.ctx.source,
        )
        if built_on:
            return True
        other = any(
            re.search(
                re.escape(o) + r"\s*=\s*[\w.]+\(\s*" + re.escape(subject) + r"\.parameters\(",
                self.ctx.source,
            )
            for o in optimizers
            if o and o != optimizer
        )
        return not other and len(optimizers) == 1

    def _accumulation(
        self, events: list[Event], step: Event, optimizers: set[str | None]
    ) -> list[tuple[Event, str]]:
        optimizer = _optimizer_of(step)
        found: list[tuple[Event, str]] = []
        for loop in reversed(step.loops()):
            counter = counter_condition(step, loop)
            if counter is None:
                continue
            if not is_accumulation(events, step, loop):
                break
            for zero in events:
                if zero.kind != ZERO or not unconditional_in(zero, loop):
                    continue
                if zero.subject not in (optimizer, None) and zero.subject in optimizers:
                    continue
                if zero.subject is None and not isinstance(zero.node, ast.Call):
                    continue
                k = ast.unparse(counter.right)
                found.append(
                    (
                        zero,
                        f"`{self.ctx.segment(zero.node)}` at line {zero.line} runs on every "
                        f"pass of the loop at line {loop.lineno}, but "  # type: ignore[attr-defined]
                        f"`{self.ctx.segment(step.node)}` at line {step.line} only every `{k}`"
                        f" passes: the gradients of the other passes are thrown away, so "
                        "nothing is accumulated",
                    )
                )
            break
        # for micro in range(k): zero_grad(); backward()  -- then step() after that loop
        for zero in events:
            if zero.kind != ZERO or zero.subject not in (optimizer, None):
                continue
            for inner in zero.loops():
                if not unconditional_in(zero, inner) or any(
                    e.kind in (STEP, SCALER_STEP) and e.in_loop(inner) for e in events
                ):
                    continue
                if not any(
                    e.kind == BACKWARD and e.in_loop(inner) and e.order > zero.order for e in events
                ):
                    continue
                if not can_follow(zero, step):
                    continue
                found.append(
                    (
                        zero,
                        f"`{self.ctx.segment(zero.node)}` at line {zero.line} runs on every "
                        f"pass of the loop at line {inner.lineno}, whose gradients "  # type: ignore[attr-defined]
                        f"`{self.ctx.segment(step.node)}` at line {step.line} applies only "
                        "after the loop: only the last pass's gradients are used",
                    )
                )
                break
        return found


def _optimizer_of(step: Event) -> str | None:
    return step.subject if step.kind == STEP else step.target
