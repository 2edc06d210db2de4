from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import file_flow, scopes_with
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules.td107_data_parallel import DATA_PARALLEL


class PreferDistributed(Rule):
    """`nn.DataParallel`: slower than `DistributedDataParallel`, even on one machine.

    ## What it does
    Finds every `nn.DataParallel(model)`. This is advice: `DataParallel` works,
    and scripts, tests of model unwrapping and simple multi-GPU paths use it on
    purpose. A `DataParallel` that crashes (its module never moved to
    `device_ids[0]`) is reported by TD107, which is on by default.

    ## Why is this bad?
    `DataParallel` runs one Python process that scatters every batch, replicates
    the model onto every GPU on *every* step and gathers the outputs on
    `cuda:0`: the GIL and the replication make it slower than
    `DistributedDataParallel` even on one machine, and `cuda:0` runs out of
    memory first. PyTorch's documentation recommends DDP instead.

    ## Example
    ```python
    model = nn.DataParallel(Net().to(device))
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

    code = "TD114"
    name = "prefer-distributed-data-parallel"
    category = "device"
    group = "advice"
    severity = Severity.INFO
    triggers: ClassVar[tuple[str, ...]] = ("DataParallel",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        for node in scopes_with(ff, "DataParallel"):
            scope = ff.scope(node, callers=False)
            for call in scope.calls_named("DataParallel"):
                if (self.ctx.call_name(call) or "") in DATA_PARALLEL:
                    self.report(
                        call,
                        "`nn.DataParallel` replicates the model on every step in one process; "
                        "`DistributedDataParallel` is faster, even on one machine",
                    )
