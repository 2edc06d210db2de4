"""`td.guard(model)`: name the exact culprit when a model fails, at no cost until it does.

Device attribution (TD120) adds no hooks: the model's forward is wrapped in one
`try`, and when PyTorch raises, the traceback is read — the innermost frame
whose `self` is a module gives the submodule path, its locals and parameters
give the operands and their devices.

The optional checks run only for the first `steps` steps, then remove
themselves, so the steady state costs nothing:

- TD211 forward under no_grad/inference_mode with Dropout/BatchNorm in training mode,
- TD210 BatchNorm in training mode on one sample (or a tiny batch),
- TD212 optimizer.step() twice with no zero_grad() while gradients piled up,
- TD206 a loss from an earlier step still holding its graph.

They use PyTorch's global module/optimizer hooks (never per-module hooks, which
would switch off the fused TransformerEncoderLayer fast path) and never change
a result: the hooks only read.
"""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
import weakref
from collections import deque
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from torchdoctor.catalog import lookup
from torchdoctor.errors import DeviceMismatchError, UsageError
from torchdoctor.explain.explainer import Explanation, explain
from torchdoctor.explain.frames import hide_own_frames, is_library_file

__all__ = ["Guard", "GuardWarning", "guard"]

DEFAULT_STEPS = 100
_ORIGINAL_FORWARD = "_torchdoctor_original_forward"


def _user_stacklevel() -> int:
    """The stacklevel that makes a warning point at the user's line, not at PyTorch's."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


class GuardWarning(UserWarning):
    """A runtime finding of the guard; `.code` is its rule code (TD210, TD211, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code


# --- attribution --------------------------------------------------------------------------


def _device_error(exc: BaseException, explanation: Explanation) -> DeviceMismatchError:
    where = (
        f"`{explanation.module_path}` ({explanation.module_class})"
        if explanation.module_path
        else "an operation"
    )
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    code = explanation.code or "TD120"  # the one diagnosis's code (TD112, TD104, ...)
    info = lookup(code)
    name = info.name if info is not None else "device-mismatch-at-call"
    lines = [f"{code} {name}: {where} got tensors on different devices"]
    lines += [f"  {culprit}" for culprit in explanation.culprits]
    params = [o for o in explanation.operands if o.role in ("parameter", "buffer")]
    if params and not any(c.role in ("parameter", "buffer") for c in explanation.culprits):
        lines += [f"  {param}" for param in params[:4]]
    if explanation.frame:
        lines.append(
            f"  at {explanation.frame.filename}:{explanation.frame.lineno}: "
            f"{explanation.frame.source}"
        )
    if explanation.causes:
        codes = ", ".join(explanation.causes[0].codes)
        lines.append(f"  likely: {explanation.causes[0].text}" + (f" [{codes}]" if codes else ""))
    lines.append(f"  PyTorch said: {first_line}")
    fix = explanation.fixes[0].code.splitlines()[0] if explanation.fixes else None
    error = DeviceMismatchError("\n".join(lines), fix=fix)
    error.code = code  # type: ignore[attr-defined]
    error.explanation = explanation  # type: ignore[attr-defined]
    return error


def attribute(exc: BaseException, model: Any = None) -> BaseException:
    """The exception to raise instead of `exc`: a DeviceMismatchError naming the culprit
    for device errors (chained to the original), else `exc` itself with the explanation
    attached as `exc.explanation`."""
    if isinstance(exc, DeviceMismatchError) or getattr(exc, "explanation", None) is not None:
        return exc
    try:
        explanation = explain(exc, model=model)
    except Exception:
        return exc
    if explanation.topic == "device":
        return _device_error(exc, explanation)
    with contextlib.suppress(AttributeError):
        exc.explanation = explanation  # type: ignore[attr-defined]
    return exc


def _guarded_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    original = self.__dict__.get(_ORIGINAL_FORWARD)
    try:
        if original is not None:
            return original(*args, **kwargs)
        return type(self).forward(self, *args, **kwargs)
    except Exception as exc:
        replacement = attribute(exc, self)
        if replacement is exc:
            raise
        raise replacement from exc


# --- the optional checks (first N steps) --------------------------------------------------


class _Sentinel:
    """Stored in a loss's grad_fn.metadata: alive exactly as long as that graph is."""


class _Checks:
    """Global hooks shared by every active guard; installed on first use, removed when idle."""

    def __init__(self) -> None:
        self.guards: list[Guard] = []
        self.handles: list[Any] = []
        self.originals: dict[tuple[type, str], Any] = {}
        self.zeroed = True  # zero_grad() seen since the last step
        self.step_index = 0
        self.loss_graphs: deque[tuple[int, weakref.ref[_Sentinel]]] = deque(maxlen=8)
        self.grads: dict[int, list[tuple[Any, Any, int]]] = {}

    def add(self, guard: Guard) -> None:
        self.guards.append(guard)
        if len(self.guards) == 1:
            self._install()

    def discard(self, guard: Guard) -> None:
        if guard in self.guards:
            self.guards.remove(guard)
            if not self.guards:
                self._uninstall()

    def _install(self) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self.handles = [
            register_module_forward_pre_hook(self.forward_pre_hook),
            register_optimizer_step_pre_hook(self.step_pre_hook),
            register_optimizer_step_post_hook(self.step_post_hook),
        ]
        self._patch(torch.optim.Optimizer, "zero_grad", self._zero_grad_wrapper)
        self._patch(nn.Module, "zero_grad", self._zero_grad_wrapper)
        self._patch(torch.Tensor, "backward", self._backward_wrapper)

    def _uninstall(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        for (owner, name), original in self.originals.items():
            setattr(owner, name, original)
        self.originals = {}
        self.loss_graphs.clear()
        self.grads.clear()
        self.zeroed = True

    def _patch(self, owner: type, name: str, make: Any) -> None:
        original = owner.__dict__[name]
        self.originals[(owner, name)] = original
        setattr(owner, name, make(original))

    def _zero_grad_wrapper(self, original: Any) -> Any:
        checks = self

        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            checks.zeroed = True
            return original(obj, *args, **kwargs)

        zero_grad.__doc__ = original.__doc__
        return zero_grad

    def _backward_wrapper(self, original: Any) -> Any:
        checks = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            node: Any = tensor.grad_fn
            if node is not None:
                sentinel = _Sentinel()
                node.metadata["torchdoctor"] = sentinel
                checks.loss_graphs.append((checks.step_index, weakref.ref(sentinel)))
            return original(tensor, *args, **kwargs)

        backward.__doc__ = original.__doc__
        return backward

    # hooks: they only read, never return a value, so results are unchanged
    def forward_pre_hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        for guard in list(self.guards):
            guard._on_forward(module, args)

    def step_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        accumulated = False
        if not self.zeroed:
            for param_ref, grad_ref, version in self.grads.get(id(optimizer), ()):
                param, grad = param_ref(), grad_ref()
                alive = param is not None and grad is not None and param.grad is grad
                if alive and grad._version != version:
                    accumulated = True
                    break
        kept = [index for index, ref in self.loss_graphs if index <= self.step_index - 2 and ref()]
        for guard in list(self.guards):
            guard._on_step(optimizer, accumulated, bool(kept))
        if kept:
            self.loss_graphs.clear()

    def step_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.step_index += 1
        self.zeroed = False
        records = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    records.append(
                        (weakref.ref(param), weakref.ref(param.grad), param.grad._version)
                    )
        self.grads[id(optimizer)] = records
        for guard in list(self.guards):
            guard._after_step()


_CHECKS = _Checks()


# --- the guard ----------------------------------------------------------------------------


class Guard:
    """Returned by `td.guard(...)`: a context manager, or call `.remove()` when done."""

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        checks: bool = True,
        steps: int = DEFAULT_STEPS,
        warn: bool = True,
        nonfinite: bool = False,
    ) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise UsageError(f"td.guard() takes an nn.Module, not {type(model).__name__}")
        if steps < 0:
            raise UsageError(f"steps must be >= 0, not {steps}")
        self.model = model
        self.steps = steps
        self.warn = warn
        self.findings: list[tuple[str, str]] = []  # (code, message), in order
        self._reported: set[tuple[str, str]] = set()
        self._calls = 0
        self._steps_seen = 0
        self._module_calls = 0
        self._batch_max = 0
        self._module_ids: set[int] | None = None
        self._param_ids: set[int] | None = None
        self._names: dict[int, str] = {}
        self._checking = False
        self._wrapped = False
        if model is not None:
            self._wrap_forward(model)
            self._module_ids = {id(m) for m in model.modules()}
            self._param_ids = {id(p) for p in model.parameters()}
            self._names = {id(m): name or type(model).__name__ for name, m in model.named_modules()}
        if checks and steps > 0:
            self._checking = True
            _CHECKS.add(self)
        self._nonfinite: Any = None  # the NaN/Inf origin finder (runtime/nonfinite.py)
        if nonfinite:
            from torchdoctor.runtime.nonfinite import NonFiniteFinder, WatchAll

            self._nonfinite = NonFiniteFinder(model).install() if model else WatchAll()

    # attribution
    def _wrap_forward(self, model: nn.Module) -> None:
        if isinstance(model.__dict__.get("forward"), types.MethodType) and (
            model.__dict__["forward"].__func__ is _guarded_forward
        ):
            return  # already guarded
        if "forward" in model.__dict__:
            model.__dict__[_ORIGINAL_FORWARD] = model.__dict__["forward"]
        model.__dict__["forward"] = types.MethodType(_guarded_forward, model)
        self._wrapped = True

    def _unwrap_forward(self, model: nn.Module) -> None:
        if not self._wrapped:
            return
        model.__dict__.pop("forward", None)
        if _ORIGINAL_FORWARD in model.__dict__:
            model.__dict__["forward"] = model.__dict__.pop(_ORIGINAL_FORWARD)
        self._wrapped = False

    # checks
    @property
    def checking(self) -> bool:
        """True while the optional checks are still on (the first `steps` steps)."""
        return self._checking

    def _report(self, code: str, key: str, message: str) -> None:
        if (code, key) in self._reported:
            return
        self._reported.add((code, key))
        self.findings.append((code, message))
        if self.warn:
            warnings.warn(GuardWarning(code, message), stacklevel=_user_stacklevel())

    def _name(self, module: nn.Module) -> str:
        return self._names.get(id(module)) or type(module).__name__

    def _on_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self._module_ids is not None:
            if id(module) not in self._module_ids:
                return
            if module is self.model:
                self._calls += 1
                if self._calls > self.steps:
                    self._stop()
                    return
        else:
            self._module_calls += 1
            if self._module_calls > self.steps * 1000:
                self._stop()
                return
        if (
            isinstance(module, (_DropoutNd, _BatchNorm))
            and module.training
            and not torch.is_grad_enabled()
        ):
            self._report(
                "TD211",
                "mode",
                f"`{self._name(module)}` ({type(module).__name__}) ran in training mode "
                "under torch.no_grad()/inference_mode(): evaluation without model.eval() "
                "— dropout stays on and BatchNorm uses (and updates) batch statistics. "
                "Call model.eval() before evaluating and model.train() after.",
            )
        if isinstance(module, _BatchNorm) and module.training and args:
            batch = args[0]
            if isinstance(batch, torch.Tensor) and batch.dim() >= 2:
                size = int(batch.shape[0])
                if size == 1:
                    per_channel = batch[0, 0].numel()
                    outcome = (
                        "PyTorch will fail with 'Expected more than 1 value per channel'"
                        if per_channel == 1
                        else "its statistics come from one sample"
                    )
                    self._report(
                        "TD210",
                        self._name(module),
                        f"`{self._name(module)}` ({type(module).__name__}) got a batch of one "
                        f"sample in training mode: {outcome}. Use model.eval() for single "
                        "samples and DataLoader(drop_last=True) for training.",
                    )
                elif self._batch_max >= 8 and size * 8 <= self._batch_max:
                    self._report(
                        "TD210",
                        self._name(module) + ":tiny",
                        f"`{self._name(module)}` ({type(module).__name__}) got a batch of {size} "
                        f"after batches of {self._batch_max} in training mode: its statistics "
                        "are noisy and skew the running averages. Use "
                        "DataLoader(drop_last=True).",
                    )
                self._batch_max = max(self._batch_max, size)

    def _owns(self, optimizer: Any) -> bool:
        if self._param_ids is None:
            return True
        return any(
            id(p) in self._param_ids for group in optimizer.param_groups for p in group["params"]
        )

    def _on_step(self, optimizer: Any, accumulated: bool, graph_kept: bool) -> None:
        if not self._owns(optimizer):
            return
        if accumulated:
            self._report(
                "TD212",
                "step",
                f"{type(optimizer).__name__}.step() ran again with no zero_grad() since the "
                "last step, and new gradients were added to the old ones: every step uses the "
                "sum of all past gradients. Call optimizer.zero_grad() once per step.",
            )
        if graph_kept:
            self._report(
                "TD206",
                "graph",
                "a loss from an earlier step still holds its autograd graph (e.g. total += loss "
                "or losses.append(loss)): memory grows every step. Keep loss.item() or "
                "loss.detach() instead.",
            )

    def _after_step(self) -> None:
        self._steps_seen += 1
        if self._steps_seen >= self.steps:
            self._stop()

    def _stop(self) -> None:
        if self._checking:
            self._checking = False
            _CHECKS.discard(self)

    # lifetime
    def remove(self) -> None:
        """Stop guarding: restore the model's forward and drop the checks."""
        self._stop()
        if self._nonfinite is not None:
            self._nonfinite.remove()
            self._nonfinite = None
        if self.model is not None:
            self._unwrap_forward(self.model)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.remove()
        if exc is not None and isinstance(exc, Exception):
            replacement = attribute(exc, self.model)
            if replacement is not exc:
                raise replacement from exc
            hide_own_frames(exc)  # e.g. the NaN finder's NonFiniteError, raised in its hooks

    def __repr__(self) -> str:
        target = type(self.model).__name__ if self.model is not None else "all models"
        state = "checking" if self._checking else "attribution only"
        return f"<torchdoctor guard of {target}: {state}, {len(self.findings)} finding(s)>"


def guard(
    model: nn.Module | None = None,
    *,
    checks: bool = True,
    steps: int = DEFAULT_STEPS,
    warn: bool = True,
    nonfinite: bool = False,
) -> Guard:
    """Guard `model` (or, with no model, every module and optimizer: `torchdoctor run`).

    Use as `with td.guard(model): ...` or `g = td.guard(model); ...; g.remove()`.
    Failures are attributed (TD120 names the submodule, parameter and input);
    the optional checks (TD210/TD211/TD212/TD206) run for the first `steps` steps
    and then remove themselves. Findings are warned (GuardWarning) and kept in
    `.findings`. With `nonfinite=True` the first NaN/Inf in forward or backward stops
    the run with a NonFiniteError (TD217) naming the module, the operation, the step
    and the statistics of its inputs and parameters.
    """
    return Guard(model, checks=checks, steps=steps, warn=warn, nonfinite=nonfinite)


def active_guards() -> list[Guard]:
    """The guards whose checks are still running (for tests and `torchdoctor run`)."""
    return list(_CHECKS.guards)
