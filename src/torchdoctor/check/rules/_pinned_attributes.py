"""Tensor attributes a module's construction pins to a device it chose then (TD104).

`self.A = torch.eye(n, device=device)` with `device = "cuda" if
torch.cuda.is_available() else "cpu"` in `__init__`: the tensor sits on the device the
class chose for itself, not a buffer, so `model.to()`, `.cpu()`, a DataParallel replica
or CPU inputs on a GPU machine meet it elsewhere; no caller can keep them together.
A device given to the constructor (`make().to(dev)`) is not enough: its caller
usually passes the very device it moves the module to (the module is device-bound by
design), and whether anything moves it elsewhere is not in the code. The question "does a
method meet it with the module's tensors?" is the CPU question of TD104 asked again:
the methods are analysed with the pinned attributes seeded as CPU tensors (a place that
is not where the module is once moved), and a meeting with an input, a parameter or a
module output is where it breaks.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable

from torchdoctor.check.analysis.cache_hit import CacheHitScope
from torchdoctor.check.analysis.default_path import on_cpu
from torchdoctor.check.analysis.file_flow import FileFlow
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.syntax import accessed_value, dotted
from torchdoctor.check.analysis.values import AnyFunction, Env, Kind, Mismatch, Place, Value
from torchdoctor.check.tree_walk import walk_statements


def construction_device(ff: FileFlow, makers: list[AnyFunction], value: Value) -> str:
    """How construction chose the device `value` was made on or moved to: "the CUDA
    availability test at line 58"; "" for any other device (a constructor argument,
    a global, an input's, a hard-wired one, unknown)."""
    if value.kind is not Kind.TENSOR or value.place is not Place.DEVICE:
        return ""
    if value.scalar or value.maybe or value.is_input or value.output or value.where:
        return ""
    device = value.device
    if "is_available" in device:
        return "a CUDA availability test"
    for maker in makers:  # `device = torch.device("cuda" if ... else "cpu")`, `self.device = ...`
        for stmt in walk_statements(maker):
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and dotted(stmt.targets[0]) == device
                and "is_available" in ff.ctx.segment(stmt.value)
            ):
                return f"the CUDA availability test at line {stmt.lineno}"
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
            scope = seeded(ff, method, as_cpu)
            if scope is None:
                return {}
            for attr in ff.self_attrs_assigned(method) & set(as_cpu):
                left = scope.exit_env.get(f"{scope.self_name}.{attr}")
                if left is None or not on_cpu(left):
                    del as_cpu[attr]
                    changed = True
    return as_cpu


def seeded(
    ff: FileFlow, method: AnyFunction, as_cpu: dict[str, Value], cache_hit: str = ""
) -> ScopeFlow | None:
    """`method` analysed with the attributes of `as_cpu` on the CPU (`cache_hit`: on the
    path where that attribute is not refilled, analysis/cache_hit.py)."""
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
    if cache_hit:
        return CacheHitScope(ff, method, seeds=seeds, attr=cache_hit)
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
        scope = seeded(ff, method, as_cpu)
        if scope is None:
            continue
        where = attribute_meeting(scope, attr, value, only=follows_module)
        if where is not None:
            return method.name, where
    return None


def attribute_meeting(
    scope: ScopeFlow,
    attr: str,
    value: Value,
    only: Callable[[Mismatch], bool] = lambda m: True,
) -> str | None:
    """ "line N" (and the path inside a call) where `self.attr`, or the tensor `value`
    it was made as, first meets a tensor of another place in `scope` (meetings `only`)."""
    me = scope.self_name
    for m in sorted(scope.mismatches, key=lambda m: m.site.lineno):  # type: ignore[attr-defined]
        if not only(m):
            continue
        held = dotted(accessed_value(m.cpu_node)) or ""
        if (
            held == f"{me}.{attr}"
            or m.attribute == f"{me}.{attr}"
            or (value.source is not None and m.cpu.source is value.source)
        ):
            via = f"; {m.path}" if m.path else ""
            return f"line {m.site.lineno}{via}"  # type: ignore[attr-defined]
    return None


def follows_module(m: Mismatch) -> bool:
    """The other side is where the module is: an input, a parameter, a module output."""
    other = m.innermost().other if m.inner is not None else m.other
    return other.is_input or other.output or other.kind is Kind.PARAMETER
