"""Per-function dataflow facts for the static rules: what each name holds.

A rule asks for the facts of one scope (a function, or a file's module-level
code) and then asks what any expression in it held at that point:

    from torchdoctor.check import flow

    ff = flow.file_flow(self.ctx)             # one per checked file, shared by all rules
    for func in ff.functions():               # every def in the file (methods, nested defs)
        if not ff.mentions(func, ".numpy("):  # cheap text gate: analyse relevant code only
            continue
        scope = ff.scope(func)                # analysed on first request, then cached
        for call in scope.method_calls("numpy"):
            held = scope.value(call.func.value)   # a Value: what the receiver held there
            if held.place is flow.Place.DEVICE: ...

A `Value` says what an expression holds: its `Kind` (module, tensor, batch from a
loader, loader, parameters, device, ...), its `Place` (on the CPU, on the target
device, unknown), and where that came from (the loader's name and line, the
line of the `.to(device)` that moved it, the factory call that made it).

The analysis is flow-sensitive over assignments, tuple unpacking, `for` and
`while` loops (run to a fixpoint), `if`/`try`/`with`/`match`, comprehensions,
early `return`/`raise` and `break`/`continue`. Where two paths meet, a value
keeps only what both paths agree on. Anything not understood is UNKNOWN, and
rules stay quiet on UNKNOWN: the facts are meant to be *proofs*, not guesses.

Besides values, each scope records:
- `mismatches`: places where a value on the CPU meets a value on the device
  (a binary operation, a torch function, a module call, a tensor method);
- `moves`: every `.to(...)`, `.cuda()`, `.cpu()` with the value before and after;
- `calls`: calls of functions of this file (used to seed parameters).

Parameters are seeded from the call sites of the function in the same file
(and, through the project index, from other files): `evaluate(model, loader)`
called as `evaluate(model, val_loader)` after `model.to(device)` knows that its
`model` is on the device and its `loader` is a DataLoader. Methods of an
`nn.Module` see the submodules, parameters and buffers made in `__init__` as
being on the module's device, and `forward` sees its tensor arguments there too.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import enum
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchdoctor.check.context import child_statements, iter_children, offsets, walk
from torchdoctor.check.project import KNOWN_MODULE_BASES

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext
    from torchdoctor.check.project import ProjectIndex

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
    fresh: bool = False  # MODULE: constructed here, not yet moved nor registered on `self`
    pinned: bool | None = None  # LOADER/BATCH: pin_memory=True given (None: not known)
    dropped_line: int = 0  # a `.to(...)` of this value whose result was dropped
    cls: str = ""  # MODULE: the class it was built from
    wrapper: str = ""  # MODULE: "DataParallel" / "DistributedDataParallel" when wrapped
    source: ast.AST | None = None  # the call that made it (a factory, a constructor)
    optimizer: ast.Call | None = None  # MODULE: an optimizer built from its parameters
    items: tuple[Value, ...] | None = None  # CONTAINER: known elements (a tuple display)
    element: Value | None = None  # CONTAINER: what iterating it gives (None: empty so far)

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


def join_env(a: Env | None, b: Env | None) -> Env | None:
    """Join two environments; None is a dead path (after return/raise/break)."""
    if a is None:
        return None if b is None else dict(b)
    if b is None:
        return dict(a)
    out: Env = {}
    for key, va in a.items():
        vb = b.get(key)
        if vb is None:
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
    via: str  # "module" (a module call), "torch" (a torch function), "method", "operator"


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


# -- vocabularies -----------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


FACTORIES = frozenset(
    {
        "zeros",
        "ones",
        "empty",
        "full",
        "rand",
        "randn",
        "randint",
        "randperm",
        "arange",
        "range",
        "linspace",
        "logspace",
        "eye",
        "tensor",
        "as_tensor",
        "from_numpy",
        "empty_strided",
        "tril_indices",
        "triu_indices",
        "bernoulli",
        "normal",
        "scalar_tensor",
        "complex",
        "polar",
    }
)
LIKE_FACTORIES = frozenset(
    {
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
    }
)
# torch.<x> namespaces whose functions compute on all their tensor arguments together.
_MEETING_NAMESPACES = ("torch.nn.functional.", "torch.linalg.", "torch.fft.", "torch.special.")
# torch functions that take several tensors without requiring one device.
_NON_MEETING_TORCH = frozenset(
    {
        "save",
        "load",
        "is_tensor",
        "is_floating_point",
        "numel",
        "manual_seed",
        "device",
        "Size",
        "set_grad_enabled",
        "no_grad",
        "enable_grad",
        "inference_mode",
        "broadcast_shapes",
        "result_type",
        "promote_types",
        "can_cast",
        "equal",
        "Generator",
        "compile",
    }
)
# Tensor methods that combine the receiver with tensor arguments (need one device).
MEETING_METHODS = frozenset(
    {
        "add",
        "add_",
        "sub",
        "sub_",
        "mul",
        "mul_",
        "div",
        "div_",
        "matmul",
        "mm",
        "bmm",
        "mv",
        "dot",
        "masked_fill",
        "masked_fill_",
        "masked_select",
        "masked_scatter",
        "masked_scatter_",
        "index_select",
        "index_add",
        "index_add_",
        "index_copy",
        "index_copy_",
        "index_put",
        "index_put_",
        "gather",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "where",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "maximum",
        "minimum",
        "lerp",
        "lerp_",
        "addcmul",
        "addcmul_",
        "addcdiv",
        "addcdiv_",
        "pow",
        "pow_",
        "fmod",
        "remainder",
        "logical_and",
        "logical_or",
        "bitwise_and",
        "bitwise_or",
    }
)
# Tensor methods whose result is a tensor on the receiver's device.
PRESERVING_METHODS = frozenset(
    {
        "float",
        "double",
        "half",
        "bfloat16",
        "long",
        "int",
        "short",
        "bool",
        "byte",
        "char",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "permute",
        "transpose",
        "t",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "contiguous",
        "clone",
        "expand",
        "expand_as",
        "repeat",
        "repeat_interleave",
        "tril",
        "triu",
        "abs",
        "exp",
        "log",
        "log1p",
        "sqrt",
        "rsqrt",
        "sigmoid",
        "tanh",
        "relu",
        "softmax",
        "log_softmax",
        "argmax",
        "argmin",
        "clamp",
        "clamp_",
        "clip",
        "round",
        "floor",
        "ceil",
        "neg",
        "logical_not",
        "cumsum",
        "cumprod",
        "flip",
        "roll",
        "narrow",
        "select",
        "index_fill",
        "fill_",
        "zero_",
        "normal_",
        "uniform_",
        "requires_grad_",
        "type",
        "sort",
        "topk",
        "chunk",
        "split",
        "unbind",
        "pin_memory",
        "masked_fill",
        "sign",
        "square",
        "pow",
    }
)
# Reductions: with no arguments the result is 0-dim (it mixes with any device).
REDUCTIONS = frozenset(
    {"sum", "mean", "max", "min", "prod", "norm", "std", "var", "all", "any", "amax", "amin"}
)
# Methods returning a Python value or metadata, not a tensor.
_NON_TENSOR_METHODS = frozenset(
    {"item", "tolist", "size", "dim", "numel", "nelement", "element_size", "stride"}
)
_TENSOR_ATTRS_SAME = frozenset({"T", "mT", "H", "mH", "real", "imag"})
_TENSOR_META_ATTRS = frozenset(
    {"shape", "dtype", "ndim", "is_cuda", "layout", "requires_grad", "is_leaf", "names"}
)
# Modules: methods that return the module itself.
_MODULE_SELF_METHODS = frozenset(
    {
        "eval",
        "train",
        "half",
        "float",
        "double",
        "bfloat16",
        "requires_grad_",
        "share_memory",
        "apply",
        "to_empty",
        "type",
    }
)
_DEVICE_STRING = re.compile(r"^(cuda|mps|xpu|npu|hpu|xla|meta|privateuseone)(:\d+)?$")
DTYPE_NAMES = frozenset(
    {
        "float",
        "float16",
        "float32",
        "float64",
        "half",
        "double",
        "bfloat16",
        "long",
        "int",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "complex64",
        "complex128",
        "cfloat",
        "cdouble",
        "short",
        "float8_e4m3fn",
        "float8_e5m2",
    }
)
# Wrappers a loop may put around a loader: the elements pass through.
_PASS_THROUGH_ITERATORS = frozenset({"tqdm", "iter", "tqdm_notebook", "track", "islice"})
# An iterable whose name says it yields batches.
_LOADERISH = re.compile(r"loader|(?:^|_)dl(?:$|_)|(?:^|_)batches$", re.IGNORECASE)
# Parameter-holding torch.nn layers (building one in forward creates fresh weights).
OPTIMIZER_PREFIX = "torch.optim."
_NOT_OPTIMIZERS = frozenset({"Optimizer", "lr_scheduler"})
DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
        "torch.nn.DistributedDataParallel",
    }
)
_NO_GRAD_CONTEXTS = frozenset({"torch.no_grad", "torch.inference_mode"})
# Values that take the name of the variable they are first bound to (for messages).
_NAMED_KINDS = frozenset({Kind.LOADER, Kind.MODULE, Kind.DEVICE, Kind.DATASET})
# Results that never require grad: booleans and indices.
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"})
_INDEX_RESULTS = frozenset({"argmax", "argmin", "long", "int", "bool", "byte", "short", "char"})
# torch.nn layers that own parameters or buffers.
_LAYERS = """
    Linear Bilinear LazyLinear Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d
    ConvTranspose3d LazyConv1d LazyConv2d LazyConv3d BatchNorm1d BatchNorm2d BatchNorm3d
    SyncBatchNorm LayerNorm GroupNorm RMSNorm LocalResponseNorm Embedding EmbeddingBag RNN
    LSTM GRU RNNCell LSTMCell GRUCell MultiheadAttention Transformer TransformerEncoder
    TransformerDecoder TransformerEncoderLayer TransformerDecoderLayer PReLU
"""
PARAMETRISED_LAYERS = frozenset(_LAYERS.split())
# Objects that hold a target device (`args.device`, `self.device`, `model.device`);
# `x.device` of any other unknown `x` is wherever `x` happens to be.
_DEVICE_HOLDERS = _words(
    """self args cfg config conf opt opts options hparams params accelerator fabric trainer
    model module net pl_module state settings hps"""
)
_NON_MODULE_NN = frozenset(
    {"Parameter", "ParameterList", "ParameterDict", "UninitializedParameter"}
)


def is_dtype_text(text: str) -> bool:
    last = text.rsplit(".", 1)[-1]
    return "dtype" in text.lower() or (text.startswith("torch.") and last in DTYPE_NAMES)


def dotted(node: ast.AST) -> str | None:
    """`self.model.fc` -> "self.model.fc"; None unless a Name/Attribute chain."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


# -- the per-file object --------------------------------------------------------------


def file_flow(ctx: FileContext) -> FileFlow:
    """The FileFlow of `ctx`, shared by every rule checking that file."""
    return ctx.shared("flow", FileFlow)


class FileFlow:
    """Index of a file's functions and classes, and the cache of their scope facts."""

    MAX_SEED_DEPTH = 2
    TEXT_SCANS = 32  # names looked up in the text before one tree walk indexes them all
    # A caller that mentions none of these cannot pass a moved module, a device tensor
    # or a loader: it is not analysed, and the callee gets no seeds (unknown is quiet).
    FACT_WORDS = (".to(", ".cuda(", "device", "DataLoader", "loader", "Loader")

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.project: ProjectIndex = ctx.project
        self._functions: list[AnyFunction] = []
        self._class_of: dict[AnyFunction, ast.ClassDef] = {}
        self._classes: dict[str, ast.ClassDef] = {}  # top-level classes by name
        self._toplevel_functions: dict[str, AnyFunction] = {}
        self._methods: dict[ast.ClassDef, dict[str, AnyFunction]] = {}
        self._index(ctx.tree.body, None, top=True)
        self._function_lines = [f.lineno for f in self._functions]
        self._reach = list(  # the furthest line any function up to this one spans
            itertools.accumulate((f.end_lineno or f.lineno for f in self._functions), max)
        )
        self._innermost: dict[int, ScopeNode] = {}
        self._scopes: dict[tuple[ast.AST, bool], ScopeFlow] = {}
        self._in_progress: set[ast.AST] = set()
        self._module_classes: dict[ast.ClassDef, bool] = {}
        self._self_attrs_assigned: dict[AnyFunction, frozenset[str]] = {}
        self._texts: dict[ast.AST, str] = {}
        self._uses: dict[str, list[tuple[int, bool]] | None] = {}
        self._uses_indexed = False
        self._returns: dict[AnyFunction, Value] = {}
        self._makes_factory: dict[AnyFunction, bool] = {}
        self._module_code_text: str | None = None
        self._module_names: frozenset[str] | None = None
        self._class_uses: dict[ast.ClassDef, dict[str, tuple[int, int, list[AnyFunction]]]] = {}

    # -- index -------------------------------------------------------------------------
    def _index(self, body: list[ast.stmt], cls: ast.ClassDef | None, *, top: bool) -> None:
        for stmt in body:
            kind = type(stmt)
            if kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
                assert isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
                self._functions.append(stmt)
                if cls is not None:
                    self._class_of[stmt] = cls
                    self._methods.setdefault(cls, {})[stmt.name] = stmt
                elif top:
                    self._toplevel_functions[stmt.name] = stmt
                self._index(stmt.body, None, top=False)
            elif kind is ast.ClassDef:
                assert isinstance(stmt, ast.ClassDef)
                if top:
                    self._classes[stmt.name] = stmt
                self._methods.setdefault(stmt, {})
                self._index(stmt.body, stmt, top=False)
            elif kind in _COMPOUND_STATEMENTS:
                self._index(child_statements(stmt), cls, top=top and cls is None)

    def release(self) -> None:
        """Drop the cached facts (they reference the syntax tree)."""
        self._scopes.clear()
        self._texts.clear()
        self._class_uses.clear()
        self._self_attrs_assigned.clear()

    def functions(self) -> list[AnyFunction]:
        """Every function and method of the file, in source order of their headers."""
        return self._functions

    def class_of(self, func: AnyFunction) -> ast.ClassDef | None:
        """The class `func` is a method of (directly in its body), or None."""
        return self._class_of.get(func)

    def methods(self, cls: ast.ClassDef) -> dict[str, AnyFunction]:
        return self._methods.get(cls, {})

    def is_module_class(self, cls: ast.ClassDef) -> bool:
        """Whether `cls` subclasses nn.Module, judged by its own bases.

        Stricter than the project index: a class of the same name elsewhere in the
        project does not make a base-less `class MyModule:` a module.
        """
        known = self._module_classes.get(cls)
        if known is None:
            self._module_classes[cls] = False  # guards against cyclic bases
            known = any(self._is_module_base(base) for base in cls.bases)
            self._module_classes[cls] = known
        return known

    def _is_module_base(self, base: ast.expr) -> bool:
        if isinstance(base, ast.Subscript):
            base = base.value  # Generic[...] style bases
        qual = self.ctx.qualname(base)
        return qual is not None and self.is_module_class_name(qual)

    def is_module_class_name(self, qual: str) -> bool:
        """Whether a class name, resolved through this file's imports, is an nn.Module."""
        last = qual.rsplit(".", 1)[-1]
        if not last[:1].isupper() or last in _NON_MODULE_NN:
            return False
        if qual.startswith("torch."):
            return qual.startswith("torch.nn.") and "functional" not in qual
        local = self._classes.get(qual)
        if local is not None:
            return self.is_module_class(local)
        if last in KNOWN_MODULE_BASES:
            return True
        if qual.startswith(("numpy.", "np.", "tensorflow.", "keras.", "jax.", "flax.")):
            return False
        return last in self.project.module_classes

    def is_forward(self, func: AnyFunction) -> bool:
        """`forward` of an nn.Module subclass."""
        cls = self.class_of(func)
        return func.name == "forward" and cls is not None and self.is_module_class(cls)

    def text(self, node: ast.AST) -> str:
        """The source lines of a statement-level node (cached; for cheap text gates)."""
        found = self._texts.get(node)
        if found is None:
            if isinstance(node, ast.Module):
                found = self.ctx.source
            else:
                first = getattr(node, "lineno", 1)
                last = getattr(node, "end_lineno", None) or first
                start = self.ctx.offset(first, 0)
                end = self.ctx.offset(last + 1, 0) if last < len(self.ctx.lines) else None
                found = self.ctx.source[start:end]
            self._texts[node] = found
        return found

    def module_code_text(self) -> str:
        """The text of the module-level code the module scope runs: the top-level
        statements, with only the decorator lines of functions and classes."""
        if self._module_code_text is None:
            parts: list[str] = []
            for stmt in self.ctx.tree.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    parts.extend(self.ctx.segment(dec) for dec in stmt.decorator_list)
                else:
                    parts.append(self.text(stmt))
            self._module_code_text = "\n".join(parts)
        return self._module_code_text

    def mentions(self, node: ast.AST, *needles: str) -> bool:
        """Whether the source text of `node` contains any of `needles`."""
        text = self.text(node)
        return any(n in text for n in needles)

    # -- scopes ------------------------------------------------------------------------
    def module_scope(self) -> ScopeFlow:
        return self.scope(self.ctx.tree)

    def scope(self, node: ScopeNode, *, callers: bool = True, depth: int = 0) -> ScopeFlow:
        """The facts of one function (or of the module-level code), analysed once.

        With `callers=False` the parameters are not seeded from the function's call
        sites (cheaper; enough for rules that look at one function's own code).
        """
        key = (node, callers)
        found = self._scopes.get(key)
        if found is not None:
            return found
        if node in self._in_progress or depth > self.MAX_SEED_DEPTH:
            # a call cycle, or too deep: analyse without call-site seeds, do not cache
            return ScopeFlow(self, node, seeds=self._seeds(node, depth, callers=False))
        self._in_progress.add(node)
        try:
            seeds = self._seeds(node, depth, callers)
            found = ScopeFlow(self, node, seeds=seeds)
        finally:
            self._in_progress.discard(node)
        self._scopes[key] = found
        return found

    def returned_tensor(self, func: AnyFunction) -> Value:
        """What `func` returns, when that is a tensor it made on the CPU (else UNKNOWN).

        `def init_hidden(self, n): return torch.zeros(1, n, 16)`: a call of it gives a
        CPU tensor. Only factory-made CPU tensors are passed on; anything that
        depends on the arguments stays unknown.
        """
        found = self._returns.get(func)
        if found is None:
            found = UNKNOWN
            if self.may_return_factory(func):
                # no seeds: a factory's result does not depend on them, and seeding
                # would analyse the callers, which are asking for this very summary
                self._returns[func] = UNKNOWN  # a recursive function sees nothing
                returned = ScopeFlow(self, func, seeds={}).returned
                if (
                    returned is not None
                    and returned.kind is Kind.TENSOR
                    and returned.place is Place.CPU
                    and isinstance(returned.source, ast.Call)
                    and not returned.scalar
                    and not returned.assumed
                ):
                    found = returned
            self._returns[func] = found
        return found

    def may_return_factory(self, func: AnyFunction) -> bool:
        """`returns_factory` of the function's text (cached)."""
        found = self._makes_factory.get(func)
        if found is None:
            found = self._makes_factory[func] = returns_factory(self.text(func))
        return found

    def module_exit_env(self) -> Env:
        """Module-level names as the module's code leaves them (globals of functions)."""
        return self.module_scope().exit_env

    def module_assigns(self, name: str) -> bool:
        """Whether module-level code assigns `name` (imports and defs do not count).

        Lets functions skip analysing the module for globals that cannot hold a fact.
        """
        if self._module_names is None:
            names: set[str] = set()
            todo: list[ast.stmt] = list(self.ctx.tree.body)
            while todo:
                stmt = todo.pop()
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                if isinstance(stmt, ast.Import | ast.ImportFrom):
                    continue
                for field in ("targets", "target", "items"):
                    value = getattr(stmt, field, None)
                    for node in value if isinstance(value, list) else [value]:
                        if isinstance(node, ast.withitem):
                            node = node.optional_vars
                        if isinstance(node, ast.AST):
                            names.update(_target_names(node))  # type: ignore[arg-type]
                todo.extend(child_statements(stmt))
            self._module_names = frozenset(names)
        return name in self._module_names

    def scopes_at(self, lines: Iterable[int]) -> list[ScopeNode]:
        """The innermost scope of each line, without repeats, in first-seen order."""
        return list(dict.fromkeys(self.innermost_scope(line) for line in lines))

    # -- seeds ---------------------------------------------------------------------------
    def _seeds(self, func: ScopeNode, depth: int, callers: bool) -> Env:
        """Initial values of a function's parameters and of `self.x` attributes."""
        if isinstance(func, ast.Module):
            return {}
        seeds: Env = {}
        args = func.args
        params = [*args.posonlyargs, *args.args]
        cls = self.class_of(func)
        is_method = cls is not None and bool(params) and not _is_static(func)
        self_name = params[0].arg if is_method else None
        for arg in [*params, *args.kwonlyargs]:
            value = self._annotation_value(arg)
            if value is not UNKNOWN:
                seeds[arg.arg] = value
        defaults = args.defaults
        for arg, default in zip(params[len(params) - len(defaults) :], defaults, strict=False):
            if isinstance(default, ast.List | ast.Tuple) and arg.arg not in seeds:
                seeds[arg.arg] = Value(Kind.CONTAINER)
        # seeds from call sites in this file (and other files, through the project index);
        # calls between methods of one class are cheap to find and always followed
        call_seeds: Env = {}
        if callers or (cls is not None and func.name != "__init__"):
            call_seeds = self._call_site_seeds(func, params, cls, depth)
        seeds.update(call_seeds)
        if cls is not None and self_name is not None:
            module_class = self.is_module_class(cls)
            if func.name != "__init__":
                seeds.update(self._self_attribute_seeds(cls, func, self_name, module_class))
            if module_class and func.name == "forward":
                for arg in params[1:]:
                    if arg.arg not in call_seeds and _looks_like_tensor_arg(func, arg):
                        seeds[arg.arg] = Value(
                            Kind.TENSOR,
                            Place.DEVICE,
                            name=arg.arg,
                            device=f"{arg.arg}.device",
                            assumed=True,
                            is_input=True,
                        )
        return seeds

    def _annotation_value(self, arg: ast.arg) -> Value:
        if arg.annotation is None:
            return UNKNOWN
        text = self.ctx.qualname(arg.annotation) or ""
        last = text.rsplit(".", 1)[-1]
        if last == "Tensor":
            return Value(Kind.TENSOR)
        if text in ("torch.device",):
            return Value(Kind.DEVICE, Place.DEVICE, name=arg.arg)
        if last == "Module" and text.startswith("torch.nn"):
            return Value(Kind.MODULE)
        return UNKNOWN

    def _self_attribute_seeds(
        self, cls: ast.ClassDef, func: AnyFunction, self_name: str, module_class: bool
    ) -> Env:
        """`self.x` as `__init__` leaves it, when no other method assigns `self.x`."""
        init = self.methods(cls).get("__init__")
        if init is None or init is func:
            return {}
        init_scope = self.scope(init)
        others: set[str] = set()
        for name, method in self.methods(cls).items():
            if name != "__init__":
                others |= self.self_attrs_assigned(method)
        seeds: Env = {}
        for key, value in init_scope.exit_env.items():
            if not key.startswith(init_scope.self_name + "."):
                continue
            attr = key[len(init_scope.self_name) + 1 :]
            if "." in attr or attr in others:
                continue
            if module_class and value.kind in (Kind.MODULE, Kind.PARAMETER):
                # registered: moves with the module, wherever it goes
                value = Value(
                    value.kind,
                    Place.DEVICE,
                    name=f"self.{attr}",
                    device=f"self.{attr}",
                    assumed=True,
                    is_input=True,
                    grad=value.kind is Kind.PARAMETER,
                )
            seeds[f"{self_name}.{attr}"] = value
        return seeds

    def self_attrs_assigned(self, func: AnyFunction) -> frozenset[str]:
        """Names `x` with `self.x = ...` (augmented, in a tuple, ...) anywhere in `func`.

        Read from the text (an over-approximation is safe: it only removes facts).
        """
        found = self._self_attrs_assigned.get(func)
        if found is None:
            params = [*func.args.posonlyargs, *func.args.args]
            me = params[0].arg if params else "self"
            text = self.text(func)
            names: set[str] = set()
            if f"{me}." in text:
                pattern = _ASSIGNED_ATTR.get(me)
                if pattern is None:
                    pattern = re.compile(
                        rf"\b{re.escape(me)}\.(\w+)\s*(?:\[[^\]\n]*\]\s*)?"
                        r"(?:,[^\n=()\[\]]*=(?!=)|=(?!=)|[-+*/%@&|^]=|//=|\*\*=|>>=|<<=)"
                    )
                    _ASSIGNED_ATTR[me] = pattern
                names.update(pattern.findall(text))
                if "setattr(" in text:
                    names.add("*")
            found = frozenset(names)
            self._self_attrs_assigned[func] = found
        return found

    def _occurrences(self, name: str) -> list[tuple[int, bool]] | None:
        """(line, is a call) of each use of the top-level function or class `name`.

        None when `name` is also used as a value (a callback, a decorator, a base
        class): then its calls cannot all be seen. The first few names are found in
        the text; a file that asks about many gets one syntax-tree pass for all.
        """
        if name in self._uses:
            return self._uses[name]
        if len(self._uses) >= self.TEXT_SCANS:
            if not self._uses_indexed:
                self._index_uses()
            return self._uses.get(name, [])
        uses = self._scan_uses(name)
        self._uses[name] = uses
        return uses

    def _scan_uses(self, name: str) -> list[tuple[int, bool]] | None:
        """`name(` is a call; `name` followed by `,` `)` `]` `}` or a line end is a value;
        prose in a docstring (`name the ...`) is neither."""
        source = self.ctx.source
        uses: list[tuple[int, bool]] = []
        start = source.find(name)
        while start >= 0:
            end = start + len(name)
            before = source[start - 1] if start else " "
            after = source[end : end + 1]
            if not (before.isalnum() or before in "_.\"'") and not (
                after.isalnum() or after == "_"
            ):
                rest = source[end : source.find("\n", end) + 1 or len(source)].lstrip(" \t")
                line_start = source.rfind("\n", 0, start) + 1
                head = source[line_start:start]
                if rest.startswith("(") and not head.rstrip().endswith("@"):
                    uses.append((self.ctx.line_of_offset(start), True))
                elif (not rest or rest[0] in ",)]}\n" or head.rstrip().endswith("@")) and not (
                    _DEF_OR_IMPORT.fullmatch(head)
                ):
                    return None
            start = source.find(name, end)
        return uses

    def _index_uses(self) -> None:
        """Every use of every top-level name, in one walk of the tree."""
        self._uses_indexed = True
        names = self._toplevel_functions.keys() | self._classes.keys()
        uses: dict[str, list[tuple[int, bool]] | None] = {}
        called: set[int] = set()
        for node in walk(self.ctx.tree):  # breadth first: a call before its callee
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in names:
                    found = uses.setdefault(node.func.id, [])
                    if found is not None:
                        found.append((node.lineno, True))
                    called.add(id(node.func))
            elif (
                isinstance(node, ast.Name)
                and node.id in names
                and isinstance(node.ctx, ast.Load)
                and id(node) not in called
            ):
                uses[node.id] = None
        self._uses.update(uses)

    def _call_site_seeds(
        self,
        func: AnyFunction,
        params: list[ast.arg],
        cls: ast.ClassDef | None,
        depth: int,
    ) -> Env:
        """Join, over every call of `func`, the value passed to each parameter."""
        sites: list[tuple[CallSite, int]] = []  # (call, offset of the first parameter)
        scopes: list[ScopeNode] | None
        if cls is None:
            if self._toplevel_functions.get(func.name) is not func:
                return {}
            callee, offset, scopes = func.name, 0, self._caller_scopes(func.name)
        elif func.name == "__init__" and self._classes.get(cls.name) is cls:
            callee, offset, scopes = cls.name, 1, self._caller_scopes(cls.name)
        elif params and not _is_static(func) and func.name != "__init__":
            callee, offset = f"self.{func.name}", 1
            uses, calls, callers = self._method_uses(cls).get(func.name, (0, 0, []))
            if uses != calls:
                return {}  # `self.m` passed around as a value: not all calls are seen
            scopes = [m for m in callers if m is not func]
        else:
            return {}
        if scopes is None:
            return {}
        # submodules handed to a module's constructor are facts without any device word
        module_init = cls is not None and func.name == "__init__" and self.is_module_class(cls)
        for scope_node in scopes:
            forward = isinstance(scope_node, ast.FunctionDef) and self.is_forward(scope_node)
            if not (forward or module_init or self.mentions(scope_node, *self.FACT_WORDS)):
                return {}  # an uninformative caller: the join would be unknown anyway
        for scope_node in scopes:
            caller = self.scope(scope_node, depth=depth + 1)
            sites.extend((site, offset) for site in caller.calls if site.callee == callee)
        remote = self.project_call_facts(callee) if cls is None or func.name == "__init__" else []
        if not sites and not remote:
            return {}
        names = [p.arg for p in params]
        seeds: dict[str, Value] = {}
        first = True
        for site, off in sites:
            values = self._bind_site(site, names, off, func)
            seeds = values if first else _join_seeds(seeds, values)
            first = False
        for values in remote:
            seeds = values if first else _join_seeds(seeds, values)
            first = False
        return {k: v for k, v in seeds.items() if v is not UNKNOWN}

    def project_call_facts(self, callee: str) -> list[Env]:
        """Parameter values of `callee` at call sites in other files (project index)."""
        getter = getattr(self.project, "call_facts_for", None)
        if getter is None:
            return []
        func = self._toplevel_functions.get(callee)
        if func is None:
            cls = self._classes.get(callee)
            init = self.methods(cls).get("__init__") if cls is not None else None
            if init is None:
                return []
            names = [p.arg for p in [*init.args.posonlyargs, *init.args.args]][1:]
            kwonly = [p.arg for p in init.args.kwonlyargs]
        else:
            names = [p.arg for p in [*func.args.posonlyargs, *func.args.args]]
            kwonly = [p.arg for p in func.args.kwonlyargs]
        out: list[Env] = []
        for fact in getter(callee, self.ctx.path):
            env: Env = {}
            if fact.opaque:
                out.append(env)  # positions unknown: nothing can be said
                continue
            for i, value in enumerate(fact.args):
                if i < len(names):
                    env[names[i]] = _as_parameter(names[i], value)
            for key, value in fact.keywords:
                if key in names or key in kwonly:
                    env[key] = _as_parameter(key, value)
            out.append(env)
        return out

    def _caller_scopes(self, name: str) -> list[ScopeNode] | None:
        """The scopes that call `name`; None if `name` escapes (passed as a value)."""
        uses = self._occurrences(name)
        if uses is None:
            return None
        found: dict[ScopeNode, None] = {}
        for line, is_call in uses:
            if is_call:
                found[self.innermost_scope(line)] = None
        return list(found)

    def innermost_scope(self, line: int) -> ScopeNode:
        """The innermost function whose text holds `line` (else the module)."""
        found = self._innermost.get(line)
        if found is None:
            found = self.ctx.tree
            # functions are listed in source order, nested ones after their parent: the
            # last one starting at or before `line` that still spans it is innermost;
            # the scan stops where no earlier function reaches `line` (a running maximum)
            index = bisect.bisect_right(self._function_lines, line) - 1
            while index >= 0 and self._reach[index] >= line:
                func = self._functions[index]
                if (func.end_lineno or func.lineno) >= line:
                    found = func
                    break
                index -= 1
            self._innermost[line] = found
        return found

    def _method_uses(self, cls: ast.ClassDef) -> dict[str, tuple[int, int, list[AnyFunction]]]:
        """Per method name `m`: (uses of `self.m`, calls `self.m(`, the methods calling it)."""
        found = self._class_uses.get(cls)
        if found is None:
            found = {}
            for method in self.methods(cls).values():
                params = [*method.args.posonlyargs, *method.args.args]
                me = params[0].arg if params else "self"
                for match in _SELF_ATTRIBUTE_USE.finditer(self.text(method)):
                    if match.group(1) != me:
                        continue
                    uses, calls, callers = found.get(match.group(2), (0, 0, []))
                    if match.group(3):
                        calls += 1
                        if not callers or callers[-1] is not method:
                            callers = [*callers, method]
                    found[match.group(2)] = (uses + 1, calls, callers)
            self._class_uses[cls] = found
        return found

    def _bind_site(
        self, site: CallSite, names: list[str], offset: int, func: AnyFunction
    ) -> dict[str, Value]:
        """Parameter name -> argument value at one call (UNKNOWN where not passed)."""
        values: dict[str, Value] = {n: UNKNOWN for n in names[offset:]}
        values.update({a.arg: UNKNOWN for a in func.args.kwonlyargs})
        if site.opaque:
            return {n: UNKNOWN for n in values}
        for i, value in enumerate(site.args):
            if offset + i < len(names):
                values[names[offset + i]] = value
        for key, value in site.keywords:
            if key in values:
                values[key] = value
        # parameters not passed take their defaults: unknown
        return {k: _as_parameter(k, v) for k, v in values.items()}


def _as_parameter(param: str, value: Value) -> Value:
    """A caller's loader seen inside the callee: named as the parameter, alias the caller's."""
    if value.kind is Kind.LOADER and value.name and value.name != param:
        return dataclasses.replace(value, name=param, alias=value.alias or value.name)
    return value


_COMPOUND_STATEMENTS = frozenset(
    {ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try}
    | {getattr(ast, name) for name in ("TryStar", "Match") if hasattr(ast, name)}
)
_ASSIGNED_ATTR: dict[str, re.Pattern[str]] = {}
# A function that may return a tensor it makes: a factory call and a return.
_RETURNS_FACTORY = re.compile(
    r"\btorch\.(?:zeros|ones|empty|full|rand|randn|randint|arange|tensor|eye|linspace)\("
    r"[\s\S]*\breturn\b|\breturn\b[^\n]*\btorch\.(?:zeros|ones|empty|full|rand|randn)\("
)
_SELF_ATTRIBUTE_USE = re.compile(r"(?<![\w.])(\w+)\.(\w+)\b(\s*\()?")
_DEF_OR_IMPORT = re.compile(r"\s*(?:(?:async\s+)?(?:def|class)\s+|(?:from\s+\S+\s+)?import\s+.*)")


def returns_factory(text: str) -> bool:
    """Whether a function's text may return a tensor it makes with a factory."""
    return "return" in text and "torch." in text and _RETURNS_FACTORY.search(text) is not None


def _join_seeds(a: dict[str, Value], b: dict[str, Value]) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for key in a.keys() | b.keys():
        out[key] = join(a.get(key, UNKNOWN), b.get(key, UNKNOWN))
    return out


def _is_static(func: AnyFunction) -> bool:
    for dec in func.decorator_list:
        name = dotted(dec) or ""
        if name.endswith(("staticmethod", "classmethod")):
            return True
    return False


_NON_TENSOR_ANNOTATIONS = frozenset(
    {"int", "float", "bool", "str", "bytes", "dict", "Dict", "tuple", "Tuple", "Callable"}
)


def _looks_like_tensor_arg(func: AnyFunction, arg: ast.arg) -> bool:
    """A `forward` argument that is a tensor in practice (not a flag or a size)."""
    if arg.annotation is not None:
        text = dotted(arg.annotation) or ""
        if isinstance(arg.annotation, ast.Subscript):
            text = dotted(arg.annotation.value) or ""
            if text.endswith("Optional"):
                inner = arg.annotation.slice
                text = dotted(inner) or ""
        return text.rsplit(".", 1)[-1] == "Tensor"
    params = [*func.args.posonlyargs, *func.args.args]
    defaults = func.args.defaults
    with_default = params[len(params) - len(defaults) :]
    if arg in with_default:
        default = defaults[with_default.index(arg)]
        return isinstance(default, ast.Constant) and default.value is None
    return True


# -- the analysis of one scope ----------------------------------------------------------


class _LoopFrame:
    __slots__ = ("breaks", "continues")

    def __init__(self) -> None:
        self.breaks: list[Env] = []
        self.continues: list[Env] = []


class ScopeFlow:
    """The facts of one function body (or of module-level code).

    Query API (all read-only after construction):
    - `value(expr)`: the Value `expr` held when it was evaluated (UNKNOWN if never/unknown);
    - `mismatches`, `moves`, `calls`: see the module docstring;
    - `method_calls(name)`: every `x.name(...)` call evaluated in the scope;
    - `exit_env`: names (and `self.x` attributes) as the scope leaves them;
    - `returned`: the join of the returned values.
    """

    MAX_LOOP_PASSES = 3

    def __init__(self, ff: FileFlow, node: ScopeNode, *, seeds: Env) -> None:
        self.ff = ff
        self.ctx = ff.ctx
        self.node = node
        self.seeds = seeds
        self._values: dict[ast.AST, Value] = {}
        self._mismatches: dict[tuple[int, int], Mismatch] = {}
        self.moves: list[Move] = []
        self.calls: list[CallSite] = []
        self._method_calls: dict[str, list[ast.Call]] = {}
        self._named_calls: dict[str, list[ast.Call]] = {}
        self.exit_env: Env = {}
        self.returned: Value | None = None
        self.moved_origins: set[tuple[str, int]] = set()  # batches moved here (name, line)
        self._recording = True
        self._no_grad = 0
        self._loops: list[_LoopFrame] = []
        self._statement_call: ast.Call | None = None
        self.env: Env | None = None
        self.is_function = not isinstance(node, ast.Module)
        self.self_name = ""
        self.cls: ast.ClassDef | None = None
        self._locals: frozenset[str] | None = None  # computed on first need
        self._globals: Env | None = None
        if not isinstance(node, ast.Module):
            self.cls = ff.class_of(node)
            params = [*node.args.posonlyargs, *node.args.args]
            if self.cls is not None and params and not _is_static(node):
                self.self_name = params[0].arg
            if _decorated_no_grad(node, ff.ctx):
                self._no_grad = 1
        self._run()

    # -- queries -------------------------------------------------------------------------
    def value(self, node: ast.AST) -> Value:
        return self._values.get(node, UNKNOWN)

    @property
    def mismatches(self) -> list[Mismatch]:
        return list(self._mismatches.values())

    def method_calls(self, name: str) -> list[ast.Call]:
        """Every `x.name(...)` call evaluated in the scope, in evaluation order."""
        return self._method_calls.get(name, [])

    def calls_named(self, name: str) -> list[ast.Call]:
        """Every `name(...)` or `x.name(...)` call evaluated in the scope."""
        return self._named_calls.get(name, [])

    # -- driver ----------------------------------------------------------------------------
    def _run(self) -> None:
        env: Env = {k: v for k, v in self.seeds.items()}
        self.env = env
        body = self.node.body
        if isinstance(self.node, ast.Module):
            self._exec_block(body)
            self.exit_env = self.env or {}
            return
        self._exits: list[Env] = []
        self._exec_block(body)
        if self.env is not None:
            self._exits.append(self.env)
        exit_env: Env | None = None
        for e in self._exits:
            exit_env = e if exit_env is None else join_env(exit_env, e)
        self.exit_env = exit_env or {}

    # -- environment -------------------------------------------------------------------------
    def lookup(self, name: str) -> Value:
        env = self.env
        if env is not None and name in env:
            return env[name]
        return self.global_value(name, name)

    def global_value(self, root: str, key: str) -> Value:
        """The module-level value of `key` (a name or `name.attr`), if `root` is not local."""
        if isinstance(self.node, ast.Module):
            return UNKNOWN  # at module level every name is the scope's own
        if not self.ff.module_assigns(root):
            return UNKNOWN
        if self._globals is None:
            self._globals = self.ff.module_exit_env()
        if key not in self._globals:
            return UNKNOWN
        if self._locals is None:
            self._locals = _local_names(self.node)
        return UNKNOWN if root in self._locals else self._globals[key]

    def _set(self, key: str, value: Value) -> None:
        env = self.env
        if env is None:
            return
        if "." in key:
            if self.self_name and key.startswith(self.self_name + ".") and value.fresh:
                value = dataclasses.replace(value, fresh=False)  # registered on self
        else:
            prefix = key + "."
            for other in [k for k in env if k.startswith(prefix)]:
                del env[other]
        if value.kind is Kind.UNKNOWN and value.place is Place.UNKNOWN:
            env.pop(key, None)
        else:
            env[key] = value

    # -- statements --------------------------------------------------------------------------
    def _exec_block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if self.env is None:
                return
            self._exec(stmt)

    def _exec(self, stmt: ast.stmt) -> None:
        handler = _STATEMENTS.get(type(stmt))
        if handler is not None:
            handler(self, stmt)
        else:
            self._exec_other(stmt)

    def _exec_other(self, stmt: ast.stmt) -> None:
        # statements with no effect on the facts we keep; still evaluate their expressions
        for child in iter_children(stmt):
            if isinstance(child, ast.expr):
                self.eval(child)

    def _exec_assign(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Assign)
        value = self.eval(stmt.value)
        for target in stmt.targets:
            self._bind(target, value)

    def _exec_ann_assign(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.AnnAssign)
        if stmt.value is not None:
            self._bind(stmt.target, self.eval(stmt.value))

    def _exec_aug_assign(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.AugAssign)
        key = dotted(stmt.target)
        current = self.lookup(key) if key and "." not in key else UNKNOWN
        if key and "." in key and self.env is not None:
            current = self.env.get(key, UNKNOWN)
        if isinstance(stmt.target, ast.Subscript):
            self.eval(stmt.target.value)
        right = self.eval(stmt.value)
        if current.kind is Kind.CONTAINER:
            new = _container_add(current, right)
        else:
            new = self._binary(stmt, [(stmt.target, current), (stmt.value, right)])
        if key:
            self._set(key, new)

    def _exec_expr(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Expr)
        if isinstance(stmt.value, ast.Call):
            self._statement_call = stmt.value
        try:
            self.eval(stmt.value)
        finally:
            self._statement_call = None

    def _exec_return(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Return)
        value = self.eval(stmt.value) if stmt.value is not None else NONE
        self.returned = value if self.returned is None else join(self.returned, value)
        if self.env is not None and self.is_function:
            self._exits.append(self.env)
        self.env = None

    def _exec_raise(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Raise)
        if stmt.exc is not None:
            self.eval(stmt.exc)
        self.env = None

    def _exec_break(self, stmt: ast.stmt) -> None:
        if self._loops and self.env is not None:
            self._loops[-1].breaks.append(self.env)
        self.env = None

    def _exec_continue(self, stmt: ast.stmt) -> None:
        if self._loops and self.env is not None:
            self._loops[-1].continues.append(self.env)
        self.env = None

    def _exec_if(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.If)
        self.eval(stmt.test)
        if not self.is_function and _is_main_guard(stmt.test):
            self._exec_block(stmt.body)  # a script's main block always runs
            return
        before = self.env
        assert before is not None
        self.env = dict(before)
        self._exec_block(stmt.body)
        after_body = self.env
        self.env = before
        self._exec_block(stmt.orelse)
        self.env = join_env(after_body, self.env)

    def _exec_with(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.With | ast.AsyncWith)
        no_grad = 0
        for item in stmt.items:
            value = self.eval(item.context_expr)
            if _is_no_grad_context(item.context_expr, self.ctx):
                no_grad += 1
            if item.optional_vars is not None:
                self._bind(item.optional_vars, value if value.kind is Kind.LOADER else UNKNOWN)
        self._no_grad += no_grad
        try:
            self._exec_block(stmt.body)
        finally:
            self._no_grad -= no_grad

    def _exec_try(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar"
        before = dict(self.env or {})
        self._exec_block(stmt.body)  # type: ignore[attr-defined]
        after_body = self.env
        outcomes: list[Env | None] = []
        for handler in stmt.handlers:  # type: ignore[attr-defined]
            self.env = join_env(before, after_body)
            if handler.type is not None:
                self.eval(handler.type)
            if handler.name:
                self._set(handler.name, UNKNOWN)
            self._exec_block(handler.body)
            outcomes.append(self.env)
        self.env = after_body
        if self.env is not None:
            self._exec_block(stmt.orelse)  # type: ignore[attr-defined]
        result = self.env
        for outcome in outcomes:
            result = join_env(result, outcome) if result is not None else outcome
        if stmt.finalbody:  # type: ignore[attr-defined]
            self.env = result if result is not None else join_env(before, after_body)
            self._exec_block(stmt.finalbody)  # type: ignore[attr-defined]
            if result is None:
                self.env = None
        else:
            self.env = result

    def _exec_for(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.For | ast.AsyncFor)
        iterable = self.eval(stmt.iter)
        element = self._element(iterable, stmt.iter)
        self._loop(stmt, stmt.body, stmt.orelse, target=stmt.target, element=element)

    def _exec_while(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.While)
        self.eval(stmt.test)
        self._loop(stmt, stmt.body, stmt.orelse, target=None, element=UNKNOWN, test=stmt.test)

    def _loop(
        self,
        stmt: ast.stmt,
        body: list[ast.stmt],
        orelse: list[ast.stmt],
        *,
        target: ast.expr | None,
        element: Value,
        test: ast.expr | None = None,
    ) -> None:
        entry = self.env
        assert entry is not None
        head: Env = dict(entry)
        recording = self._recording
        # silent passes until the loop head is stable, then one recording pass
        self._recording = False
        try:
            for _ in range(self.MAX_LOOP_PASSES):
                end, _frame = self._loop_pass(head, body, target, element, test)
                new_head = join_env(entry, end)
                for cont in _frame.continues:
                    new_head = join_env(new_head, cont)
                assert new_head is not None
                if new_head == head:
                    break
                head = new_head
            else:
                head = _weaken(head, entry)
        finally:
            self._recording = recording
        end, frame = self._loop_pass(head, body, target, element, test)
        self.env = dict(head)  # the loop may run zero times, or end after any pass
        self.env = join_env(self.env, end)
        self._exec_block(orelse)
        for brk in frame.breaks:
            self.env = join_env(self.env, brk) if self.env is not None else dict(brk)

    def _loop_pass(
        self,
        head: Env,
        body: list[ast.stmt],
        target: ast.expr | None,
        element: Value,
        test: ast.expr | None,
    ) -> tuple[Env | None, _LoopFrame]:
        self.env = dict(head)
        frame = _LoopFrame()
        self._loops.append(frame)
        try:
            if test is not None:
                self.eval(test)
            if target is not None:
                self._bind(target, element)
            self._exec_block(body)
        finally:
            self._loops.pop()
        return self.env, frame

    def _exec_def(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for dec in stmt.decorator_list:
            self.eval(dec)
        self._set(stmt.name, UNKNOWN)

    def _exec_import(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Import | ast.ImportFrom)
        for alias in stmt.names:
            name = alias.asname or alias.name.split(".", 1)[0]
            if name != "*":
                self._set(name, UNKNOWN)

    def _exec_delete(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Delete)
        for target in stmt.targets:
            key = dotted(target)
            if key:
                self._set(key, UNKNOWN)
            elif isinstance(target, ast.Subscript):
                self.eval(target.value)

    def _exec_match(self, stmt: ast.stmt) -> None:
        subject: ast.expr = stmt.subject  # type: ignore[attr-defined]
        self.eval(subject)
        before = self.env
        assert before is not None
        result: Env | None = dict(before)  # no case may match
        for case in stmt.cases:  # type: ignore[attr-defined]
            self.env = dict(before)
            for node in walk(case.pattern):
                name = getattr(node, "name", None)
                if isinstance(name, str):
                    self._set(name, UNKNOWN)
            if case.guard is not None:
                self.eval(case.guard)
            self._exec_block(case.body)
            result = join_env(result, self.env) if result is not None else self.env
        self.env = result

    # -- binding --------------------------------------------------------------------------
    def _bind(self, target: ast.expr, value: Value) -> None:
        if isinstance(target, ast.Name):
            if value.kind in _NAMED_KINDS and not value.name:
                value = dataclasses.replace(value, name=target.id)
            if self._recording and value is not UNKNOWN:
                self._values[target] = value  # what the name was bound to, here
            self._set(target.id, value)
        elif isinstance(target, ast.Tuple | ast.List):
            elts = target.elts
            starred = any(isinstance(e, ast.Starred) for e in elts)
            if value.items is not None and len(value.items) == len(elts) and not starred:
                for elt, item in zip(elts, value.items, strict=False):
                    self._bind(elt, item)
                return
            item = self._element(value, None)
            for elt in elts:
                if isinstance(elt, ast.Starred):
                    self._bind(elt.value, Value(Kind.CONTAINER, element=item))
                else:
                    self._bind(elt, item)
        elif isinstance(target, ast.Attribute):
            self.eval(target.value)
            key = dotted(target)
            if key:
                self._set(key, value)
        elif isinstance(target, ast.Subscript):
            self.eval(target.slice)
            key = dotted(target.value)
            base = self.eval(target.value)
            if key is None or self.env is None:
                return
            if base.kind in (Kind.TENSOR, Kind.PARAMETER):
                return  # an in-place write: still the same tensor
            if base.kind is Kind.CONTAINER:
                self._set(key, _container_add(base, Value(Kind.CONTAINER, element=value)))
            else:
                self._set(key, UNKNOWN)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, value)

    # -- expressions -------------------------------------------------------------------------
    def eval(self, node: ast.expr) -> Value:
        handler = _EXPRESSIONS.get(type(node))
        if handler is None:
            for child in iter_children(node):
                if isinstance(child, ast.expr):
                    self.eval(child)
            value = UNKNOWN
        else:
            value = handler(self, node)
        if self._recording and value is not UNKNOWN:
            self._values[node] = value
        return value

    def _eval_name(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Name)
        return self.lookup(node.id)

    def _eval_constant(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Constant)
        value = node.value
        if value is None:
            return NONE
        if isinstance(value, str):
            if value == "cpu":
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
        return self._attribute(recv, node)

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
            # an integer index may leave a 0-dim tensor, which mixes with any device
            point = not isinstance(index, ast.Slice | ast.Tuple)
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
        if left.kind is Kind.CONTAINER and right.kind is Kind.CONTAINER:
            return _container_add(left, right)
        if left.kind is Kind.CONTAINER and isinstance(node.op, ast.Mult):
            return left  # [layer] * n
        return self._binary(node, [(node.left, left), (node.right, right)])

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
        return join(self.eval(node.body), self.eval(node.orelse))

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

    # -- operations ---------------------------------------------------------------------------
    def _binary(
        self,
        site: ast.AST,
        operands: list[tuple[ast.expr, Value]],
        *,
        grad: bool = True,
    ) -> Value:
        """Arithmetic/comparison of tensors: the result, and a mismatch if devices differ."""
        tensors = [(n, v) for n, v in operands if v.kind in _TENSOR_KINDS and v.tensor_like]
        if not tensors:
            return UNKNOWN
        self._meet(site, tensors, "operator")
        return self._combined([v for _, v in tensors], grad=grad)

    def _combined(self, values: list[Value], *, grad: bool = True) -> Value:
        """A tensor computed from `values`: on the device if any is, else on the CPU."""
        devices = [v for v in values if v.place is Place.DEVICE]
        cpus = [v for v in values if v.place is Place.CPU]
        needs_grad = grad and self._no_grad == 0 and any(v.grad for v in values)
        if devices:
            first = next((v for v in devices if not v.maybe), devices[0])
            return Value(
                Kind.TENSOR,
                Place.DEVICE,
                name=first.name,
                device=first.device,
                device_line=first.device_line,
                assumed=first.assumed,
                is_input=first.is_input,
                maybe=first.maybe,
                grad=needs_grad,
                scalar=all(v.scalar for v in values),
                output=first.output,
            )
        if cpus and len(cpus) == len(values):
            first = next((v for v in cpus if not v.scalar), cpus[0])
            return Value(
                Kind.TENSOR,
                Place.CPU,
                name=first.name,
                line=first.line,
                assumed=any(v.assumed for v in cpus),
                grad=needs_grad,
                scalar=all(v.scalar for v in values),
                source=first.source,
                dropped_line=first.dropped_line,
            )
        return Value(Kind.TENSOR, grad=needs_grad) if needs_grad else UNKNOWN

    def _meet(self, site: ast.AST, operands: list[tuple[ast.expr, Value]], via: str) -> None:
        """Record CPU operands meeting a device operand (0-dim CPU tensors are allowed)."""
        if not self._recording:
            return
        device = next(
            ((n, v) for n, v in operands if v.place is Place.DEVICE and v.kind is not Kind.DEVICE),
            None,
        )
        if device is None:
            return
        for node, value in operands:
            if value.place is Place.CPU and not value.scalar and value.kind in _TENSOR_KINDS:
                key = (id(site), id(node))
                self._mismatches[key] = Mismatch(site, node, value, device[0], device[1], via)

    # -- calls --------------------------------------------------------------------------------
    def _eval_call(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Call)
        statement = self._statement_call is node
        self._statement_call = None
        func = node.func
        recv: Value | None = None
        if isinstance(func, ast.Attribute):
            recv = self.eval(func.value)
            if self._recording:
                self._method_calls.setdefault(func.attr, []).append(node)
                self._named_calls.setdefault(func.attr, []).append(node)
            callee = UNKNOWN
            key = dotted(func)
            if key is not None and self.env is not None and key in self.env:
                callee = self.env[key]
            elif key is not None:
                callee = self.global_value(key.split(".", 1)[0], key)
        else:
            callee = self.eval(func)
            if self._recording and isinstance(func, ast.Name):
                self._named_calls.setdefault(func.id, []).append(node)
        args: list[Value] = []
        opaque = False
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                opaque = True
                args.append(self.eval(arg.value))
            else:
                args.append(self.eval(arg))
        keywords: list[tuple[str | None, Value]] = []
        for kw in node.keywords:
            value = self.eval(kw.value)
            keywords.append((kw.arg, value))
            if kw.arg is None:
                opaque = True
        qual = self.ctx.qualname(func) or ""
        result = self._call(node, qual, recv, callee, args, keywords, statement)
        self._record_call_site(node, args, keywords, opaque)
        if statement and result is UNKNOWN and self.env is not None:
            self._forget_mutated(node, recv)
        return result

    def _record_call_site(
        self,
        node: ast.Call,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        opaque: bool,
    ) -> None:
        if not self._recording:
            return
        func = node.func
        if isinstance(func, ast.Name):
            name = func.id
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and self.self_name
            and func.value.id == self.self_name
        ):
            name = f"self.{func.attr}"
        else:
            return
        self.calls.append(
            CallSite(
                name,
                node,
                tuple(args),
                tuple((k, v) for k, v in keywords if k is not None),
                opaque,
            )
        )

    def _forget_mutated(self, node: ast.Call, recv: Value | None) -> None:
        """A dropped call of unknown effect may move or change its arguments in place."""
        env = self.env
        assert env is not None
        for arg in [*node.args, *(kw.value for kw in node.keywords)]:
            if isinstance(arg, ast.Starred):
                arg = arg.value
            key = dotted(arg)
            if key is None:
                continue
            held = env.get(key)
            if held is None:
                continue
            if held.kind is Kind.MODULE:
                if held.place is not Place.DEVICE:  # helpers rarely move a module back
                    self._set(key, dataclasses.replace(held, place=Place.UNKNOWN, fresh=False))
            elif held.kind in (Kind.BATCH, Kind.CONTAINER):
                self._set(key, UNKNOWN)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and self.self_name
            and func.value.id == self.self_name
            and self.cls is not None
        ):
            method = self.ff.methods(self.cls).get(func.attr)
            if method is not None:
                assigned = self.ff.self_attrs_assigned(method)
                prefix = self.self_name + "."
                for key in [k for k in env if k.startswith(prefix)]:
                    attr = key[len(prefix) :].split(".", 1)[0]
                    if attr in assigned or "*" in assigned:
                        del env[key]

    def _call(
        self,
        node: ast.Call,
        qual: str,
        recv: Value | None,
        callee: Value,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        statement: bool,
    ) -> Value:
        func = node.func
        if recv is not None and isinstance(func, ast.Attribute):
            method = func.attr
            if recv.kind is not Kind.UNKNOWN or recv.place is not Place.UNKNOWN:
                result = self._method(node, func, method, recv, args, statement)
                if result is not None:
                    return result
            elif method in ("to", "cuda", "cpu"):
                result = self._move(node, func.value, recv, statement)
                if result is not None:
                    return result
        if qual:
            result = self._known_function(node, qual, args, keywords)
            if result is not None:
                return result
        if callee.kind is Kind.MODULE or (
            callee.kind is Kind.UNKNOWN and callee.place is Place.DEVICE
        ):
            return self._module_call(node, callee, args, keywords)
        target = self._same_file_callee(func, recv)
        if target is not None:
            return self.ff.returned_tensor(target)
        return UNKNOWN

    def _same_file_callee(self, func: ast.expr, recv: Value | None) -> AnyFunction | None:
        """The function of this file a call runs: `helper(...)`, `self.m(...)`,
        `model.init_hidden(...)` on a module of a class defined here."""
        ff = self.ff
        if isinstance(func, ast.Name):
            if self.env is not None and func.id in self.env:
                return None  # a local variable, not the function
            return ff._toplevel_functions.get(func.id)
        if not isinstance(func, ast.Attribute):
            return None
        cls: ast.ClassDef | None = None
        if isinstance(func.value, ast.Name) and self.self_name and func.value.id == self.self_name:
            cls = self.cls
        elif recv is not None and recv.kind is Kind.MODULE and recv.cls:
            cls = ff._classes.get(recv.cls)
        return ff.methods(cls).get(func.attr) if cls is not None else None

    def _module_call(
        self,
        node: ast.Call,
        callee: Value,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> Value:
        operands: list[tuple[ast.expr, Value]] = []
        if callee.place is not Place.UNKNOWN:
            operands.append((node.func, callee))
        for arg_node, value in zip(node.args, args, strict=False):
            arg_node = arg_node.value if isinstance(arg_node, ast.Starred) else arg_node
            operands.extend(self._tensor_operands(arg_node, value))
        for kw, (_, value) in zip(node.keywords, keywords, strict=False):
            operands.extend(self._tensor_operands(kw.value, value))
        tensors = [(n, v) for n, v in operands if v.tensor_like or n is node.func]
        self._meet(node, [(n, v) for n, v in tensors], "module")
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

    def _tensor_operands(self, node: ast.expr, value: Value) -> list[tuple[ast.expr, Value]]:
        """An argument as operands: a tuple/list display counts element by element."""
        if isinstance(node, ast.Tuple | ast.List) and value.items is not None:
            out: list[tuple[ast.expr, Value]] = []
            for elt, item in zip(node.elts, value.items, strict=False):
                out.extend(self._tensor_operands(elt, item))
            return out
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
        if method in ("to", "cuda", "cpu"):
            return self._move(node, func.value, recv, statement)
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
        if method == "named_parameters":
            param = Value(Kind.PARAMETER, recv.place, device=recv.device, grad=True)
            return Value(Kind.CONTAINER, element=Value(Kind.CONTAINER, items=(UNKNOWN, param)))
        if method == "forward":
            return self._module_call(node, recv, args, [])
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
            if recv.kind is Kind.PARAMETER and method in DTYPE_NAMES:
                kind = Kind.PARAMETER  # `.float()` of a float32 parameter returns itself
            return dataclasses.replace(
                recv,
                kind=kind,
                grad=(recv.grad and method not in _INDEX_RESULTS) or method == "requires_grad_",
                scalar=False if reshaping else recv.scalar,
                output=False,
            )
        return None

    def _move(
        self, node: ast.Call, receiver: ast.expr, recv: Value, statement: bool
    ) -> Value | None:
        """`x.to(...)`, `x.cuda()`, `x.cpu()`: the moved value (None: not a move)."""
        method = node.func.attr  # type: ignore[attr-defined]
        if method == "cpu":
            target: tuple[Place, str] | None = (Place.CPU, "'cpu'")
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
        moved_module = kind is Kind.MODULE or (kind is Kind.UNKNOWN and statement)
        if kind is Kind.UNKNOWN and statement:
            kind = Kind.MODULE  # Tensor.to is not in place: a dropped .to() is a module's
        after = dataclasses.replace(
            recv,
            kind=kind,
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
                    self._set(key, after)
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
            if target.value == "cpu":
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
            if isinstance(first, ast.Constant) and first.value == "cpu":
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

    # -- known functions -------------------------------------------------------------------
    def _known_function(
        self,
        node: ast.Call,
        qual: str,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> Value | None:
        last = qual.rsplit(".", 1)[-1]
        if qual.startswith("torch."):
            return self._torch_function(node, qual, last, args, keywords)
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
        if qual.startswith("timm.") and last == "create_model":
            return Value(Kind.MODULE, cls="timm", line=node.lineno, source=node, fresh=True)
        if qual.startswith("torchvision.models.") and last[:1].islower():
            return Value(Kind.MODULE, cls=last, line=node.lineno, source=node, fresh=True)
        return None

    def _is_module_class(self, qual: str) -> bool:
        if qual.startswith("torch.") and not (
            qual.startswith("torch.nn.") and qual.count(".") == 2
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
        for kw in node.keywords:
            if kw.arg == "device":
                target = self.device_target(kw.value)
                if target is not None:
                    place, device = target
        return Value(
            Kind.MODULE,
            place,
            cls=last,
            line=node.lineno,
            source=node,
            fresh=place is Place.UNKNOWN,
            device=device,
            device_line=node.lineno if device else 0,
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
            elif kw.arg == "collate_fn":
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
        if qual.count(".") == 1 and last in FACTORIES:
            return self._factory(node, qual, last)
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
            if isinstance(first, ast.Constant) and first.value == "cpu":
                return Value(Kind.DEVICE, Place.CPU, line=node.lineno)
            return Value(Kind.DEVICE, Place.DEVICE, line=node.lineno, device=self._text(node))
        if qual in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            data = args[0] if args else UNKNOWN
            return Value(
                Kind.PARAMETER,
                data.place,
                grad=True,
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
        meets = (qual.count(".") == 1 and last not in _NON_MEETING_TORCH) or qual.startswith(
            _MEETING_NAMESPACES
        )
        if not meets:
            return None
        operands: list[tuple[ast.expr, Value]] = []
        for arg_node, value in zip(node.args, args, strict=False):
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

    def _factory(self, node: ast.Call, qual: str, last: str) -> Value:
        place = Place.CPU
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
        scalar = False
        if last in ("tensor", "as_tensor", "scalar_tensor"):
            data = node.args[0] if node.args else None
            if last == "scalar_tensor":
                scalar = True
            elif isinstance(data, ast.List | ast.Tuple) and not data.elts:
                scalar = True  # torch.tensor([]): an empty placeholder
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
            name=qual,
            line=node.lineno,
            device=device,
            device_line=node.lineno if device else 0,
            grad=grad,
            scalar=scalar,
            source=node,
        )

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
        for sub in walk(node):
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
        if kind is Kind.TENSOR and iterable.place is not Place.UNKNOWN:
            return dataclasses.replace(iterable, scalar=False, output=False)
        if kind is Kind.UNKNOWN and node is not None and iterable.place is Place.UNKNOWN:
            name = dotted(node)
            if name is not None and _LOADERISH.search(name.rsplit(".", 1)[-1]):
                # an iterable named like a loader, of unknown make: its batches are
                # assumed to be on the CPU (rules ask for more evidence before using this)
                return Value(Kind.BATCH, Place.CPU, name=name, assumed=True)
        return UNKNOWN

    # -- helpers ------------------------------------------------------------------------------
    def _text(self, node: ast.AST) -> str:
        return self.ctx.segment(node)


def _trainable(module: Value) -> bool:
    """A module known to have trainable parameters: its outputs require grad."""
    if module.kind is not Kind.MODULE or module.is_input:
        return False
    return module.optimizer is not None or module.cls in PARAMETRISED_LAYERS


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


def _is_zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def _weaken(head: Env, entry: Env) -> Env:
    """After too many loop passes: keep only what the loop entry already agreed on."""
    return {k: v for k, v in head.items() if entry.get(k) == v}


def _target_names(target: ast.expr) -> Iterator[str]:
    for node in walk(target):
        if isinstance(node, ast.Name):
            yield node.id


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _is_no_grad_context(expr: ast.expr, ctx: FileContext) -> bool:
    if isinstance(expr, ast.Call):
        name = ctx.qualname(expr.func) or ""
        if name in _NO_GRAD_CONTEXTS:
            return True
        if name == "torch.set_grad_enabled" and expr.args:
            arg = expr.args[0]
            return isinstance(arg, ast.Constant) and arg.value is False
        return False
    return (ctx.qualname(expr) or "") in _NO_GRAD_CONTEXTS


def _decorated_no_grad(func: AnyFunction, ctx: FileContext) -> bool:
    return any(_is_no_grad_context(dec, ctx) for dec in func.decorator_list)


def _local_names(func: AnyFunction) -> frozenset[str]:
    """Names bound in `func`'s own scope (parameters, assignments, imports, defs)."""
    args = func.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    if args.vararg:
        names.add(args.vararg.arg)
    if args.kwarg:
        names.add(args.kwarg.arg)
    declared_global: set[str] = set()
    todo: list[ast.AST] = list(func.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            todo.extend(getattr(node, "decorator_list", ()))
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".", 1)[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            declared_global.update(node.names)
        else:
            name = getattr(node, "name", None)
            if isinstance(name, str) and type(node).__name__.startswith("Match"):
                names.add(name)
        todo.extend(iter_children(node))
    return frozenset(names - declared_global)


def lines_matching(ctx: FileContext, needles: Iterable[str], pattern: re.Pattern[str]) -> list[int]:
    """The lines (ascending) that `pattern` matches from their start, among those holding
    a needle.

    The same lines as a MULTILINE `^...` search of the whole text whenever every match
    lies on one line and holds a needle, without trying the pattern at every position.
    """
    source = ctx.source
    starts = {source.rfind("\n", 0, at) + 1 for needle in needles for at in offsets(source, needle)}
    return [ctx.line_of_offset(s) for s in sorted(starts) if pattern.match(source, s)]


def scopes_with(ff: FileFlow, *needles: str) -> list[ScopeNode]:
    """The scopes (module-level code, functions) whose own code contains a needle."""
    return ff.scopes_at(ff.ctx.lines_holding(needles))


def _skip(self: ScopeFlow, stmt: ast.stmt) -> None:
    return None


_STATEMENTS: dict[type[ast.stmt], Callable[[ScopeFlow, ast.stmt], None]] = {
    ast.Assign: ScopeFlow._exec_assign,
    ast.AnnAssign: ScopeFlow._exec_ann_assign,
    ast.AugAssign: ScopeFlow._exec_aug_assign,
    ast.Expr: ScopeFlow._exec_expr,
    ast.Return: ScopeFlow._exec_return,
    ast.Raise: ScopeFlow._exec_raise,
    ast.Break: ScopeFlow._exec_break,
    ast.Continue: ScopeFlow._exec_continue,
    ast.If: ScopeFlow._exec_if,
    ast.With: ScopeFlow._exec_with,
    ast.AsyncWith: ScopeFlow._exec_with,
    ast.Try: ScopeFlow._exec_try,
    ast.For: ScopeFlow._exec_for,
    ast.AsyncFor: ScopeFlow._exec_for,
    ast.While: ScopeFlow._exec_while,
    ast.FunctionDef: ScopeFlow._exec_def,
    ast.AsyncFunctionDef: ScopeFlow._exec_def,
    ast.ClassDef: ScopeFlow._exec_def,
    ast.Import: ScopeFlow._exec_import,
    ast.ImportFrom: ScopeFlow._exec_import,
    ast.Delete: ScopeFlow._exec_delete,
    ast.Pass: _skip,
    ast.Global: _skip,
    ast.Nonlocal: _skip,
}
if hasattr(ast, "TryStar"):
    _STATEMENTS[ast.TryStar] = ScopeFlow._exec_try
if hasattr(ast, "Match"):
    _STATEMENTS[ast.Match] = ScopeFlow._exec_match

_EXPRESSIONS: dict[type[ast.expr], Callable[[ScopeFlow, ast.expr], Value]] = {
    ast.Name: ScopeFlow._eval_name,
    ast.Constant: ScopeFlow._eval_constant,
    ast.Attribute: ScopeFlow._eval_attribute,
    ast.Subscript: ScopeFlow._eval_subscript,
    ast.Call: ScopeFlow._eval_call,
    ast.Tuple: ScopeFlow._eval_tuple,
    ast.List: ScopeFlow._eval_tuple,
    ast.Set: ScopeFlow._eval_tuple,
    ast.Dict: ScopeFlow._eval_dict,
    ast.ListComp: ScopeFlow._eval_comprehension,
    ast.SetComp: ScopeFlow._eval_comprehension,
    ast.GeneratorExp: ScopeFlow._eval_comprehension,
    ast.DictComp: ScopeFlow._eval_comprehension,
    ast.BinOp: ScopeFlow._eval_binop,
    ast.Compare: ScopeFlow._eval_compare,
    ast.UnaryOp: ScopeFlow._eval_unary,
    ast.IfExp: ScopeFlow._eval_ifexp,
    ast.BoolOp: ScopeFlow._eval_boolop,
    ast.NamedExpr: ScopeFlow._eval_namedexpr,
    ast.Starred: ScopeFlow._eval_starred,
    ast.Lambda: ScopeFlow._eval_lambda,
    ast.Await: ScopeFlow._eval_await,
}
