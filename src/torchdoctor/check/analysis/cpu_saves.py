"""Whether what a `torch.save` writes holds CPU tensors only, as the saving file shows
(TD402: a load of such a file needs no `map_location`).

A save is on the CPU when its value is brought there (`x.cpu()`, `model.cpu().state_dict()`,
or a name bound to such a value), or when the saving file never names an accelerator
(no `cuda`, `device`, `.to(`...) and the value is made there, not handed in (rooted at
`self` or at a parameter of the saving function: code elsewhere may have moved it).

The saves of a file are matched with a load by the file they write: `with open(path,
"wb") as f: torch.save(x, f)` writes `path`, as `with open(path, "rb") as f:
torch.load(f)` reads it. Across files, `analysis/saved_objects.project_saves` records
each save's CPU verdict by its file key (`ProjectIndex.saved_files_for`).
"""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.scope_index import binding, calls_on_lines
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk

SAVES = frozenset({"torch.save", "torch.serialization.save"})
# Words of a file that may run on, or write from, an accelerator. A file with none of
# them never touches a GPU: what it saves holds CPU tensors.
ACCELERATOR = re.compile(r"cuda|device|gpu|accel|\bmps\b|xla|\.to\(", re.IGNORECASE)
_OPENERS = frozenset({"open", "io.open", "gzip.open", "bz2.open", "lzma.open"})


def names_accelerator(ctx: FileContext) -> bool:
    return ctx.shared("cpu_saves.accelerator", _names_accelerator)


def _names_accelerator(ctx: FileContext) -> bool:
    return ACCELERATOR.search(ctx.source) is not None


def file_saves(ctx: FileContext) -> list[tuple[ast.AST, ast.Call, ast.expr]]:
    """(scope, call, file written) for each `torch.save` of the file with a file."""
    return ctx.shared("cpu_saves.saves", _file_saves)


def _file_saves(ctx: FileContext) -> list[tuple[ast.AST, ast.Call, ast.expr]]:
    found: list[tuple[ast.AST, ast.Call, ast.expr]] = []
    for scope, call in calls_on_lines(ctx, ctx.lines_holding(["save"]), spanning=True):
        if ctx.call_name_in(call, SAVES) is None:
            continue
        path = call.args[1] if len(call.args) > 1 else _keyword(call, "f")
        if path is not None:
            found.append((scope, call, opened_path(ctx, scope, path)))
    return found


def opened_path(ctx: FileContext, scope: ast.AST, handle: ast.expr) -> ast.expr:
    """The file `handle` stands for: `path` for `f` of `with open(path, ...) as f` in
    `scope`; else `handle` itself."""
    if not isinstance(handle, ast.Name):
        return handle
    for node in walk(scope):
        if not isinstance(node, ast.With | ast.AsyncWith):
            continue
        for item in node.items:
            opened = item.context_expr
            if (
                isinstance(item.optional_vars, ast.Name)
                and item.optional_vars.id == handle.id
                and isinstance(opened, ast.Call)
                and opened.args
                and ctx.call_name(opened) in _OPENERS
                and node.lineno <= handle.lineno <= (node.end_lineno or node.lineno)
            ):
                return opened.args[0]
    return handle


def saved_on_cpu(ctx: FileContext, scope: ast.AST, call: ast.Call) -> bool:
    """What the save writes holds CPU tensors only, as the saving file shows."""
    value = call.args[0] if call.args else _keyword(call, "obj")
    if value is None:
        return False
    if ".cpu()" in ctx.segment(value):
        return True
    if isinstance(value, ast.Name):
        bound = binding(ctx, scope, value.id, call.lineno)
        if bound is not None and ".cpu()" in ctx.segment(bound):
            return True  # `state = model.cpu().state_dict()`
    if names_accelerator(ctx):
        return False
    handed = {"self"}
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        args = scope.args
        handed |= {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    return root_name(value) not in handed


def root_name(node: ast.expr) -> str:
    """`self` for `self.model.state_dict()`, `obj` for `obj`."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)
