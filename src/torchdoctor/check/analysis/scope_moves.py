"""Tensor methods and moves: `.to()`, `.cuda()`, `.cpu()` and the device they target."""

from __future__ import annotations

import ast
import dataclasses
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.scope_library import ScopeLibrary
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.analysis.torch_api import (
    _COMPARISONS,
    _DEVICE_HOLDERS,
    _INDEX_RESULTS,
    _NON_TENSOR_METHODS,
    DTYPE_NAMES,
    MEETING_METHODS,
    PRESERVING_METHODS,
    REDUCTIONS,
    is_cpu_name,
    is_dtype_text,
    legacy_type_place,
)
from torchdoctor.check.analysis.values import (
    _TENSOR_KINDS,
    UNKNOWN,
    Kind,
    Move,
    Place,
    Value,
    _tensor_kind,
)

if TYPE_CHECKING:
    pass


class ScopeMoves(ScopeLibrary):
    """Tensor methods, and the moves between devices."""

    def _tensor_method(
        self,
        node: ast.Call,
        func: ast.Attribute,
        method: str,
        recv: Value,
        args: list[Value],
    ) -> Value | None:
        kind = recv.kind
        if kind is Kind.BATCH and not recv.part:
            if method == "items":
                part = dataclasses.replace(recv, part=True)
                return Value(Kind.CONTAINER, element=Value(Kind.CONTAINER, items=(UNKNOWN, part)))
            if method == "values":
                return Value(Kind.CONTAINER, element=dataclasses.replace(recv, part=True))
            if method in ("get", "pop"):
                return dataclasses.replace(recv, part=True)
        if method == "numpy":
            return Value(Kind.ARRAY)
        if method in ("detach", "detach_"):
            return dataclasses.replace(recv, grad=False, kind=_tensor_kind(recv))
        if method in _NON_TENSOR_METHODS:
            return UNKNOWN
        if method == "type_as" and args:
            other = args[0]
            if other.place is not Place.UNKNOWN:
                return dataclasses.replace(
                    recv, place=other.place, device=other.device, device_line=node.lineno
                )
            return UNKNOWN
        if method.startswith("new_"):
            return Value(
                Kind.TENSOR,
                recv.place,
                name=recv.name,
                device=recv.device,
                device_line=recv.device_line,
                assumed=recv.assumed,
                is_input=recv.is_input,
            )
        if method in REDUCTIONS:
            result = self._combined([recv])
            if result is UNKNOWN:
                return UNKNOWN
            no_dim = not node.args and not any(k.arg == "dim" for k in node.keywords)
            return dataclasses.replace(result, scalar=no_dim, source=recv.source)
        if method in MEETING_METHODS:
            comparison = method in _COMPARISONS
            operands = [(func.value, recv)]
            for arg_node, value in zip(node.args, args, strict=False):
                if value.tensor_like:
                    operands.append((arg_node, value))
            if len(operands) > 1:
                self._meet(node, operands, "method")
            result = self._combined([recv] + [v for _, v in operands[1:]], grad=not comparison)
            if result is not UNKNOWN and result.place is recv.place:
                result = dataclasses.replace(result, source=recv.source)
            return result
        if method in PRESERVING_METHODS:
            reshaping = method in ("view", "reshape", "unsqueeze", "expand", "repeat")
            kind = _tensor_kind(recv)
            if recv.kind is Kind.PARAMETER and (method in DTYPE_NAMES or method.endswith("_")):
                # `.float()` of a float32 parameter, and in-place methods
                # (`.requires_grad_(False)`), return the parameter itself
                kind = Kind.PARAMETER
            grad = recv.grad and method not in _INDEX_RESULTS
            if method == "requires_grad_":
                flag = node.args[0] if node.args else None
                grad = not (isinstance(flag, ast.Constant) and flag.value is False)
            return dataclasses.replace(
                recv,
                kind=kind,
                grad=grad,
                scalar=False if reshaping else recv.scalar,
                output=False,
            )
        return None

    def _retype(
        self, node: ast.Call, receiver: ast.expr, recv: Value, args: list[Value], statement: bool
    ) -> Value | None:
        """`x.type(T)`: a move when `T` is a legacy tensor type (None: a dtype conversion)."""
        if not node.args and not node.keywords:
            return None if recv.kind is Kind.MODULE else UNKNOWN  # the type's name, a string
        arg = node.args[0] if node.args else node.keywords[0].value
        held = args[0] if node.args else self._peek(arg)
        text = self._text(arg)
        maybe = False
        if held.kind is Kind.TENSOR_TYPE:
            # chosen at run time between the CPU and a device: the target device, as
            # `device = "cuda" if cuda else "cpu"` is
            maybe = held.place is Place.UNKNOWN
            target = (Place.DEVICE, text) if maybe else (held.place, held.device)
        elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            place = legacy_type_place(arg.value)
            if place is None:
                return None
            target = (place, text)
        elif is_dtype_text(text) or is_dtype_text(self.ctx.qualname(arg) or ""):
            return None
        elif (like := _type_name_of(arg)) is not None:
            # `x.type(y.type())`: y's type name ("torch.cuda.FloatTensor") puts x where y is
            other = self._peek(like)
            place = other.place if other.kind in _TENSOR_KINDS else Place.UNKNOWN
            target = (place, f"{self._text(like)}.device")
        else:
            target = (Place.UNKNOWN, text)  # a type we cannot know: anywhere
        moved = self._move(node, receiver, recv, statement, target)
        if moved is not None and maybe:
            moved = dataclasses.replace(moved, maybe=True)
            if statement and moved.kind is Kind.MODULE and (key := dotted(receiver)):
                self._set(key, moved)
        return moved

    def _move(
        self,
        node: ast.Call,
        receiver: ast.expr,
        recv: Value,
        statement: bool,
        target: tuple[Place, str] | None = None,
    ) -> Value | None:
        """`x.to(...)`, `x.cuda()`, `x.cpu()`: the moved value (None: not a move).

        `target`: where a move that is not one of these sends it (`x.type(T)`)."""
        method = node.func.attr  # type: ignore[attr-defined]
        if target is not None:
            pass
        elif method == "cpu":
            target = (Place.CPU, "'cpu'")
        elif method == "cuda":
            target = (Place.DEVICE, '"cuda"')
        else:
            target = self._to_target(node)
        if target is None:
            # a dtype conversion: same place
            if recv.kind is Kind.MODULE:
                if self._recording:
                    self.moves.append(Move(node, receiver, recv, recv, statement, dtype_only=True))
                return recv
            converted: Value | None = None
            if recv.kind in _TENSOR_KINDS and recv.place is not Place.UNKNOWN:
                converted = dataclasses.replace(recv, kind=_tensor_kind(recv), output=False)
            if self._recording and recv.kind is not Kind.UNKNOWN:
                after = converted or recv
                self.moves.append(Move(node, receiver, recv, after, statement, dtype_only=True))
            return converted
        place, device_text = target
        kind = recv.kind
        if kind is Kind.PARAMETER:
            kind = Kind.TENSOR
        shown = self.shown_module(dotted(receiver))
        moved_module = kind is Kind.MODULE or (kind is Kind.UNKNOWN and (statement or shown))
        guessed = recv.guessed and not shown
        if kind is Kind.UNKNOWN and (statement or shown):
            # Tensor.to is not in place: a dropped .to() is a module's, or a pipeline's,
            # a graph batch's: a module for sure only if the scope uses it as one
            kind = Kind.MODULE
            guessed = not shown
        after = dataclasses.replace(
            recv,
            kind=kind,
            guessed=guessed,
            place=place,
            device=device_text,
            device_line=node.lineno,
            assumed=False,
            is_input=False,
            fresh=False,
            dropped_line=0,
            output=recv.output,
        )
        if kind is Kind.BATCH and self._recording and place is Place.DEVICE:
            self.moved_origins.add((recv.name, recv.line))
        if self._recording:
            self.moves.append(Move(node, receiver, recv, after, statement))
        if statement:
            key = dotted(receiver)
            if key is not None:
                if moved_module:
                    kept = self._attributes_after_move(key, after)
                    self._set(key, after)
                    if self.env is not None:
                        self.env.update(kept)
                elif kind is Kind.BATCH and not recv.part and recv.moves_in_place:
                    self._set(key, after)  # `inputs.to(device)` of a BatchEncoding
                elif kind is Kind.BATCH and not recv.part:
                    self._set(key, UNKNOWN)  # a custom batch may move in place
                elif recv.kind in _TENSOR_KINDS and recv.kind is not Kind.UNKNOWN:
                    self._set(key, dataclasses.replace(recv, dropped_line=node.lineno))
        return after

    def _to_target(self, node: ast.Call) -> tuple[Place, str] | None:
        """Where `.to(...)` sends a tensor; None for a dtype-only conversion."""
        target: ast.expr | None = None
        for kw in node.keywords:
            if kw.arg == "device":
                target = kw.value
        if target is None:
            if not node.args:
                return None
            target = node.args[0]
            if isinstance(target, ast.Starred):
                return None
        return self.device_target(target)

    def device_target(self, target: ast.expr) -> tuple[Place, str] | None:
        """Place and text of a device argument (`device`, "cuda", torch.device(...))."""
        text = self._text(target)
        if isinstance(target, ast.Constant):
            if is_cpu_name(target.value):
                return Place.CPU, text
            if isinstance(target.value, str | int) and not isinstance(target.value, bool):
                return Place.DEVICE, text
            return None
        held = self.value(target) if self._recording else UNKNOWN
        if held is UNKNOWN:
            held = self._peek(target)
        if held.kind is Kind.DEVICE:
            return (held.place if held.place is not Place.UNKNOWN else Place.DEVICE), text
        if held.kind in (Kind.TENSOR, Kind.PARAMETER, Kind.BATCH) and held.place is not (
            Place.UNKNOWN
        ):
            return held.place, held.device or f"{text}.device"
        if held.kind in (Kind.TENSOR, Kind.PARAMETER, Kind.BATCH, Kind.ARRAY):
            return None  # to(other tensor) of unknown place
        if isinstance(target, ast.Attribute) and target.attr == "device":
            base_value = self._peek(target.value)
            last = (dotted(target.value) or "").rsplit(".", 1)[-1]
            if base_value.kind is not Kind.MODULE and last not in _DEVICE_HOLDERS:
                return Place.UNKNOWN, text  # wherever that tensor is
        qual = self.ctx.qualname(target) or ""
        if qual and is_dtype_text(qual):
            return None
        if is_dtype_text(text):
            return None
        if isinstance(target, ast.Call) and self.ctx.call_name(target) == "torch.device":
            first = target.args[0] if target.args else None
            if isinstance(first, ast.Constant) and is_cpu_name(first.value):
                return Place.CPU, text
        return Place.DEVICE, text

    def _peek(self, node: ast.expr) -> Value:
        """The value of a simple expression without recording anything."""
        key = dotted(node)
        if key is None:
            return UNKNOWN
        if "." not in key:
            return self.lookup(key)
        if self.env is not None and key in self.env:
            return self.env[key]
        return UNKNOWN

    def _attributes_after_move(self, key: str, after: Value) -> dict[str, Value]:
        """`self.x` of an nn.Module that `self.cuda()` / `self.to(device)` moves in place:
        its submodules and parameters go with it, its plain tensors stay where they are
        (Module.to moves parameters and buffers only), unless the class overrides
        `_apply`/`to`/`cuda`, which may move them too."""
        if self.env is None or key != self.self_name or self.cls is None:
            return {}
        if not self.ff.is_module_class(self.cls):
            return {}
        if _MOVING_OVERRIDES & self.ff.methods(self.cls).keys():
            return {}
        prefix = key + "."
        kept: dict[str, Value] = {}
        for k, v in self.env.items():
            if not k.startswith(prefix) or "." in k[len(prefix) :]:
                continue
            if v.kind is Kind.TENSOR:
                kept[k] = v
            elif v.kind in (Kind.MODULE, Kind.PARAMETER):
                kept[k] = dataclasses.replace(
                    v,
                    place=after.place,
                    device=after.device,
                    device_line=after.device_line,
                    maybe=after.maybe,
                    fresh=False,
                    assumed=False,
                )
        return kept


# methods through which a module's own class may move its plain tensor attributes too
_MOVING_OVERRIDES = frozenset({"_apply", "to", "cuda", "cpu", "type"})


def _type_name_of(arg: ast.expr) -> ast.expr | None:
    """`y` of `y.type()` (the call that names y's tensor type), else None."""
    if (
        isinstance(arg, ast.Call)
        and isinstance(arg.func, ast.Attribute)
        and arg.func.attr == "type"
        and not arg.args
        and not arg.keywords
    ):
        return arg.func.value
    return None
