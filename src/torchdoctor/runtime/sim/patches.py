"""Python-level patches: what the dispatch mode cannot see.

A CPU build of PyTorch refuses `device="cuda"` before any op is dispatched, and
answers `torch.cuda.is_available()` with False, so the entry points that take
or report devices are replaced while a simulation runs: tensor properties and
moves, factories, `torch.cuda.*` / `torch.accelerator.*`, NumPy conversion,
pinned memory, checkpoints, optimizer grouping, the RNN checks and threads.
Every replaced attribute is put back on exit.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._device as _device_context

from torchdoctor.runtime.sim import device_modules, legacy, rules, value_checks
from torchdoctor.runtime.sim.devices import (
    CPU,
    PINNED,
    TAG,
    WILD,
    InvalidOrdinal,
    describe,
    device_of,
    real_device,
    set_site,
    set_tag,
    tag_of,
)
from torchdoctor.runtime.sim.frames import user_site
from torchdoctor.runtime.sim.opaque import call_opaque

if TYPE_CHECKING:
    from torchdoctor.runtime.sim.session import Simulation

Tensor = torch.Tensor
_MISSING: Any = object()
_base = torch._C.TensorBase  # type: ignore[attr-defined]


class Patcher:
    """Replaces attributes and restores them, in reverse order.

    A replaced function stays guarded after the restore: code that grabbed it while the
    simulation ran (`from torch import zeros` in a module imported then) gets the real
    function's behaviour once the simulation is over.
    """

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self.closed = False

    def set(self, owner: Any, name: str, value: Any) -> None:
        namespace = getattr(owner, "__dict__", None)
        old = namespace.get(name, _MISSING) if namespace is not None else _MISSING
        real = getattr(owner, name, _MISSING) if old is _MISSING else old
        if isinstance(value, types.FunctionType) and callable(real):
            value = self._guard(value, real)
        self._saved.append((owner, name, old))
        setattr(owner, name, value)

    def _guard(self, value: Callable[..., Any], real: Callable[..., Any]) -> Callable[..., Any]:
        patcher = self

        @functools.wraps(value)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            if patcher.closed:
                return real(*args, **kwargs)
            return value(*args, **kwargs)

        return guarded

    def restore(self) -> None:
        self.closed = True
        while self._saved:
            owner, name, old = self._saved.pop()
            if old is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, old)


_holders_cache: tuple[int, list[Any]] = (-1, [])


def _holders(function: Any) -> list[Any]:
    """The torch modules that imported `function` by name (cached until sys.modules grows)."""
    global _holders_cache
    if _holders_cache[0] != len(sys.modules):
        found = []
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None) if name.startswith("torch") else None
            if namespace and namespace.get(function.__name__) is function:
                found.append(module)
        _holders_cache = (len(sys.modules), found)
    return _holders_cache[1]


def _virtual(tag: Any) -> bool:

    return tag is not None and tag is not WILD


class Patches:
    """All Python-level patches of one simulation."""

    def __init__(self, session: Simulation) -> None:
        self.session = session
        self.devices = session.devices
        self.backend = session.devices.backend
        self.patcher = Patcher()
        self.originals: dict[str, Any] = {}
        self.stream_class: Any = None  # the stand-in Stream (device_modules.py)

    # -- helpers -------------------------------------------------------------

    def resolve(self, device: Any) -> Any:
        """A user's device argument -> virtual device, None (cpu) or a real other device."""
        try:
            return self.devices.resolve(device)
        except InvalidOrdinal as bad:
            return self.session.invalid_ordinal(bad.device)

    def default_device(self) -> Any:
        """The device of `torch.set_default_device` / `with torch.device(...)`, if virtual."""
        if not torch._C._len_torch_function_stack():
            return None
        current = None
        for mode in torch.overrides._get_current_function_mode_stack():  # type: ignore[no-untyped-call]
            if isinstance(mode, _device_context.DeviceContext):
                current = mode.device  # the innermost one wins
        if current is None or current.type != self.backend:
            return None
        return self.resolve(current)

    def install(self) -> None:
        self._tensor_properties()
        self._tensor_moves()
        self._factories()
        self._numpy_and_pinning()
        device_modules.install(self)
        self._device_class()
        self._generator()
        self._serialization()
        self._optimizers()
        self._rnn()
        self._copying()
        self._threads()
        self._autocast()
        self._unsupported()
        legacy.install(self)
        value_checks.install(self)

    def uninstall(self) -> None:
        self.patcher.restore()

    # -- tensor properties ---------------------------------------------------

    def _tensor_properties(self) -> None:
        p = self.patcher
        backend = self.backend
        real_get_device = _base.get_device

        def is_backend(self: Tensor) -> bool:
            tag = tag_of(self)
            return _virtual(tag) and tag.type == backend

        def is_cpu(self: Tensor) -> bool:
            return not _virtual(tag_of(self)) and real_device(self).type == "cpu"

        def get_device(self: Tensor) -> int:
            tag = tag_of(self)
            if _virtual(tag):
                return int(tag.index)
            return int(real_get_device(self))

        p.set(Tensor, "device", property(device_of))
        p.set(Tensor, "is_cuda", property(is_backend if backend == "cuda" else lambda t: False))
        p.set(Tensor, "is_mps", property(is_backend if backend == "mps" else lambda t: False))
        p.set(Tensor, "is_cpu", property(is_cpu))
        p.set(Tensor, "get_device", get_device)

    # -- moves: to / cuda / cpu ----------------------------------------------

    def _tensor_moves(self) -> None:
        p = self.patcher
        real_to = _base.to
        patches = self

        class _DeviceMove(torch.autograd.Function):
            """A copy to another device; the gradient flows back to the source device."""

            @staticmethod
            def forward(ctx: Any, x: Tensor, dst: Any, dtype: Any, memory_format: Any) -> Tensor:
                src = tag_of(x)
                ctx.src = src if _virtual(src) else None
                ctx.src_dtype = x.dtype
                out = real_to(x, CPU, dtype or x.dtype, False, True, memory_format=memory_format)
                set_tag(out, dst)
                return out  # type: ignore[no-any-return]

            @staticmethod
            def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
                out = real_to(grad, CPU, ctx.src_dtype, False, True)
                set_tag(out, ctx.src)
                return out, None, None, None

        session = self.session

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
            src = src if _virtual(src) else None
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
                device = tag if _virtual(tag) else torch._C.TensorBase.device.__get__(other)
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
                target = src if _virtual(src) else None
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

        self.originals["cuda"] = Tensor.cuda
        p.set(Tensor, "to", to)
        p.set(Tensor, "cuda", cuda)
        p.set(Tensor, "cpu", cpu)
        self.to_device = to_device
        # Lazy modules' uninitialized parameters only allow the methods they know
        lazy: Any = torch.nn.parameter.UninitializedTensorMixin  # type: ignore[attr-defined]
        installed = [Tensor.__dict__[name] for name in ("to", "cuda", "cpu", "get_device")]
        p.set(lazy, "_allowed_methods", [*lazy._allowed_methods, *installed])

        # nn.Module.to parses its arguments with _parse_to, which rejects a bare ordinal
        real_parse_to = torch._C._nn._parse_to
        devices = self.devices

        def parse_to(*args: Any, **kwargs: Any) -> Any:
            if args and isinstance(args[0], int) and not isinstance(args[0], bool):
                args = (f"{devices.backend}:{args[0]}", *args[1:])
            if isinstance(kwargs.get("device"), int):
                kwargs["device"] = f"{devices.backend}:{kwargs['device']}"
            result = real_parse_to(*args, **kwargs)
            if args and isinstance(args[0], Tensor):
                tag = tag_of(args[0])
                if _virtual(tag):
                    return (tag, *result[1:])
            return result

        p.set(torch._C._nn, "_parse_to", parse_to)

    # -- factories -----------------------------------------------------------

    def _factories(self) -> None:
        p = self.patcher
        patches = self
        pin_site = self._mark_pinned

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
                        pin_site(out)
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
                kwargs["device"] = tag if _virtual(tag) else CPU
            return wrap_like(real_new_tensor, ".new_tensor")(self, data, *args, **kwargs)

        p.set(Tensor, "new_tensor", new_tensor)

    # -- numpy, pin_memory ---------------------------------------------------

    def _mark_pinned(self, t: Tensor) -> None:
        setattr(t.untyped_storage(), PINNED, True)

    def _numpy_and_pinning(self) -> None:
        p = self.patcher
        session = self.session
        real_numpy = _base.numpy

        def numpy(self: Tensor, *, force: bool = False) -> Any:
            tag = tag_of(self)
            if _virtual(tag) and not force:
                session.violation(
                    rules.Violation(
                        f"can't convert {tag} device type tensor to numpy. Use Tensor.cpu() "
                        "to copy the tensor to host memory first.",
                        culprit=rules.Operand("self", self, tag, False),
                        exc_type=TypeError,
                        kind="numpy",
                    ),
                    op=None,
                )
            return real_numpy(self, force=force)

        def pin_memory(self: Tensor, device: Any = None) -> Tensor:
            tag = tag_of(self)
            if _virtual(tag):
                session.violation(
                    rules.Violation(
                        f"cannot pin '{rules.legacy_type(self, tag)}' only dense CPU tensors "
                        "can be pinned",
                        culprit=rules.Operand("self", self, tag, False),
                        kind="pin",
                    ),
                    op=None,
                )
                return self
            if getattr(self.untyped_storage(), PINNED, False):
                return self
            out = self.clone()
            setattr(out.untyped_storage(), PINNED, True)
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

    # -- torch.cuda / torch.mps / torch.accelerator --------------------------

    def _index(self, device: Any) -> int:
        if device is None:
            return self.devices.current
        if isinstance(device, int) and not isinstance(device, bool):
            index = device
        else:
            dev = device if isinstance(device, torch.device) else torch.device(device)
            index = self.devices.current if dev.index is None else dev.index
        if index < 0:
            return self.devices.current
        if index >= self.devices.count:
            self.session.invalid_ordinal(torch.device(self.backend, index))
        return index

    # -- torch.Generator -----------------------------------------------------

    def _device_class(self) -> None:
        """torch.device(0): a bare ordinal names the accelerator, which a CPU build lacks.

        torch.device becomes a stand-in class whose instances are the real
        torch.device objects (isinstance keeps working); only `torch.device(<int>)`
        is answered here.
        """
        patches = self
        real = torch.device

        class _DeviceMeta(type):
            def __instancecheck__(cls, obj: object) -> bool:
                return isinstance(obj, real)

            def __subclasscheck__(cls, sub: type) -> bool:
                return issubclass(sub, real)

            def __call__(cls, *args: Any, **kwargs: Any) -> Any:
                if len(args) == 1 and not kwargs and type(args[0]) is int:
                    return torch.device(patches.backend, patches._index(args[0]))
                return real(*args, **kwargs)

        class device(metaclass=_DeviceMeta):  # stands in for torch.device
            __doc__ = real.__doc__

        self.patcher.set(torch, "device", device)

    def _generator(self) -> None:

        patches = self
        real = torch._C.Generator

        class _GeneratorMeta(type(real)):  # type: ignore[misc]
            def __instancecheck__(cls, obj: object) -> bool:
                return isinstance(obj, real)

            def __subclasscheck__(cls, sub: type) -> bool:
                return issubclass(sub, real)

        class Generator(real, metaclass=_GeneratorMeta):  # type: ignore[valid-type,misc]
            """torch.Generator(device="cuda"): a CPU generator that reports the virtual device."""

            def __new__(cls, device: Any = "cpu") -> Any:
                target = patches.resolve(device)
                gen = real.__new__(cls, "cpu" if patches.devices.is_virtual(target) else device)  # type: ignore[call-arg]
                gen._td_device = target
                return gen

            def __init__(self, device: Any = "cpu") -> None:
                pass

            @property
            def device(self) -> Any:  # type: ignore[override]
                target = self._td_device
                return target if patches.devices.is_virtual(target) else real.device.__get__(self)

        with contextlib.suppress(TypeError):  # a torch whose Generator cannot be subclassed
            self.patcher.set(torch, "Generator", Generator)

    # -- torch.save / torch.load ---------------------------------------------

    def _serialization(self) -> None:
        p = self.patcher
        ser = torch.serialization
        real_location_tag = ser.location_tag
        real_restore: Callable[..., Any] = ser.default_restore_location
        session = self.session
        backend = self.backend

        def location_tag(storage: Any) -> Any:
            untyped = getattr(storage, "_untyped_storage", storage)
            tag = getattr(untyped, TAG, None)
            if tag is not None and tag is not WILD:  # what a GPU machine writes: cuda:0, mps
                return "mps" if tag.type == "mps" else str(tag)
            return real_location_tag(storage)

        def default_restore_location(storage: Any, location: str) -> Any:
            if not (location == backend or location.startswith(backend + ":")):
                return real_restore(storage, location)
            # _validate_device raises PyTorch's message for a missing ordinal
            validate: Callable[..., Any] = ser._validate_device
            index = 0 if backend == "mps" else validate(location, backend).index
            target = self.devices.get(index or 0)
            untyped = getattr(storage, "_untyped_storage", storage)
            setattr(untyped, TAG, target)
            return storage

        p.set(ser, "location_tag", location_tag)
        p.set(ser, "default_restore_location", default_restore_location)

        real_get_restore: Callable[..., Any] = ser._get_restore_location

        def get_restore_location(map_location: Any) -> Any:
            restore = real_get_restore(map_location)
            if map_location is not None:
                return restore

            def restore_without_map_location(storage: Any, location: str) -> Any:
                if location == backend or location.startswith(backend + ":"):
                    session.loaded_device_checkpoint(location)  # strict: a CPU box's error
                return restore(storage, location)

            return restore_without_map_location

        p.set(ser, "_get_restore_location", get_restore_location)

        patches = self

        def storage_cuda(
            self_: Any, device: Any = None, non_blocking: bool = False, **kw: Any
        ) -> Any:
            copied = self_.clone()
            index = patches.devices.current if device is None else patches._index(device)
            setattr(copied, TAG, patches.devices.get(index))
            return copied

        if backend == "cuda":
            p.set(torch.UntypedStorage, "cuda", storage_cuda)

    # -- optimizers, grad clipping, GradScaler -------------------------------

    def _optimizers(self) -> None:
        from torch.utils import _foreach_utils

        real_group = _foreach_utils._group_tensors_by_device_and_dtype

        def group(tensorlistlist: Any, with_indices: bool = False) -> Any:
            """Group by *virtual* device and dtype, as a CUDA machine would."""
            grouped = real_group(tensorlistlist, with_indices)
            result: dict[Any, Any] = {}
            for (_, dtype), (lists, indices) in grouped.items():
                firsts = lists[0]
                buckets: dict[Any, list[int]] = {}
                for pos, t in enumerate(firsts):
                    tag = tag_of(t) if t is not None else None
                    dev = tag if _virtual(tag) else CPU
                    buckets.setdefault(dev, []).append(pos)
                for dev, positions in buckets.items():
                    new_lists = [[lst[i] for i in positions] if lst else lst for lst in lists]
                    new_indices = [indices[i] for i in positions] if indices else indices
                    key = (dev, dtype)
                    if key in result:
                        old_lists, old_indices = result[key]
                        for old, new in zip(old_lists, new_lists, strict=True):
                            if old is not None and new:
                                old.extend(new)
                        if old_indices is not None:
                            old_indices.extend(new_indices)
                    else:
                        result[key] = (new_lists, new_indices)
            return result

        for module in _holders(real_group):
            self.patcher.set(module, "_group_tensors_by_device_and_dtype", group)

        opt = torch.optim.Optimizer
        if "_group_tensors_by_device_and_dtype" in opt.__dict__:
            self.patcher.set(opt, "_group_tensors_by_device_and_dtype", staticmethod(group))

    # -- RNN device checks ---------------------------------------------------

    def _rnn(self) -> None:
        vf = torch._VF
        session = self.session

        def check(inp: Tensor, hiddens: list[Any], params: list[Any]) -> Any:
            """The input's device, once hidden state and parameters agree (rule 6)."""
            dev = rules.operand_device(inp, tag_of(inp))
            if dev is WILD:
                return dev

            for what, group in (("hidden", hiddens), ("parameter", params)):
                for t in group:
                    if not isinstance(t, Tensor):
                        continue
                    other = rules.operand_device(t, tag_of(t))
                    if other is WILD or other == dev:
                        continue
                    session.violation(
                        rules.Violation(
                            f"Input and {what} tensors are not at the same device, found input "
                            f"tensor at {describe(dev)} and {what} tensor at "
                            f"{describe(other)}",
                            culprit=rules.Operand(what, t, other, False),
                            reference=rules.Operand("input", inp, dev, False),
                            output_device=dev,
                        ),
                        op=None,
                    )
                    return dev  # keep-going: run it on the input's device
            return dev

        def wrap(name: str) -> Callable[..., Any]:

            real = getattr(vf, name)

            def rnn(*args: Any, **kwargs: Any) -> Any:
                # (input, hx, params, ...) or, packed, (data, batch_sizes, hx, params, ...)
                packed = len(args) > 3 and isinstance(args[3], (list, tuple))
                hx, params = (args[2], args[3]) if packed else (args[1], args[2])
                hiddens = list(hx) if isinstance(hx, (list, tuple)) else [hx]
                device = check(args[0], hiddens, list(params))
                if kwargs or device is WILD:
                    return real(*args, **kwargs)
                # checked: nothing inside can mix devices, so skip the per-op checks
                return call_opaque(real, args, device, cpu_args=(1,) if packed else ())

            return rnn

        for name in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
            self.patcher.set(vf, name, wrap(name))

        # Packed sequences (rule 9): the data stays on its device, batch sizes and
        # lengths on the CPU, whatever the C++ composite allocated them with.
        real_pad = vf._pad_packed_sequence

        def pad_packed_sequence(data: Tensor, batch_sizes: Tensor, *args: Any) -> Any:
            tag = tag_of(batch_sizes)
            if _virtual(tag):
                session.violation(
                    rules.Violation(
                        rules.lengths_message(batch_sizes, tag),
                        culprit=rules.Operand("batch_sizes", batch_sizes, tag, False),
                        kind="cpu-by-design",
                    ),
                    op=None,
                )
            padded, lengths = real_pad(data, batch_sizes, *args)
            data_tag = tag_of(data)
            set_tag(padded, data_tag if _virtual(data_tag) else None)
            set_tag(lengths, None)
            return padded, lengths

        self.patcher.set(vf, "_pad_packed_sequence", pad_packed_sequence)

        # ctc_loss (a C++ composite) divides by lengths it copies into a fresh CPU
        # tensor that no factory call shows; CUDA accepts lengths on either device.
        real_ctc = torch.ctc_loss

        @functools.wraps(real_ctc)
        def ctc_loss(*args: Any, **kwargs: Any) -> Any:
            with session.lenient_region():
                return real_ctc(*args, **kwargs)

        self.patcher.set(torch, "ctc_loss", ctc_loss)

    # -- deepcopy of storages, pickling --------------------------------------

    def _copying(self) -> None:
        real_deepcopy = torch.UntypedStorage.__deepcopy__

        def storage_deepcopy(self: Any, memo: Any) -> Any:
            copied = real_deepcopy(self, memo)  # type: ignore[no-untyped-call]
            tag = getattr(self, TAG, None)
            if tag is not None:
                setattr(copied, TAG, tag)
            return copied

        self.patcher.set(torch.UntypedStorage, "__deepcopy__", storage_deepcopy)

    # -- threads -------------------------------------------------------------

    def _threads(self) -> None:
        real_bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
        session = self.session

        def bootstrap_inner(thread: threading.Thread) -> None:
            # dispatch modes are per thread: enter ours in threads started while simulating
            with session.thread_mode():
                real_bootstrap(thread)

        self.patcher.set(threading.Thread, "_bootstrap_inner", bootstrap_inner)

        # DataLoader workers forked from a GPU process cannot touch the GPU; everything
        # they make is on the CPU, so they run without the dispatch mode.
        from torch.utils.data._utils import worker

        real_loop = worker._worker_loop

        def worker_loop(*args: Any, **kwargs: Any) -> Any:
            session.enter_forked_worker()
            return real_loop(*args, **kwargs)

        self.patcher.set(worker, "_worker_loop", worker_loop)

    # -- what is not simulated -----------------------------------------------

    def _autocast(self) -> None:
        """Opt-in: run `autocast("cuda")` as CPU autocast, so its dtype bugs show here.

        The numbers then differ from a plain CPU run (float16/bfloat16 math); without
        the opt-in CUDA autocast is a no-op on the CPU tensors.
        """
        if not self.session.cpu_autocast:
            return
        autocast = torch.amp.autocast_mode.autocast
        real_init = autocast.__init__
        backend = self.backend

        def init(
            self: Any,
            device_type: str,
            dtype: Any = None,
            enabled: bool = True,
            cache_enabled: Any = None,
        ) -> None:
            if device_type == backend:
                device_type = "cpu"
                dtype = torch.float16 if dtype is None else dtype  # CUDA's default
            real_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        self.patcher.set(autocast, "__init__", init)

    def _unsupported(self) -> None:

        session = self.session
        import torch.distributed as dist

        if dist.is_available():
            real_init = dist.init_process_group

            def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
                if backend is None or "nccl" in str(backend):
                    session.unsupported(
                        "the NCCL backend (use backend='gloo' to run distributed code here)"
                    )
                return real_init(backend, *args, **kwargs)

            self.patcher.set(dist, "init_process_group", init_process_group)

        self._data_parallel()

    def _data_parallel(self) -> None:
        """nn.DataParallel's collectives (torch.nn.parallel.comm) as plain device copies."""
        from torch.nn.parallel import comm

        patches = self
        backend = self.backend

        def device(index: Any) -> torch.device:
            if isinstance(index, torch.device) and index.type == "cpu":
                return CPU
            return torch.device(backend, patches._index(index))

        def scatter(
            tensor: Tensor,
            devices: Any = None,
            chunk_sizes: Any = None,
            dim: int = 0,
            streams: Any = None,
            *,
            out: Any = None,
        ) -> tuple[Tensor, ...]:
            if out is not None:
                devices = [t.device for t in out]
            targets = [device(d) for d in devices]
            if chunk_sizes is None:
                chunks = tensor.chunk(len(targets), dim)
            else:
                chunks = torch.split(tensor, list(chunk_sizes), dim)
            return tuple(c.contiguous().to(d) for c, d in zip(chunks, targets, strict=False))

        def gather(
            tensors: Any, dim: int = 0, destination: Any = None, *, out: Any = None
        ) -> Tensor:
            if destination == -1 or destination == "cpu":
                target: Any = CPU
            else:
                target = device(destination)
            return torch.cat([t.to(target) for t in tensors], dim)

        def broadcast(tensor: Tensor, devices: Any = None, *, out: Any = None) -> Any:
            return tuple(tensor.to(device(d)) for d in devices)

        def broadcast_coalesced(tensors: Any, devices: Any, buffer_size: int = 0) -> Any:
            return [[t.to(device(d)) for t in tensors] for d in devices]

        def reduce_add(inputs: Any, destination: Any = None) -> Tensor:
            target = device(destination)
            total = inputs[0].to(target, copy=True)
            for t in inputs[1:]:
                total += t.to(target)
            return total  # type: ignore[no-any-return]

        def reduce_add_coalesced(inputs: Any, destination: Any = None, buffer_size: int = 0) -> Any:
            return [reduce_add(list(group), destination) for group in zip(*inputs, strict=True)]

        for name, value in (
            ("scatter", scatter),
            ("gather", gather),
            ("broadcast", broadcast),
            ("broadcast_coalesced", broadcast_coalesced),
            ("reduce_add", reduce_add),
            ("reduce_add_coalesced", reduce_add_coalesced),
        ):
            self.patcher.set(comm, name, value)
        # Scatter copies CPU inputs on side streams made from torch.device(<int>), which
        # needs a real accelerator; the copies need no streams here.
        from torch.nn.parallel import _functions

        def scatter_forward(ctx: Any, target_gpus: Any, chunk_sizes: Any, dim: int, x: Any) -> Any:
            ctx.dim = dim
            ctx.input_device = x.get_device() if x.device.type != "cpu" else -1
            return scatter(x, target_gpus, chunk_sizes, dim, None)

        self.patcher.set(_functions.Scatter, "forward", staticmethod(scatter_forward))
