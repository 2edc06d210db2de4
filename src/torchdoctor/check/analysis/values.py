"""Values and places: what an expression holds (the lattice the scope interpreter computes)."""

from __future__ import annotations

import ast
import dataclasses
import enum
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef


ScopeNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Module


class Kind(enum.Enum):
    """What sort of thing a value is."""

    UNKNOWN = "unknown"
    MODULE = "module"  # an nn.Module instance
    TENSOR = "tensor"
    PARAMETER = "parameter"  # an nn.Parameter: a tensor that requires grad
    BATCH = "batch"  # a batch from a data loader, or a part of one
    LOADER = "loader"  # a DataLoader (an iterable of batches)
    DATASET = "dataset"
    PARAMETERS = "parameters"  # model.parameters(): iterating gives parameters
    DEVICE = "device"  # a torch.device or a device string
    ARRAY = "array"  # a NumPy array
    OPTIMIZER = "optimizer"
    CONTAINER = "container"  # a list/tuple/dict/iterator: see Value.element and Value.items
    NONE = "none"  # the constant None
    # an instance of a plain (not nn.Module) class of this file (`cls`): its methods are
    # the file's functions, `obj.m(...)` runs them
    OBJECT = "object"
    # a legacy tensor type (`torch.FloatTensor`, `torch.cuda.FloatTensor`): `x.type(T)` and
    # `T(...)` put a tensor where it says; UNKNOWN place when chosen at run time between the
    # CPU and a device (`torch.cuda.FloatTensor if cuda else torch.FloatTensor`)
    TENSOR_TYPE = "tensor type"
    # a torch.distributions object: where its parameter tensors are (`Normal(mu, sigma)`);
    # its methods combine them with their arguments (`log_prob(x)`, `kl_divergence(p, q)`)
    DISTRIBUTION = "distribution"
    # a plain class another file of the project defines (`where`: that file), held by a
    # name (`agent = RNDAgent`); calling it gives an OBJECT whose methods are that file's
    CLASS = "class"


class Place(enum.Enum):
    """Where a tensor (or a module's parameters) lives."""

    UNKNOWN = "unknown"
    CPU = "cpu"
    DEVICE = "device"  # on the target device, whatever `device` is at run time


@dataclass(frozen=True, slots=True)
class Value:
    """What an expression holds at one point of a scope. Immutable; compare with ==."""

    kind: Kind = Kind.UNKNOWN
    place: Place = Place.UNKNOWN
    # Where it came from, as written: the loader a batch was drawn from, the variable a
    # module was bound to, the factory that made a tensor ("torch.zeros").
    name: str = ""
    line: int = 0  # the line where it came from (loader built, tensor made, module built)
    alias: str = ""  # for seeded parameters: the caller's name for it ("val_loader")
    where: str = ""  # for facts from another file: that file's name ("train.py")
    device: str = ""  # the device expression of the move that put it there ("device")
    device_line: int = 0  # the line of that move
    grad: bool = False  # may require grad (a parameter, or computed from one outside no_grad)
    part: bool = False  # BATCH: taken out of a batch (unpacked, indexed): a tensor in practice
    assumed: bool = False  # the place is inferred, not proven (see Place notes in rules)
    maybe: bool = False  # DEVICE on some paths only (`if use_cuda: model.cuda()`), CPU on others
    is_input: bool = False  # an argument of `forward`, or a parameter/submodule of `self`
    output: bool = False  # TENSOR: the output of a module call
    scalar: bool = False  # TENSOR: 0-dim (mixes with tensors on any device)
    ndim: int = 0  # ARRAY: its number of dimensions, when the shape is written out (0: unknown)
    fresh: bool = False  # MODULE: constructed here, not yet moved nor registered on `self`
    # MODULE: known only from an in-place `.to()` (pipelines and graph batches have one too):
    # calling it gives an output of unknown kind and place
    guessed: bool = False
    pinned: bool | None = None  # LOADER/BATCH: pin_memory=True given (None: not known)
    dropped_line: int = 0  # a `.to(...)` of this value whose result was dropped
    # BATCH: a structure whose `.to()` moves it in place and returns it (a tokenizer's
    # BatchEncoding, a processor's BatchFeature); its parts are plain tensors
    moves_in_place: bool = False
    cls: str = ""  # MODULE, OBJECT: the class it was built from
    wrapper: str = ""  # MODULE: "DataParallel" / "DistributedDataParallel" when wrapped
    source: ast.AST | None = None  # the call that made it (a factory, a constructor)
    optimizer: ast.Call | None = None  # MODULE: an optimizer built from its parameters
    items: tuple[Value, ...] | None = None  # CONTAINER: known elements (a tuple display)
    element: Value | None = None  # CONTAINER: what iterating it gives (None: empty so far)
    # on this path only where the caller leaves out this parameter (its default None):
    # `if h is None: h = torch.zeros(n)` (analysis/default_path.py)
    default_of: str = ""
    # OBJECT: the CPU tensors its construction here stored on it (`Edge(torch.zeros(n))`
    # keeps `self.vec`), by attribute: its methods run with them (scope_objects.py)
    state: tuple[tuple[str, Value], ...] = ()

    @property
    def tensor_like(self) -> bool:
        """A tensor (or batch part) whose place is known."""
        return self.place is not Place.UNKNOWN and self.kind in _TENSOR_KINDS

    def describe_origin(self) -> str:
        """`val_loader` (line 30), for messages."""
        text = f"`{self.name}`" if self.name else "a loader"
        if self.alias and self.alias != self.name:
            text += f" (`{self.alias}`"
            text += f", {self.where_line(self.line)})" if self.line else ")"
        elif self.line:
            text += f" ({self.where_line(self.line)})"
        return text

    def where_line(self, line: int) -> str:
        return f"{self.where} line {line}" if self.where else f"line {line}"


UNKNOWN = Value()


NONE = Value(Kind.NONE)


_TENSOR_KINDS = frozenset({Kind.TENSOR, Kind.PARAMETER, Kind.BATCH, Kind.UNKNOWN})


_FIELDS = tuple(f.name for f in dataclasses.fields(Value))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Value)}


def join(a: Value, b: Value) -> Value:
    """What is true of a value that is `a` on one path and `b` on another."""
    if a is b or a == b:
        return a
    if a.kind is not b.kind:
        return UNKNOWN
    changes: dict[str, object] = {}
    for name in _FIELDS:
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            changes[name] = _DEFAULTS[name]
    if "grad" in changes:
        changes["grad"] = True  # may require grad on some path
    if "guessed" in changes:
        changes["guessed"] = True  # a module on some paths only by the guess
    if "default_of" in changes:
        if a.default_of and b.default_of:
            changes["place"] = Place.UNKNOWN  # each on the CPU on another path only
        else:  # on the CPU on every path, or where the caller leaves the parameter out
            changes["default_of"] = a.default_of or b.default_of
    if "place" in changes:
        device_side = a if a.place is Place.DEVICE else b if b.place is Place.DEVICE else None
        other = b if device_side is a else a
        # a module moved on one path only (`if use_cuda: model.cuda()`): on the device on
        # that path, which crashes against a batch that is on the CPU on every path.
        # (Tensors do not get this: `x.cpu()` under the same condition is too common.)
        if (
            device_side is not None
            and a.kind is Kind.MODULE
            and (other.place is Place.CPU or other.fresh)
        ):
            for name in ("place", "device", "device_line", "assumed", "is_input", "output"):
                changes[name] = getattr(device_side, name)
            changes["maybe"] = True
            changes["fresh"] = False
    if "element" in changes:
        # an empty container (element None) joined with a filled one keeps the filling
        if a.element is None or b.element is None:
            changes["element"] = a.element or b.element
        else:
            changes["element"] = join(a.element, b.element)
    if "items" in changes and a.items and b.items and len(a.items) == len(b.items):
        changes["items"] = tuple(join(x, y) for x, y in zip(a.items, b.items, strict=False))
    return dataclasses.replace(a, **changes)  # type: ignore[arg-type]


Env = dict[str, Value]


def join_env(
    a: Env | None, b: Env | None, unbound: Callable[[str], bool] | None = None
) -> Env | None:
    """Join two environments; None is a dead path (after return/raise/break).

    A key one side lacks is unknown there, unless `unbound(key)`: not bound at all on
    that path, where using it raises; then the other side's value is what every use
    that runs sees (analysis/unbound.py)."""
    if a is None:
        return None if b is None else dict(b)
    if b is None:
        return dict(a)
    out: Env = {}
    if unbound is not None:
        for key, only_b in b.items():
            if key not in a and unbound(key):
                out[key] = only_b
    for key, va in a.items():
        vb = b.get(key)
        if vb is None:
            if unbound is not None and unbound(key):
                out[key] = va
            continue
        joined = join(va, vb)
        if joined.kind is not Kind.UNKNOWN or joined.place is not Place.UNKNOWN:
            out[key] = joined
    return out


@dataclass(frozen=True)
class Mismatch:
    """A value on the CPU meets a value on the device at `site`."""

    site: ast.AST  # the BinOp / Compare / Call where they meet
    cpu_node: ast.expr
    cpu: Value
    other_node: ast.expr
    other: Value
    via: str  # "module" (a module call), "torch" (a torch function), "method", "operator",
    # "call" (a function of this file combines the two arguments)
    path: str = ""  # for "call": where, inside the callee, they meet
    callee: ast.AST | None = None  # for "call": the function they meet in
    inner: Mismatch | None = None  # for "call": the meeting inside the callee
    later: bool = False  # met on a loop's second iteration (a value the first one rebinds)
    # for "call": the caller's `self.x` that carried the CPU tensor in (not an argument)
    attribute: str = ""

    def innermost(self) -> Mismatch:
        """The meeting itself, through the calls that lead to it."""
        deepest = self
        while deepest.inner is not None:
            deepest = deepest.inner
        return deepest


@dataclass(frozen=True)
class CallFacts:
    """What one call of a function of the file does, given what it passes."""

    returned: Value
    mismatches: tuple[Mismatch, ...]
    # for a method followed with its caller's `self` attributes: `self.x` as it leaves them
    writes: tuple[tuple[str, Value], ...] = ()


@dataclass(frozen=True)
class Conversion:
    """A tensor converted to NumPy implicitly (through `__array__`, that is `.numpy()`)."""

    site: ast.AST  # the call (`np.isnan(t)`) or the assignment target (`arr[i]`)
    node: ast.expr  # the tensor's expression (the target, for an assignment)
    value: Value  # what it held
    how: str  # "`numpy.isnan`", "an assignment into a NumPy array"


@dataclass(frozen=True)
class Move:
    """A `.to(...)` / `.cuda()` / `.cpu()` call."""

    call: ast.Call
    receiver: ast.expr
    before: Value
    after: Value
    dropped: bool  # the result was not used (an expression statement)
    dtype_only: bool = False  # `.to(torch.float16)`: a conversion, not a move


@dataclass(frozen=True)
class CallSite:
    """A call of a function or method of this file: the values of its arguments."""

    callee: str  # "evaluate", or "self.helper" for a method of the same class
    call: ast.Call
    args: tuple[Value, ...]
    keywords: tuple[tuple[str, Value], ...]
    opaque: bool  # *args or **kwargs: the argument positions are not known
    # the object a method of another file's module class is called on (`model.read(x)`)
    receiver: Value | None = None


def _tensor_kind(value: Value) -> Kind:
    return Kind.BATCH if value.kind is Kind.BATCH else Kind.TENSOR


def _container_add(container: Value, other: Value) -> Value:
    """A container after `+=`, `.append`, `.extend` with `other` (a container)."""
    element = container.element
    added = other.element if other.kind is Kind.CONTAINER else None
    if added is None and other.kind is Kind.CONTAINER and other.items:
        added = other.items[0]
        for item in other.items[1:]:
            added = join(added, item)
    if element is None:
        element = added
    elif added is not None:
        element = join(element, added)
    return Value(Kind.CONTAINER, element.place if element else Place.UNKNOWN, element=element)


def _as_parameter(param: str, value: Value) -> Value:
    """A caller's loader seen inside the callee: named as the parameter, alias the caller's."""
    if value.kind is Kind.LOADER and value.name and value.name != param:
        return dataclasses.replace(value, name=param, alias=value.alias or value.name)
    return value


def _join_seeds(a: dict[str, Value], b: dict[str, Value]) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for key in a.keys() | b.keys():
        out[key] = join(a.get(key, UNKNOWN), b.get(key, UNKNOWN))
    return out


# -- models wrapped in DataParallel/DDP (analysis/wraps.py), portable across files --
@dataclass(frozen=True)
class Wrap:
    key: str  # the name (or `self.` attribute) that holds the wrapper
    line: int  # where the name is bound to it
    wrapper: str  # "DataParallel" / "DistributedDataParallel"
    via: str = ""  # the function whose result it is (`load_model`), if not built here
    origin: int = 0  # the line of the wrapper's construction (in `via`, if one)

    def describe(self, where: str = "") -> str:
        """`DataParallel` (line 85, returned by `load_model`), for messages."""
        text = f"`{self.wrapper}` ({where + ' ' if where else ''}line {self.origin or self.line}"
        return text + (f", returned by `{self.via}`)" if self.via else ")")


@dataclass(frozen=True)
class Passed:
    """A wrapped model handed to a function's parameter by a call."""

    wrap: Wrap
    caller: str  # the calling function's name
    line: int  # the call's line
    where: str = ""  # the caller's file, when another one


# -- what a function returns, judged from its own code (FileFlow.returned_tensor) --
def built_loaders(value: Value) -> bool:
    """A loader with a known place, or a tuple of them (what a data helper returns)."""
    if value.kind is Kind.LOADER:
        return value.place is not Place.UNKNOWN and not value.assumed
    items = value.items if value.kind is Kind.CONTAINER else None
    return bool(items) and all(built_loaders(item) for item in items or ())


def moved_whatever_given(value: Value, func: AnyFunction) -> bool:
    """A tensor on the device however `func` is called: analysed with its parameters
    unknown, and the device it names is not one of them (`x.to(device)` with `device`
    a parameter may be the CPU; `self.device` is the object's own)."""
    if value.kind is not Kind.TENSOR or value.place is not Place.DEVICE:
        return False
    if value.assumed or value.maybe or value.is_input or not value.device:
        return False
    root = re.split(r"[.(\[]", value.device, maxsplit=1)[0].strip()
    params = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
    names = {p.arg for p in params}
    if params and params[0].arg == "self":
        names.discard("self")
    return root not in names


def proven_module(value: Value) -> bool:
    """A module the code shows on the device on every path (moved there, not assumed)."""
    return (
        value.kind is Kind.MODULE
        and value.place is Place.DEVICE
        and not (value.assumed or value.maybe or value.is_input or value.guessed)
    )


def sent_from(value: Value, path: str) -> Value:
    """`value` as a fact sent to another file: named by the file it comes from, without
    the nodes and element values that belong to this file's analysis."""
    return dataclasses.replace(
        value,
        where=value.where or os.path.basename(path),
        source=None,
        optimizer=None,
        items=None,
        element=None,
    )


def on_proven_self(seeds: Env, me: str, module: Value) -> Env:
    """A method's `self.x` seeds when its caller proved `self` (`module`) on the device:
    the registered submodules and parameters, assumed there, are there for sure."""
    prefix = f"{me}."
    return {
        key: dataclasses.replace(
            value,
            assumed=False,
            is_input=False,
            device=module.device,
            device_line=module.device_line,
            where=module.where,
        )
        for key, value in seeds.items()
        if key.startswith(prefix)
        and value.kind in (Kind.MODULE, Kind.PARAMETER)
        and value.place is Place.DEVICE
        and value.assumed
    }


def informative(value: Value, depth: int = 2) -> bool:
    """Whether a passed value tells the callee something: a known place, a loader, or a
    container of such (`enumerate(loader)` handed to a progress-bar helper that returns
    it, or `tqdm(it)` of it)."""
    if value.place is not Place.UNKNOWN or value.kind is Kind.LOADER:
        return True
    if value.kind is not Kind.CONTAINER or depth == 0:
        return False
    inside = (*(value.items or ()), *((value.element,) if value.element is not None else ()))
    return any(informative(v, depth - 1) for v in inside)


def one_of(value: Value, passed: list[Value]) -> bool:
    """Whether `value` is one of the values `passed` (the same value, or from the same
    node of the caller's code)."""
    return value is not UNKNOWN and any(
        value == p or (value.source is not None and value.source is p.source) for p in passed
    )


def renamed(value: Value, old: str, new: str) -> Value:
    """`value` with the expressions `old.x` it names (its device, its origin) written
    `new.x` (also inside a tuple or list it is)."""
    changes: dict[str, object] = {}
    if value.device.startswith(old + "."):
        changes["device"] = new + value.device[len(old) :]
    if f"`{old}." in value.name:
        changes["name"] = value.name.replace(f"`{old}.", f"`{new}.")
    if value.items:
        changes["items"] = tuple(renamed(v, old, new) for v in value.items)
    if value.element is not None:
        changes["element"] = renamed(value.element, old, new)
    return dataclasses.replace(value, **changes) if changes else value  # type: ignore[arg-type]
