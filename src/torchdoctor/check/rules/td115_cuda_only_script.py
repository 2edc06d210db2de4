from __future__ import annotations

from torchdoctor.check.rule import Severity
from torchdoctor.check.rules.td101_hardcoded_cuda import HardcodedCuda


class CudaOnlyScript(HardcodedCuda):
    """A script hard-wired to CUDA: it cannot run, or be smoke-tested, without a GPU.

    ## What it does
    Finds the same unconditional `.cuda()` calls and `"cuda"` devices as TD101
    (with the same exemptions: guards, defaults, GPU-only files and blocks), in
    code that shows no other device: a script or helper that is not model code,
    has no device of its own to follow, and never asks
    `torch.cuda.is_available()`. Such a script was written for a GPU machine,
    so this is a portability note, off by default (`--extend-select advice` or
    `--extend-select TD115`). Where the code does show another device, TD101
    reports it as a bug.

    ## Why is this bad?
    Nobody can try the script, or run its tests, on a laptop, an Apple-silicon
    Mac or a CPU CI runner: the first such line stops it with `AssertionError:
    Torch not compiled with CUDA enabled`. A small smoke run on the CPU before
    renting a GPU is exactly what it rules out.

    ## Example
    ```python
    net = Generator().cuda()
    noise = torch.randn(64, 100).cuda()
    ```

    ## Use instead
    ```python
    device = td.pick_device()  # CUDA, MPS or XPU when present, else the CPU
    net = Generator().to(device)
    noise = torch.randn(64, 100, device=device)
    ```

    ## References
    - https://pytorch.org/docs/stable/notes/cuda.html#device-agnostic-code
    """

    code = "TD115"
    name = "cuda-only-script"
    group = "advice"
    severity = Severity.WARNING

    def reports(self, reason: str | None) -> bool:
        return reason is None
