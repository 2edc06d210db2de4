"""Docs of the runtime codes for multi-GPU runs and non-finite values (`catalog.py` lists them).

Each entry: code, kebab-case name, category, severity ("error"/"warning"), docs in
ruff's shape. The simulated multi-GPU run (`torchdoctor run --simulate cuda:N --
torchrun ...`) reports TD701–TD706, and TD113, documented by its static rule
(`check/rules/td113_collective_on_cpu_tensor.py`: checker and simulator share the code);
the non-finite finder (`td.guard(model, nonfinite=True)`, `torchdoctor run
--detect-nonfinite`) reports TD217.
"""

from __future__ import annotations

ENTRIES: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "TD217",
        "non-finite-value",
        "training",
        "error",
        """
        A NaN or Inf appeared in a forward or backward pass; the finder names where it started.

        ## What it does
        `td.guard(model, nonfinite=True)` and `torchdoctor run --detect-nonfinite` check the
        output of every operation while the model runs forward and backward. At the first
        non-finite value they stop and name the module path, the operation, the step, and
        the min/max/dtype of its inputs and parameters, with the likely cause (log of zero,
        division by zero, float16 overflow, a learning rate that blew the weights up).

        ## Why is this bad?
        One NaN spreads to every weight in the next optimizer step; by the time the loss is
        printed as `nan` the place it came from is long gone. `torch.autograd.detect_anomaly`
        only covers backward, names an autograd node instead of a module, and is slow.

        ## Example
        ```python
        probs = torch.softmax(logits, -1)
        loss = -(targets * probs.log()).sum()      # log(0) = -inf, then NaN gradients
        ```

        ## Use instead
        ```python
        loss = torch.nn.functional.cross_entropy(logits, targets)   # log-softmax inside
        ```
        """,
    ),
    (
        "TD701",
        "checkpoint-onto-other-gpu",
        "distributed",
        "warning",
        """
        A rank loaded a checkpoint onto another rank's GPU (usually every rank onto cuda:0).

        ## What it does
        In a simulated multi-GPU run, `torch.load` results are checked: tensors that land on a
        GPU other than `cuda:LOCAL_RANK` are reported with their size, and the report sums
        what each GPU received from other ranks.

        ## Why is this bad?
        A checkpoint saved from cuda:0 restores onto cuda:0 without `map_location`. With N
        ranks, GPU 0 holds N copies: out of memory on GPU 0 only, or a slow, lopsided job.

        ## Example
        ```python
        state = torch.load("model.pt")
        ```

        ## Use instead
        ```python
        state = torch.load("model.pt", map_location=f"cuda:{local_rank}")   # or "cpu"
        ```
        """,
    ),
    (
        "TD702",
        "ddp-model-not-on-local-rank",
        "distributed",
        "error",
        """
        `DistributedDataParallel` wraps a model that is not on `cuda:LOCAL_RANK`.

        ## What it does
        In a simulated multi-GPU run, DDP's construction checks where the parameters are.
        On another rank's GPU, its first broadcast fails as NCCL fails ("Duplicate GPU
        detected", TD706); on the CPU, NCCL has no backend for them (TD113).

        ## Why is this bad?
        Every rank must own one GPU. `model.cuda()` or `.to("cuda:0")` puts all ranks' models
        on GPU 0.

        ## Example
        ```python
        model = Net().to("cuda:0")
        model = DDP(model, device_ids=[local_rank])
        ```

        ## Use instead
        ```python
        model = Net().to(local_rank)
        model = DDP(model, device_ids=[local_rank])
        ```
        """,
    ),
    (
        "TD703",
        "missing-set-device",
        "distributed",
        "warning",
        """
        A rank of an NCCL job never called `torch.cuda.set_device(LOCAL_RANK)`.

        ## What it does
        In a simulated multi-GPU run, at the first DDP construction or collective, a rank whose
        current GPU is not `cuda:LOCAL_RANK` (and whose `init_process_group` got no
        `device_id`) is reported.

        ## Why is this bad?
        The current device stays cuda:0 on every rank: each process creates a CUDA context and
        NCCL buffers on GPU 0, and every `.cuda()`, `device="cuda"` or `torch.cuda.*` call lands
        there. The job runs slower, uses more memory on GPU 0, or hangs in a collective.

        ## Example
        ```python
        dist.init_process_group("nccl")
        model = DDP(Net().to(local_rank), device_ids=[local_rank])
        ```

        ## Use instead
        ```python
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        ```
        """,
    ),
    (
        "TD704",
        "no-distributed-sampler",
        "distributed",
        "warning",
        """
        Every rank got the same batches from a DataLoader: no `DistributedSampler`.

        ## What it does
        In a simulated multi-GPU run each rank records a digest of the first batch of every
        DataLoader loop; the launcher compares them. When all ranks got identical data, the
        loop is reported. (Ranks that shuffle with different seeds get different batches and
        are not reported, though they also overlap.)

        ## Why is this bad?
        N GPUs train on the same samples: an epoch does the work of one GPU at N times the
        cost, and the averaged gradient is that of a batch N times smaller than intended.

        ## Example
        ```python
        loader = DataLoader(dataset, batch_size=32, shuffle=True)
        ```

        ## Use instead
        ```python
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
        ```
        """,
    ),
    (
        "TD705",
        "every-rank-saves",
        "distributed",
        "warning",
        """
        Several ranks write the same checkpoint file.

        ## What it does
        In a simulated multi-GPU run each rank records the paths it passes to `torch.save`;
        the launcher reports a path written by more than one rank.

        ## Why is this bad?
        The ranks race on one file: a reader can see a torn or half-written checkpoint, and on
        a shared file system the writes cost N times the I/O.

        ## Example
        ```python
        torch.save(model.module.state_dict(), "model.pt")
        ```

        ## Use instead
        ```python
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "model.pt")
        dist.barrier()
        ```
        """,
    ),
    (
        "TD706",
        "collective-on-other-gpu",
        "distributed",
        "error",
        """
        A rank ran a collective on another rank's GPU: NCCL's "Duplicate GPU detected".

        ## What it does
        In a simulated multi-GPU run each collective (and DDP's first parameter broadcast)
        checks that its tensors are on `cuda:LOCAL_RANK`; a tensor on the GPU of another
        local rank fails with NCCL's error at the calling line.

        ## Why is this bad?
        NCCL needs one GPU per rank. Two ranks on one GPU abort the job at the first
        collective (or hang it).

        ## Example
        ```python
        flag = torch.zeros(1, device="cuda:0")
        dist.broadcast(flag, src=0)
        ```

        ## Use instead
        ```python
        flag = torch.zeros(1, device=f"cuda:{local_rank}")
        dist.broadcast(flag, src=0)
        ```
        """,
    ),
)
