"""Expressions: names, attributes, subscripts, containers, operators, iteration."""

from __future__ import annotations

import ast
import dataclasses
import functools
from typing import TYPE_CHECKING

from torchdoctor.check.analysis import distributions
from torchdoctor.check.analysis.default_path import keep_default_side
from torchdoctor.check.analysis.scope_core import ScopeCore
from torchdoctor.check.analysis.syntax import _target_names, dotted
from torchdoctor.check.analysis.torch_api import (
    _DEVICE_STRING,
    _LOADERISH,
    _TENSOR_ATTRS_SAME,
    _TENSOR_META_ATTRS,
    is_cpu_name,
    legacy_type_place,
)
from torchdoctor.check.analysis.values import (
    NONE,
    UNKNOWN,
    Kind,
    Place,
    Value,
    _container_add,
    _tensor_kind,
    join,
)

if TYPE_CHECKING:
    pass

# tensor methods that return a (values, indices) pair (with a `dim`, for max/min/median)
_PAIR_METHODS = frozenset({"sort", "topk", "kthvalue", "mode", "aminmax"})
_PAIR_WITH_DIM = frozenset({"max", "min", "median", "nanmedian"})


def _pair_result(node: ast.expr) -> bool:
    """`x.max(1)`, `x.sort()`, `torch.topk(x, k)`: a call that returns two tensors."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    name = node.func.attr
    if name in _PAIR_METHODS:
        return True
    if name not in _PAIR_WITH_DIM:
        return False
    if any(kw.arg == "dim" for kw in node.keywords):
        return True
    # `x.max(1)`, `torch.max(x, -1)`: a dimension; `x.max(y)` is elementwise
    torch_form = isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
    args = node.args[1:] if torch_form else node.args
    dim = args[0] if args else None
    if isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub):
        dim = dim.operand
    return isinstance(dim, ast.Constant) and type(dim.value) is int


# module containers whose iteration gives their layers (a ModuleDict gives its keys)
_MODULE_SEQUENCES = frozenset({"ModuleList", "Sequential"})


class ScopeExprs(ScopeCore):
    """Evaluates expressions other than calls."""

    def _eval_name(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Name)
        held = self.lookup(node.id)
        if held is UNKNOWN and node.id in self.ctx.imports:
            held = self._legacy_type(node)  # `from torch.cuda import FloatTensor`
        if held is UNKNOWN and node.id[:1].isupper():
            path = self.ff.project_class(node.id)
            if path is not None and not self._is_local(node.id):
                return Value(Kind.CLASS, cls=node.id, where=path)  # of `from agents import *`
        return held

    def _eval_constant(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Constant)
        value = node.value
        if value is None:
            return NONE
        if isinstance(value, str):
            if is_cpu_name(value):
                return Value(Kind.DEVICE, Place.CPU, name=repr(value))
            if _DEVICE_STRING.match(value):
                return Value(Kind.DEVICE, Place.DEVICE, name=repr(value), device=repr(value))
        return UNKNOWN

    def _eval_attribute(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Attribute)
        key = dotted(node)
        if key is not None and self.env is not None:
            if key in self.env:
                self.eval(node.value)
                return self.env[key]
            held = self.global_value(key.split(".", 1)[0], key)
            if held is not UNKNOWN:
                return held
        recv = self.eval(node.value)
        if recv is UNKNOWN and node.attr.endswith("Tensor"):
            held = self._legacy_type(node)
            if held is not UNKNOWN:
                return held
        return self._attribute(recv, node)

    def _legacy_type(self, node: ast.Name | ast.Attribute) -> Value:
        """`torch.cuda.FloatTensor` / `torch.FloatTensor` as a value (not called)."""
        qual = self.ctx.qualname(node) or ""
        place = legacy_type_place(qual)
        if place is None:
            return UNKNOWN
        device = '"cuda"' if place is Place.DEVICE else "'cpu'"
        return Value(Kind.TENSOR_TYPE, place, name=qual, device=device)

    def _attribute(self, recv: Value, node: ast.Attribute) -> Value:
        attr = node.attr
        kind = recv.kind
        if kind is Kind.MODULE or (kind is Kind.UNKNOWN and recv.place is Place.DEVICE):
            if attr in ("weight", "bias"):
                return Value(
                    Kind.PARAMETER,
                    recv.place,
                    name=f"{recv.name}.{attr}" if recv.name else attr,
                    device=recv.device,
                    device_line=recv.device_line,
                    grad=True,
                    assumed=recv.assumed,
                    is_input=recv.is_input,
                )
            if attr == "module" and recv.wrapper:
                return dataclasses.replace(recv, wrapper="")
            if attr == "device" and kind is Kind.MODULE:
                return Value(Kind.DEVICE, recv.place, name=self._text(node))
            return UNKNOWN
        if kind in (Kind.TENSOR, Kind.PARAMETER, Kind.BATCH):
            if attr in _TENSOR_ATTRS_SAME:
                return recv
            if attr == "data":
                return dataclasses.replace(recv, grad=False, kind=_tensor_kind(recv))
            if attr == "grad":
                return dataclasses.replace(recv, grad=False, kind=Kind.TENSOR, scalar=False)
            if attr == "device":
                return Value(
                    Kind.DEVICE,
                    recv.place,
                    name=self._text(node),
                    device=self._text(node),
                    assumed=recv.assumed,
                )
            if attr in _TENSOR_META_ATTRS:
                return UNKNOWN
            if kind is Kind.BATCH:
                return dataclasses.replace(recv, part=True)  # batch.input_ids, data.x
            if recv.output:
                return dataclasses.replace(recv, scalar=False)  # outputs.logits
        if kind is Kind.DISTRIBUTION and attr in distributions.TENSOR_RESULTS:
            return distributions.result(recv)  # `d.mean`, `d.probs`
        return UNKNOWN

    def _eval_subscript(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Subscript)
        base = self.eval(node.value)
        index = node.slice
        self.eval(index)
        if (
            base.items is not None
            and isinstance(index, ast.Constant)
            and isinstance(index.value, int)
            and -len(base.items) <= index.value < len(base.items)
        ):
            return base.items[index.value]
        kind = base.kind
        if kind is Kind.BATCH:
            return dataclasses.replace(base, part=True)
        if kind is Kind.DATASET:
            return self._sample(base)
        if kind is Kind.MODULE and base.place is not Place.UNKNOWN:
            # model[0] of a Sequential/ModuleList: a submodule, where the module is
            return Value(
                Kind.MODULE,
                base.place,
                device=base.device,
                device_line=base.device_line,
                assumed=base.assumed,
                is_input=base.is_input,
            )
        if kind in (Kind.TENSOR, Kind.PARAMETER):
            # an integer index may leave a 0-dim tensor, which mixes with any device;
            # not when it picks a tensor of a (values, indices) pair: `x.max(1)[1]`
            point = not isinstance(index, ast.Slice | ast.Tuple) and not _pair_result(node.value)
            return dataclasses.replace(
                base, kind=Kind.TENSOR, scalar=base.scalar or point, output=base.output
            )
        if kind is Kind.CONTAINER:
            if base.items and not isinstance(index, ast.Slice):
                joined = base.items[0]
                for item in base.items[1:]:
                    joined = join(joined, item)
                return joined
            if isinstance(index, ast.Slice):
                return base
            return base.element or UNKNOWN
        if kind is Kind.UNKNOWN and base.place is not Place.UNKNOWN:
            return Value(place=base.place, device=base.device, device_line=base.device_line)
        return UNKNOWN

    def _eval_tuple(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Tuple | ast.List | ast.Set)
        if _numbers_only(node.elts):  # a data table: nothing to follow, skip the walk
            return _numbers_row(len(node.elts))
        items = []
        starred = False
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                starred = True
                items.append(self._element(self.eval(elt.value), elt.value))
            else:
                items.append(self.eval(elt))
        element: Value | None = None
        for item in items:
            element = item if element is None else join(element, item)
        return Value(
            Kind.CONTAINER,
            element.place if element is not None else Place.UNKNOWN,
            items=None if starred else tuple(items),
            element=element,
        )

    def _eval_dict(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Dict)
        element: Value | None = None
        for key, val in zip(node.keys, node.values, strict=False):
            if key is not None:
                self.eval(key)
            item = self.eval(val)
            if key is None:
                item = self._element(item, None)
            element = item if element is None else join(element, item)
        return Value(
            Kind.CONTAINER, element.place if element is not None else Place.UNKNOWN, element=element
        )

    def _eval_comprehension(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp)
        env = self.env
        if env is None:
            return UNKNOWN
        saved: dict[str, Value | None] = {}
        for gen in node.generators:
            element = self._element(self.eval(gen.iter), gen.iter)
            for name in _target_names(gen.target):
                if name not in saved:
                    saved[name] = env.get(name)
                env[name] = UNKNOWN  # comprehension variables shadow outer names
            self._bind(gen.target, element)
            for name in _target_names(gen.target):
                env.setdefault(name, UNKNOWN)
            for cond in gen.ifs:
                self.eval(cond)
        if isinstance(node, ast.DictComp):
            self.eval(node.key)
            element = self.eval(node.value)
        else:
            element = self.eval(node.elt)
        for name, old in saved.items():
            if old is None:
                env.pop(name, None)
            else:
                env[name] = old
        return Value(Kind.CONTAINER, element.place, element=element)

    def _eval_binop(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.BinOp)
        left = self.eval(node.left)
        right = self.eval(node.right)
        if left.kind is Kind.OBJECT or right.kind is Kind.OBJECT:
            # `a * b` of an object: what its class's `__mul__` (or `b`'s `__rmul__`) returns
            return self._operator_call(node, left, right)
        if left.kind is Kind.CONTAINER and right.kind is Kind.CONTAINER:
            return _container_add(left, right)
        if left.kind is Kind.CONTAINER and isinstance(node.op, ast.Mult):
            return left  # [layer] * n
        return self._binary(node, [(node.left, left), (node.right, right)])

    def _operator_call(self, node: ast.BinOp, left: Value, right: Value) -> Value:
        """An operator one of whose operands is an object of a project class (followed
        into its method by the layer that follows calls)."""
        return UNKNOWN

    def _eval_compare(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Compare)
        operands = [(node.left, self.eval(node.left))]
        for comp in node.comparators:
            operands.append((comp, self.eval(comp)))
        if any(isinstance(op, ast.Is | ast.IsNot | ast.In | ast.NotIn) for op in node.ops):
            return UNKNOWN
        return self._binary(node, operands, grad=False)

    def _eval_unary(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.UnaryOp)
        operand = self.eval(node.operand)
        if isinstance(node.op, ast.Not):
            return UNKNOWN
        if operand.kind in (Kind.TENSOR, Kind.PARAMETER, Kind.BATCH):
            return dataclasses.replace(operand, kind=_tensor_kind(operand), output=False)
        return UNKNOWN

    def _eval_ifexp(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.IfExp)
        self.eval(node.test)
        body, orelse = self.eval(node.body), self.eval(node.orelse)
        joined = join(body, orelse)
        omitted = self.when_omitted(node.test)
        if omitted is not None:
            return keep_default_side(joined, body if omitted[1] else orelse, omitted[0])
        return joined

    def _eval_boolop(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.BoolOp)
        values = [self.eval(v) for v in node.values]
        result = values[-1]
        for v in values[:-1]:
            result = join(result, v)
        return result

    def _eval_namedexpr(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.NamedExpr)
        value = self.eval(node.value)
        self._bind(node.target, value)
        return value

    def _eval_starred(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Starred)
        return self.eval(node.value)

    def _eval_lambda(self, node: ast.expr) -> Value:
        return UNKNOWN  # its body is another scope

    def _eval_await(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Await)
        self.eval(node.value)
        return UNKNOWN

    # -- iteration --------------------------------------------------------------------------
    @staticmethod
    def _sample(dataset: Value) -> Value:
        """One sample of a dataset (`test_data[0]`): on the CPU for the datasets we know."""
        if dataset.place is not Place.CPU or dataset.assumed:
            return UNKNOWN
        return Value(Kind.BATCH, Place.CPU, name=dataset.name, line=dataset.line, part=True)

    def _element(self, iterable: Value, node: ast.expr | None) -> Value:
        """What one iteration over `iterable` gives."""
        kind = iterable.kind
        if kind is Kind.DATASET:
            return self._sample(iterable)
        if kind is Kind.LOADER:
            return Value(
                Kind.BATCH,
                iterable.place,
                name=iterable.name or (self._text(node) if node is not None else ""),
                alias=iterable.alias,
                where=iterable.where,
                line=iterable.line,
                pinned=iterable.pinned,
                device=iterable.device,
                device_line=iterable.device_line,
            )
        if kind is Kind.CONTAINER:
            if iterable.element is not None:
                return iterable.element
            if iterable.items:
                joined = iterable.items[0]
                for item in iterable.items[1:]:
                    joined = join(joined, item)
                return joined
            return UNKNOWN
        if kind is Kind.PARAMETERS:
            return Value(
                Kind.PARAMETER,
                iterable.place,
                grad=True,
                name=f"parameter of `{iterable.name}`" if iterable.name else "",
                device=iterable.device,
                device_line=iterable.device_line,
            )
        if kind is Kind.BATCH:
            return dataclasses.replace(iterable, part=True)
        if kind is Kind.MODULE and iterable.cls in _MODULE_SEQUENCES:
            # `for head in self.heads` over an nn.ModuleList: its layers, wherever it is
            return dataclasses.replace(
                iterable, cls="", name=f"layer of `{iterable.name}`" if iterable.name else ""
            )
        if kind is Kind.TENSOR and iterable.place is not Place.UNKNOWN:
            return dataclasses.replace(iterable, scalar=False, output=False)
        if kind is Kind.UNKNOWN and node is not None and iterable.place is Place.UNKNOWN:
            name = dotted(node)
            if name is not None and _LOADERISH.search(name.rsplit(".", 1)[-1]):
                # an iterable named like a loader, of unknown make: its batches are
                # assumed to be on the CPU (rules ask for more evidence before using this)
                return Value(Kind.BATCH, Place.CPU, name=name, assumed=True)
        return UNKNOWN


def _numbers_only(elts: list[ast.expr]) -> bool:
    """Literal numbers (each evaluates to UNKNOWN; only strings and None carry facts).
    Any length but none: a generated table's rows are short (`(2, 8, 1, 4)`). (Exact
    classes: the parser makes no subclass of them; a table's rows are ~27,000 a file.)"""
    if not elts:
        return False
    for e in elts:
        if e.__class__ is not ast.Constant or e.value.__class__ not in _NUMBER_CLASSES:
            return False
    return True


_NUMBER_CLASSES = frozenset({int, float, complex, bool})


@functools.lru_cache(maxsize=64)
def _numbers_row(length: int) -> Value:
    """The value of a literal row of `length` numbers: one shared object per length
    (values are immutable), so a table's rows are neither built nor compared field by
    field when its dict joins them."""
    return Value(Kind.CONTAINER, UNKNOWN.place, items=(UNKNOWN,) * length, element=UNKNOWN)
