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

import ast
import linecache
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from torchdoctor.runtime.evidence import (
    DeviceMessage,
    binding_line,
    dropped_move_line,
    parse_device_message,
    referenced_names,
    running_expression,
)
from torchdoctor.runtime.sim.devices import WILD, describe, site_of, tag_of
from torchdoctor.runtime.sim.frames import is_user_file
from torchdoctor.runtime.sim.rules import Operand, Violation

Tensor = torch.Tensor
Module = torch.nn.Module
_MACHINERY = os.path.normcase(torch.nn.modules.module.__file__ or "")
_OWN = os.path.normcase(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


_UNNAMED = "an intermediate result"


@dataclass
class Culprit:
    role: str  # "culprit" or "reference"
    name: str  # model.fc1.weight, x, batch['x']
    kind: str  # parameter of Linear, local variable in main() at t.py, input, ...
    device: str
    created: str | None = None  # "created at train.py:31 by torch.zeros(...)"
    created_in: str | None = None  # the function that created it
    owner: Any = None  # the module holding it, if any
    registered: bool = True  # False: held by a module the model does not register
    made_in_module: bool = False  # made by a module's own code (not passed in)
    value: Any = None  # the named tensor itself (the whole attribute, not a view)
    dropped_move: str | None = None  # "t.py:12": a `.to()` there whose result was dropped
    expression: str | None = None  # how the failing line used it: self.bias[:, :T] == 0
    code: str = ""

    def describe(self) -> str:
        text = f"{self.name} ({self.kind}) is on {self.device}"
        if self.expression:
            text += f", used as `{self.expression}`"
        if self.created:
            text += f", {self.created}"
        return text


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


def short_path(path: str) -> str:
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


def _device_name(t: Tensor) -> str:
    tag = tag_of(t)
    return describe(tag) if tag is not None else str(t.device)


# --- the stack ----------------------------------------------------------------------------


@dataclass
class _Stack:
    frames: list[FrameType]  # innermost first
    lasti: dict[int, int]  # id(frame) -> the instruction it was at (from the traceback)
    user: list[FrameType]  # user frames, innermost first
    modules: list[tuple[FrameType, Module]]  # frames whose self is a module, innermost first
    root: Module | None
    root_name: str


def _stack(frames: list[FrameType], lasti: dict[int, int], root: Module | None) -> _Stack:
    user = [f for f in frames if is_user_file(f.f_code.co_filename)]
    modules = []
    for frame in frames:
        filename = os.path.normcase(frame.f_code.co_filename)
        if filename == _MACHINERY or filename.startswith(_OWN):
            continue  # nn.Module's call machinery, our wrappers: the module's methods say more
        self_obj = frame.f_locals.get("self")
        if isinstance(self_obj, Module):
            modules.append((frame, self_obj))
    if root is None and modules:
        root = modules[-1][1]
    root_name = ""
    if root is not None:
        outer = next((f for f, m in reversed(modules) if m is root), None)
        root_name = _root_name(root, outer.f_back if outer is not None else frames[-1])
    return _Stack(frames, lasti, user, modules, root, root_name)


def _root_name(root: Module, start: FrameType | None) -> str:
    """The variable a user frame holds the root module in (model), else its class name."""
    frame = start
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            for name, value in frame.f_locals.items():
                if value is root and name != "self":
                    return name
                if not isinstance(value, Module) and hasattr(value, "__dict__"):
                    try:
                        held_items = list(vars(value).items())
                    except TypeError:
                        continue
                    for attr, held in held_items:  # self.model in a Trainer
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
                if item is sub or (isinstance(item, Module) and sub in list(item.modules())):
                    prefix = f"{root_name}.{name}" if name else root_name
                    inner = "" if item is sub else _inner_path(item, sub)
                    return f"{prefix}.{attr}{suffix}{inner}"
    return None


def _inner_path(container: Module, sub: Module) -> str:
    for name, module in container.named_modules():
        if module is sub:
            return f".{name}" if name else ""
    return ""


# --- naming one tensor --------------------------------------------------------------------


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


def _leaves(value: Any, path: str, depth: int = 0) -> list[tuple[str, Tensor]]:
    """Tensors inside a value (nested lists/tuples/dicts, a few levels), with their paths."""
    if isinstance(value, Tensor):
        return [(path, value)]
    found: list[tuple[str, Tensor]] = []
    if depth < 3 and isinstance(value, dict):
        for key, item in list(value.items())[:50]:
            found += _leaves(item, f"{path}[{key!r}]", depth + 1)
    elif depth < 3 and isinstance(value, (list, tuple)):
        for index, item in enumerate(value[:50]):
            found += _leaves(item, f"{path}[{index}]", depth + 1)
    return found


def _arguments(frame: FrameType) -> tuple[str, ...]:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
    return code.co_varnames[:count]


def _describe_site(t: Tensor) -> tuple[str | None, str | None]:
    site = site_of(t)
    if site is None:
        return None, None
    file, line, what = site[:3]
    verb = "moved" if what.startswith((".to(", ".cuda")) else "created"
    function = site[3] if len(site) > 3 else None
    return f"{verb} at {short_path(file)}:{line} by {what}", function


def _in_module_method(stack: _Stack, site: tuple[Any, ...] | None) -> bool:
    """The site (file, line, what, function) is in a method of the model's modules."""
    if site is None or len(site) < 4:
        return False
    file, function = site[0], site[3]
    if any(f.f_code.co_name == function and f.f_code.co_filename == file for f, _ in stack.modules):
        return True
    modules = [m for _, m in stack.modules]
    if stack.root is not None:
        modules += list(stack.root.modules())
    for cls in {type(m) for m in modules}:
        method = getattr(cls, function, None)
        code = getattr(method, "__code__", None)
        if code is not None and code.co_filename == file:
            return True
    return False


def name_tensor(tensor: Tensor, device: str, role: str, stack: _Stack) -> Culprit | None:
    """Name `tensor` as the user knows it; None when nothing the user holds is it."""
    storage = _storage(tensor)
    site = site_of(tensor)
    created, created_in = _describe_site(tensor)
    culprit = Culprit(role, "", "tensor", device, created, created_in)
    if storage is None:
        return None
    # 1. an attribute of a module on the stack (innermost first), or of the root model
    candidates = [m for _, m in stack.modules]
    if stack.root is not None:
        candidates += [m for _, m in stack.root.named_modules()]
    seen: set[int] = set()
    for module in candidates:
        if id(module) in seen:
            continue
        seen.add(id(module))
        hit = _name_in_module(storage, module)
        if hit is None:
            continue
        name, kind, culprit.value = hit
        root, root_name = stack.root, stack.root_name
        path = None if root is None else _module_path(module, root, root_name)
        culprit.registered = root is None or path is not None
        if path is None and root is not None:
            path = _unregistered_path(module, root, root_name)
        culprit.name = f"{path or type(module).__name__}.{name}"
        culprit.kind = f"{kind} of {type(module).__name__}"
        culprit.owner = module
        return culprit
    # 2. an input of the model: an argument of the outermost module frame's forward
    outer = next((f for f, m in reversed(stack.modules) if m is stack.root), None)
    bound: list[tuple[FrameType, str, Tensor]] = []
    # 3. local variables of user frames, innermost first (and the model's input): a local
    # that is the tensor before one that holds it in a container
    frames = list(stack.user)
    if outer is not None and outer not in frames:
        frames.append(outer)
    for direct in (True, False):
        for frame in frames:
            if any(held is frame for held, _, _ in bound):
                continue
            for local, value in list(frame.f_locals.items()):
                if local == "self" or isinstance(value, Tensor) != direct:
                    continue
                hit = next((pl for pl in _leaves(value, local) if _storage(pl[1]) is storage), None)
                if hit is not None:
                    bound.append((frame, *hit))
                    break
    if not bound:
        if created is None:
            return None
        # bound to no name, but we know where it was made: name it by that
        culprit.name = created.split(" by ", 1)[-1]
        culprit.kind = "a tensor bound to no name"
        culprit.made_in_module = created.startswith("created") and _in_module_method(stack, site)
        return culprit
    frame, path, culprit.value = bound[0]
    code = frame.f_code
    is_argument = path.split("[", 1)[0] in _arguments(frame)
    in_module = isinstance(frame.f_locals.get("self"), Module)
    culprit.name = path
    if frame is outer and is_argument:
        culprit.kind = f"input of {type(stack.root).__name__}.forward"
    else:
        culprit.kind = f"local variable in {code.co_name}() at {short_path(code.co_filename)}"
    if in_module and not is_argument:
        # made by the module's own code, unless the site shows it came from elsewhere
        culprit.made_in_module = created_in is None or _in_module_method(stack, site)
    elif created_in is not None and _in_module_method(stack, site):
        culprit.made_in_module = "created" in (created or "")
    # where it should have been moved: the outermost user frame that holds it
    home_frame, home_path = frame, path
    for other, other_path, _ in bound:
        if not isinstance(other.f_locals.get("self"), Module):
            home_frame, home_path = other, other_path
    base = home_path.split("[", 1)[0]
    if culprit.created is None:
        line = binding_line(home_frame, base)
        if line is not None:
            where = short_path(home_frame.f_code.co_filename)
            culprit.created = f"assigned at {where}:{line}"
    for other, other_path, _ in bound:
        line = dropped_move_line(other, other_path)
        assigned = binding_line(other, other_path.split("[", 1)[0])
        if line is not None and (assigned is None or line > assigned):
            culprit.dropped_move = f"{short_path(other.f_code.co_filename)}:{line}"
            break
    return culprit


def _resolve(frame: FrameType, dotted: str) -> Any:
    """The value of `self.bias` / `y` / `b[1]` in a frame, without running user code."""
    parts = re.findall(r"\.?(\w+)|\[('[^']*'|-?\d+)\]", dotted)
    value: Any = None
    for index, (attr, key) in enumerate(parts):
        if index == 0:
            if attr in frame.f_locals:
                value = frame.f_locals[attr]
            else:
                return None
            continue
        if attr:
            namespace = getattr(value, "__dict__", None)
            if isinstance(value, Module):
                for store in ("_parameters", "_buffers", "_modules"):
                    held = value.__dict__.get(store, {})
                    if attr in held:
                        value = held[attr]
                        break
                else:
                    value = namespace.get(attr) if namespace else None
            elif isinstance(namespace, dict) and attr in namespace:
                value = namespace[attr]
            else:
                return None
        else:
            try:
                value = value[ast.literal_eval(key)]
            except Exception:
                return None
        if value is None:
            return None
    return value


def _statement_tensors(frame: FrameType, lasti: int | None) -> list[tuple[str, Tensor, str]]:
    """(name, tensor, how it is used) for the tensors the frame's running expression reads."""
    expression = running_expression(frame, lasti)
    found: list[tuple[str, Tensor, str]] = []
    seen: set[int] = set()
    for name in referenced_names(expression):
        value = _resolve(frame, name)
        if not isinstance(value, Tensor) or id(value) in seen:
            continue
        seen.add(id(value))
        found.append((name, value, expression.strip()))
    return found


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
    where = f" after it is {stray.created.split(' by ')[0]}" if stray.created else ""
    base = stray.name.split("[", 1)[0]
    if "." in base or not stray.name.isidentifier():
        how = ".to(device)"
    else:
        how = f"{base} = {base}.to(device)"
    return "TD112", f"move {stray.name} to {target or 'the model device'} ({how}){where}"


_FIXED_CODES = {
    "numpy": ("TD106", "call .detach().cpu().numpy() (or .tolist()/.item()) to copy it to the host"),
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
    decided = [(_decide(s, target), s) for s in strays if s.kind != _UNNAMED]
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


def _locate(diag: Diagnosis, stack: _Stack) -> None:
    if stack.user:
        top = stack.user[0]
        diag.file = top.f_code.co_filename
        diag.line = _line_of(top, stack)
        diag.source = linecache.getline(diag.file, diag.line).strip() or None
    if stack.modules and stack.root is not None:
        sub = stack.modules[0][1]
        root, name = stack.root, stack.root_name
        path = _module_path(sub, root, name) or _unregistered_path(sub, root, name)
        diag.module = f"{path or name} ({type(sub).__name__})"


def _line_of(frame: FrameType, stack: _Stack) -> int:
    lasti = stack.lasti.get(id(frame))
    if lasti is None:
        return frame.f_lineno
    for i, (line, *_rest) in enumerate(frame.f_code.co_positions()):
        if i == lasti // 2 and line is not None:
            return line
    return frame.f_lineno


def _named_from_statement(stack: _Stack, device: str, role: str) -> list[Culprit]:
    """Tensors on `device` that the running expressions read, innermost frame first."""
    for frame in stack.frames:
        filename = os.path.normcase(frame.f_code.co_filename)
        if filename == _MACHINERY or filename.startswith(_OWN):
            continue
        found = []
        for expr_name, tensor, expression in _statement_tensors(frame, stack.lasti.get(id(frame))):
            if _device_name(tensor) != device:
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
    stack = _stack(frames, {}, None)
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
            culprit = Culprit(role, f"the `{op.name}` operand", _UNNAMED, device)
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
    stack = _stack(frames, lasti, root)
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


def _model_device(stack: _Stack) -> str | None:
    if stack.root is None:
        return None
    for tensor in (*stack.root.parameters(), *stack.root.buffers()):
        return _device_name(tensor)
    return None


def _stray_device(message: DeviceMessage, stack: _Stack) -> str | None:
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


def _reference(stack: _Stack, message: DeviceMessage, stray: str) -> Culprit | None:
    """One operand on the right side, for context: a parameter of the failing module."""
    if not stack.modules:
        return None
    module = stack.modules[0][1]
    for name, param in module.named_parameters(recurse=False):
        device = _device_name(param)
        if device != stray:
            culprit = name_tensor(param, device, "reference", stack)
            return culprit if culprit is not None else None
    return None
