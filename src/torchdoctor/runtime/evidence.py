"""Evidence the diagnosis reads besides the tensors: the error message and the source.

What PyTorch's device messages say (which devices, which argument), the exact
expression a frame was running (from the code object's positions), the names it
refers to, where a name was last bound, and a `.to()` whose result was dropped.
Only stdlib: it never imports torch.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import re
import textwrap
from dataclasses import dataclass
from types import FrameType

_LEGACY = re.compile(r"torch\.(?:(cuda|mps|xpu)\.)?\w+Tensor\b")


@dataclass(frozen=True)
class DeviceMessage:
    """A device error as its message tells it."""

    kind: str  # mismatch, numpy, load, ordinal
    devices: tuple[str, ...] = ()
    stray: str | None = None  # the device of the operand on the wrong side, when it says
    argument: str | None = None  # the argument it names (mat1, target, indices)


_MISMATCH: tuple[tuple[re.Pattern[str], str], ...] = (
    # (pattern, which group is the stray device: "a", "b" or "cpu-else-b")
    (
        re.compile(r"but got (?P<arg>\w+) is on (?P<a>[\w:]+), different from other tensors on "
                   r"(?P<b>[\w:]+)"),
        "a",
    ),
    (re.compile(r"found at least two devices, (?P<b>[\w:]+) and (?P<a>[\w:]+)!"), "cpu-else-a"),
    (
        re.compile(r"found input tensor at (?P<b>[\w:]+) and hidden tensor at (?P<a>[\w:]+)"),
        "cpu-else-a",
    ),
    (re.compile(r"but got (?P<arg>\w+) on (?P<a>[\w:]+) and \w+ on (?P<b>[\w:]+)"), "a"),
    (re.compile(r"Tensor on device (?P<a>[\w:]+) is not on the expected device (?P<b>[\w:]+)"),
     "unknown"),
    (
        re.compile(r"indices should be either on cpu or on the same device as the indexed "
                   r"tensor \((?P<b>[\w:]+)\)"),
        "not-b",
    ),
)  # fmt: skip


def _legacy_device(name: str) -> str:
    found = _LEGACY.search(name)
    return found.group(1) if found and found.group(1) else "cpu"


def parse_device_message(text: str) -> DeviceMessage | None:
    """The device facts of PyTorch's message, or None when it is not a device error."""
    if "can't convert" in text and "to numpy" in text:
        found = re.search(r"can't convert ([\w:]+) device type tensor", text)
        device = found.group(1) if found else ""
        return DeviceMessage("numpy", (device,), device or None)
    if "Attempting to deserialize object on" in text:
        return DeviceMessage("load")
    if "invalid device ordinal" in text:
        return DeviceMessage("ordinal")
    conv = re.search(r"Input type \(([\w.]+)\) and weight type \(([\w.]+)\)", text)
    if conv:
        a, b = _legacy_device(conv.group(1)), _legacy_device(conv.group(2))
        if a != b:
            return DeviceMessage("mismatch", (b, a), a, "input")
    for pattern, rule in _MISMATCH:
        found = pattern.search(text)
        if not found:
            continue
        groups = found.groupdict()
        a, b = groups.get("a") or "", groups.get("b") or ""
        stray: str | None
        if rule == "a":
            stray = a
        elif rule == "cpu-else-a":
            stray = "cpu" if "cpu" in (a, b) else a
        elif rule == "not-b":
            stray = None  # the indices: on some device other than cpu and b
        else:
            stray = None  # PyTorch's own wording does not say which side is odd
        devices = tuple(d for d in (b, a) if d)
        return DeviceMessage("mismatch", devices, stray, groups.get("arg"))
    return None


# --- source -----------------------------------------------------------------------------


def running_expression(frame: FrameType, lasti: int | None = None) -> str:
    """The source of the expression the frame was running (a whole multi-line call)."""
    code = frame.f_code
    index = (frame.f_lasti if lasti is None else lasti) // 2
    positions = getattr(code, "co_positions", None)
    filename = code.co_filename
    if positions is not None:
        for i, (start, end, col, end_col) in enumerate(positions()):
            if i != index:
                continue
            if start is None or end is None or col is None or end_col is None:
                break
            lines = [linecache.getline(filename, n) for n in range(start, end + 1)]
            if not all(lines):
                break
            if len(lines) == 1:
                return lines[0][col:end_col]
            return "".join([lines[0][col:], *lines[1:-1], lines[-1][:end_col]])
    return linecache.getline(filename, frame.f_lineno).strip()


def referenced_names(expression: str) -> list[str]:
    """Dotted names an expression reads, outermost first: `self.bias`, `y`, `b[1]`."""
    tree: ast.AST
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        try:
            tree = ast.parse(expression.strip())
        except SyntaxError:
            return []
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name, ast.Subscript)):
            text = _dotted(node)
            if text and text not in found:
                found.append(text)
    return found


def _dotted(node: ast.AST) -> str | None:
    """`self.fc.weight`, `b[1]`, `batch['x']`: a name reached by attributes and constant keys."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        base = _dotted(node.value)
        return f"{base}[{node.slice.value!r}]" if base else None
    return None


def _function_tree(frame: FrameType) -> tuple[ast.AST, int] | None:
    """The frame's function (or module) as a tree, and the line its source starts at."""
    code = frame.f_code
    if code.co_name == "<module>":  # getsourcelines would give the first statement only
        lines, start = linecache.getlines(code.co_filename, frame.f_globals), 1
        if not lines:
            return None
    else:
        try:
            lines, start = inspect.getsourcelines(code)
        except (OSError, TypeError):
            return None

    try:
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return None
    return tree, max(start, 1) - 1


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for element in node.elts for n in _targets(element)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def binding_line(frame: FrameType, name: str) -> int | None:
    """The last line at or before the current one that binds `name` in the frame's function."""
    found = _function_tree(frame)
    if found is None:
        return None
    tree, offset = found
    best: int | None = None
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Assign):
            names = [n for target in node.targets for n in _targets(target)]
        elif isinstance(
            node,
            (ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.For, ast.AsyncFor, ast.comprehension),
        ):
            names = _targets(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            names = _targets(node.optional_vars)
        if name not in names:
            continue
        line = getattr(node, "lineno", None) or getattr(node.target, "lineno", None)  # type: ignore[attr-defined]
        if line is None:
            continue
        line += offset
        if line <= frame.f_lineno and (best is None or line > best):
            best = line
    return best


_MOVES = frozenset({"to", "cuda", "cpu", "mps", "xpu"})


def dropped_move_line(frame: FrameType, name: str) -> int | None:
    """A statement `name.to(...)` (or `.cuda()`) before the current line: its result dropped."""
    found = _function_tree(frame)
    if found is None:
        return None
    tree, offset = found
    best: int | None = None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if not (isinstance(func, ast.Attribute) and func.attr in _MOVES):
            continue
        if _dotted(func.value) != name:
            continue
        line = node.lineno + offset
        if line < frame.f_lineno and (best is None or line > best):
            best = line
    return best
