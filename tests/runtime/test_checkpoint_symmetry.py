"""load_checkpoint restores every stateful object save_checkpoint accepted, on any device,
with or without a `module.` prefix, and returns only the extras."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor as td
from torchdoctor.errors import CheckpointError

from .fakes import clear_device_env


class Counter:
    """A user object with the state_dict protocol (a sampler, a data cursor, ...)."""

    def __init__(self, position: int = 0) -> None:
        self.position = position

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def training_state(seed: int, steps: int = 3) -> dict[str, Any]:
    torch.manual_seed(seed)
    model, ema = make_model(), make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**seed)
    for _ in range(steps):
        loss = model(torch.randn(6, 4)).pow(2).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
    ema.load_state_dict(model.state_dict())
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "scaler": scaler,
        "ema": ema,
        "cursor": Counter(position=100 + seed),
    }


def same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same_state, a, b))
    return bool(a == b)


def test_every_saved_object_is_restored_and_only_the_extras_come_back(tmp_path: Path) -> None:
    saved = training_state(seed=0)
    path = td.save_checkpoint(tmp_path / "last.pt", **saved, epoch=4, config={"lr": 0.1})
    fresh = training_state(seed=1, steps=1)
    for name in saved:
        assert not same_state(fresh[name].state_dict(), saved[name].state_dict()), name

    extras = td.load_checkpoint(
        path,
        fresh["model"],
        fresh["optimizer"],
        scheduler=fresh["scheduler"],
        scaler=fresh["scaler"],
        ema=fresh["ema"],
        cursor=fresh["cursor"],
    )
    assert extras == {"epoch": 4, "config": {"lr": 0.1}}
    for name in saved:
        assert same_state(fresh[name].state_dict(), saved[name].state_dict()), name
    assert fresh["scaler"].get_scale() == saved["scaler"].get_scale()


def test_a_state_not_passed_stays_in_the_returned_entries(tmp_path: Path) -> None:
    saved = training_state(seed=0)
    path = td.save_checkpoint(tmp_path / "last.pt", **saved, epoch=4)
    fresh = training_state(seed=1, steps=1)
    rest = td.load_checkpoint(path, fresh["model"], fresh["optimizer"])
    assert set(rest) == {"scheduler", "scaler", "ema", "cursor", "epoch"}
    assert rest["cursor"] == {"position": 100}


def test_a_disabled_grad_scaler_round_trips(tmp_path: Path) -> None:
    with pytest.warns(UserWarning):  # CUDA scaler on a machine without CUDA: disabled
        scaler = torch.amp.GradScaler("cuda")
    path = td.save_checkpoint(tmp_path / "s.pt", scaler=scaler, step=1)
    with pytest.warns(UserWarning):
        fresh = torch.amp.GradScaler("cuda")
    assert td.load_checkpoint(path, scaler=fresh) == {"step": 1}


@pytest.mark.parametrize("saved_wrapped", [False, True], ids=["plain", "module."])
@pytest.mark.parametrize("target", ["cpu", "meta", "DataParallel"])
def test_model_restored_across_devices_and_prefixes(
    tmp_path: Path, saved_wrapped: bool, target: str
) -> None:
    saved = training_state(seed=0)
    model = saved["model"]
    state = nn.DataParallel(model).state_dict() if saved_wrapped else model.state_dict()
    torch.save({"model": state, "epoch": 2}, tmp_path / "foreign.pt")  # another tool's file
    td.save_checkpoint(tmp_path / "td.pt", model=model, epoch=2)
    for name in ("foreign.pt", "td.pt"):
        torch.manual_seed(5)
        if target == "meta":
            with torch.device("meta"):
                fresh: nn.Module = make_model()
        else:
            fresh = make_model()
        loaded_into = nn.DataParallel(fresh) if target == "DataParallel" else fresh
        assert td.load_checkpoint(tmp_path / name, loaded_into) == {"epoch": 2}
        assert same_state(fresh.state_dict(), model.state_dict()), (name, target)
        assert td.device_of(fresh) == torch.device("cpu")


def test_objects_restored_on_the_virtual_cuda_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_device_env(monkeypatch)
    saved = training_state(seed=0)
    path = td.save_checkpoint(tmp_path / "last.pt", **saved, epoch=9)
    with td.simulate("cuda"):
        device = td.pick_device()
        fresh = training_state(seed=1, steps=0)
        model = td.to_device(fresh["model"], device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        extras = td.load_checkpoint(path, model, optimizer, scheduler=scheduler)
        assert td.device_of(model) == device
        assert {s["exp_avg"].device for s in optimizer.state.values()} == {device}
        assert scheduler.last_epoch == saved["scheduler"].last_epoch
        assert same_state(model.state_dict(), saved["model"].state_dict())
    assert set(extras) == {"scaler", "ema", "cursor", "epoch"}


def test_missing_or_unfitting_named_objects_are_clear_errors(tmp_path: Path) -> None:
    saved = training_state(seed=0)
    path = td.save_checkpoint(tmp_path / "last.pt", model=saved["model"], epoch=1)
    with pytest.raises(CheckpointError, match=r"has no entry 'scheduler'; its states are: model"):
        td.load_checkpoint(path, scheduler=saved["scheduler"])
    td.save_checkpoint(tmp_path / "c.pt", cursor=Counter(3))
    with pytest.raises(CheckpointError, match=r"the 'cursor' state in .* does not fit this"):
        td.load_checkpoint(
            tmp_path / "c.pt",
            cursor=torch.optim.lr_scheduler.StepLR(saved["optimizer"], step_size=1),
        )
    with pytest.raises(Exception, match="must have load_state_dict"):
        td.load_checkpoint(path, scheduler=3)
