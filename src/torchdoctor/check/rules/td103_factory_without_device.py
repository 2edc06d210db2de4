from __future__ import annotations

import ast
import bisect
import re
from typing import ClassVar

from torchdoctor.check.analysis.class_calls import inherited_calls
from torchdoctor.check.analysis.default_path import default_text
from torchdoctor.check.analysis.file_flow import FileFlow, file_flow
from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.scope_index import calls_in
from torchdoctor.check.analysis.syntax import own_code
from torchdoctor.check.analysis.torch_api import FACTORIES, LEGACY_CONSTRUCTORS
from torchdoctor.check.analysis.values import AnyFunction, Kind, Mismatch, Place
from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

_ALL_FACTORIES = FACTORIES | LEGACY_CONSTRUCTORS
# values whose `.device` the message cannot name (a torch.distributions object has none)
_NO_DEVICE_ATTRIBUTE = frozenset({Kind.MODULE, Kind.DISTRIBUTION})
# `torch.zeros(`, `th.FloatTensor(`: how a factory call reads, whatever torch is imported as
_FACTORY_CALLS = tuple(f".{name}(" for name in sorted(_ALL_FACTORIES))
_ALL_FACTORY_NAMES = tuple(sorted(_ALL_FACTORIES))

# code of a function that puts a tensor on the device itself
_OWN_PROOF = (".to(", ".cuda(", "device=")
_FACTORY_NAMES_CALLED = tuple(f"{name}(" for name in sorted(_ALL_FACTORIES))

_LIKE_FORM = {
    "zeros": "new_zeros",
    "ones": "new_ones",
    "empty": "new_empty",
    "full": "new_full",
    "tensor": "new_tensor",
    "rand": "torch.rand_like",
    "randn": "torch.randn_like",
}


class FactoryWithoutDevice(Rule):
    """A tensor factory with no `device=`: made on the CPU, it meets tensors on the GPU.

    ## What it does
    Finds `torch.zeros/ones/empty/full/rand/randn/randint/arange/linspace/eye/tensor/…`
    (and the legacy `torch.FloatTensor(...)` constructors) called without `device=`:

    - inside a module's `forward` (or a method `forward` calls) whose result then
      meets the inputs, the module's parameters or submodules: in arithmetic,
      `torch.cat`, a tensor method or a submodule call;
    - in any other function -- a loss, metric, plotting or training-loop helper,
      `main()` -- whose result meets a tensor the analysis proves to be on the
      device there: moved by this code (`x.to(device)`), made with `device=`, the
      output of a model this code moved, or passed by a caller that did so. Where
      the other side's place is not known (a parameter no caller in view moved), it
      stays quiet.

    `*_like` and `x.new_*` factories take the device of their argument and are fine,
    as are 0-dim scalars such as `torch.tensor(2.0)`, which mix with any device.

    ## Why is this bad?
    Without `device=`, a factory makes its tensor on the CPU. The model works on a
    CPU and crashes as soon as it is moved to a GPU:
    `RuntimeError: Expected all tensors to be on the same device, but found at
    least two devices, cuda:0 and cpu!` (a position index, an attention mask, a
    `[CLS]` token or an initial hidden state made in `forward`).

    ## Example
    ```python
    def forward(self, x):
        cls = torch.zeros(x.size(0), 1, x.size(2))
        return torch.cat([cls, x], dim=1)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        cls = x.new_zeros(x.size(0), 1, x.size(2))  # or torch.zeros(..., device=x.device)
        return torch.cat([cls, x], dim=1)
    ```

    ## References
    - https://pytorch.org/docs/stable/notes/cuda.html#best-practices
    - https://pytorch.org/docs/stable/tensor_creation_ops.html
    """

    code = "TD103"
    name = "factory-without-device"
    category = "device"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("forward", ".to(", ".cuda(", "device")
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._factory_lines: list[int] | None = None  # lines that name a factory
        self._cpu_in: dict[AnyFunction, bool] = {}  # functions holding a CPU factory call
        # lines holding a needle of each tuple (`_spans`): one text scan per file, not
        # one per function and needle
        self._needle_lines: dict[tuple[str, ...], list[int]] = {}
        self._class_helpers: dict[ast.ClassDef, list[AnyFunction]] = {}

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        # a value proven on the device comes from a move or a `device=` in this file
        moves = any(m in self.ctx.source for m in (".to(", ".cuda(", "device="))
        # a file that never names a device
        devices = moves or any(w in self.ctx.source for w in ("cuda", "device", "accelerat"))
        for func in ff.functions():
            cls = ff.class_of(func)
            forward = None if cls is None else self._forward_reaching(ff, cls, func)
            if forward is None:
                if not moves or not self._spans(func, _FACTORY_CALLS):
                    continue
                if cls is not None and ff.is_module_class(cls):
                    # a module whose `forward` is not seen to run this method (a base of
                    # another file calls it through attributes holding functions): its
                    # factory meets a tensor its own code puts on the device
                    # (`device=self.device`); where the class's own `forward` is in
                    # view, what it does not run is left alone
                    if (
                        "forward" not in ff.inherited_methods(cls)
                        and ff.mentions(func, *_OWN_PROOF)
                        and self._may_make_on_cpu(func)
                    ):
                        self._check(func, None, ff.scope(func, callers=False))
                    continue
                # a loss, metric or plotting helper: its factory meets tensors its
                # callers proved to be on the device
                # (only where a device value can come from: its own code, or callers here)
                # (the factory test first: it is a lookup, finding the callers is not)
                if self._may_make_on_cpu(func) and (
                    ff.mentions(func, *ff.FACT_WORDS) or ff.called_in_file(func)
                ):
                    self._check(func, None, ff.scope(func))
                continue
            assert cls is not None
            if not devices and _runs_here(ff, cls):
                continue  # a CPU-only script running its own model: it never meets a GPU
            if not self._spans(func, _ALL_FACTORY_NAMES):
                makers = self._makers(ff, cls, func)
                if not (makers and ff.mentions(func, *makers)):
                    continue
            if self._may_make_on_cpu(func):
                self._check(func, forward, ff.scope(func, callers=False))

    def _spans(self, func: AnyFunction, needles: tuple[str, ...]) -> bool:
        """`ff.mentions(func, *needles)`, from the lines holding one (needles hold no line
        break: one is in the function's text exactly when a line of it holds one)."""
        lines = self._needle_lines.get(needles)
        if lines is None:
            lines = self._needle_lines[needles] = self.ctx.lines_holding(needles)
        at = bisect.bisect_left(lines, func.lineno)
        return at < len(lines) and lines[at] <= (func.end_lineno or func.lineno)

    def _may_make_on_cpu(self, func: AnyFunction) -> bool:
        """Whether `func`, or a method of its class that can hand it a value, calls a
        factory the CPU gets: the only sources this rule reports. Most functions that
        name a factory give every call a `device=`; they are not analysed at all."""
        return self._cpu_factories(func) or any(
            self._cpu_factories(f) for f in self._class_methods(func) if f is not func
        )

    def _cpu_factories(self, func: AnyFunction) -> bool:
        """Whether a call of the function's lines is one (once per function: only the
        functions the rule asks about are walked, on their lines that name a factory)."""
        found = self._cpu_in.get(func)
        if found is None:
            if self._factory_lines is None:
                self._factory_lines = self.ctx.lines_holding(_FACTORY_NAMES_CALLED)
            first, last = func.lineno, func.end_lineno or 0
            lines = self._factory_lines
            lines = lines[bisect.bisect_left(lines, first) : bisect.bisect_right(lines, last)]
            # (a call starting on the function's lines lies in it, as every line it spans)
            found = bool(lines) and any(
                first <= call.lineno <= last and self._cpu_factory(call)
                for call in calls_in(func, lines)
            )
            self._cpu_in[func] = found
        return found

    def _cpu_factory(self, call: ast.Call) -> bool:
        """A torch factory call made on the CPU whatever the values: no `device=`, or
        a literal CPU device (`device="cpu"`)."""
        qual = self.ctx.call_name(call) or ""
        factory = qual.rsplit(".", 1)[-1]
        if not qual.startswith("torch.") or factory not in _ALL_FACTORIES:
            return False
        return all(k.arg not in ("device", None) or _literal_cpu(k.value) for k in call.keywords)

    def _check(self, func: AnyFunction, forward: AnyFunction | None, scope: ScopeFlow) -> None:
        reported: set[ast.AST] = set()
        # results moved on the spot (`f(torch.arange(n)).to(x.device)`): done on purpose
        moved_now = {id(m.receiver) for m in scope.moves if not m.dtype_only}
        for m in sorted(scope.mismatches, key=lambda m: getattr(m.cpu.source, "lineno", 0)):
            source = m.cpu.source
            if not isinstance(source, ast.Call) or source in reported or m.cpu.assumed:
                continue
            # the factory may sit in a method forward calls (`self.init_hidden(n)`); one
            # made in `__init__` and kept on `self` is TD104's
            inside = _inside(source, func) or any(
                _inside(source, method) for method in self._helpers(func)
            )
            if forward is None:  # outside a module: the other side must be proven there
                other = m.other
                proven = not (other.assumed or other.maybe or other.is_input)
                if not proven or other.place is not Place.DEVICE or other.kind is Kind.MODULE:
                    continue
            elif not m.other.is_input:
                continue
            if not inside or id(m.site) in moved_now or _on_no_gpu_path(m.site, func):
                continue
            if m.via == "module" and self._moves_inputs(scope, m):
                continue  # the module puts what it is given on its device itself
            qual = self.ctx.call_name(source) or ""
            factory = qual.rsplit(".", 1)[-1]
            legacy = factory in LEGACY_CONSTRUCTORS and qual.count(".") == 1
            if not (factory in FACTORIES or legacy) or not self._cpu_factory(source):
                continue  # a `device=` the caller chose: it is not this rule's claim
            reported.add(source)
            self.report(source, self._message(func, forward, m, qual, factory))

    def _forward_reaching(
        self, ff: FileFlow, cls: ast.ClassDef, func: AnyFunction
    ) -> AnyFunction | None:
        """The method through which the module's `forward` runs `func`: `forward` itself
        (the class's, or a base's of this file), or the method of this file a base
        `forward` of another file calls (`self.transform(x)`). None: not a module, or
        `forward` does not run `func`."""
        if not ff.is_module_class(cls):
            return None
        forward = ff.inherited_methods(cls).get("forward")  # maybe a base class's
        if forward is not None:
            return forward if ff.reaches(cls, forward, func) else None
        if not (
            self._spans(func, _FACTORY_CALLS) or ff.mentions(func, *self._makers(ff, cls, func))
        ) or not self._may_make_on_cpu(func):
            return None  # no factory the CPU gets here: nothing to report, no base read
        called = inherited_calls(analysis(self.ctx), cls, "forward") or frozenset()
        methods = ff.inherited_methods(cls)
        for name in sorted(called):
            start = methods.get(name)
            if start is not None and ff.reaches(cls, start, func):
                return start
        return None

    def _makers(self, ff: FileFlow, cls: ast.ClassDef, func: AnyFunction) -> list[str]:
        """`self.m(` of the methods that return a tensor they make (`self.init_hidden(n)`)."""
        return [
            f"self.{m.name}("
            for m in ff.methods(cls).values()
            if m is not func and ff.may_return_factory(m)
        ]

    def _moves_inputs(self, scope: ScopeFlow, m: Mismatch) -> bool:
        """A call of a module whose class moves what it receives (`x = x.to(device)`)."""
        module = m.other
        if module.kind is not Kind.MODULE and isinstance(m.site, ast.Call):
            module = scope.value(m.site.func)
        return bool(module.cls) and module.cls in self.ctx.project.moving_classes

    def _helpers(self, func: AnyFunction) -> list[AnyFunction]:
        return [m for m in self._class_methods(func) if m is not func]

    def _class_methods(self, func: AnyFunction) -> list[AnyFunction]:
        """The methods of `func`'s class but construction's (cached per class)."""
        ff = file_flow(self.ctx)
        cls = ff.class_of(func)
        if cls is None:
            return []
        methods = self._class_helpers.get(cls)
        if methods is None:
            skip = {"__init__", *ff.init_helpers(cls)}  # what construction makes is TD104's
            methods = [m for name, m in ff.methods(cls).items() if name not in skip]
            self._class_helpers[cls] = methods
        return methods

    def _message(
        self, func: AnyFunction, forward: AnyFunction | None, m: Mismatch, qual: str, factory: str
    ) -> str:
        device = m.other.device if m.other.device.endswith(".device") else ""
        if forward is None:
            device = device or m.other.device or "device"
        if isinstance(m.other_node, ast.Name) and m.other.kind not in _NO_DEVICE_ATTRIBUTE:
            device = f"{m.other_node.id}.device"  # the tensor it meets
        if not device:
            first = _first_input(forward if forward is not None else func)
            device = f"{first}.device" if first else "x.device"
        base = device.removesuffix(".device")
        met = self.ctx.segment(m.other_node)
        if len(met) > 40:
            met = met[:37] + "..."
        site = self.ctx.segment(m.site).split("(", 1)[0] if m.via != "operator" else "an operation"
        where = f"`{site}`" if m.via != "operator" else site
        if m.via == "module" and isinstance(m.site, ast.Call) and m.other_node is m.site.func:
            meets = f"is passed to `{met}`"
        else:
            meets = f"meets `{met}` in {where}"
        like = _LIKE_FORM.get(factory)
        alternative = ""
        if like is not None:
            alternative = (
                f" or `{like}(...)`" if like.startswith("torch.") else f" or `{base}.{like}(...)`"
            )
        path = f", and {m.path}" if m.path else ""
        if m.later:  # rebound here, it meets the device on the loop's next iteration
            path = f", on the loop's next iteration{path}"
        cls = file_flow(self.ctx).class_of(func)
        if forward is not None and cls is not None and func is not forward:
            # `forward` -> `_masks` -> `_mask`: say how forward gets there
            chain = file_flow(self.ctx).call_chain(cls, forward, func)
            if len(chain) > 2:
                through = " -> ".join(f"`{c.name}`" for c in chain)
                path += f"; {through} runs it"
        if factory in LEGACY_CONSTRUCTORS:
            if m.cpu.default_of:
                path += f", {default_text(m.cpu.default_of)}"
            dtype = _LEGACY_DTYPES.get(factory, "")
            return (
                f"`{qual}(...)` is a legacy constructor: it always makes its tensor on the CPU, "
                f"and it {meets} (line {m.site.lineno}{path}), which fails once the model is "  # type: ignore[attr-defined]
                f"on a GPU; use `torch.tensor(...{dtype}, device={device})`"
                + ("" if dtype else f" for data, `torch.empty(..., device={device})` for sizes")
            )
        if m.cpu.default_of:  # `if h is None: h = torch.zeros(n)`
            path += f", {default_text(m.cpu.default_of)}"
        made = "has no `device=`: it is made on the CPU"
        if isinstance(m.cpu.source, ast.Call) and any(
            k.arg == "device" for k in m.cpu.source.keywords
        ):
            made = "is made on the CPU by its `device=`"
        return (
            f"`{qual}(...)` {made} and {meets} (line "
            f"{m.site.lineno}{path}), which fails once the model is on a GPU; pass "  # type: ignore[attr-defined]
            f"`device={device}`{alternative}"
        )


_LEGACY_DTYPES = {
    "FloatTensor": ", dtype=torch.float",
    "DoubleTensor": ", dtype=torch.double",
    "HalfTensor": ", dtype=torch.half",
    "BFloat16Tensor": ", dtype=torch.bfloat16",
    "LongTensor": ", dtype=torch.long",
    "IntTensor": ", dtype=torch.int",
    "ShortTensor": ", dtype=torch.short",
    "ByteTensor": ", dtype=torch.uint8",
    "CharTensor": ", dtype=torch.int8",
    "BoolTensor": ", dtype=torch.bool",
}


def _on_no_gpu_path(site: ast.AST, func: AnyFunction) -> bool:
    """`site` runs only where the code found no GPU: the `else:` of
    `if torch.cuda.is_available():` (or the body of `if not use_cuda:`), where the
    model is not on one either."""
    for node in walk(func):
        if not isinstance(node, ast.If):
            continue
        test, negated = node.test, False
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, negated = test.operand, True
        if not _GPU_TEST.search(ast.unparse(test)):
            continue
        branch = node.body if negated else node.orelse
        if any(_inside(site, stmt) for stmt in branch):
            return True
    return False


# A condition that asks whether a GPU is there (`torch.cuda.is_available()`, `use_cuda`).
_GPU_TEST = re.compile(r"cuda|gpu", re.IGNORECASE)


def _inside(node: ast.AST, func: ast.AST | None) -> bool:
    if func is None:
        return False
    line = getattr(node, "lineno", 0)
    start, end = getattr(func, "lineno", 0), getattr(func, "end_lineno", None)
    return bool(start) and start <= line <= (end or start)


def _literal_cpu(value: ast.expr) -> bool:
    """`"cpu"` or `torch.device("cpu")` written out."""
    if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords:
        value = value.args[0]  # `torch.device("cpu")`
    return isinstance(value, ast.Constant) and str(value.value).startswith("cpu")


def _first_input(func: AnyFunction) -> str:
    params = [*func.args.posonlyargs, *func.args.args]
    return params[1].arg if len(params) > 1 else ""


def _runs_here(ff: FileFlow, cls: ast.ClassDef) -> bool:
    """Whether the file's own top-level code (a script, its `__main__` block) builds the
    module class it defines (`model = Net()`); not a layer other classes build."""
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == cls.name
        for node in own_code(ff.ctx.tree.body)
    )
