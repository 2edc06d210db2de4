from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.cpu_evidence import CpuEvidence, access_key, cpu_evidence_for
from torchdoctor.check.analysis.file_flow import file_flow, scopes_with
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.torch_api import (
    NUMPY_ARRAY_FACTORIES,
    NUMPY_CONVERTING,
    NUMPY_CONVERTING_MODULES,
)
from torchdoctor.check.analysis.values import UNKNOWN, Conversion, Kind, Place, ScopeNode, Value
from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import FixAvailability, Rule, Severity

# A file that turns gradients off globally: outputs there do not require grad.
_GRAD_OFF = ("set_grad_enabled(False)", "inference_mode()")


class NumpyOnDevice(Rule):
    """`.numpy()` on a tensor that is on a device or requires grad.

    ## What it does
    Finds `x.numpy()` where `x` is on the device (moved with `.to(device)` /
    `.cuda()`, the output of a model that was moved, or computed from one) or
    requires grad (a parameter, a model's output outside `torch.no_grad()`, a
    tensor made with `requires_grad=True`, or computed from those) and is not
    brought back with `.detach().cpu()` first.

    ## Why is this bad?
    NumPy arrays live in CPU memory. On a GPU, `.numpy()` raises
    `TypeError: can't convert cuda:0 device type tensor to numpy. Use
    Tensor.cpu() to copy the tensor to host memory first.`; on a tensor that
    requires grad it raises `RuntimeError: Can't call numpy() on Tensor that
    requires grad. Use tensor.detach().numpy() instead.` The evaluation code that
    collects predictions is where it usually bites — on the first GPU run.

    ## Example
    ```python
    outputs = model(images.to(device))
    predictions.append(outputs.argmax(dim=1).numpy())
    ```

    ## Use instead
    ```python
    predictions.append(outputs.argmax(dim=1).detach().cpu().numpy())
    ```

    ## Fix safety
    The fix inserts `.detach().cpu()` (or the part of it that is missing) before
    `.numpy()`. It is safe: both are no-ops for a CPU tensor without grad, and the
    statement raised before.

    ## References
    - https://pytorch.org/docs/stable/generated/torch.Tensor.numpy.html
    """

    code = "TD106"
    name = "numpy-on-device"
    category = "device"
    severity = Severity.ERROR
    fix_availability = FixAvailability.SAFE
    triggers: ClassVar[tuple[str, ...]] = (".numpy(", "numpy")
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        grad_off = any(self.ctx.holds(t) for t in _GRAD_OFF)
        for node in scopes_with(ff, ".numpy("):
            scope = ff.scope(node)
            for call in scope.method_calls("numpy"):
                self._check(scope, call, grad_off)
        # implicit conversions: `np.isnan(t)`, `np.mean([losses])`, `array[i] = t`
        calls = [
            f"{local}.{name}(" if target == "numpy" else f"{local}("
            for local, target in self.ctx.imports.items()
            if target == "numpy" or target.startswith("numpy.")
            for name in (NUMPY_CONVERTING | NUMPY_ARRAY_FACTORIES if target == "numpy" else [""])
        ]
        # modules whose every function converts (`metrics.f1_score(y, pred)`)
        calls += [
            f"{local}." if f"{target}." in NUMPY_CONVERTING_MODULES else f"{local}("
            for local, target in self.ctx.imports.items()
            if f"{target}.".startswith(NUMPY_CONVERTING_MODULES)
        ]
        if calls:
            for node in scopes_with(ff, *calls):
                # only code that can hold a tensor on the device or one requiring grad
                if ff.mentions(node, *_DEVICE_OR_GRAD):
                    for conversion in ff.scope(node).conversions:
                        self._check_conversion(node, conversion, grad_off)

    def _check_conversion(self, scope: ScopeNode, conversion: Conversion, grad_off: bool) -> None:
        held = conversion.value
        if held == UNKNOWN:
            evidence = cpu_evidence_for(self.ctx, scope, conversion.node)
            if evidence is not None:
                text = _short(self.ctx.segment(conversion.node))
                self.report(
                    conversion.site,
                    f"`{text}` can be on a device "
                    f"({_evidence_text(self.ctx, evidence, conversion.node)}): "
                    f"{conversion.how} converts it with `.numpy()`, which raises for such a "
                    "tensor; convert it yourself with `.cpu().numpy()`",
                )
            return
        if held.is_input or held.assumed or held.maybe:
            return
        on_device = held.place is Place.DEVICE
        grad = held.grad and not grad_off
        if not (on_device or grad):
            return
        reasons = []
        if on_device:
            reasons.append(f"is on `{held.device or 'the device'}`{_since(held)}")
        if grad:
            reasons.append("requires grad" + _why_grad(held))
        text = " ".join(self.ctx.segment(conversion.node).split())
        if len(text) > 40:
            text = text[:37] + "..."
        what = "the tensor assigned" if conversion.node is conversion.site else f"`{text}`"
        insert = (".detach()" if grad else "") + (".cpu()" if held.place is not Place.CPU else "")
        self.report(
            conversion.site,
            f"{what} {' and '.join(reasons)}: {conversion.how} converts it with `.numpy()`, "
            f"which raises for such a tensor; convert it yourself with `{insert}.numpy()` "
            "(or `.item()` for one number)",
        )

    def _check(self, scope: ScopeFlow, call: ast.Call, grad_off: bool) -> None:
        if call.args or any(kw.arg == "force" for kw in call.keywords):
            return
        assert isinstance(call.func, ast.Attribute)
        receiver = call.func.value
        held = scope.value(receiver)
        if held.place is Place.UNKNOWN and not held.grad:
            self._check_evidence(scope, call, receiver)
            return
        if held.kind not in (Kind.TENSOR, Kind.PARAMETER, Kind.BATCH):
            return
        if held.is_input or held.assumed or held.maybe:
            return  # `x.numpy() if not use_cuda else x.cpu().numpy()`: paths correlate
        on_device = held.place is Place.DEVICE
        grad = held.grad and not grad_off
        if not (on_device or grad):
            return
        text = " ".join(self.ctx.segment(receiver).split())
        if len(text) > 40:
            text = text[:37] + "..."
        reasons = []
        if on_device:
            reasons.append(f"is on `{held.device or 'the device'}`{_since(held)}")
        if grad:
            reasons.append("requires grad" + _why_grad(held))
        insert = (".detach()" if grad else "") + (".cpu()" if held.place is not Place.CPU else "")
        crash = (
            "`TypeError: can't convert cuda:0 device type tensor to numpy`"
            if on_device
            else "`RuntimeError: Can't call numpy() on Tensor that requires grad`"
        )
        message = (
            f"`{text}` {' and '.join(reasons)}: `.numpy()` raises {crash}; use `{insert}.numpy()`"
        )
        fix = self.ctx.fix(f"insert `{insert}`", self.ctx.insert_after(receiver, insert))
        self.report(call, message, fix=fix)

    def _check_evidence(self, scope: ScopeFlow, call: ast.Call, receiver: ast.expr) -> None:
        """Where the value comes from is not known, but this scope brings it to the CPU
        elsewhere (`err.data.cpu().numpy()` ... `err.data.numpy()`): it can be on a device."""
        evidence = cpu_evidence_for(self.ctx, scope.node, receiver)
        if evidence is None:
            return
        message = (
            f"`{_short(self.ctx.segment(receiver))}` can be on a device "
            f"({_evidence_text(self.ctx, evidence, receiver)}): "
            "`.numpy()` raises `TypeError: can't "
            "convert cuda:0 device type tensor to numpy` there; use `.cpu().numpy()`"
        )
        fix = self.ctx.fix("insert `.cpu()`", self.ctx.insert_after(receiver, ".cpu()"))
        self.report(call, message, fix=fix)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."


def _evidence_text(ctx: FileContext, evidence: CpuEvidence, use: ast.expr) -> str:
    moved = " ".join(ctx.segment(evidence.call).split())
    if len(moved) > 40:
        moved = "..." + moved[-37:]
    read = access_key(use)
    what = "the tensor it is part of" if read and len(read[0]) > len(evidence.key) else ""
    where = f"line {evidence.call.lineno}"
    return f"{what or 'the same value'} is brought to the CPU at {where}: `{moved}`"


_DEVICE_OR_GRAD = (
    ".to(",
    ".cuda(",
    ".cpu(",
    "device",
    "backward",
    "grad",
    "model",
    "loss",
    "forward",
)


def _since(held: Value) -> str:
    if held.name.startswith("output of"):
        return f" (the {held.name})" if held.output else f" (computed from the {held.name})"
    if held.device_line:
        return f" (moved at {held.where_line(held.device_line)})"
    return ""


def _why_grad(held: Value) -> str:
    if held.kind is Kind.PARAMETER:
        return " (a parameter)"
    if held.name.startswith("output of"):
        return f" (from the {held.name}, outside `torch.no_grad()`)"
    return ""
