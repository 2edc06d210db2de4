from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.torch_api import PARAMETRISED_LAYERS
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import iter_children, walk


class ModuleCreatedInForward(Rule):
    """A layer with weights built inside `forward`: new random weights on every call.

    ## What it does
    Finds `nn.Linear(...)`, `nn.Conv2d(...)`, `nn.BatchNorm2d(...)`, `nn.LSTM(...)`
    and the other `torch.nn` layers that own parameters or buffers when they are
    constructed inside a module's `forward` (and not stored on `self` as a lazy
    initialisation).

    ## Why is this bad?
    Every call builds a new layer with freshly initialised random weights on the
    CPU. They are not registered in the model, so the optimizer never sees them
    (they never train: the model's loss plateaus), `model.to(device)` never moves
    them (`Expected all tensors to be on the same device` on a GPU), their batch
    norm statistics are thrown away, and `state_dict()` does not save them.

    ## Example
    ```python
    def forward(self, x):
        x = self.features(x)
        return nn.Linear(x.size(1), 10)(x)
    ```

    ## Use instead
    ```python
    def __init__(self):
        super().__init__()
        self.features = ...
        self.head = nn.LazyLinear(10)  # or nn.Linear(in_features, 10)

    def forward(self, x):
        return self.head(self.features(x))
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.LazyLinear.html
    - https://pytorch.org/tutorials/beginner/basics/buildmodel_tutorial.html
    """

    code = "TD110"
    name = "module-created-in-forward"
    category = "device"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("forward",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        for func in ff.functions():
            if func.name != "forward" or not ff.mentions(func, *PARAMETRISED_LAYERS):
                continue
            if not ff.is_forward(func):
                continue
            self._check(func)

    def _check(self, func: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        stored: set[ast.AST] = set()  # built for `self.x = ...` (lazy init): registered
        calls: list[ast.Call] = []
        todo: list[ast.AST] = list(func.body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(node, ast.Assign | ast.AnnAssign) and any(
                isinstance(t, ast.Attribute | ast.Subscript)
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            ):
                stored.update(walk(node))
            if isinstance(node, ast.Call):
                name = self.ctx.call_name(node) or ""
                if name in ("setattr",) or name.endswith((".add_module", ".register_module")):
                    stored.update(walk(node))
                elif (
                    name.startswith("torch.nn.")
                    and name.count(".") == 2
                    and name.rsplit(".", 1)[-1] in PARAMETRISED_LAYERS
                ):
                    calls.append(node)
            todo.extend(iter_children(node))
        for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
            if call in stored:
                continue
            layer = self.ctx.segment(call.func)
            self.report(
                call,
                f"`{layer}(...)` is built inside `forward`: every call makes new random "
                "weights on the CPU that the optimizer never sees and `model.to(device)` "
                "never moves; build it once in `__init__` and store it on `self`",
            )
