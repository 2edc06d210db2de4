"""Calls of well-known library functions: torch factories, modules, loaders, optimizers."""

from __future__ import annotations

import ast
import dataclasses
from typing import TYPE_CHECKING

from torchdoctor.check.analysis import distributions
from torchdoctor.check.analysis.collate import collate_keeps_place
from torchdoctor.check.analysis.scope_exprs import ScopeExprs
from torchdoctor.check.analysis.syntax import _is_zero, dotted
from torchdoctor.check.analysis.torch_api import (
    _MEETING_NAMESPACES,
    _NON_MEETING_TORCH,
    _NOT_OPTIMIZERS,
    _PASS_THROUGH_ITERATORS,
    DATA_PARALLEL,
    DEVICE_TOLERANT,
    IDENTITY_FUNCTIONS,
    LEGACY_CONSTRUCTORS,
    LIKE_FACTORIES,
    MODULE_RETURNING,
    NUMPY_ARRAY_FACTORIES,
    NUMPY_CONVERTING,
    NUMPY_CONVERTING_MODULES,
    OPTIMIZER_PREFIX,
    REDUCTIONS,
    is_cpu_name,
    is_factory_call,
    legacy_type_place,
)
from torchdoctor.check.analysis.values import UNKNOWN, Kind, Place, Value

if TYPE_CHECKING:
    pass


# Hugging Face calls given `return_tensors="pt"` that return one tensor (the others
# return a BatchEncoding/BatchFeature, a dict of tensors whose `.to()` moves it in place).
_TENSOR_RETURNING_ENCODERS = frozenset({"encode", "apply_chat_template"})
# Callables that take `return_tensors=` but return no tensors: they make a callable.
_NOT_ENCODING = frozenset({"partial", "pipeline"})

# NumPy factories whose first argument is the shape.
_SHAPED = frozenset({"zeros", "ones", "empty", "full"})


class ScopeLibrary(ScopeExprs):
    """What calls of torch and its ecosystem return."""

    # -- known functions -------------------------------------------------------------------
    def _known_function(
        self,
        node: ast.Call,
        qual: str,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> Value | None:
        last = qual.rsplit(".", 1)[-1]
        if qual in IDENTITY_FUNCTIONS:
            return args[0] if args and args[0] is not UNKNOWN else None
        if qual in MODULE_RETURNING:
            return args[0] if args and args[0].kind is Kind.MODULE else None
        if qual.startswith("torch."):
            return self._torch_function(node, qual, last, args, keywords)
        if qual.startswith(NUMPY_CONVERTING_MODULES):
            # `sklearn.metrics.accuracy_score(y_true, y_pred)`: NumPy converts the arguments
            for arg_node, value in [
                *zip(node.args, args, strict=False),
                *((kw.value, v) for kw, (_, v) in zip(node.keywords, keywords, strict=False)),
            ]:
                self._converted(node, arg_node, value, f"`{qual}`")
            return None
        if qual.startswith("numpy.") and qual.count(".") == 1:
            if last in NUMPY_CONVERTING:
                for arg_node, value in zip(node.args, args, strict=False):
                    self._converted(node, arg_node, value, f"`{qual}`")
            if last in NUMPY_ARRAY_FACTORIES or last in NUMPY_CONVERTING:
                shape = node.args[0] if node.args and last in _SHAPED else None
                ndim = len(shape.elts) if isinstance(shape, ast.Tuple | ast.List) else 0
                if isinstance(shape, ast.Constant) and isinstance(shape.value, int):
                    ndim = 1
                return Value(Kind.ARRAY, line=node.lineno, source=node, ndim=ndim)
        if last in _PASS_THROUGH_ITERATORS and args:
            return args[0] if args[0].kind is not Kind.UNKNOWN else None
        if qual == "enumerate" and args:
            element = self._element(args[0], node.args[0])
            return Value(Kind.CONTAINER, element=Value(Kind.CONTAINER, items=(UNKNOWN, element)))
        if qual == "zip" and args and not any(isinstance(a, ast.Starred) for a in node.args):
            items = tuple(self._element(v, n) for v, n in zip(args, node.args, strict=False))
            return Value(Kind.CONTAINER, element=Value(Kind.CONTAINER, items=items))
        if qual == "next" and args:
            return self._element(args[0], node.args[0])
        if qual in ("list", "tuple", "sorted", "reversed", "set") and len(args) == 1:
            arg = args[0]
            if arg.kind is Kind.CONTAINER:
                return arg
            if arg.kind is Kind.PARAMETERS:
                return Value(Kind.CONTAINER, element=self._element(arg, None))
            return None
        if last == "DataLoader" and (qual == "DataLoader" or qual.startswith("torch_geometric.")):
            return self._data_loader(node, args, keywords)
        if self._is_module_class(qual):
            return self._construct_module(node, qual, keywords)
        vision = qual.startswith("torchvision.datasets.") and last[:1].isupper()
        if vision or (last.endswith("Dataset") and last[:1].isupper()):
            # samples are CPU tensors, unless the dataset's class moves them itself
            moving = last in getattr(self.ff.project, "moving_classes", ()) or any(
                kw.arg in ("device", None) for kw in node.keywords
            )
            place = Place.UNKNOWN if moving else Place.CPU
            return Value(Kind.DATASET, place, cls=last, assumed=moving, line=node.lineno)
        if last.startswith("Auto") and "Model" in qual and ".from_pretrained" in f".{qual}":
            return Value(Kind.MODULE, name="", cls=last, line=node.lineno, source=node, fresh=True)
        if last == "from_pretrained" and self._is_module_class(qual[: -len(".from_pretrained")]):
            # `Reader.from_pretrained(path)` of a module class (the project's, a library's):
            # an instance of it, loaded where `device_map=` says (on the CPU without one)
            if any(kw.arg in ("device_map", None) for kw in node.keywords):
                return None
            owner = qual[: -len(".from_pretrained")].rsplit(".", 1)[-1]
            return Value(Kind.MODULE, cls=owner, line=node.lineno, source=node, fresh=True)
        if qual.startswith("timm.") and last == "create_model":
            return Value(Kind.MODULE, cls="timm", line=node.lineno, source=node, fresh=True)
        if qual.startswith("torchvision.models.") and last[:1].islower():
            return Value(Kind.MODULE, cls=last, line=node.lineno, source=node, fresh=True)
        return None

    def _encoded(self, node: ast.Call) -> Value | None:
        """`tokenizer(texts, return_tensors="pt")`, `processor(images=..., return_tensors="pt")`,
        `tokenizer.encode(text, return_tensors="pt")`: tensors made on the CPU."""
        if not any(
            kw.arg == "return_tensors"
            and isinstance(kw.value, ast.Constant)
            and kw.value.value == "pt"
            for kw in node.keywords
        ):
            return None
        func = node.func
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if not last or last[:1].isupper() or last in _NOT_ENCODING:
            return None  # `DataCollatorWithPadding(tok, return_tensors="pt")` makes a collator
        one_tensor = last in _TENSOR_RETURNING_ENCODERS and not any(
            kw.arg == "return_dict"
            and not (isinstance(kw.value, ast.Constant) and not kw.value.value)
            for kw in node.keywords
        )
        return Value(
            Kind.BATCH,
            Place.CPU,
            name=f"{self._text(func)}(...)",
            line=node.lineno,
            source=node,
            part=one_tensor,
            moves_in_place=not one_tensor,
        )

    def _is_module_class(self, qual: str) -> bool:
        if qual.startswith("torch.") and not (
            (qual.startswith("torch.nn.") and qual.count(".") == 2)
            # where a layer is defined: `from torch.nn.modules.rnn import LSTMCell`
            or (qual.startswith("torch.nn.modules.") and qual.count(".") == 4)
        ):
            return False  # torch.nn.utils..., torch.optim...: not layers
        return self.ff.is_module_class_name(qual)

    def _construct_module(
        self, node: ast.Call, qual: str, keywords: list[tuple[str | None, Value]]
    ) -> Value:
        last = qual.rsplit(".", 1)[-1]
        if qual in DATA_PARALLEL or last in ("DataParallel", "DistributedDataParallel"):
            inner = self.value(node.args[0]) if node.args else UNKNOWN
            if inner is UNKNOWN and node.args:
                inner = self._peek(node.args[0])
            return dataclasses.replace(
                inner if inner.kind is Kind.MODULE else Value(Kind.MODULE),
                wrapper=last,
                source=node,
                name="",
            )
        place = Place.UNKNOWN
        device = ""
        maybe = False
        for kw in node.keywords:
            if kw.arg == "device":
                target = self.device_target(kw.value)
                if target is not None:
                    place, device = target
        moves_itself = getattr(self.ff.project, "self_moving", {}).get(last)
        if place is Place.UNKNOWN and moves_itself is not None:
            # a project class whose `__init__` runs `self.cuda()`: built on the GPU
            place, device, maybe = Place.DEVICE, "cuda", moves_itself
        return Value(
            Kind.MODULE,
            place,
            cls=last,
            line=node.lineno,
            source=node,
            fresh=place is Place.UNKNOWN,
            device=device,
            device_line=node.lineno if device else 0,
            maybe=maybe,
        )

    def _data_loader(
        self,
        node: ast.Call,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> Value:
        dataset = args[0] if args else UNKNOWN
        pinned: bool | None = False
        place = Place.CPU
        for kw in node.keywords:
            if kw.arg is None:
                pinned = None
                place = Place.UNKNOWN
            elif kw.arg == "dataset":
                dataset = self.value(kw.value)
            elif kw.arg == "pin_memory":
                value = kw.value
                given = value.value if isinstance(value, ast.Constant) else None
                pinned = given if isinstance(given, bool) else None
            elif kw.arg == "collate_fn" and not collate_keeps_place(self.ff, kw.value):
                place = Place.UNKNOWN  # a collate function may move the batch
        if dataset.place is not Place.UNKNOWN:
            place = dataset.place
        elif dataset.kind is Kind.DATASET and dataset.assumed:
            place = Place.UNKNOWN
        return Value(Kind.LOADER, place, line=node.lineno, pinned=pinned, source=node)

    def _torch_function(
        self,
        node: ast.Call,
        qual: str,
        last: str,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> Value | None:
        if qual.count(".") == 1 and is_factory_call(node, last):
            return self._factory(node, qual, last)
        if qual.startswith("torch.distributions."):
            return self._distribution_function(node, last, args, keywords)
        if qual.count(".") == 1 and last in LEGACY_CONSTRUCTORS:
            # `torch.FloatTensor([n])`: on the CPU, whatever the arguments
            return Value(Kind.TENSOR, Place.CPU, name=qual, line=node.lineno, source=node)
        if qual.startswith("torch.cuda.") and legacy_type_place(qual) is Place.DEVICE:
            # `torch.cuda.FloatTensor(n)`: a new tensor on the GPU
            device = '"cuda"'
            return Value(Kind.TENSOR, Place.DEVICE, name=qual, line=node.lineno, device=device)
        if qual.count(".") == 1 and last in LIKE_FACTORIES:
            base = args[0] if args else UNKNOWN
            for kw in node.keywords:
                if kw.arg == "device":
                    target = self.device_target(kw.value)
                    if target is not None:
                        return Value(Kind.TENSOR, target[0], device=target[1], source=node)
            if base.place is Place.UNKNOWN:
                return Value(Kind.TENSOR)
            return Value(
                Kind.TENSOR,
                base.place,
                name=base.name,
                device=base.device,
                device_line=base.device_line,
                assumed=base.assumed,
                is_input=base.is_input,
            )
        if qual == "torch.device":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and is_cpu_name(first.value):
                return Value(Kind.DEVICE, Place.CPU, line=node.lineno)
            return Value(Kind.DEVICE, Place.DEVICE, line=node.lineno, device=self._text(node))
        if qual in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            data = args[0] if args else UNKNOWN
            # `nn.Parameter(t, requires_grad=False)`: a frozen buffer-like parameter
            flag = node.args[1] if len(node.args) > 1 else None
            for kw in node.keywords:
                if kw.arg == "requires_grad":
                    flag = kw.value
            frozen = isinstance(flag, ast.Constant) and flag.value is False
            return Value(
                Kind.PARAMETER,
                data.place,
                grad=not frozen,
                line=node.lineno,
                source=node,
                device=data.device,
                assumed=data.assumed,
            )
        if qual.startswith(OPTIMIZER_PREFIX) and last[:1].isupper():
            if last not in _NOT_OPTIMIZERS and ".lr_scheduler." not in qual:
                self._optimizer_built(node)
                return Value(Kind.OPTIMIZER, line=node.lineno, source=node)
            return None
        if qual == "torch.utils.data.DataLoader":
            return self._data_loader(node, args, keywords)
        if qual == "torch.utils.data.TensorDataset":
            return self._tensor_dataset(args)
        if self._is_module_class(qual) or qual in DATA_PARALLEL:
            return self._construct_module(node, qual, keywords)
        # (private ops such as `torch._nested_view_from_buffer` take CPU metadata tensors)
        public = qual.count(".") == 1 and not last.startswith("_")
        meets = (public and last not in _NON_MEETING_TORCH) or qual.startswith(_MEETING_NAMESPACES)
        if not meets:
            return None
        operands: list[tuple[ast.expr, Value]] = []
        tolerant = DEVICE_TOLERANT.get(qual.removeprefix("torch."), frozenset())
        for position, (arg_node, value) in enumerate(zip(node.args, args, strict=False)):
            if position in tolerant:
                continue  # `F.ctc_loss(log_probs, cpu_targets, ...)`: taken from any device
            if isinstance(arg_node, ast.List | ast.Tuple):
                for elt in arg_node.elts:
                    item = self.value(elt) if self._recording else UNKNOWN
                    if item is UNKNOWN:
                        item = self._peek(elt)
                    if item.tensor_like:
                        operands.append((elt, item))
            elif value.tensor_like:
                operands.append((arg_node, value))
            elif value.kind is Kind.CONTAINER and value.element and value.element.tensor_like:
                operands.append((arg_node, value.element))
        for kw, (_, value) in zip(node.keywords, keywords, strict=False):
            if value.tensor_like:
                operands.append((kw.value, value))
        if len(operands) > 1:
            self._meet(node, operands, "torch")
        if not operands:
            return None
        result = self._combined([v for _, v in operands])
        if result is not UNKNOWN and result.place is Place.CPU:
            cpu_sources = [v.source for _, v in operands if v.source is not None]
            if cpu_sources:
                result = dataclasses.replace(result, source=cpu_sources[0])
        if last in REDUCTIONS and result is not UNKNOWN:
            no_dim = len(node.args) < 2 and not any(k.arg == "dim" for k in node.keywords)
            result = dataclasses.replace(result, scalar=no_dim)
        return result

    def _distribution_function(
        self,
        node: ast.Call,
        last: str,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> Value | None:
        """`Normal(mu, sigma)`: an object where its parameters are; `kl_divergence(p, q)`:
        the parameters of both meet (analysis/distributions.py)."""
        if last in distributions.CLASSES:
            operands = distributions.parameters(node, args, keywords)
            combined = self._combined([v for _, v in operands]) if operands else UNKNOWN
            return None if combined is UNKNOWN else distributions.distribution(combined)
        if last not in distributions.MEETING_FUNCTIONS:
            return None
        held = [
            (arg_node, distributions.as_tensor(value))
            for arg_node, value in zip(node.args, args, strict=False)
            if value.kind is Kind.DISTRIBUTION
        ]
        if len(held) > 1:
            self._meet(node, held, "torch")
        if not held or len(held) != len(node.args):
            return None
        combined = self._combined([v for _, v in held])
        return None if combined is UNKNOWN else dataclasses.replace(combined, scalar=False)

    def _distribution_method(
        self, node: ast.Call, func: ast.Attribute, recv: Value, args: list[Value]
    ) -> Value | None:
        """`d.log_prob(x)`: the parameters meet `x`; `d.sample()`: a tensor where they are."""
        method = func.attr
        if method in distributions.TENSOR_RESULTS:
            return None if recv.place is Place.UNKNOWN else distributions.result(recv)
        if method not in distributions.MEETING_METHODS:
            return None
        operands = [(func.value, distributions.as_tensor(recv))]
        operands += [(n, v) for n, v in zip(node.args, args, strict=False) if v.tensor_like]
        if len(operands) > 1:
            self._meet(node, operands, "method")
        if len(operands) != len(node.args) + 1:
            return None
        combined = self._combined([v for _, v in operands])
        return None if combined is UNKNOWN else dataclasses.replace(combined, scalar=False)

    def _factory(self, node: ast.Call, qual: str, last: str) -> Value:
        place = Place.UNKNOWN if self._default_device else Place.CPU
        device = ""
        grad = False
        for kw in node.keywords:
            if kw.arg == "device":
                target = self.device_target(kw.value)
                if target is None:
                    place = Place.UNKNOWN
                else:
                    place, device = target
            elif kw.arg == "requires_grad":
                grad = isinstance(kw.value, ast.Constant) and kw.value.value is True
            elif kw.arg is None:
                place = Place.UNKNOWN
        source: ast.AST = node
        name, line = qual, node.lineno
        if place is Place.CPU and device:
            origin = self._device_origin(node)
            if origin is not None:  # on the CPU because that tensor is: the CPU side's origin
                source, name, line = origin.source, origin.name, origin.line  # type: ignore[assignment]
        scalar = False
        if last in ("tensor", "as_tensor", "scalar_tensor"):
            data = node.args[0] if node.args else None
            if last == "scalar_tensor":
                scalar = True
            elif isinstance(data, ast.List | ast.Tuple) and not data.elts:
                # torch.tensor([]): an empty 1-d tensor, no 0-dim scalar: `torch.cat` of it
                # with tensors on another device fails (no tensor is skipped from that check)
                scalar = False
            elif not isinstance(data, ast.List | ast.Tuple | ast.ListComp):
                held = self.value(data) if data is not None and self._recording else UNKNOWN
                if held is UNKNOWN and data is not None:
                    held = self._peek(data)
                if held.kind in (Kind.TENSOR, Kind.PARAMETER, Kind.BATCH):
                    if "device" not in {k.arg for k in node.keywords}:
                        place = held.place
                    scalar = held.scalar
                elif held.kind is not Kind.CONTAINER and held.kind is not Kind.ARRAY:
                    scalar = True  # a number, or not known to be a sequence
        elif node.args and last in ("zeros", "ones", "empty", "full", "rand", "randn"):
            shape = node.args[0]
            if isinstance(shape, ast.Tuple | ast.List):
                # shape (): 0-dim; shape [0]: an empty placeholder, never computed with
                scalar = not shape.elts or (
                    len(shape.elts) == 1 and _is_zero(shape.elts[0]) and len(node.args) == 1
                )
            elif _is_zero(shape) and len(node.args) == 1:
                scalar = True
        return Value(
            Kind.TENSOR,
            place,
            name=name,
            line=line,
            device=device,
            device_line=node.lineno if device else 0,
            grad=grad,
            scalar=scalar,
            source=source,
        )

    def _device_origin(self, node: ast.Call) -> Value | None:
        """The CPU tensor `t` of a factory's `device=t.device` (made where it was made)."""
        for kw in node.keywords:
            if kw.arg == "device" and isinstance(kw.value, ast.Attribute):
                if kw.value.attr != "device":
                    return None
                held = self._peek(kw.value.value)
                if held.kind is Kind.TENSOR and held.place is Place.CPU and held.source is not None:
                    return held
        return None

    def _tensor_dataset(self, args: list[Value]) -> Value:
        places = {a.place for a in args}
        if Place.DEVICE in places:
            return Value(Kind.DATASET, Place.DEVICE)
        if places == {Place.CPU}:
            return Value(Kind.DATASET, Place.CPU)
        return Value(Kind.DATASET)

    def _optimizer_built(self, node: ast.Call) -> None:
        """Mark each `model` whose `model.parameters()` feeds this optimizer."""
        if self.env is None:
            return
        for sub in _every_path_parts(node):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in ("parameters", "named_parameters")
            ):
                key = dotted(sub.func.value)
                if key is None:
                    continue
                # `model.classifier.parameters()`: the optimizer depends on `model` too,
                # which is what gets moved (updated in place: its attribute facts stay)
                for name in dict.fromkeys((key, key.split(".", 1)[0])):
                    held = self.env.get(name)
                    if held is not None and held.kind is Kind.MODULE and held.optimizer is None:
                        self.env[name] = dataclasses.replace(held, optimizer=node)


def _every_path_parts(node: ast.AST) -> list[ast.AST]:
    """The parts of `node` every evaluation of it runs: a conditional expression's
    test, not its branches (`a.parameters() if train_a else b.parameters()` takes
    `a`'s parameters on one path only)."""
    found: list[ast.AST] = []
    todo = [node]
    while todo:
        current = todo.pop()
        found.append(current)
        if isinstance(current, ast.IfExp):
            todo.append(current.test)
        else:
            todo.extend(ast.iter_child_nodes(current))
    return found
