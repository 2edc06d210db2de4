"""TD104's cache claim on real torch: the fixture's cached tensors stay behind after
`.to()`, and the rule's fix (a buffer registered as None) makes them follow the module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name.replace(".", "_"), FIXTURES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_then_move(module: ModuleType, cls: str) -> torch.device:
    """The device of what the module hands back after a CPU call and a move to `meta`."""
    sized = cls in ("PositionalEncoding", "Rotary")
    encoding = getattr(module, cls)(8) if sized else getattr(module, cls)()
    x = torch.ones(2, 5, 8)
    encoding(x)  # fills the cache on the CPU
    encoding.to("meta")
    out = encoding(torch.ones(2, 5, 8, device="meta"))
    return out.device


def test_the_reported_cache_stays_on_the_device_that_filled_it() -> None:
    bad = _load("TD104_stale_cache.py")
    assert _run_then_move(bad, "PositionalEncoding") == torch.device("cpu")


def test_the_reused_rotary_cache_meets_the_moved_input_on_the_cpu() -> None:
    bad = _load("TD104_stale_cache.py")
    with pytest.raises(RuntimeError, match="device"):
        _run_then_move(bad, "Rotary")


def test_the_fixed_cache_follows_the_module() -> None:
    fixed = _load("TD104_stale_cache.fixed.py")
    for cls in ("PositionalEncoding", "Mask", "Rotary"):
        assert _run_then_move(fixed, cls).type == "meta", cls


def test_the_quiet_device_keyed_cache_follows_its_input() -> None:
    good = _load("TD104_stale_cache.py")
    assert _run_then_move(good, "DeviceKeyed").type == "meta"
