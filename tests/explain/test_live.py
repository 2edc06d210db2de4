"""Live exceptions: the failing submodule, the tensors involved and the culprit, found on the
meta device (mixing meta and CPU tensors raises PyTorch's device-mismatch errors)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchdoctor.explain.explainer import explain


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
        self.head = nn.Linear(4, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.layers(batch["x"]))


class WithAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.scale = torch.ones(2)  # not a buffer: .to() leaves it behind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


class WithFactory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset = torch.ones(2)  # no device=
        return self.fc(x) + offset


class WithPlainList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.blocks = [nn.Linear(3, 3)]  # not registered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        for block in self.blocks:
            x = block(x)
        return x


def _raised(fn: object, *args: object) -> BaseException:
    with pytest.raises(RuntimeError) as caught:
        fn(*args)  # type: ignore[operator]
    return caught.value


def test_unmoved_input_is_the_culprit() -> None:
    model = Encoder().to("meta")
    explanation = explain(_raised(model, {"x": torch.zeros(2, 3)}))
    assert explanation.topic == "device"
    assert explanation.module_path == "layers.0"
    assert explanation.module_class == "Linear"
    [culprit] = explanation.culprits
    assert (culprit.role, culprit.name, culprit.device, culprit.code) == (
        "input",
        "batch['x']",
        "cpu",
        "TD112",
    )
    assert explanation.code == "TD112"
    assert explanation.causes[0].codes == ("TD112",)
    devices = {o.name: o.device for o in explanation.operands}
    assert devices["layers.0.weight"] == "meta"
    assert explanation.frame is not None and explanation.frame.function == "forward"
    assert "batch['x']" in str(explanation)


def test_plain_tensor_attribute_is_td104() -> None:
    model = WithAttribute().to("meta")
    explanation = explain(_raised(model, torch.zeros(2, 3, device="meta")))
    # named through the variable the caller holds the model in (`fn` here)
    assert [(c.name, c.code) for c in explanation.culprits] == [("fn.scale", "TD104")]
    assert explanation.code == "TD104"
    assert explanation.causes[0].codes == ("TD104",)


def test_tensor_made_in_forward_is_td103() -> None:
    model = WithFactory().to("meta")
    explanation = explain(_raised(model, torch.zeros(2, 3, device="meta")))
    assert [(c.role, c.name, c.code) for c in explanation.culprits] == [
        ("local", "offset", "TD103")
    ]


def test_module_in_plain_list_is_td105() -> None:
    model = WithPlainList().to("meta")
    explanation = explain(_raised(model, torch.zeros(2, 3, device="meta")))
    codes = {c.code for c in explanation.culprits}
    assert codes == {"TD105"}
    [culprit] = explanation.culprits  # the operand the failing op got: a parameter of it
    assert culprit.role == "parameter" and culprit.name.startswith("fn.blocks[0].")


def test_dtype_culprit_is_named() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    explanation = explain(_raised(model, torch.zeros(2, 3, dtype=torch.float64)))
    assert explanation.id == "dtype-mismatch"
    [culprit] = explanation.culprits
    assert (culprit.name, culprit.dtype) == ("input", "float64")


def test_model_argument_names_paths_from_that_root() -> None:
    model = Encoder().to("meta")
    exc = _raised(model.layers, torch.zeros(2, 3))
    assert explain(exc, model=model).module_path == "layers.0"


def test_tensors_of_a_bare_op_are_listed() -> None:
    def user_code() -> torch.Tensor:
        a = torch.zeros(2)
        b = torch.zeros(2, device="meta")
        return torch.add(a, b)

    explanation = explain(_raised(user_code))
    assert explanation.frame is not None and explanation.frame.function == "user_code"
    names = {o.name: o.device for o in explanation.operands}
    assert names.get("a") == "cpu" and names.get("b") == "meta"
