"""Fake accelerator answers for testing GPU code paths on a CPU-only machine.

Each helper patches the documented torch API (torch.cuda.is_available, ...)
through pytest's monkeypatch, so everything is restored after the test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

DISTRIBUTED_VARS = ("TORCHDOCTOR_DEVICE", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def clear_device_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in DISTRIBUTED_VARS:
        monkeypatch.delenv(name, raising=False)


@dataclass
class FakeCuda:
    """What the fake torch.cuda answered and was asked."""

    count: int
    current: int = 0
    set_device_calls: list[Any] = field(default_factory=list)


def fake_cuda(
    monkeypatch: pytest.MonkeyPatch,
    count: int = 2,
    *,
    properties: list[SimpleNamespace] | None = None,
    arch_list: list[str] | None = None,
    cuda_version: str = "12.6",
) -> FakeCuda:
    """Make torch.cuda report `count` GPUs (on a CPU-only build)."""
    state = FakeCuda(count)
    props = properties or [
        SimpleNamespace(name="NVIDIA A10G", major=8, minor=6, total_memory=24 * 2**30)
        for _ in range(count)
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state.current)
    monkeypatch.setattr(torch.cuda, "set_device", state.set_device_calls.append)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[int(i)])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (20 * 2**30, 24 * 2**30))
    monkeypatch.setattr(
        torch.cuda,
        "get_arch_list",
        lambda: arch_list if arch_list is not None else ["sm_50", "sm_80", "sm_86", "sm_90"],
    )
    monkeypatch.setattr(torch.version, "cuda", cuda_version)
    return state


def fake_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


def fake_xpu(monkeypatch: pytest.MonkeyPatch, count: int = 1) -> None:
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: count)
    monkeypatch.setattr(torch.xpu, "current_device", lambda: 0)
    monkeypatch.setattr(torch.xpu, "set_device", lambda device: None)
