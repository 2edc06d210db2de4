"""The one diagnosis of a device error: its rule code and the tensors at fault.

Everything that reports a device error asks this module: the virtual accelerator
(with the exact operands of the refused op, `diagnose_violation`), and the guard,
`td.diagnose`, `torchdoctor run` and `td.explain` (with a live exception,
`diagnose_exception`, which reuses a simulator's diagnosis when the exception
carries one). Culprits are only tensors on the wrong device for the failing op;
each is named in the user's terms (a parameter, buffer or plain attribute of a
module by its path, a model input by the name `forward` gave it, a local
variable) with where it was made or last moved. Where the evidence disagrees, it
says less rather than something wrong.
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from torchdoctor.runtime.evidence import DeviceMessage, parse_device_message
from torchdoctor.runtime.naming import (
    MACHINERY,
    OWN_DIR,
    UNNAMED,
    Culprit,
    Stack,
    build_stack,
    device_name,
    module_path,
    name_tensor,
    short_path,
    statement_tensors,
    unregistered_path,
)
from torchdoctor.runtime.sim.devices import WILD, describe
from torchdoctor.runtime.sim.frames import is_user_file
from torchdoctor.runtime.sim.operands import Operand
from torchdoctor.runtime.sim.rules import Violation

__all__ = ["Culprit", "Diagnosis", "diagnose_exception", "diagnose_violation"]

Module = torch.nn.Module


@dataclass
class Diagnosis:
    code: str
    message: str  # PyTorch's own message
    file: str | None = None
    line: int | None = None
    source: str | None = None
    module: str | None = None  # model.encoder (TransformerEncoder)
    operands: list[Culprit] = field(default_factory=list)
    hint: str = ""

    @property
    def key(self) -> tuple[str, str | None, int | None, str]:
        """Identity of an error for --keep-going: the same mistake at the same line."""
        return (self.code, self.file, self.line, self.message)

    @property
    def culprits(self) -> list[Culprit]:
        """The operands on the wrong device (those carrying a rule code)."""
        return [c for c in self.operands if c.code]

    def location(self) -> str:
        if self.file is None:
            return "<unknown>"
        return f"{short_path(self.file)}:{self.line}"

    def render(self) -> str:
        lines = [f"torchdoctor simulate [{self.code}]: at {self.location()}"]
        if self.source:
            lines.append(f"    {self.source}")
        if self.module:
            lines.append(f"  in module: {self.module}")
        lines += [f"  {op.describe()}" for op in self.operands]
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


# --- the rule code ------------------------------------------------------------------------


def _decide(stray: Culprit, target: str | None) -> tuple[str, str]:
    """The rule code and the hint for the operand on the wrong device (the call runs on
    `target`)."""
    if stray.device != "cpu" and target is not None and target != "cpu":
        return "TD120", (
            f"{stray.name} is on {stray.device} but the call runs on {target}: move it "
            f"with .to('{target}')"
        )
    if stray.kind.startswith("plain tensor attribute"):
        return "TD104", (
            f"{stray.name} is a plain tensor attribute, which model.to() does not move: "
            "register it with self.register_buffer(...)"
        )
    if not stray.registered:
        return "TD105", (
            f"{stray.name} belongs to a module kept in a plain list/dict, which the model "
            "does not register: use nn.ModuleList / nn.ModuleDict"
        )
    if stray.kind.startswith(("parameter", "buffer")):
        return "TD120", (
            f"{stray.name} is on {stray.device}: move the whole model with model.to(device) "
            "before using it"
        )
    if stray.dropped_move:
        return "TD102", (
            f"the result of the .to() at {stray.dropped_move} was dropped (Tensor.to is not "
            f"in place): write {stray.name.split('[', 1)[0]} = "
            f"{stray.name.split('[', 1)[0]}.to(device)"
        )
    if stray.made_in_module:
        return "TD103", (
            f"{stray.name} is created inside the model without device=: pass "
            "device=<input>.device to the factory (or make it a registered buffer)"
        )
    if stray.bound_at:  # where the batch reaches the user's code: move it there
        where = f" where it is bound at {stray.bound_at} ({stray.created})"
    else:
        where = f" after it is {stray.created.split(' by ')[0]}" if stray.created else ""
    base = stray.name.split("[", 1)[0]
    if "." in base or not stray.name.isidentifier():
        how = ".to(device)"
    else:
        how = f"{base} = {base}.to(device)"
    return "TD112", f"move {stray.name} to {target or 'the model device'} ({how}){where}"


_FIXED_CODES = {
    "numpy": (
        "TD106",
        "call .detach().cpu().numpy() (or .tolist()/.item()) to copy it to the host",
    ),
    "pin": ("TD120", "pin CPU tensors before moving them; a tensor on the GPU needs no pinning"),
    "ordinal": (
        "TD101",
        "this machine has fewer devices: pick the device with torch.device('cuda') or "
        "td.pick_device() instead of a hard-coded ordinal",
    ),
    "load": ("TD402", "pass map_location (e.g. map_location='cpu' or the target device)"),
    "fork": (
        "TD120",
        "move batches to the GPU in the training loop, not in Dataset.__getitem__ "
        "(DataLoader workers are forked processes)",
    ),
    "mps-float64": ("TD120", "MPS has no float64: convert to float32 (.float()) before moving"),
    "cpu-by-design": ("TD120", "lengths and batch_sizes must stay on the CPU: pass lengths.cpu()"),
}


def _conclude(
    diag: Diagnosis,
    kind: str,
    named: list[Culprit],
    stray_device: str | None,
    target: str | None,
) -> None:
    """Set the code, the hint and the culprits' codes from the named operands; the op
    runs on `target` and the operands on `stray_device` are the ones at fault."""
    diag.operands = named
    if kind in _FIXED_CODES:
        diag.code, diag.hint = _FIXED_CODES[kind]
        for culprit in named:
            if culprit.role == "culprit":
                culprit.code = diag.code
        return
    strays = [c for c in named if c.device == stray_device] if stray_device else []
    decided = [(_decide(s, target), s) for s in strays if s.kind != UNNAMED]
    codes = {code for (code, _), _ in decided}
    if not decided or len(codes) > 1:
        # no named culprit, or culprits that point different ways: say only what is sure
        diag.code, diag.hint = "TD120", "move every operand of this call to the same device"
        for (code, _), stray in decided:
            stray.code = code
        return
    (diag.code, diag.hint), _ = decided[0]
    for stray in strays:
        stray.code = diag.code


def _locate(diag: Diagnosis, stack: Stack) -> None:
    if stack.user:
        top = stack.user[0]
        diag.file = top.f_code.co_filename
        diag.line = _line_of(top, stack)
        diag.source = linecache.getline(diag.file, diag.line).strip() or None
    if stack.modules and stack.root is not None:
        sub = stack.modules[0][1]
        root, name = stack.root, stack.root_name
        path = module_path(sub, root, name) or unregistered_path(sub, root, name)
        diag.module = f"{path or name} ({type(sub).__name__})"


def _line_of(frame: FrameType, stack: Stack) -> int:
    lasti = stack.lasti.get(id(frame))
    if lasti is None:
        return frame.f_lineno
    positions = getattr(frame.f_code, "co_positions", None)  # Python 3.11+
    if positions is None:
        return frame.f_lineno
    for i, (line, *_rest) in enumerate(positions()):
        if i == lasti // 2 and line is not None:
            return int(line)
    return frame.f_lineno


def _named_from_statement(stack: Stack, device: str, role: str) -> list[Culprit]:
    """Tensors on `device` that the running expressions read, innermost frame first."""
    for frame in stack.frames:
        filename = os.path.normcase(frame.f_code.co_filename)
        if filename == MACHINERY or filename.startswith(OWN_DIR):
            continue
        found = []
        for expr_name, tensor, expression in statement_tensors(frame, stack.lasti.get(id(frame))):
            if device_name(tensor) != device:
                continue
            culprit = name_tensor(tensor, device, role, stack)
            if culprit is None:
                continue
            user_line = is_user_file(frame.f_code.co_filename)
            if user_line and expr_name != culprit.name and len(expression) < 80:
                culprit.expression = expression
            found.append(culprit)
        if found:
            return found
        if is_user_file(frame.f_code.co_filename):
            return []  # past the user's own line: nothing it wrote names the tensor
    return []


# --- entry points -------------------------------------------------------------------------


def diagnose_violation(violation: Violation, start: FrameType | None = None) -> Diagnosis:
    """The simulator's diagnosis: `violation` carries the exact operands of the refused op."""
    frame = start if start is not None else sys._getframe(1)
    frames: list[FrameType] = []
    f: FrameType | None = frame
    while f is not None:
        frames.append(f)
        f = f.f_back
    stack = build_stack(frames, {}, None)
    diag = Diagnosis(code="TD120", message=violation.message)
    _locate(diag, stack)
    named: list[Culprit] = []
    stray_device: str | None = None
    target: str | None = None
    pairs: list[tuple[Operand | None, str]] = [
        (violation.culprit, "culprit"),
        (violation.reference, "reference"),
    ]
    for op, role in pairs:
        if op is None:
            continue
        device = describe(op.device) if op.device is not WILD else "cpu"
        if role == "culprit":
            stray_device = device
        else:
            target = device
        culprit = name_tensor(op.tensor, device, role, stack)
        if culprit is None and role == "culprit":
            # an intermediate result: the tensor on that device the failing line reads
            found = _named_from_statement(stack, device, role)
            culprit = found[0] if len(found) == 1 else None
        if culprit is None and role == "culprit":
            culprit = Culprit(role, f"the `{op.name}` operand", UNNAMED, device)
        if culprit is not None:  # an unnamed reference tells nothing the message does not
            named.append(culprit)
    cpu = [c for c in named if c.device == "cpu"]
    if len(cpu) == 1 and len(named) > 1 and stray_device != "cpu":
        stray_device, target = "cpu", stray_device  # the CPU side is the one left behind
    _conclude(diag, violation.kind, named, stray_device, target)
    return diag


def diagnose_exception(exc: BaseException, model: Any = None) -> Diagnosis | None:
    """The diagnosis of a raised device error, or None when it is not one.

    A simulator's error carries its own (made with the exact operands); a real
    one is read from its message and the frames of its traceback.
    """
    attached = getattr(exc, "diagnosis", None)
    if isinstance(attached, Diagnosis):
        return attached
    try:
        text = str(exc)
    except Exception:
        return None
    message = parse_device_message(text)
    if message is None:
        return None
    walked = list(traceback.walk_tb(exc.__traceback__))
    frames = [f for f, _ in reversed(walked)]
    lasti = {id(tb.tb_frame): tb.tb_lasti for tb in _tbs(exc)}
    root = model if isinstance(model, Module) else None
    stack = build_stack(frames, lasti, root)
    diag = Diagnosis(code="TD120", message=text)
    _locate(diag, stack)
    stray = _stray_device(message, stack)
    named = _named_from_statement(stack, stray, "culprit") if stray else []
    if message.kind == "mismatch" and stray is not None:
        reference = _reference(stack, message, stray)
        if reference is not None:
            named.append(reference)
    target = next((d for d in message.devices if d != stray), None)
    _conclude(diag, message.kind, named, stray, target)
    return diag


def _tbs(exc: BaseException) -> list[Any]:
    found = []
    tb = exc.__traceback__
    while tb is not None:
        found.append(tb)
        tb = tb.tb_next
    return found


def _model_device(stack: Stack) -> str | None:
    if stack.root is None:
        return None
    for tensor in (*stack.root.parameters(), *stack.root.buffers()):
        return device_name(tensor)
    return None


def _stray_device(message: DeviceMessage, stack: Stack) -> str | None:
    """The device of the operand on the wrong side: from the message, else the model."""
    if message.kind == "mismatch" and len(message.devices) == 2 and "cpu" in message.devices:
        return "cpu"  # the CPU side is the one left behind (as for the simulator's operands)
    if message.stray is not None:
        return message.stray
    model_device = _model_device(stack)
    if model_device is not None and model_device in message.devices:
        others = [d for d in message.devices if d != model_device]
        return others[0] if others else None
    if message.kind == "mismatch" and len(message.devices) == 1:
        # indices on a third device: whatever is neither cpu nor the indexed tensor's
        return None
    return None


def _reference(stack: Stack, message: DeviceMessage, stray: str) -> Culprit | None:
    """One operand on the right side, for context: a parameter of the failing module."""
    if not stack.modules:
        return None
    module = stack.modules[0][1]
    for param in module.parameters(recurse=False):
        device = device_name(param)
        if device != stray:
            return name_tensor(param, device, "reference", stack)
    return None
