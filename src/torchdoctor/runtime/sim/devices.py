"""The virtual devices and the tag store.

Every tensor really lives on the CPU. The device it would have on an accelerator
is written on its `UntypedStorage` Python object (absent = cpu), so views,
`.data`, `nn.Parameter(t)`, `param.data = ...` and `set_()` share it for free.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

TAG = "_td_device"  # the virtual device, an interned torch.device; absent = cpu
PINNED = "_td_pinned"  # set by the simulated pin_memory()
SITE = "_td_site"  # (file, line, what, function) where the tensor was created or moved

Tensor = torch.Tensor
real_device = torch._C.TensorBase.device.__get__  # type: ignore[attr-defined]
CPU = torch.device("cpu")


class _Wild:
    """Tag of tensors made by a factory inside a C++ composite (e.g. `one_hot`).

    They arrive with device=cpu although the composite would have put them on the
    device of its input; they take the device of the first tensor they meet.
    """

    def __repr__(self) -> str:
        return "wild"


WILD: Any = _Wild()


def is_virtual(tag: Any) -> bool:
    """Whether a tensor's tag names a virtual device (not the CPU, not "any device")."""
    return tag is not None and tag is not WILD


class InvalidOrdinal(Exception):
    """A device index at or beyond the simulated device count (rule 11)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(str(device))
        self.device = device


class VirtualDevices:
    """The simulated accelerator: its backend name, device count and current device."""

    def __init__(self, backend: str, count: int) -> None:
        self.backend = backend
        self.count = count
        self.devices = tuple(torch.device(backend, i) for i in range(count))
        self._interned: dict[Any, torch.device] = {}
        self._thread = threading.local()  # the current device is per thread, as in CUDA

    @property
    def current(self) -> int:
        return getattr(self._thread, "current", 0)  # type: ignore[no-any-return]

    @current.setter
    def current(self, index: int) -> None:
        self._thread.current = index

    def get(self, index: int) -> torch.device:
        """The interned device object for an ordinal; raises InvalidOrdinal past the count."""
        if 0 <= index < self.count:
            return self.devices[index]
        raise InvalidOrdinal(torch.device(self.backend, index))

    def resolve(self, device: Any) -> torch.device | None:
        """Map a user's device argument to a virtual device, None for cpu.

        Devices of another type (meta, ...) come back as real `torch.device`
        objects that are not virtual; callers pass those to torch unchanged.
        """
        if device is None:
            return None
        if isinstance(device, int) and not isinstance(device, bool):
            return self.get(device)  # a bare ordinal means the accelerator
        hit = self._interned.get(device) if isinstance(device, (str, torch.device)) else None
        if hit is not None:
            return hit
        dev = device if isinstance(device, torch.device) else torch.device(device)
        if dev.type == "cpu":
            return None
        if dev.type != self.backend:
            return dev
        index = self.current if dev.index is None else dev.index
        result = self.get(index)
        if dev.index is not None:  # "cuda" follows set_device; "cuda:0" never changes
            self._interned[device] = result
        return result

    def is_virtual(self, device: object) -> bool:
        return isinstance(device, torch.device) and device.type == self.backend


def _storage_holder(t: Tensor) -> Tensor:
    """The tensor whose storage carries the tag: a sparse tensor's values."""
    if t.layout == torch.sparse_coo:
        return t._values()
    if t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return t.values()
    return t


def tag_of(t: Tensor) -> Any:
    """The raw tag: an interned virtual device, WILD, or None (cpu)."""
    try:
        return getattr(t.untyped_storage(), TAG, None)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):  # sparse, nested, fake
        try:
            return getattr(_storage_holder(t).untyped_storage(), TAG, None)
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            return None


def set_tag(t: Tensor, device: Any) -> None:
    """Put `t` (and every alias of its storage) on a virtual device; None = cpu."""
    try:
        storage = _storage_holder(t).untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return
    if device is None:
        storage.__dict__.pop(TAG, None)
    elif getattr(storage, TAG, None) is not device:
        setattr(storage, TAG, device)


def device_of(t: Tensor) -> torch.device:
    """The device user code sees: the virtual one, else the real one."""
    tag = tag_of(t)
    if tag is None or tag is WILD:
        return real_device(t)  # type: ignore[no-any-return]
    return tag  # type: ignore[no-any-return]


def describe(dev: Any) -> str:
    """How PyTorch prints a device in its messages: cpu, cuda:0."""
    if dev is None or dev is WILD:
        return "cpu"
    return str(dev)


def set_site(t: Tensor, site: tuple[str, int, str, str] | None) -> None:
    if site is None:
        return
    with contextlib.suppress(RuntimeError, NotImplementedError, TypeError, ValueError):
        setattr(t.untyped_storage(), SITE, site)


def site_of(t: Tensor) -> tuple[str, int, str, str] | None:
    try:
        return getattr(t.untyped_storage(), SITE, None)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None
