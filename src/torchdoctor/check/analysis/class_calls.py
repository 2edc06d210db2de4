"""Methods looked up the way Python does for `self`, and the call sites of a function.

`self.forward(x)` in a method a subclass inherits runs the subclass's `forward` when
`self` is an instance of the subclass: a value followed into a method therefore carries
the class `self` was made from (its "self class"), and a method is looked up along that
class's bases (those defined in the same file; a base from elsewhere ends the search).
`project_class` / `project_mro` follow a class name into the sibling module it is
imported from (through a package `__init__` that re-exports it), for the rules that
need a base class or a built class of another file of the project.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.check.analysis.file_loops import FileLoops, sibling_file
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.loop_index import LoopIndex
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.tree_walk import walk


def class_mro(fl: LoopIndex, cls: str) -> list[str]:
    """`cls` and its bases defined in the file, in (depth-first, left-to-right) order."""
    order: list[str] = []
    todo = [cls]
    while todo:
        name = todo.pop(0)
        node = fl.classes.get(name)
        if node is None or name in order:
            continue
        order.append(name)
        bases = [(dotted(b) or "").rsplit(".", 1)[-1] for b in node.bases]
        todo[0:0] = [b for b in bases if b in fl.classes]
    return order


def method_of(fl: LoopIndex, cls: str, name: str) -> FunctionInfo | None:
    """The method `self.<name>` runs when `self` is a `cls` (None: not defined in the file,
    or a base we cannot see may define it first)."""
    for owner in class_mro(fl, cls):
        found = fl.methods.get(owner, {}).get(name)
        if found is not None:
            return found
        if not all(_is_plain_base(fl, b) for b in fl.classes[owner].bases):
            return None  # a base we cannot see may define it
    return None


def _is_plain_base(fl: LoopIndex, base: ast.expr) -> bool:
    name = fl.ctx.qualname(base) or dotted(base) or ""
    return name in ("object", "torch.nn.Module", "torch.nn.modules.module.Module") or (
        name.rsplit(".", 1)[-1] in fl.classes
    )


def self_call_sites(
    fl: LoopIndex, fi: FunctionInfo
) -> Iterator[tuple[FunctionInfo, ast.Call, str]]:
    """Calls `self.<fi.name>(...)` that run method `fi`: (caller, call, self class), over
    every class of the file whose lookup of the name finds `fi` (the class of `fi` and
    subclasses that do not override it), in every method such a class has."""
    if fi.cls is None or fi.parent is not None:
        return
    for cls in fl.classes:
        if method_of(fl, cls, fi.name) is not fi:
            continue
        for owner in class_mro(fl, cls):
            for caller in fl.methods.get(owner, {}).values():
                if f"self.{fi.name}(" not in caller.text:
                    continue
                if method_of(fl, cls, caller.name) is not caller:
                    continue  # overridden in `cls`: this one does not run for it
                for node in walk(caller.node):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Attribute)
                        and node.func.attr == fi.name
                        and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "self"
                    ):
                        yield caller, node, cls


def argument_for(fi: FunctionInfo, call: ast.Call, param: str) -> ast.expr | None:
    """The expression `call` passes for `fi`'s parameter `param` (None: not passed, or
    not knowable because of `*args` / `**kwargs` before it)."""
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    params = fi.params()
    if param not in params:
        return None
    index = params.index(param)
    if any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return None
    return call.args[index] if index < len(call.args) else None


def passed_constant(fi: FunctionInfo, call: ast.Call, param: str) -> ast.Constant | None:
    """The constant `call` passes for `param`, or its constant default when not passed."""
    arg = argument_for(fi, call, param)
    if arg is None and not isinstance(fi.node, ast.Module):
        a = fi.node.args
        if any(isinstance(x, ast.Starred) for x in call.args) or any(
            k.arg is None for k in call.keywords
        ):
            return None  # *args / **kwargs may pass it
        positional = [p.arg for p in (*a.posonlyargs, *a.args)]
        if param in positional:
            index = positional.index(param) - (len(positional) - len(a.defaults))
            arg = a.defaults[index] if index >= 0 else None
        elif param in [p.arg for p in a.kwonlyargs]:
            arg = a.kw_defaults[[p.arg for p in a.kwonlyargs].index(param)]
    return arg if isinstance(arg, ast.Constant) else None


_REEXPORT_HOPS = 3  # `from pkg import C` -> pkg/__init__.py -> `from .mod import C`


def project_class(
    fl: FileLoops, name: str, by_tail: bool = False
) -> tuple[FileLoops, ast.ClassDef] | None:
    """The class a name (`C`, `mod.C`) of `fl`'s file refers to: defined in the file, or
    in the sibling module it is imported from, through package re-exports (None: not a
    class we can read). `by_tail`: an absolute import may name the one project file whose
    path ends like it (a test beside `src/pkg/`), see `sibling_path`."""
    for _ in range(_REEXPORT_HOPS + 1):
        head, _, rest = name.partition(".")
        if not rest and name in fl.classes:
            return fl, fl.classes[name]
        target = fl.ctx.imports.get(head)
        if target is None:
            return None
        module, _, name = (f"{target}.{rest}" if rest else target).rpartition(".")
        other = sibling_file(fl.ctx, module, by_tail) if module.strip(".") else None
        if other is None:
            return None
        fl = other
    return None


def project_mro(fl: FileLoops, cls: ast.ClassDef) -> list[tuple[FileLoops, ast.ClassDef]]:
    """`cls` and the bases we can read (in its file or imported from sibling modules), in
    depth-first, left-to-right order, each with the file it is defined in."""
    order: list[tuple[FileLoops, ast.ClassDef]] = []
    todo: list[tuple[FileLoops, ast.ClassDef]] = [(fl, cls)]
    while todo and len(order) < 16:
        owner, node = todo.pop(0)
        if any(node is seen for _, seen in order):
            continue
        order.append((owner, node))
        bases = []
        for base in node.bases:
            name = dotted(base)
            if not name or (owner.ctx.qualname(base) or "").startswith(("torch.", "typing.")):
                continue  # torch's own classes: nothing of the project to read
            found = project_class(owner, name)
            if found is not None:
                bases.append(found)
        todo[0:0] = bases
    return order


_SELF_CALL = re.compile(r"\bself\.(\w+)\(")


def inherited_calls(fl: FileLoops, cls: ast.ClassDef, name: str) -> frozenset[str] | None:
    """The methods of `fl`'s file that method `name` of an instance of `cls` runs through
    `self.m(...)` calls when `cls` inherits `name` from a base of another file (a
    `forward` of the project's base class calling the `self.transform(x)` the subclass
    defines), through the base's own methods it calls on the way. None: `name` is
    defined in the file, or no readable base defines it."""
    mro = project_mro(fl, cls)

    def lookup(method: str) -> tuple[FileLoops, FunctionInfo] | None:
        for owner, node in mro:
            found = owner.methods.get(node.name, {}).get(method)
            if found is not None and found.cls is node:
                return owner, found
        return None

    first = lookup(name)
    if first is None or first[0] is fl:
        return None
    names: set[str] = set()
    seen: set[str] = set()
    todo = [name]
    while todo and len(seen) < 32:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        hit = lookup(current)
        if hit is None:
            continue  # an attribute holding a function, or a method we cannot read
        owner, method = hit
        if owner is fl:
            names.add(current)  # the caller follows it on in its own file
        else:
            todo.extend(_SELF_CALL.findall(method.text))
    return frozenset(names)


_PARAMETER_CLASSES = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})


def parameter_attributes(fl: FileLoops, cls: ast.ClassDef) -> dict[str, tuple[str, int]]:
    """`self.<attr>` -> (file, line) for the attributes that every assignment in the class
    and its readable bases makes an `nn.Parameter` requiring grad (`self.b =
    nn.Parameter(torch.zeros(n))`); an attribute whose `requires_grad` the class
    changes is left out."""
    made: dict[str, tuple[str, int]] = {}
    other: set[str] = set()
    for owner, node in project_mro(fl, cls):
        text = owner.ctx.segment(node)
        for stmt in walk(node):
            if not isinstance(stmt, ast.Assign | ast.AnnAssign):
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                key = dotted(target)
                if not key or not key.startswith("self.") or key.count(".") != 1:
                    continue
                attr = key[5:]
                if _makes_parameter(owner, stmt.value) and f"{attr}.requires_grad" not in text:
                    made.setdefault(attr, (owner.ctx.path, stmt.lineno))
                else:
                    other.add(attr)
    return {attr: where for attr, where in made.items() if attr not in other}


def _makes_parameter(fl: FileLoops, value: ast.expr | None) -> bool:
    if not isinstance(value, ast.Call) or fl.ctx.qualname(value.func) not in _PARAMETER_CLASSES:
        return False
    for kw in value.keywords:
        if kw.arg == "requires_grad":
            return isinstance(kw.value, ast.Constant) and kw.value.value is True
    return len(value.args) < 2  # `Parameter(t, False)`: a second argument may turn it off
