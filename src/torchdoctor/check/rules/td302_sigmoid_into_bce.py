from __future__ import annotations

from typing import ClassVar

from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._loss_inputs import (
    BCE_LOGITS,
    SIGMOID,
    activation,
    built_logit_losses,
    loss_calls,
    loss_name,
)
from torchdoctor.check.rules._loss_params import may_hold_losses


class SigmoidIntoBce(Rule):
    """`sigmoid` output fed to `BCEWithLogitsLoss`: the sigmoid is applied twice.

    ## What it does
    Finds `F.binary_cross_entropy_with_logits` / `nn.BCEWithLogitsLoss` calls whose
    input already went through a sigmoid -- directly, through a variable or a dict
    item, or from a model whose `forward` ends in `sigmoid` or whose last layer is
    `nn.Sigmoid` -- and calls of a project loss class whose `forward` hands its input,
    reshaped at most (or joined into one tensor, `torch.cat([1 - x, x], 1)`), to
    `binary_cross_entropy_with_logits`. Settings are independent: a method that returns
    a sigmoid under `if self.method == "binary":` gives one to a loss called under
    `if self.with_focal_loss:`, since both can be set at once.

    A sigmoid output fed to `BCELoss` (numerically weaker, but a correct loss) is
    advice: TD304 says it, when advice is selected.

    ## Why is this bad?
    `BCEWithLogitsLoss` applies the sigmoid itself. Feeding it a sigmoid output
    applies the sigmoid twice: the predicted probabilities are squeezed into
    (0.5, 0.73), so the model can never predict the negative class, and the loss
    cannot go below 0.31 for a positive target or 0.69 for a negative one.

    ## Example
    ```python
    prob = torch.sigmoid(model(x))
    loss = F.binary_cross_entropy_with_logits(prob, y)
    ```

    ## Use instead
    ```python
    logits = model(x)
    loss = F.binary_cross_entropy_with_logits(logits, y)
    prob = torch.sigmoid(logits)  # only where probabilities are needed
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.BCEWithLogitsLoss.html
    """

    code = "TD302"
    name = "sigmoid-into-bce"
    category = "loss"
    severity = Severity.WARNING
    # `loss`: `loss = criterion(out, y)`, a loss another file passes (_loss_params.py)
    triggers: ClassVar[tuple[str, ...]] = (
        "igmoid",
        "BCEWithLogitsLoss",
        "binary_cross_entropy",
        "loss",
    )

    def finish(self) -> None:
        src = self.ctx.source
        words = ("binary_cross_entropy_with_logits", "BCEWithLogitsLoss")
        if (
            not any(t in src for t in words)
            and not built_logit_losses(self.ctx)
            and not may_hold_losses(self.ctx)
        ):
            return  # no loss taking logits here (nor a project class built on one, nor
            # one another file may pass to a function here)
        fl = analysis(self.ctx)
        for fi, call, _ in loss_calls(self.ctx, frozenset({BCE_LOGITS})):
            if not call.args:
                continue
            found = activation(fl, fi, call.args[0])
            if found is None or found[0] != SIGMOID:
                continue
            self.report(
                call,
                f"{loss_name(self.ctx, call)} applies sigmoid itself, but its input "
                f"already went through {found[1]}: predictions are squeezed into (0.5, 0.73)",
                hint="pass the logits (the values before sigmoid)",
            )
