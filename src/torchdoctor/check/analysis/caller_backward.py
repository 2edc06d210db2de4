"""Callers that run backward() on what a method returns.

`logits, loss = self.predict_evaluate_collect(model, problem, batch, self.stats, i)`
followed by `loss.backward()` in a trainer's loop shows that the method's second result
carries the graph of a training step, and that the method runs once per step. The
callers are the methods of the class and its subclasses (`ProjectIndex.bases`, their
files `class_files`, read on demand) that call it on `self`; none of those classes may
define a method of that name again (which one runs would not be known). TD206 asks this
where a method stores what it returns into an object that keeps it.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from torchdoctor.check.analysis.events import BACKWARD
from torchdoctor.check.analysis.file_loops import FileLoops, project_file
from torchdoctor.check.analysis.functions import FunctionInfo


@dataclass(frozen=True)
class TrainingCaller:
    caller: FunctionInfo
    call: ast.Call
    position: int | None  # the element of the returned tuple given to backward() (None: all)
    backward_line: int
    file: str  # the caller's file name, for messages


def training_callers(fl: FileLoops, fi: FunctionInfo) -> list[TrainingCaller]:
    """Calls `self.<fi>(...)` in the class family of `fi` whose result (or an element of
    it) goes to backward() after the call, in the same caller."""
    if fi.cls is None or fi.is_module:
        return []
    ctx = fl.ctx
    family = ctx.project.subclasses_of({fi.cls.name})
    paths = {p for c in family for p in ctx.project.class_files.get(c, ())} - {ctx.path}
    files = [fl] + [f for p in sorted(paths) if (f := project_file(ctx, p)) is not None]
    needle = f"self.{fi.name}("
    found: list[TrainingCaller] = []
    for other in files:
        for g in other.all_functions():
            if g.cls is None or g.cls.name not in family:
                continue
            if g.name == fi.name and g.node is not fi.node:
                return []  # overridden in the family: which one a call runs is not known
            if needle not in g.text:
                continue
            found += _callers_in(other, g, fi.name)
    return found


def _callers_in(fl: FileLoops, g: FunctionInfo, name: str) -> list[TrainingCaller]:
    backs = [e for e in fl.events(g) if e.kind == BACKWARD and isinstance(e.expr, ast.Name)]
    if not backs:
        return []
    found: list[TrainingCaller] = []
    for stmt in g.own_statements():
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        call = stmt.value
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == name
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "self"
        ):
            continue
        target = stmt.targets[0]
        named: list[tuple[int | None, str]] = []
        if isinstance(target, ast.Name):
            named = [(None, target.id)]
        elif isinstance(target, ast.Tuple):
            named = [(i, t.id) for i, t in enumerate(target.elts) if isinstance(t, ast.Name)]
        for position, bound in named:
            back = next(
                (
                    e
                    for e in backs
                    if isinstance(e.expr, ast.Name) and e.expr.id == bound and e.line > stmt.lineno
                ),
                None,
            )
            if back is not None:
                where = os.path.basename(fl.ctx.path)
                found.append(TrainingCaller(g, call, position, back.line, where))
    return found
