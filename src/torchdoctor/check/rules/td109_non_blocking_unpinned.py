from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import file_flow, scopes_with
from torchdoctor.check.analysis.values import Kind
from torchdoctor.check.rule import Rule, Severity


class NonBlockingUnpinned(Rule):
    """`.to(device, non_blocking=True)` on batches of a DataLoader without `pin_memory=True`.

    ## What it does
    Finds `x.to(..., non_blocking=True)` / `x.cuda(non_blocking=True)` where `x`
    comes from a `DataLoader` built in the same file without `pin_memory=True`.

    ## Why is this bad?
    A host-to-GPU copy can only overlap with computation when the source is in
    pinned (page-locked) memory. From ordinary pageable memory CUDA first stages
    the data through a pinned buffer synchronously, so `non_blocking=True` buys
    nothing: the overlap the code was written for does not happen. On Apple's MPS
    backend non-blocking copies from pageable memory have produced wrong values
    when the source is reused before the copy finished.

    Nothing computes wrong on CUDA (the copy is only slower than it could be), so
    this is advice: off by default, on with `--extend-select advice`.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64, num_workers=4)
    for x, y in loader:
        x = x.to(device, non_blocking=True)
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True)
    ```
    or `td.DeviceLoader(loader)`, which pins and overlaps the copies for you on CUDA.

    ## References
    - https://pytorch.org/docs/stable/data.html#memory-pinning
    - https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html
    """

    code = "TD109"
    name = "non-blocking-unpinned"
    category = "device"
    group = "advice"
    severity = Severity.INFO
    triggers: ClassVar[tuple[str, ...]] = ("non_blocking",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        reported: set[tuple[str, int]] = set()
        for node in scopes_with(ff, "non_blocking"):
            scope = ff.scope(node)
            for call in [*scope.method_calls("to"), *scope.method_calls("cuda")]:
                if not any(
                    kw.arg == "non_blocking"
                    and isinstance(kw.value, ast.Constant)
                    and kw.value.value is True
                    for kw in call.keywords
                ):
                    continue
                assert isinstance(call.func, ast.Attribute)
                held = scope.value(call.func.value)
                if held.kind is not Kind.BATCH or held.pinned is not False or held.assumed:
                    continue
                key = (held.name, call.lineno)
                if key in reported:
                    continue
                reported.add(key)
                name = self.ctx.segment(call.func.value)
                self.report(
                    call,
                    f"`{name}` comes from {held.describe_origin()}, a DataLoader without "
                    "`pin_memory=True`: `non_blocking=True` copies from pageable memory do not "
                    "overlap with compute; pass `pin_memory=True` to the DataLoader",
                )
