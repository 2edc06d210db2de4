"""`loss_arguments.may_hand_losses` answers exactly as a search for `HANDS_LOSS` (after
its gate), which it replaces for speed."""

from __future__ import annotations

import re

import pytest

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.analysis.loss_arguments import HANDS_LOSS, may_hand_losses, names_a_loss

PATTERN = re.compile(HANDS_LOSS)

TRICKY = [
    "loss = nn.CrossEntropyLoss()\n",
    "crit = BCEWithLogitsLoss (\n  pos_weight=w)\n",
    "BCEWithLogitsLoss\n",
    "fn = F.cross_entropy\n",
    "F.cross_entropy(x, y)\n",
    "F.cross_entropy (x, y)\n",
    "F.binary_cross_entropy_with_logits,\n",
    "F.binary_cross_entropy_with_logitsx\n",
    "F.nll_lossy\n",
    "NLLLoss NLLLoss(",
    "",
]


def _expected(source: str) -> bool:
    return names_a_loss(source) and PATTERN.search(source) is not None


@pytest.mark.parametrize("source", TRICKY)
def test_tricky_texts(source: str) -> None:
    assert may_hand_losses(source) == _expected(source)


def test_random_texts() -> None:
    pieces = ["CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "BCEWith", "."]
    pieces += ["cross_entropy", "nll_loss", "binary_cross_entropy", "_with_logits", "("]
    pieces += [" ", "\n", "x", "_", "é"]
    for source in random_texts(pieces, seed=13, longest=8):
        assert may_hand_losses(source) == _expected(source), repr(source)


def test_fixtures() -> None:
    for path, source in fixture_texts():
        assert may_hand_losses(source) == _expected(source), path
