from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.rule import FixAvailability, Rule, Severity

# name -> how many positional arguments reach `use_reentrant` (None: never positional)
_CHECKPOINTS: dict[str, int | None] = {
    "torch.utils.checkpoint.checkpoint": None,  # checkpoint(function, *args, use_reentrant=...)
    "torch.utils.checkpoint.checkpoint_sequential": 4,  # (functions, segments, input, use_r...)
}
_CHECKPOINT_NAMES = frozenset(_CHECKPOINTS)


class CheckpointReentrant(Rule):
    """`torch.utils.checkpoint.checkpoint(...)` without `use_reentrant=`.

    ## What it does
    Finds calls of `torch.utils.checkpoint.checkpoint` and
    `checkpoint_sequential` that do not pass `use_reentrant` (directly or
    through `**kwargs`).

    ## Why is this bad?
    Without the argument PyTorch warns on every call (`torch.utils.checkpoint:
    the use_reentrant parameter should be passed explicitly`) and falls back to
    the old reentrant implementation, which the documentation recommends
    against and has announced will become an error. The reentrant variant has
    a silent failure mode: when none of the tensors passed in requires grad —
    typically the first checkpointed block, fed the input batch — the block's
    output does not require grad either, so **its parameters get no gradients
    and never train** (only a `UserWarning: None of the inputs have
    requires_grad=True` hints at it). It also does not support
    `torch.autograd.grad`, keyword arguments or detaching inside the block.

    ## Example
    ```python
    from torch.utils.checkpoint import checkpoint

    h = checkpoint(self.block, x)
    ```

    ## Use instead
    ```python
    h = checkpoint(self.block, x, use_reentrant=False)
    ```

    ## Fix safety
    The fix adds `use_reentrant=False`, the variant PyTorch recommends. It is
    unsafe because it changes behaviour: blocks fed only tensors that do not
    require grad start producing gradients (usually the intent), and code that
    relies on reentrant-only behaviour differs. Pass `use_reentrant=True` to
    keep the old behaviour explicitly.

    ## References
    - https://pytorch.org/docs/stable/checkpoint.html
    """

    code = "TD604"
    name = "checkpoint-reentrant"
    category = "training"
    severity = Severity.WARNING
    fix_availability = FixAvailability.UNSAFE
    triggers: ClassVar[tuple[str, ...]] = ("checkpoint",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)

    def visit_words(self) -> tuple[str, ...]:
        # `call_name_in` accepts a callee whose last name or import alias is the word
        return self.ctx.call_needles(_CHECKPOINT_NAMES)

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        name = self.ctx.call_name_in(node, _CHECKPOINT_NAMES)
        if name is None:
            return
        if any(kw.arg in ("use_reentrant", None) for kw in node.keywords):
            return  # given, or possibly inside **kwargs
        positional = _CHECKPOINTS[name]
        if any(isinstance(a, ast.Starred) for a in node.args) and positional is not None:
            return  # `*args` may carry it
        if positional is not None and len(node.args) >= positional:
            return
        short = name.rsplit(".", 1)[-1]
        fix = None
        arguments: list[ast.expr | ast.keyword] = [*node.args, *node.keywords]
        if arguments:
            last = max(arguments, key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))
            fix = self.ctx.fix(
                "add `use_reentrant=False`",
                self.ctx.insert_after(last, ", use_reentrant=False"),
                safe=False,
            )
        self.report(
            node,
            f"`{short}(...)` without `use_reentrant=` falls back to the reentrant "
            "variant (a warning on every call, an error in future PyTorch): blocks "
            "whose inputs do not require grad silently get no parameter gradients",
            fix=fix,
            hint="pass `use_reentrant=False` (recommended) or `use_reentrant=True` to keep "
            "the old behaviour",
        )
