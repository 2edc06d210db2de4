"""Tensor entry points while a simulation runs: `.to()` / `.cuda()` / `.cpu()` moves,
factories (`torch.zeros(..., device="cuda")`, `*_like`, `as_tensor`, `new_tensor`),
`.numpy()` and pinned memory."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor.runtime.sim import rules
from torchdoctor.runtime.sim.devices import (
    CPU,
    PINNED,
    is_virtual,
    set_site,
    set_tag,
    tag_of,
)
from torchdoctor.runtime.sim.frames import user_site
from torchdoctor.runtime.sim.operands import Operand

if TYPE_CHECKING:
    from torchdoctor.runtime.sim.patches import Patches

Tensor = torch.Tensor
_MISSING: Any = object()
_base = torch._C.TensorBase  # type: ignore[attr-defined]


def _mark_pinned(t: Tensor) -> None:
    setattr(t.untyped_storage(), PINNED, True)


def install(patches: Patches) -> None:
    _tensor_moves(patches)
    _factories(patches)
    _numpy_and_pinning(patches)


def _tensor_moves(patches: Patches) -> None:
    p = patches.patcher
    real_to = _base.to

    class _DeviceMove(torch.autograd.Function):
        """A copy to another device; the gradient flows back to the source device."""

        @staticmethod
        def forward(ctx: Any, x: Tensor, dst: Any, dtype: Any, memory_format: Any) -> Tensor:
            src = tag_of(x)
            ctx.src = src if is_virtual(src) else None
            ctx.src_dtype = x.dtype
            out = real_to(x, CPU, dtype or x.dtype, False, True, memory_format=memory_format)
            set_tag(out, dst)
            return out  # type: ignore[no-any-return]

        @staticmethod
        def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
            out = real_to(grad, CPU, ctx.src_dtype, False, True)
            set_tag(out, ctx.src)
            return out, None, None, None

    session = patches.session

    def move(t: Tensor, dst: Any, dtype: Any, memory_format: Any) -> Tensor:
        session.moves += 1
        if dst is not None and session.forked_worker:
            session.gpu_in_forked_worker()
        if dst is not None and dst.type == "mps" and (dtype or t.dtype) is torch.float64:
            session.mps_float64(t)
        if memory_format is None:
            memory_format = torch.preserve_format
        if t.requires_grad and torch.is_grad_enabled():
            out = _DeviceMove.apply(t, dst, dtype, memory_format)  # type: ignore[no-untyped-call]
        else:
            out = real_to(t, CPU, dtype or t.dtype, False, True, memory_format=memory_format)
            set_tag(out, dst)
        set_site(out, user_site(f".to({dst or 'cpu'})", depth=3))
        return out  # type: ignore[no-any-return]

    def to_device(
        t: Tensor, target: Any, dtype: Any, copy_: bool, memory_format: Any, non_blocking: bool
    ) -> Tensor:
        src = tag_of(t)
        src = src if is_virtual(src) else None
        if target is src:
            kwargs = {} if memory_format is None else {"memory_format": memory_format}
            return real_to(  # type: ignore[no-any-return]
                t,
                torch._C.TensorBase.device.__get__(t),
                dtype or t.dtype,
                non_blocking,
                copy_,
                **kwargs,
            )
        return move(t, target, dtype, memory_format)

    def parse(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Tensor.to's three signatures -> (device given?, device, dtype, copy, mf, nb)."""
        kw = dict(kwargs)
        device = kw.pop("device", _MISSING)
        dtype = kw.pop("dtype", None)
        non_blocking = kw.pop("non_blocking", False)
        copy_ = kw.pop("copy", False)
        memory_format = kw.pop("memory_format", None)
        pos = list(args)
        if pos and isinstance(pos[0], Tensor):
            other = pos.pop(0)
            tag = tag_of(other)
            device = tag if is_virtual(tag) else torch._C.TensorBase.device.__get__(other)
            dtype = other.dtype
        elif pos and isinstance(pos[0], torch.dtype):
            dtype = pos.pop(0)
        elif pos and (pos[0] is None or isinstance(pos[0], (str, torch.device, int))):
            device = pos.pop(0)
            if pos and (pos[0] is None or isinstance(pos[0], torch.dtype)):
                dtype = pos.pop(0)
        if pos:
            non_blocking = pos.pop(0)
        if pos:
            copy_ = pos.pop(0)
        if pos or kw:
            return None  # not a form we know: let torch say what is wrong
        return device, dtype, copy_, memory_format, non_blocking

    def to(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        parsed = parse(args, kwargs)
        if parsed is None:
            return real_to(self, *args, **kwargs)
        device, dtype, copy_, memory_format, non_blocking = parsed
        if device is _MISSING or device is None:
            src = tag_of(self)
            target = src if is_virtual(src) else None
        else:
            target = patches.resolve(device)
            if target is not None and not patches.devices.is_virtual(target):
                return real_to(self, *args, **kwargs)  # meta, or an unsimulated backend
        return to_device(self, target, dtype, copy_, memory_format, non_blocking)

    def cuda(self: Tensor, device: Any = None, non_blocking: bool = False, **kw: Any) -> Any:
        if patches.backend != "cuda":
            return patches.originals["cuda"](self, device, non_blocking, **kw)
        target = patches.resolve("cuda" if device is None else device)
        if isinstance(device, torch.device) and device.type != "cuda":
            raise RuntimeError(f"Invalid device, must be cuda device, got {device}")
        return to_device(self, target, None, False, kw.get("memory_format"), non_blocking)

    def cpu(self: Tensor, memory_format: Any = None) -> Any:
        return to_device(self, None, None, False, memory_format, False)

    patches.originals["cuda"] = Tensor.cuda
    p.set(Tensor, "to", to)
    p.set(Tensor, "cuda", cuda)
    p.set(Tensor, "cpu", cpu)
    patches.to_device = to_device
    # Lazy modules' uninitialized parameters only allow the methods they know
    lazy: Any = torch.nn.parameter.UninitializedTensorMixin  # type: ignore[attr-defined]
    installed = [Tensor.__dict__[name] for name in ("to", "cuda", "cpu", "get_device")]
    p.set(lazy, "_allowed_methods", [*lazy._allowed_methods, *installed])

    # nn.Module.to parses its arguments with _parse_to, which rejects a bare ordinal
    real_parse_to = torch._C._nn._parse_to
    devices = patches.devices

    def parse_to(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            args = (f"{devices.backend}:{args[0]}", *args[1:])
        if isinstance(kwargs.get("device"), int):
            kwargs["device"] = f"{devices.backend}:{kwargs['device']}"
        result = real_parse_to(*args, **kwargs)
        if args and isinstance(args[0], Tensor):
            tag = tag_of(args[0])
            if is_virtual(tag):
                return (tag, *result[1:])
        return result

    p.set(torch._C._nn, "_parse_to", parse_to)


def _factories(patches: Patches) -> None:
    p = patches.patcher

    def wrap(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def factory(*args: Any, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if device is None:
                target = patches.default_device()
            else:
                target = patches.resolve(device)
                if target is not None and not patches.devices.is_virtual(target):
                    return fn(*args, **kwargs)  # meta and friends: really there
            if target is not None:
                kwargs["device"] = CPU
                if patches.session.forked_worker:
                    patches.session.gpu_in_forked_worker()
            pinned = bool(kwargs.pop("pin_memory", False))

            out = fn(*args, **kwargs)
            if isinstance(out, Tensor):
                if target is not None and target.type == "mps" and out.dtype is torch.float64:
                    patches.session.mps_float64(out)
                set_tag(out, target)
                set_site(out, user_site(f"torch.{name}(...)"))
                if pinned and target is None:
                    _mark_pinned(out)
            return out

        return factory

    def wrap_like(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def like(*args: Any, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if device is None:
                out = fn(*args, **kwargs)  # follows its input: the mode tags it
                if isinstance(out, Tensor):
                    set_site(out, user_site(f"{name}(...)"))
                return out
            target = patches.resolve(device)
            if target is not None and not patches.devices.is_virtual(target):
                return fn(*args, **kwargs)
            kwargs["device"] = CPU
            out = fn(*args, **kwargs)
            set_tag(out, target)
            set_site(out, user_site(f"{name}(...)"))
            return out

        return like

    def wrap_as_tensor(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        factory = wrap(fn, name)

        @functools.wraps(fn)
        def as_tensor(data: Any, *args: Any, **kwargs: Any) -> Any:
            if name == "as_tensor" and args:  # as_tensor(data, dtype, device)
                kwargs.setdefault("dtype", args[0])
                if len(args) > 1:
                    kwargs.setdefault("device", args[1])
                args = ()
            if isinstance(data, Tensor) and name == "as_tensor":
                device = kwargs.get("device")
                target = patches.resolve(device) if device is not None else _MISSING
                if target is _MISSING:
                    return fn(data, dtype=kwargs.get("dtype"))
                if target is not None and not patches.devices.is_virtual(target):
                    return fn(data, *args, **kwargs)
                return patches.to_device(data, target, kwargs.get("dtype"), False, None, False)
            if isinstance(data, Tensor) and kwargs.get("device") is None:
                return fn(data, *args, **kwargs)  # asarray(tensor): stays where it is
            return factory(data, *args, **kwargs)

        return as_tensor

    factories = [
        "empty", "empty_permuted", "empty_strided", "ones", "zeros", "full", "arange",
        "range", "eye", "linspace", "logspace", "rand", "randn", "randint", "randperm",
        "scalar_tensor", "tensor", "tril_indices", "triu_indices", "bartlett_window",
        "blackman_window", "hamming_window", "hann_window", "kaiser_window", "normal",
        "sparse_coo_tensor", "sparse_csr_tensor", "sparse_csc_tensor", "sparse_bsr_tensor",
        "sparse_bsc_tensor", "sparse_compressed_tensor",
    ]  # fmt: skip
    for name in factories:
        if hasattr(torch, name):
            p.set(torch, name, wrap(getattr(torch, name), name))
    for name in ("as_tensor", "asarray"):
        p.set(torch, name, wrap_as_tensor(getattr(torch, name), name))
    for name in ("fftfreq", "rfftfreq"):
        p.set(torch.fft, name, wrap(getattr(torch.fft, name), f"fft.{name}"))
    for name in ("empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
                 "randn_like", "randint_like"):  # fmt: skip
        p.set(torch, name, wrap_like(getattr(torch, name), f"torch.{name}"))
    for name in ("new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"):
        p.set(Tensor, name, wrap_like(getattr(Tensor, name), f".{name}"))

    real_new_tensor = Tensor.new_tensor

    def new_tensor(self: Tensor, data: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device") is None:
            tag = tag_of(self)
            kwargs["device"] = tag if is_virtual(tag) else CPU
        return wrap_like(real_new_tensor, ".new_tensor")(self, data, *args, **kwargs)

    p.set(Tensor, "new_tensor", new_tensor)


def _numpy_and_pinning(patches: Patches) -> None:
    p = patches.patcher
    session = patches.session
    real_numpy = _base.numpy

    def numpy(self: Tensor, *, force: bool = False) -> Any:
        tag = tag_of(self)
        if is_virtual(tag) and not force:
            session.violation(
                rules.Violation(
                    f"can't convert {tag} device type tensor to numpy. Use Tensor.cpu() "
                    "to copy the tensor to host memory first.",
                    culprit=Operand("self", self, tag, False),
                    exc_type=TypeError,
                    kind="numpy",
                ),
                op=None,
            )
        return real_numpy(self, force=force)

    def pin_memory(self: Tensor, device: Any = None) -> Tensor:
        tag = tag_of(self)
        if is_virtual(tag):
            session.violation(
                rules.Violation(
                    f"cannot pin '{rules.legacy_type(self, tag)}' only dense CPU tensors "
                    "can be pinned",
                    culprit=Operand("self", self, tag, False),
                    kind="pin",
                ),
                op=None,
            )
            return self
        if getattr(self.untyped_storage(), PINNED, False):
            return self
        out = self.clone()
        _mark_pinned(out)
        return out

    def is_pinned(self: Tensor, device: Any = None) -> bool:
        try:
            return bool(getattr(self.untyped_storage(), PINNED, False))
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            return False

    p.set(Tensor, "numpy", numpy)
    p.set(Tensor, "pin_memory", pin_memory)
    p.set(Tensor, "is_pinned", is_pinned)
    p.set(Tensor, "record_stream", lambda self, stream: None)  # streams are stand-ins
