"""Training-side entry points while a simulation runs: `torch.save` / `torch.load`
(storage locations, `map_location`), optimizers, gradient clipping and GradScaler, and
the RNN modules' device checks."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor.runtime.sim import rules
from torchdoctor.runtime.sim.devices import (
    CPU,
    TAG,
    WILD,
    describe,
    is_virtual,
    set_tag,
    tag_of,
)
from torchdoctor.runtime.sim.opaque import call_opaque
from torchdoctor.runtime.sim.operands import Operand, operand_device

if TYPE_CHECKING:
    from torchdoctor.runtime.sim.patches import Patches

Tensor = torch.Tensor


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


def install(patches: Patches) -> None:
    _serialization(patches)
    _optimizers(patches)
    _rnn(patches)


def _serialization(patches: Patches) -> None:
    p = patches.patcher
    ser = torch.serialization
    real_location_tag = ser.location_tag
    real_restore: Callable[..., Any] = ser.default_restore_location
    session = patches.session
    backend = patches.backend

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
        target = patches.devices.get(index or 0)
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

    def storage_cuda(self_: Any, device: Any = None, non_blocking: bool = False, **kw: Any) -> Any:
        copied = self_.clone()
        index = patches.devices.current if device is None else patches.device_index(device)
        setattr(copied, TAG, patches.devices.get(index))
        return copied

    if backend == "cuda":
        p.set(torch.UntypedStorage, "cuda", storage_cuda)


def _optimizers(patches: Patches) -> None:
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
                dev = tag if is_virtual(tag) else CPU
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
        patches.patcher.set(module, "_group_tensors_by_device_and_dtype", group)

    opt = torch.optim.Optimizer
    if "_group_tensors_by_device_and_dtype" in opt.__dict__:
        patches.patcher.set(opt, "_group_tensors_by_device_and_dtype", staticmethod(group))


def _rnn(patches: Patches) -> None:
    vf = torch._VF
    session = patches.session

    def check(inp: Tensor, hiddens: list[Any], params: list[Any]) -> Any:
        """The input's device, once hidden state and parameters agree (rule 6)."""
        dev = operand_device(inp, tag_of(inp))
        if dev is WILD:
            return dev

        for what, group in (("hidden", hiddens), ("parameter", params)):
            for t in group:
                if not isinstance(t, Tensor):
                    continue
                other = operand_device(t, tag_of(t))
                if other is WILD or other == dev:
                    continue
                session.violation(
                    rules.Violation(
                        f"Input and {what} tensors are not at the same device, found input "
                        f"tensor at {describe(dev)} and {what} tensor at "
                        f"{describe(other)}",
                        culprit=Operand(what, t, other, False),
                        reference=Operand("input", inp, dev, False),
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
        patches.patcher.set(vf, name, wrap(name))

    # Packed sequences (rule 9): the data stays on its device, batch sizes and
    # lengths on the CPU, whatever the C++ composite allocated them with.
    real_pad = vf._pad_packed_sequence

    def pad_packed_sequence(data: Tensor, batch_sizes: Tensor, *args: Any) -> Any:
        tag = tag_of(batch_sizes)
        if is_virtual(tag):
            session.violation(
                rules.Violation(
                    rules.lengths_message(batch_sizes, tag),
                    culprit=Operand("batch_sizes", batch_sizes, tag, False),
                    kind="cpu-by-design",
                ),
                op=None,
            )
        padded, lengths = real_pad(data, batch_sizes, *args)
        data_tag = tag_of(data)
        set_tag(padded, data_tag if is_virtual(data_tag) else None)
        set_tag(lengths, None)
        return padded, lengths

    patches.patcher.set(vf, "_pad_packed_sequence", pad_packed_sequence)

    # ctc_loss (a C++ composite) divides by lengths it copies into a fresh CPU
    # tensor that no factory call shows; CUDA accepts lengths on either device.
    real_ctc = torch.ctc_loss

    @functools.wraps(real_ctc)
    def ctc_loss(*args: Any, **kwargs: Any) -> Any:
        with session.lenient_region():
            return real_ctc(*args, **kwargs)

    patches.patcher.set(torch, "ctc_loss", ctc_loss)
