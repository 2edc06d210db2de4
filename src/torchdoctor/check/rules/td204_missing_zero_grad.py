from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.events import (
    BACKWARD,
    CALL,
    SCALER_STEP,
    STEP,
    ZERO,
    Branch,
    Event,
    can_follow,
    invariant_guards,
)
from torchdoctor.check.analysis.file_loops import FileLoops, analysis, file_of
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import mentions_zeroing
from torchdoctor.check.analysis.inline_events import inlined_events_with
from torchdoctor.check.analysis.names import is_torch_file
from torchdoctor.check.analysis.pass_guards import single_pass_guard
from torchdoctor.check.analysis.syntax import dotted, encloses
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

_OPTIMIZER_METHODS_THAT_DO_NOT_ZERO = frozenset(
    {"step", "state_dict", "load_state_dict", "add_param_group", "param_groups", "state"}
)
# library functions given the optimizer that step it (and never zero its gradients)
_STEPPING_FUNCTIONS = frozenset({"torch_xla.core.xla_model.optimizer_step"})


class MissingZeroGrad(Rule):
    """A training loop calls `backward()` and `optimizer.step()` but never zeroes gradients.

    ## What it does
    Finds loops that call `loss.backward()` and `optimizer.step()` (or
    `scaler.step(optimizer)`) on every pass but never clear the gradients inside
    the loop: no `optimizer.zero_grad()`, `model.zero_grad()`,
    `zero_grad(set_to_none=True)`, `p.grad = None` or `p.grad.zero_()`, directly or
    in a function the loop calls. A `zero_grad()` that runs once before the loop
    does not count, nor one under a test that holds on one pass only (`if i == 0:`
    on the loop's counter or a copy of it). A loop split across methods (the loop
    calls `self.train_one_step(batch)`, which runs `backward()` and `step()`) is read
    with the file's methods in place; where the only zeroing after the step sits
    under a test that holds for the whole run (`if self.scheduler:`), the report
    goes to that `zero_grad()`. A method that runs one step of the optimizer its object builds
    (`def learn(self, batch)`, called by a game or episode loop elsewhere) is
    reported when nothing in its file zeroes gradients and no other checked file
    that zeroes them calls it.

    ## Why is this bad?
    `backward()` *adds* into `.grad`; it never overwrites it. Without zeroing,
    the gradient used by step *n* is the sum of the gradients of batches 1..n, so
    the effective learning rate grows linearly with the step count: after 100
    steps every update is about 100 times the intended one and points mostly in
    the direction of old batches. Training loss typically plateaus or blows up to
    `nan` after a few hundred steps. Nothing raises an error.

    Gradient accumulation that steps every k batches still has to zero after each
    step; see also TD205 and TD214.

    ## Example
    ```python
    optimizer.zero_grad()
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html
    - https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html
    """

    code = "TD204"
    name = "missing-zero-grad"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("backward",)

    def finish(self) -> None:
        if not is_torch_file(self.ctx.source):
            return
        fl = analysis(self.ctx)
        zeroing_here = mentions_zeroing(self.ctx.source)
        split = ".step(" in self.ctx.source
        reported: set[int] = set()
        for fi in fl.all_functions():
            text = fi.text
            extra: list[ast.AST] = []
            if "backward" in text and ".step(" in text:
                events = fl.events(fi)
                if not zeroing_here:
                    self._step_method(fi, events)
            elif split and ("for " in text or "while " in text) and _calls_in_loop(fl, fi):
                # a loop split across methods: `self.train_one_step(batch)` backward()s and steps
                events, callees = inlined_events_with(fl, fi)
                if not any(e.site is not None and e.kind in (STEP, SCALER_STEP) for e in events):
                    continue
                extra = [c.node for c in callees]
            else:
                continue
            self._loops(fl, fi, events, extra, reported)

    def _loops(
        self,
        fl: FileLoops,
        fi: FunctionInfo,
        events: list[Event],
        extra: list[ast.AST],
        reported: set[int],
    ) -> None:
        done: set[tuple[int, str | None]] = set()
        for step in events:
            if step.kind not in (STEP, SCALER_STEP):
                continue
            loop = _training_loop(events, step)
            slot = (id(loop), step.subject if step.kind == STEP else step.target)
            if loop is None or slot in done:
                continue
            done.add(slot)
            only_when: list[tuple[Event, list[Branch]]] = []
            once: list[tuple[Event, ast.If]] = []
            if self._zeroes(fl, fi, events, loop, step, extra, only_when, once):
                continue
            backward = next(e for e in events if e.kind == BACKWARD and e.in_loop(loop))
            optimizer = step.subject if step.kind == STEP else step.target
            before = [
                e for e in events if e.kind == ZERO and not e.in_loop(loop) and e.order < step.order
            ]
            before_text = (
                f"; `{self.ctx.segment(before[-1].node)}` at line {before[-1].line} runs "
                "only once, before the loop"
                if before
                else ""
            )
            if once:
                first, pin = once[0]
                before_text += (
                    f"; `{self.ctx.segment(first.node)}` at line {first.line} runs on one pass "
                    f"only (`{ast.unparse(pin.test)}`)"
                )
            nothing = "nothing in the loop zeroes the gradients"
            at: ast.AST = step.node
            hint = (
                f"call `{optimizer or 'optimizer'}.zero_grad()` once per step, "
                "e.g. at the top of the loop"
            )
            if only_when:
                zero, guards = only_when[0]
                test = ast.unparse(guards[0].node.test)  # type: ignore[attr-defined]
                holds = "false" if guards[0].label == "body" else "true"
                nothing = (
                    f"`{self.ctx.segment(zero.node)}` at line {zero.line} is skipped on "
                    f"every pass where `{test}` is {holds}, and nothing else zeroes the "
                    "gradients"
                )
                if zero.order > step.order:
                    at = zero.node  # the zeroing after the step is what the test skips
                    hint = f"zero the gradients on every pass, not only under `{test}`"
            if id(at) in reported:
                continue
            reported.add(id(at))
            where = (
                ""
                if step.site is None
                else f" (through `{self.ctx.segment(step.site)}` at line {step.site.lineno})"  # type: ignore[attr-defined]
            )
            self.report(
                at,
                f"`{self.ctx.segment(step.node)}` at line {step.line} follows "
                f"`{self.ctx.segment(backward.node)}` at line {backward.line} on every "
                f"pass of the loop at line {loop.lineno}{where}, but {nothing}: "  # type: ignore[attr-defined]
                f"each step applies the sum of all gradients so far{before_text}",
                hint=hint,
            )

    def _step_method(self, fi: FunctionInfo, events: list[Event]) -> None:
        """A method that runs one training step of the optimizer its object holds, with no
        loop of its own (`def learn(self, batch)`, called once per batch or episode):
        where nothing in the file zeroes gradients, and no other file that zeroes them
        calls this method, each call adds its gradients to all earlier calls'."""
        if fi.cls is None:
            return
        for step in events:
            if step.kind not in (STEP, SCALER_STEP) or step.loops():
                continue
            optimizer = step.subject if step.kind == STEP else step.target
            if optimizer is None or not optimizer.startswith("self."):
                continue
            backward = next(
                (e for e in events if e.kind == BACKWARD and not e.loops() and can_follow(e, step)),
                None,
            )
            if backward is None or not self._owned_optimizer(fi, optimizer):
                continue
            if self._zeroed_elsewhere(fi.name):
                return
            self.report(
                step.node,
                f"`{self.ctx.segment(step.node)}` at line {step.line} follows "
                f"`{self.ctx.segment(backward.node)}` at line {backward.line} on every call of "
                f"{fi.label}, but nothing in this file zeroes the gradients: `{optimizer}` "
                "lives on between calls, so each step applies the sum of the gradients of "
                "every call so far",
                hint=f"call `{optimizer}.zero_grad()` before `backward()` in `{fi.name}()`",
            )
            return

    def _owned_optimizer(self, fi: FunctionInfo, optimizer: str) -> bool:
        """`self.optimizer = torch.optim.Adam(...)` in the class, and not rebuilt in `fi`."""
        cls = fi.cls
        assert cls is not None
        built = False
        for node in walk(cls):
            if not isinstance(node, ast.Assign) or not any(
                dotted(t) == optimizer for t in node.targets
            ):
                continue
            if encloses(fi.node, node):
                return False  # a fresh optimizer on every call
            value = node.value
            name = self.ctx.qualname(value.func) if isinstance(value, ast.Call) else None
            if name is None or not name.startswith("torch.optim."):
                return False  # assigned from something we cannot see
            built = True
        return built

    def _zeroed_elsewhere(self, method: str) -> bool:
        """Another file of the run zeroes gradients and calls `.method(` (this file zeroes
        nothing, or the rule would not ask)."""
        return method in self.ctx.project.zeroing_calls

    def _zeroes(
        self,
        fl: FileLoops,
        fi: FunctionInfo,
        events: list[Event],
        loop: ast.AST,
        step: Event,
        extra: list[ast.AST],
        only_when: list[tuple[Event, list[Branch]]],
        once: list[tuple[Event, ast.If]],
    ) -> bool:
        """Whether anything in `loop` may zero (or reset) the gradients on every pass; if a
        zeroing runs only under a fixed test, it goes to `only_when`, and one that runs on
        a single pass (`if i == 0:`) to `once` (for the message). `extra`: the functions
        whose events are inlined (they may assign what a test reads)."""
        if single_pass_guard(step, loop, extra) is not None:
            return True  # the step itself runs on one pass: not a per-pass training step
        loop_text = self.ctx.segment(loop)
        optimizer = step.subject if step.kind == STEP else step.target
        if optimizer is not None and re.search(re.escape(optimizer) + r"\s*=[^=]", loop_text):
            return True  # a fresh optimizer (over fresh tensors) on every pass
        optimizers = {e.subject if e.kind == STEP else e.target for e in events} - {None}
        guarded: list[tuple[Event, list[Branch]]] = []
        for event in events:
            if not event.in_loop(loop):
                continue
            if event.kind == ZERO and (
                event.subject is None
                or event.subject == optimizer
                or event.subject not in optimizers
            ):
                # this optimizer's zero_grad, p.grad = None, model.zero_grad() -- unless a
                # test that holds for the whole loop (`if args.moe:`) keeps it from the step
                # or one that holds on a single pass (`if batch_index == 0:`)
                first = single_pass_guard(event, loop, extra)
                if first is not None:
                    once.append((event, first))
                    continue
                guards = [
                    g
                    for g in invariant_guards(event, step, loop, extra)
                    # `if optimizer is not None:`: where it fails, the step cannot run either
                    if optimizer is None
                    or not re.search(
                        r"\b" + re.escape(optimizer) + r"\b",
                        ast.unparse(g.node.test),  # type: ignore[attr-defined]
                    )
                ]
                if not guards:
                    return True
                guarded.append((event, guards))
                continue
            if event.kind != CALL:
                continue
            call = event.node
            assert isinstance(call, ast.Call)
            resolved = fl.resolve(fi, call)
            if resolved is not None:
                if _callee_zeroes(resolved[0], 0):
                    return True
                continue
            if optimizer is None:
                continue
            func = call.func
            if (
                isinstance(func, ast.Attribute)
                and dotted(func.value) == optimizer
                and func.attr not in _OPTIMIZER_METHODS_THAT_DO_NOT_ZERO
            ):
                return True  # optimizer.some_custom_reset()
            if (
                any(dotted(a) == optimizer for a in call.args)
                and not (isinstance(func, ast.Attribute) and func.attr in ("step", "unscale_"))
                and self.ctx.qualname(func) not in _STEPPING_FUNCTIONS
            ):
                return True  # handed to code we cannot see
        # a closure defined in the loop (LBFGS) or code we do not see as events
        if any(
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            and mentions_zeroing(self.ctx.segment(node))
            for node in walk(loop)
        ):
            return True
        if guarded:
            branches = {(id(b.node), b.label) for _, guards in guarded for b in guards}
            if any((i, "body") in branches and (i, "orelse") in branches for i, _ in branches):
                return True  # zeroed in both branches of one test: every pass is covered
            only_when.append(guarded[0])
        return False


def _calls_in_loop(fl: FileLoops, fi: FunctionInfo) -> bool:
    """Whether a loop of `fi` calls a function of the file (that may hold its step)."""
    return any(
        e.kind == CALL
        and e.loops()
        and isinstance(e.node, ast.Call)
        and fl.resolve(fi, e.node, other_files=False) is not None
        for e in fl.events(fi)
    )


def _training_loop(events: list[Event], step: Event) -> ast.AST | None:
    """The innermost loop around `step` that also runs a backward() -- if the step runs
    on every pass (or every k-th, `if i % k == 0`), not only on some last pass."""
    for loop in reversed(step.loops()):
        if not any(e.kind == BACKWARD and e.in_loop(loop) for e in events):
            continue
        for cond in step.conditions_in(loop):
            text = ast.unparse(cond.test)
            if "len(" in text or "last" in text or "final" in text or "end" in text:
                return None  # steps once at the end: accumulation over the whole loop
        return loop
    return None


def _callee_zeroes(fi: FunctionInfo, depth: int) -> bool:
    if mentions_zeroing(fi.text):
        return True
    if depth >= 2:
        return False
    fl = file_of(fi)
    for event in fl.events(fi):
        if event.kind == CALL and isinstance(event.node, ast.Call):
            resolved = fl.resolve(fi, event.node)
            if (
                resolved is not None
                and resolved[0] is not fi
                and _callee_zeroes(resolved[0], depth + 1)
            ):
                return True
    return False
