"""td.guard: TD120 attribution at no hot-path cost, and the first-N-steps checks."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_globals
from torch.optim import optimizer as optimizer_globals

import torchdoctor as td
from torchdoctor.errors import DeviceMismatchError, UsageError
from torchdoctor.runtime.guard import GuardWarning, active_guards


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Dropout(0.5))
        self.head = nn.Linear(8, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.encoder(batch["x"]))


def _global_hooks() -> tuple[set[int], ...]:
    return (
        set(module_globals._global_forward_pre_hooks),
        set(optimizer_globals._global_optimizer_pre_hooks),
        set(optimizer_globals._global_optimizer_post_hooks),
    )


@pytest.fixture(autouse=True)
def _clean_up() -> Any:
    backward = torch.Tensor.backward
    before = _global_hooks()
    yield
    for guard in active_guards():
        guard.remove()
    assert _global_hooks() == before
    assert torch.Tensor.backward is backward


def test_device_mismatch_names_submodule_parameter_and_input() -> None:
    model = Net().to("meta")
    with pytest.raises(DeviceMismatchError) as caught, td.guard(model):
        model({"x": torch.zeros(4, 3)})
    error = caught.value
    assert isinstance(error, RuntimeError)  # existing `except RuntimeError` still works
    assert error.code == "TD112"  # type: ignore[attr-defined]  # the unmoved batch
    text = str(error)
    assert text.startswith("TD112 batch-not-moved: `encoder.0` (Linear)")
    assert "input `batch['x']`: cpu" in text
    assert "parameter `encoder.0.weight`: meta" in text
    assert "not on the expected device" in str(error.__cause__)


def test_handle_form_and_remove_restore_the_model() -> None:
    model = Net().to("meta")
    handle = td.guard(model)
    with pytest.raises(DeviceMismatchError):
        model({"x": torch.zeros(4, 3)})
    handle.remove()
    assert "forward" not in model.__dict__
    with pytest.raises(RuntimeError) as caught:
        model({"x": torch.zeros(4, 3)})
    assert not isinstance(caught.value, DeviceMismatchError)


def test_non_device_errors_pass_through_unchanged_with_explanation() -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(RuntimeError) as caught, td.guard(model):
        model(torch.zeros(2, 5))
    assert type(caught.value) is RuntimeError
    assert caught.value.explanation.id == "matmul-shapes"  # type: ignore[attr-defined]


def test_no_per_module_hooks_and_global_hooks_end_after_n_steps() -> None:
    model = Net()
    before = _global_hooks()
    guard = td.guard(model, steps=3)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert _global_hooks() != before
    for _ in range(4):
        model({"x": torch.randn(4, 3)})
    assert not guard.checking
    assert _global_hooks() == before
    guard.remove()


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def _transformer() -> nn.Module:
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


@pytest.mark.parametrize("build", [_cnn, _transformer])
@pytest.mark.parametrize("training", [False, True])
def test_outputs_are_bit_identical_with_and_without_guard(build: Any, training: bool) -> None:
    torch.manual_seed(0)
    model = build().train(training)
    x = torch.randn(4, 3, 8, 8) if build is _cnn else torch.randn(4, 5, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", GuardWarning)
        torch.manual_seed(1)
        plain = [model(x) for _ in range(3)]
        torch.manual_seed(1)
        with td.guard(model, steps=2):
            guarded = [model(x) for _ in range(3)]
    for a, b in zip(plain, guarded, strict=True):
        assert torch.equal(a, b)


def test_transformer_fast_path_is_kept_under_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fused = torch._transformer_encoder_layer_fwd

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", counting)
    model = _transformer().eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), td.guard(model, steps=1):
        model(x)  # checks on
        model(x)  # checks off
    assert len(calls) == 4  # 2 layers x 2 calls: the fused kernel every time


def test_td211_eval_under_no_grad_in_training_mode() -> None:
    model = Net()
    with td.guard(model) as guard, pytest.warns(GuardWarning, match="TD211"), torch.no_grad():
        model({"x": torch.randn(4, 3)})
    assert [code for code, _ in guard.findings] == ["TD211"]
    model.eval()
    with td.guard(model) as quiet, torch.no_grad():
        model({"x": torch.randn(4, 3)})
    assert quiet.findings == []


def test_td210_warns_before_the_single_sample_crash() -> None:
    model = Net()
    with (
        pytest.warns(GuardWarning, match="TD210 `encoder.1`"),
        pytest.raises(ValueError),
        td.guard(model) as guard,
    ):
        model({"x": torch.randn(1, 3)})
    assert guard.findings[0][0] == "TD210"
    assert "Expected more than 1 value per channel" in guard.findings[0][1]


def test_td210_tiny_last_batch() -> None:
    model = Net()
    with td.guard(model, warn=False) as guard:
        model({"x": torch.randn(64, 3)})
        model({"x": torch.randn(3, 3)})
    assert [code for code, _ in guard.findings] == ["TD210"]
    assert "batch of 3 after batches of 64" in guard.findings[0][1]


def _train(model: nn.Module, steps: int, *, zero_grad: str | None, keep_loss: bool = False) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for _ in range(steps):
        if zero_grad == "optimizer":
            optimizer.zero_grad()
        elif zero_grad == "model":
            model.zero_grad(set_to_none=False)
        loss = model({"x": torch.randn(8, 3)}).pow(2).mean()
        loss.backward()
        optimizer.step()
        kept.append(loss if keep_loss else loss.item())


def test_td212_step_without_zero_grad() -> None:
    model = Net()
    with td.guard(model, warn=False) as guard:
        _train(model, 3, zero_grad=None)
    assert [code for code, _ in guard.findings] == ["TD212"]


@pytest.mark.parametrize("zero_grad", ["optimizer", "model"])
def test_no_td212_with_zero_grad(zero_grad: str) -> None:
    model = Net()
    with td.guard(model, warn=False) as guard:
        _train(model, 4, zero_grad=zero_grad)
    assert guard.findings == []


def test_no_td212_for_deliberate_accumulation() -> None:
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with td.guard(model, warn=False) as guard:
        for _ in range(3):
            for _ in range(4):  # 4 micro-batches, then one step
                (model({"x": torch.randn(8, 3)}).pow(2).mean() / 4).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert guard.findings == []


def test_td206_loss_kept_with_graph() -> None:
    model = Net()
    with td.guard(model, warn=False) as guard:
        _train(model, 4, zero_grad="optimizer", keep_loss=True)
    assert [code for code, _ in guard.findings] == ["TD206"]


def test_guard_of_another_models_optimizer_stays_quiet() -> None:
    watched, other = Net(), Net()
    with td.guard(watched, warn=False) as guard:
        _train(other, 3, zero_grad=None)
    assert guard.findings == []


def test_deepcopy_of_a_guarded_model_uses_its_own_weights() -> None:
    model = nn.Linear(3, 2)
    with td.guard(model, checks=False):
        clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.weight.zero_()
        clone.bias.zero_()
    assert torch.equal(clone(torch.ones(1, 3)), torch.zeros(1, 2))


def test_guard_rejects_non_modules() -> None:
    with pytest.raises(UsageError):
        td.guard("model")  # type: ignore[arg-type]
