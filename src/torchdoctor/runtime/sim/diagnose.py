"""What went wrong, in the user's terms: built only when a rule is broken.

Walks the Python stack at the moment of the violation: the innermost user frame
(file:line and source), the submodule being run (`model.encoder.layers.0 (Linear)`),
each operand's name (parameter, buffer, plain tensor attribute, local variable)
with its device and where it was created or moved, a hint and the rule code.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from torchdoctor.runtime.sim.devices import WILD, describe, site_of
from torchdoctor.runtime.sim.frames import is_user_file
from torchdoctor.runtime.sim.rules import Operand, Violation

Tensor = torch.Tensor
Module = torch.nn.Module


@dataclass
class Culprit:
    role: str  # "culprit" or "reference"
    name: str  # self.fc1.weight, x, batch
    kind: str  # parameter, buffer, attribute, local variable, argument, tensor
    device: str
    created: str | None = None  # "created at train.py:31 by torch.zeros(...)"
    created_in: str | None = None  # the function that created it: forward
    owner: Any = None  # the module holding it, if any
    registered: bool = True  # False: held by a module the model does not register
    made_in_module: bool = False  # a local (not an argument) of a module's method
    value: Any = None  # the named tensor itself (the whole attribute, not the op's view of it)


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

    def location(self) -> str:
        if self.file is None:
            return "<unknown>"
        return f"{_short(self.file)}:{self.line}"

    def render(self) -> str:
        lines = [f"torchdoctor simulate [{self.code}]: at {self.location()}"]
        if self.source:
            lines.append(f"    {self.source}")
        if self.module:
            lines.append(f"  in module: {self.module}")
        for op in self.operands:
            text = f"  {op.name} ({op.kind}) is on {op.device}"
            if op.created:
                text += f", {op.created}"
            lines.append(text)
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _storage(t: Tensor) -> Any:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None


def _module_frames(frame: FrameType | None) -> list[tuple[FrameType, Module]]:
    found = []
    while frame is not None:
        self_obj = frame.f_locals.get("self")
        if isinstance(self_obj, Module):
            found.append((frame, self_obj))
        frame = frame.f_back
    return found


def _root_name(root: Module, start: FrameType | None) -> str:
    """The variable a user frame holds the root module in (model), else its class name."""
    frame = start
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            for name, value in frame.f_locals.items():
                if value is root and name != "self":
                    return name
                if not isinstance(value, Module) and hasattr(value, "__dict__"):
                    for attr, held in vars(value).items():  # self.model in a Trainer
                        if held is root:
                            return f"{name}.{attr}"
            for name, value in frame.f_globals.items():
                if value is root:
                    return name
        frame = frame.f_back
    return type(root).__name__


def _module_path(sub: Module, root: Module, root_name: str) -> str | None:
    if sub is root:
        return root_name
    for name, module in root.named_modules():
        if module is sub:
            return f"{root_name}.{name}"
    return None


def _unregistered_path(sub: Module, root: Module, root_name: str) -> str | None:
    """Where a module hides in a plain list/dict attribute (TD105): model.blocks[1]."""
    for name, module in root.named_modules():
        for attr, value in vars(module).items():
            items: list[tuple[str, Any]] = []
            if isinstance(value, (list, tuple)):
                items = [(f"[{i}]", v) for i, v in enumerate(value)]
            elif isinstance(value, dict):
                items = [(f"[{k!r}]", v) for k, v in value.items()]
            for suffix, item in items:
                if item is sub:
                    prefix = f"{root_name}.{name}" if name else root_name
                    return f"{prefix}.{attr}{suffix}"
    return None


def _name_in_module(storage: Any, module: Module) -> tuple[str, str, Tensor] | None:
    for name, param in module.named_parameters(recurse=False):
        if _storage(param) is storage:
            return name, "parameter", param
    for name, buf in module.named_buffers(recurse=False):
        if buf is not None and _storage(buf) is storage:
            return name, "buffer", buf
    for name, value in vars(module).items():
        if isinstance(value, Tensor) and not name.startswith("_") and _storage(value) is storage:
            return name, "plain tensor attribute, not a buffer", value
    return None


def _describe_site(t: Tensor) -> str | None:
    site = site_of(t)
    if site is None:
        return None
    file, line, what = site[:3]
    verb = "moved" if what.startswith(".to(") or what.startswith(".cuda") else "created"
    return f"{verb} at {_short(file)}:{line} by {what}"


def _name_operand(
    op: Operand,
    role: str,
    frames: list[FrameType],
    modules: list[tuple[FrameType, Module]],
    root: Module | None,
    root_name: str,
) -> Culprit:
    storage = _storage(op.tensor)
    device = describe(op.device) if op.device is not WILD else "cpu"
    site = site_of(op.tensor)
    culprit = Culprit(role, op.name, "tensor", device, _describe_site(op.tensor))
    culprit.created_in = site[3] if site is not None and len(site) > 3 else None
    if storage is None:
        return culprit
    # 1. an attribute of a module on the stack (innermost first), or of the root model
    candidates = [m for _, m in modules]
    if root is not None:
        candidates += [m for _, m in root.named_modules()]
    seen: set[int] = set()
    for module in candidates:
        if id(module) in seen:
            continue
        seen.add(id(module))
        hit = _name_in_module(storage, module)
        if hit is None:
            continue
        name, kind, culprit.value = hit
        path = None if root is None else _module_path(module, root, root_name)
        culprit.registered = root is None or path is not None
        if path is None and root is not None:
            path = _unregistered_path(module, root, root_name)
        owner = path or type(module).__name__
        culprit.name = f"{owner}.{name}"
        culprit.kind = f"{kind} of {type(module).__name__}"
        culprit.owner = module
        return culprit
    # 2. a local variable of a frame, innermost user frame first
    for frame in frames:
        for name, value in frame.f_locals.items():
            if name == "self" or not isinstance(value, Tensor):
                continue
            if _storage(value) is storage:
                code = frame.f_code
                where = f"{code.co_name}() at {_short(code.co_filename)}"
                arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
                culprit.name = name
                culprit.value = value
                culprit.kind = f"local variable in {where}"
                culprit.made_in_module = name not in arguments and isinstance(
                    frame.f_locals.get("self"), Module
                )
                if culprit.made_in_module and culprit.created is None:
                    line = _assignment_line(frame, name)
                    if line is not None:
                        culprit.created = f"assigned at {_short(code.co_filename)}:{line}"
                return culprit
    culprit.name = f"the `{op.name}` operand"
    culprit.kind = "an intermediate result"

    return culprit


def _assignment_line(frame: FrameType, name: str) -> int | None:
    """The first line of the frame's function that assigns `name` (`noise = ...`)."""
    import inspect
    import re

    try:
        lines, start = inspect.getsourcelines(frame.f_code)
    except (OSError, TypeError):
        return None
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*(:[^=]*)?=[^=]")
    for offset, text in enumerate(lines):
        if pattern.match(text):
            return start + offset
    return None


def _hint_and_code(
    violation: Violation, named: list[Culprit], module: str | None
) -> tuple[str, str]:
    kind = violation.kind
    if kind == "numpy":
        return "TD106", "call .detach().cpu().numpy() (or .tolist()/.item()) to copy it to the host"
    if kind == "pin":
        return "TD120", "pin CPU tensors before moving them; a tensor on the GPU needs no pinning"
    if kind == "ordinal":
        return "TD101", (
            "this machine has fewer devices: pick the device with torch.device('cuda') or "
            "td.pick_device() instead of a hard-coded ordinal"
        )
    if kind == "load":
        return "TD402", "pass map_location (e.g. map_location='cpu' or the target device)"
    if kind == "fork":
        return "TD120", (
            "move batches to the GPU in the training loop, not in Dataset.__getitem__ "
            "(DataLoader workers are forked processes)"
        )
    if kind == "mps-float64":
        return "TD120", "MPS has no float64: convert to float32 (.float()) before moving to mps"
    if kind == "cpu-by-design":
        return "TD120", "lengths and batch_sizes must stay on the CPU: pass lengths.cpu()"
    stray = _stray(named)
    if stray is None:
        return "TD120", "move every operand to the same device"
    if all(c.device != "cpu" for c in named) and len(named) > 1:
        others = [c.device for c in named if c is not stray]
        return "TD120", (
            f"{stray.name} is on {stray.device} but the call runs on {others[0]}: move it "
            f"with .to('{others[0]}')"
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
    made_by_factory = bool(stray.created and stray.created.startswith("created"))
    if stray.made_in_module or (made_by_factory and (stray.created_in or "").startswith("forward")):
        return "TD103", (
            f"{stray.name} is created inside the model without device=: pass "
            "device=<input>.device to the factory (or make it a registered buffer)"
        )

    others = [c.device for c in named if c is not stray]
    target = others[0] if others else "the model's device"
    return "TD112", f"move {stray.name} to {target} with .to(device) before this call"


def _stray(named: list[Culprit]) -> Culprit | None:
    """The operand on the odd device: the CPU one when one side is on the CPU."""
    cpu = [c for c in named if c.device == "cpu"]
    if len(cpu) == 1:
        return cpu[0]
    culprits = [c for c in named if c.role == "culprit"]
    return culprits[0] if culprits else None


def diagnose(violation: Violation, start: FrameType | None = None) -> Diagnosis:
    """Build the diagnosis for `violation`, raised from a frame below `start`."""
    frame = start if start is not None else sys._getframe(1)
    all_frames: list[FrameType] = []
    f: FrameType | None = frame
    while f is not None:
        all_frames.append(f)
        f = f.f_back
    user = [fr for fr in all_frames if is_user_file(fr.f_code.co_filename)]
    modules = _module_frames(frame)
    diag = Diagnosis(code="TD120", message=violation.message)
    if user:
        top = user[0]
        diag.file = top.f_code.co_filename
        diag.line = top.f_lineno
        source = linecache.getline(diag.file, diag.line).strip()
        diag.source = source or None
    root: Module | None = modules[-1][1] if modules else None
    root_name = _root_name(root, modules[-1][0].f_back) if root is not None else ""
    if modules and root is not None:
        sub = modules[0][1]
        path = _module_path(sub, root, root_name) or _unregistered_path(sub, root, root_name)
        diag.module = f"{path or root_name} ({type(sub).__name__})"
    named: list[Culprit] = []
    for op, role in ((violation.culprit, "culprit"), (violation.reference, "reference")):
        if op is not None:
            named.append(_name_operand(op, role, user, modules, root, root_name))
    diag.operands = named
    diag.code, diag.hint = _hint_and_code(violation, named, diag.module)
    return diag
