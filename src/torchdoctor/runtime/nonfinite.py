"""The NaN/Inf origin finder (TD217): where did the first non-finite value come from?

Cheap while nothing is wrong: each guarded model call checks its outputs once
(one fused reduction), and each backward checks the gradient arriving at the
model's output and, at its end, all parameter gradients (one `_foreach_norm`).
Nothing runs per operation. When a check fails, the step is *replayed* on the
same inputs with a dispatch mode that checks every operation's outputs, and a
function mode that remembers which submodule made each autograd node, so the
first operation that turned finite inputs into NaN/Inf is named, forward or
backward, with its module path and the statistics of its inputs and of the
module's parameters. The replay restores the model's buffers (BatchNorm
statistics) and never writes `.grad`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CODE = "TD217"


class NonFiniteError(FloatingPointError):
    """TD217: the first NaN/Inf of a run; `.report` holds where and why."""

    def __init__(self, report: NonFiniteReport) -> None:
        super().__init__(report.render())
        self.report = report
        self.code = CODE


@dataclass
class Stats:
    name: str
    dtype: str
    shape: tuple[int, ...]
    min: float
    max: float
    nan: bool
    inf: bool

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> Stats:
        data = t.detach()
        finite = data[torch.isfinite(data)] if data.is_floating_point() else data
        low = float(finite.min()) if finite.numel() else math.nan
        high = float(finite.max()) if finite.numel() else math.nan
        floating = data.is_floating_point()
        return cls(
            name,
            str(data.dtype).replace("torch.", ""),
            tuple(data.shape),
            low,
            high,
            bool(floating and torch.isnan(data).any()),
            bool(floating and torch.isinf(data).any()),
        )

    def render(self) -> str:
        bad = [w for w, on in (("NaN", self.nan), ("Inf", self.inf)) if on]
        extra = f", has {' and '.join(bad)}" if bad else ""
        return (
            f"{self.name}: {self.dtype}{list(self.shape)} min {self.min:.4g} max "
            f"{self.max:.4g}{extra}"
        )


@dataclass
class NonFiniteReport:
    phase: str  # "forward" or "backward"
    step: int
    module: str  # the submodule path, "" for the model itself
    operation: str
    inputs: list[Stats] = field(default_factory=list)
    parameters: list[Stats] = field(default_factory=list)
    suggestion: str = ""
    model_class: str = ""

    def render(self) -> str:
        where = f"`{self.module}`" if self.module else f"the model ({self.model_class})"
        lines = [
            f"{CODE} non-finite-value: the first NaN/Inf of step {self.step} came from "
            f"{self.operation} in {where}, {self.phase} pass"
        ]
        lines += [f"  input {s.render()}" for s in self.inputs]
        lines += [f"  parameter {s.render()}" for s in self.parameters]
        if self.suggestion:
            lines.append(f"  hint: {self.suggestion}")
        return "\n".join(lines)


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):  # the common case, without pytree's cost
        return [tree]
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _floats(tree: Any) -> list[torch.Tensor]:
    return [t for t in _tensors(tree) if t.is_floating_point() or t.is_complex()]


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value is finite, in one cheap pass.

    A NaN/Inf anywhere makes a sum (or a norm) non-finite; a finite sum proves all are
    finite. A non-finite sum may also be an overflow of huge finite values, so that case
    is confirmed exactly (rare, and only then is the slow check paid).
    """
    tensors = [t.detach() for t in tensors if t is not None and t.numel()]
    if not tensors:
        return True
    if len(tensors) == 1:
        total = tensors[0].sum()
    else:
        total = torch.stack(torch._foreach_norm([_as_float(t) for t in tensors])).sum()
    if math.isfinite(float(total.real if total.is_complex() else total)):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _as_float(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_floating_point() or t.is_complex() else t.float()


# -- the suggestion ------------------------------------------------------------------

LOG_OPS = ("log", "log2", "log10", "xlogy", "log_softmax", "LogBackward", "Log2Backward")
DIV_OPS = ("div", "reciprocal", "rsqrt", "DivBackward", "ReciprocalBackward", "RsqrtBackward")


def suggest(report: NonFiniteReport, lr: float | None = None) -> str:
    op = report.operation
    low = min((s.min for s in report.inputs if not math.isnan(s.min)), default=math.nan)
    big = max((max(abs(s.min), abs(s.max)) for s in report.parameters), default=0.0)
    if any(s.nan or s.inf for s in report.parameters):
        return (
            "a parameter is already non-finite: an earlier optimizer step wrote it (learning "
            "rate too high, or fp16 gradients without GradScaler)"
        )
    if any(name in op for name in LOG_OPS) and low <= 0:
        return (
            "log of zero (or of a negative number): clamp the input (x.clamp_min(1e-8)) or "
            "use log_softmax / F.cross_entropy instead of log(softmax(x))"
        )
    if "sqrt" in op.lower() and low <= 0:
        return "sqrt at 0 has an infinite gradient: use (x + 1e-8).sqrt() or a smooth norm"
    if any(name in op for name in DIV_OPS):
        return "division by zero: add an epsilon to the divisor (x / (y + 1e-8))"
    if any(s.dtype in ("float16", "bfloat16") for s in report.inputs):
        return (
            "float16 overflow (max 65504): use torch.amp.GradScaler, or bfloat16 "
            "(autocast(dtype=torch.bfloat16)), or keep this op in float32"
        )
    if big > 1e4 or (lr is not None and lr >= 1.0):
        return "the weights have grown huge: lower the learning rate or clip gradients"
    return "inspect the inputs above: an extreme value reached this operation"


# -- the replay ------------------------------------------------------------------------


class _Found(Exception):
    def __init__(self, report: NonFiniteReport) -> None:
        self.report = report


class _Origin(TorchFunctionMode):  # type: ignore[no-untyped-call]
    """Remembers which submodule (and which torch function) made each autograd node."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.stack = stack
        self.nodes: dict[int, tuple[str, str]] = {}
        self.keep: list[Any] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in _tensors(out):
            node = t.grad_fn
            if node is not None and id(node) not in self.nodes:
                self.keep.append(node)  # ids stay unique while the replay lives
                name = getattr(func, "__name__", str(func))
                self.nodes[id(node)] = (self.stack[-1] if self.stack else "", name)
        return out


class _Check(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Stops at the first operation whose finite inputs give a non-finite output."""

    def __init__(self, finder: NonFiniteFinder, stack: list[str], origin: _Origin) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.finder = finder
        self.stack = stack
        self.origin = origin
        self.phase = "forward"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outputs = _floats(out)
        if outputs and not all_finite(outputs):
            inputs = _floats((args, kwargs))
            if all_finite(inputs):
                raise _Found(self._report(func, inputs))
        return out

    def _report(self, func: Any, inputs: list[torch.Tensor]) -> NonFiniteReport:
        module = self.stack[-1] if self.stack else ""
        operation = f"aten.{func.__name__}" if hasattr(func, "__name__") else str(func)
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                module, made_by = self.origin.nodes.get(id(node), (module, ""))
                via = f" (the gradient of {made_by})" if made_by else ""
                operation = f"{node.name()}{via}, {operation}"
        return self.finder.report(self.phase, module, operation, inputs)


class NonFiniteFinder:
    """Watches one model; see the module docstring."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.step = 0
        self.paths = {id(m): name for name, m in model.named_modules()}
        self._forward = model.forward
        self._before = model.__dict__.get("forward")  # a wrapper of the guard, if any
        self._installed = False
        self._params: list[nn.Parameter] | None = None

    # -- install -------------------------------------------------------------

    def install(self) -> NonFiniteFinder:
        if not self._installed:
            self.model.forward = self._watched  # type: ignore[method-assign]
            self._installed = True
        return self

    def remove(self) -> None:
        if self._installed:
            self.model.__dict__.pop("forward", None)
            if self._before is not None:
                self.model.__dict__["forward"] = self._before
            self._installed = False

    def _watched(self, *args: Any, **kwargs: Any) -> Any:
        out = self._forward(*args, **kwargs)
        if torch.is_grad_enabled() and self.model.training:
            self.step += 1
        if not all_finite(_floats(out)):
            self._find_forward(args, kwargs)
        elif torch.is_grad_enabled():
            self._watch_backward(out, args, kwargs)
        return out

    def _watch_backward(self, out: Any, args: Any, kwargs: Any) -> None:
        first = next((t for t in _floats(out) if t.requires_grad), None)
        if first is None:
            return
        step = self.step

        # The hook must not hold `first` itself: a tensor -> hook -> tensor cycle would
        # keep every step's graph alive until the garbage collector runs.
        def arrived(grad: torch.Tensor) -> None:
            if not all_finite([grad]):
                raise NonFiniteError(self._from_loss(grad, step))
            engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
            engine.queue_callback(lambda: self._check_grads(grad, args, kwargs, step))

        first.register_hook(arrived)  # type: ignore[no-untyped-call]

    def _check_grads(self, grad: torch.Tensor, args: Any, kwargs: Any, step: int) -> None:
        if self._params is None:
            self._params = list(self.model.parameters())
        grads = [p.grad for p in self._params if p.grad is not None]
        if not all_finite(grads):
            self._find_backward(grad, args, kwargs, step)

    # -- reports -------------------------------------------------------------

    def report(
        self, phase: str, module: str, operation: str, inputs: list[torch.Tensor]
    ) -> NonFiniteReport:
        owner = dict(self.model.named_modules()).get(module, self.model)
        params = [Stats.of(n, p) for n, p in owner.named_parameters()]
        result = NonFiniteReport(
            phase,
            self.step,
            module,
            operation,
            [Stats.of(f"#{i}", t) for i, t in enumerate(inputs[:4])],
            params[:4],
        )
        result.model_class = type(self.model).__name__
        result.suggestion = suggest(result)
        return result

    def _from_loss(self, grad: torch.Tensor, step: int) -> NonFiniteReport:
        result = NonFiniteReport(
            "backward", step, "", "the gradient arriving at the model's output", [], []
        )
        result.inputs = [Stats.of("grad of the output", grad)]
        result.model_class = type(self.model).__name__
        result.suggestion = (
            "the loss (computed after the model) made it: look for log(0), x/0 or sqrt(0) "
            "in the loss, or use a built-in loss (F.cross_entropy, BCEWithLogitsLoss)"
        )
        return result

    def _broken_parameter(self, phase: str) -> NonFiniteReport | None:
        for name, p in self.model.named_parameters():
            if not all_finite([p]):
                module, _, param = name.rpartition(".")
                result = self.report(phase, module, f"parameter {param}", [])
                result.parameters = [Stats.of(name, p)]
                result.suggestion = suggest(result)
                return result
        return None

    @contextlib.contextmanager
    def _replay(self) -> Iterator[tuple[list[str], _Origin, _Check]]:
        """Module stack + origin and check modes, with the model's buffers restored after."""
        stack: list[str] = []
        saved = [(b, b.detach().clone()) for b in self.model.buffers()]

        def enter(module: nn.Module, _: Any) -> None:
            stack.append(self.paths.get(id(module), ""))

        def leave(module: nn.Module, _: Any, __: Any) -> None:
            if stack:
                stack.pop()

        handles = [m.register_forward_pre_hook(enter) for m in self.model.modules()]
        handles += [m.register_forward_hook(leave) for m in self.model.modules()]
        origin = _Origin(stack)
        check = _Check(self, stack, origin)
        try:
            with origin, check:
                yield stack, origin, check
        finally:
            for handle in handles:
                handle.remove()
            with torch.no_grad():
                for buffer, value in saved:
                    buffer.copy_(value)

    def _find_forward(self, args: Any, kwargs: Any) -> None:
        broken = self._broken_parameter("forward")
        if broken is not None:
            raise NonFiniteError(broken)
        try:
            with self._replay(), torch.no_grad():
                self._forward(*args, **kwargs)
        except _Found as found:
            raise NonFiniteError(found.report) from None
        inputs = _floats((args, kwargs))
        if not all_finite(inputs):
            result = self.report("forward", "", "its input", inputs)
            result.suggestion = (
                "the NaN/Inf was made before this call, outside any watched module: look at "
                "the code that computed the input (log(0), x / 0, sqrt of a negative number)"
            )
            raise NonFiniteError(result)
        raise NonFiniteError(self.report("forward", "", "the model's output", inputs))

    def _find_backward(self, grad: torch.Tensor, args: Any, kwargs: Any, step: int) -> None:
        params = [p for p in self.model.parameters() if p.requires_grad]
        try:
            with self._replay() as (_, _, check), torch.enable_grad():
                replayed = _floats(self._forward(*args, **kwargs))
                first = next(t for t in replayed if t.requires_grad)
                check.phase = "backward"
                torch.autograd.grad(first, params, grad, allow_unused=True)
        except _Found as found:
            raise NonFiniteError(found.report) from None
        raise NonFiniteError(
            self.report("backward", "", "the backward pass (not reproduced on replay)", [])
        )


def watch(model: nn.Module) -> NonFiniteFinder:
    """Find the origin of the first NaN/Inf in `model`'s forward or backward (TD217)."""
    return NonFiniteFinder(model).install()


class WatchAll:
    """`torchdoctor run --detect-nonfinite`: watch every top-level module (model and loss).

    Global module hooks spot the modules called at the top level during the first
    `limit` top-level calls and watch each one from then on (including that first
    call, checked from the global hooks); then the hooks remove themselves, so the
    steady state costs what `watch(model)` costs.
    """

    def __init__(self, limit: int = 20) -> None:
        self.limit = limit
        self.finders: dict[int, NonFiniteFinder] = {}
        self._depth = 0
        self._calls = 0
        self._inputs: dict[int, tuple[Any, Any]] = {}
        from torch.nn.modules import module as module_hooks

        self._handles = [
            module_hooks.register_module_forward_pre_hook(self._enter),
            module_hooks.register_module_forward_hook(self._leave),
        ]

    def _enter(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0 and id(module) not in self.finders:
            self.finders[id(module)] = finder = NonFiniteFinder(module)
            self._inputs[id(module)] = (finder, args)
        self._depth += 1

    def _leave(self, module: nn.Module, args: Any, out: Any) -> None:
        self._depth -= 1
        if self._depth:
            return
        pending = self._inputs.pop(id(module), None)
        if pending is not None:  # this call was not watched yet: check it from here
            finder, inputs = pending
            if torch.is_grad_enabled() and module.training:
                finder.step += 1
            if not all_finite(_floats(out)):
                finder._find_forward(inputs, {})
            elif torch.is_grad_enabled():
                finder._watch_backward(out, inputs, {})
            finder.install()
        self._calls += 1
        if self._calls >= self.limit:
            self._unhook()

    def _unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def remove(self) -> None:
        self._unhook()
        for finder in self.finders.values():
            finder.remove()


@contextlib.contextmanager
def watching(model: nn.Module | None = None) -> Iterator[Any]:
    """Watch `model` (or every top-level module) for the first NaN/Inf while inside."""
    handle: NonFiniteFinder | WatchAll = watch(model) if model is not None else WatchAll()
    try:
        yield handle
    finally:
        handle.remove()
