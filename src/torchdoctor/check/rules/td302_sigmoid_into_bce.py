from __future__ import annotations

from typing import ClassVar

from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._loss_inputs import BCE, BCE_LOGITS, SIGMOID, activation, loss_calls


class SigmoidIntoBce(Rule):
    """`sigmoid` output fed to `BCELoss` (use `BCEWithLogitsLoss` on the logits).

    ## What it does
    Finds `F.binary_cross_entropy` / `nn.BCELoss` calls whose input is a sigmoid
    output -- directly, through a variable, or from a model whose `forward` ends in
    `sigmoid` or whose last layer is `nn.Sigmoid` -- and
    `F.binary_cross_entropy_with_logits` / `nn.BCEWithLogitsLoss` calls whose input
    already went through a sigmoid.

    ## Why is this bad?
    `sigmoid` followed by `log` loses precision: in float32 `sigmoid(x)` is exactly
    1.0 for x > 17 (float16: x > 8), so `log(1 - p)` is `log(0)`; `BCELoss` clamps it
    to -100, and the gradient through the saturated sigmoid is zero -- confidently
    wrong predictions stop learning. `BCEWithLogitsLoss` computes the same loss
    from the logits with the log-sum-exp trick, exactly, and is also the only one of
    the two allowed under `autocast` (`BCELoss` raises "unsafe to autocast").
    Feeding a sigmoid output to `BCEWithLogitsLoss` applies the sigmoid twice: the
    predicted probabilities are squeezed into (0.5, 0.73), so the model can never
    predict the negative class.

    ## Example
    ```python
    prob = torch.sigmoid(model(x))
    loss = F.binary_cross_entropy(prob, y)
    ```

    ## Use instead
    ```python
    logits = model(x)
    loss = F.binary_cross_entropy_with_logits(logits, y)
    prob = torch.sigmoid(logits)  # only where probabilities are needed
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.BCEWithLogitsLoss.html
    - https://pytorch.org/docs/stable/amp.html#prefer-binary-cross-entropy-with-logits-over-binary-cross-entropy
    """

    code = "TD302"
    name = "sigmoid-into-bce"
    category = "loss"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = (
        "igmoid",
        "BCELoss",
        "BCEWithLogitsLoss",
        "binary_cross_entropy",
    )

    def finish(self) -> None:
        src = self.ctx.source
        if not any(t in src for t in ("binary_cross_entropy", "BCELoss", "BCEWithLogitsLoss")):
            return
        fl = analysis(self.ctx)
        for fi, call, kind in loss_calls(self.ctx, frozenset({BCE, BCE_LOGITS})):
            if not call.args:
                continue
            found = activation(fl, fi, call.args[0])
            if found is None or found[0] != SIGMOID:
                continue
            proof = found[1]
            loss = self.ctx.segment(call.func)
            if kind == BCE:
                self.report(
                    call,
                    f"`{loss}` gets probabilities from {proof}: sigmoid then log loses "
                    "precision and saturated predictions stop learning",
                    hint="drop the sigmoid and use `BCEWithLogitsLoss` / "
                    "`binary_cross_entropy_with_logits` on the logits",
                )
            else:
                self.report(
                    call,
                    f"`{loss}` applies sigmoid itself, but its input already went through "
                    f"{proof}: predictions are squeezed into (0.5, 0.73)",
                    hint="pass the logits (the values before sigmoid)",
                )
