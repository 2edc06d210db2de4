"""Where an error happened and what was involved: from traceback text or a live exception.

Text tracebacks are parsed with the stdlib only. A live exception's frames are
inspected for tensors and modules only when torch is already imported (an
exception raised by PyTorch code always means it is): this module never
imports torch by itself.
"""

from __future__ import annotations

import itertools
import linecache
import os
import re
import sys
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# The frame line IPython prints: "File /path/x.py:12, in f(x)" or "Cell In[3], line 4"
_IPY_FRAME_LINE = re.compile(r"^\s*(?:File (?P<file>\S+?):(?P<line>\d+)|Cell In\[\d+\], line \d+)")
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)\b"
)
_CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_MARKERS = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python", "<frozen")


@dataclass(frozen=True)
class FrameInfo:
    """The innermost frame of the user's own code (not PyTorch's, not a library's)."""

    filename: str
    lineno: int
    function: str
    source: str = ""

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno} in {self.function}"
        return f"{where}\n    {self.source}" if self.source else where

    def as_dict(self) -> dict[str, Any]:
        return {
            "filename": self.filename,
            "lineno": self.lineno,
            "function": self.function,
            "source": self.source,
        }


def is_library_file(filename: str) -> bool:
    """True for PyTorch, installed libraries, the stdlib and torchdoctor itself."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    return any(marker in path for marker in _LIBRARY_MARKERS)


def hide_own_frames(error: BaseException) -> None:
    """Drop torchdoctor's frames from `error`'s traceback, as pytest hides its own.

    The one place that does this: the simulator's errors, `torchdoctor run`
    (NaN finder, guard) and the guard's context all call it. Nothing changes
    when every frame is torchdoctor's or none is.
    """
    entries = []
    tb = error.__traceback__
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    own = _PACKAGE_DIR + os.sep
    kept = [t for t in entries if not t.tb_frame.f_code.co_filename.startswith(own)]
    if not kept or len(kept) == len(entries):
        return
    for outer, inner in itertools.pairwise(kept):
        outer.tb_next = inner
    kept[-1].tb_next = None
    error.__traceback__ = kept[0]


# --- text ---------------------------------------------------------------------------------


def split_traceback(text: str) -> tuple[list[str], list[FrameInfo]]:
    """Split a pasted traceback into its exception messages (innermost chain last) and frames.

    Text that is not a traceback comes back as one message and no frames.
    """
    blocks = [text]
    for marker in _CHAIN_MARKERS:
        blocks = [part for block in blocks for part in block.split(marker)]
    messages: list[str] = []
    frames: list[FrameInfo] = []
    for block in blocks:
        lines = block.strip("\n").splitlines()
        last_frame = -1
        for index, line in enumerate(lines):
            found = _FRAME_LINE.match(line)
            if found:
                source = lines[index + 1].strip() if index + 1 < len(lines) else ""
                frames.append(FrameInfo(found["file"], int(found["line"]), found["func"], source))
                last_frame = index
            elif _IPY_FRAME_LINE.match(line):
                last_frame = index
        if last_frame < 0:
            messages.append(block.strip())
            continue
        # After the last frame: its source lines (indented, or ^^^ markers), then the message.
        rest = lines[last_frame + 1 :]
        start = next(
            (i for i, line in enumerate(rest) if _EXCEPTION_LINE.match(line)),
            next((i for i, line in enumerate(rest) if line and not line[0].isspace()), len(rest)),
        )
        message = "\n".join(rest[start:]).strip()
        if message:
            messages.append(message)
    return [m for m in messages if m] or [text.strip()], frames


def user_frame_from_text(frames: list[FrameInfo]) -> FrameInfo | None:
    for frame in reversed(frames):
        if not is_library_file(frame.filename):
            return frame
    return frames[-1] if frames else None


# --- live exceptions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Culprit:
    """A tensor, parameter or module involved in the failure."""

    role: str  # input, parameter, buffer, attribute, local, module
    name: str
    device: str = ""
    dtype: str = ""
    shape: tuple[int, ...] | None = None
    note: str = ""
    code: str = ""  # the rule code this culprit points to

    def __str__(self) -> str:
        details = ", ".join(
            part
            for part in (
                self.device,
                self.dtype,
                f"shape {list(self.shape)}" if self.shape is not None else "",
            )
            if part
        )
        text = f"{self.role} `{self.name}`"
        if details:
            text += f": {details}"
        if self.note:
            text += f" — {self.note}"
        if self.code:
            text += f" [{self.code}]"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "name": self.name,
            "device": self.device,
            "dtype": self.dtype,
            "shape": list(self.shape) if self.shape is not None else None,
            "note": self.note,
            "code": self.code,
        }


@dataclass
class LiveFindings:
    frame: FrameInfo | None = None
    module_path: str = ""
    module_class: str = ""
    culprits: tuple[Culprit, ...] = ()
    operands: tuple[Culprit, ...] = ()  # every tensor looked at, culprit or not
    codes: tuple[str, ...] = ()  # codes the culprits point to, strongest first
    diagnosis: Any = None  # torchdoctor.runtime.diagnosis.Diagnosis of a device error


def _walk(tb: TracebackType | None) -> list[tuple[FrameType, int]]:
    return list(traceback.walk_tb(tb))


def user_frame_from_traceback(tb: TracebackType | None) -> FrameInfo | None:
    frames = _walk(tb)
    chosen = next(
        (f for f in reversed(frames) if not is_library_file(f[0].f_code.co_filename)),
        frames[-1] if frames else None,
    )
    if chosen is None:
        return None
    frame, lineno = chosen
    filename = frame.f_code.co_filename
    source = linecache.getline(filename, lineno, frame.f_globals).strip()
    return FrameInfo(filename, lineno, frame.f_code.co_name, source)


def _torch() -> Any:
    return sys.modules.get("torch")


def _describe(tensor: Any) -> tuple[str, str, tuple[int, ...]]:
    return str(tensor.device), str(tensor.dtype).replace("torch.", ""), tuple(tensor.shape)


def _leaves(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Tensors inside value (nested lists/tuples/dicts, a few levels), with their paths."""
    torch = _torch()
    if torch is None:
        return
    if isinstance(value, torch.Tensor):
        yield path, value
    elif depth < 3 and isinstance(value, dict):
        for key, item in list(value.items())[:50]:
            yield from _leaves(item, f"{path}[{key!r}]", depth + 1)
    elif depth < 3 and isinstance(value, (list, tuple)):
        for index, item in enumerate(value[:50]):
            yield from _leaves(item, f"{path}[{index}]", depth + 1)


def _forward_arguments(frame: FrameType) -> Iterator[tuple[str, Any]]:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:count])
    flags = code.co_flags
    if flags & 0x04:  # *args
        names.append(code.co_varnames[count])
        count += 1
    if flags & 0x08:  # **kwargs
        names.append(code.co_varnames[count])
    for name in names:
        if name != "self" and name in frame.f_locals:
            yield from _leaves(frame.f_locals[name], name)


def _module_path(root: Any, module: Any) -> str:
    if module is root:
        return type(root).__name__
    for name, sub in root.named_modules():
        if sub is module:
            return str(name)
    return type(module).__name__


def inspect_live(exc: BaseException, root: Any = None, topic: str = "") -> LiveFindings:
    """Look at the frames of a live exception: the failing module, its operands, the culprit."""
    findings = LiveFindings(frame=user_frame_from_traceback(exc.__traceback__))
    torch = _torch()
    if torch is None:
        return findings
    frames = [f for f, _ in _walk(exc.__traceback__)]
    # Frames of forward methods (not of nn.Module's own call machinery) whose self is a module.
    machinery = torch.nn.modules.module.__file__
    module_frames = [
        f
        for f in frames
        if isinstance(f.f_locals.get("self"), torch.nn.Module)
        and f.f_code.co_filename != machinery
        and not f.f_code.co_filename.startswith(_PACKAGE_DIR + os.sep)
    ]
    if root is None and module_frames:
        root = module_frames[0].f_locals["self"]
    failing = module_frames[-1].f_locals["self"] if module_frames else None
    operands: list[Culprit] = []
    seen: set[int] = set()

    def add(role: str, name: str, tensor: Any) -> None:
        if id(tensor) in seen:
            return
        seen.add(id(tensor))
        operands.append(Culprit(role, name, *_describe(tensor)))

    # Inputs of the top-level model call, by the names the caller's forward gave them.
    if root is not None:
        root_frame = next((f for f in module_frames if f.f_locals["self"] is root), None)
        if root_frame is not None:
            for path, tensor in _forward_arguments(root_frame):
                add("input", path, tensor)
    if failing is not None:
        path = _module_path(root, failing) if root is not None else type(failing).__name__
        findings.module_path = path
        findings.module_class = type(failing).__name__
        prefix = "" if failing is root else f"{path}."
        for name, param in failing.named_parameters(recurse=False):
            add("parameter", prefix + name, param)
        for name, buf in failing.named_buffers(recurse=False):
            add("buffer", prefix + name, buf)
        registered = {id(t) for t in failing.parameters()} | {id(t) for t in failing.buffers()}
        for name, value in vars(failing).items():
            if isinstance(value, torch.Tensor) and id(value) not in registered:
                add("attribute", prefix + name, value)
        for name, value in module_frames[-1].f_locals.items():
            if name != "self":
                for leaf_path, tensor in _leaves(value, name):
                    add("local", leaf_path, tensor)
    # Tensors named in the innermost user frame (e.g. a bare `torch.mm(a, b)`).
    user = next((f for f in reversed(frames) if not is_library_file(f.f_code.co_filename)), None)
    if user is not None and (not module_frames or user is not module_frames[-1]):
        for name, value in user.f_locals.items():
            if name != "self":
                for leaf_path, tensor in _leaves(value, name):
                    add("local", leaf_path, tensor)
    findings.operands = tuple(operands)
    if topic == "device" or getattr(exc, "diagnosis", None) is not None:
        _blame_device(findings, exc, root)
    elif topic == "dtype":
        _blame_dtype(findings, failing)
    return findings


_ROLES = (
    ("input of", "input"),
    ("parameter", "parameter"),
    ("buffer", "buffer"),
    ("plain tensor attribute", "attribute"),
    ("local variable", "local"),
)


def _role(kind: str) -> str:
    return next((role for prefix, role in _ROLES if kind.startswith(prefix)), "tensor")


def _blame_device(findings: LiveFindings, exc: BaseException, root: Any) -> None:
    """The culprits as the one diagnosis engine names them (shared with the simulator)."""
    from torchdoctor.runtime.diagnosis import diagnose_exception

    diagnosis = diagnose_exception(exc, root)
    if diagnosis is None:
        return
    culprits = []
    for found in diagnosis.culprits:
        tensor = found.value
        dtype, shape = "", None
        if tensor is not None:
            _, dtype, shape = _describe(tensor)
        notes = [diagnosis.hint] if diagnosis.hint else []
        if found.created and found.created.split(" by ")[0] not in diagnosis.hint:
            notes.insert(0, found.created)
        if found.expression:
            notes.insert(0, f"used as `{found.expression}`")
        culprits.append(
            Culprit(_role(found.kind), found.name, found.device, dtype, shape, "; ".join(notes),
                    found.code)
        )  # fmt: skip
    findings.culprits = tuple(culprits)
    findings.codes = (diagnosis.code,)
    findings.diagnosis = diagnosis


def _blame_dtype(findings: LiveFindings, failing: Any) -> None:
    params = [o for o in findings.operands if o.role in ("parameter", "buffer")]
    if not params:
        return
    reference = Counter(o.dtype for o in params).most_common(1)[0][0]
    culprits = [
        Culprit(o.role, o.name, o.device, o.dtype, o.shape, f"the module's weights are {reference}")
        for o in findings.operands
        if o.role in ("input", "local") and o.dtype != reference
    ]
    findings.culprits = tuple(culprits)
