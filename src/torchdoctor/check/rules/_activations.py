"""Whether a value is the output of a softmax, log-softmax or sigmoid (TD301, TD302, TD304).

Not a rule (the leading underscore keeps the registry away). A value is followed back
through assignments, tuple unpacking, shape-only ops (`permute`, `reshape`, `x[mask]`),
`torch.cat` of such outputs, the returns of the function or method it comes from, and,
for a parameter, the arguments its callers in the file pass. Along the way the `if`
tests on `self.<setting>` that hold at the loss call prune the branches of a method that
cannot run with it (`_activation_fn` returns a softmax when `self.method == "multiclass"`,
the loss calls `cross_entropy` under the same test). Tests on different settings are
independent (analysis/settings.py): a method whose returns differ gives what the returns
chosen by its own setting tests give, when the class lets them hold with the loss call's.
Every step is a proof: anything not understood ends the walk with None.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from torchdoctor.check.analysis.class_calls import (
    argument_for,
    method_of,
    passed_constant,
    self_call_sites,
)
from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.file_loops import FileLoops, file_of
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.path_guards import (
    Cond,
    compatible,
    conditions_at,
    subjects_assigned,
)
from torchdoctor.check.analysis.settings import describe, settable
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.analysis.values import Kind
from torchdoctor.check.rules._activation_facts import (
    _CLASS_OF,
    _FUNCTIONS,
    _METHODS,
    _MODULES,
    _SAME_VALUES,
    _class_forward,
    _function_called,
    _last_binding,
    _module_activation,
    _param_conds,
    _self_conds,
    _short,
    _where,
    assigned_calls,
    is_item,
    item_binding,
    str_key,
    str_key_of,
)
from torchdoctor.check.rules._activation_joins import joined, log_or_exp
from torchdoctor.check.rules._built_settings import built_settings

_BUDGET = 400  # steps of one walk: a large class with many callers stays fast
_MAX_DEPTH = 16


@dataclass
class _Walk:
    """What holds along one walk: the class `self` is an instance of, the `self.<x> ==
    c` tests known to hold at the loss call, and the steps left."""

    self_cls: str | None
    conds: list[Cond] = field(default_factory=list)
    budget: list[int] = field(default_factory=lambda: [_BUDGET])
    # tests on the loss function's own parameters (`if from_probs:`), checked against
    # the constants its callers pass
    params: list[Cond] = field(default_factory=list)
    params_of: ast.AST | None = None

    def to(self, self_cls: str | None, conds: list[Cond] | None = None) -> _Walk:
        return _Walk(self_cls, self.conds if conds is None else conds, self.budget)


def activation(
    fl: FileLoops, fi: FunctionInfo, expr: ast.expr, depth: int = 0, walk_: _Walk | None = None
) -> tuple[str, str] | None:
    """(kind, proof) if `expr` is the output of a softmax / log-softmax / sigmoid."""
    if walk_ is None:
        walk_ = _Walk(fi.cls.name if fi.cls is not None else None)
        walk_.conds = _self_conds(fi, expr)
        walk_.params, walk_.params_of = _param_conds(fi, expr), fi.node
    if depth > _MAX_DEPTH or walk_.budget[0] <= 0:
        return None
    walk_.budget[0] -= 1
    ctx = fl.ctx
    if isinstance(expr, ast.Name):
        return _name(fl, fi, expr, depth, walk_)
    if isinstance(expr, ast.Subscript):
        key = str_key(expr)
        if key is not None:  # `out["probs"]`: an item of a dict
            found = _item(fl, fi, expr.value, key, expr.lineno, depth + 1, walk_)
            if found is not None:
                return found
        return activation(fl, fi, expr.value, depth + 1, walk_)  # a part of the values
    if not isinstance(expr, ast.Call):
        return None
    func = expr.func
    name = ctx.qualname(func) or ""
    if name in _FUNCTIONS:
        return _FUNCTIONS[name], f"`{_short(ctx, expr)}` (line {expr.lineno})"
    if name in ("torch.log", "torch.exp") and expr.args:
        return log_or_exp(
            activation, fl, fi, expr, expr.args[0], name.endswith("log"), depth, walk_
        )
    if name in ("torch.cat", "torch.stack", "torch.concat") and expr.args:
        return joined(activation, fl, fi, expr, depth, walk_)
    if isinstance(func, ast.Call):
        kind = _MODULES.get(ctx.qualname(func.func) or "")
        if kind:
            return kind, f"`{_short(ctx, expr)}` (line {expr.lineno})"
        return None
    is_self = isinstance(func, ast.Attribute) and dotted(func.value) == "self"
    if (
        isinstance(func, ast.Attribute)
        and not is_self
        and ctx.qualname(func.value)
        not in (
            "torch",
            "torch.nn.functional",
        )
    ):
        if func.attr in _METHODS:
            return _METHODS[func.attr], f"`{_short(ctx, expr)}` (line {expr.lineno})"
        if func.attr in ("log", "exp") and not expr.args:
            return log_or_exp(
                activation, fl, fi, expr, func.value, func.attr == "log", depth, walk_
            )
        if func.attr in _SAME_VALUES:
            return activation(fl, fi, func.value, depth + 1, walk_)
    if isinstance(func, ast.Name) and func.id == "self" and walk_.self_cls:
        return _returned(fl, fi, expr, method_of(fl, walk_.self_cls, "forward"), depth, walk_)
    key = dotted(func)
    if key is None:
        return None
    if key.startswith("self.") and fi.cls is not None:
        # self.act = nn.Softmax(dim=1) / nn.Sequential(..., nn.Sigmoid())
        ctors = assigned_calls(fl, fi, key)
        kinds = {_module_activation(fl, c) for c in ctors}
        if len(kinds) == 1 and None not in kinds:
            kind = kinds.pop()
            assert kind is not None
            return kind, f"`{key}` (an `nn.{_CLASS_OF[kind]}`, line {ctors[0].lineno})"
        if not ctors and key.count(".") == 1 and walk_.self_cls:
            # self.m(x): a method of the class `self` is, not an attribute set to a layer
            method = method_of(fl, walk_.self_cls, key[5:])
            return _returned(fl, fi, expr, method, depth, walk_)
        return None
    callee = _function_called(fl, fi, expr)
    if callee is not None:
        return _returned(fl, fi, expr, callee, depth, walk_.to(None))
    return _model_output(fl, fi, func, expr, depth, walk_)


def _name(
    fl: FileLoops, fi: FunctionInfo, expr: ast.Name, depth: int, walk_: _Walk
) -> tuple[str, str] | None:
    stmt = _last_binding(fi, expr.id, expr.lineno)
    if stmt is None:
        if expr.id in fi.params() and not fi.is_module:
            return _from_callers(fl, fi, expr.id, depth, walk_)
        return None
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target, value = stmt.targets[0], stmt.value
    found = None
    if isinstance(target, ast.Name):
        found = activation(fl, fi, value, depth + 1, walk_)
    elif isinstance(target, ast.Tuple | ast.List):
        found = _unpacked(
            fl,
            fi,
            target,
            value,
            lambda t: isinstance(t, ast.Name) and t.id == expr.id,
            depth,
            walk_,
        )
    if found is None:
        return None
    return found[0], f"`{expr.id}` = {found[1]}"


def _item(
    fl: FileLoops,
    fi: FunctionInfo,
    base: ast.expr,
    key: str,
    line: int,
    depth: int,
    walk_: _Walk,
) -> tuple[str, str] | None:
    """Item `key` of the dict `base` holds at `line`: the last `d[key] = v` (or tuple
    unpacking into it) above, a `d = {key: v}` display, the dict a function returns, or,
    for a parameter, what its callers in the file pass."""
    if isinstance(base, ast.Call):
        return _item_of_call(fl, fi, base, None, depth, walk_, key)
    if not isinstance(base, ast.Name) or depth > _MAX_DEPTH:
        return None
    name = base.id
    stmt = item_binding(fi, name, key, line)
    if stmt is None:
        if name in fi.params() and not fi.is_module:
            return _from_callers(fl, fi, name, depth, walk_, key)
        return None
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target, value = stmt.targets[0], stmt.value
    found = None
    if is_item(target, name, key):
        found = activation(fl, fi, value, depth + 1, walk_)
    elif isinstance(target, ast.Tuple | ast.List):
        found = _unpacked(fl, fi, target, value, lambda t: is_item(t, name, key), depth, walk_)
    elif isinstance(target, ast.Name) and isinstance(value, ast.Dict):
        if None in value.keys:
            return None  # `{**other, ...}`
        items = [v for k, v in zip(value.keys, value.values, strict=True) if str_key_of(k) == key]
        found = activation(fl, fi, items[-1], depth + 1, walk_) if items else None
    elif isinstance(target, ast.Name) and isinstance(value, ast.Call):
        found = _item_of_call(fl, fi, value, None, depth, walk_, key)
    if found is None:
        return None
    return found[0], f"`{name}[{key!r}]` = {found[1]}"


def _unpacked(
    fl: FileLoops,
    fi: FunctionInfo,
    target: ast.Tuple | ast.List,
    value: ast.expr,
    picks: Callable[[ast.expr], bool],
    depth: int,
    walk_: _Walk,
) -> tuple[str, str] | None:
    """What `a, b = value` puts in the one target `picks` (a tuple display's item, or
    the item of what a call of the file's function returns); None with a starred one."""
    elts = target.elts
    index = next((i for i, t in enumerate(elts) if picks(t)), None)
    if index is None or any(isinstance(t, ast.Starred) for t in elts):
        return None
    if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(elts):
        return activation(fl, fi, value.elts[index], depth + 1, walk_)
    if isinstance(value, ast.Call):
        return _item_of_call(fl, fi, value, index, depth, walk_)
    return None


def _item_of_call(
    fl: FileLoops,
    fi: FunctionInfo,
    call: ast.Call,
    index: int | None,
    depth: int,
    walk_: _Walk,
    key: str | None = None,
) -> tuple[str, str] | None:
    """Item `index` of the tuple (or `key` of the dict) a call of the file's function or
    method returns."""
    func = call.func
    callee: FunctionInfo | None = None
    inner = walk_
    if isinstance(func, ast.Name) and func.id == "self" and walk_.self_cls:
        callee = method_of(fl, walk_.self_cls, "forward")
    elif isinstance(func, ast.Attribute) and dotted(func.value) == "self" and walk_.self_cls:
        if not assigned_calls(fl, fi, f"self.{func.attr}"):
            callee = method_of(fl, walk_.self_cls, func.attr)
    else:
        callee, inner = _function_called(fl, fi, call), walk_.to(None)
    return _returned(fl, fi, call, callee, depth, inner, index, key)


def _returned(
    fl: FileLoops,
    fi: FunctionInfo,
    call: ast.Call,
    callee: FunctionInfo | None,
    depth: int,
    walk_: _Walk,
    index: int | None = None,
    key: str | None = None,
) -> tuple[str, str] | None:
    """What every `return` of `callee` that can run under the walk's tests gives (item
    `index` of a returned tuple, item `key` of a returned dict); a returned parameter is
    what `call` passes for it."""
    if callee is None:
        return None
    owner = file_of(callee)  # this file, or the sibling module that defines it
    conds = walk_.conds
    if conds and subjects_assigned(callee.node, {c.subject for c in conds}):
        conds = []
    found = _returns(fl, fi, call, callee, owner, conds, depth, walk_, index, key)
    if found is not None or callee.cls is None or walk_.self_cls is None:
        return found
    # Settings are independent: where the returns differ, one chosen by tests on the
    # object's settings (`if self.method == "binary": return torch.sigmoid(x)`) is what
    # the call gives whenever those settings hold, unless the tests at the loss call
    # rule them out (a contradicted test; lead's policy: any combination can be set).
    for stmt in callee.own_statements():
        if not isinstance(stmt, ast.Return) or stmt.value is None:
            continue
        flags = [c for c in conditions_at(callee.node, stmt) if c.subject.startswith("self.")]
        if not flags or not compatible(conds, flags):
            continue
        if subjects_assigned(callee.node, {c.subject for c in flags}):
            return None
        narrowed = [*conds, *flags]
        if not settable(callee.cls, [c for c in narrowed if c.subject.startswith("self.")]):
            continue  # a combination the class rules out (analysis/settings.py)
        found = _returns(
            fl,
            fi,
            call,
            callee,
            owner,
            narrowed,
            depth,
            walk_.to(walk_.self_cls, narrowed),
            index,
            key,
        )
        if found is not None:
            return found[0], f"{found[1]} when {describe(flags)}"
    return None


def _returns(
    fl: FileLoops,
    fi: FunctionInfo,
    call: ast.Call,
    callee: FunctionInfo,
    owner: FileLoops,
    conds: list[Cond],
    depth: int,
    walk_: _Walk,
    index: int | None,
    key: str | None,
) -> tuple[str, str] | None:
    """What every `return` of `callee` that can run under `conds` gives (see _returned)."""
    results: list[tuple[str, str] | None] = []
    first: ast.Return | None = None
    for stmt in callee.own_statements():
        if not isinstance(stmt, ast.Return) or stmt.value is None:
            continue
        if conds and not compatible(conds, conditions_at(callee.node, stmt)):
            continue  # a branch that cannot run with the loss call's branch
        value: ast.expr | None = stmt.value
        if index is not None:
            value = (
                stmt.value.elts[index]
                if isinstance(stmt.value, ast.Tuple) and index < len(stmt.value.elts)
                else None
            )
        if value is None:
            return None
        first = first or stmt
        if key is not None:
            if (
                isinstance(value, ast.Name)
                and value.id in callee.params()
                and item_binding(callee, value.id, key, stmt.lineno) is None
            ):  # the dict the call passes, returned
                arg = argument_for(callee, call, value.id)
                found = None if arg is None else _item(fl, fi, arg, key, call.lineno, depth, walk_)
                results.append(found)
            else:
                results.append(_item(owner, callee, value, key, stmt.lineno, depth + 1, walk_))
        elif (
            isinstance(value, ast.Name)
            and value.id in callee.params()
            and _last_binding(callee, value.id, value.lineno) is None
        ):
            arg = argument_for(callee, call, value.id)
            results.append(None if arg is None else activation(fl, fi, arg, depth + 1, walk_))
        else:
            results.append(activation(owner, callee, value, depth + 1, walk_))
        if results[-1] is None:
            return None
    kinds = {r[0] for r in results if r is not None}
    if first is None or len(kinds) != 1:
        return None
    what = f"item {index} of the tuple `{callee.name}` returns" if index is not None else ""
    what = f"item {key!r} of the dict `{callee.name}` returns" if key is not None else what
    what = what or f"`{callee.name}` returns"
    proof = results[0][1] if results[0] is not None else ""
    return kinds.pop(), (
        f"`{_short(fl.ctx, call)}` ({what}: {proof}, line {first.lineno}{_where(fl, owner)})"
    )


def _from_callers(
    fl: FileLoops, fi: FunctionInfo, param: str, depth: int, walk_: _Walk, key: str | None = None
) -> tuple[str, str] | None:
    """A parameter of a method: what a `self.<method>(...)` call in the file passes; of a
    plain function: what a call of it in the file passes (its item `key`, if given)."""
    if fi.cls is None:
        return _from_function_callers(fl, fi, param, depth, walk_, key)
    for caller, call, self_cls in self_call_sites(fl, fi):
        if walk_.self_cls not in (None, fi.cls.name) and self_cls != walk_.self_cls:
            continue
        arg = argument_for(fi, call, param)
        if arg is None:
            continue
        # the tests at the loss call still hold in the caller (self is the same object)
        conds = walk_.conds + _self_conds(caller, call)
        if not compatible(walk_.conds, _self_conds(caller, call)):
            continue
        if walk_.params_of is fi.node and not all(
            (const := passed_constant(fi, call, c.subject)) is None
            or compatible([Cond(c.subject, const.value, True)], [c])
            for c in walk_.params
        ):
            continue  # this caller's constant argument rules out the loss call's branch
        inner = walk_.to(self_cls, conds)
        if key is None:
            found = activation(fl, caller, arg, depth + 1, inner)
        else:
            found = _item(fl, caller, arg, key, call.lineno, depth + 1, inner)
        if found is not None:
            return found[0], (
                f"`{param}`, which `{self_cls}.{caller.name}` passes as "
                f"{found[1]} (line {call.lineno})"
            )
    return None


def _from_function_callers(
    fl: FileLoops, fi: FunctionInfo, param: str, depth: int, walk_: _Walk, key: str | None
) -> tuple[str, str] | None:
    """A parameter of a plain function of the file: what a call of it passes."""
    if fi.parent is not None or fi.file is not fl:
        return None
    for caller, event in fl.callers(fi):
        call = event.node
        if not isinstance(call, ast.Call):
            continue
        arg = argument_for(fi, call, param)
        if arg is None:
            continue
        inner = walk_.to(caller.cls.name if caller.cls is not None else None, [])
        if key is None:
            found = activation(fl, caller, arg, depth + 1, inner)
        else:
            found = _item(fl, caller, arg, key, call.lineno, depth + 1, inner)
        if found is not None:
            return found[0], (
                f"`{param}`, which `{caller.name}` passes as {found[1]} (line {call.lineno})"
            )
    return None


def _model_output(
    fl: FileLoops, fi: FunctionInfo, func: ast.expr, call: ast.Call, depth: int, walk_: _Walk
) -> tuple[str, str] | None:
    """`model(x)` where model's class ends its forward with a softmax/sigmoid."""
    ctx = fl.ctx
    held = file_flow(ctx).scope(fi.node).value(func)
    if held.kind is not Kind.MODULE or not held.cls:
        return None
    source = held.source
    if isinstance(source, ast.Call):
        kind = _module_activation(fl, source)
        if kind:
            return kind, f"`{ctx.segment(func)}(...)` (its last layer is `nn.{_CLASS_OF[kind]}`)"
    found = _class_forward(fl, held.cls)
    if found is None:
        return None
    owner, forward = found
    returns = [s.value for s in forward.own_statements() if isinstance(s, ast.Return) and s.value]
    if not returns:
        return None
    # another object: the tests on `self` say nothing of it, but the constants its
    # constructor call passes may fix some of its settings
    conds: list[Cond] = []
    pruned = False
    if isinstance(source, ast.Call) and held.cls in owner.classes:
        conds = built_settings(fl, owner, held.cls, source)
        if conds and not subjects_assigned(forward.node, {c.subject for c in conds}):
            kept = [r for r in returns if compatible(conds, conditions_at(forward.node, r))]
            pruned, returns = len(kept) < len(returns), kept
        else:
            conds = []
    inner = walk_.to(held.cls, conds)
    built = ""
    if pruned and isinstance(source, ast.Call):  # name the settings that chose the returns
        built = f" as built with {describe(conds)} (line {source.lineno})"
    results = [activation(owner, forward, r, depth + 1, inner) for r in returns]
    kinds = {r[0] if r else None for r in results}
    if len(kinds) == 1 and None not in kinds:
        kind = kinds.pop()
        assert kind is not None
        where = "" if owner is fl else f" in {owner.ctx.path.rsplit('/', 1)[-1]}"
        return kind, (
            f"`{ctx.segment(func)}(...)`, whose `{held.cls}.forward` returns a {kind} output "
            f"(line {returns[0].lineno}{where}){built}"
        )
    return None
