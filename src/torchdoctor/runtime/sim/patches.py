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
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._device as _device_context

from torchdoctor.runtime.sim import (
    device_modules,
    legacy,
    tensor_patches,
    training_patches,
    value_checks,
)
from torchdoctor.runtime.sim.devices import (
    CPU,
    TAG,
    InvalidOrdinal,
    device_of,
    is_virtual,
    real_device,
    tag_of,
)

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


def _not_installed(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("the simulation's tensor patches are not installed")


class Patches:
    """All Python-level patches of one simulation."""

    def __init__(self, session: Simulation) -> None:
        self.session = session
        self.devices = session.devices
        self.backend = session.devices.backend
        self.patcher = Patcher()
        self.originals: dict[str, Any] = {}
        self.stream_class: Any = None  # the stand-in Stream (device_modules.py)
        # moves a tensor to a (virtual) device: set by tensor_patches, used by the factories
        self.to_device: Callable[..., Any] = _not_installed

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
        tensor_patches.install(self)
        device_modules.install(self)
        self._device_class()
        self._generator()
        training_patches.install(self)
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
            return is_virtual(tag) and tag.type == backend

        def is_cpu(self: Tensor) -> bool:
            return not is_virtual(tag_of(self)) and real_device(self).type == "cpu"

        def get_device(self: Tensor) -> int:
            tag = tag_of(self)
            if is_virtual(tag):
                return int(tag.index)
            return int(real_get_device(self))

        p.set(Tensor, "device", property(device_of))
        p.set(Tensor, "is_cuda", property(is_backend if backend == "cuda" else lambda t: False))
        p.set(Tensor, "is_mps", property(is_backend if backend == "mps" else lambda t: False))
        p.set(Tensor, "is_cpu", property(is_cpu))
        p.set(Tensor, "get_device", get_device)

    # -- the virtual device an argument names (torch.cuda: device_modules.py) -

    def device_index(self, device: Any) -> int:
        """A user's device argument (None, an index, `"cuda:1"`) -> a virtual device's
        index; the current one where it names none, an invalid ordinal reported."""
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
                    return torch.device(patches.backend, patches.device_index(args[0]))
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
            return torch.device(backend, patches.device_index(index))

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
