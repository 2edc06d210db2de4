"""Naming a tensor as the user knows it, from the frames on the stack.

A parameter, buffer or plain attribute of a module by its path (`model.attn.mask`),
a model input by the name `forward` gave it (`batch['x']`), a local variable of the
user's code (`y`), or the tensors the running expression reads (`self.mask[:t] == 0`),
with where it was made or last moved, the line that bound it and a `.to()` whose
result was dropped. Used by `torchdoctor.runtime.diagnosis`.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

from torchdoctor.runtime.evidence import (
    binding_line,
    dropped_move_line,
    referenced_names,
    running_expression,
)
from torchdoctor.runtime.sim.devices import describe, site_of, tag_of
from torchdoctor.runtime.sim.frames import is_user_file

Tensor = torch.Tensor
Module = torch.nn.Module
MACHINERY = os.path.normcase(torch.nn.modules.module.__file__ or "")
OWN_DIR = os.path.normcase(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep

UNNAMED = "an intermediate result"


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
    bound_at: str | None = None  # "t.py:23": where the user's name got it (for x in loader)
    expression: str | None = None  # how the failing line used it: self.bias[:, :T] == 0
    code: str = ""

    def describe(self) -> str:
        text = f"{self.name} ({self.kind}) is on {self.device}"
        if self.expression:
            text += f", used as `{self.expression}`"
        if self.created:
            text += f", {self.created}"
        return text


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


def device_name(t: Tensor) -> str:
    tag = tag_of(t)
    return describe(tag) if tag is not None else str(t.device)


# --- the stack ----------------------------------------------------------------------------


@dataclass
class Stack:
    frames: list[FrameType]  # innermost first
    lasti: dict[int, int]  # id(frame) -> the instruction it was at (from the traceback)
    user: list[FrameType]  # user frames, innermost first
    modules: list[tuple[FrameType, Module]]  # frames whose self is a module, innermost first
    root: Module | None
    root_name: str


def _is_method(module: Module, code: Any) -> bool:
    """`code` is a method of the module's class (its first argument is self, by any name)."""
    method = getattr(type(module), code.co_name, None)
    return getattr(method, "__code__", None) is code


def build_stack(frames: list[FrameType], lasti: dict[int, int], root: Module | None) -> Stack:
    user = [f for f in frames if is_user_file(f.f_code.co_filename)]
    modules = []
    for frame in frames:
        filename = os.path.normcase(frame.f_code.co_filename)
        if filename == MACHINERY or filename.startswith(OWN_DIR):
            continue  # nn.Module's call machinery, our wrappers: the module's methods say more
        code = frame.f_code
        first = code.co_varnames[0] if code.co_argcount else "self"
        self_obj = frame.f_locals.get(first)
        if isinstance(self_obj, Module) and (first == "self" or _is_method(self_obj, code)):
            modules.append((frame, self_obj))
    if root is None and modules:
        root = modules[-1][1]
    root_name = ""
    if root is not None:
        outer = next((f for f, m in reversed(modules) if m is root), None)
        root_name = _root_name(root, outer.f_back if outer is not None else frames[-1])
    return Stack(frames, lasti, user, modules, root, root_name)


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


def module_path(sub: Module, root: Module, root_name: str) -> str | None:
    if sub is root:
        return root_name
    for name, module in root.named_modules():
        if module is sub:
            return f"{root_name}.{name}"
    return None


def unregistered_path(sub: Module, root: Module, root_name: str) -> str | None:
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


def _in_module_method(stack: Stack, site: tuple[Any, ...] | None) -> bool:
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


def name_tensor(tensor: Tensor, device: str, role: str, stack: Stack) -> Culprit | None:
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
        path = None if root is None else module_path(module, root, root_name)
        culprit.registered = root is None or path is not None
        if path is None and root is not None:
            path = unregistered_path(module, root, root_name)
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
                leaf = next(
                    (pl for pl in _leaves(value, local) if _storage(pl[1]) is storage), None
                )
                if leaf is not None:
                    bound.append((frame, leaf[0], leaf[1]))
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
    line = binding_line(home_frame, base)
    if line is not None:
        where = f"{short_path(home_frame.f_code.co_filename)}:{line}"
        if culprit.created is None:
            culprit.created = f"assigned at {where}"
        elif not culprit.created.split(" by ")[0].endswith(where):
            culprit.bound_at = where  # made elsewhere (a dataset), bound to the name here
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


def statement_tensors(frame: FrameType, lasti: int | None) -> list[tuple[str, Tensor, str]]:
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
