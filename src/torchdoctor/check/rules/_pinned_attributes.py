"""Tensor attributes a module's construction pins to a device it chose then (TD104).

`self.A = torch.eye(n, device=device)` with `device = "cuda" if
torch.cuda.is_available() else "cpu"`, or `self.freqs = make().to(dev)` with `dev` a
constructor argument: the tensor sits on the device construction chose, not a buffer,
so `model.to()`, `.cuda()`, `.cpu()`, a DataParallel replica or an accelerate device map
leaves it there while the parameters and inputs go elsewhere. The question "does a
method meet it with the module's tensors?" is the CPU question of TD104 asked again:
the methods are analysed with the pinned attributes seeded as CPU tensors (a place that
is not where the module is once moved), and a meeting with an input, a parameter or a
module output is where it breaks.
"""

from __future__ import annotations

import ast
import dataclasses

from torchdoctor.check.analysis.default_path import on_cpu
from torchdoctor.check.analysis.file_flow import FileFlow
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.syntax import accessed_value, dotted
from torchdoctor.check.analysis.values import AnyFunction, Env, Kind, Mismatch, Place, Value
from torchdoctor.check.tree_walk import walk


def construction_device(ff: FileFlow, makers: list[AnyFunction], value: Value) -> str:
    """How construction chose the device `value` was made on or moved to: "the
    constructor argument `dev`", "the CUDA availability test at line 58"; "" when it is
    neither (a device of an input, a hard-wired one, unknown)."""
    if value.kind is not Kind.TENSOR or value.place is not Place.DEVICE:
        return ""
    if value.scalar or value.maybe or value.is_input or value.output or value.where:
        return ""
    device = value.device
    if "is_available" in device:
        return "a CUDA availability test"
    for maker in makers:
        params = [*maker.args.posonlyargs, *maker.args.args, *maker.args.kwonlyargs]
        me = params[0].arg if params else ""
        names = {p.arg for p in params[1:]}
        if device in names:
            return f"the constructor argument `{device}`"
        for stmt in walk(maker):
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            if dotted(stmt.targets[0]) != device or device == me:
                continue
            source = stmt.value
            if "is_available" in ff.ctx.segment(source):
                return f"the CUDA availability test at line {stmt.lineno}"
            if isinstance(source, ast.Name) and source.id in names:
                return f"the constructor argument `{source.id}`"
    return ""


def pinned_cpu(
    ff: FileFlow, cls: ast.ClassDef, makers: list[AnyFunction], pinned: dict[str, Value]
) -> dict[str, Value]:
    """The attributes of `pinned` (name -> what construction left there) that no other
    method moves off the device construction chose: each, as a CPU tensor, for seeding."""
    as_cpu = {
        attr: dataclasses.replace(v, place=Place.CPU, device="", device_line=0)
        for attr, v in pinned.items()
    }
    writers = [
        m
        for m in ff.methods(cls).values()
        if m not in makers and set(as_cpu) & ff.self_attrs_assigned(m)
    ]
    changed = True
    while changed and as_cpu:  # drop what a writer moves, until every writer keeps the rest
        changed = False
        for method in writers:
            scope = _seeded(ff, method, as_cpu)
            if scope is None:
                return {}
            for attr in ff.self_attrs_assigned(method) & set(as_cpu):
                left = scope.exit_env.get(f"{scope.self_name}.{attr}")
                if left is None or not on_cpu(left):
                    del as_cpu[attr]
                    changed = True
    return as_cpu


def _seeded(ff: FileFlow, method: AnyFunction, as_cpu: dict[str, Value]) -> ScopeFlow | None:
    """`method` analysed with the attributes of `as_cpu` on the CPU."""
    params = [*method.args.posonlyargs, *method.args.args]
    if not params or method.decorator_list:
        return None  # a staticmethod, classmethod, property: not read as one
    text = ff.text(method)
    if "lambda" in text or text.count("def ") > 1:
        return None  # a nested function may move them: not run here
    me = params[0].arg
    seeds: Env = dict(ff.scope(method, callers=False).seeds)
    for attr, value in as_cpu.items():
        seeds[f"{me}.{attr}"] = value
    return ff.fresh_scope(method, seeds)


def pinned_meeting(
    ff: FileFlow, methods: list[AnyFunction], attr: str, as_cpu: dict[str, Value]
) -> tuple[str, str] | None:
    """(method, "line N") where `self.attr`, pinned, first meets an input of the module,
    a parameter or a module output (the module's device, wherever it is moved)."""
    value = as_cpu[attr]
    ordered = sorted(methods, key=lambda m: (m.name != "forward", m.lineno))
    for method in ordered:
        if not ff.mentions(method, f".{attr}"):
            continue
        scope = _seeded(ff, method, as_cpu)
        if scope is None:
            continue
        me = scope.self_name
        for m in sorted(scope.mismatches, key=lambda m: m.site.lineno):  # type: ignore[attr-defined]
            held = dotted(accessed_value(m.cpu_node)) or ""
            if not _follows_module(m):
                continue
            if (
                held == f"{me}.{attr}"
                or m.attribute == f"{me}.{attr}"
                or (value.source is not None and m.cpu.source is value.source)
            ):
                via = f"; {m.path}" if m.path else ""
                return method.name, f"line {m.site.lineno}{via}"  # type: ignore[attr-defined]
    return None


def _follows_module(m: Mismatch) -> bool:
    """The other side is where the module is: an input, a parameter, a module output."""
    other = m.innermost().other if m.inner is not None else m.other
    return other.is_input or other.output or other.kind is Kind.PARAMETER
