from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.host_scalars import ends_on_host
from torchdoctor.check.analysis.values import Place
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

# torch.FloatTensor, torch.cuda.LongTensor, torch.sparse.FloatTensor, ... and their strings.
_LEGACY = re.compile(
    r"torch\.(?:(cuda|sparse)\.)?(Float|Double|Half|BFloat16|Long|Int|Short|Byte|Char|Bool)Tensor"
)
_DEVICE_WORDS = re.compile(r"cuda|gpu|device|half", re.IGNORECASE)
_COLLECTIVES = frozenset({"all_reduce", "all_gather", "broadcast", "reduce", "all_gather_object"})
# In-place fills that initialise a freshly allocated tensor.
_INITIALISERS = frozenset(
    {"zero_", "fill_", "normal_", "uniform_", "random_", "bernoulli_", "copy_", "exponential_"}
)
# Methods whose result holds the same values (moved or cast): what fills it fills them.
_VALUE_KEEPING = frozenset(
    {"to", "cuda", "cpu", "long", "float", "double", "half", "int", "contiguous", "pin_memory"}
)
_DTYPES = {
    "Float": "torch.float32",
    "Double": "torch.float64",
    "Half": "torch.float16",
    "BFloat16": "torch.bfloat16",
    "Long": "torch.int64",
    "Int": "torch.int32",
    "Short": "torch.int16",
    "Byte": "torch.uint8",
    "Char": "torch.int8",
    "Bool": "torch.bool",
}


class LegacyTensorType(Rule):
    """`torch.FloatTensor(...)`, `torch.cuda.LongTensor(...)`, `.type(torch.cuda.FloatTensor)`.

    ## What it does
    Finds the hazardous uses of the legacy typed-tensor API: constructors given
    sizes (`torch.FloatTensor(2, 3)`, `torch.LongTensor(x.size())`), which return
    uninitialised memory; every CUDA or sparse constructor
    (`torch.cuda.LongTensor(labels)`, `torch.sparse.FloatTensor(...)`);
    conversions through a tensor type,
    `x.type(torch.cuda.FloatTensor)` or `x.type("torch.FloatTensor")`;
    `torch.set_default_tensor_type(...)`; and names bound to a CUDA tensor type
    (`Tensor = torch.cuda.FloatTensor`), whose calls are CUDA-only.

    A constructor given one piece of data (`torch.LongTensor([1, 2])`,
    `torch.FloatTensor(array)`) only copies it, and one filled at once
    (`torch.FloatTensor(1, n).zero_()`, or stored and then filled by the same
    function or class: `self.v = nn.Parameter(torch.FloatTensor(1, n))` with
    `nn.init.uniform_(self.v)`, `emb = torch.FloatTensor(n, d)` with
    `init_embedding(emb)`) is initialised, and a placeholder whose values nothing
    reads (`self.register_buffer("_float_tensor", torch.FloatTensor(1))`, used only
    for `.new(...)`, `.device` or `.dtype`) needs none: old style, but it works,
    and well-kept code (fairseq, PyTorch's own ONNX exporter) uses it hundreds
    of times, so these are left alone, as are bindings that choose the device
    (`Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`), type
    checks (`isinstance(x, torch.cuda.FloatTensor)`) and annotations. So is a
    CPU type on a device tensor whose value only becomes a Python number that is
    printed or summed (`acc += torch.mean(eq.type(torch.FloatTensor)).item()`,
    `acc = torch.sum(eq).type(torch.FloatTensor) / n` then `print("%.2f" % acc)`):
    the move can neither meet a device tensor nor slow later tensor work.

    ## Why is this bad?
    - `torch.FloatTensor(2, 3)` returns *uninitialised* memory: whatever was
      there before, sometimes NaN or 1e38, which silently poisons training when
      the tensor is not overwritten everywhere. `torch.FloatTensor(3)` is an
      uninitialised 3-vector, not `[3.0]` — the same call means a size or data
      depending on its argument.
    - `torch.cuda.FloatTensor(...)` hardcodes CUDA: it fails on a CPU/MPS
      machine with `TypeError: type torch.cuda.FloatTensor not available`.
    - `x.type(torch.FloatTensor)` changes the dtype *and* moves a GPU tensor to
      the CPU, which then fails with a device mismatch (or silently runs on the
      CPU).
    - The constructors ignore the default dtype and device and accept no
      `device=` or `requires_grad=`; `torch.set_default_tensor_type` is
      deprecated since PyTorch 2.1.

    ## Example
    ```python
    Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
    valid = Tensor(imgs.size(0), 1).fill_(1.0)
    labels = torch.LongTensor(label_list)
    x = x.type(torch.cuda.FloatTensor)
    ```

    ## Use instead
    ```python
    valid = torch.ones(imgs.size(0), 1, device=imgs.device)
    labels = torch.tensor(label_list, dtype=torch.long)
    x = x.to(device=device, dtype=torch.float32)
    ```
    (`torch.empty(...)` when uninitialised memory is really wanted,
    `torch.set_default_dtype` / `torch.set_default_device` for defaults.)

    ## References
    - https://pytorch.org/docs/stable/tensors.html#torch.Tensor
    - https://pytorch.org/docs/stable/generated/torch.set_default_tensor_type.html
    """

    code = "TD603"
    name = "legacy-tensor-type"
    category = "deprecation"
    severity = Severity.INFO
    # A finding names one of the legacy types (`FloatTensor`, ...) or
    # `set_default_tensor_type`: in the call, the reference, the string or the import.
    triggers: ClassVar[tuple[str, ...]] = (*(f"{kind}Tensor" for kind in _DTYPES), "tensor_type")
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call, ast.Assign)

    def visit_needles(self) -> tuple[str, ...]:
        # `x.type(...)`, `set_default_tensor_type(`
        return ("type(", "tensor_type")

    def visit_words(self) -> tuple[str, ...]:
        # What `visit` reports names a legacy type: `torch.cuda.FloatTensor(...)`, its
        # string, `T = torch.FloatTensor` hold `FloatTensor` as a word; a call or a
        # reference resolved through an import holds the name the import binds.
        legacy = (f"{kind}Tensor" for kind in _DTYPES)
        aliases = (
            name
            for name, target in self.ctx.imports.items()
            if _LEGACY.fullmatch(target) or target == "torch.set_default_tensor_type"
        )
        return (*legacy, *aliases)

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            if isinstance(node.value, ast.Attribute) and node.value.attr.endswith("Tensor"):
                self._visit_binding(node)
            return
        assert isinstance(node, ast.Call)
        func = node.func
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if not (last.endswith("Tensor") or last in ("type", "set_default_tensor_type")):
            return  # cheap test first: most calls are none of these
        name = self.ctx.call_name(node) or ""
        legacy = _LEGACY.fullmatch(name)
        if legacy is not None:
            if self._expects_error():
                return
            kind = legacy.group(1)
            if kind == "cuda" and self._device_chosen():
                kind = None  # CUDA on purpose: only the uninitialised-memory hazard remains
            if kind is not None or (_sizes(node) and not self._initialised(node)):
                self.report(node, self._constructor_message(name, legacy, kind))
            return
        if name == "torch.set_default_tensor_type":
            if self._expects_error():
                return
            self.report(
                node,
                "`torch.set_default_tensor_type` is deprecated since PyTorch 2.1; use "
                "`torch.set_default_dtype(...)` and `torch.set_default_device(...)`",
            )
            return
        if isinstance(func, ast.Attribute) and func.attr == "type" and len(node.args) == 1:
            target = self._legacy_reference(node.args[0])
            if target is None or self._expects_error():
                return
            if ".cuda." not in target and not self._on_device(func.value):
                return  # a CPU type on a tensor not shown on a GPU: only the dtype changes
            if ".cuda." not in target and ends_on_host(self.ctx, node, self.ctx.stack):
                return  # only printed or summed as a number: the move harms nothing
            self.report(node, self._type_message(target))

    def _on_device(self, receiver: ast.expr) -> bool:
        """The scope analysis shows `receiver` on the accelerator (moved there, or made
        from a batch or module that is)."""
        scope_node = self.ctx.enclosing_function() or self.ctx.tree
        scope = file_flow(self.ctx).scope(scope_node, callers=False)
        return scope.value(receiver).place is Place.DEVICE

    def _device_chosen(self) -> bool:
        """Inside `if self.cuda:` / `if x.is_cuda` / a GPU-named function, or code that
        feeds torch.distributed collectives (NCCL buffers must be CUDA tensors)."""
        for node in self.ctx.stack:
            if isinstance(node, ast.If | ast.IfExp | ast.While):
                if _DEVICE_WORDS.search(self.ctx.segment(node.test)):
                    return True
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if _DEVICE_WORDS.search(node.name) or any(c in node.name for c in _COLLECTIVES):
                    return True
                if any(
                    isinstance(sub, ast.Call)
                    and getattr(sub.func, "attr", getattr(sub.func, "id", "")) in _COLLECTIVES
                    for sub in walk(node)
                ):
                    return True
        return False

    def _initialised(self, call: ast.Call) -> bool:
        """`torch.FloatTensor(1, n).zero_()`: filled right away, like `torch.zeros`; or
        bound to a name that the function (the class, for `self.` attributes) fills:
        `nn.init.uniform_(self.v)`, `init_embedding(emb)`, `lat = lat.to(d).zero_()`."""
        parent = self.ctx.stack[-1] if self.ctx.stack else None
        if isinstance(parent, ast.Attribute) and parent.attr in _INITIALISERS:
            return True
        target = self._bound_to()
        if target is None:
            return False
        scope: ast.AST | None = None
        if target.startswith("self."):
            scope = self.ctx.enclosing_class()
        scope = scope or self.ctx.enclosing_function()
        text = self.ctx.segment(scope) if scope is not None else self.ctx.source
        name = rf"(?<![\w.]){re.escape(target)}\b"
        filled = rf"init[\w.]*\(\s*{name}|{name}(\.\w+\([^()]*\))*\.({'|'.join(_INITIALISERS)})\("
        return re.search(filled, text) is not None or _only_metadata_read(name, text)

    def _bound_to(self) -> str | None:
        """The name or attribute the constructor's tensor is stored in: `x = T(...)`,
        `self.v = nn.Parameter(T(...))`, `params.append(nn.Parameter(T(...)))`."""
        stack = self.ctx.stack
        depth = len(stack) - 1
        # `T(n, m).to(device)`: a move or cast keeps the (uninitialised) values
        while depth >= 1 and _keeps_values(stack[depth], stack[depth - 1]):
            depth -= 2
        if depth >= 0 and isinstance(stack[depth], ast.Call):
            wrapper = stack[depth]
            assert isinstance(wrapper, ast.Call)
            if (self.ctx.call_name(wrapper) or "").endswith("Parameter"):
                depth -= 1
        holder = stack[depth] if depth >= 0 else None
        if isinstance(holder, ast.Assign) and len(holder.targets) == 1:
            target = holder.targets[0]
            if isinstance(target, ast.Name | ast.Attribute):
                return self.ctx.segment(target)
        if isinstance(holder, ast.Call) and isinstance(holder.func, ast.Attribute):
            if holder.func.attr == "append":
                return self.ctx.segment(holder.func.value)
            buffer = holder.args[0] if holder.args else None
            if (
                holder.func.attr == "register_buffer"
                and self.ctx.segment(holder.func.value) == "self"
                and isinstance(buffer, ast.Constant)
                and isinstance(buffer.value, str)
            ):
                return f"self.{buffer.value}"  # `self.register_buffer("b", T(1))`
        return None

    def _expects_error(self) -> bool:
        """Inside `with pytest.raises(...)` / `self.assertRaises(...)`."""
        return any(
            isinstance(node, ast.With)
            and any("raises" in self.ctx.segment(i.context_expr).lower() for i in node.items)
            for node in self.ctx.stack
        )

    def _visit_binding(self, node: ast.Assign) -> None:
        """`Tensor = torch.cuda.FloatTensor`: every later `Tensor(...)` is CUDA-only.
        (`torch.cuda.FloatTensor if cuda else torch.FloatTensor`, or the binding under
        `if torch.cuda.is_available():`, chooses the device and is left alone.)"""
        target = self._legacy_reference(node.value)
        if target is None or ".cuda." not in target or not isinstance(node.value, ast.Attribute):
            return
        if self._device_chosen():
            return  # `if torch.cuda.is_available(): T = torch.cuda.FloatTensor` chooses it
        names = ", ".join(self.ctx.segment(t) for t in node.targets)
        self.report(
            node.value,
            f"`{names}` is bound to the legacy type `{target}`: every call of it builds "
            "a tensor on the GPU (a TypeError without one); use "
            "`torch.empty/zeros/tensor(..., dtype=..., device=device)`",
        )

    def _legacy_reference(self, node: ast.AST) -> str | None:
        """`torch.cuda.FloatTensor` (a reference, not a call) or the string of one."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value if _LEGACY.fullmatch(node.value) else None
        if isinstance(node, ast.Attribute):
            name = self.ctx.qualname(node) or ""
            return name if _LEGACY.fullmatch(name) else None
        return None

    @staticmethod
    def _constructor_message(name: str, legacy: re.Match[str], kind: str | None) -> str:
        dtype = _DTYPES[legacy.group(2)]
        if kind == "cuda":
            return (
                f"`{name}(...)` is a legacy constructor that hardcodes CUDA (a TypeError "
                f"without a GPU); use `torch.tensor(data, dtype={dtype}, device=device)` "
                f"or `torch.empty(size, dtype={dtype}, device=device)`"
            )
        if kind == "sparse":
            return f"`{name}(...)` is a legacy constructor; use `torch.sparse_coo_tensor(...)`"
        return (
            f"`{name}(...)` is a legacy constructor: with sizes it returns uninitialised "
            f"memory, with data a copy; use `torch.tensor(data, dtype={dtype})` or "
            f"`torch.zeros/empty(size, dtype={dtype})`"
        )

    @staticmethod
    def _type_message(target: str) -> str:
        legacy = _LEGACY.fullmatch(target)
        assert legacy is not None
        dtype = _DTYPES[legacy.group(2)]
        if legacy.group(1) == "cuda":
            effect = "also moves the tensor to a CUDA GPU (a TypeError without one)"
        else:
            effect = "also moves a GPU tensor back to the CPU"
        return f"`.type({target})` {effect}; use `.to(dtype={dtype})` (and `device=` to move)"


# What reads only a tensor's device or dtype, or makes a new tensor like it.
_METADATA = r"new(?:_\w+)?\(|device\b|dtype\b|is_cuda\b|type\(\)"


def _only_metadata_read(name: str, text: str) -> bool:
    """Every read of `name` (a pattern) in `text` asks for its device or dtype or makes a
    new tensor like it (`self._float_tensor.new(n, d)`, `.device`, `.dtype`), and there
    is one: a placeholder whose values nothing reads, so they need no initialising."""
    metadata = rf"{name}\.(?:{_METADATA})"
    other = rf"{name}(?!\s*=[^=])(?!\.(?:{_METADATA}))"  # neither a binding nor metadata
    return re.search(metadata, text) is not None and re.search(other, text) is None


def _sizes(call: ast.Call) -> bool:
    """`torch.FloatTensor(2, 3)`, `torch.LongTensor(n_batch, 1)`, `torch.FloatTensor(x.size())`:
    the call is given sizes, so it returns uninitialised memory. A single data
    argument (`torch.LongTensor([1, 2])`, `torch.FloatTensor(array)`) copies data:
    old style, but it works, so it is left alone."""
    if len(call.args) >= 2 or any(isinstance(a, ast.Starred) for a in call.args):
        return True
    if len(call.args) != 1:
        return False
    arg = call.args[0]
    if isinstance(arg, ast.Constant):
        return isinstance(arg.value, int) and not isinstance(arg.value, bool)
    if isinstance(arg, ast.Attribute):
        return arg.attr == "shape"
    if isinstance(arg, ast.Call):
        func = arg.func
        return (isinstance(func, ast.Attribute) and func.attr == "size") or (
            getattr(func, "attr", getattr(func, "id", "")) == "Size"
        )
    return False


def _keeps_values(attribute: ast.AST, call: ast.AST) -> bool:
    """`<tensor>.to(device)` (the attribute, then its call): same values, moved or cast."""
    return (
        isinstance(attribute, ast.Attribute)
        and attribute.attr in _VALUE_KEEPING
        and isinstance(call, ast.Call)
        and call.func is attribute
    )
