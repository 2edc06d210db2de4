"""The runtime helpers end to end on the virtual CUDA device (td.simulate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchdoctor as td
from torchdoctor.errors import DeviceMismatchError

from .fakes import clear_device_env


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_train_save_and_load_on_virtual_cuda(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_device_env(monkeypatch)
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    with td.simulate("cuda"):
        device = td.pick_device()
        assert device == torch.device("cuda", 0)
        model = td.to_device(make_model(), device)
        optimizer = torch.optim.Adam(model.parameters())
        loader = td.DeviceLoader(DataLoader(dataset, batch_size=4, pin_memory=True), device)
        for inputs, labels in loader:  # the side-stream path
            assert td.device_of((inputs, labels)) == device
            loss = nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        td.save_checkpoint(tmp_path / "td.pt", model=model, optimizer=optimizer)
        torch.save(model.state_dict(), tmp_path / "plain.pt")  # keeps cuda:0 location tags

        fresh = td.to_device(make_model(), device)
        fresh_optimizer = torch.optim.Adam(fresh.parameters())
        td.load_checkpoint(tmp_path / "td.pt", fresh, fresh_optimizer)
        assert td.device_of(fresh) == device
        assert {s["exp_avg"].device for s in fresh_optimizer.state.values()} == {device}
        assert torch.equal(fresh[0].weight.cpu(), model[0].weight.cpu())
        with pytest.raises(DeviceMismatchError, match='batch\\["mask"\\]: cpu'):
            td.device_of({"ids": torch.ones(2, device=device), "mask": torch.ones(2)})
        report = td.env_report()
        assert report["pick_device"] == "cuda:0" and report["cuda"]["device_count"] >= 1

    # Back on the CPU-only machine: the checkpoint loads even with a bare torch.load,
    # while the plain torch.save file needs map_location.
    state = torch.load(tmp_path / "td.pt", weights_only=True)
    assert {t.device.type for t in state["model"].values()} == {"cpu"}
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(tmp_path / "plain.pt", weights_only=True)
    cpu_model = make_model()
    td.load_checkpoint(tmp_path / "plain.pt", cpu_model)  # map_location is always set
    assert td.device_of(cpu_model) == torch.device("cpu")
