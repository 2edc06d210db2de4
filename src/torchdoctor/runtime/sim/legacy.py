"""Legacy tensor types on the virtual GPU: `torch.cuda.FloatTensor(3)`, `.new(...)`, `.type()`.

A CPU build refuses `torch.cuda.LongTensor([1, 2])` ("Torch not compiled with
CUDA"), which a GPU machine accepts. While a simulation runs, each
`torch.cuda.<T>Tensor` is a stand-in that builds the CPU tensor and puts it on the
current virtual device, and answers `isinstance` as the real type does on a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchdoctor.runtime.sim import rules
from torchdoctor.runtime.sim.devices import is_virtual, set_site, set_tag, tag_of
from torchdoctor.runtime.sim.frames import user_site

if TYPE_CHECKING:
    from torchdoctor.runtime.sim.patches import Patches

Tensor = torch.Tensor
_base = torch._C.TensorBase  # type: ignore[attr-defined]

LEGACY_NAMES = (
    "BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor",
    "HalfTensor", "IntTensor", "LongTensor", "ShortTensor",
)  # fmt: skip


def install(patches: Patches) -> None:
    """Patch `torch.<backend>.<T>Tensor`, `Tensor.new` and `Tensor.type`."""
    if patches.backend == "cuda":
        _legacy_constructors(patches)
    _new(patches)
    _type(patches)


def _legacy_constructors(patches: Patches) -> None:
    backend = patches.backend

    class _LegacyType(type):
        cpu_type: Any
        dtype: torch.dtype

        def __instancecheck__(cls, obj: object) -> bool:
            if not isinstance(obj, Tensor) or obj.layout != torch.strided:
                return False
            tag = tag_of(obj)
            return is_virtual(tag) and tag.type == backend and obj.dtype == cls.dtype

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            device = kwargs.pop("device", None)
            out = cls.cpu_type(*args, **kwargs)
            target = patches.resolve(backend if device is None else device)
            if isinstance(out, Tensor) and not any(isinstance(a, Tensor) for a in args):
                set_tag(out, target)  # new memory: on the device (an aliased tensor keeps its own)
                set_site(out, user_site(f"torch.{backend}.{cls.__name__}(...)"))
            elif isinstance(out, Tensor):
                out = out.to(target)
            return out

    for name in LEGACY_NAMES:
        real = getattr(torch.cuda, name, None)
        if real is None:
            continue
        stand_in = _LegacyType(
            name,
            (),
            {
                "__module__": f"torch.{backend}",
                "__qualname__": name,
                "cpu_type": getattr(torch, name),
                "dtype": real.dtype,
                "is_cuda": True,
                "is_sparse": False,
            },
        )
        patches.patcher.set(torch.cuda, name, stand_in)


def _new(patches: Patches) -> None:
    real_new = _base.new

    def new(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.pop("device", None)
        if device is None:
            tag = tag_of(self)
            target = tag if is_virtual(tag) else None
        else:
            target = patches.resolve(device)
        out = real_new(self, *args, **kwargs)
        if isinstance(out, Tensor) and not any(isinstance(a, Tensor) for a in args):
            set_tag(out, target)
        return out

    patches.patcher.set(Tensor, "new", new)


def _type(patches: Patches) -> None:
    """`.type()`: the legacy name with the virtual device; dtype and type arguments."""
    backend = patches.backend
    real_type = _base.type

    def type_(self: Tensor, dtype: Any = None, non_blocking: bool = False, **kw: Any) -> Any:
        tag = tag_of(self)
        if dtype is None:
            return rules.legacy_type(self, tag if is_virtual(tag) else None)
        if isinstance(dtype, torch.dtype):  # x.type(torch.int64): same device, new dtype
            return real_type(self, dtype, non_blocking, **kw)
        name = dtype if isinstance(dtype, str) else f"{dtype.__module__}.{dtype.__name__}"
        marker = f".{backend}."
        if marker in name:
            converted = real_type(self, name.replace(marker, "."), non_blocking, **kw)
            return converted.to(backend)
        result = real_type(self, dtype if isinstance(dtype, str) else name, non_blocking, **kw)
        return result.to("cpu") if is_virtual(tag) and isinstance(result, Tensor) else result

    patches.patcher.set(Tensor, "type", type_)
