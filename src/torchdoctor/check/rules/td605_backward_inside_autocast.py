from __future__ import annotations

from typing import ClassVar

from torchdoctor.check.analysis.events import BACKWARD
from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.names import is_torch_file
from torchdoctor.check.rule import Rule, Severity


class BackwardInsideAutocast(Rule):
    """`loss.backward()` runs inside an `autocast` block.

    ## What it does
    Finds `backward()` calls (including `scaler.scale(loss).backward()` and
    `accelerator.backward(loss)`) lexically inside `with torch.autocast(...)`,
    `torch.amp.autocast(...)`, `torch.cuda.amp.autocast()` -- or a name assigned
    one of them, like `ctx = nullcontext() if cpu else torch.autocast("cuda")`.
    `autocast(enabled=False)` does not count.

    ## Why is this bad?
    Autocast is meant to wrap only the forward pass and the loss computation. The
    backward pass already runs each op in the dtype autocast chose for its
    forward counterpart, so wrapping `backward()` adds nothing -- but anything
    else that runs inside the block is cast too: custom `autograd.Function`
    backward code, gradient hooks, double-backward (`create_graph=True`, gradient
    penalties) and gradient clipping inside the block compute in float16/bfloat16
    with about 3 significant digits instead of 7, and float16 gradients overflow
    above 65504. PyTorch's AMP documentation says explicitly: "Backward passes
    under autocast are not recommended."

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    ```

    ## References
    - https://pytorch.org/docs/stable/amp.html#torch.autocast
    - https://pytorch.org/docs/stable/notes/amp_examples.html
    """

    code = "TD605"
    name = "backward-inside-autocast"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("autocast",)

    def finish(self) -> None:
        if not is_torch_file(self.ctx.source):
            return
        fl = analysis(self.ctx)
        for fi in fl.all_functions():
            if "backward" not in fi.text:
                continue
            for event in fl.events(fi):
                if event.via is not None:
                    continue  # a helper's backward(): reported where it is written
                if event.kind != BACKWARD or event.autocast is None:
                    continue
                block = event.autocast
                self.report(
                    event.node,
                    f"`{self.ctx.segment(event.node)}` at line {event.line} runs inside the "
                    f"autocast block at line {block.lineno}: backward passes under "  # type: ignore[attr-defined]
                    "autocast are not recommended; code run there is cast to low precision",
                    hint="dedent the backward() call so it runs after the `with` block",
                )
