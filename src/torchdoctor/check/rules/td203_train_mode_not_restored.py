from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.mode_state import EVAL, Origin
from torchdoctor.check.analysis.names import is_eval_name, is_torch_file
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.rule import Rule, Severity


class TrainModeNotRestored(Rule):
    """A loop sets a model to eval mode and trains it again without `model.train()`.

    ## What it does
    Finds loops -- typically the epoch loop -- in which a model is trained
    (its output reaches `backward()` / `optimizer.step()`, directly or inside a
    called `train_one_epoch()`), then put into eval mode (`model.eval()`, directly
    or inside a called `evaluate()` / `validate()`), and the loop comes back to the
    training step with no `model.train()` on the way. It follows calls within the
    file and into sibling files (`from engine import evaluate`). An evaluation
    routine called *before* a training step -- `self.validate()` every N batches,
    a baseline `evaluate(model)` before the epoch loop -- that leaves the model in
    eval mode is reported too; a direct `model.eval()` before training is not
    (fine-tuning with BatchNorm frozen does that on purpose). A routine of the same
    file called from one place only is reported at its `model.eval()`; one that
    several places call, at the call that trains in eval mode after it.

    A model the file freezes (`for p in model.parameters(): p.requires_grad = False`)
    and never unfreezes is not trained: a backward() next to it trains something else
    (an adversarial patch, a prompt), so its eval mode there is left alone.

    ## Why is this bad?
    Only the first epoch trains in training mode. From the second epoch on,
    Dropout is off (the regularisation you configured silently disappears, so the
    model overfits sooner) and BatchNorm normalises with its frozen running
    statistics instead of batch statistics and stops updating them -- with a fresh
    or fine-tuned network those statistics are stale, and training loss typically
    stalls or diverges after epoch 1. Nothing raises an error.

    ## Example
    ```python
    for epoch in range(epochs):
        for x, y in train_loader:
            loss = criterion(model(x), y)
            ...
        evaluate(model, val_loader)  # calls model.eval()
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            loss = criterion(model(x), y)
            ...
        evaluate(model, val_loader)
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.train
    """

    code = "TD203"
    name = "train-mode-not-restored"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("eval", "train(False")

    def finish(self) -> None:
        if not is_torch_file(self.ctx.source):
            return
        fl = analysis(self.ctx)
        reported: set[int] = set()
        for fi in fl.all_functions():
            text = fi.text
            if not ("for " in text or "while " in text):
                continue
            if not (".eval(" in text or "train(" in text or fi.mentions_evaluation):
                continue
            if not (fi.mentions_model and fl.may_run_model(fi)):
                continue
            for step in fl.modes(fi).steps:
                if fl.key_mode_sensitive(step.key) is False:
                    continue  # no Dropout/BatchNorm: eval mode changes nothing in training
                if _frozen(self.ctx.source, step.key):
                    continue  # a frozen model is not trained: its eval mode is a choice
                step_line = getattr(step.node, "lineno", 0)
                for origin in sorted(step.origins, key=lambda o: o.line):
                    if origin.mode != EVAL or origin.node is None:
                        continue
                    if origin.line <= step_line and not _evaluation_call(origin.node):
                        continue  # a direct eval() before training may freeze BatchNorm on purpose
                    where = _where(fl, fi, origin)
                    if id(where) in reported:
                        continue
                    reported.add(id(where))
                    then = (
                        f"the loop comes back to {step.what} at line {step_line}, which"
                        if origin.line > step_line
                        else f"{step.what} at line {step_line} then"
                    )
                    self.report(
                        where,
                        f"{origin.what} is never undone: {then} trains `{step.key}` in eval mode "
                        "(Dropout off, BatchNorm frozen to its running statistics)",
                        hint=f"call `{step.key}.train()` at the start of each epoch or after "
                        "evaluating",
                    )


def _frozen(source: str, key: str) -> bool:
    """The file freezes the model (`for p in model.parameters(): p.requires_grad = False`,
    `model.requires_grad_(False)`) and never unfreezes anything: a backward() near it
    trains something else (an adversarial patch, a prompt, a head), not this model."""
    # each search starts from a literal the file must hold: no scan of every position
    loop, method = f"{key}.parameters()", f"{key}.requires_grad_("
    if loop not in source and method not in source:
        return False
    name = re.escape(key)
    call = rf"(?<![\w.]){name}\.requires_grad_\(\s*(requires_grad\s*=\s*)?"
    freezes = (
        loop in source
        and re.search(
            rf"for\s+(\w+)\s+in\s+{name}\.parameters\(\)\s*:\s*\n?\s*\1\.requires_grad\s*=\s*False",
            source,
        )
    ) or (method in source and re.search(call + r"False\s*\)", source))
    if not freezes:
        return False
    if _UNFREEZES.search(source):
        return False
    return not re.search(call + r"(True)?\s*\)", source)


_UNFREEZES = re.compile(r"\.requires_grad\s*=\s*True")


def _where(fl: FileLoops, fi: FunctionInfo, origin: Origin) -> ast.AST:
    """Where to report an eval() never undone: inside the function of this file that
    calls it (`self.model.eval()` in `validate()`) when only one call reaches it, or
    when no caller sets training mode again after calling it: that is the code to
    change; at the call otherwise (a shared `validate()` that other callers follow with
    `train()`)."""
    call = origin.node
    assert call is not None
    if origin.inner is None or not isinstance(call, ast.Call):
        return call
    resolved = fl.resolve(fi, call, other_files=False)
    if resolved is None:
        return call
    callers = fl.callers(resolved[0])
    if len(callers) == 1 or not any(_restores_after(fl, c, e.node) for c, e in callers):
        return origin.inner
    return call


_RESTORE = re.compile(r"\btrain\(|[\"']train[\"']|train\s*=\s*True")


def _restores_after(fl: FileLoops, caller: FunctionInfo, call: ast.AST) -> bool:
    """Some code of `caller` after `call` may set training mode again."""
    end = getattr(call, "end_lineno", 0) or 0
    # the caller may be the module's top-level code, which has no span of its own
    last = getattr(caller.node, "end_lineno", None) or len(fl.ctx.lines)
    return bool(_RESTORE.search("\n".join(fl.ctx.lines[end:last])))


def _evaluation_call(node: ast.AST) -> bool:
    """`self.validate()`, `evaluate(model, loader)`: an evaluation routine the training code
    calls, which left the model in eval mode (an origin a callee's summary reports)."""
    if not isinstance(node, ast.Call):
        return False
    name = dotted(node.func)
    if name is None:
        return False
    last = name.rsplit(".", 1)[-1]
    return last not in ("eval", "train") and is_eval_name(last)
