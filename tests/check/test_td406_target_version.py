"""TD406 depends on the torch version the code targets: weights_only=True is the default
only from torch 2.6."""

from __future__ import annotations

from torchdoctor.check.engine import check_source
from torchdoctor.check.registry import rules_by_code

SOURCE = """\
import argparse
import torch

args = argparse.ArgumentParser().parse_args()
torch.save({"args": args}, "ckpt.pt")
ckpt = torch.load("ckpt.pt")
"""


def _lines(target: tuple[int, int] | None) -> list[int]:
    rule = rules_by_code()["TD406"]
    return [f.line for f in check_source(SOURCE, "a.py", [rule], target_version=target)]


def test_reported_when_the_target_has_the_weights_only_default() -> None:
    assert _lines((2, 6)) == [6]
    assert _lines(None) == [6]  # no target configured: today's torch


def test_quiet_when_the_target_predates_the_default() -> None:
    assert _lines((2, 5)) == []
    assert _lines((1, 13)) == []
