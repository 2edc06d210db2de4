"""Run a torch composite whose operands were checked up front without the dispatch mode.

An LSTM on the CPU decomposes into a dozen small ops per time step; sending each
through the mode would make RNNs several times slower. Once the RNN's own
device check (input, hidden state, parameters) has passed, nothing inside can
mix devices, so the call runs with the mode off, its outputs are tagged with the
device, and its backward (an inner graph) runs with the mode off too, handing
back gradients tagged with the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from torchdoctor.runtime.sim.devices import set_tag

Tensor = torch.Tensor


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _replace(value: Any, mapping: dict[int, Tensor]) -> Any:
    if isinstance(value, Tensor):
        return mapping.get(id(value), value)
    if isinstance(value, list):
        return [_replace(item, mapping) for item in value]
    if isinstance(value, tuple):
        return tuple(_replace(item, mapping) for item in value)
    return value


def _tag_all(value: Any, device: Any, keep: set[int]) -> None:
    for t in _tensors(value):
        if id(t) not in keep:
            set_tag(t, device)


class _Opaque(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, real: Callable[..., Any], args: Any, device: Any, *leaves: Tensor) -> Any:
        inner = {id(t): t.detach().requires_grad_(t.requires_grad) for t in leaves}
        with torch.enable_grad(), _disable_current_modes():
            out = real(*_replace(args, inner))
        outputs = _tensors(out)
        ctx.inner_inputs = [inner[id(t)] for t in leaves]
        ctx.inner_outputs = outputs
        ctx.device = device
        results = tuple(o.detach() for o in outputs)
        for r in results:
            set_tag(r, device)
        return results

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        pairs = [
            (o, g)
            for o, g in zip(ctx.inner_outputs, grads, strict=True)
            if g is not None and o.requires_grad
        ]
        wanted = [t for t in ctx.inner_inputs if t.requires_grad]
        found: dict[int, Any] = {}
        if pairs and wanted:
            with _disable_current_modes():
                computed = _grad(
                    [o for o, _ in pairs], wanted, [g for _, g in pairs], torch.is_grad_enabled()
                )
            found = {id(t): g for t, g in zip(wanted, computed, strict=True)}
        result = []
        for t in ctx.inner_inputs:
            grad = found.get(id(t))
            if grad is not None:
                set_tag(grad, ctx.device)
            result.append(grad)
        return (None, None, None, *result)


def _grad(outputs: list[Tensor], inputs: list[Tensor], grads: list[Tensor], create: bool) -> Any:
    """torch.autograd.grad(outputs, inputs, grads, allow_unused=True), straight to the engine.

    torch.autograd.grad checks the given gradients' shapes with sympy-based helpers whose
    first import costs over a second of every simulated run; these gradients come from
    autograd itself, so the check has nothing to find.
    """
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    if engine is None:  # another torch: the public way
        return torch.autograd.grad(outputs, inputs, grads, allow_unused=True, create_graph=create)
    return engine.run_backward(
        tuple(outputs), tuple(grads), create, create, tuple(inputs), True, False
    )


def call_opaque(
    real: Callable[..., Any], args: tuple[Any, ...], device: Any, cpu_args: tuple[int, ...] = ()
) -> Any:
    """real(*args) with the mode off; outputs (and gradients) tagged with `device`.

    `real` returns a tuple of tensors (as the RNN functions do). `cpu_args`:
    positions of arguments that stay on the CPU (batch_sizes).
    """
    leaves = [
        t for i, a in enumerate(args) if i not in cpu_args for t in _tensors(a) if t.requires_grad
    ]
    if not leaves or not torch.is_grad_enabled():
        with _disable_current_modes():
            out = real(*args)
        keep = {id(t) for i in cpu_args for t in _tensors(args[i])}
        _tag_all(out, device, keep)
        return out
    return _Opaque.apply(real, args, device, *leaves)  # type: ignore[no-untyped-call]
