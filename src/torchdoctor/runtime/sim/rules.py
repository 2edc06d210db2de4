"""CUDA's device rules, applied to one ATen call whose operands are not all on one device.

Each check returns the device the outputs go on (rule 10) or raises `Violation`
carrying the message a CUDA build of PyTorch would raise for the same call.
The numbers refer to the rules in the design note (virtual-accelerator.md).
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor.runtime.sim.devices import WILD, describe
from torchdoctor.runtime.sim.operands import CHECKED_NAMES, Operand, classify, operands

Tensor = torch.Tensor
_real_type = torch._C.TensorBase.type  # type: ignore[attr-defined]

# Arguments that are on the CPU by design (rule 9).
CPU_BY_DESIGN = frozenset({"lengths", "batch_sizes", "input_lengths", "target_lengths"})


class Violation(Exception):
    """A call that CUDA would reject: its message, exception type and the operands at fault."""

    def __init__(
        self,
        message: str,
        *,
        culprit: Operand | None = None,
        reference: Operand | None = None,
        exc_type: type[BaseException] = RuntimeError,
        output_device: Any = None,
        kind: str = "mismatch",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.culprit = culprit
        self.reference = reference
        self.exc_type = exc_type
        self.output_device = output_device
        self.kind = kind
        self.operands: list[Operand] = []  # every tensor operand of the call


# ---------------------------------------------------------------------------
# Messages


def two_devices(common: Any, other: Any) -> str:
    return (
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{describe(common)} and {describe(other)}!"
    )


def legacy_type(t: Tensor, device: Any) -> str:
    """torch.cuda.FloatTensor: the name PyTorch prints for a tensor type in messages."""
    name = str(_real_type(t))  # torch.FloatTensor
    if device is None or device is WILD:
        return name
    return name.replace("torch.", f"torch.{device.type}.", 1)


# ---------------------------------------------------------------------------
# The rules


def _resolve_wild(ops: list[Operand], common: Any, set_tag: Any) -> Any:
    """Wild tensors take the device of the first real tensor they meet."""
    wild = [op for op in ops if op.device is WILD]
    if common is None:
        if any(op.device is None and op.tensor.dim() > 0 for op in ops):
            common = None
        elif wild:
            return WILD
    for op in wild:
        set_tag(op.tensor, common)
    return common


def check_tensor_iterator(
    ops: list[Operand], *, allow_cpu_scalars: bool = True, max_scalars: int = 1
) -> Any:
    """Rule 1: pointwise ops. Common device = the first non-CPU operand, outputs first."""
    ordered = [op for op in ops if op.is_output] + [op for op in ops if not op.is_output]
    common = None
    for op in ordered:
        if op.device is not None and op.device is not WILD:
            common = op.device
            break
    if common is None:
        return None
    scalars = 0
    for op in ordered:
        if op.device is WILD or op.device == common:
            continue
        if allow_cpu_scalars and not op.is_output and op.is_cpu_scalar:
            scalars += 1
            if scalars > max_scalars:
                raise Violation(
                    "Trying to pass too many CPU scalars to non-CPU kernel!",
                    culprit=op,
                    output_device=common,
                    kind="scalars",
                )
            continue
        reference = next(o for o in ordered if o.device == common)
        raise Violation(
            two_devices(common, op.device), culprit=op, reference=reference, output_device=common
        )
    return common


def check_where(ops: list[Operand]) -> Any:
    """Rule 2: `where` takes any number of 0-dim CPU operands."""
    return check_tensor_iterator(ops, max_scalars=len(ops))


def check_first_fixes(
    ops: list[Operand], order: tuple[str, ...] | None, wrapper: str, backend_key: str
) -> Any:
    """Rule 3: the first tensor argument fixes the device; no scalar exemption."""
    if order is not None:
        rank = {name: i for i, name in enumerate(order)}
        ordered = sorted((op for op in ops if op.name in rank), key=lambda op: rank[op.name])
    else:
        ordered = list(ops)
    common_op: Operand | None = None
    for op in ordered:
        if op.device is WILD or op.name in CPU_BY_DESIGN:
            continue
        if order is None and op.is_cpu_scalar:
            continue  # not a generated CUDA wrapper: CPU scalars pass (composites move them)
        if common_op is None:
            common_op = op
            continue
        if op.device != common_op.device:
            if order is None:  # say it the TensorIterator way
                raise Violation(
                    two_devices(common_op.device, op.device),
                    culprit=op,
                    reference=common_op,
                    output_device=common_op.device,
                )
            raise Violation(
                "Expected all tensors to be on the same device, but got "
                f"{op.name} is on {describe(op.device)}, different from other tensors on "
                f"{describe(common_op.device)} (when checking argument in method "
                f"wrapper_{backend_key}_{wrapper})",
                culprit=op,
                reference=common_op,
                output_device=common_op.device,
            )
    return None if common_op is None else common_op.device


def check_index(ops: list[Operand]) -> Any:
    """Rule 4: indices on CPU or on self's device; an assigned value may be 0-dim CPU."""
    self_op = next((op for op in ops if op.name in ("self", "input")), None)
    if self_op is None:
        return check_tensor_iterator(ops)
    self_dev = self_op.device
    for op in ops:
        if op.name != "indices" or op.device is WILD:
            continue
        if op.device is not None and op.device != self_dev and self_dev is not WILD:
            raise Violation(
                "indices should be either on cpu or on the same device as the indexed tensor "
                f"({describe(self_dev)})",
                culprit=op,
                reference=self_op,
                output_device=self_dev,
                kind="index",
            )
    values = [op for op in ops if op.name == "values"]
    for value in values:
        if value.device is WILD or value.device == self_dev:
            continue
        if value.tensor.dim() == 0:  # a 0-dim value is moved to self's device
            continue
        out_dev = self_dev if self_dev is not None else value.device
        other_dev = value.device if self_dev is not None else self_dev
        raise Violation(
            two_devices(out_dev, other_dev),
            culprit=value,
            reference=self_op,
            output_device=self_dev,
        )
    return self_dev


def check_masked_fill(ops: list[Operand]) -> Any:
    """Rule 5: the mask on self's device; a value tensor must be 0-dim, any device."""
    self_op = next(op for op in ops if op.name == "self")
    mask = next((op for op in ops if op.name == "mask"), None)
    value = next((op for op in ops if op.name == "value"), None)
    if mask is None:
        return self_op.device
    devices = {op.device for op in (self_op, mask, value) if op is not None}
    devices.discard(WILD)
    if value is not None and self_op.device is None and len(devices) > 1:
        raise Violation(
            "masked_fill_: Expected inputs to be on same device",
            culprit=self_op,
            reference=mask if mask.device is not None else value,
            output_device=self_op.device,
        )
    if mask.device is not WILD and self_op.device is not WILD and mask.device != self_op.device:
        raise Violation(
            "expected self and mask to be on the same device, but got mask on "
            f"{describe(mask.device)} and self on {describe(self_op.device)}",
            culprit=mask,
            reference=self_op,
            output_device=self_op.device,
        )
    return self_op.device


def check_embedding(ops: list[Operand], backend_key: str) -> Any:
    """Rule 6: `embedding` is `weight.index_select(0, indices)` and says so."""
    renamed = []
    for op in ops:
        name = {"weight": "self", "indices": "index"}.get(op.name, op.name)
        renamed.append(Operand(name, op.tensor, op.device, op.is_output))
    try:
        return check_first_fixes(renamed, ("self", "index"), "_index_select", backend_key)
    except Violation as v:  # keep the user-facing operand names
        v.culprit = next(
            op for op in ops if v.culprit is not None and op.tensor is v.culprit.tensor
        )
        v.reference = next(
            op for op in ops if v.reference is not None and op.tensor is v.reference.tensor
        )
        raise


def check_conv(ops: list[Operand]) -> Any:
    """Rule 6: convolution compares tensor types: torch.FloatTensor vs torch.cuda.FloatTensor."""
    by_name = {op.name: op for op in ops}
    inp, weight, bias = by_name.get("input"), by_name.get("weight"), by_name.get("bias")
    if inp is None or weight is None:
        return check_first_fixes(ops, None, "", "")
    mkldnn = inp.device is None and inp.tensor.dtype in (torch.float32, torch.bfloat16)
    for param, what in ((weight, "weight"), (bias, "bias")):
        if param is None or param.device is WILD or inp.device is WILD:
            continue
        if param.device == inp.device:
            continue
        in_type = _device_type(inp.device)
        if in_type == _device_type(param.device):  # same kind, different ordinals (cudnn)
            raise Violation(
                f"Expected tensor for argument #1 'input' to have the same device as tensor "
                f"for argument #2 '{what}'; but device {inp.device.index} does not equal "
                f"{param.device.index} (while checking arguments for cudnn_convolution)",
                culprit=param,
                reference=inp,
                output_device=inp.device,
            )
        suffix = (
            f" or input should be a MKLDNN tensor and {what} is a dense tensor" if mkldnn else ""
        )
        raise Violation(
            f"Input type ({legacy_type(inp.tensor, inp.device)}) and {what} type "
            f"({legacy_type(param.tensor, param.device)}) should be the same{suffix}",
            culprit=param if inp.device is not None else inp,
            reference=inp if inp.device is not None else param,
            output_device=inp.device if inp.device is not None else param.device,
        )
    return inp.device


def _device_type(dev: Any) -> str:
    return "cpu" if dev is None or dev is WILD else str(dev.type)


class PerPosition(list[Any]):
    """Output devices of a `_foreach_*` op, one per list position."""


def check_foreach(ops: list[Operand]) -> Any:
    """Rule 8: `_foreach_*` ops are checked per list position; scalar tensors may be CPU."""
    lists: dict[str, list[Operand]] = {}
    singles: list[Operand] = []
    for op in ops:
        lists.setdefault(op.name, []).append(op)
    lengths = {len(v) for v in lists.values() if len(v) > 1}
    width = max(lengths) if lengths else 1
    columns: list[list[Operand]] = [[] for _ in range(width)]
    for group in lists.values():
        if len(group) == width:
            for i, op in enumerate(group):
                columns[i].append(op)
        else:
            singles.extend(group)
    per_position = PerPosition()
    for column in columns:
        common = check_tensor_iterator(column + singles, max_scalars=len(column) + len(singles))
        if common is None:  # all on the CPU: the outputs follow the first list
            common = column[0].device if column and column[0].device is not WILD else None
        per_position.append(common)
    return per_position


_SCALAR_TYPE_NAMES = {
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float16: "Half",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.bool: "Bool",
    torch.bfloat16: "BFloat16",
}


def lengths_message(t: Tensor, device: Any) -> str:
    dtype = _SCALAR_TYPE_NAMES.get(t.dtype, str(t.dtype))
    return (
        "'lengths' argument should be a 1D CPU int64 tensor, but got "
        f"{t.dim()}D {describe(device)} {dtype} tensor"
    )


def check_pack(func_name: str, ops: list[Operand]) -> Any:
    """Rule 9: packed sequences keep `lengths`/`batch_sizes` on the CPU."""
    for op in ops:
        if (
            op.name in ("lengths", "batch_sizes")
            and op.device is not None
            and op.device is not WILD
        ):
            raise Violation(
                lengths_message(op.tensor, op.device),
                culprit=op,
                output_device=None,
                kind="cpu-by-design",
            )
    data = next((op for op in ops if op.name in ("input", "data")), None)
    return None if data is None else data.device


def check(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    tag_of: Any,
    set_tag: Any,
    key: str,
    lenient: bool = False,
) -> tuple[Any, list[Operand]]:
    """Apply the rule for `func`; return (output device, operands) or raise Violation.

    `lenient`: CPU tensors count as wild (inside composites known to allocate CPU
    tensors without dispatching a factory, such as ctc_loss's reduction).
    """
    kind, _names, _writes, wrapper = classify(func)
    ops = operands(func, args, kwargs, tag_of, lenient)
    if kind == "copy":  # rule 7: crosses devices; a wild destination meets its source here
        first = _first_device(ops)
        if first is WILD:
            source = next((op.device for op in ops if op.device not in (None, WILD)), None)
            if source is not None:
                return _resolve_wild(ops, source, set_tag), ops
        return first, ops
    try:
        if kind == "ti":
            common = check_tensor_iterator(ops)
        elif kind == "where":
            common = check_where(ops)
        elif kind == "index":
            common = check_index(ops)
        elif kind == "masked_fill":
            common = check_masked_fill(ops)
        elif kind == "embedding":
            common = check_embedding(ops, key)
        elif kind == "conv":
            common = check_conv(ops)
        elif kind == "foreach":
            common = check_foreach(ops)
        elif kind == "pack":
            common = check_pack(func.__name__, ops)
        elif kind == "checked":
            names = CHECKED_NAMES[func]
            if func.__name__.startswith("_ctc_loss"):
                names = tuple(n for n in names if n != "targets")
            common = check_first_fixes(ops, names, wrapper, key)
        else:
            common = check_first_fixes(ops, None, "", key)
    except Violation as violation:
        violation.operands = ops
        raise
    if isinstance(common, PerPosition):
        return common, ops
    return _resolve_wild(ops, common, set_tag), ops


def _first_device(ops: list[Operand]) -> Any:
    for op in ops:
        return op.device
    return None
