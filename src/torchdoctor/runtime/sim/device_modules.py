"""`torch.cuda`, `torch.mps` and `torch.accelerator` while a simulation runs: the
virtual devices are available, counted and current; streams, events, device contexts
and properties are stand-ins; what cannot be simulated says so."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchdoctor.runtime.sim.patches import Patches

Tensor = torch.Tensor


# what the simulated GPUs report as their memory (an 80 GB card)
_TOTAL_MEMORY = 80 * 1024**3


def install(patches: Patches) -> None:
    _cuda_module(patches)
    _accelerator(patches)


def _current_device_class(patches: Patches) -> type[Any]:
    """`torch.cuda.device(i)` / `torch.accelerator.device_index(i)`: make virtual device
    i the current one inside the block (None or a negative index: leave it)."""

    class _CurrentDevice:
        def __init__(self, device: Any = None) -> None:
            self.idx = -1 if device is None else patches.device_index(device)
            self.prev = -1

        def __enter__(self) -> None:
            self.prev = patches.devices.current
            if self.idx >= 0:
                patches.devices.current = self.idx

        def __exit__(self, *exc: object) -> None:
            patches.devices.current = self.prev

    return _CurrentDevice


def _device_module_functions(patches: Patches) -> dict[str, Any]:
    """Functions shared by torch.cuda, torch.mps and torch.accelerator."""
    devices = patches.devices

    def set_device(device: Any) -> None:
        devices.current = patches.device_index(device)

    def synchronize(device: Any = None) -> None:
        patches.device_index(device)

    def zero(device: Any = None) -> int:
        return 0

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    return {
        "is_available": lambda: True,
        "device_count": lambda: devices.count,
        "current_device": lambda: devices.current,
        "set_device": set_device,
        "synchronize": synchronize,
        "empty_cache": noop,
        "memory_allocated": zero,
        "max_memory_allocated": zero,
        "memory_reserved": zero,
        "max_memory_reserved": zero,
        "memory_cached": zero,
        "max_memory_cached": zero,
        "reset_peak_memory_stats": noop,
        "reset_max_memory_allocated": noop,
        "reset_max_memory_cached": noop,
        "reset_accumulated_memory_stats": noop,
        "memory_stats": lambda device=None: {},
        "noop": noop,
    }


def _cuda_module(patches: Patches) -> None:
    p = patches.patcher
    shared = _device_module_functions(patches)
    noop = shared.pop("noop")
    session = patches.session

    class _Properties:
        def __init__(self, index: int) -> None:
            self.name = "torchdoctor virtual GPU"
            self.major, self.minor = 8, 0
            self.total_memory = _TOTAL_MEMORY
            self.multi_processor_count = 108
            self.is_integrated = False
            self.is_multi_gpu_board = False
            self.warp_size = 32
            self.index = index

        def __repr__(self) -> str:
            return (
                f"_CudaDeviceProperties(name='{self.name}', major=8, minor=0, "
                f"total_memory={_TOTAL_MEMORY // 1024**2}MB, multi_processor_count=108)"
            )

    class _Stream:
        def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
            self.device = torch.device(patches.backend, patches.device_index(device))
            self.priority = priority
            self.cuda_stream = 0  # the raw handle libraries read: the default stream

        def synchronize(self) -> None:
            return None

        def query(self) -> bool:
            return True

        def is_capturing(self) -> bool:
            return False

        def wait_stream(self, stream: Any) -> None:
            return None

        def wait_event(self, event: Any) -> None:
            return None

        def record_event(self, event: Any = None) -> Any:
            return event if event is not None else _Event()

        def __enter__(self) -> _Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def __eq__(self, other: object) -> bool:
            return isinstance(other, _Stream) and other.device == self.device

        def __hash__(self) -> int:
            return hash(self.device)

    class _Event:
        def __init__(self, enable_timing: bool = False, **kwargs: Any) -> None:
            import time

            self._time = time.perf_counter
            self._at = 0.0

        def record(self, stream: Any = None) -> None:
            self._at = self._time()

        def synchronize(self) -> None:
            return None

        def wait(self, stream: Any = None) -> None:
            return None

        def query(self) -> bool:
            return True

        def elapsed_time(self, end: _Event) -> float:
            return (end._at - self._at) * 1000.0

    @contextlib.contextmanager
    def stream_context(stream: Any = None) -> Iterator[Any]:
        yield stream

    class _StreamContext:
        """torch.cuda.StreamContext(stream): nothing to switch on the CPU."""

        def __init__(self, stream: Any = None) -> None:
            self.stream = stream

        def __enter__(self) -> Any:
            return self.stream

        def __exit__(self, *exc: object) -> None:
            return None

    _DeviceContext = _current_device_class(patches)

    def device_of(obj: Any) -> Any:
        if isinstance(obj, Tensor) and obj.is_cuda:
            return _DeviceContext(obj.get_device())
        return _DeviceContext(None)

    def props(device: Any = None) -> _Properties:
        return _Properties(patches.device_index(device))

    def unsupported(what: str) -> type:
        """A class (isinstance checks keep working) that refuses to be made."""

        class Unsupported:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                session.unsupported(what)

        Unsupported.__name__ = Unsupported.__qualname__ = what.split("(")[-1].rstrip(")")
        return Unsupported

    fake = {
        **shared,
        "is_initialized": lambda: True,
        "init": noop,
        "_lazy_init": noop,
        "ipc_collect": noop,
        "get_device_name": lambda device=None: props(device).name,
        "get_device_properties": props,
        "get_device_capability": lambda device=None: (8, 0),
        "is_bf16_supported": lambda including_emulation=True: True,
        "is_tf32_supported": lambda: True,
        "get_arch_list": lambda: ["sm_80"],
        "get_gencode_flags": lambda: "",
        "can_device_access_peer": lambda device, peer: True,
        "mem_get_info": lambda device=None: (_TOTAL_MEMORY, _TOTAL_MEMORY),
        "memory_summary": lambda device=None, abbreviated=False: (
            "torchdoctor: GPU memory is not simulated on this machine\n"
        ),
        "memory_snapshot": lambda *a, **k: [],
        "list_gpu_processes": lambda device=None: "no processes (simulated GPU)",
        "utilization": lambda device=None: 0,
        "set_per_process_memory_fraction": noop,
        "get_per_process_memory_fraction": lambda device=None: 1.0,
        "manual_seed": noop,
        "manual_seed_all": noop,
        "seed": noop,
        "seed_all": noop,
        "initial_seed": torch.initial_seed,
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "get_rng_state_all": lambda: [torch.get_rng_state() for _ in range(patches.devices.count)],
        "set_rng_state": noop,
        "set_rng_state_all": noop,
        "device": _DeviceContext,
        "device_of": device_of,
        "Stream": _Stream,
        "Event": _Event,
        "current_stream": lambda device=None: _Stream(device),
        "default_stream": lambda device=None: _Stream(device),
        "set_stream": noop,
        "stream": stream_context,
        "StreamContext": _StreamContext,
        "set_sync_debug_mode": noop,
        "is_current_stream_capturing": lambda: False,
        "get_sync_debug_mode": lambda: 0,
        "graph": unsupported("CUDA graphs (torch.cuda.graph)"),
        "CUDAGraph": unsupported("CUDA graphs (torch.cuda.CUDAGraph)"),
        "make_graphed_callables": unsupported("CUDA graphs (make_graphed_callables)"),
    }
    patches.stream_class = _Stream  # torch.accelerator's streams are the same stand-ins
    if patches.backend == "cuda":
        for name, value in fake.items():
            p.set(torch.cuda, name, value)
        for name in ("range_push", "range_pop", "mark"):
            p.set(torch.cuda.nvtx, name, noop)
        p.set(torch.cuda.nvtx, "range", stream_context)
        p.set(torch.cuda.memory, "_set_allocator_settings", noop)
        p.set(torch.backends.cuda, "is_built", lambda: True)
        # cuDNN is not simulated: RNNs must not try to flatten weights for it
        p.set(torch.backends.cudnn, "is_acceptable", lambda tensor: False)
    else:  # mps
        mps_fake = {
            **shared,
            "manual_seed": noop,
            "seed": noop,
            "get_rng_state": lambda device="mps": torch.get_rng_state(),
            "set_rng_state": noop,
            "current_allocated_memory": lambda: 0,
            "driver_allocated_memory": lambda: 0,
            "recommended_max_memory": lambda: _TOTAL_MEMORY,
            "set_per_process_memory_fraction": noop,
            "Event": _Event,
        }
        for name, value in mps_fake.items():
            p.set(torch.mps, name, value)
        p.set(torch.backends.mps, "is_available", lambda: True)
        p.set(torch.backends.mps, "is_built", lambda: True)


def _accelerator(patches: Patches) -> None:
    p = patches.patcher
    shared = _device_module_functions(patches)
    noop = shared.pop("noop")
    backend = patches.backend

    fake = {
        "is_available": lambda: True,
        "current_accelerator": lambda check_available=False: torch.device(backend),
        "device_count": shared["device_count"],
        "current_device_index": shared["current_device"],
        "current_device_idx": shared["current_device"],
        "set_device_index": shared["set_device"],
        "set_device_idx": shared["set_device"],
        "synchronize": shared["synchronize"],
        "empty_cache": noop,
        "empty_host_cache": noop,
        "current_stream": lambda device=None: patches.stream_class(device),
        "set_stream": noop,
        "device_index": _current_device_class(patches),
        "get_memory_info": lambda device=None: (_TOTAL_MEMORY, _TOTAL_MEMORY),
        "get_device_capability": lambda device=None: {"major": 8, "minor": 0},
    }
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
                 "reset_accumulated_memory_stats"):  # fmt: skip
        fake[name] = shared[name]
    for name, value in fake.items():
        if hasattr(torch.accelerator, name):
            p.set(torch.accelerator, name, value)
    p.set(torch._C, "_get_accelerator", lambda check=False: torch.device(backend))
