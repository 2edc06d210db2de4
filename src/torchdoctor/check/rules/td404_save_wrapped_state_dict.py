from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import ClassVar

from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.names import is_test_file
from torchdoctor.check.analysis.syntax import dotted, last_part
from torchdoctor.check.context import iter_children, walk
from torchdoctor.check.rule import Rule, Severity

_WRAPPERS = frozenset({"DataParallel", "DistributedDataParallel", "DDP"})
# An `if` that tells wrapped from plain models apart: the code already handles the prefix.
_GUARD_WORDS = re.compile(r"module|DataParallel|DDP|isinstance|hasattr")


@dataclass(frozen=True)
class Wrap:
    key: str
    line: int
    wrapper: str


class SaveWrappedStateDict(Rule):
    """`state_dict()` of a `DataParallel` / `DistributedDataParallel` model saved or loaded.

    ## What it does
    Finds `model.state_dict()` saved (`torch.save(...)`, directly, inside a dict, or
    through a `save_checkpoint(...)`-style function) where `model` was wrapped in
    `nn.DataParallel` or `DistributedDataParallel` on some path before -- also a
    `self.model = DDP(...)` used in another method. And the mirror case: a
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
    triggers: ClassVar[tuple[str, ...]] = ("DataParallel", "DDP")

    def finish(self) -> None:
        if "state_dict" not in self.ctx.source or is_test_file(self.ctx.path):
            return  # tests save wrapped checkpoints on purpose, to test them
        fl = analysis(self.ctx)
        class_wraps = self._class_wraps()
        plain_saves = re.search(r"\.module\.state_dict\(\)", self.ctx.source)
        loads: list[tuple[ast.Call, str, Wrap]] = []
        saved_wrapped = False
        for fi in fl.all_functions():
            if "state_dict" not in fi.text:
                continue
            wraps = self._wraps(fi)
            if fi.cls is not None:
                wraps.extend(class_wraps.get(fi.cls.name, []))
            if not wraps:
                continue
            for node, parents in _calls_with_parents(fi):
                func = node.func
                if not isinstance(func, ast.Attribute) or func.attr not in (
                    "state_dict",
                    "load_state_dict",
                ):
                    continue
                key = dotted(func.value)
                wrap = self._wrapped_at(fi, wraps, key, node.lineno) if key else None
                if wrap is None or _guarded(parents):
                    continue
                if func.attr == "state_dict" and _saved(fi, node, parents):
                    saved_wrapped = True
                    self.report(
                        node,
                        f"`{key}.state_dict()` at line {node.lineno} is saved while `{key}` is "
                        f"wrapped in `{wrap.wrapper}` (line {wrap.line}): every key gets a "
                        "`module.` prefix and the file no longer loads into the plain model",
                        hint=f"save `{key}.module.state_dict()`",
                    )
                elif (
                    func.attr == "load_state_dict"
                    and plain_saves
                    and _loads_file(node)
                    and not wrap.key.startswith("self.")  # which method runs first? unknown
                ):
                    loads.append((node, wrap.key, wrap))
        if plain_saves is None or saved_wrapped:
            return  # the loaded file may be one this file saved wrapped
        line = self.ctx.line_of_offset(plain_saves.start())
        for node, key, wrap in loads:
            self.report(
                node,
                f"`{key}.load_state_dict(...)` at line {node.lineno} loads into `{key}`, "
                f"wrapped in `{wrap.wrapper}` (line {wrap.line}), the checkpoints this file "
                f"saves without the wrapper (line {line}): the keys lack the `module.` "
                "prefix and do not match",
                hint=f"load into `{key}.module`",
            )

    def _wraps(self, fi: FunctionInfo) -> list[Wrap]:
        found = []
        for stmt in fi.own_statements():
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                key = dotted(stmt.targets[0])
                wrapper = self._wrapper(stmt.value)
                if key and wrapper and not key.startswith("self."):
                    found.append(Wrap(key, stmt.lineno, wrapper))
        return found

    def _class_wraps(self) -> dict[str, list[Wrap]]:
        found: dict[str, list[Wrap]] = {}
        for name, methods in analysis(self.ctx).methods.items():
            for method in methods.values():
                for stmt in method.own_statements():
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                        key = dotted(stmt.targets[0])
                        wrapper = self._wrapper(stmt.value)
                        if key and wrapper and key.startswith("self."):
                            found.setdefault(name, []).append(Wrap(key, stmt.lineno, wrapper))
        return found

    def _wrapper(self, value: ast.expr) -> str | None:
        """`DataParallel` for `nn.DataParallel(model).cuda()` and the like."""
        while (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in ("to", "cuda", "cpu", "half", "float")
        ):
            value = value.func.value
        if not isinstance(value, ast.Call):
            return None
        name = self.ctx.qualname(value.func) or ""
        last = last_part(name)
        if last in _WRAPPERS and (name.startswith("torch.") or last != "DDP" or "DDP" in name):
            return "DistributedDataParallel" if last == "DDP" else last
        return None

    def _wrapped_at(self, fi: FunctionInfo, wraps: list[Wrap], key: str, line: int) -> Wrap | None:
        """The wrap of `key` in effect at `line`, unless `key` was rebound since."""
        candidates = [
            w for w in wraps if w.key == key and (w.line < line or key.startswith("self."))
        ]
        if not candidates:
            return None
        wrap = max(candidates, key=lambda w: w.line)
        if key.startswith("self."):
            return wrap
        for stmt in fi.own_statements():
            if (
                wrap.line < stmt.lineno < line
                and isinstance(stmt, ast.Assign)
                and (
                    any(dotted(t) == key for t in stmt.targets)
                    and self._wrapper(stmt.value) is None
                )
            ):
                return None
        return wrap


def _calls_with_parents(fi: FunctionInfo) -> list[tuple[ast.Call, tuple[ast.AST, ...]]]:
    out: list[tuple[ast.Call, tuple[ast.AST, ...]]] = []
    for stmt in fi.body:
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if isinstance(stmt, ast.Call):
                out.append((stmt, ()))
            _collect_calls(stmt, (stmt,), out)
    return out


def _collect_calls(
    node: ast.AST,
    parents: tuple[ast.AST, ...],
    out: list[tuple[ast.Call, tuple[ast.AST, ...]]],
) -> None:
    # not a closure: one that calls itself is a reference cycle for the cyclic GC
    for child in iter_children(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(child, ast.Call):
            out.append((child, (*parents, node)))
        _collect_calls(child, (*parents, node), out)


def _guarded(parents: tuple[ast.AST, ...]) -> bool:
    """Inside an `if` that tells wrapped and plain models apart: its test looks at the
    wrapper (`hasattr(model, "module")`), or its other branch unwraps (`model.module`)."""
    for i, node in enumerate(parents):
        if not isinstance(node, ast.If | ast.IfExp):
            continue
        if _GUARD_WORDS.search(ast.unparse(node.test)):
            return True
        inside = parents[i + 1] if i + 1 < len(parents) else None
        body = node.body if isinstance(node.body, list) else [node.body]
        orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
        other = orelse if any(inside is b for b in body) else body
        if any(".module" in ast.unparse(b) for b in other):
            return True
    return False


def _is_save_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return "save" in name.lower()


def _saved(fi: FunctionInfo, call: ast.Call, parents: tuple[ast.AST, ...]) -> bool:
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


def _name_saved(fi: FunctionInfo, name: str, after: int) -> bool:
    pattern = re.compile(r"\b" + re.escape(name) + r"\b")
    for stmt in fi.own_statements():
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
