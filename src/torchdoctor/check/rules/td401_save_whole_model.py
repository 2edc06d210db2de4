from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.torch_api import MODULE_ONLY_SAVED_METHODS
from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._file_gate import has_word, skip_visits
from torchdoctor.check.tree_walk import walk, walk_statements

_SAVES = frozenset({"torch.save", "torch.serialization.save"})
# Methods that return the module itself (or a converted copy of it).
_MODULE_METHODS = frozenset(
    {"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "eval", "train", "module"}
)
# Names that, in PyTorch code, mean a module when nothing in the function says otherwise.
_MODEL_NAME = re.compile(
    r"(model|net|network|generator|discriminator|encoder|decoder|classifier|backbone|"
    r"net[GD]|G|D|G_[A-Z]{2}|D_[A-Z])",
    re.IGNORECASE,
)
_MODEL_SUFFIX = re.compile(r"(^|_)(model|net)$", re.IGNORECASE)
# Calls whose result is no module.
_NOT_MODULES = frozenset(
    {"state_dict", "dict", "OrderedDict", "load", "load_state_dict", "get", "copy", "items"}
)
# Factories that build modules.
_MODULE_FACTORIES = re.compile(
    r"^(torchvision\.models\.|timm\.create_model$|torch\.hub\.load$)|\.from_pretrained$"
)


class SaveWholeModel(Rule):
    """`torch.save(model, ...)` pickles the module object: save `model.state_dict()`.

    ## What it does
    Finds `torch.save` calls whose first argument is a module itself: `self`
    inside an `nn.Module`, a name or attribute built from a module class
    (`model = Net()`, `self.net = torchvision.models.resnet18()`), a module parameter
    (`model: nn.Module`), `model.module`, `model.cpu()`, ..., or a variable
    named like a model (`model`, `net`, `netG`, `encoder`, `*_model`) that the
    function does not bind to anything else (a dict, a `state_dict()`, a
    loaded checkpoint), or an attribute so named (`self.model`, `self.trainer.model`)
    that the file does not bind to anything else. A loaded object, or one built by a
    class the run cannot see, counts as a module where the function calls a method only modules have
    on it (`net.parameters()`, `net.train()`, `net.named_modules()`).

    Dicts are left alone, even with a module inside: checkpoint dicts that
    pickle a model on purpose (YOLOv5 does) are a deliberate format choice.

    ## Why is this bad?
    Pickling a module stores a reference to its class by import path, not its
    code. Loading it needs the very same class at the very same module path:
    after renaming a file, moving the class or changing its attributes,
    `torch.load` fails with `AttributeError: Can't get attribute 'Net' on
    <module '__main__'>` or `ModuleNotFoundError`, or silently builds a stale
    object. The file is also tied to the saving device and, since PyTorch 2.6,
    can only be loaded with `weights_only=False` — full pickle, which runs
    arbitrary code (TD403).

    ## Example
    ```python
    torch.save(model, "model.pt")
    model = torch.load("model.pt")
    ```

    ## Use instead
    ```python
    torch.save(model.state_dict(), "model.pt")
    model = Net()
    model.load_state_dict(torch.load("model.pt", map_location="cpu"))
    ```
    or `td.save_checkpoint("model.pt", model=model, optimizer=optimizer)`.

    ## References
    - https://pytorch.org/tutorials/beginner/saving_loading_models.html
    """

    code = "TD401"
    name = "save-whole-model"
    category = "checkpoint"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("save",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        if not has_word(ctx.source, "save"):
            skip_visits(self)  # `x.save(` or an import of torch's `save` names the word

    def visit_words(self) -> tuple[str, ...]:
        # `call_name_in` accepts a callee whose last name or import alias is the word
        return self.ctx.call_needles(_SAVES)

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if not node.args or self.ctx.call_name_in(node, _SAVES) is None:
            return
        obj = node.args[0]
        why = self._module_evidence(obj, node.lineno, depth=2)
        if why is None:
            return
        text = self.ctx.segment(obj)
        if len(text) > 40:
            text = text[:37] + "..."
        self.report(
            node,
            f"`torch.save({text}, ...)` pickles the whole module ({why}): loading needs "
            "the same class at the same import path and `weights_only=False`; save "
            f"`{text}.state_dict()`",
            hint="save `model.state_dict()` and rebuild the model before `load_state_dict`",
        )

    def _module_evidence(self, obj: ast.expr, line: int, depth: int) -> str | None:
        """Why `obj` is an nn.Module (a short phrase), or None."""
        if depth < 0:
            return None
        if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Attribute):
            if obj.func.attr in _MODULE_METHODS:
                return self._module_evidence(obj.func.value, line, depth - 1)
            return self._constructed_module(obj)
        if isinstance(obj, ast.Call):
            return self._constructed_module(obj)
        if isinstance(obj, ast.Attribute) and obj.attr == "module":
            return self._module_evidence(obj.value, line, depth - 1)
        if isinstance(obj, ast.Attribute):
            return self._attribute_module(obj, depth)
        if not isinstance(obj, ast.Name):
            return None
        if obj.id == "self":
            cls = self.ctx.enclosing_class()
            if cls is not None and self.ctx.is_module_class(cls):
                return f"`self` is the module `{cls.name}`"
            return None
        return self._named_module(obj.id, line, depth)

    def _not_a_module(self, value: ast.expr) -> bool:
        """Bound to a dict, a state dict, a loaded checkpoint or a plain value."""
        if not isinstance(value, ast.Call):
            return True  # a literal, comprehension, name, subscript, ...
        name = self.ctx.qualname(value.func) or ""
        last = name.rsplit(".", 1)[-1]
        return last in _NOT_MODULES or name in ("torch.load", "torch.jit.load")

    def _loaded(self, value: ast.expr) -> bool:
        return isinstance(value, ast.Call) and self.ctx.qualname(value.func) in (
            "torch.load",
            "torch.serialization.load",
        )

    def _used_as_module(self, scope: ast.AST, name: str, line: int) -> str | None:
        """`name.parameters()`, `name.train()`, ... before `line`: only a module has them."""
        for sub in walk(scope):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in MODULE_ONLY_SAVED_METHODS
                and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id == name
                and sub.lineno < line
            ):
                return f"`{name}.{sub.func.attr}()` at line {sub.lineno} is a module's method"
        return None

    def _constructed_module(self, call: ast.Call) -> str | None:
        name = self.ctx.qualname(call.func) or ""
        last = name.rsplit(".", 1)[-1]
        if (name.startswith("torch.nn.") and last[:1].isupper()) or (
            self.ctx.project.is_module_class_name(name) and last[:1].isupper()
        ):
            return f"built by `{last}(...)`"
        if _MODULE_FACTORIES.search(name):
            return f"built by `{name}(...)`"
        return None

    def _attribute_module(self, obj: ast.Attribute, depth: int) -> str | None:
        """An attribute named like a model (`self.model`, `self.trainer.net`), unless the
        file binds that attribute to something else (a dict, a name string, a state dict)
        -- where the file builds it, what it is bound to decides."""
        if not (_MODEL_NAME.fullmatch(obj.attr) or _MODEL_SUFFIX.search(obj.attr)):
            return None
        text = self.ctx.segment(obj)
        for sub in walk_statements(self.ctx.tree):
            if not isinstance(sub, ast.Assign | ast.AnnAssign) or sub.value is None:
                continue
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            if not any(self.ctx.segment(t) == text for t in targets) or (
                isinstance(sub.value, ast.Constant) and sub.value.value is None
            ):
                continue  # another attribute, or a placeholder filled later
            why = self._module_evidence(sub.value, sub.lineno, depth - 1)
            if why is not None:
                return why
            if self._not_a_module(sub.value) or self._loaded(sub.value):
                return None
        return f"`{text}` names a model"

    def _named_module(self, name: str, line: int, depth: int) -> str | None:
        """A name's latest binding before `line` in this function (or module) decides;
        with no binding, a module-typed parameter or a model-like name does."""
        scope = self.ctx.enclosing_function() or self.ctx.tree
        latest: ast.expr | None = None
        latest_line = -1
        for sub in walk(scope):
            if isinstance(sub, ast.Assign | ast.AnnAssign) and sub.value is not None:
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                if (
                    any(isinstance(t, ast.Name) and t.id == name for t in targets)
                    and latest_line < sub.lineno < line
                ):
                    latest, latest_line = sub.value, sub.lineno
            elif isinstance(sub, ast.For | ast.comprehension | ast.With | ast.withitem):
                target = getattr(sub, "target", None) or getattr(sub, "optional_vars", None)
                if target is not None and any(
                    isinstance(t, ast.Name) and t.id == name for t in walk(target)
                ):
                    return None  # a loop or `with` variable: unknown
        if latest is not None:
            why = self._module_evidence(latest, latest_line, depth - 1)
            if why is not None:
                return why
            if self._not_a_module(latest) and not self._loaded(latest):
                return None
            # A loaded object, or a call of a class this run cannot see: how the code
            # uses the name decides (`net.parameters()` only exists on a module).
            return self._used_as_module(scope, name, line)
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs):
                if arg.arg == name and arg.annotation is not None:
                    annotation = self.ctx.segment(arg.annotation)
                    if "Module" in annotation:
                        return f"`{name}: {annotation}`"
                    return None  # annotated as something else
        if _MODEL_NAME.fullmatch(name) or _MODEL_SUFFIX.search(name):
            return f"`{name}` names a model"
        return None
