"""`DeviceLoader`: wrap any iterable of batches so they arrive on the device."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

import torch

from torchdoctor.errors import InvalidArgumentError
from torchdoctor.runtime.device import DeviceLike, _named_tensors, pick_device, to_device

__all__ = ["DeviceLoader"]

B = TypeVar("B")


class DeviceLoader(Generic[B]):
    """Yields the batches of `loader`, already moved with `td.to_device`.

    On CUDA the copy of batch i+1 runs on a side stream while the model computes
    on batch i (give the DataLoader `pin_memory=True` so the copy can be
    asynchronous). Elsewhere it is a plain mover. `len()`, `sampler`,
    `dataset`, `batch_size` and any other attribute come from the wrapped
    loader; `set_epoch(n)` reaches the loader or its sampler.
    """

    def __init__(
        self,
        loader: Iterable[B],
        device: DeviceLike | None = None,
        *,
        non_blocking: bool | None = None,
    ) -> None:
        if not isinstance(loader, Iterable):
            raise InvalidArgumentError(
                f"DeviceLoader needs an iterable of batches (a DataLoader, a list, ...), "
                f"not {type(loader).__name__}"
            )
        self.loader = loader
        self.device = pick_device(device) if device is not None else pick_device()
        self.non_blocking = non_blocking

    def __iter__(self) -> Iterator[B]:
        if self.device.type == "cuda" and torch.cuda.is_available():
            return self._iter_overlapped()
        return (
            to_device(batch, self.device, non_blocking=self.non_blocking) for batch in self.loader
        )

    def _iter_overlapped(self) -> Iterator[B]:
        device = self.device
        copy_stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        batches = iter(self.loader)
        done = object()

        def start_copy() -> Any:
            batch = next(batches, done)
            if batch is done:
                return done
            with torch.cuda.stream(copy_stream):
                return to_device(batch, device, non_blocking=self.non_blocking)

        upcoming = start_copy()
        while upcoming is not done:
            compute_stream = torch.cuda.current_stream(device)
            compute_stream.wait_stream(copy_stream)
            batch = upcoming
            # The memory was allocated on the copy stream: tell the caching allocator it
            # is used on the compute stream, so it is not reused while kernels still read it.
            # (A stream that is no torch.Stream, e.g. the virtual accelerator's, has no
            # allocator behind it to tell.)
            if isinstance(compute_stream, torch.Stream):
                for _, tensor, _ in _named_tensors(batch, ""):
                    if tensor.device.type != "cpu":  # PackedSequence.batch_sizes stays on CPU
                        tensor.record_stream(compute_stream)
            upcoming = start_copy()  # overlaps with the caller's compute on `batch`
            yield batch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Forward to the loader's or its sampler's `set_epoch` (DistributedSampler)."""
        for owner in (
            self.loader,
            getattr(self.loader, "sampler", None),
            getattr(getattr(self.loader, "batch_sampler", None), "sampler", None),
        ):
            set_epoch = getattr(owner, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
                return

    def __getattr__(self, name: str) -> Any:
        # Only called for names DeviceLoader lacks: sampler, dataset, batch_size, ...
        if name == "loader":  # not yet set (during unpickling): avoid recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"DeviceLoader({self.loader!r}, device={str(self.device)!r})"
