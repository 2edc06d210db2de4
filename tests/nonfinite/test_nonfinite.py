"""The NaN/Inf origin finder (TD217) on real models with real NaNs, forward and backward."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdoctor as td
from torchdoctor.runtime.nonfinite import NonFiniteError, all_finite, watch


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x), -1).log()  # -inf once a probability underflows


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU())
        self.head = Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Norm(nn.Module):
    """The length of the change: sqrt at 0, finite forward, NaN gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return (h - h.detach()).pow(2).sum(-1).sqrt()


def train_steps(model: nn.Module, x: torch.Tensor, steps: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(x).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_forward_log_of_zero_named_with_module_step_and_stats() -> None:
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(8, 4)
    with td.guard(model, checks=False, nonfinite=True):
        train_steps(model, x, 2)  # clean steps: no alarm
        with torch.no_grad():
            model.head.fc.weight.mul_(1e4)  # logits far apart: softmax underflows to 0
        running = model.body[1].running_mean.clone()
        with pytest.raises(NonFiniteError) as caught:
            train_steps(model, x, 1)
    report = caught.value.report
    assert (report.phase, report.step, report.module) == ("forward", 3, "head")
    assert report.operation == "aten.log.default"
    assert report.inputs[0].min == 0.0 and not report.inputs[0].nan
    assert [p.name for p in report.parameters] == ["fc.weight", "fc.bias"]
    assert report.parameters[0].max > 1e3
    assert "log of zero" in report.suggestion
    assert str(caught.value).startswith("TD217 non-finite-value")
    # the replay restored BatchNorm's statistics the failing step had updated once
    assert not torch.equal(running, model.body[1].running_mean)  # the real step ran
    assert "forward" not in model.__dict__  # the guard and the finder are gone


def test_backward_sqrt_at_zero_names_the_gradient_node() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Norm())
    with pytest.raises(NonFiniteError) as caught, td.guard(model, checks=False, nonfinite=True):
        model(torch.randn(2, 4)).sum().backward()
    report = caught.value.report
    assert (report.phase, report.step, report.module) == ("backward", 1, "1")
    assert report.operation.startswith("SqrtBackward0 (the gradient of sqrt)")
    assert "sqrt at 0" in report.suggestion
    assert any(s.min == 0.0 for s in report.inputs)


def test_division_by_zero() -> None:
    class Normalise(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / x.sum(-1, keepdim=True)

    model = nn.Sequential(nn.ReLU(), Normalise())
    watch(model)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.tensor([[1.0, 2.0], [-1.0, -2.0]]))  # second row: 0 / 0
    assert caught.value.report.module == "1"
    assert caught.value.report.operation == "aten.div.Tensor"
    assert "division by zero" in caught.value.report.suggestion


def test_float16_overflow_suggests_grad_scaler_or_bfloat16() -> None:
    class Scale(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.half() * 1000.0

    model = nn.Sequential(nn.Linear(2, 2), Scale())
    with torch.no_grad():
        model[0].weight.fill_(50.0)
    watch(model)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.ones(1, 2))  # 100 * 1000 > 65504
    report = caught.value.report
    assert report.operation == "aten.mul.Tensor" and report.inputs[0].dtype == "float16"
    assert "GradScaler" in report.suggestion and "bfloat16" in report.suggestion


def test_learning_rate_blowup_names_the_parameter() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    watch(model)
    x = torch.randn(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e38)
    with pytest.raises(NonFiniteError) as caught:
        for _ in range(5):
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    report = caught.value.report
    assert report.step >= 2
    assert "learning rate" in report.suggestion


def test_nan_from_the_loss_outside_the_model() -> None:
    model = nn.Linear(3, 3)
    watch(model)
    out = model(torch.randn(2, 3))
    with pytest.raises(NonFiniteError) as caught:
        (out * 0).log().sum().backward()
    assert caught.value.report.operation == "the gradient arriving at the model's output"
    assert "loss" in caught.value.report.suggestion


def test_clean_training_is_untouched_and_off_costs_nothing() -> None:
    torch.manual_seed(0)
    plain, watched = Net(), Net()
    watched.load_state_dict(plain.state_dict())
    x = torch.randn(8, 4)
    finder = watch(watched)
    train_steps(plain, x, 3)
    train_steps(watched, x, 3)
    assert finder.step == 3
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)
    finder.remove()
    assert "forward" not in watched.__dict__
    with td.guard(watched, checks=False):  # nonfinite off: no finder, NaNs pass
        assert "NonFinite" not in repr(watched.__dict__.get("forward"))
        assert torch.isnan(watched(torch.full((2, 4), float("nan")))).all()


def test_all_finite_confirms_an_overflowing_sum() -> None:
    big = torch.full((4,), 3e38)
    assert all_finite([big])  # the sum overflows, every value is finite
    assert not all_finite([big, torch.tensor([float("inf")])])
    assert not all_finite([torch.tensor([1.0, float("nan")])])


def test_run_detect_nonfinite_finds_it_in_a_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))\n"
        "criterion = nn.NLLLoss()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))\n"
        "for step in range(3):\n"
        "    probs = torch.softmax(model(x) * (1e6 if step == 2 else 1), -1)\n"
        "    loss = criterion(probs.log(), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "print('finished')\n"
    )
    command = [sys.executable, "-m", "torchdoctor", "run", "--detect-nonfinite", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert "finished" not in result.stdout
    assert "TD217 non-finite-value" in result.stderr
    # the log ran between the model and the loss module, which gets the -inf as its input
    assert "step 3 came from its input in the model (NLLLoss)" in result.stderr
    assert "made before this call" in result.stderr
    plain = [sys.executable, "-m", "torchdoctor", "run", str(script)]
    assert "finished" in subprocess.run(plain, capture_output=True, text=True, check=False).stdout
