from __future__ import annotations

from typing import ClassVar

from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._loss_inputs import (
    CROSS_ENTROPY,
    NLL,
    SOFTMAX,
    activation,
    loss_calls,
    loss_name,
)
from torchdoctor.check.rules._loss_params import may_hold_losses


class SoftmaxIntoCrossEntropy(Rule):
    """Softmax output fed to `cross_entropy` / `CrossEntropyLoss`, or plain softmax to `NLLLoss`.

    ## What it does
    Finds `F.cross_entropy` / `nn.CrossEntropyLoss` calls whose input is the output
    of `softmax` -- directly, through a variable or a dict item (`out["probs"]`, also
    one a function returns or a caller passes), or from a model whose `forward`
    ends in a softmax or whose last layer is `nn.Softmax` -- and `F.nll_loss` /
    `nn.NLLLoss` calls given plain softmax probabilities instead of
    log-probabilities. A loss class of the project whose `forward` hands its input,
    reshaped at most, to `log_softmax` or `cross_entropy` (a focal loss built on
    log-softmax and NLL) counts as `cross_entropy`, and so does a loss a function
    takes as a parameter (`criterion(model(x), y)`) where every call of it seen passes
    one (`fit(model, loader, nn.CrossEntropyLoss())`, in this file or another). A model
    built with constants that fix its settings (`Tagger(n, normalize=True)` storing
    `self.normalize`) runs only the returns of its `forward` those settings allow; a
    setting chosen at run time leaves it unknown. A `log_softmax` output fed to
    `cross_entropy` is not reported: log_softmax is idempotent, so the loss and its
    gradients are right.

    ## Why is this bad?
    `cross_entropy` applies `log_softmax` itself and expects raw logits. Given
    probabilities in [0, 1], it takes the softmax of values that differ by at most
    1, so the loss can never approach 0: with 10 classes its floor is
    `log(1 + 9/e)` = 1.46 nats even for a perfect prediction, the gradients shrink
    as the model becomes confident, and training stalls at mediocre accuracy.
    `nll_loss` expects log-probabilities: given probabilities it minimises `-p`
    instead of `-log p`, so the loss is negative and confident mistakes are barely
    penalised.

    ## Example
    ```python
    probs = F.softmax(model(x), dim=1)
    loss = F.cross_entropy(probs, y)
    ```

    ## Use instead
    ```python
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    probs = logits.softmax(dim=1)  # only where probabilities are needed
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html
    - https://pytorch.org/docs/stable/generated/torch.nn.NLLLoss.html
    """

    code = "TD301"
    name = "softmax-into-cross-entropy"
    category = "loss"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = (
        "oftmax",
        "CrossEntropyLoss",
        "cross_entropy",
        "NLLLoss",
        "nll_loss",
        "loss",  # `loss = criterion(out, y)`: a loss another file passes (_loss_params.py)
    )

    def finish(self) -> None:
        src = self.ctx.source
        words = ("cross_entropy", "CrossEntropyLoss", "nll_loss", "NLLLoss")
        if not any(t in src for t in words) and not may_hold_losses(self.ctx):
            return  # no such loss here, nor one another file may pass to a function here
        fl = analysis(self.ctx)
        for fi, call, kind in loss_calls(self.ctx, frozenset({CROSS_ENTROPY, NLL})):
            if not call.args:
                continue
            found = activation(fl, fi, call.args[0])
            if found is None:
                continue
            act, proof = found
            loss = loss_name(self.ctx, call)
            if kind == CROSS_ENTROPY and act == SOFTMAX:
                message = (
                    f"{loss} gets probabilities from {proof}, and applies log_softmax "
                    "to them itself: the loss can never approach 0 and gradients vanish "
                    "as the model grows confident"
                )
                hint = "pass the logits (the values before softmax)"
            elif kind == NLL and act == SOFTMAX:
                message = (
                    f"{loss} expects log-probabilities but gets probabilities from {proof}: "
                    "it minimises -p instead of -log p"
                )
                hint = "use `log_softmax` instead of `softmax`, or `cross_entropy` on logits"
            else:
                continue
            self.report(call, message, hint=hint)
