from __future__ import annotations

import ast
import os
from typing import ClassVar

from torchdoctor.check.analysis.events import (
    BACKWARD,
    CLIP,
    SCALER_STEP,
    STEP,
    UNSCALE,
    Event,
    opposite_sides,
    same_path,
)
from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.names import is_torch_file
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk


class GradScalerMisuse(Rule):
    """A `GradScaler` used so that scaled gradients reach the optimizer or the clipping.

    ## What it does
    Finds three mistakes around `torch.amp.GradScaler` (formerly
    `torch.cuda.amp.GradScaler`):

    - `scaler.scale(loss).backward()` followed by a plain `optimizer.step()`
      instead of `scaler.step(optimizer)`;
    - `scaler.step(optimizer)` in a loop that never calls `scaler.update()`;
    - gradient clipping (`clip_grad_norm_`, `clip_grad_value_`) after
      `scaler.scale(loss).backward()` without `scaler.unscale_(optimizer)` first;
      also in an update function whose caller ran the backward: clipping, then
      `scaler.step(optimizer)`, with no `unscale_` in the function;
    - gradient hooks that clamp (`p.register_hook(lambda g: g.clamp(-c, c))`, registered
      by a function of another file of the project) in a class or function that builds
      and steps a `GradScaler`: hooks run inside backward, on scaled gradients.

    Two `if`s on one setting not rebound between them take the same side in a run:
    the scaled backward of `if self.fp16:` never meets the plain `step()` in the
    `else` of a later `if self.fp16:`.

    ## Why is this bad?
    `scaler.scale(loss)` multiplies the loss by the scale factor -- 65536 (2**16)
    at the start -- so every gradient is 65536 times too large until
    `scaler.step()` divides it back. A plain `optimizer.step()` applies the scaled
    gradients (a 65536x learning rate: the weights become `inf`/`nan` within a few
    steps) and also skips the check that drops steps with overflowed gradients.
    Without `scaler.update()` the scale never adapts, and the second
    `scaler.step()` raises `RuntimeError: step() has already been called since the
    last update().` Clipping scaled gradients compares a norm that is 65536 times
    too large with `max_norm`, so clipping fires on every step and shrinks every
    update to a tiny fraction of what it should be.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## References
    - https://pytorch.org/docs/stable/amp.html#gradient-scaling
    - https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping
    """

    code = "TD606"
    name = "grad-scaler-misuse"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("scale",)

    def finish(self) -> None:
        if not is_torch_file(self.ctx.source):
            return
        if self.ctx.project.clamping_hooks and "GradScaler" in self.ctx.source:
            for unit in self.ctx.tree.body:
                if isinstance(unit, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    self._clamping_hooks(unit)
        fl = analysis(self.ctx)
        for fi in fl.all_functions():
            text = fi.text
            if ".scale(" not in text and "scaler" not in text:
                continue
            # a helper's backward() may scale the loss itself: only backward()s written here
            events = [e for e in fl.events(fi) if e.via is None]
            scaled = [e for e in events if e.kind == BACKWARD and e.scaler is not None]
            reported: set[int] = set()
            for backward in scaled:
                window = [
                    e
                    for e in self._after(events, backward)
                    if not opposite_sides(backward, e, fi.node)
                ]
                for event in window:
                    if id(event.node) in reported:
                        continue
                    message = self._check(window, backward, event)
                    if message:
                        reported.add(id(event.node))
                        self.report(event.node, message[0], hint=message[1])
            if not scaled:
                self._clip_before_scaler_step(events, reported)
            for step in events:
                if step.kind != SCALER_STEP or not step.loops() or id(step.node) in reported:
                    continue
                loop = step.loops()[-1]
                outer = step.loops()[0]
                loop_text = self.ctx.segment(outer)
                if f"{step.subject}.update(" in loop_text or "update()" in loop_text:
                    continue
                reported.add(id(step.node))
                self.report(
                    step.node,
                    f"`{self.ctx.segment(step.node)}` at line {step.line} runs on every pass of "
                    f"the loop at line {loop.lineno} but `{step.subject}.update()` never does: "  # type: ignore[attr-defined]
                    "the second pass raises `RuntimeError: step() has already been called "
                    "since the last update()` and the scale never adapts",
                    hint=f"call `{step.subject}.update()` right after `{step.subject}.step(...)`",
                )

    def _clamping_hooks(self, unit: ast.AST) -> None:
        """A call of a project function that registers gradient hooks which clamp
        (`enable_gradient_clipping(self.model, limit)`), in a class or function whose
        gradients a `GradScaler` it builds and steps scales: the hooks run inside
        backward, before any `unscale_`, so they clamp scaled gradients."""
        scalers: dict[str, int] = {}  # `self._scaler` / `scaler` -> line built
        for node in walk(unit):
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
                name = self.ctx.qualname(node.value.func) or ""
                if name.rsplit(".", 1)[-1] == "GradScaler":
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        scalers.setdefault(self.ctx.segment(target), node.lineno)
        stepped = {
            self.ctx.segment(node.func.value)
            for node in walk(unit)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "step"
        }
        scaler = next((s for s in scalers if s in stepped), None)
        if scaler is None:
            return
        hooks = self.ctx.project.clamping_hooks
        for node in walk(unit):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            where = hooks.get(last)
            root = func
            while isinstance(root, ast.Attribute):
                root = root.value
            if (
                where is None
                or not isinstance(root, ast.Name)
                or self.ctx.imports.get(root.id, "torch").split(".", 1)[0] == "torch"
            ):
                continue  # only the project's function, imported (a local one is another)
            path, _, line = where.rpartition(":")
            self.report(
                node,
                f"`{self.ctx.segment(node)[:60]}` registers gradient hooks that clamp each "
                f"gradient while backward computes it ({os.path.basename(path)} line {line}), "
                f"and `{scaler}` (a GradScaler, line {scalers[scaler]}) scales those gradients "
                "(65536x at the start): the limit applies to scaled values, so the hooks cut "
                "almost every gradient far below it",
                hint=f"clip after `{scaler}.unscale_(optimizer)` (`clip_grad_value_`, "
                "`clip_grad_norm_`) instead of in gradient hooks",
            )

    def _clip_before_scaler_step(self, events: list[Event], reported: set[int]) -> None:
        """An update step whose backward ran elsewhere (the caller's `scaler.scale(loss)
        .backward()`): gradients clipped before `scaler.step(opt)` with no `unscale_` in
        the function are still scaled, since `step` is where the scaler unscales them."""
        if any(e.kind == UNSCALE for e in events):
            return
        for clip in events:
            if clip.kind != CLIP or id(clip.node) in reported:
                continue
            step = next(
                (
                    e
                    for e in events
                    if e.kind == SCALER_STEP and e.order > clip.order and same_path(clip, e)
                ),
                None,
            )
            if step is None:
                continue
            reported.add(id(clip.node))
            self.report(
                clip.node,
                f"`{self.ctx.segment(clip.node)}` at line {clip.line} clips gradients that "
                f"`{step.subject}` still holds scaled (it unscales them only in "
                f"`{self.ctx.segment(step.node)}` at line {step.line}): clipping compares "
                "gradients up to 65536 times too large with the limit, so it fires on every step",
                hint=f"call `{step.subject}.unscale_({step.target})` before clipping",
            )

    def _after(self, events: list[Event], backward: Event) -> list[Event]:
        """What can run after `backward`, up to the next backward() on that path."""
        out = []
        for event in events:
            if event.order <= backward.order or not same_path(backward, event):
                continue
            if event.kind == BACKWARD:
                break
            out.append(event)
        return out

    def _check(self, events: list[Event], backward: Event, event: Event) -> tuple[str, str] | None:
        scaler = backward.scaler
        back = f"`{self.ctx.segment(backward.node)}` at line {backward.line}"
        if event.kind == STEP:
            if any(
                e.kind == SCALER_STEP and e.target == event.subject and same_path(e, event)
                for e in events
            ):
                return None  # `if amp: scaler.step(opt) else: opt.step()` and the like
            return (
                f"`{self.ctx.segment(event.node)}` at line {event.line} applies the gradients "
                f"of {back} while they are still multiplied by `{scaler}`'s scale factor "
                "(65536 at the start): updates are thousands of times too large and "
                "overflowed steps are not skipped",
                f"use `{scaler}.step({event.subject})` followed by `{scaler}.update()`",
            )
        if event.kind == CLIP:
            stepped = any(e.kind in (SCALER_STEP, STEP) and e.order < event.order for e in events)
            unscaled = any(
                e.kind == UNSCALE and e.order < event.order and same_path(e, event) for e in events
            )
            if unscaled or stepped:
                return None
            return (
                f"`{self.ctx.segment(event.node)}` at line {event.line} clips the gradients "
                f"of {back} while they are still multiplied by `{scaler}`'s scale factor "
                "(65536 at the start): clipping fires on every step and shrinks each update "
                "to a tiny fraction",
                f"call `{scaler}.unscale_(optimizer)` before clipping",
            )
        return None
