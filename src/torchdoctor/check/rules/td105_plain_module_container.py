from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import FileFlow, file_flow
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.values import AnyFunction, Kind, Value
from torchdoctor.check.rule import FixAvailability, Rule, Severity
from torchdoctor.check.tree_walk import walk


class PlainModuleContainer(Rule):
    """Submodules kept in a plain list, tuple or dict: not registered, moved or trained.

    ## What it does
    Finds `self.name = [...]` (or a tuple, a dict, a comprehension, or a list filled
    with `.append(...)`) in an `nn.Module` whose elements are modules built right
    there, when the container is not an `nn.ModuleList` / `nn.ModuleDict` /
    `nn.Sequential` and is not handed to one later.

    ## Why is this bad?
    `nn.Module` registers submodules only when they are assigned as attributes
    directly or held by a `ModuleList`/`ModuleDict`. Modules in a plain list are
    invisible: `model.parameters()` skips them, so the optimizer never trains
    them (the loss goes down only through the other layers); `model.to(device)`
    skips them, so `forward` fails on a GPU with `RuntimeError: Expected all
    tensors to be on the same device`; `state_dict()` does not save them, and
    `model.eval()` does not reach their dropout or batch norm.

    ## Example
    ```python
    self.blocks = [nn.Linear(dim, dim) for _ in range(layers)]
    ```

    ## Use instead
    ```python
    self.blocks = nn.ModuleList([nn.Linear(dim, dim) for _ in range(layers)])
    ```

    ## Fix safety
    The fix wraps the container in `nn.ModuleList(...)` (`nn.ModuleDict(...)` for a
    dict). It is unsafe: the parameters become trainable and part of the
    `state_dict` (old checkpoints no longer load with `strict=True`), and a dict's
    keys must be strings.

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.ModuleList.html
    - https://pytorch.org/docs/stable/generated/torch.nn.ModuleDict.html
    """

    code = "TD105"
    name = "plain-module-container"
    category = "device"
    severity = Severity.ERROR
    fix_availability = FixAvailability.UNSAFE
    triggers: ClassVar[tuple[str, ...]] = ("self.",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        for func in ff.functions():
            if func.name != "__init__" or not ff.mentions(func, "[", "{", "(", "append("):
                continue
            cls = ff.class_of(func)
            if cls is None or not ff.is_module_class(cls):
                continue
            init_text = ff.text(func)
            if any(w in init_text for w in ("add_module(", "register_module(", "setattr(")):
                continue  # the modules are registered by hand
            self._check(ff, cls, func, ff.scope(func, callers=False))

    def _check(self, ff: FileFlow, cls: ast.ClassDef, init: AnyFunction, scope: ScopeFlow) -> None:
        me = scope.self_name
        if not me:
            return
        class_text = ff.text(cls)
        seen: set[str] = set()
        for stmt in walk(init):
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            target = stmt.targets[0]
            if not (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == me
            ):
                continue
            attr = target.attr
            if attr in seen:
                continue
            seen.add(attr)
            assigned = scope.value(stmt.value)
            if assigned.kind is not Kind.CONTAINER or assigned.where:
                continue  # (`where`: made by another file's function, not built here)
            final = scope.exit_env.get(f"{me}.{attr}")
            element = _module_element(final)
            if element is None:
                continue
            wrapped = re.compile(
                rf"(?:ModuleList|ModuleDict|Sequential|ParameterList)\(\s*\*?\s*self\.{attr}\b"
                rf"|\*\s*self\.{attr}\b"
            )
            if wrapped.search(class_text):
                continue
            self._report(stmt, attr, element, appended=assigned.element is None)

    def _report(self, stmt: ast.Assign, attr: str, element: Value, *, appended: bool) -> None:
        value = stmt.value
        kind = "dict" if isinstance(value, ast.Dict | ast.DictComp) else "list"
        if isinstance(value, ast.Tuple):
            kind = "tuple"
        built = f"`{element.cls}`" if element.cls else "modules"
        how = "appended to it" if appended else "built in it"
        message = (
            f"`self.{attr}` is a plain {kind} of modules ({built} {how}, line "
            f"{element.line or stmt.lineno}): they are not registered, so `model.parameters()` "
            f"(the optimizer), `model.to(device)`, `model.eval()` and `state_dict()` do not "
            f"reach them; use `nn.{'ModuleDict' if kind == 'dict' else 'ModuleList'}`"
        )
        fix = None
        nn = _nn_prefix(self.ctx.imports)
        if nn is not None:
            wrapper = f"{nn}.{'ModuleDict' if kind == 'dict' else 'ModuleList'}"
            text = self.ctx.segment(value)
            empty = (isinstance(value, ast.List | ast.Tuple) and not value.elts) or (
                isinstance(value, ast.Dict) and not value.keys
            )
            new = f"{wrapper}()" if empty else f"{wrapper}({text})"
            fix = self.ctx.fix(f"wrap in `{wrapper}`", self.ctx.replace(value, new), safe=False)
        self.report(value, message, fix=fix)


def _module_element(value: Value | None) -> Value | None:
    """The freshly built module a container holds (None: not a container of new modules)."""
    if value is None or value.kind is not Kind.CONTAINER:
        return None
    element = value.element
    if element is None and value.items:
        element = value.items[0]
    if element is not None and element.kind is Kind.CONTAINER and element.items:
        element = element.items[-1]  # dict items: (key, module)
    if element is None or element.kind is not Kind.MODULE or not element.fresh:
        return None
    return element


def _nn_prefix(imports: dict[str, str]) -> str | None:
    """How this file spells `torch.nn` (`nn`, `torch.nn`), or None."""
    for name, target in imports.items():
        if target == "torch.nn":
            return name
    for name, target in imports.items():
        if target == "torch":
            return f"{name}.nn"
    return None
