"""Whether what a `torch.save` writes holds CPU tensors only, as the saving file shows
(TD402: a load of such a file needs no `map_location`).

A save is on the CPU when its value is brought there (`x.cpu()`, `model.cpu().state_dict()`,
a name bound to such a value, a model whose last move before the save is
`model.eval().cpu()`), or when the saving file never names an accelerator
(no `cuda`, `device`, `.to(`...) and the value is made there, not handed in (rooted at
`self` or at a parameter of the saving function: code elsewhere may have moved it).

The saves of a file are matched with a load by the file they write: `with open(path,
"wb") as f: torch.save(x, f)` writes `path`, as `with open(path, "rb") as f:
torch.load(f)` reads it. Across files, `analysis/saved_objects.project_saves` records
each save's CPU verdict by its file key (`ProjectIndex.saved_files_for`). A state
dict loaded into a `Net()` is matched with the file's saves of `Net`s' `state_dict()`s.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.check.analysis.scope_index import (
    binding,
    calls_on_lines,
    scope_nodes,
)
from torchdoctor.check.analysis.syntax import assigned_values
from torchdoctor.check.analysis.torch_api import is_cpu_name
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
        path = save_path(call)
        if path is not None:
            found.append((scope, call, bound_once(scope, opened_path(ctx, scope, path))))
    return found


def bound_once(scope: ast.AST, node: ast.expr) -> ast.expr:
    """What a name is bound to when `scope` binds it exactly once, by a plain assignment
    (`save_path = os.path.join(d, f"out-{tag}.pt")`); else the node itself."""
    if not isinstance(node, ast.Name):
        return node
    values = assigned_values(scope, node.id)
    return values[0] if values is not None and len(values) == 1 else node


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
    value = call.args[0] if call.args else keyword(call, "obj")
    if value is None:
        return False
    if brought_to_cpu(value):
        return True
    if isinstance(value, ast.Name):
        bound = binding(ctx, scope, value.id, call.lineno)
        if bound is not None and brought_to_cpu(bound):
            return True  # `state = model.cpu().state_dict()`
    if _moved_to_cpu_before(ctx, scope, root_name(value), call.lineno):
        return True
    if names_accelerator(ctx):
        return False
    handed = {"self"}
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        args = scope.args
        handed |= {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    return root_name(value) not in handed


def brought_to_cpu(node: ast.expr) -> bool:
    """`node`'s tensors are all on the CPU by its own text: the last move of its call
    chain is to the CPU (`x.detach().cpu()`, `model.cpu().state_dict()`), or it is a
    container whose every item is that or a literal (`{"w": w.cpu(), "step": 3}`,
    `{k: v.cpu() for k, v in sd.items()}`). A `.cpu()` elsewhere in it proves nothing
    (`{"model": model.state_dict(), "loss": loss.cpu()}`)."""
    if isinstance(node, ast.Dict):
        return bool(node.values) and all(_item_on_cpu(v) for v in node.values)
    if isinstance(node, ast.List | ast.Tuple):
        return bool(node.elts) and all(_item_on_cpu(e) for e in node.elts)
    if isinstance(node, ast.DictComp):
        return brought_to_cpu(node.value)
    if isinstance(node, ast.ListComp | ast.GeneratorExp):
        return brought_to_cpu(node.elt)
    return _last_move(node) == "cpu"


def _item_on_cpu(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) or brought_to_cpu(node)


def _last_move(call: ast.expr) -> str:
    """The outermost device move of a call chain: "cpu", "other", or "" for none."""
    return next(_chain_moves(call), "")


def loads_cpu_saved_state(
    ctx: FileContext, scope: ast.AST, load: ast.Call, parent: ast.AST
) -> bool:
    """The state `load` reads goes into a `Net()` of `scope` (`net.load_state_dict(
    state)`), and every save of this file of a `Net`'s `state_dict()` (there is one)
    writes CPU tensors (`net.eval().cpu()` before `torch.save(net.state_dict(), p)`):
    the file's own checkpoints of that model hold CPU tensors."""
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        target = parent.targets[0]
        if not isinstance(target, ast.Name):
            return False
        uses = [
            n
            for n in walk(scope)
            if isinstance(n, ast.Call)
            and n.args
            and isinstance(n.args[0], ast.Name)
            and n.args[0].id == target.id
        ]
    elif isinstance(parent, ast.Call) and parent.args and parent.args[0] is load:
        uses = [parent]
    else:
        return False
    for use in uses:
        if not (isinstance(use.func, ast.Attribute) and use.func.attr == "load_state_dict"):
            continue
        cls = built_class(ctx, scope, root_name(use.func.value), use.lineno)
        saves = _state_saves_of(ctx, cls) if cls else []
        if saves and all(saved_on_cpu(ctx, where, call) for where, call in saves):
            return True
    return False


def built_class(ctx: FileContext, scope: ast.AST, name: str, line: int) -> str | None:
    """`Net` for `name` bound (before `line` in `scope`) to `Net(...)` or
    `Net(...).to(device)`: a module of the class `Net`."""
    bound = binding(ctx, scope, name, line)
    while isinstance(bound, ast.Call) and isinstance(bound.func, ast.Attribute):
        bound = bound.func.value  # `Net(...).to(device)`
    if isinstance(bound, ast.Call) and isinstance(bound.func, ast.Name):
        return bound.func.id
    return None


def _state_saves_of(ctx: FileContext, cls: str) -> list[tuple[ast.AST, ast.Call]]:
    """The saves of the file that write `model.state_dict()` of a `model = cls(...)`."""
    found = []
    for scope, call, _ in file_saves(ctx):
        value = call.args[0] if call.args else keyword(call, "obj")
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr == "state_dict"
            and built_class(ctx, scope, root_name(value), call.lineno) == cls
        ):
            found.append((scope, call))
    return found


def _moved_to_cpu_before(ctx: FileContext, scope: ast.AST, name: str, line: int) -> bool:
    """The last statement of `scope` before `line` that moves `name` in place moves it
    to the CPU (`model.eval().cpu()`; not `model.to(device)` or `.cuda()`)."""
    if not name:
        return False
    latest, on_cpu = -1, False
    for node in scope_nodes(ctx, scope):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and latest < node.lineno < line
            and root_name(node.value) == name
        ):
            moves = set(_chain_moves(node.value))
            if moves:
                latest, on_cpu = node.lineno, moves == {"cpu"}
    return on_cpu


def _chain_moves(call: ast.expr) -> Iterator[str]:
    """The device moves of a call chain, outermost first: "cpu" for `.cpu()` /
    `.to("cpu")`, "other" for `.cuda()` and any other `.to(...)`."""
    while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
        attr = call.func.attr
        if attr == "cpu" or (attr == "to" and call.args and _is_cpu(call.args[0])):
            yield "cpu"
        elif attr in ("cuda", "to"):
            yield "other"
        call = call.func.value


def _is_cpu(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and is_cpu_name(node.value)


def root_name(node: ast.expr) -> str:
    """`self` for `self.model.state_dict()`, `obj` for `obj`."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def save_path(call: ast.Call) -> ast.expr | None:
    """The file (or handle) a `torch.save(obj, f)` call writes to."""
    return call.args[1] if len(call.args) > 1 else keyword(call, "f")


def file_names(path: ast.expr) -> set[str]:
    """The file names written in a path expression: `"trainfeat.pth"` in
    `os.path.join(out, "trainfeat.pth")`."""
    names = {
        n.value.rsplit("/", 1)[-1]
        for n in walk(path)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "." in n.value
    }
    # `".pt"` of `f"out-{tag}.pt"` is an extension, no name: any such f-string has it
    return {name for name in names if not name.startswith(".")}
