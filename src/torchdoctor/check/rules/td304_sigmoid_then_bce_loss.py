from __future__ import annotations

from typing import ClassVar

from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._loss_inputs import BCE, SIGMOID, activation, loss_calls


class SigmoidThenBceLoss(Rule):
    """`sigmoid` then `BCELoss`: prefer `BCEWithLogitsLoss` on the logits.

    ## What it does
    Finds `F.binary_cross_entropy` / `nn.BCELoss` calls whose input is a sigmoid
    output -- directly, through a variable, or from a model whose `forward` ends in
    `sigmoid` or whose last layer is `nn.Sigmoid`. The loss is correct, so this is
    advice (GAN discriminators ending in `nn.Sigmoid` are written this way on
    purpose); feeding a sigmoid output to `BCEWithLogitsLoss`, which is wrong, is
    TD302.

    ## Why is this bad?
    `sigmoid` followed by `log` loses precision: in float32 `sigmoid(x)` is exactly
    1.0 for x > 17 (float16: x > 8), so `log(1 - p)` is `log(0)`; `BCELoss` clamps it
    to -100, and the gradient through the saturated sigmoid is zero -- confidently
    wrong predictions stop learning. `BCEWithLogitsLoss` computes the same loss
    from the logits with the log-sum-exp trick, exactly, and is also the only one of
    the two allowed under `autocast` (`BCELoss` raises "unsafe to autocast").

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

    code = "TD304"
    name = "sigmoid-then-bce-loss"
    category = "loss"
    group = "advice"
    severity = Severity.INFO
    triggers: ClassVar[tuple[str, ...]] = ("igmoid", "BCELoss", "binary_cross_entropy")

    def finish(self) -> None:
        if not any(self.ctx.holds(t) for t in ("binary_cross_entropy", "BCELoss")):
            return
        fl = analysis(self.ctx)
        for fi, call, _ in loss_calls(self.ctx, frozenset({BCE})):
            if not call.args:
                continue
            found = activation(fl, fi, call.args[0])
            if found is None or found[0] != SIGMOID:
                continue
            self.report(
                call,
                f"`{self.ctx.segment(call.func)}` gets probabilities from {found[1]}: sigmoid "
                "then log loses precision and saturated predictions stop learning",
                hint="drop the sigmoid and use `BCEWithLogitsLoss` / "
                "`binary_cross_entropy_with_logits` on the logits",
            )
