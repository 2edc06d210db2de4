"""Calls of modules, tensors' and containers' methods: where the operands meet."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.loop_builds import loop_builds
from torchdoctor.check.analysis.moved_inputs import Moves, forward_moves
from torchdoctor.check.analysis.scope_moves import ScopeMoves
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.analysis.torch_api import _MODULE_SELF_METHODS, DEVICE_TOLERANT, _trainable
from torchdoctor.check.analysis.values import (
    _TENSOR_KINDS,
    NONE,
    UNKNOWN,
    Kind,
    Place,
    Value,
    _container_add,
)
from torchdoctor.check.analysis.wraps import bound_arguments

if TYPE_CHECKING:
    pass


class ScopeMethods(ScopeMoves):
    """Evaluates a module call (its inputs meet the module's parameters) and the methods
    of modules, tensors and containers."""

    def _module_call(
        self,
        node: ast.Call,
        callee: Value,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        callee_node: ast.expr | None = None,
        *,
        meet: bool = True,
    ) -> Value:
        operands: list[tuple[ast.expr, Value]] = []
        if callee.place is not Place.UNKNOWN:
            operands.append((node.func, callee))
        tolerant = DEVICE_TOLERANT.get(callee.cls.rsplit(".", 1)[-1], frozenset())
        for position, (arg_node, value) in enumerate(zip(node.args, args, strict=False)):
            if position in tolerant and callee.kind is Kind.MODULE:
                continue  # `nn.CTCLoss()(log_probs, cpu_targets, ...)`: any device
            arg_node = arg_node.value if isinstance(arg_node, ast.Starred) else arg_node
            operands.extend(self._tensor_operands(arg_node, value))
        for kw, (_, value) in zip(node.keywords, keywords, strict=False):
            operands.extend(self._tensor_operands(kw.value, value))
        tensors = [(n, v) for n, v in operands if v.tensor_like or n is node.func]
        if any(v.place is Place.CPU for _, v in tensors):
            first_moved = self._moved_inputs(node, callee)
            tensors = [(n, v) for n, v in tensors if id(n) not in first_moved]
        if not meet:
            # where the module is, is not known; its inputs still meet one another when
            # one was put on the device and another made by a factory on the CPU (a
            # tokenizer's mask is left out: libraries' models often move it themselves)
            tensors = [
                (n, v)
                for n, v in tensors
                if not (v.assumed or v.maybe or v.is_input)
                and (v.place is Place.DEVICE or (v.kind is Kind.TENSOR and v.source is not None))
            ]
        if callee.wrapper != "DataParallel":  # DataParallel scatters CPU inputs itself
            self._meet(node, tensors, "module")
        if (callee.kind is not Kind.MODULE or callee.guessed) and not self.shown_module(
            dotted(callee_node if callee_node is not None else node.func)
        ):
            # moved with `.to()` but not shown to be an nn.Module: a pipeline returns
            # images, a wrapper a structure; what the call gives is not known
            return UNKNOWN
        maybe = False
        if callee.place is not Place.UNKNOWN:
            place = callee.place
            device, device_line = callee.device, callee.device_line
            assumed, is_input, maybe = callee.assumed, callee.is_input, callee.maybe
        else:
            moved = next((v for v in args if v.place is Place.DEVICE), None)
            if moved is None:
                moved = next((v for _, v in keywords if v.place is Place.DEVICE), None)
            if moved is None:
                if self._no_grad == 0 and _trainable(callee):
                    # a module's output requires grad, wherever it is
                    return Value(
                        Kind.TENSOR,
                        name=f"output of `{self._text(node.func)}`",
                        line=node.lineno,
                        grad=True,
                        output=True,
                    )
                return UNKNOWN
            place, device, device_line = Place.DEVICE, moved.device, moved.device_line
            assumed, is_input, maybe = moved.assumed, moved.is_input, moved.maybe
        return Value(
            Kind.TENSOR,
            place,
            name=f"output of `{self._text(node.func)}`",
            line=node.lineno,
            device=device,
            device_line=device_line,
            grad=self._no_grad == 0 and _trainable(callee),
            assumed=assumed,
            is_input=is_input,
            output=True,
            maybe=maybe,
        )

    def _moved_inputs(self, node: ast.Call, callee: Value) -> frozenset[int]:
        """The arguments (ids of their nodes) the `forward` of `callee`, a module of a
        project class built in this file, moves to a device before reading them; for a
        loop's name over a display of such modules, those every one of them moves."""
        if callee.kind is not Kind.MODULE or (
            callee.cls and callee.cls not in self.ff.project.module_classes
        ):
            return frozenset()
        if isinstance(callee.source, ast.Call):
            builds: list[ast.Call] | None = [callee.source] if callee.cls else None
        elif isinstance(node.func, ast.Name) and self.is_function:
            builds = loop_builds(self.ctx, self.node, node.func.id)
        else:
            builds = None
        common: frozenset[int] | None = None
        for built in builds or ():
            ids = self._moved_of(node, forward_moves(self.ctx, built))
            common = ids if common is None else common & ids
            if not common:
                break
        return common or frozenset()

    @staticmethod
    def _moved_of(node: ast.Call, found: Moves | None) -> frozenset[int]:
        if found is None or not found[1]:
            return frozenset()
        params, moved = found
        # positions bind `params` (none after a `*args`); keywords keyword-only ones too
        ids = {id(arg) for param, arg in bound_arguments(node, params) if param in moved}
        ids.update(id(kw.value) for kw in node.keywords if kw.arg in moved)
        return frozenset(ids)

    def _tensor_operands(self, node: ast.expr, value: Value) -> list[tuple[ast.expr, Value]]:
        """An argument as operands: a tuple/list display counts element by element."""
        if isinstance(node, ast.Tuple | ast.List) and value.items is not None:
            out: list[tuple[ast.expr, Value]] = []
            for elt, item in zip(node.elts, value.items, strict=False):
                out.extend(self._tensor_operands(elt, item))
            return out
        if isinstance(node, ast.Name) and value.kind is Kind.CONTAINER and value.items:
            # a name bound to a tuple display (`states = (h, c)`): its elements
            return [(node, item) for item in value.items if item.kind is not Kind.CONTAINER]
        return [(node, value)]

    # -- methods -------------------------------------------------------------------------
    def _method(
        self,
        node: ast.Call,
        func: ast.Attribute,
        method: str,
        recv: Value,
        args: list[Value],
        statement: bool,
    ) -> Value | None:
        kind = recv.kind
        if kind is Kind.OBJECT:
            return None  # its methods are the file's: `_same_file_callee`
        if kind is Kind.DISTRIBUTION:
            return self._distribution_method(node, func, recv, args)
        if method in ("to", "cuda", "cpu"):
            return self._move(node, func.value, recv, statement)
        if method == "type" and (kind is Kind.MODULE or kind in _TENSOR_KINDS):
            result = self._retype(node, func.value, recv, args, statement)
            if result is not None:
                return result
        if kind is Kind.MODULE:
            return self._module_method(node, method, recv, args)
        if kind is Kind.CONTAINER:
            return self._container_method(node, func, method, recv, args, statement)
        if kind is Kind.LOADER:
            return recv if method == "__iter__" else None
        if kind is Kind.PARAMETERS:
            return None
        if kind in _TENSOR_KINDS:
            return self._tensor_method(node, func, method, recv, args)
        return None

    def _module_method(
        self, node: ast.Call, method: str, recv: Value, args: list[Value]
    ) -> Value | None:
        if method in _MODULE_SELF_METHODS:
            return recv
        if method == "parameters":
            return Value(
                Kind.PARAMETERS,
                recv.place,
                name=self._text(node.func.value),  # type: ignore[attr-defined]
                device=recv.device,
                device_line=recv.device_line,
                grad=True,
            )
        if method == "buffers":
            # the module's buffers: plain tensors where the module is
            buffer = Value(Kind.TENSOR, recv.place, device=recv.device, name="buffer")
            return Value(Kind.CONTAINER, element=buffer)
        if method == "named_parameters":
            param = Value(Kind.PARAMETER, recv.place, device=recv.device, grad=True)
            return Value(Kind.CONTAINER, element=Value(Kind.CONTAINER, items=(UNKNOWN, param)))
        if method == "forward":
            return self._module_call(node, recv, args, [], node.func.value)  # type: ignore[attr-defined]
        return None

    def _container_method(
        self,
        node: ast.Call,
        func: ast.Attribute,
        method: str,
        recv: Value,
        args: list[Value],
        statement: bool,
    ) -> Value | None:
        key = dotted(func.value)
        if method in ("append", "add", "insert") and args and key is not None:
            self._set(key, _container_add(recv, Value(Kind.CONTAINER, element=args[-1])))
            return NONE
        if method == "extend" and args and key is not None:
            self._set(key, _container_add(recv, args[0]))
            return NONE
        if method == "items":
            item = recv.element or UNKNOWN
            return Value(Kind.CONTAINER, element=Value(Kind.CONTAINER, items=(UNKNOWN, item)))
        if method in ("values", "copy"):
            return recv if method == "copy" else Value(Kind.CONTAINER, element=recv.element)
        if method in ("get", "pop") and recv.element is not None:
            return recv.element
        return None
