from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import FixAvailability, Rule, Severity
from torchdoctor.check.rules._file_gate import skip_visits

_SAVES = frozenset({"torch.save", "torch.serialization.save"})


class SaveBoundStateDict(Rule):
    """`torch.save(model.state_dict, ...)` saves the bound method, not the weights.

    ## What it does
    Finds `torch.save` calls that pass `x.state_dict` without calling it, as the saved
    object itself or as a value of a dict or list literal saved
    (`torch.save({"model": model.state_dict}, path)`).

    ## Why is this bad?
    `model.state_dict` is a bound method. Pickling it pickles the object it is bound to:
    the whole model (or optimizer), class by import path. The file is not a state dict:
    `torch.load` under the `weights_only=True` default refuses it, and
    `model.load_state_dict(torch.load(path, weights_only=False))` fails with
    `TypeError: Expected state_dict to be dict-like, got <class 'method'>`. Nobody notices
    until the checkpoint is needed. On by default: it is always a bug.

    ## Example
    ```python
    torch.save(model.state_dict, "model.pt")
    ```

    ## Use instead
    ```python
    torch.save(model.state_dict(), "model.pt")
    ```

    ## Fix safety
    The fix adds the missing `()`. It is safe: a bound `state_dict` method is never what
    a checkpoint should hold.

    ## References
    - https://pytorch.org/tutorials/beginner/saving_loading_models.html
    - https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.state_dict
    """

    code = "TD407"
    name = "save-bound-state-dict"
    category = "checkpoint"
    severity = Severity.ERROR
    fix_availability = FixAvailability.SAFE
    triggers: ClassVar[tuple[str, ...]] = ("state_dict",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        if "save" not in ctx.source:
            skip_visits(self)

    def visit_words(self) -> tuple[str, ...]:
        # `call_name_in` accepts a callee whose last name or import alias is the word
        return self.ctx.call_needles(_SAVES)

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if self.ctx.call_name_in(node, _SAVES) is None:
            return
        obj = node.args[0] if node.args else None
        obj = obj or next((k.value for k in node.keywords if k.arg == "obj"), None)
        if obj is None:
            return
        for method in _bound_state_dicts(obj):
            text = self.ctx.segment(method)
            self.report(
                method,
                f"`torch.save` is given `{text}`, the bound method, not `{text}()`: it "
                "pickles the whole object the method belongs to, and the file is no state "
                "dict (`load_state_dict` fails, `weights_only=True` loading refuses it)",
                fix=self.ctx.fix(f"call `{text}()`", self.ctx.insert_after(method, "()")),
                hint=f"save `{text}()`",
            )


def _bound_state_dicts(obj: ast.expr) -> list[ast.Attribute]:
    """`x.state_dict` attributes (not called) in `obj` or in the dict/list literals it is."""
    if isinstance(obj, ast.Attribute) and obj.attr == "state_dict":
        return [obj]
    if isinstance(obj, ast.Dict):
        return [m for value in obj.values for m in _bound_state_dicts(value)]
    if isinstance(obj, ast.List | ast.Tuple):
        return [m for value in obj.elts for m in _bound_state_dicts(value)]
    return []
