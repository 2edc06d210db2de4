"""Simulated multi-GPU training: NCCL's device rules on the real gloo backend.

Under `torchrun`, every process of a simulation sees the virtual devices and
its own `cuda:LOCAL_RANK`. `init_process_group("nccl")` runs on gloo (the
tensors really live on the CPU), so the script's distributed code really
runs, and each collective first checks what NCCL would: a CPU tensor has no
NCCL backend (TD113), a tensor on another rank's GPU makes two ranks share
one GPU (TD706). The layer also records, per rank, the multi-GPU mistakes that
do not crash (`ranks.py` writes and merges them): a checkpoint loaded onto
another rank's GPU (TD701), a DDP model not on `cuda:LOCAL_RANK` (TD702), no
`torch.cuda.set_device` (TD703), the first batch of every DataLoader (TD704
is decided across ranks), the paths every rank saves (TD705) and a DDP
wrapper's `module.`-prefixed state dict being saved (TD404).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from torchdoctor.explain.frames import is_library_file
from torchdoctor.runtime.sim.devices import WILD, tag_of

if TYPE_CHECKING:
    from torchdoctor.runtime.sim.session import Simulation

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
)

CPU_UNDER_NCCL = "No backend type associated with device type cpu"


@dataclass
class Finding:
    code: str
    message: str
    file: str
    line: int


@dataclass
class RankRecord:
    """What one rank saw; `ranks.py` writes it and compares the ranks."""

    rank: int
    local_rank: int
    world_size: int
    findings: list[Finding] = field(default_factory=list)
    saves: list[dict[str, Any]] = field(default_factory=list)  # path, file, line
    batches: dict[str, str] = field(default_factory=dict)  # "file:line" -> fingerprint
    foreign_bytes: dict[str, int] = field(default_factory=dict)  # device -> bytes

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def size(nbytes: float) -> str:
    """Bytes as people read them: 512 B, 3.1 KiB, 2.0 MiB."""
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _user_site() -> tuple[str, int]:
    """File and line of the innermost frame outside torch and torchdoctor."""
    frame = sys._getframe(1)
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>", 0
    return frame.f_code.co_filename, frame.f_lineno


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in nested dicts/lists/tuples (a checkpoint, a batch, a collective's list)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 6 and isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, depth + 1)
    elif depth < 6 and isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, depth + 1)


def _virtual_index(t: torch.Tensor) -> int | None:
    """The virtual GPU ordinal of `t`; None when it is on the CPU."""
    tag = tag_of(t)
    if tag is None or tag is WILD:
        return None
    return tag.index if tag.index is not None else 0


def _wrapped_state_dict(obj: Any) -> bool:
    """A state dict whose every key carries DDP's `module.` prefix (or holds one)."""
    if not isinstance(obj, dict) or not obj:
        return False
    if all(isinstance(k, str) and k.startswith("module.") for k in obj):
        return any(isinstance(v, torch.Tensor) for v in obj.values())
    return any(_wrapped_state_dict(v) for v in obj.values() if isinstance(v, dict))


def fingerprint(batch: Any) -> str:
    """A digest of a batch's values, equal on two ranks only if they got the same data."""
    digest = hashlib.sha1()
    for t in _tensors(batch):
        data = t.detach().contiguous()
        digest.update(str((tuple(data.shape), data.dtype)).encode())
        digest.update(torch._C.TensorBase.numpy(data).tobytes())  # the real bytes, any tag
    return digest.hexdigest()


class DistributedLayer:
    """The multi-GPU part of one simulation; installed and removed with it."""

    def __init__(self, session: Simulation) -> None:
        self.session = session
        self.record = RankRecord(
            rank=_env_int("RANK", 0),
            local_rank=_env_int("LOCAL_RANK", 0),
            world_size=_env_int("WORLD_SIZE", 1),
        )
        self.local_world = _env_int("LOCAL_WORLD_SIZE", self.record.world_size)
        self.nccl = False  # the script asked for nccl
        self.cpu_backend = False  # "cpu:gloo,cuda:nccl": CPU tensors have a backend too
        self.bound_device = False  # init_process_group(device_id=...) picked the GPU
        self.ddp_built = False
        self._told_device = False
        self._seen: set[tuple[str, str, int]] = set()
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def distributed(self) -> bool:
        return self.record.world_size > 1

    # -- findings ------------------------------------------------------------

    def find(self, code: str, message: str, site: tuple[str, int] | None = None) -> None:
        file, line = site or _user_site()
        if (code, file, line) in self._seen:
            return
        self._seen.add((code, file, line))
        self.record.findings.append(Finding(code, message, file, line))

    def _foreign(self, tensors: list[torch.Tensor]) -> dict[int, int]:
        """Bytes per other rank's GPU among `tensors` (each storage counted once)."""
        seen: set[int] = set()
        found: dict[int, int] = {}
        for t in tensors:
            index = _virtual_index(t)
            if index is None or index == self.record.local_rank:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            found[index] = found.get(index, 0) + storage.nbytes()
        for index, nbytes in found.items():
            key = f"{self.session.backend}:{index}"
            self.record.foreign_bytes[key] = self.record.foreign_bytes.get(key, 0) + nbytes
        return found

    # -- install -------------------------------------------------------------

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name)))
        setattr(owner, name, value)

    def install(self) -> None:
        import torch.distributed as dist

        if dist.is_available():
            self._process_group(dist)
            self._ddp()
        self._serialization()
        self._loader()

    def uninstall(self) -> None:
        while self._saved:
            owner, name, old = self._saved.pop()
            setattr(owner, name, old)

    def _process_group(self, dist: Any) -> None:
        from torch.distributed import distributed_c10d as c10d

        real_init: Callable[..., Any] = c10d.init_process_group
        layer = self

        def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
            name = str(backend or "nccl").lower()  # no backend: nccl for cuda on a GPU box
            if "nccl" in name:
                layer.nccl = True
                layer.cpu_backend = "cpu:" in name
                backend = "gloo"  # the real backend underneath: the tensors are on the CPU
                layer.bound_device = kwargs.pop("device_id", None) is not None
            return real_init(backend, *args, **kwargs)

        self._set(dist, "init_process_group", init_process_group)
        for name in COLLECTIVES:
            real = getattr(dist, name, None)
            if real is not None:
                self._set(dist, name, self._checked(name, real))

    def _checked(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        layer = self

        def collective(*args: Any, **kwargs: Any) -> Any:
            if layer.nccl:
                tensors = [t for a in (*args, *kwargs.values()) for t in _tensors(a)]
                layer.check_collective(name, tensors)
            return real(*args, **kwargs)

        collective.__name__ = name
        collective.__doc__ = real.__doc__
        return collective

    def check_collective(self, what: str, tensors: list[torch.Tensor]) -> None:
        """Raise what NCCL would for tensors on the CPU or on another rank's GPU."""
        site = _user_site()
        self._check_set_device(site)
        for t in tensors:
            index = _virtual_index(t)
            if index is None:
                if self.cpu_backend:
                    continue
                self.find(
                    "TD113",
                    f"rank {self.record.rank}: {what} on a CPU tensor under the nccl backend",
                    site,
                )
                self._raise(RuntimeError(CPU_UNDER_NCCL), "TD113", site)
            if index != self.record.local_rank and index < self.local_world:
                other = self.record.rank - self.record.local_rank + index
                self.find(
                    "TD706",
                    f"rank {self.record.rank}: {what} on {self.session.backend}:{index}, "
                    f"the GPU of rank {other} (LOCAL_RANK is {self.record.local_rank})",
                    site,
                )
                self._raise(self._duplicate_gpu(other, index), "TD706", site)

    def _duplicate_gpu(self, other: int, index: int) -> BaseException:
        first, second = sorted((self.record.rank, other))
        message = (
            "NCCL error in: ProcessGroupNCCL.cpp, invalid usage (run with NCCL_DEBUG=WARN for "
            "details)\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
            f"Last error:\nDuplicate GPU detected : rank {first} and rank {second} both on "
            f"CUDA device {index + 1:x}000"
        )
        error_type = getattr(torch.distributed, "DistBackendError", RuntimeError)
        return error_type(message)  # type: ignore[no-any-return]

    def _raise(self, error: BaseException, code: str, site: tuple[str, int]) -> NoReturn:
        note = f"torchdoctor [{code}] rank {self.record.rank} at {site[0]}:{site[1]}"
        add_note = getattr(error, "add_note", None)
        if add_note is not None:
            add_note(note)
        raise error.with_traceback(None)

    def _check_set_device(self, site: tuple[str, int]) -> None:
        if not self.nccl or self.bound_device or not self.distributed or self._told_device:
            return
        if self.session.devices.current != self.record.local_rank:
            self._told_device = True  # once per rank: the first place it matters
            self.find(
                "TD703",
                f"rank {self.record.rank}: the current GPU is {self.session.backend}:"
                f"{self.session.devices.current}, not LOCAL_RANK {self.record.local_rank} "
                "(no torch.cuda.set_device): every rank's CUDA context, `.cuda()` and "
                f"'{self.session.backend}' tensors land on "
                f"{self.session.backend}:{self.session.devices.current}",
                site,
            )

    # -- DistributedDataParallel ---------------------------------------------

    def _ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        real_init = DDP.__init__
        layer = self

        def init(self_: Any, module: Any, device_ids: Any = None, *args: Any, **kw: Any) -> None:
            layer.ddp_built = True
            params = list(module.parameters())
            layer.check_model(params)
            output_device = kw.pop("output_device", None)
            if args:
                output_device, args = args[0], args[1:]
            real_init(self_, module, None, None, *args, **kw)  # type: ignore[no-untyped-call]
            if device_ids:  # DDP moves the inputs onto device_ids[0]: the same, virtually
                self_._td_input_device = torch.device(layer.session.backend, device_ids[0])
            del output_device

        self._set(DDP, "__init__", init)
        real_forward = DDP.forward

        def forward(self_: Any, *inputs: Any, **kwargs: Any) -> Any:
            device = self_.__dict__.get("_td_input_device")
            if device is not None:
                from torchdoctor.runtime.device import to_device

                inputs, kwargs = to_device((inputs, kwargs), device)
            return real_forward(self_, *inputs, **kwargs)  # type: ignore[no-untyped-call]

        self._set(DDP, "forward", forward)

    def check_model(self, params: list[torch.Tensor]) -> None:
        """DDP's first broadcast of the parameters, as NCCL would see it."""
        site = _user_site()
        if not self.nccl or not self.distributed:
            return
        devices = {_virtual_index(p) for p in params}
        here = f"{self.session.backend}:{self.record.local_rank}"
        if None in devices:
            self.find(
                "TD702",
                f"rank {self.record.rank}: DDP wraps a model still on the CPU, not on "
                f"{here} (cuda:LOCAL_RANK)",
                site,
            )
        elif devices != {self.record.local_rank}:
            shown = ", ".join(f"{self.session.backend}:{d}" for d in sorted(devices))  # type: ignore[type-var]
            nbytes = sum(self._foreign(params).values())
            self.find(
                "TD702",
                f"rank {self.record.rank}: DDP wraps a model on {shown}, not on {here} "
                f"(cuda:LOCAL_RANK); {size(nbytes)} of parameters on another rank's GPU",
                site,
            )
        self.check_collective("DistributedDataParallel's parameter broadcast", params)

    # -- torch.load / torch.save ----------------------------------------------

    def _serialization(self) -> None:
        layer = self
        real_load: Callable[..., Any] = torch.load
        real_save: Callable[..., Any] = torch.save

        def load(*args: Any, **kwargs: Any) -> Any:
            result = real_load(*args, **kwargs)
            if layer.distributed:
                layer.check_loaded(result)
            return result

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            layer.check_saved(obj, f)
            return real_save(obj, f, *args, **kwargs)

        for function, name in ((load, "load"), (save, "save")):
            function.__doc__ = getattr(torch, name).__doc__
            function.__wrapped__ = getattr(torch, name)  # type: ignore[attr-defined]
            self._set(torch, name, function)

    def check_loaded(self, result: Any) -> None:
        foreign = self._foreign(list(_tensors(result)))
        if not foreign:
            return
        backend = self.session.backend
        where = ", ".join(f"{size(n)} on {backend}:{d}" for d, n in sorted(foreign.items()))
        self.find(
            "TD701",
            f"rank {self.record.rank}: torch.load put {where}, not on "
            f"{self.session.backend}:{self.record.local_rank} (no map_location to this "
            "rank's GPU)",
        )

    def check_saved(self, obj: Any, f: Any) -> None:
        file, line = _user_site()
        if isinstance(f, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(f))
            self.record.saves.append({"path": path, "file": file, "line": line})
        if self.ddp_built and _wrapped_state_dict(obj):
            self.find(
                "TD404",
                f"rank {self.record.rank}: a state dict with DDP's `module.` key prefix is "
                "saved (save model.module.state_dict())",
                (file, line),
            )

    # -- DataLoader ----------------------------------------------------------

    def _loader(self) -> None:
        from torch.utils.data import DataLoader

        real_iter = DataLoader.__iter__
        layer = self

        def iterate(self_: Any) -> Any:
            iterator = real_iter(self_)
            if not layer.distributed:
                return iterator
            file, line = _user_site()
            key = f"{file}:{line}"
            if key in layer.record.batches:
                return iterator
            return _FirstBatch(iterator, layer, key)

        self._set(DataLoader, "__iter__", iterate)


class _FirstBatch:
    """Passes a DataLoader iterator through, fingerprinting its first batch."""

    def __init__(self, iterator: Any, layer: DistributedLayer, key: str) -> None:
        self._iterator = iterator
        self._layer = layer
        self._key = key

    def __iter__(self) -> _FirstBatch:
        return self

    def __next__(self) -> Any:
        batch = next(self._iterator)
        if self._key not in self._layer.record.batches:
            self._layer.record.batches[self._key] = fingerprint(batch)
        return batch

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)
