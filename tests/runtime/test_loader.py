"""td.DeviceLoader: batches arrive on the device; the CUDA path overlaps copies."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import torchdoctor as td
from torchdoctor.errors import InvalidArgumentError
from torchdoctor.runtime import loader as loader_module

from .fakes import clear_device_env, fake_cuda

META = torch.device("meta")


@pytest.fixture(autouse=True)
def _no_device_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_device_env(monkeypatch)


def make_loader(**kwargs: Any) -> DataLoader[Any]:
    dataset = TensorDataset(torch.arange(10.0).reshape(5, 2), torch.arange(5))
    return DataLoader(dataset, batch_size=2, **kwargs)


def test_batches_arrive_on_the_device_with_their_shape() -> None:
    loader = td.DeviceLoader(make_loader(), "meta")
    batches = list(loader)
    assert len(batches) == len(loader) == 3
    for inputs, labels in batches:
        assert inputs.device == META and labels.device == META
    assert [tuple(b[0].shape) for b in batches] == [(2, 2), (2, 2), (1, 2)]


def test_any_iterable_of_batches_and_default_device() -> None:
    batches = [{"x": torch.ones(1)}, {"x": torch.zeros(1)}]
    loader = td.DeviceLoader(batches)
    assert loader.device == torch.device("cpu")
    assert [b["x"].item() for b in loader] == [1.0, 0.0]
    assert all(b["x"].device == META for b in td.DeviceLoader(iter(batches), "meta"))
    with pytest.raises(TypeError):
        len(td.DeviceLoader(iter(batches)))  # a generator has no length
    with pytest.raises(InvalidArgumentError, match="iterable of batches"):
        td.DeviceLoader(42)  # type: ignore[arg-type]


def test_passthrough_attributes_and_set_epoch() -> None:
    dataset = TensorDataset(torch.arange(8.0))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=1)
    inner = DataLoader(dataset, batch_size=2, sampler=sampler)
    loader = td.DeviceLoader(inner, "cpu")
    assert loader.dataset is dataset and loader.sampler is sampler and loader.batch_size == 2
    epoch0 = [b[0].tolist() for b in loader]
    loader.set_epoch(5)
    assert sampler.epoch == 5
    assert [b[0].tolist() for b in loader] != epoch0, "a new epoch reshuffles"
    with pytest.raises(AttributeError):
        _ = loader.no_such_attribute


class FakeStream(torch.Stream):
    """A real torch.Stream object (on the CPU) that logs what the loader asks of it."""

    def __new__(cls, name: str, log: list[tuple[Any, ...]]) -> FakeStream:
        return super().__new__(cls, device="cpu")

    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait", self.name, other.name))


def test_cuda_path_overlaps_the_next_copy_with_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, count=1)
    log: list[tuple[Any, ...]] = []
    main, side = FakeStream("main", log), FakeStream("side", log)
    active = ["main"]

    @contextlib.contextmanager
    def stream(s: FakeStream) -> Iterator[None]:
        active.append(s.name)
        yield
        active.pop()

    def fake_move(batch: dict[str, Any], device: torch.device, non_blocking: Any) -> Any:
        log.append(("copy", int(batch["id"]), active[-1]))
        return td.to_device(batch, "meta")  # stands in for the host->GPU copy

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: main)
    monkeypatch.setattr(
        torch.Tensor, "record_stream", lambda t, s: log.append(("record", s.name)), raising=False
    )
    monkeypatch.setattr(loader_module, "to_device", fake_move)

    batches = [{"id": i, "x": torch.ones(1)} for i in range(3)]
    loader = td.DeviceLoader(batches, "cuda")
    assert loader.device == torch.device("cuda", 0)
    for batch in loader:
        log.append(("compute", batch["id"]))
        assert batch["x"].device == META
    assert log == [
        ("copy", 0, "side"),
        ("wait", "main", "side"),
        ("record", "main"),
        ("copy", 1, "side"),  # issued before batch 0 is computed on
        ("compute", 0),
        ("wait", "main", "side"),
        ("record", "main"),
        ("copy", 2, "side"),
        ("compute", 1),
        ("wait", "main", "side"),
        ("record", "main"),
        ("compute", 2),
    ]
