from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

_LOADS = frozenset({"torch.load", "torch.serialization.load"})


class LoadUnsafe(Rule):
    """`torch.load(..., weights_only=False)`: unpickling a file can run arbitrary code.

    ## What it does
    Finds `torch.load` calls that pass `weights_only=False`.

    A round trip that `torch.save`s to the same file or buffer earlier in the same
    function is left alone: the program reads back what it wrote itself.

    ## Why is this bad?
    With `weights_only=False`, `torch.load` runs the full `pickle` machinery, and a
    pickle can call any Python function while it loads: a checkpoint downloaded
    from a model hub, a shared drive or a colleague's bucket can delete files,
    steal credentials or install a backdoor the moment it is loaded. Since
    PyTorch 2.6 `weights_only=True` is the default for exactly this reason;
    passing `False` switches the protection off.

    `weights_only=False` is written on purpose, usually for the program's own
    files, so this is advice: off by default, on with `--extend-select advice`.

    ## Example
    ```python
    checkpoint = torch.load("checkpoint.pt", weights_only=False)
    ```

    ## Use instead
    Save plain state dicts and tensors, which load with the safe default:
    ```python
    torch.save({"model": model.state_dict(), "epoch": epoch}, "checkpoint.pt")
    checkpoint = torch.load("checkpoint.pt", map_location="cpu")  # weights_only=True
    ```
    If the file holds your own classes, allow exactly those with
    `torch.serialization.add_safe_globals([MyConfig])` (or the
    `torch.serialization.safe_globals` context manager) instead of disabling the
    check. Keep `weights_only=False` only for files you produced yourself, and
    say so with `# noqa: TD403`.

    ## References
    - https://pytorch.org/docs/stable/generated/torch.load.html
    - https://pytorch.org/docs/stable/notes/serialization.html#weights-only
    """

    code = "TD403"
    name = "load-unsafe"
    category = "checkpoint"
    group = "advice"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("weights_only",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)

    def visit_needles(self) -> tuple[str, ...]:
        return ("weights_only",)

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        unsafe = next(
            (
                kw
                for kw in node.keywords
                if kw.arg == "weights_only"
                and isinstance(kw.value, ast.Constant)
                and kw.value.value is False
            ),
            None,
        )
        if unsafe is None or self.ctx.call_name(node) not in _LOADS:
            return
        if node.args and self._saved_here(node.args[0]):
            return
        source = self.ctx.segment(node.args[0]) if node.args else "the file"
        if len(source) > 40:
            source = source[:37] + "..."
        self.report(
            node,
            f"`torch.load({source}, ..., weights_only=False)` unpickles the file with full "
            "pickle, which can run arbitrary code if the file is not your own",
            hint="load state dicts with the default `weights_only=True`; allow your own "
            "classes with `torch.serialization.add_safe_globals([...])`",
        )

    def _saved_here(self, source: ast.expr) -> bool:
        """The same function `torch.save`s to this very file or buffer before loading it."""
        scope = self.ctx.enclosing_function() or self.ctx.tree
        target = self.ctx.segment(source)
        for sub in walk(scope):
            if (
                isinstance(sub, ast.Call)
                and len(sub.args) >= 2
                and sub.lineno < source.lineno
                and self.ctx.call_name(sub) == "torch.save"
                and self.ctx.segment(sub.args[1]) == target
            ):
                return True
        return False
