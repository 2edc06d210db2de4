from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.rule import Fix, FixAvailability, Rule, Severity

_VARIABLE = frozenset({"torch.autograd.Variable", "torch.autograd.variable.Variable"})
# torch functions that build a new tensor which does not require grad (unless asked).
_FACTORIES = frozenset(
    {
        "tensor",
        "as_tensor",
        "from_numpy",
        "zeros",
        "ones",
        "empty",
        "full",
        "rand",
        "randn",
        "randint",
        "randperm",
        "arange",
        "linspace",
        "logspace",
        "eye",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "Tensor",
        "FloatTensor",
        "DoubleTensor",
        "HalfTensor",
        "LongTensor",
        "IntTensor",
        "ShortTensor",
        "ByteTensor",
        "CharTensor",
        "BoolTensor",
    }
)
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)


class DeprecatedVariable(Rule):
    """`Variable(x)` / `volatile=True`: removed autograd API of PyTorch 0.3.

    ## What it does
    Finds calls of `torch.autograd.Variable(...)`, including its `volatile=`
    and `requires_grad=` arguments.

    ## Why is this bad?
    Since PyTorch 0.4 every tensor is a Variable: `Variable(x)` only returns a
    detached alias of `x` and is kept for old code. `volatile=True` was removed
    and has no effect at all (PyTorch warns `volatile was removed and now has
    no effect. Use with torch.no_grad(): instead`), so "volatile" inference
    code builds full autograd graphs and keeps every activation alive: it
    needs far more memory and time than intended.

    ## Example
    ```python
    for images, labels in loader:
        images, labels = Variable(images), Variable(labels)
    w = Variable(torch.randn(3, 5), requires_grad=True)
    logits = model(Variable(x, volatile=True))
    ```

    ## Use instead
    ```python
    for images, labels in loader:
        ...  # tensors need no wrapping
    w = torch.randn(3, 5).requires_grad_()
    with torch.no_grad():
        logits = model(x)
    ```

    ## Fix safety
    The fix drops the wrapper (`Variable(x)` → `x`, dropping `volatile=`) and
    turns `requires_grad=True` into `.requires_grad_()`. `Variable(x)` also
    detached `x` from its autograd graph, so the fix is safe where `x` is a
    fresh tensor (a factory call such as `torch.randn(...)`, or a batch from
    a data loader) and unsafe otherwise; `Variable(x, requires_grad=True)` on
    an arbitrary `x` becomes the exact equivalent `x.detach().requires_grad_()`.
    The fix does not add the `torch.no_grad()` block that `volatile=True` was
    meant to give; the message points at it.

    ## References
    - https://pytorch.org/blog/pytorch-0_4_0-migration-guide/
    """

    code = "TD602"
    name = "deprecated-variable"
    category = "deprecation"
    severity = Severity.INFO
    fix_availability = FixAvailability.SAFE
    triggers: ClassVar[tuple[str, ...]] = ("Variable",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)

    def visit_words(self) -> tuple[str, ...]:
        # `call_name_in` accepts a callee whose last name or import alias is the word
        return self.ctx.call_needles(_VARIABLE)

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if self.ctx.call_name_in(node, _VARIABLE) is None:
            return
        volatile = _keyword(node, "volatile")
        message = "`Variable(...)` is a no-op wrapper since PyTorch 0.4; use the tensor itself"
        requires_grad = _keyword(node, "requires_grad")
        if requires_grad is not None and not _is_false(requires_grad):
            # not a no-op: it makes a new leaf that requires grad, which the tensor is not
            message = (
                "`Variable(x, requires_grad=...)` is a legacy wrapper since PyTorch 0.4; "
                "use `x.detach().requires_grad_()` (or `.requires_grad_()` on a new tensor)"
            )
        if volatile is not None and _is_true(volatile):
            message = (
                "`Variable(..., volatile=True)` has had no effect since PyTorch 0.4: "
                "autograd still records the graph; run this under `with torch.no_grad():`"
            )
        elif volatile is not None and not _is_false(volatile):
            # a computed flag: where it is true the graph is recorded all the same, and
            # whether that path wants gradients the code decides, not this rule
            message = (
                f"`Variable(..., volatile={self.ctx.segment(volatile)})` is a legacy wrapper "
                "and `volatile` has had no effect since PyTorch 0.4; use the tensor itself, "
                "under `torch.no_grad()` where gradients are not wanted"
            )
        self.report(node, message, fix=self._fix(node))

    def _fix(self, call: ast.Call) -> Fix | None:
        if len(call.args) != 1 or isinstance(call.args[0], ast.Starred):
            return None
        if any(kw.arg not in ("requires_grad", "volatile") for kw in call.keywords):
            return None
        requires_grad = _keyword(call, "requires_grad")
        if requires_grad is not None and not isinstance(requires_grad, ast.Constant):
            return None  # a computed flag: no mechanical rewrite
        data = call.args[0]
        text = self.ctx.segment(data)
        if not isinstance(data, _ATOMS):
            text = f"({text})"
        fresh = self._fresh(data)
        if requires_grad is not None and requires_grad.value is True:
            if fresh:
                return self.ctx.fix(
                    f"replace with `{text}.requires_grad_()`",
                    self.ctx.replace(call, f"{text}.requires_grad_()"),
                )
            return self.ctx.fix(
                f"replace with `{text}.detach().requires_grad_()`",
                self.ctx.replace(call, f"{text}.detach().requires_grad_()"),
            )
        return self.ctx.fix(
            f"replace with `{text}`"
            + ("" if fresh else " (unsafe: `Variable` also detached it; use .detach() if needed)"),
            self.ctx.replace(call, text),
            safe=fresh,
        )

    def _fresh(self, data: ast.expr) -> bool:
        """A new tensor that cannot require grad: a factory call (and methods on one),
        or a batch unpacked from a data loader."""
        while isinstance(data, ast.Call) and isinstance(data.func, ast.Attribute):
            name = self.ctx.qualname(data.func) or ""
            if name.startswith("torch."):
                return name.rsplit(".", 1)[-1] in _FACTORIES and not any(
                    kw.arg == "requires_grad" for kw in data.keywords
                )
            data = data.func.value  # `torch.randn(3).float()`: look at the receiver
        if isinstance(data, ast.Call):
            name = self.ctx.qualname(data.func) or ""
            return name.startswith("torch.") and name.rsplit(".", 1)[-1] in _FACTORIES
        if isinstance(data, ast.Name):
            return self._loader_batch(data.id)
        return False

    def _loader_batch(self, name: str) -> bool:
        """`for images, labels in train_loader:` binds `name` in an enclosing loop."""
        for node in self.ctx.stack:
            if isinstance(node, ast.For) and "loader" in self.ctx.segment(node.iter).lower():
                targets = [node.target]
                while targets:
                    target = targets.pop()
                    if isinstance(target, ast.Name) and target.id == name:
                        return True
                    if isinstance(target, ast.Tuple | ast.List):
                        targets.extend(target.elts)
        return False


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _is_false(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
