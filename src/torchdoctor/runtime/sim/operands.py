"""The operands of one ATen call as the device rules see them: each tensor argument with
its device (virtual tag, WILD, None for the CPU), and the kind of rule the op obeys
(classified once per OpOverload from the op table)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torchdoctor.runtime.sim._optable import CHECKED, TENSOR_ITERATOR
from torchdoctor.runtime.sim.devices import WILD

Tensor = torch.Tensor
_real_device = torch._C.TensorBase.device.__get__  # type: ignore[attr-defined]


@dataclass
class Operand:
    name: str
    tensor: Tensor
    device: Any  # interned virtual device, WILD, None (cpu) or a real non-cpu device
    is_output: bool

    @property
    def is_cpu_scalar(self) -> bool:
        return self.device is None and self.tensor.dim() == 0


def operand_device(t: Tensor, tag: Any) -> Any:
    """The device used by the rules: the tag, or the real device when not cpu (meta)."""
    if tag is not None:
        return tag
    real = _real_device(t)
    return None if real.type == "cpu" else real


# ---------------------------------------------------------------------------
# Op classification (cached per OpOverload)

_KINDS: dict[Any, tuple[str, tuple[str, ...], frozenset[str], str]] = {}

_COPY_OPS = frozenset(
    {
        "copy_",
        "_copy_from",
        "_copy_from_and_resize",
        "copy",
        "set_",
        "_to_copy",
        "to",
        "lift_fresh",
        "lift_fresh_copy",
        "_has_compatible_shallow_copy_type",
        "_make_dep_token",
    }
)
_INDEX_OPS = frozenset(
    {"index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"}
)
_PACK_OPS = frozenset({"_pack_padded_sequence", "_pad_packed_sequence"})


def classify(func: Any) -> tuple[str, tuple[str, ...], frozenset[str], str]:
    """(kind, argument names, names of written arguments, CUDA wrapper suffix)."""
    hit = _KINDS.get(func)
    if hit is not None:
        return hit
    schema = func._schema
    names = tuple(a.name for a in schema.arguments)
    writes = frozenset(
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write
    )
    base = schema.name.split("::", 1)[-1]
    key = f"{base}.{schema.overload_name or 'default'}"
    wrapper = ""
    if base in _COPY_OPS:
        kind = "copy"
    elif base in _PACK_OPS:
        kind = "pack"
    elif base == "where":
        kind = "where"
    elif base in _INDEX_OPS:
        kind = "index"
    elif base in ("masked_fill", "masked_fill_"):
        kind = "masked_fill"
    elif base == "embedding":
        kind = "embedding"
    elif base in ("convolution", "_convolution"):
        kind = "conv"
    elif base.startswith(("_foreach_", "_amp_foreach")) and key not in CHECKED:
        kind = "foreach"
    elif key in CHECKED:  # a generated CUDA wrapper compares these arguments
        kind = "checked"
        wrapper, CHECKED_NAMES[func] = CHECKED[key]
    elif key in TENSOR_ITERATOR or torch.Tag.pointwise in func.tags:
        kind = "ti"
    else:
        # NoCheck kernels that check in their own ways, and composites without a CUDA
        # kernel (their inner ops would check): the first tensor fixes the device, and
        # CPU scalars pass.
        kind = "other"
    result = (kind, names, writes, wrapper)
    _KINDS[func] = result
    return result


CHECKED_NAMES: dict[Any, tuple[str, ...]] = {}


def _iter_tensors(
    name: str, value: Any, is_output: bool, tag_of: Any, lenient: bool
) -> Iterator[Operand]:
    items = [value] if isinstance(value, Tensor) else value
    if not isinstance(items, (list, tuple)):
        return
    for item in items:
        if isinstance(item, Tensor):
            device = operand_device(item, tag_of(item))
            if lenient and device is None:
                device = WILD  # inside a composite that allocates CPU tensors unseen
            yield Operand(name, item, device, is_output)


def operands(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    tag_of: Any,
    lenient: bool = False,
) -> list[Operand]:
    """Every tensor argument, named after the schema, in schema order."""
    _, names, writes, _ = classify(func)
    found: list[Operand] = []
    for i, value in enumerate(args):
        name = names[i] if i < len(names) else f"arg{i}"
        found.extend(_iter_tensors(name, value, name in writes, tag_of, lenient))
    for name, value in kwargs.items():
        found.extend(_iter_tensors(name, value, name in writes, tag_of, lenient))
    return found
