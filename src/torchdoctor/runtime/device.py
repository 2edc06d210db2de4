"""Device selection and moving: `pick_device`, `to_device`, `device_of`, `device_safe`.

These replace the boilerplate every training script grows: the
`DEVICE = torch.device("cuda" if ... else "cpu")` line, the recursive `.to`
helper, and the "which device is this model on?" guesswork.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, cast, overload

import torch
from torch import nn

from torchdoctor.errors import DeviceMismatchError, DeviceUnavailableError, InvalidArgumentError

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

Mover = Callable[[Any], Any]
ItemsMover = Callable[[Iterable[Any]], list[Any]]
_LEAF_TYPES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)
_HANDLERS_BY_TARGET: dict[tuple[object, object, object], _HandlerCache] = {}
_MAX_TARGETS = 64


def _identity(obj: T) -> T:
    return obj


class _HandlerCache(dict[type, Mover]):
    """type -> handler; a missing type is resolved on first sight and kept."""

    def __init__(self, resolve: Callable[[type], Mover]) -> None:
        super().__init__()
        self.resolve = resolve

    def __missing__(self, cls: type) -> Mover:
        handler = self[cls] = self.resolve(cls)
        return handler


# The handlers of the last call with default dtype/non_blocking, checked by identity of
# `device`: a training loop calling to_device(batch, device) skips even the dict lookup.
_LAST_HANDLERS: tuple[object, _HandlerCache] = (object(), _HandlerCache(lambda cls: _identity))


def _tensor_mover(
    device: torch.device, dtype: torch.dtype | None, non_blocking: bool | None
) -> Mover:
    """How one tensor moves, specialised once per (device, dtype, non_blocking)."""
    if device.type == "mps":
        non_blocking = False  # non_blocking copies to/from MPS have returned stale data
    if non_blocking is None:
        # Asynchronous copies are only safe and useful host->CUDA from pinned memory.
        if device.type == "cuda":
            if dtype is None:
                return lambda t: t.to(device, non_blocking=t.is_pinned())
            return lambda t: (
                t.to(device, dtype, non_blocking=t.is_pinned())
                if t.is_floating_point()
                else t.to(device, non_blocking=t.is_pinned())
            )
        non_blocking = False
    if non_blocking:
        if dtype is None:
            return lambda t: t.to(device, non_blocking=t.device.type != "mps")
        return lambda t: t.to(
            device,
            dtype if t.is_floating_point() else t.dtype,
            non_blocking=t.device.type != "mps",
        )
    if dtype is None:
        return lambda t: t.to(device)
    return lambda t: t.to(device, dtype) if t.is_floating_point() else t.to(device)


def _custom_to_kwargs(
    cls: type, device: torch.device, dtype: torch.dtype | None, non_blocking: bool | None
) -> dict[str, Any]:
    """Keyword arguments an object's own `.to()` accepts, checked once per type."""
    wanted: dict[str, Any] = {}
    if non_blocking and device.type != "mps":
        wanted["non_blocking"] = True
    if dtype is not None:
        wanted["dtype"] = dtype
    if not wanted:
        return wanted
    try:
        params = inspect.signature(cast(Any, cls).to).parameters
    except (TypeError, ValueError):
        return wanted  # a builtin: trust it
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return wanted
    if "dtype" in wanted and "dtype" not in params:
        raise InvalidArgumentError(
            f"{cls.__qualname__}.to() takes no dtype argument, so to_device(dtype=...) "
            "cannot cast it",
            fix="cast that object yourself, or call to_device without dtype",
        )
    return {k: v for k, v in wanted.items() if k in params}


class _NoFastPath:
    """A type no object has: switches off the inline `v.to(device)` when tensors need more."""


def _build_handlers(
    device: torch.device, dtype: torch.dtype | None, non_blocking: bool | None
) -> _HandlerCache:
    """The per-type handlers that move objects to one target: `handlers[type(obj)](obj)`.

    Every container moves its items in one comprehension of the form
    `v.to(device) if type(v) is fast else handlers[type(v)](v)`: a plain tensor
    is moved inline, with no Python call of ours (close to a bare `.to` loop);
    anything else costs one C-level dict lookup (an unseen type is resolved
    once) and one call. `fast` is Tensor when moving a tensor is exactly
    `t.to(device)`; otherwise it is a type no object has, and tensors go through
    `handlers[Tensor]`.
    """
    move_tensor = _tensor_mover(device, dtype, non_blocking)
    # Same conditions under which _tensor_mover returns a plain `t.to(device)`.
    synchronous = (
        device.type == "mps"
        or non_blocking is False
        or (non_blocking is None and device.type != "cuda")
    )
    fast: Any = _Tensor if dtype is None and synchronous else _NoFastPath
    module_non_blocking = bool(non_blocking) and device.type != "mps"
    handlers = _HandlerCache(lambda cls: resolve(cls))

    # The hot handlers (list, dict, tuple, namedtuple, dataclass) each spell the
    # comprehension out: calling a shared helper costs one more Python call per
    # container, which is most of the walk's own cost.
    def move_items(items: Iterable[Any]) -> list[Any]:
        return [v.to(device) if type(v) is fast else handlers[type(v)](v) for v in items]

    def move_dict(obj: dict[Any, Any]) -> dict[Any, Any]:
        return {
            k: v.to(device) if type(v) is fast else handlers[type(v)](v) for k, v in obj.items()
        }

    def move_tuple(obj: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple([v.to(device) if type(v) is fast else handlers[type(v)](v) for v in obj])

    def namedtuple_handler(cls: type) -> Mover:
        tuple_new = tuple.__new__  # builds it from an iterable, as its own _make does

        def move_namedtuple(obj: Any) -> Any:
            return tuple_new(
                cls, [v.to(device) if type(v) is fast else handlers[type(v)](v) for v in obj]
            )

        return move_namedtuple

    def dataclass_handler(cls: type) -> Mover:
        # Every field, including init=False ones. The copy skips __init__ and
        # __post_init__, keeps other attributes, and works for frozen classes (no
        # __setattr__ involved).
        names = tuple(f.name for f in dataclasses.fields(cls))
        by_copy = _dataclass_by_copy(names, move_items)
        if not _plain_instance_state(cls):
            return by_copy
        new_instance = object.__new__

        def move_dataclass(obj: Any) -> Any:
            new: Any = new_instance(cls)
            state = new.__dict__
            state.update(obj.__dict__)
            try:
                for name in names:
                    v = state[name]
                    state[name] = v.to(device) if type(v) is fast else handlers[type(v)](v)
            except KeyError:  # an init=False field never set
                return by_copy(obj)
            return new

        return move_dataclass

    handlers.update({dict: move_dict, list: move_items, tuple: move_tuple, _Tensor: move_tensor})
    handlers.update(dict.fromkeys(_LEAF_TYPES, _identity))

    def move_module(module: nn.Module) -> nn.Module:
        # In place, like Module.to; floating parameters only get the dtype.
        if dtype is not None:
            return module.to(device, dtype, non_blocking=module_non_blocking)
        return module.to(device, non_blocking=module_non_blocking)

    def resolve(cls: type) -> Mover:
        if issubclass(cls, _Tensor):
            return move_tensor
        if issubclass(cls, nn.Module):
            return move_module
        if callable(getattr(cls, "to", None)):
            # The object knows how to move itself (HF BatchEncoding, PackedSequence, ...).
            kwargs = _custom_to_kwargs(cls, device, dtype, non_blocking)
            return lambda obj: obj.to(device, **kwargs)
        if dataclasses.is_dataclass(cls):
            return dataclass_handler(cls)
        if issubclass(cls, Mapping):
            return _mapping_handler(cls, move_items)
        if issubclass(cls, tuple):
            if hasattr(cls, "_fields") and hasattr(cls, "_make"):
                return namedtuple_handler(cls)
            return _tuple_handler(cls, move_items)
        if issubclass(cls, list):
            return _list_handler(move_items)
        if issubclass(cls, collections.deque):
            return _deque_handler(cls, move_items)
        if issubclass(cls, (set, frozenset)):
            return lambda obj: cls(move_items(obj))
        return _identity

    return handlers


def _plain_instance_state(cls: type) -> bool:
    """Instances are fully described by their __dict__ (no slots, custom copy or __new__)."""
    klass: Any = cls
    return (
        klass.__new__ is object.__new__
        and not hasattr(cls, "__slots__")
        and not hasattr(cls, "__copy__")
        and not hasattr(cls, "__setstate__")
        and klass.__reduce_ex__ is object.__reduce_ex__
        and klass.__reduce__ is object.__reduce__
    )


def _dataclass_by_copy(names: tuple[str, ...], move_items: ItemsMover) -> Mover:
    """For slotted dataclasses, custom copy protocols, and init=False fields never set."""
    missing = object()

    def move_by_copy(obj: Any) -> Any:
        new = copy.copy(obj)
        values = [getattr(obj, name, missing) for name in names]
        # `missing` is a plain object: it comes back as itself
        for name, value in zip(names, move_items(values), strict=True):
            if value is not missing:
                object.__setattr__(new, name, value)
        return new

    return move_by_copy


def _mapping_handler(cls: type, move_items: ItemsMover) -> Mover:
    if cls is collections.OrderedDict:

        def move_ordered_dict(obj: Any) -> Any:
            new = collections.OrderedDict(zip(obj, move_items(obj.values()), strict=True))
            if obj.__dict__:  # e.g. a state_dict's `_metadata` (module versions)
                new.__dict__.update(obj.__dict__)
            return new

        return move_ordered_dict
    if cls is collections.defaultdict:
        return lambda obj: collections.defaultdict(
            obj.default_factory, zip(obj, move_items(obj.values()), strict=True)
        )
    if issubclass(cls, (dict, collections.UserDict)):
        # A copy keeps the type, a defaultdict's factory and any extra attributes.
        def move_mutable(obj: Any) -> Any:
            new = copy.copy(obj)
            for key, value in zip(obj, move_items(obj.values()), strict=True):
                new[key] = value
            return new

        return move_mutable

    def move_mapping(obj: Any) -> Any:
        moved = dict(zip(obj, move_items(obj.values()), strict=True))
        try:
            return cast(Any, cls)(moved)
        except TypeError:
            raise InvalidArgumentError(
                f"to_device cannot rebuild a {cls.__qualname__}: its constructor does not "
                "take a dict",
                fix=f"give {cls.__qualname__} a .to(device) method, or pass a plain dict",
            ) from None

    return move_mapping


def _tuple_handler(cls: type, move_items: ItemsMover) -> Mover:
    def move_tuple_subclass(obj: Any) -> Any:
        moved = move_items(obj)
        try:
            return cast(Any, cls)(moved)
        except TypeError:
            if all(a is b for a, b in zip(moved, obj, strict=True)):
                return obj  # nothing moved: keep the original
            raise InvalidArgumentError(
                f"to_device cannot rebuild a {cls.__qualname__} from its items",
                fix=f"give {cls.__qualname__} a .to(device) method",
            ) from None

    return move_tuple_subclass


def _list_handler(move_items: ItemsMover) -> Mover:
    def move_list_subclass(obj: Any) -> Any:
        new = copy.copy(obj)
        new[:] = move_items(obj)
        return new

    return move_list_subclass


def _deque_handler(cls: type, move_items: ItemsMover) -> Mover:
    if cls is collections.deque:
        return lambda obj: collections.deque(move_items(obj), obj.maxlen)

    def move_deque_subclass(obj: Any) -> Any:
        new = copy.copy(obj)
        new.clear()
        new.extend(move_items(obj))
        return new

    return move_deque_subclass


def _handlers_for(
    device: DeviceLike, dtype: torch.dtype | None, non_blocking: bool | None
) -> _HandlerCache:
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
        mover = _build_handlers(target, dtype, non_blocking)
        if len(_HANDLERS_BY_TARGET) >= _MAX_TARGETS:
            _HANDLERS_BY_TARGET.clear()
        _HANDLERS_BY_TARGET[key] = mover
    if dtype is None and non_blocking is None:
        _LAST_HANDLERS = (device, mover)  # one tuple: read and replaced atomically
    return mover


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
        return moved
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
    elif isinstance(obj, _LEAF_TYPES):
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
