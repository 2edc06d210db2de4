"""Device selection and moving: `pick_device`, `to_device`, `device_of`, `device_safe`.

These replace the boilerplate every training script grows: the
`DEVICE = torch.device("cuda" if ... else "cpu")` line, the recursive `.to`
helper, and the "which device is this model on?" guesswork.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast, overload

import torch
from torch import nn

from torchdoctor.errors import DeviceMismatchError, DeviceUnavailableError, InvalidArgumentError
from torchdoctor.runtime.moving import LEAF_TYPES, Handlers, build_handlers

__all__ = ["device_of", "device_safe", "pick_device", "to_device"]

DeviceLike = str | torch.device
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_Tensor = torch.Tensor
_DEVICE_HELP = "run `torchdoctor env` to see which devices this machine has"


# --------------------------------------------------------------------------- pick_device


def _accelerator_module(kind: str) -> Any:
    """torch.cuda, torch.xpu, ... (None when this torch has no such backend)."""
    if kind == "mps":
        return None
    return getattr(torch, kind, None)


def _availability_problem(device: torch.device) -> str | None:
    """Why `device` cannot be used here, or None when it can."""
    kind = device.type
    if kind in ("cpu", "meta"):
        return None
    if kind == "mps":
        mps = torch.backends.mps
        if not mps.is_available():
            if not mps.is_built():
                return "this torch build has no MPS support"
            return "MPS is not available (it needs Apple silicon and macOS 12.3 or later)"
        if device.index not in (None, 0):
            return "there is only one MPS device, mps:0"
        return None
    module = _accelerator_module(kind)
    is_available = getattr(module, "is_available", None)
    if not callable(is_available) or not is_available():
        if kind == "cuda" and torch.version.cuda is None and torch.version.hip is None:
            return "this torch build has no CUDA support (a CPU-only wheel is installed)"
        if kind == "cuda":
            return "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
        return f"no {kind} device is available"
    count = int(module.device_count())
    if device.index is not None and device.index >= count:
        return f"only {count} {kind} device(s) are visible ({kind}:0 to {kind}:{count - 1})"
    return None


def _is_available(kind: str) -> bool:
    return _availability_problem(torch.device(kind)) is None


def _parse_device(value: object, what: str) -> torch.device:
    """A torch.device from a str or torch.device, with a clear error for anything else."""
    if isinstance(value, torch.device):
        return value
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"{what} must be a device name such as 'cuda' or 'cpu', or a torch.device, "
            f"not {type(value).__name__}"
        )
    try:
        return torch.device(value.strip())
    except RuntimeError:
        hint = " (did you mean 'cuda'?)" if value.strip().lower() in ("gpu", "nvidia") else ""
        raise DeviceUnavailableError(
            f"{what}: unknown device {value!r}{hint}",
            fix="use cpu, cuda, cuda:N, mps, xpu or another torch device type",
        ) from None


def _local_rank() -> int | None:
    """LOCAL_RANK as set by torchrun / torch.distributed launchers, or None."""
    text = os.environ.get("LOCAL_RANK", "").strip()
    if not text:
        return None
    try:
        rank = int(text)
    except ValueError:
        rank = -1
    if rank < 0:
        raise InvalidArgumentError(
            f"LOCAL_RANK={text!r} is not a non-negative integer",
            fix="let torchrun set LOCAL_RANK, or unset it",
        )
    return rank


def _current_index(kind: str) -> int:
    try:
        return int(_accelerator_module(kind).current_device())
    except Exception:  # a stubbed or partial backend: the first device is right
        return 0


def _set_device(device: torch.device) -> None:
    """Make `device` this process's current device (what torchrun scripts must do)."""
    setter = getattr(_accelerator_module(device.type), "set_device", None)
    if setter is None:
        return
    # A patched backend on a CPU-only build has no device to make current.
    with contextlib.suppress(AttributeError, AssertionError):
        setter(device)


def _rank_device(kind: str, local_rank: int) -> torch.device:
    count = int(_accelerator_module(kind).device_count())
    if local_rank < count:
        index = local_rank
    elif count == 1:
        index = 0  # the launcher gave each process one visible device
    else:
        raise DeviceUnavailableError(
            f"LOCAL_RANK={local_rank} but only {count} {kind} devices are visible",
            fix=f"start at most {count} processes per node (torchrun --nproc_per_node={count}), "
            "or check CUDA_VISIBLE_DEVICES",
        )
    return torch.device(kind, index)


def _explicit_device(value: object, what: str) -> torch.device:
    device = _parse_device(value, what)
    problem = _availability_problem(device)
    if problem is not None:
        shown = value if isinstance(value, str) else str(device)
        raise DeviceUnavailableError(f"{what} asks for {shown!r}, but {problem}", fix=_DEVICE_HELP)
    if device.index is None and device.type not in ("cpu", "meta"):
        local_rank = _local_rank() if device.type != "mps" else None
        if local_rank is not None:
            device = _rank_device(device.type, local_rank)
            _set_device(device)
        else:
            device = torch.device(device.type, _current_index(device.type))
    return device


def pick_device(prefer: DeviceLike | None = None) -> torch.device:
    """The device this process should train on, as a `torch.device` with an index.

    Order: `prefer` > the `TORCHDOCTOR_DEVICE` environment variable > under
    torchrun (`LOCAL_RANK` set) `cuda:LOCAL_RANK` or `xpu:LOCAL_RANK`, made the
    current device > cuda > mps > xpu > cpu.

    An explicit choice (`prefer` or the variable) that this machine cannot
    honour raises `DeviceUnavailableError`; it never falls back silently. A
    bare "cuda" under torchrun means this process's GPU, `cuda:LOCAL_RANK`.
    Under torchrun with no CUDA/XPU device the answer is cpu (the gloo backend
    works there; no collective backend handles MPS tensors).
    """
    if prefer is not None:
        return _explicit_device(prefer, "pick_device(prefer=...)")
    from_env = os.environ.get("TORCHDOCTOR_DEVICE", "").strip()
    if from_env:
        return _explicit_device(from_env, "TORCHDOCTOR_DEVICE")
    local_rank = _local_rank()
    if local_rank is not None:
        for kind in ("cuda", "xpu"):
            if _is_available(kind):
                device = _rank_device(kind, local_rank)
                _set_device(device)
                return device
        return torch.device("cpu")
    if _is_available("cuda"):
        return torch.device("cuda", _current_index("cuda"))
    if _is_available("mps"):
        return torch.device("mps", 0)
    if _is_available("xpu"):
        return torch.device("xpu", _current_index("xpu"))
    return torch.device("cpu")


# --------------------------------------------------------------------------- to_device

_HANDLERS_BY_TARGET: dict[tuple[object, object, object], Handlers] = {}
_MAX_TARGETS = 64

# The handlers of the last call with default dtype/non_blocking, checked by identity of
# `device`: a training loop calling to_device(batch, device) skips even the dict lookup.
_LAST_HANDLERS: tuple[object, Handlers] = (object(), Handlers())


def _handlers_for(
    device: DeviceLike, dtype: torch.dtype | None, non_blocking: bool | None
) -> Handlers:
    global _LAST_HANDLERS
    key = (device, dtype, non_blocking)
    mover = _HANDLERS_BY_TARGET.get(key)
    if mover is None:
        target = _parse_device(device, "to_device(device=...)")
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise InvalidArgumentError(
                f"to_device(dtype=...) must be a floating torch.dtype, not {dtype!r}",
                fix="it casts floating tensors only, e.g. dtype=torch.bfloat16",
            )
        if non_blocking is not None and not isinstance(non_blocking, bool):
            raise InvalidArgumentError("to_device(non_blocking=...) must be True, False or None")
        mover = build_handlers(target, dtype, non_blocking)
        if len(_HANDLERS_BY_TARGET) >= _MAX_TARGETS:
            _HANDLERS_BY_TARGET.clear()
        _HANDLERS_BY_TARGET[key] = mover
    if dtype is None and non_blocking is None:
        _LAST_HANDLERS = (device, mover)  # one tuple: read and replaced atomically
    return mover


def _prefer(
    handlers: Handlers, device: DeviceLike, dtype: torch.dtype | None, non_blocking: bool | None
) -> None:
    """Use the other variant of a target's handlers from the next call on."""
    global _LAST_HANDLERS
    key = (device, dtype, non_blocking)
    if key in _HANDLERS_BY_TARGET:
        _HANDLERS_BY_TARGET[key] = handlers
    if dtype is None and non_blocking is None:
        _LAST_HANDLERS = (device, handlers)


def to_device(
    obj: T,
    device: DeviceLike | None = None,
    *,
    non_blocking: bool | None = None,
    dtype: torch.dtype | None = None,
) -> T:
    """Move every tensor inside `obj` to `device` and return the same shape of object.

    Handles dict, OrderedDict, defaultdict (factory kept), other Mappings and
    UserDict, list, tuple, namedtuple, tuple subclasses, deque, set, dataclasses
    (frozen ones and init=False fields too), objects with their own `.to()`
    (called), and modules (moved in place and returned). Other leaves pass
    through untouched.

    Like `Tensor.to`, it copies nothing that need not be: a tensor already on
    `device` (with the right dtype) comes back as itself, and so does every
    container none of whose items changed, so with nothing to move the result
    *is* `obj`. A container holding anything that moved is a new object of the
    same type; `obj` is never modified. The result may therefore share
    unchanged containers with `obj`: copy it before mutating it in place if the
    input must stay as it was.

    `device` defaults to `pick_device()`. `dtype` casts floating tensors only.
    `non_blocking=None` copies asynchronously only host->CUDA from pinned memory;
    copies to or from MPS are never asynchronous.
    """
    if device is None:
        device = pick_device()
    last_device, handlers = _LAST_HANDLERS
    if device is not last_device or dtype is not None or non_blocking is not None:
        handlers = _handlers_for(device, dtype, non_blocking)
    try:
        moved: T = handlers[type(obj)](obj)
    except RecursionError:
        raise InvalidArgumentError(
            "to_device: the object is nested too deeply or refers to itself (a cycle)",
            fix="pass the tensors, or a container without back-references",
        ) from None
    except (RuntimeError, AssertionError) as exc:
        target = _parse_device(device, "to_device(device=...)")
        problem = _availability_problem(target)
        if problem is not None:
            raise DeviceUnavailableError(
                f"to_device cannot move to {target}: {problem}", fix=_DEVICE_HELP
            ) from exc
        raise
    if (moved is obj) is handlers.flip_if:
        # Nothing moved this time and the handlers call .to on every tensor, or the
        # other way round: the other variant fits the next call better (same results).
        _prefer(handlers.other, device, dtype, non_blocking)
    return moved


# --------------------------------------------------------------------------- device_of


def _key_path(key: object) -> str:
    return f'["{key}"]' if isinstance(key, str) else f"[{key!r}]"


def _module_tensors(module: nn.Module, path: str) -> Iterator[tuple[str, torch.Tensor, str]]:
    """Parameters, buffers and plain tensor attributes (which `.to()` never moves)."""
    prefix = f"{path}." if path else ""
    for name, param in module.named_parameters():
        yield prefix + name, param, ""
    for name, buffer in module.named_buffers():
        yield prefix + name, buffer, ""
    for sub_name, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if isinstance(value, _Tensor):
                where = f"{sub_name}.{attr}" if sub_name else attr
                yield prefix + where, value, "plain tensor attribute"


def _named_tensors(obj: Any, path: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor, str]]:
    """(path, tensor, note) for every tensor inside obj, walked like to_device walks it."""
    if depth > 200:
        raise InvalidArgumentError("the object is nested too deeply or refers to itself")
    if isinstance(obj, _Tensor):
        yield path, obj, ""
    elif isinstance(obj, nn.Module):
        yield from _module_tensors(obj, path)
    elif isinstance(obj, LEAF_TYPES):
        return
    elif isinstance(obj, nn.utils.rnn.PackedSequence):
        # batch_sizes stays on the CPU by design.
        yield f"{path}.data", obj.data, ""
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _named_tensors(value, path + _key_path(key), depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            if hasattr(obj, field.name):
                value = getattr(obj, field.name)
                yield from _named_tensors(value, f"{path}.{field.name}", depth + 1)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name, value in zip(obj._fields, obj, strict=False):
            yield from _named_tensors(value, f"{path}.{name}", depth + 1)
    elif isinstance(obj, (list, tuple, collections.deque)):
        for index, value in enumerate(obj):
            yield from _named_tensors(value, f"{path}[{index}]", depth + 1)


def _mismatch_error(
    found: list[tuple[str, torch.Tensor, str]], roots: list[str], subject: str
) -> DeviceMismatchError:
    """One error naming each tensor off the majority device, and summarising the rest."""
    counts = collections.Counter(str(t.device) for _, t, _ in found)
    majority = counts.most_common(1)[0][0]
    summary = ", ".join(f"{dev} ({n} tensor{'s' * (n != 1)})" for dev, n in counts.most_common())
    lines = [f"{subject} tensors on {len(counts)} devices: {summary} (TD120)"]
    shown_per_device: collections.Counter[str] = collections.Counter()
    plain_attrs = []
    for path, tensor, note in found:
        dev = str(tensor.device)
        if dev == majority:
            continue
        shown_per_device[dev] += 1
        if shown_per_device[dev] <= 8:
            lines.append(f"  {path}: {dev}" + (f"  ({note}, TD104)" if note else ""))
        if note:
            plain_attrs.append(path)
    for dev, n in shown_per_device.items():
        if n > 8:
            lines.append(f"  ... and {n - 8} more on {dev}")
    for root in roots:
        on_majority = [p for p, t, _ in found if str(t.device) == majority and _under(p, root)]
        if len(on_majority) == 1:
            lines.append(f"  {on_majority[0]}: {majority}")
        elif on_majority:
            lines.append(f"  {root}.*: {majority} ({len(on_majority)} tensors)")
    if plain_attrs:
        fix = (
            "register plain tensor attributes with self.register_buffer(name, tensor) so "
            "module.to() moves them"
        )
    else:
        fix = "move everything to one device: module.to(device), td.to_device(batch, device)"
    return DeviceMismatchError("\n".join(lines), fix=fix)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith((root + ".", root + "["))


def device_of(obj: Any) -> torch.device:
    """The one device of a module, tensor or nested batch.

    Raises `DeviceMismatchError` naming each path and device when the tensors are
    spread over several devices (including a module's plain tensor attributes,
    which `module.to()` does not move), and `InvalidArgumentError` when `obj`
    holds no tensor at all.
    """
    if isinstance(obj, _Tensor):
        return obj.device
    root = "model" if isinstance(obj, nn.Module) else "batch"
    found = list(_named_tensors(obj, root))
    if not found:
        what = "parameters or buffers" if isinstance(obj, nn.Module) else "tensors"
        raise InvalidArgumentError(
            f"device_of: the {type(obj).__name__} has no {what}, so it has no device"
        )
    devices = {t.device for _, t, _ in found}
    if len(devices) == 1:
        return devices.pop()
    raise _mismatch_error(found, [root], f"{root} has")


# --------------------------------------------------------------------------- device_safe


def _is_cpu_scalar(tensor: torch.Tensor) -> bool:
    # PyTorch itself accepts a 0-dim CPU tensor beside accelerator tensors.
    return tensor.dim() == 0 and tensor.device.type == "cpu"


@overload
def device_safe(fn: F) -> F: ...


@overload
def device_safe(fn: None = None) -> Callable[[F], F]: ...


def device_safe(fn: F | None = None) -> F | Callable[[F], F]:
    """Decorator: before each call, all tensor arguments (nested) must share a device.

    For methods of modules, `self`'s parameters, buffers and plain tensor
    attributes count too. 0-dim CPU tensors are allowed beside accelerator
    tensors, as PyTorch allows them. On a mismatch it raises
    `DeviceMismatchError` naming each argument path (`batch["mask"]: cpu`).
    The check walks every tensor on every call, so its cost grows with the
    number of parameters: for zero-cost checking of a whole model use the guard.
    """
    if fn is None:
        return device_safe
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        devices = set()
        for index, value in enumerate(args):
            for _, tensor, _ in _named_tensors(value, str(index)):
                if not _is_cpu_scalar(tensor):
                    devices.add(tensor.device)
        for name, value in kwargs.items():
            for _, tensor, _ in _named_tensors(value, name):
                if not _is_cpu_scalar(tensor):
                    devices.add(tensor.device)
        if len(devices) > 1:
            raise _named_mismatch(signature, args, kwargs, fn)
        return fn(*args, **kwargs)

    return cast("F", wrapper)


def _named_mismatch(
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fn: Callable[..., Any],
) -> DeviceMismatchError:
    try:
        arguments = signature.bind(*args, **kwargs).arguments
    except TypeError:
        arguments = {f"args[{i}]": v for i, v in enumerate(args)} | kwargs
    found = []
    for name, value in arguments.items():
        for path, tensor, note in _named_tensors(value, name):
            if not _is_cpu_scalar(tensor):
                found.append((path, tensor, note))
    name = getattr(fn, "__qualname__", repr(fn)).rsplit("<locals>.", 1)[-1]
    return _mismatch_error(found, list(arguments), f"{name}() got")
