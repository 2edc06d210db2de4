"""The settings a constructor call fixes: `Tagger(5, probabilities=True)` with
`self.probabilities = probabilities` in `__init__` makes `self.probabilities` truthy, so
of `forward`'s returns only those under tests that agree can run (TD301, TD302).

A setting counts only where the class is a plain `nn.Module` subclass whose `__init__`
stores the parameter unchanged and nothing else in the class assigns it, and the file
holding the call never assigns an attribute of that name (`model.probabilities = True`
before a step). The constant is the one passed, or the parameter's constant default.

Not a rule (the leading underscore keeps the registry away).
"""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.class_calls import passed_constant
from torchdoctor.check.analysis.file_loops import FileLoops
from torchdoctor.check.analysis.path_guards import TRUTHY, Cond
from torchdoctor.check.analysis.syntax import dotted


def built_settings(caller: FileLoops, owner: FileLoops, cls: str, ctor: ast.Call) -> list[Cond]:
    """`self.<x> == c` for each setting `ctor` (a call of class `cls`, which `owner`
    defines) fixes to a constant."""
    node = owner.classes.get(cls)
    init = owner.methods.get(cls, {}).get("__init__")
    if node is None or init is None or "self." not in init.text:
        return []
    if not node.bases or any(
        owner.ctx.qualname(b) not in ("torch.nn.Module", "torch.nn.modules.module.Module")
        for b in node.bases
    ):
        return []  # a base class's code may set the attribute too
    stored: dict[str, str] = {}  # attribute -> the parameter stored in it
    params = set(init.params()) | set(init.keyword_params())
    for stmt in init.own_statements():
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.value, ast.Name)
            and stmt.value.id in params
            and (key := dotted(stmt.targets[0])) is not None
            and key.startswith("self.")
            and key.count(".") == 1
        ):
            stored[key] = stmt.value.id
    if not stored:
        return []
    counts = dict.fromkeys(stored, 0)
    for n in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(n, ast.Assign):
            targets = list(n.targets)
        elif isinstance(n, ast.AugAssign | ast.AnnAssign):
            targets = [n.target]
        for t in targets:
            for part in ast.walk(t):
                key = dotted(part) if isinstance(part, ast.Attribute) else None
                if key in counts:
                    counts[key] += 1
        if isinstance(n, ast.Call) and dotted(n.func) == "setattr":
            return []
    source = caller.ctx.source
    conds = []
    for key, param in stored.items():
        attr = key[5:]
        # the class's own assignment is the only one in its file, none in the caller's
        written = len(re.findall(rf"\.{attr}\s*=(?!=)", source))
        if counts[key] != 1 or written != (1 if caller is owner else 0):
            continue
        const = passed_constant(init, ctor, param)
        if const is None:
            continue
        conds.append(Cond(key, const.value, True))
    return conds


__all__ = ["TRUTHY", "built_settings"]
