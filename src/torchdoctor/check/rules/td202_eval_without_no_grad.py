from __future__ import annotations

import ast
import os
import re
from typing import ClassVar

from torchdoctor.check.analysis.eval_branches import eval_only_runs
from torchdoctor.check.analysis.events import BACKWARD, SCALER_STEP, STEP
from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_callers import called_only_without_grad
from torchdoctor.check.analysis.mode_intent import flag_phases, same_side
from torchdoctor.check.analysis.mode_state import BUILT, EVAL, TRAIN, ForwardCall
from torchdoctor.check.analysis.names import (
    is_lightning_eval_hook,
    is_test_code,
    is_test_file,
    is_torch_file,
)
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

_WORDS = ("val", "test", "eval", "predict", "infer", "generate")
_SCRIPT_WORDS = ("DataLoader", ".backward(", "zero_grad", ".eval()", "optim.")
# Code that wants gradients on purpose: adversarial examples, saliency, gradient penalties.
# `requires_grad=False` / `requires_grad_(False)` turn gradients off: no such wish.
_NEEDS_GRAD = re.compile(
    r"\.backward\(|autograd\.grad|requires_grad(?!\s*=\s*False|_\(\s*False)"
    r"|enable_grad|set_grad_enabled|\.grad\b"
)


class EvalWithoutNoGrad(Rule):
    """Evaluation code runs the model with gradients on.

    ## What it does
    Finds model calls in evaluation code -- functions named like `evaluate`,
    `validate`, `test`, `predict`, `infer`, `generate`, loops over a validation or
    test loader, and loops that run a model right after `model.eval()` -- that are
    not inside `torch.no_grad()`, `torch.inference_mode()` or a function decorated
    with either, and not called from inside one in this file. Code that computes
    gradients on purpose (it calls `backward()`, `torch.autograd.grad`, or sets
    `requires_grad`) is left alone, and so are Lightning's `validation_step`,
    `test_step` and `predict_step` (Lightning disables gradients there). A call of
    an abstract method (`self.evaluate()` of a base trainer) runs the one override a
    subclass of the project defines; when that runs in a file that leaves the gradient
    mode to its callers (no training code there), the report goes to the call.

    Evaluation code every call of which, in the project's files, runs under `no_grad`
    -- directly or through its callers, in other files too (`lm.evaluate()` in
    `rescore()`, called only by a decoder method a script calls inside
    `with torch.no_grad():`) -- is left alone. Calls are matched by name, so any call
    of the name counts; code nothing calls, code whose function is used as a value
    (a callback, `getattr`), module-level calls outside `no_grad`, and the files of a
    distributed package (whose users call it) are still reported, and so is everything
    in a project of more than 2000 files (not followed).

    A model's own methods leave the gradient mode to their callers, with one exception:
    a method whose layers run only in eval mode (`if not self.training: ...`) that the
    project's code calls (`model.module.mask_net(feats)`) in a project none of whose files
    turns gradients off (no `no_grad`, `inference_mode`, `set_grad_enabled` other than a
    forward's own `set_grad_enabled(self.training)`, nor a framework that evaluates under
    no_grad): then every call records the graph, and the report goes to the method.

    ## Why is this bad?
    `model.eval()` switches Dropout and BatchNorm to inference behaviour; it does
    not turn autograd off. Every forward pass still records the graph and keeps
    each layer's activations for a backward pass that never comes. Measured for a
    VGG-11-BN at batch 16 (224x224): 1.25 GB of activations kept per forward with
    gradients on, none under `no_grad`. It is held for as long as any output -- or
    a list of outputs, `preds.append(out)` -- is alive: the usual cause of "CUDA
    out of memory" during validation, and of `RuntimeError: Can't call numpy() on
    Tensor that requires grad`. Evaluation also runs slower than it needs to.

    ## Example
    ```python
    def evaluate(model, loader):
        model.eval()
        for x, y in loader:
            preds.append(model(x))
    ```

    ## Use instead
    ```python
    @torch.no_grad()
    def evaluate(model, loader):
        model.eval()
        for x, y in loader:
            preds.append(model(x))
    ```
    `torch.inference_mode()` is faster still when the outputs never enter autograd.

    ## References
    - https://pytorch.org/docs/stable/notes/autograd.html#locally-disable-grad-doc
    - https://pytorch.org/docs/stable/generated/torch.no_grad.html
    """

    code = "TD202"
    name = "eval-without-no-grad"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = _WORDS

    def finish(self) -> None:
        if is_test_file(self.ctx.path) or not is_torch_file(self.ctx.source):
            return
        # evaluation of a model being trained or served: not library helpers that run
        # a model they were handed (calibration, tracing, export)
        script = any(self.ctx.holds(w) for w in _SCRIPT_WORDS)
        fl = analysis(self.ctx)
        self._eval_only_methods(fl)
        for fi in fl.all_functions():
            # (evaluation first: its lines are fewer to find than the model words')
            if not (fi.mentions_evaluation and fi.mentions_model and fl.may_run_model(fi)):
                continue
            if is_lightning_eval_hook(fi.name):
                continue
            if fi.cls is not None and fi.name in ("training_step", "forward"):
                continue
            seen: set[str] = set()
            for fc in fl.modes(fi).forwards:
                if fc.no_grad or fc.grad_switch or fc.key in seen:
                    continue
                if fc.via is not None and (
                    (fc.region_node is fc.via.node and _reported_there(fl, fc.via))
                    or _NEEDS_GRAD.search(fc.via.text)
                ):
                    continue  # evaluation code of its own (reported there), or wants gradients
                if fc.key.split(".", 1)[0] == "self" and _in_module_class(self, fi):
                    continue  # a model's own inference API: its caller picks the grad mode
                after_eval = (
                    fc.in_loop and bool(fc.origins) and all(o.mode == EVAL for o in fc.origins)
                )
                flagged = None
                if fc.region != "strong" and not after_eval:
                    flagged = _evaluation_side(self, fl, fi, fc) or _guarded_elsewhere(fl, fi, fc)
                    if flagged is None:
                        continue
                if not script and not after_eval and flagged is None:
                    continue
                if not fc.in_loop and (
                    all(o.mode == BUILT for o in fc.origins)
                    or fc.key.split(".", 1)[0] in fi.local_names() - set(fi.params())
                ):
                    continue  # one forward of a model made right here: a smoke test
                scope = fc.region_node if fc.region == "strong" else fc.loop_node
                scope_text = (
                    fi.text if scope is None or scope is fi.node else self.ctx.segment(scope)
                )
                if flagged is None and _NEEDS_GRAD.search(scope_text):
                    continue
                if _called_under_no_grad(fl, fi) or _project_calls_without_grad(self, fi):
                    break
                seen.add(fc.key)
                if flagged is not None:
                    where = flagged
                elif after_eval and fc.region != "strong":
                    where = f"after {min(fc.origins, key=lambda o: o.line).what}"
                elif fc.via is not None and fc.region_node is fc.via.node:
                    where = f"in evaluation code ({fc.via.label})"
                else:
                    where = f"in evaluation code ({_region(fi, fc.region_node)})"
                elsewhere = (
                    ""
                    if fc.via is None or fc.via.file is fl
                    else f" in {os.path.basename(fc.via.file.ctx.path)}"
                )
                runs = (
                    f"`{fc.key}` runs"
                    if fc.via is None
                    else f"`{self.ctx.segment(fc.node.func)}()` runs `{fc.key}` (line "
                    f"{fc.inner_line} of {fc.via.label}{elsewhere})"
                )
                self.report(
                    fc.node,
                    f"{runs} {where} with gradients on: autograd keeps every "
                    "activation of this forward pass alive for a backward() that never "
                    "comes; `model.eval()` does not turn gradients off",
                    hint="wrap it in `with torch.no_grad():` (or `torch.inference_mode()`), "
                    "or decorate the function with `@torch.no_grad()`",
                )

    def _eval_only_methods(self, fl: FileLoops) -> None:
        """A module's method whose layers run only in eval mode (`if not self.training:`),
        called by the project (`model.module.mask_net(...)`), in a project none of whose
        files turns gradients off: every call builds the graph of an inference pass."""
        project = self.ctx.project
        if project.turns_grad_off or "self.training" not in self.ctx.source:
            return
        for fi in fl.all_functions():
            node = fi.node
            if (
                fi.cls is None
                or fi.parent is not None
                or not any(
                    not is_test_code(project.inside(path))
                    for path in project.outside_calls.get(fi.name, ())
                )
                or fi.name in ("forward", "__init__", "__call__")
                or not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                or not _in_module_class(self, fi)
                or _NEEDS_GRAD.search(fi.text)
            ):
                continue
            for call, key, test in eval_only_runs(self.ctx, fi.cls, node)[:1]:
                self.report(
                    call,
                    f"`{key}` runs in {fi.label}, which runs only in eval mode "
                    f"(`if {ast.unparse(test.test)}:` at line {test.lineno}), with gradients "
                    f"on: the project calls `.{fi.name}()` and none of its files turns "
                    "gradients off around it, so autograd keeps every activation of this inference "
                    "pass alive for a backward() that never comes",
                    hint="decorate the method with `@torch.no_grad()` (or wrap its callers "
                    "in `with torch.no_grad():` / `torch.inference_mode()`)",
                )


def _reported_there(fl: FileLoops, callee: FunctionInfo) -> bool:
    """Whether the rule, checking `callee`'s own file, reports the runs of its evaluation
    code: a file of this one's, or one with training words (one without leaves the
    model it is handed to its callers: the call here is where gradients stay on)."""
    other = callee.file
    if other is fl:
        return True
    source = other.ctx.source
    return is_test_file(other.ctx.path) or any(w in source for w in _SCRIPT_WORDS)


def _region(fi: FunctionInfo, node: object) -> str:
    if node is fi.node:
        return f"{fi.label}"
    line = getattr(node, "lineno", 0)
    return f"the loop at line {line}"


def _called_under_no_grad(fl: FileLoops, fi: FunctionInfo, depth: int = 0) -> bool:
    """Some chain of calls into `fi` in this file starts inside no_grad or a framework hook."""
    for caller, event in fl.callers(fi):
        if event.no_grad or is_lightning_eval_hook(caller.name):
            return True
        if depth < 3 and caller is not fi and _called_under_no_grad(fl, caller, depth + 1):
            return True
    return False


def _project_calls_without_grad(rule: Rule, fi: FunctionInfo) -> bool:
    """Every call of `fi` (a function or method, not nested) in the project's files runs
    with gradients off, through callers of other files too (analysis/grad_callers.py)."""
    node = fi.node
    if fi.parent is not None or not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    return called_only_without_grad(rule.ctx, node, fi.cls)


def _in_module_class(rule: Rule, fi: FunctionInfo) -> bool:
    return fi.cls is not None and rule.ctx.is_module_class(fi.cls)


def _evaluation_side(rule: Rule, fl: FileLoops, fi: FunctionInfo, fc: ForwardCall) -> str | None:
    """A function serving both phases (`if is_train: model.train() else: model.eval()`)
    runs `fc` on both, while everything that needs gradients (backward(), step(), ...)
    runs only on the training side: on the other side it is evaluation with gradients on.
    Returns where that is, for the message; None if the code does not show it."""
    if fi.is_module or not fc.in_loop:
        return None
    node = fi.node
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    train = next((o for o in fc.origins if o.mode == TRAIN and o.inner is None), None)
    evaluate = next((o for o in fc.origins if o.mode == EVAL and o.inner is None), None)
    if train is None or evaluate is None or train.node is None or evaluate.node is None:
        return None
    phases = flag_phases(node, train.node, evaluate.node)
    if phases is None:
        return None
    test, side = phases
    trained = [e for e in fl.events(fi) if e.kind in (BACKWARD, STEP, SCALER_STEP)]
    if not trained or not all(
        any(same_side(b.node, b.label, phases) for b in e.chain) for e in trained
    ):
        return None
    # the training side's blocks, wherever the test is repeated
    blocks = [
        (n.body if side == "body" else n.orelse)
        for n in walk(node)
        if isinstance(n, ast.If) and ast.unparse(n.test) == ast.unparse(test.test)
    ]
    spans = [(b[0].lineno, b[-1].end_lineno or b[-1].lineno) for b in blocks if b]
    line = fc.node.lineno
    if any(start <= line <= end for start, end in spans):
        return None  # the run itself is on the training side
    rest = [
        text
        for number, text in enumerate(rule.ctx.segment(node).splitlines(), start=node.lineno)
        if not any(start <= number <= end for start, end in spans)
    ]
    if _NEEDS_GRAD.search("\n".join(rest)):
        return None
    holds = "false" if side == "body" else "true"
    return (
        f"where `{ast.unparse(test.test)}` is {holds} ({evaluate.what} is in effect there, "
        "and every backward()/step() runs only on the other side)"
    )


def _guarded_elsewhere(fl: FileLoops, fi: FunctionInfo, fc: ForwardCall) -> str | None:
    """Inference code that runs `fc.key` under no_grad in one place and over a loop of
    data without it in another (one branch wrapped, its sibling not), in a function with
    no gradient use and no training flag: the author's own no_grad shows the intent."""
    if fi.is_module or not fc.in_loop or fc.via is not None:
        return None
    if _NEEDS_GRAD.search(fi.text) or ".step(" in fi.text:
        return None
    if any("train" in name.lower() for name in fi.identifiers()):
        return None  # `if training:` -- a phase flag may want gradients on this side
    guarded = [
        other
        for other in fl.modes(fi).forwards
        if other.key == fc.key and other.no_grad and other.via is None and other is not fc
    ]
    if not guarded:
        return None
    return (
        f"in inference code (line {guarded[0].node.lineno} runs `{fc.key}` under no_grad in "
        "the same function)"
    )
