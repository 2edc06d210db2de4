"""The mode interpreter's calls: forward calls, training steps, summaries of callees."""

from __future__ import annotations

import ast
import dataclasses
import os
from typing import TYPE_CHECKING, cast

from torchdoctor.check.analysis.event_collector import classify_call
from torchdoctor.check.analysis.events import BACKWARD, CALL, SCALER_STEP, STEP
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import (
    _MODE_SAFE_FUNCTIONS,
    _MODE_SAFE_METHODS,
    is_no_grad_decorated,
)
from torchdoctor.check.analysis.mode_inline import HelperInliner
from torchdoctor.check.analysis.mode_state import (
    _SELF_ANY,
    _UNKNOWN,
    ENTRY,
    EVAL,
    TRAIN,
    TRAINED,
    UNKNOWN_MODE,
    ForwardCall,
    LoopFacts,
    Origin,
    Origins,
    State,
    Summary,
    TrainingStep,
    _Frame,
    _train_arg,
    chain_root,
)
from torchdoctor.check.analysis.syntax import dotted, words

if TYPE_CHECKING:
    pass


class ModeInterpreter(HelperInliner):
    """Follows model modes through calls."""

    def _call(self, call: ast.Call, state: State, frame: _Frame) -> None:
        func = call.func
        key = chain_root(func.value) if isinstance(func, ast.Attribute) else None
        if isinstance(func, ast.Attribute) and key is not None:
            attr = func.attr
            if attr == "eval" and not call.args:
                self.mode_set.add(key)
                self.set(
                    state,
                    key,
                    frozenset({Origin(EVAL, call, f"`{key}.eval()` at line {call.lineno}")}),
                )
                return
            if attr == "train":
                self.mode_set.add(key)
                mode = _train_arg(call)
                origin = (
                    Origin(mode, call, f"`{self._short(call)}` at line {call.lineno}")
                    if mode is not None
                    else _UNKNOWN
                )
                self.set(state, key, frozenset({origin}))
                return
        kind, _ = classify_call(self.ctx, call)
        if kind == BACKWARD:
            self._training_step(call, "`" + self._short(call) + "`", state, frame)
            return
        if kind in (STEP, SCALER_STEP):
            self._training_step(call, "`" + self._short(call) + "`", state, frame, step=True)
            state.forwarded = frozenset()
            return
        if kind != CALL:
            return
        # a model run?
        target = dotted(func)
        if target is not None and self._is_model(target, state):
            self._forward(call, target, state, frame)
            return
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "forward"
            and key is not None
            and self._is_model(key, state)
        ):
            self._forward(call, key, state, frame)
            return
        if (
            isinstance(func, ast.Attribute)
            and key is not None
            and key == dotted(func.value)
            and _inference_method(func.attr)
            and self._is_model(key, state)
            and not self._no_grad_method(func.attr)
        ):
            # `self.model.predict(batch)`: a model's own inference method runs its layers
            self._forward(call, key, state, frame)
            return
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "generate"
            and key is not None
            and key != "self"
            and key == dotted(func.value)
            and self._is_model(key, state)
        ):
            # Hugging Face's generate(): the model's layers run in its current mode (it
            # never calls eval()), under a no_grad of its own
            self._forward(call, key, state, dataclasses.replace(frame, no_grad=True))
            return
        passes_model = any(
            (k := dotted(a.value if isinstance(a, ast.Starred) else a)) is not None
            and self._is_model(k, state)
            for a in (*call.args, *(kw.value for kw in call.keywords))
        )
        resolved = self.fl.resolve(self.fi, call, other_files=passes_model)
        if resolved is not None:
            callee, as_method = resolved
            if as_method and frame.region is not None and callee.file is self.fl:
                # `self.evaluate()` of an abstract method in evaluation code: the override
                # of the one subclass of the project that defines it
                callee = self.fl.sole_override(callee) or callee
            # a callee can only matter to modes here through a model it is given, `self`,
            # or a module-level model it uses by name
            relevant = (
                passes_model
                or as_method
                or (callee.file is self.fl and self._mentions_global_model(callee))
            )
            if not as_method:
                after = self._inline_helper(call, callee, state, frame)
                if after is not None:
                    state.modes = after.modes
                    state.forwarded = after.forwarded
                    return
            callee_file = cast(LoopFacts, callee.file)  # a FileLoops, as every FunctionInfo's
            summary = callee_file.summary(callee) if relevant and callee is not self.fi else None
            if summary is not None:
                self._apply_summary(call, callee, as_method, summary, state, frame)
                return
        self._unknown_call(call, state)

    def _no_grad_method(self, name: str) -> bool:
        """A method of that name in this file turns gradients off itself."""
        return any(
            fi.name == name
            and (
                "no_grad" in fi.text
                or "inference_mode" in fi.text
                or is_no_grad_decorated(self.ctx, fi.node)  # type: ignore[arg-type]
            )
            for fi in self.fl.all_functions()
            if not fi.is_module
        )

    def _mentions_global_model(self, callee: FunctionInfo) -> bool:
        text = callee.text
        return any(k in text for k in self.fl.mode_keys() if "." not in k) or any(
            k in text for k in self.fl.module_models()
        )

    def _is_model(self, key: str, state: State) -> bool:
        if key == "self":
            return self.is_module_class
        origins = state.modes.get(key, frozenset())
        return any(o.mode not in (UNKNOWN_MODE, ENTRY) for o in origins) or self.fl.is_model_key(
            key
        )

    def _forward(self, call: ast.Call, key: str, state: State, frame: _Frame) -> None:
        origins = self.get(state, key)
        found = self.forwards.get(id(call))
        if found is None:
            self.forwards[id(call)] = _forward_call(call, key, origins, frame)
        else:
            found.origins = found.origins | origins
        if not frame.no_grad:
            state.forwarded = state.forwarded | {key}

    def _training_step(
        self, node: ast.AST, what: str, state: State, frame: _Frame, *, step: bool = False
    ) -> None:
        for key in state.forwarded:
            origins = self.get(state, key)
            slot = (id(node), key)
            found = self.steps.get(slot)
            if found is None:
                self.steps[slot] = TrainingStep(node, what, key, origins)
            else:
                found.origins = found.origins | origins
            # an optimizer step after its output reached backward(): it is being trained,
            # so -- unless the file manages its mode with eval() -- it is in training mode
            if not step or self.fl.ever_set_to_eval(key) or not self.fl.optimized(key):
                continue
            trained = Origin(TRAINED, node, f"{what} at line {getattr(node, 'lineno', 0)}")
            kept = frozenset(o for o in origins if o.mode in (EVAL, TRAIN, TRAINED))
            if kept != origins:
                if not any(o.mode in (TRAIN, TRAINED) for o in kept):
                    kept = kept | {trained}
                self.set(state, key, kept)

    def _unknown_call(self, call: ast.Call, state: State) -> None:
        """A call we cannot see into: models it receives may come back in any mode."""
        name = self.ctx.qualname(call.func) or ""
        if name in _MODE_SAFE_FUNCTIONS or name.startswith(("torch.", "logging.", "math.")):
            return
        func = call.func
        if isinstance(func, ast.Attribute):
            owner = dotted(func.value)
            if (
                owner is not None
                and (owner in state.modes or self.fl.is_model_key(owner))
                and func.attr not in _MODE_SAFE_METHODS
            ):
                self.set(state, owner, frozenset({_UNKNOWN}))
            if owner == "self" or any(
                isinstance(a, ast.Name) and a.id == "self" for a in call.args
            ):
                # an inherited method (or a helper given `self`) may set any self.model's mode
                self.set(state, _SELF_ANY, frozenset({_UNKNOWN}))
        for arg in (*call.args, *(kw.value for kw in call.keywords)):
            if isinstance(arg, ast.Starred):
                arg = arg.value
            key = dotted(arg)
            if key is not None and (key in state.modes or self.fl.is_model_key(key)):
                self.set(state, key, frozenset({_UNKNOWN}))

    def _apply_summary(
        self,
        call: ast.Call,
        callee: FunctionInfo,
        as_method: bool,
        summary: Summary,
        state: State,
        frame: _Frame,
    ) -> None:
        mapping = self._map_keys(call, callee, as_method, summary)
        where = "" if callee.file is self.fl else f" in {os.path.basename(callee.file.ctx.path)}"
        call_text = f"`{self.ctx.segment(call.func)}()`"
        # runs of the caller's model inside the callee, in the caller's mode
        for ckey, (line, region) in summary.evals.items():
            mine = mapping.get(ckey)
            if mine is None:
                continue
            origins = self.get(state, mine)
            slot = self.forwards.get(id(call))
            if slot is None or slot.key != mine:
                self.forwards[id(call)] = ForwardCall(
                    call,
                    mine,
                    origins,
                    region,
                    callee.node if not callee.is_module else None,
                    frame.no_grad,
                    frame.grad_switch,
                    frame.loop_depth > 0,
                    frame.loop_node,
                    via=callee,
                    inner_line=line,
                )
            else:
                slot.origins = slot.origins | origins
        if not frame.no_grad:
            # its output may reach a backward() here (`loss = compute_loss(model, batch)`)
            ran = {mapping[k] for k in summary.runs if k in mapping}
            state.forwarded = state.forwarded | ran
        if frame.region is not None:
            # a helper that runs the model, called from evaluation code: the run belongs to
            # the caller's region (and to its grad mode)
            for ckey, line in summary.runs.items():
                mine = mapping.get(ckey)
                if mine is None or id(call) in self.forwards:
                    continue
                self.forwards[id(call)] = _forward_call(
                    call, mine, self.get(state, mine), frame, via=callee, inner_line=line
                )
        for ckey in summary.trains:
            mine = mapping.get(ckey)
            if mine is None:
                continue
            state.forwarded = state.forwarded | {mine}
        if any(ckey in mapping for ckey in summary.trains):
            self._training_step(
                call,
                f"{call_text} (its {next(iter(summary.trains.values()))[1]}{where})",
                state,
                frame,
                step=True,
            )
        # the modes it leaves behind
        for ckey, origins in summary.exit.items():
            mine = mapping.get(ckey)
            if mine is None:
                continue
            before = self.get(state, mine)
            new: set[Origin] = set()
            for o in origins:
                if o.mode == ENTRY:
                    new |= before
                elif o.mode == UNKNOWN_MODE:
                    new.add(_UNKNOWN)
                else:
                    inner = o.what.split(" (", 1)[0]
                    new.add(
                        Origin(
                            o.mode,
                            call,
                            f"{inner} in {callee.label}{where} (called at line {call.lineno})",
                            inner=(o.inner or o.node) if callee.file is self.fl else None,
                        )
                    )
            self.set(state, mine, frozenset(new))
        # arguments the callee never touched keep their mode; models it got but we could
        # not map (e.g. passed through *args) are unknown
        for arg in (*call.args, *(kw.value for kw in call.keywords)):
            if isinstance(arg, ast.Starred):
                inner_key = dotted(arg.value)
                if inner_key is not None and self._is_model(inner_key, state):
                    self.set(state, inner_key, frozenset({_UNKNOWN}))

    def _map_keys(
        self, call: ast.Call, callee: FunctionInfo, as_method: bool, summary: Summary
    ) -> dict[str, str]:
        """Callee key -> caller key for every key the summary mentions."""
        params = callee.params()
        bound: dict[str, str] = {}
        for name, arg in zip(params, call.args, strict=False):
            if isinstance(arg, ast.Starred):
                break
            key = dotted(arg)
            if key is not None:
                bound[name] = key
        for kw in call.keywords:
            if kw.arg is not None:
                key = dotted(kw.value)
                if key is not None:
                    bound[kw.arg] = key
        callee_locals = callee.local_names()
        mapping: dict[str, str] = {}
        keys = set(summary.exit) | set(summary.evals) | set(summary.trains) | set(summary.runs)
        for ckey in keys:
            head, _, rest = ckey.partition(".")
            if head in bound:
                mapping[ckey] = bound[head] + ("." + rest if rest else "")
            elif head == "self":
                if as_method:
                    mapping[ckey] = ckey
            elif (
                head not in callee_locals
                and head not in params
                and callee.file is self.fl
                and (self.fi.is_module or head not in self.locals())
            ):
                # a global of the callee's module: the same name here if it is global here
                mapping[ckey] = ckey
        return mapping


def _inference_method(name: str) -> bool:
    """`predict`, `full_sort_predict`, `inference` -- not `generate` (Hugging Face's runs
    under no_grad itself) nor `evaluate` (framework loops that set modes themselves)."""
    return any(w in ("predict", "inference", "infer") for w in words(name))


def _forward_call(
    call: ast.Call,
    key: str,
    origins: Origins,
    frame: _Frame,
    via: FunctionInfo | None = None,
    inner_line: int = 0,
) -> ForwardCall:
    """A run of the model `key` at `call`, in the region and grad mode of `frame`."""
    return ForwardCall(
        call,
        key,
        origins,
        frame.region,
        frame.region_node,
        frame.no_grad,
        frame.grad_switch,
        frame.loop_depth > 0,
        frame.loop_node,
        via=via,
        inner_line=inner_line,
    )
