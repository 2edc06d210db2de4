from __future__ import annotations

import ast
import os
import re
from typing import ClassVar

from torchdoctor.check.analysis.names import is_test_file
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.analysis.values import Passed, Wrap
from torchdoctor.check.analysis.wraps import (
    FileWraps,
    Scope,
    calls_with_parents,
    guarded,
    own_statements,
    parameter_slots,
)
from torchdoctor.check.project import WrappedFacts
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import spans_a_line, walk

_WRAPPER_WORDS = ("DataParallel", "DDP")


class SaveWrappedStateDict(Rule):
    """`state_dict()` of a `DataParallel` / `DistributedDataParallel` model saved or loaded.

    ## What it does
    Finds `model.state_dict()` saved (`torch.save(...)`, directly, inside a dict, or
    through a `save_checkpoint(...)`-style function) where `model` was wrapped in
    `nn.DataParallel` or `DistributedDataParallel` on some path before -- also a
    `self.model = DDP(...)` used in another method, a model that a function of the
    file returns wrapped (`model = load_model()`), and a parameter whose state dict a
    function saves when a call (in this file or another file of the project) hands it
    a wrapped model (`save_checkpoint(model, optimizer, path)`). And the mirror case: a
    checkpoint this file saves from the unwrapped model (`model.module.state_dict()`)
    loaded with `load_state_dict` into the wrapped model. Saves inside an `if` that
    tells wrapped and plain models apart (`hasattr(model, "module")`,
    `isinstance(model, DDP)`, ...) are left alone.

    ## Why is this bad?
    A wrapper holds the real model as its `module` attribute, so every key of its
    state dict gets a `module.` prefix: `module.conv1.weight` instead of
    `conv1.weight`. The checkpoint then fails to load into the plain model -- for
    inference, on a single-GPU or CPU machine, or in any other script:
    `RuntimeError: Error(s) in loading state_dict for Net: Missing key(s) in
    state_dict: "conv1.weight", ... Unexpected key(s) in state_dict:
    "module.conv1.weight", ...`. With `strict=False` it "loads" and silently
    keeps the random initial weights. Loading a plain checkpoint into a wrapped
    model fails the same way in the other direction.

    ## Example
    ```python
    model = nn.DataParallel(model)
    ...
    torch.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    model = nn.DataParallel(model)
    ...
    torch.save(model.module.state_dict(), "model.pt")
    ```
    or `td.save_checkpoint("model.pt", model=model)`, which strips the wrapper.

    ## References
    - https://pytorch.org/tutorials/beginner/saving_loading_models.html#saving-torch-nn-dataparallel-models
    - https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
    """

    code = "TD404"
    name = "save-wrapped-state-dict"
    category = "checkpoint"
    severity = Severity.WARNING
    # `state_dict`: a file that saves what another file's call hands it wrapped
    triggers: ClassVar[tuple[str, ...]] = ("DataParallel", "DDP", "state_dict")

    def finish(self) -> None:
        if "state_dict" not in self.ctx.source or is_test_file(self.ctx.path):
            return  # tests save wrapped checkpoints on purpose, to test them
        # What other files hand a function counts only where the function itself calls
        # `.state_dict()` (`_saved_parameters`); with no wrapper in this file's text, the
        # rest finds nothing either. So only functions on lines with `state_dict` ask
        # (each asked builds the analysis of every file that calls it).
        lines = self.ctx.lines_holding(["state_dict"])
        top = [
            f.name
            for f in self.ctx.tree.body
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and spans_a_line(f, lines)
        ]
        handed = self.ctx.project.wrapped_arguments_for(top)
        if not handed and not any(self.ctx.holds(w) for w in _WRAPPER_WORDS):
            return  # nothing wraps a model here, nor hands one to a function of this file
        fw = FileWraps(self.ctx)
        plain_saves = re.search(r"\.module\.state_dict\(\)", self.ctx.source)
        loads: list[tuple[ast.Call, str, Wrap]] = []
        saved_wrapped = False
        for scope in fw.scopes:
            if scope is not self.ctx.tree and "state_dict" not in self.ctx.segment(scope):
                continue
            for node, parents in calls_with_parents(scope):
                func = node.func
                if not isinstance(func, ast.Attribute) or func.attr not in (
                    "state_dict",
                    "load_state_dict",
                ):
                    continue
                key = dotted(func.value)
                wrap = fw.wrapped_at(scope, key, node.lineno) if key else None
                if wrap is None or guarded(parents):
                    continue
                if func.attr == "state_dict" and _saved(scope, node, parents):
                    saved_wrapped = True
                    self._report_saved(node, key or "", f"wrapped in {wrap.describe()}")
                elif (
                    func.attr == "load_state_dict"
                    and plain_saves
                    and _loads_file(node)
                    and not wrap.key.startswith("self.")  # which method runs first? unknown
                ):
                    loads.append((node, wrap.key, wrap))
        saved_wrapped |= self._saved_parameters(fw, handed)
        if plain_saves is None or saved_wrapped:
            return  # the loaded file may be one this file saved wrapped
        line = self.ctx.line_of_offset(plain_saves.start())
        for node, key, wrap in loads:
            self.report(
                node,
                f"`{key}.load_state_dict(...)` at line {node.lineno} loads into `{key}`, "
                f"wrapped in {wrap.describe()}, the checkpoints this file "
                f"saves without the wrapper (line {line}): the keys lack the `module.` "
                "prefix and do not match",
                hint=f"load into `{key}.module`",
            )

    def _saved_parameters(self, fw: FileWraps, handed: WrappedFacts) -> bool:
        """State dicts of a parameter saved by a function that a call (here, or in another
        file of the project) hands a wrapped model to."""
        given: dict[str, dict[str, Passed]] = {}  # function -> parameter -> fact
        for call, slot, passed in fw.passed():
            name = call.func.id  # type: ignore[attr-defined]
            if name in fw.top:
                given.setdefault(name, {}).setdefault(slot, passed)
        for name, facts in handed.items():
            func = fw.top.get(name)
            if func is None:
                continue
            slots = parameter_slots(func, False)
            for slot, passed in facts:
                if passed.where == self.ctx.path:
                    continue
                param = slots[int(slot)] if slot.isdigit() and int(slot) < len(slots) else slot
                if param in slots:
                    given.setdefault(name, {}).setdefault(param, passed)
        reported = False
        for name, params in given.items():
            func = fw.top[name]
            for node, parents in calls_with_parents(func):
                key = dotted(node.func.value) if isinstance(node.func, ast.Attribute) else None
                fact = params.get(key or "")
                if (
                    fact is None
                    or node.func.attr != "state_dict"  # type: ignore[attr-defined]
                    or guarded(parents)
                    or _rebound(func, key or "", node.lineno)
                    or not _saved(func, node, parents)
                ):
                    continue
                where = f"{os.path.basename(fact.where)}" if fact.where else ""
                self._report_saved(
                    node,
                    key or "",
                    f"which `{fact.caller}` passes ({where + ' ' if where else ''}line "
                    f"{fact.line}) wrapped in {fact.wrap.describe(where)}",
                )
                reported = True
        return reported

    def _report_saved(self, node: ast.Call, key: str, how: str) -> None:
        self.report(
            node,
            f"`{key}.state_dict()` at line {node.lineno} is saved while `{key}` may be a "
            f"model {how}: every key gets a `module.` prefix and the file no longer loads "
            "into the plain model",
            hint=f"save `{key}.module.state_dict()`",
        )


def _rebound(func: Scope, name: str, line: int) -> bool:
    """The parameter `name` is assigned in `func` before `line`."""
    return any(
        isinstance(stmt, ast.Assign)
        and stmt.lineno < line
        and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
        for stmt in own_statements(func)
    )


def _is_save_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return "save" in name.lower()


def _saved(fi: Scope, call: ast.Call, parents: tuple[ast.AST, ...]) -> bool:
    """Whether this `state_dict()` reaches a save call (directly, in a dict, via a name)."""
    for node in reversed(parents):
        if _is_save_call(node):
            return True
        if isinstance(node, ast.Dict | ast.List | ast.Tuple | ast.keyword | ast.Call):
            continue
        if isinstance(node, ast.Assign):
            # state = {"model": model.state_dict()} / ckpt["model"] = model.state_dict()
            for target in node.targets:
                name = dotted(target.value if isinstance(target, ast.Subscript) else target)
                if name and _name_saved(fi, name, node.lineno):
                    return True
            return False
        if isinstance(node, ast.stmt):
            return False
    return False


def _name_saved(fi: Scope, name: str, after: int) -> bool:
    pattern = re.compile(r"\b" + re.escape(name) + r"\b")
    for stmt in own_statements(fi):
        if stmt.lineno < after or isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in walk(stmt):
            if _is_save_call(node) and any(
                pattern.search(ast.unparse(a))
                for a in node.args  # type: ignore[attr-defined]
            ):
                return True
    return False


def _loads_file(call: ast.Call) -> bool:
    """`load_state_dict(torch.load(...))` or of a checkpoint entry."""
    if not call.args:
        return False
    return "load" in ast.unparse(call.args[0]) or isinstance(call.args[0], ast.Subscript)
