"""What an object's methods can know about its state, beyond what `__init__` leaves.

- Buffers: `self.register_buffer("beta", t)` in construction (the class's or a base
  class's, of this file or of another project file) makes `self.beta` a tensor that
  `model.to(device)` moves, like a parameter: on the module's device in its methods.
- Method aliases: `self.state_function = self._base_sub` (one of several bound methods
  chosen in `__init__`): `self.state_function(x)` runs one of them.

Syntax only here; the per-file facts that use these live in FileFlow / FlowSeeds.
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.values import AnyFunction
from torchdoctor.check.tree_walk import walk


def registered_buffers(cls: ast.ClassDef) -> frozenset[str]:
    """Names `cls`'s own methods register with `<obj>.register_buffer("name", value)`,
    the value not the constant None (a None buffer holds no tensor)."""
    found: set[str] = set()
    for node in walk(cls):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_buffer"
            and isinstance(node.func.value, ast.Name)
        ):
            continue
        name = node.args[0] if node.args else _keyword(node, "name")
        value = node.args[1] if len(node.args) > 1 else _keyword(node, "tensor")
        if (
            isinstance(name, ast.Constant)
            and isinstance(name.value, str)
            and value is not None
            and not (isinstance(value, ast.Constant) and value.value is None)
        ):
            found.add(name.value)
    return frozenset(found)


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def method_aliases(
    cls: ast.ClassDef, methods: dict[str, AnyFunction]
) -> dict[str, tuple[AnyFunction, ...]]:
    """Attributes `x` that hold a bound method of the class on every assignment
    (`self.x = self._base_sub` in one branch, `self.x = self._base_zero` in another),
    with the methods they may hold. An attribute assigned anything else anywhere in the
    class (or through `setattr`, or a name that is also a method) is not one."""
    candidates: dict[str, list[AnyFunction]] = {}
    spoiled: set[str] = set()
    for node in walk(cls):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "setattr":
                return {}
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets, value = [node.target], None
        elif isinstance(node, ast.For | ast.With | ast.AsyncFor | ast.AsyncWith):
            targets = [node.target] if isinstance(node, ast.For | ast.AsyncFor) else []
            value = None
        else:
            continue
        for target in targets:
            for part in _flat(target):
                if not (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name)):
                    continue
                method = _bound_method(value, part.value.id, methods) if part is target else None
                if method is None:
                    spoiled.add(part.attr)
                else:
                    candidates.setdefault(part.attr, []).append(method)
    return {
        attr: tuple(dict.fromkeys(found))
        for attr, found in candidates.items()
        if attr not in spoiled and attr not in methods
    }


def _flat(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [p for elt in target.elts for p in _flat(elt)]
    if isinstance(target, ast.Starred):
        return _flat(target.value)
    return [target]


def _bound_method(
    value: ast.expr | None, me: str, methods: dict[str, AnyFunction]
) -> AnyFunction | None:
    """`self._base_sub` (the same receiver as the target's) -> that method."""
    if (
        isinstance(value, ast.Attribute)
        and isinstance(value.value, ast.Name)
        and value.value.id == me
        and value.attr in methods
    ):
        return methods[value.attr]
    return None
