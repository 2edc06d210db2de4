from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import ClassVar

from torchdoctor.check.analysis.scope_index import calls_on_lines
from torchdoctor.check.context import walk
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._unpicklable import Finder, Unpicklable

# Methods by which a class controls how pickle stores its objects.
_PICKLE_HOOKS = frozenset({"__getstate__", "__setstate__", "__reduce__", "__reduce_ex__"})
_MODULE_METHODS = frozenset({"cpu", "to", "cuda", "eval", "train", "half", "float"})
_PICKLES = frozenset({"pickle.dump", "pickle.dumps", "torch.save", "torch.serialization.save"})
_PICKLE_NAMES = frozenset(name.rsplit(".", 1)[-1] for name in _PICKLES)
# Names that, in PyTorch code, mean a module when nothing else is known (as TD401).
_MODEL_NAME = re.compile(
    r"(model|net|network|generator|discriminator|encoder|decoder|classifier|backbone)"
    r"|\w*_(model|net)",
    re.IGNORECASE,
)


class UnpicklableModuleAttribute(Rule):
    """A lambda or local function stored on an `nn.Module` that the program pickles whole.

    ## What it does
    In a file that pickles whole modules -- `torch.save(model, ...)`, `torch.save(self,
    ...)` in a module, `pickle.dump(model, ...)` -- finds, in the file's `nn.Module`
    classes, attributes set to a lambda or a function defined inside a method
    (`self.act = lambda x: x * 2`), and lambdas or local functions given to such a class's
    constructor when the class stores that argument on `self`
    (`Lambda(lambda x: x.view(-1))` with `self.fn = fn`).

    The same in a file that writes pickling hooks (`__getstate__`, `__setstate__`,
    `__reduce__`) for one class of a family: its other classes that share a base of the
    project (and define no hook of their own) are pickled too.

    Files that pickle no whole module are left alone: a lambda on a module whose
    `state_dict()` is saved is harmless.

    ## Why is this bad?
    Pickling a module pickles its `__dict__`, attributes included, and pickle cannot
    store a lambda or a local function: `torch.save(model, path)` fails with
    `AttributeError: Can't pickle local object 'Net.__init__.<locals>.<lambda>'`
    (or `PicklingError: Can't pickle <function <lambda>>`) -- typically at the end of
    the first epoch, when the first checkpoint is written. On by default: with the
    whole-model save in the same file, it always fails.

    ## Example
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.act = lambda x: x.clamp(min=0)

    torch.save(Net(), "net.pt")
    ```

    ## Use instead
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.act = nn.ReLU()        # or a method, or a module-level function

    torch.save(Net().state_dict(), "net.pt")
    ```

    ## Fix safety
    No fix is offered.

    ## References
    - https://docs.python.org/3/library/pickle.html#what-can-be-pickled-and-unpickled
    - https://pytorch.org/tutorials/beginner/saving_loading_models.html
    """

    code = "TD405"
    name = "unpicklable-module-attribute"
    category = "checkpoint"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("lambda",)

    def finish(self) -> None:
        saved = self._pickled_module()
        families = self._pickled_families()
        if saved is None and not families:
            return
        for cls in walk(self.ctx.tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            if saved is not None and self.ctx.is_module_class(cls):
                why = (
                    f"`{self.ctx.segment(saved.func)}` at line {saved.lineno} pickles the "
                    "whole module"
                )
            elif cls.name in families:
                why = families[cls.name]
            else:
                continue
            stored_params: dict[str, str] = {}  # constructor parameter -> attribute
            for method in cls.body:
                if not isinstance(method, ast.FunctionDef):
                    continue
                finder = Finder(self.ctx, method)
                params = {a.arg for a in (*method.args.args, *method.args.kwonlyargs)}
                for node in walk(method):
                    if not isinstance(node, ast.Assign):
                        continue
                    attrs = [_self_attribute(t) for t in node.targets]
                    attr = next((a for a in attrs if a), None)
                    if attr is None:
                        continue
                    for u in finder.find(node.value, node.lineno):
                        self._report(u, f"`self.{attr}` of `{cls.name}`", why)
                    if (
                        method.name == "__init__"
                        and isinstance(node.value, ast.Name)
                        and node.value.id in params
                    ):
                        stored_params[node.value.id] = attr
            if stored_params:
                self._constructor_arguments(cls, stored_params, why)

    def _pickled_families(self) -> dict[str, str]:
        """Classes of this file whose objects the file shows are pickled: a class that
        shares a base of the project with one defining `__getstate__`/`__setstate__`
        (the file writes pickling hooks for that family), but defines none itself
        (its own hook may drop what pickle cannot store). Class name -> why."""
        if "state__" not in self.ctx.source and "__reduce" not in self.ctx.source:
            return {}
        classes = [c for c in self.ctx.tree.body if isinstance(c, ast.ClassDef)]
        hooked: dict[str, tuple[str, int]] = {}  # class -> (hook, line)
        for cls in classes:
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name in _PICKLE_HOOKS:
                    hooked.setdefault(cls.name, (item.name, item.lineno))
        found: dict[str, str] = {}
        for hook_cls in classes:
            if hook_cls.name not in hooked:
                continue
            bases = _project_bases(hook_cls, self.ctx.qualname)
            hook, line = hooked[hook_cls.name]
            for cls in classes:
                if cls.name in hooked or cls.name in found:
                    continue
                shared = bases & _project_bases(cls, self.ctx.qualname)
                if shared:
                    found[cls.name] = (
                        f"`{hook_cls.name}.{hook}` at line {line} shows that this file's "
                        f"`{sorted(shared)[0]}` objects are pickled"
                    )
        return found

    def _constructor_arguments(self, cls: ast.ClassDef, stored: dict[str, str], why: str) -> None:
        """Lambdas given to `cls(...)` for a parameter that `__init__` stores on self."""
        init = next(m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__")
        positional = [a.arg for a in init.args.args[1:]]
        for scope, call in calls_on_lines(self.ctx, self.ctx.lines_holding([cls.name])):
            if not (isinstance(call.func, ast.Name) and call.func.id == cls.name):
                continue
            finder = Finder(self.ctx, scope)
            given = dict(zip(positional, call.args, strict=False))
            given.update({k.arg: k.value for k in call.keywords if k.arg})
            for param, attr in stored.items():
                for u in finder.find(given.get(param), call.lineno, depth=1):
                    self._report(u, f"`self.{attr}` of `{cls.name}`", why)

    def _pickled_module(self) -> ast.Call | None:
        """A call in this file that pickles a whole module, if any."""
        if not any(f"{last}(" in self.ctx.source for last in _PICKLE_NAMES):
            return None  # cheap first: most files with a lambda pickle nothing
        lines = self.ctx.lines_holding([f"{last}(" for last in _PICKLE_NAMES])
        for scope, call in calls_on_lines(self.ctx, lines):
            func = call.func
            last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if (
                call.args
                and last in _PICKLE_NAMES
                and (self.ctx.qualname(func) or "") in _PICKLES
                and self._is_module(call.args[0], scope, call.lineno)
            ):
                return call
        return None

    def _is_module(self, obj: ast.expr, scope: ast.AST, line: int) -> bool:
        while isinstance(obj, ast.Call) and isinstance(obj.func, ast.Attribute):
            if obj.func.attr not in _MODULE_METHODS:
                return False
            obj = obj.func.value
        if isinstance(obj, ast.Attribute) and obj.attr == "module":
            obj = obj.value
        if not isinstance(obj, ast.Name):
            return False
        if obj.id == "self":
            return any(
                isinstance(c, ast.ClassDef)
                and self.ctx.is_module_class(c)
                and any(m is scope for m in c.body)
                for c in walk(self.ctx.tree)
            )
        bound = Finder(self.ctx, scope).binding(obj.id, line)
        if bound is None:
            return bool(_MODEL_NAME.fullmatch(obj.id))  # a parameter or a global
        return self._is_module(bound, scope, line) or (
            isinstance(bound, ast.Call) and self._builds_module(bound)
        )

    def _builds_module(self, call: ast.Call) -> bool:
        name = self.ctx.qualname(call.func) or ""
        last = name.rsplit(".", 1)[-1]
        if not last[:1].isupper():
            return False
        return name.startswith("torch.nn.") or self.ctx.project.is_module_class_name(name)

    def _report(self, u: Unpicklable, where: str, why: str) -> None:
        self.report(
            u.node,
            f"{u.what} stored as {where}, and {why}: pickle cannot store it "
            "(`Can't pickle local object`)",
            hint="use a module (`nn.ReLU()`), a method or a module-level function; or save "
            "`state_dict()`",
        )


def _project_bases(cls: ast.ClassDef, qualname: Callable[[ast.expr], str | None]) -> set[str]:
    """The bases of `cls` that are classes of the project (not torch's, not `object`)."""
    found: set[str] = set()
    for base in cls.bases:
        name = qualname(base) or ""
        if name and name != "object" and not name.startswith(("torch.", "typing.", "abc.")):
            found.add(name)
    return found


def _self_attribute(target: ast.expr) -> str | None:
    if (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    ):
        return target.attr
    return None
