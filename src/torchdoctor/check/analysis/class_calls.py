"""Methods looked up the way Python does for `self`, and the call sites of a function.

`self.forward(x)` in a method a subclass inherits runs the subclass's `forward` when
`self` is an instance of the subclass: a value followed into a method therefore carries
the class `self` was made from (its "self class"), and a method is looked up along that
class's bases (those defined in the same file; a base from elsewhere ends the search).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.loop_index import LoopIndex
from torchdoctor.check.analysis.syntax import dotted


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
                for node in ast.walk(caller.node):
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
