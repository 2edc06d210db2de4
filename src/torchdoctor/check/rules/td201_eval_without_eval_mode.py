from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.mode_intent import train_on_purpose
from torchdoctor.check.analysis.mode_state import (
    BUILT,
    TRAIN,
    TRAINED,
    TRAINISH,
    ForwardCall,
    Origin,
    describe_origins,
)
from torchdoctor.check.analysis.names import is_lightning_eval_hook, is_test_file, is_torch_file
from torchdoctor.check.rule import Rule, Severity

# a function can only hold evaluation code (or call it) if its text says so
_WORDS = ("val", "test", "eval", "predict", "infer", "generate", "no_grad", "inference_mode")


class EvalWithoutEvalMode(Rule):
    """Evaluation code runs a model that is still in training mode.

    ## What it does
    Finds evaluation and inference code -- functions named like `evaluate`,
    `validate`, `test`, `predict`, `infer`, `generate`; loops over a validation or
    test loader; `torch.no_grad()` / `inference_mode()` blocks and decorators that
    loop over data -- that runs a model whose mode, on some path, is still training
    mode: `model.train()` was called, the model was just trained (its output reached
    `backward()`), or it was just built (new modules start in training mode), and no
    `model.eval()` came in between. It follows calls: an epoch loop that calls
    `validate(model)` after `train(model)`, where `validate()` never calls
    `model.eval()`, is reported inside `validate()`, where `eval()` is missing, and
    names the call (at the `validate(...)` call when `validate()` is in another file
    or reaches the model only through a helper).

    Lightning's `validation_step`, `test_step` and `predict_step` are not reported:
    Lightning switches to eval mode around them itself.

    ## Why is this bad?
    Nothing crashes; the numbers are just wrong. In training mode `nn.Dropout`
    zeroes a random fraction p of the activations (p = 0.1-0.5 in most models) and
    scales the rest by 1/(1-p), so each evaluation pass scores a different random
    sub-network: the same weights give different accuracies run after run.
    `nn.BatchNorm` normalises each batch with that batch's own mean and variance
    instead of the running statistics -- with small or single-class evaluation
    batches the outputs are far off -- and it also *updates* the running
    statistics with validation data (each batch moves them 10% of the way, the
    default momentum 0.1), so evaluating changes the model you later save.

    ## Example
    ```python
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            ...
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum()  # still in training mode
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            ...
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum()
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval
    - https://pytorch.org/docs/stable/notes/autograd.html#locally-disable-grad-doc
    """

    code = "TD201"
    name = "eval-without-eval-mode"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = _WORDS

    def finish(self) -> None:
        if is_test_file(self.ctx.path) or not is_torch_file(self.ctx.source):
            return
        fl = analysis(self.ctx)
        stored_seen: dict[int, ForwardCall] = {}
        inner_seen: set[int] = set()
        for fi in fl.all_functions():
            # (evaluation first: its lines are fewer to find than the model words')
            if not (fi.mentions_evaluation and fi.mentions_model and fl.may_run_model(fi)):
                continue
            if is_lightning_eval_hook(fi.name):
                continue
            if fi.cls is not None and fi.name in ("training_step", "forward"):
                continue
            seen: set[tuple[int, str]] = set()
            for fc in fl.modes(fi).forwards:
                held = frozenset(o for o in fc.origins if o.stored is not None)
                if fc.region is None:
                    if not (fc.no_grad and held):
                        continue
                    # inference under no_grad of a model the class built and never set
                    # to eval mode: nothing else can have switched it
                    modes = frozenset({BUILT})
                else:
                    modes = TRAINISH if fc.region == "strong" else frozenset({TRAIN, TRAINED})
                proof = self._proof_origins(fl, fi.node, fc, modes)
                if not proof:
                    continue
                if all(o.stored is not None for o in proof):
                    # one fix for every method that runs it: where the class stores it
                    stored = next(iter(proof)).stored
                    assert stored is not None
                    if stored_seen.setdefault(id(stored), fc) is fc:
                        self.report(
                            stored,
                            self._held_message(fc, proof),
                            hint=f"set it to eval mode where it is stored: `{fc.key}.eval()`",
                        )
                    continue
                inner = _inner_run(fl, fc)
                if inner is not None:
                    # the evaluation function of this file runs it: report there, where
                    # its eval() is missing, once for all the calls that reach it
                    if id(inner.node) in inner_seen:
                        continue
                    inner_seen.add(id(inner.node))
                    self.report(
                        inner.node,
                        self._inner_message(fc, inner, proof),
                        hint=f"call `{inner.key}.eval()` at the start of "
                        f"{fc.via.label if fc.via else 'it'}",
                    )
                    continue
                slot = (id(fc.region_node), fc.key)
                if slot in seen:
                    continue
                seen.add(slot)
                self.report(fc.node, self._message(fc, proof), hint=self._hint(fc))

    def _proof_origins(
        self, fl: FileLoops, function: ast.AST, fc: ForwardCall, modes: frozenset[str]
    ) -> frozenset[Origin]:
        """The origins that show `fc.key` may be in training mode, minus deliberate ones."""
        region = fc.region_node if fc.via is None else None
        proof = set()
        for o in fc.origins:
            if o.mode not in modes:
                continue
            if (
                o.mode == TRAIN
                and region is not None
                and o.node is not None
                and _inside(o.node, region)
                and train_on_purpose(function, region, o.node, fc.node, fc.key)
            ):
                continue  # set right here on purpose (MC dropout, `if train: model.train()`)
            if o.mode == BUILT:
                if not fc.in_loop and o.stored is None:
                    continue  # one forward of a fresh model: a smoke test, not evaluation
                name = self.ctx.qualname(o.node.func) if isinstance(o.node, ast.Call) else None
                sensitive = fl.class_mode_sensitive(name.rsplit(".", 1)[-1]) if name else None
                if sensitive is False:
                    continue  # no Dropout/BatchNorm: the mode changes nothing
                if o.stored is not None and not (
                    sensitive or (name or "").startswith("transformers.")
                ):
                    # a class-level fact needs the harm shown: a class we see has Dropout or
                    # BatchNorm, or a Hugging Face model (dropout on by default in its config)
                    continue
            proof.add(o)
        if proof and all(o.mode != BUILT for o in proof) and fl.key_mode_sensitive(fc.key) is False:
            return frozenset()  # built only from layers without Dropout/BatchNorm
        return frozenset(proof)

    def _message(self, fc: ForwardCall, proof: frozenset[Origin]) -> str:
        key = fc.key
        because = _because(key, proof)
        if fc.via is not None:
            return (
                f"`{self.ctx.segment(fc.node.func)}()` evaluates `{key}` (line {fc.inner_line}"
                f" of {fc.via.label}) without `{key}.eval()`, and {because}: Dropout stays "
                "active and BatchNorm uses batch statistics and overwrites its running ones"
            )
        return (
            f"`{key}` runs in training mode in evaluation code: {because}; Dropout stays "
            "active and BatchNorm uses batch statistics and overwrites its running ones"
        )

    def _inner_message(self, fc: ForwardCall, inner: ForwardCall, proof: frozenset[Origin]) -> str:
        return (
            f"`{inner.key}` runs in training mode here when `{self.ctx.segment(fc.node)}` at "
            f"line {fc.node.lineno} calls this evaluation code: {_because(fc.key, proof)}; "
            "Dropout stays active and BatchNorm uses batch statistics and overwrites its "
            "running ones"
        )

    def _held_message(self, fc: ForwardCall, proof: frozenset[Origin]) -> str:
        where = fc.node.lineno
        how = "" if fc.region is not None else " under no_grad"
        return (
            f"`{fc.key}` is built in training mode "
            f"({describe_origins(proof, frozenset({BUILT}))}), yet it runs for inference"
            f"{how} at line {where}: Dropout stays active and BatchNorm uses batch statistics "
            "and overwrites its running ones"
        )

    def _hint(self, fc: ForwardCall) -> str:
        return (
            f"call `{fc.key}.eval()` before evaluating and `{fc.key}.train()` before training again"
        )


def _inner_run(fl: FileLoops, fc: ForwardCall, depth: int = 0) -> ForwardCall | None:
    """The run of the model inside `fc.via`, when that is an evaluation function of this
    file that runs the model itself, or calls one that does (`validate()` calling
    `predict()`), not a helper shared with training code."""
    via = fc.via
    if via is None or via.is_module or via.file is not fl or fc.region != "strong":
        return None
    for inner in fl.modes(via).forwards:
        if inner.region is None or inner.node.lineno != fc.inner_line:
            continue
        if inner.via is None:
            return inner
        return _inner_run(fl, inner, depth + 1) if depth < 3 else None
    return None


def _because(key: str, proof: frozenset[Origin]) -> str:
    explicit = describe_origins(proof, frozenset({TRAIN}))
    if explicit:
        return f"{explicit} is still in effect"
    trained = describe_origins(proof, frozenset({TRAINED}))
    if trained:
        return f"`{key}` was trained up to {trained} and nothing set it to eval mode since"
    built = describe_origins(proof, frozenset({BUILT}))
    return f"`{key}` was built by {built} (new modules start in training mode)"


def _inside(node: ast.AST | None, region: ast.AST) -> bool:
    line = getattr(node, "lineno", 0)
    return bool(region.lineno <= line <= (region.end_lineno or region.lineno))  # type: ignore[attr-defined]
