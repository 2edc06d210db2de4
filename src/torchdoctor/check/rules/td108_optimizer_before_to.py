from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import file_flow, scopes_with
from torchdoctor.check.analysis.values import Kind, Place
from torchdoctor.check.rule import Rule, Severity


class OptimizerBeforeTo(Rule):
    """An optimizer built from `model.parameters()` before the model is moved.

    ## What it does
    Finds an optimizer (`torch.optim.*`) built from `model.parameters()` when the
    same model is moved with `model.to(device)` / `.cuda()` later in the same scope.

    ## Why is this bad?
    PyTorch's documentation asks to move the model *before* constructing its
    optimizer. With default settings `Module.to()` updates the parameters in place
    and the optimizer still works — until it does not: optimizer state that
    already exists stays on the CPU (restoring `optimizer.load_state_dict(...)`
    before the move makes `step()` fail with `Expected all tensors to be on the
    same device`), and when the module's parameters are replaced rather than
    updated (`torch.__future__.set_overwrite_module_params_on_conversion(True)`,
    XLA/TPU devices, some tensor subclasses) the optimizer keeps updating the old
    CPU tensors and the model on the device never trains, silently.

    With default settings on CPU and CUDA nothing goes wrong (optimizers create
    their state at the first step, on the moved parameters), so this is advice:
    off by default, on with `--extend-select advice`.

    ## Example
    ```python
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.to(device)
    ```

    ## Use instead
    ```python
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ```

    ## References
    - https://pytorch.org/docs/stable/optim.html#constructing-it
    """

    code = "TD108"
    name = "optimizer-before-to"
    category = "device"
    group = "advice"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("optim",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        reported: set[ast.AST] = set()
        for node in scopes_with(ff, "optim"):
            # the move is in the scope's own code (for the module: not in its functions)
            text = ff.module_code_text() if isinstance(node, ast.Module) else ff.text(node)
            if ".to(" not in text and ".cuda(" not in text:
                continue
            scope = ff.scope(node, callers=False)
            for move in scope.moves:
                before, after = move.before, move.after
                optimizer = before.optimizer
                if before.kind is not Kind.MODULE or optimizer is None or optimizer in reported:
                    continue
                if move.dtype_only or after.place is not Place.DEVICE:
                    continue
                if before.place is Place.DEVICE and not before.maybe:
                    continue  # already on the device when the optimizer was built
                reported.add(optimizer)
                model = self.ctx.segment(move.receiver)
                built = self.ctx.segment(optimizer.func)
                self.report(
                    optimizer,
                    f"`{built}` is built from `{model}`'s parameters before `{model}` is moved "
                    f"to `{after.device}` (line {move.call.lineno}); move the model first, then "
                    "build the optimizer",
                )
