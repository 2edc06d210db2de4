"""Class-level mode facts: a model a plain class builds in `__init__` and keeps.

`self.model = Net()` in `__init__` (or in a helper `__init__` calls) and run in another
method: at that method's entry the model is in whatever `__init__` left it in, provided
nothing else can have changed its mode -- no method of the class sets it (`.eval()`,
`.train()`), stores another model there, hands it to code we cannot see, or returns it.
An `nn.Module` class is left out (its owner switches the whole tree with `.eval()`), and
so is a class with bases (an inherited method may set the mode).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.mode_state import BUILT, Origin
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    from torchdoctor.check.analysis.functions import FunctionInfo
    from torchdoctor.check.analysis.mode_state import LoopFacts


_PLAIN_BASES = frozenset({"object"})


def init_helpers(methods: list[FunctionInfo]) -> frozenset[str]:
    """`__init__` and the methods it calls on `self` (they run during construction)."""
    init = next((m for m in methods if m.name == "__init__"), None)
    if init is None:
        return frozenset()
    found = {"__init__"}
    for node in walk(init.node):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
        ):
            found.add(node.func.attr)
    return frozenset(found)


def held_models(fl: LoopFacts, cls: ast.ClassDef) -> dict[str, Origin]:
    """`self.<attr>` -> BUILT origin (with `stored`: the assignment) for every model the
    class builds during construction and whose mode nothing after that can change."""
    if fl.ctx.is_module_class(cls) or any((dotted(b) or "") not in _PLAIN_BASES for b in cls.bases):
        return {}
    methods = [fi for fi in fl.all_functions() if fi.cls is cls]
    construction = init_helpers(methods)
    if not construction:
        return {}
    init = next(m for m in methods if m.name == "__init__")
    final = fl.modes(init).final
    if final is None:
        return {}
    stored: dict[str, ast.Assign | ast.AnnAssign] = {}
    spoiled: set[str] = set()
    for m in methods:
        building = m.name in construction
        for node in walk(m.node):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for leaf in walk(t):
                        key = dotted(leaf) if isinstance(leaf, ast.Attribute) else None
                        if key is None or not key.startswith("self."):
                            continue
                        if building and isinstance(node, ast.Assign | ast.AnnAssign):
                            stored[key] = node
                        else:
                            spoiled.add(key)
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in ("eval", "train"):
                    spoiled.add(_root_attr(dotted(func.value)))
                if not building:
                    for arg in (*node.args, *(kw.value for kw in node.keywords)):
                        spoiled.add(_root_attr(dotted(arg)))
            elif isinstance(node, ast.Return | ast.Yield) and node.value is not None:
                spoiled.add(_root_attr(dotted(node.value)))
    text = fl.ctx.segment(cls)
    if ".backward(" in text:
        return {}  # a training class: its models' mode is its business
    found: dict[str, Origin] = {}
    for key, stmt in stored.items():
        if key in spoiled or key.count(".") != 1 or f"{key}.parameters(" in text:
            continue
        origins = final.modes.get(key)
        if not origins or any(o.mode != BUILT for o in origins):
            continue
        first = min(origins, key=lambda o: o.line)
        value = stmt.value
        # built in a helper: name the constructor itself, not the helper's call
        built = (
            value if isinstance(value, ast.Call) and fl.is_module_constructor(value) else first.node
        )
        found[key] = Origin(
            BUILT,
            built,
            f"{first.what}, stored in `{key}` at line {stmt.lineno}, and no method of "
            f"`{cls.name}` sets its mode",
            stored=stmt,
        )
    return found


def _root_attr(key: str | None) -> str:
    """`self.model.encoder` -> `self.model` (the attribute the class holds)."""
    if key is None:
        return ""
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] == "self" else key
