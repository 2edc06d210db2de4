from __future__ import annotations

import ast
from typing import TYPE_CHECKING, ClassVar

from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# Attributes that hold a tensor on any module or tensor: `m.weight.data`, `p.grad.data`.
_TENSOR_ATTRIBUTES = frozenset({"weight", "bias", "grad", "running_mean", "running_var"})
# Iterators that yield parameters or buffers (`named_*` yield (name, tensor) pairs).
_PARAMETER_ITERATORS = frozenset({"parameters", "buffers"})
_NAMED_ITERATORS = frozenset({"named_parameters", "named_buffers"})


class TensorData(Rule):
    """`.data` on a tensor or parameter: bypasses autograd silently.

    ## What it does
    Finds `.data` on values that are certainly tensors: parameters and their
    gradients (`m.weight.data`, `self.fc.bias.data`, `p.grad.data`),
    the loop variable of `for p in model.parameters()` /
    `for name, p in model.named_parameters()` / `for p in group["params"]`,
    tensors just built by torch (`torch.zeros(3).data`, a name bound to
    `nn.Parameter(...)`), and losses (`loss.data`). Other `.data` attributes —
    `dataset.data`, `batch.data`, `self.data` — are not tensors of this kind and
    are left alone.

    This rule is off by default: well-kept code (weight initialisation, EMA
    updates, custom optimizers in timm, fairseq and PyTorch itself) uses
    `p.data` on purpose, where it is harmless. Turn it on to modernise a code
    base: `--extend-select TD207`.

    ## Why is this bad?
    `x.data` is the same storage as `x` with autograd switched off and the
    version counter bypassed. Reading it hides that the value is detached;
    writing through it (`x.data.mul_(2)`, `p.data = new`) changes a tensor that
    autograd may already have saved for the backward pass *without* the
    `RuntimeError: one of the variables needed for gradient computation has
    been modified by an inplace operation` that `.detach()` or `no_grad`
    updates would raise — the gradients come out silently wrong. `loss.data`
    kept for logging also keeps a tensor (and its device memory) alive where a
    Python number would do.

    ## Example
    ```python
    for p in model.parameters():
        p.data.add_(p.grad.data, alpha=-lr)
    running_loss += loss.data
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)
    running_loss += loss.item()
    ```
    (`x.detach()` to read a value without gradients; `nn.init.*_` for weight
    initialisation.)

    ## References
    - https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html
    - https://pytorch.org/blog/pytorch-0_4_0-migration-guide/#what-about-data
    """

    code = "TD207"
    name = "tensor-data"
    category = "training"
    group = "advice"
    severity = Severity.INFO
    triggers: ClassVar[tuple[str, ...]] = (".data",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Attribute,)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._loop_tensors: dict[int, set[str]] = {}

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Attribute)
        if node.attr != "data":
            return
        parent = self.ctx.stack[-1] if self.ctx.stack else None
        if isinstance(parent, ast.Attribute) and parent.attr == "data":
            return  # `x.data.data`: reported once, at the inner one
        why = self._tensor_evidence(node.value)
        if why is None:
            return
        text = self.ctx.segment(node.value)
        if len(text) > 40:
            text = text[:37] + "..."
        if isinstance(node.ctx, ast.Store):
            advice = f"assign under `torch.no_grad()`: `{text}.copy_(...)`"
        else:
            advice = f"use `{text}.detach()` to read, or update `{text}` under `torch.no_grad()`"
        self.report(
            node,
            f"`{text}.data` ({why}) bypasses autograd and its in-place checks; {advice}",
        )

    def _tensor_evidence(self, value: ast.expr) -> str | None:
        if isinstance(value, ast.Attribute) and value.attr in _TENSOR_ATTRIBUTES:
            return f"`.{value.attr}` is a tensor"
        if isinstance(value, ast.Call):
            name = self.ctx.qualname(value.func) or ""
            if name.startswith("torch.") and name.rsplit(".", 1)[-1][:1].islower():
                return f"`{name}(...)` returns a tensor"
            if name in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
                return "a parameter"
            return None
        if not isinstance(value, ast.Name):
            return None
        lowered = value.id.lower()
        if "loss" in lowered and "losses" not in lowered:
            return f"`{value.id}` is a loss tensor"
        if value.id in self._parameter_names():
            return f"`{value.id}` iterates over parameters"
        return None

    def _parameter_names(self) -> set[str]:
        """Names bound by loops over parameters in the enclosing function (or module):
        `for p in model.parameters()`, `for n, p in m.named_parameters()`,
        `for p in group["params"]`, and the same in comprehensions."""
        scope = self.ctx.enclosing_function() or self.ctx.tree
        names = self._loop_tensors.get(id(scope))
        if names is None:
            names = set()
            for sub in walk(scope):
                if isinstance(sub, ast.For | ast.comprehension):
                    names.update(self._loop_parameter(sub.target, sub.iter))
                elif isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
                    built = self.ctx.qualname(sub.value.func) or ""
                    if built in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
                        names.update(t.id for t in sub.targets if isinstance(t, ast.Name))
            self._loop_tensors[id(scope)] = names
        return names

    def _loop_parameter(self, target: ast.expr, iterable: ast.expr) -> list[str]:
        # for p in model.parameters() / for name, p in model.named_parameters()
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute):
            method = iterable.func.attr
            if method in _PARAMETER_ITERATORS and isinstance(target, ast.Name):
                return [target.id]
            if (
                method in _NAMED_ITERATORS
                and isinstance(target, ast.Tuple)
                and len(target.elts) == 2
                and isinstance(target.elts[1], ast.Name)
            ):
                return [target.elts[1].id]
        # for p in group["params"]
        if (
            isinstance(iterable, ast.Subscript)
            and isinstance(iterable.slice, ast.Constant)
            and iterable.slice.value == "params"
            and isinstance(target, ast.Name)
        ):
            return [target.id]
        return []
