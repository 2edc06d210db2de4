from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import file_flow, scopes_with
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.values import Kind, Place
from torchdoctor.check.rule import Rule, Severity

_DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    }
)


class DataParallelUsed(Rule):
    """`nn.DataParallel`: slower than DistributedDataParallel, and needs the module on `cuda:0`.

    ## What it does
    Finds `nn.DataParallel(model)`. When the wrapped model was built in the same
    scope and is moved neither before nor after wrapping, it says so: that run
    crashes on its first forward.

    ## Why is this bad?
    `DataParallel` runs one Python process that scatters every batch, replicates
    the model onto every GPU on *every* step and gathers the outputs on
    `cuda:0`: the GIL and the replication make it slower than
    `DistributedDataParallel` even on one machine, and `cuda:0` runs out of
    memory first. PyTorch's documentation recommends DDP instead. A module that
    is not on `device_ids[0]` fails with `RuntimeError: module must have its
    parameters and buffers on device cuda:0 (device_ids[0]) but found one of them
    on device: cpu`.

    ## Example
    ```python
    model = nn.DataParallel(Net())
    ```

    ## Use instead
    ```python
    # torchrun --nproc-per-node=NUM_GPUS train.py
    device = td.pick_device()  # honours LOCAL_RANK under torchrun
    model = DistributedDataParallel(Net().to(device), device_ids=[device.index])
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html
    - https://pytorch.org/docs/stable/notes/cuda.html#use-nn-parallel-distributeddataparallel-instead-of-multiprocessing-or-nn-dataparallel
    """

    code = "TD107"
    name = "data-parallel"
    category = "device"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("DataParallel",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        for node in scopes_with(ff, "DataParallel"):
            scope = ff.scope(node, callers=False)
            for call in scope.calls_named("DataParallel"):
                if (self.ctx.call_name(call) or "") in _DATA_PARALLEL:
                    self._check(scope, call)

    def _check(self, scope: ScopeFlow, call: ast.Call) -> None:
        message = (
            "`nn.DataParallel` replicates the model on every step in one process; "
            "`DistributedDataParallel` is faster, even on one machine"
        )
        inner = scope.value(call.args[0]) if call.args else None
        if inner is not None and inner.kind is Kind.MODULE and inner.fresh:
            moved_after = any(
                m.before.source is call and m.after.place is Place.DEVICE for m in scope.moves
            )
            called = any(
                scope.value(site.call.func).source is call
                for site in scope.calls
                if isinstance(site.call.func, ast.Name)
            )
            if called and not moved_after:
                name = self.ctx.segment(call.args[0])
                message = (
                    f"`{name}` (built at line {inner.line}) is wrapped in `nn.DataParallel` but "
                    "never moved to `device_ids[0]`: the first forward fails with `module must "
                    "have its parameters and buffers on device cuda:0`; move it with "
                    "`.to(device)`, and prefer `DistributedDataParallel`"
                )
        self.report(call, message)
