"""Trigger PyTorch's real errors on this machine and check that explain() classifies them."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchdoctor.explain.explainer import explain


def _inplace_after_save() -> None:
    a = torch.ones(3, requires_grad=True)
    b = a.sigmoid()
    b.mul_(2)
    b.sum().backward()


def _leaf_inplace() -> None:
    torch.ones(3, requires_grad=True).add_(1)


def _backward_twice() -> None:
    loss = torch.ones(3, requires_grad=True).exp().sum()
    loss.backward()
    loss.backward()


def _backward_under_no_grad() -> None:
    with torch.no_grad():
        loss = nn.Linear(3, 1)(torch.ones(2, 3)).sum()
    loss.backward()


def _saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class _Config:
    pass


def _module_prefix() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    model.load_state_dict({f"module.{k}": v for k, v in model.state_dict().items()})


CASES: list[tuple[str, Callable[[], object], str]] = [
    (
        "meta input",
        lambda: nn.Linear(3, 4, device="meta")(torch.zeros(2, 3)),
        "meta-device-mismatch",
    ),
    (
        "meta cat",
        lambda: torch.cat([torch.zeros(2), torch.zeros(2, device="meta")]),
        "meta-device-mismatch",
    ),
    (
        "lstm meta",
        lambda: nn.LSTM(3, 4)(torch.zeros(5, 2, 3, device="meta")),
        "rnn-input-parameter-device",
    ),
    ("meta copy", lambda: torch.zeros(3).copy_(torch.zeros(3, device="meta")), "meta-no-data"),
    (
        "double linear",
        lambda: nn.Linear(3, 4)(torch.zeros(2, 3, dtype=torch.double)),
        "dtype-mismatch",
    ),
    ("half linear", lambda: nn.Linear(3, 4)(torch.zeros(2, 3, dtype=torch.half)), "dtype-mismatch"),
    (
        "double conv",
        lambda: nn.Conv2d(3, 4, 3)(torch.zeros(1, 3, 8, 8, dtype=torch.double)),
        "input-weight-dtype",
    ),
    (
        "uint8 conv",
        lambda: nn.Conv2d(3, 4, 3)(torch.zeros(1, 3, 8, 8, dtype=torch.uint8)),
        "input-weight-dtype",
    ),
    (
        "lstm double",
        lambda: nn.LSTM(3, 4)(torch.zeros(5, 2, 3, dtype=torch.double)),
        "dtype-mismatch",
    ),
    ("float target", lambda: F.cross_entropy(torch.zeros(4, 3), torch.zeros(4)), "target-dtype"),
    (
        "int target",
        lambda: F.cross_entropy(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int32)),
        "target-dtype",
    ),
    (
        "bce long",
        lambda: F.binary_cross_entropy_with_logits(
            torch.zeros(4), torch.zeros(4, dtype=torch.long)
        ),
        "loss-target-float",
    ),
    ("float indices", lambda: nn.Embedding(10, 3)(torch.zeros(2)), "embedding-index-dtype"),
    (
        "layernorm double",
        lambda: nn.LayerNorm(3)(torch.zeros(2, 3, dtype=torch.double)),
        "mixed-dtype-cpu",
    ),
    (
        "softmax long",
        lambda: torch.zeros(3, dtype=torch.long).softmax(0),
        "op-not-implemented-dtype",
    ),
    ("numpy grad", lambda: (torch.zeros(2, requires_grad=True) * 2).numpy(), "numpy-requires-grad"),
    (
        "np.array grad",
        lambda: np.array(torch.zeros(2, requires_grad=True) * 2),
        "numpy-requires-grad",
    ),
    ("numpy meta", lambda: torch.zeros(2, device="meta").numpy(), "numpy-on-device"),
    (
        "load cuda",
        lambda: torch.load(io.BytesIO(_saved(torch.zeros(2))), map_location="cuda"),
        "load-cuda-on-cpu-only",
    ),
    (
        "truncated",
        lambda: torch.load(io.BytesIO(_saved(torch.zeros(2))[:200])),
        "checkpoint-corrupt",
    ),
    (
        "weights only",
        lambda: torch.load(io.BytesIO(_saved({"cfg": _Config()}))),
        "weights-only-unsupported-global",
    ),
    (
        "whole model",
        lambda: torch.load(io.BytesIO(_saved(nn.Linear(2, 2)))),
        "weights-only-unsupported-global",
    ),
    ("module prefix", _module_prefix, "state-dict-prefix"),
    (
        "size mismatch",
        lambda: nn.Linear(2, 2).load_state_dict(
            {"weight": torch.zeros(3, 2), "bias": torch.zeros(2)}
        ),
        "state-dict-size-mismatch",
    ),
    (
        "missing key",
        lambda: nn.Linear(2, 2).load_state_dict({"weight": torch.zeros(2, 2)}),
        "state-dict-keys",
    ),
    (
        "optimizer groups",
        lambda: torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1).load_state_dict(
            {"state": {}, "param_groups": [{"params": [0, 1, 2], "lr": 1}]}
        ),
        "optimizer-state-mismatch",
    ),
    ("no params", lambda: torch.optim.SGD([], lr=0.1), "optimizer-no-parameters"),
    ("inplace", _inplace_after_save, "inplace-modified"),
    ("leaf inplace", _leaf_inplace, "leaf-inplace"),
    ("backward twice", _backward_twice, "backward-twice"),
    ("no grad_fn", _backward_under_no_grad, "no-grad-fn"),
    ("non-scalar", lambda: (torch.ones(3, requires_grad=True) * 2).backward(), "grad-non-scalar"),
    (
        "int grad",
        lambda: torch.ones(3, dtype=torch.long, requires_grad=True),
        "requires-grad-misuse",
    ),
    ("batchnorm one", lambda: nn.BatchNorm1d(3)(torch.zeros(1, 3)), "batchnorm-single-sample"),
    ("no cuda", lambda: torch.zeros(2, device="cuda"), "cuda-not-compiled"),
    ("cuda()", lambda: torch.zeros(2).cuda(), "cuda-not-compiled"),
    ("gpu string", lambda: torch.device("gpu"), "bad-device-string"),
    ("pin memory", lambda: torch.zeros(2).pin_memory(), "no-accelerator"),
    ("cpu oom", lambda: torch.empty(2**50, dtype=torch.uint8), "cpu-out-of-memory"),
    ("mat shapes", lambda: nn.Linear(3, 4)(torch.zeros(2, 5)), "matmul-shapes"),
    (
        "batch sizes",
        lambda: F.cross_entropy(torch.zeros(4, 3), torch.zeros(5, dtype=torch.long)),
        "loss-batch-size",
    ),
    (
        "target range",
        lambda: F.cross_entropy(torch.zeros(4, 3), torch.tensor([0, 1, 2, 5])),
        "target-out-of-range",
    ),
    ("embedding range", lambda: nn.Embedding(10, 3)(torch.tensor([11])), "target-out-of-range"),
    ("conv channels", lambda: nn.Conv2d(3, 4, 3)(torch.zeros(1, 1, 8, 8)), "conv-input-shape"),
    ("conv dims", lambda: nn.Conv2d(3, 4, 3)(torch.zeros(3, 8)), "conv-input-shape"),
    ("broadcast", lambda: torch.zeros(2, 3) + torch.zeros(4, 3), "broadcast-size"),
    (
        "bce shape",
        lambda: F.binary_cross_entropy_with_logits(torch.zeros(4, 1), torch.zeros(4)),
        "broadcast-size",
    ),
    ("view", lambda: torch.zeros(2, 3).t().view(6), "view-stride"),
    (
        "collate",
        lambda: torch.utils.data.default_collate([torch.zeros(2), torch.zeros(3)]),
        "collate-unequal",
    ),
    ("bool", lambda: bool(torch.ones(3)), "bool-ambiguous"),
    ("lstm size", lambda: nn.LSTM(3, 4)(torch.zeros(5, 2, 6)), "rnn-input-size"),
    ("bn features", lambda: nn.BatchNorm1d(3)(torch.zeros(4, 5)), "norm-num-features"),
    (
        "bce range",
        lambda: F.binary_cross_entropy(torch.tensor([1.5]), torch.tensor([1.0])),
        "bce-out-of-range",
    ),
    (
        "no process group",
        lambda: torch.distributed.all_reduce(torch.zeros(1)),
        "process-group-not-initialized",
    ),
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("name", "trigger", "entry_id"), CASES, ids=[c[0] for c in CASES])
def test_real_error_is_explained(name: str, trigger: Callable[[], object], entry_id: str) -> None:
    with pytest.raises(Exception) as caught:
        trigger()
    assert explain(caught.value).id == entry_id
    # The pasted message alone gives the same answer (no torch needed for that path).
    assert explain(f"{type(caught.value).__name__}: {caught.value}").id == entry_id
