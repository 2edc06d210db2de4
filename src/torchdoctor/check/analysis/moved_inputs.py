"""The inputs a project module's `forward` moves to a device before it reads them.

`loss_func(embeddings, labels)` with CPU `labels` and `embeddings` on the device is no
meeting when the class's `forward` (its own, or a base's in another project file)
starts with `labels = labels.to(embeddings.device)`: whatever `labels` is passed, it is
on a device before its data is read. Reading its size first (`labels.size(0)`, or in
a helper that only reads sizes) is no read of its data. The move may sit under
`if labels is not None:`: a None argument carries no tensor.

Only for a class resolved for certain: built here by a name this file binds to a
project class, every base read (torch's `nn.Module` and typing/abc aside), and
`forward` defined by the class itself or by exactly one of its bases, `__call__` by none.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchdoctor.check.analysis.class_calls import project_class
from torchdoctor.check.analysis.file_loops import FileLoops, analysis, sibling_file
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.analysis.wraps import parameter_slots
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk

# reads of a tensor's metadata, not of its data: no meeting with another tensor
_META_ATTRS = frozenset(
    {"shape", "device", "dtype", "ndim", "size", "dim", "numel", "nelement", "is_cuda"}
)
_META_CALLS = frozenset({"len", "isinstance", "type"})
_NO_FORWARD_BASES = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module", "object"})
_MRO_LIMIT = 16

Moves = tuple[list[str], frozenset[str]]  # forward's parameters (after self), moved ones


def forward_moves(ctx: FileContext, built: ast.Call) -> Moves | None:
    """The parameters of the `forward` an instance built by `built` (a call of this
    file) runs, and those it moves to a device first (None: not known for certain)."""
    name = dotted(built.func)
    if name is None:
        return None
    cache: dict[str, Moves | None] = ctx.shared("moved_inputs", lambda _: {})
    if name not in cache:
        cache[name] = _forward_moves(analysis(ctx), name)
    return cache[name]


def _forward_moves(fl: FileLoops, name: str) -> Moves | None:
    found = project_class(fl, name, by_tail=True)
    mro = _strict_mro(*found) if found is not None else None
    if mro is None:
        return None
    defined: dict[str, list[tuple[FileLoops, ast.ClassDef, ast.AST]]] = {}
    for owner, cls in mro:
        for method in ("forward", "__call__"):
            info = owner.methods.get(cls.name, {}).get(method)
            if info is not None and info.cls is cls:
                defined.setdefault(method, []).append((owner, cls, info.node))
    forwards = defined.get("forward", [])
    if "__call__" in defined or not forwards:
        return None
    # the class's own `forward` comes first in any order; a base's must be the only one
    if forwards[0][1] is not mro[0][1] and len(forwards) > 1:
        return None
    owner, _, forward = forwards[0]
    if not isinstance(forward, ast.FunctionDef) or forward.args.vararg is not None:
        return None
    params = parameter_slots(forward, method=True)
    names = [*params, *(p.arg for p in forward.args.kwonlyargs)]
    return params, frozenset(_moved_first(owner, forward, names))


def _strict_mro(fl: FileLoops, cls: ast.ClassDef) -> list[tuple[FileLoops, ast.ClassDef]] | None:
    """`cls` and all its bases, or None when one of them cannot be read."""
    order: list[tuple[FileLoops, ast.ClassDef]] = []
    todo = [(fl, cls)]
    while todo:
        owner, node = todo.pop(0)
        if any(node is seen for _, seen in order):
            continue
        if len(order) >= _MRO_LIMIT or node.keywords:
            return None  # a metaclass may make calls behave otherwise
        order.append((owner, node))
        for base in node.bases:
            qual = owner.ctx.qualname(base) or ""
            if qual in _NO_FORWARD_BASES or qual.startswith(("typing.", "abc.")):
                continue
            name = dotted(base)
            read = project_class(owner, name, by_tail=True) if name else None
            if read is None:
                return None
            todo.append(read)
    return order


def _moved_first(fl: FileLoops, func: ast.FunctionDef, names: list[str]) -> Iterator[str]:
    """The parameters of `func` whose first statement that reads or binds them is
    `p = p.to(<x>.device)` / `p = p.to(device=...)` / `p = p.cuda()`, or that move under
    `if p is not None:` (a None argument carries no tensor)."""
    open_ = set(names)
    for part in _straight_line(func.body):
        if not open_:
            return
        found = _move_of(part)
        for name in list(open_):
            if found is not None and name == found[0]:
                if not _reads_data(found[1], name, fl, skip=found[1].func):
                    yield name
                open_.discard(name)
            elif _reads_data(part, name, fl) or _binds(part, name):
                open_.discard(name)


def _straight_line(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The statements that run in order from the start, a `with` block's entered (its
    context expressions first); any other compound statement counts as one."""
    for stmt in body:
        if isinstance(stmt, ast.With):
            yield from (item.context_expr for item in stmt.items)
            yield from _straight_line(stmt.body)
        else:
            yield stmt


def _move_of(part: ast.AST) -> tuple[str, ast.Call] | None:
    """`p` and the call of `p = p.to(x.device)` (or `device=`, or `p.cuda()`), also as
    `if p is not None: p = p.to(...)` or `p = p.to(...) if p is not None else None`."""
    if isinstance(part, ast.If) and len(part.body) == 1 and not part.orelse:
        found = _move_of(part.body[0])
        return found if found is not None and _not_none(part.test, found[0]) else None
    if not (
        isinstance(part, ast.Assign)
        and len(part.targets) == 1
        and isinstance(part.targets[0], ast.Name)
    ):
        return None
    name, call = part.targets[0].id, part.value
    if (
        isinstance(call, ast.IfExp)
        and _not_none(call.test, name)
        and isinstance(call.orelse, ast.Constant)
        and call.orelse.value is None
    ):
        call = call.body
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == name
    ):
        return None
    method = call.func.attr
    first = call.args[0] if call.args else None
    to_device = method == "to" and (
        (isinstance(first, ast.Attribute) and first.attr == "device")
        or any(kw.arg == "device" for kw in call.keywords)
    )
    return (name, call) if to_device or method == "cuda" else None


def _not_none(test: ast.expr, name: str) -> bool:
    """`test` is `name is not None`."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == name
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


def _binds(tree: ast.AST, name: str) -> bool:
    return any(
        isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load)
        for node in walk(tree)
    )


def _reads_data(
    tree: ast.AST, name: str, fl: FileLoops | None, skip: ast.AST | None = None
) -> bool:
    """Whether `tree` reads the data of the tensor `name` holds: any use but of its
    metadata, or (with `fl`, the file of `tree`) passing it to a helper of the project
    that reads only its metadata. `skip`: a use under that node does not count."""
    parents: dict[int, ast.AST] = {}
    for node in walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    for node in walk(tree):
        if not (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents.get(id(node))
        if skip is not None and parent is skip:
            continue
        if isinstance(parent, ast.Attribute) and parent.attr in _META_ATTRS:
            continue
        if isinstance(parent, ast.Compare) and all(
            isinstance(op, ast.Is | ast.IsNot) for op in parent.ops
        ):
            continue
        if isinstance(parent, ast.Call) and node in parent.args:
            if isinstance(parent.func, ast.Name) and parent.func.id in _META_CALLS:
                continue
            if fl is not None and _metadata_helper(fl, parent, parent.args.index(node)):
                continue
        return True
    return False


def _metadata_helper(fl: FileLoops, call: ast.Call, index: int) -> bool:
    """`call` runs a top-level function of the project that only reads the metadata of
    its parameter at `index` (`assert_same_size(embeddings, labels)`)."""
    name = dotted(call.func)
    if name is None or any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return False
    if "." not in name:
        found = fl.top.get(name)
    else:
        module, _, last = (fl.ctx.qualname(call.func) or "").rpartition(".")
        other = sibling_file(fl.ctx, module, by_tail=True) if module.strip(".") else None
        found = other.top.get(last) if other is not None else None
    if found is None or not isinstance(found.node, ast.FunctionDef):
        return False
    params = [*found.node.args.posonlyargs, *found.node.args.args]
    if index >= len(params):
        return False
    param = params[index].arg
    return not any(_binds(s, param) or _reads_data(s, param, None) for s in found.node.body)
