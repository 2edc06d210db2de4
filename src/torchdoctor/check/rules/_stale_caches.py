"""Tensor caches a module keeps as plain attributes and reuses on any device (TD104).

`self.cache = None` in `__init__`; `forward` fills it with a tensor made on its input's
device and, on a later call, hands it back or uses it again without asking where it is
(`if self.cache is not None and self.cache.shape == x.shape: return self.cache`). The
cache is not a buffer, so `model.to(device)` leaves it on the device of the first input:
a module run once on the CPU (a summary, a smoke test, a trace) and then moved returns a
CPU tensor to GPU code. The question "does the reuse meet or return the old tensor?" is
asked by analysing the method with the attribute seeded as a tensor somewhere else (the
CPU): where the seed reaches a `return` or meets the module's inputs, the cache is stale.
A cache whose test or key reads a `.device` is keyed by the device: not reported.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from torchdoctor.check.analysis.file_flow import FileFlow
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.analysis.values import AnyFunction, Kind, Place, Value
from torchdoctor.check.rules._pinned_attributes import attribute_meeting, follows_module, seeded
from torchdoctor.check.tree_walk import walk, walk_statements


@dataclass(frozen=True)
class StaleCache:
    """`self.<attr> = None` of construction (`slot`), filled by `method` at `filled`
    (line) and reused there stale at `reuse` ("line N" or "line N returns it")."""

    slot: ast.Assign
    target: ast.Attribute
    attr: str
    method: str
    filled: int
    reuse: str


def stale_caches(
    ff: FileFlow, cls: ast.ClassDef, makers: list[AnyFunction], others: list[AnyFunction]
) -> Iterator[StaleCache]:
    """The cache slots of `cls` that a method reuses whatever device it holds."""
    buffers = ff.buffers(cls)
    for slot, target in _none_slots(makers):
        attr = target.attr
        if attr in buffers:
            continue
        writers = [m for m in others if attr in ff.self_attrs_assigned(m)]
        if len(writers) != 1:
            continue  # reset by another method (`update()`, `clear_cache()`): managed state
        (method,) = writers
        stores = _stores(ff, method, attr)
        if not stores:
            continue  # something other than None or a tensor made on the input's device
        found = _stale_reuse(ff, method, attr, *stores[0])
        if found is not None:
            filled, reuse = found
            yield StaleCache(slot, target, attr, method.name, filled, reuse)


def _none_slots(makers: list[AnyFunction]) -> Iterator[tuple[ast.Assign, ast.Attribute]]:
    """`self.x = None` statements of construction."""
    for maker in makers:
        params = [*maker.args.posonlyargs, *maker.args.args]
        if not params:
            continue
        me = params[0].arg
        for stmt in walk_statements(maker):
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(target := stmt.targets[0], ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == me
                and isinstance(stmt.value, ast.Constant)
                and stmt.value.value is None
            ):
                yield stmt, target


def _stores(
    ff: FileFlow, method: AnyFunction, attr: str
) -> list[tuple[ast.Assign | ast.AnnAssign, Value]] | None:
    """The tensors `method` stores in `self.attr`, each made on the device of one of its
    parameters from its shape, not its data (`torch.arange(n, device=x.device)`; None: it
    stores anything else but None)."""
    scope = ff.scope(method, callers=False)
    if not scope.self_name:
        return None
    key = f"{scope.self_name}.{attr}"
    inputs = {a.arg for a in [*method.args.posonlyargs, *method.args.args][1:]}
    found: list[tuple[ast.Assign | ast.AnnAssign, Value]] = []
    for stmt in walk_statements(method):
        if not isinstance(stmt, ast.Assign | ast.AnnAssign) or stmt.value is None:
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if not any(dotted(t) == key for t in targets):
            continue
        value = scope.value(stmt.value)
        if value.kind is Kind.NONE:
            continue
        on_input = value.device.split(".")[0] in inputs and value.device.endswith(".device")
        if value.kind is not Kind.TENSOR or value.place is not Place.DEVICE or not on_input:
            return None
        if value.is_input or value.output:
            return None  # made of the input's data: state carried to the next call
        found.append((stmt, value))
    return found


def _stale_reuse(
    ff: FileFlow, method: AnyFunction, attr: str, stmt: ast.Assign | ast.AnnAssign, store: Value
) -> tuple[int, str] | None:
    """(line filled, where reused) when `method`, run with the cache holding the tensor
    `stmt` stores (`store`) made on another device, returns it or meets its inputs with it."""
    if _reads_device(method):
        return None
    elsewhere = dataclasses.replace(
        store, place=Place.CPU, device="", device_line=0, source=store.source or stmt
    )
    for path in ("", attr):  # every path joined, then the path that reuses the cache
        scope = seeded(ff, method, {attr: elsewhere}, cache_hit=path)
        if scope is None:
            return None
        met = attribute_meeting(scope, attr, elsewhere, only=follows_module)
        if met is not None:
            return stmt.lineno, met
        for ret in walk_statements(method):
            if isinstance(ret, ast.Return) and ret.value is not None:
                held = scope.value(ret.value)
                if held.source is elsewhere.source and held.place is Place.CPU:
                    return stmt.lineno, f"line {ret.lineno} returns it"
    return None


def _reads_device(method: AnyFunction) -> bool:
    """Whether `method` reads a device (`x.device`, `self.cache_device`, a `device`
    parameter) other than to make or move a tensor there (`device=x.device`,
    `.to(x.device)`): a test or key on the device."""
    placing: set[int] = set()
    for node in walk(method):
        if isinstance(node, ast.Call):
            placing.update(id(k.value) for k in node.keywords if k.arg == "device")
            if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
                placing.update(id(a) for a in node.args)
    for node in walk(method):
        if id(node) in placing:
            continue
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        if isinstance(name, str) and "device" in name.lower():
            if isinstance(node, ast.Attribute) and id(node.value) in placing:
                continue
            return True
    return False
