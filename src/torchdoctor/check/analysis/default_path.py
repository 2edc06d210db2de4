"""The path where a caller leaves out a parameter whose default is None (or where an
attribute `__init__` sets to None has not been set yet).

`def forward(self, x, h=None): if h is None: h = torch.zeros(n)` makes `h` on the CPU
whenever the caller gives no `h`, whatever it is when one is given. The plain join of the
two branches knows nothing (the given `h` is unknown), so the meeting of `h` with the
module's device is lost. A test that can be decided with the parameter at its default
(`h is None`, `not h`, `h != None`) says which branch that call runs; what that branch
leaves on the CPU stays a fact, marked `Value.default_of` = the parameter ("CPU when the
caller leaves it out"), for the rules' messages.

An attribute works the same way: `self.feature_map = None` in `__init__`, set only by a
method the user may call (`register_feature_map`), makes `if self.feature_map is None:`
the branch an object runs as built (`Value.default_of` = "self.feature_map").
"""

from __future__ import annotations

import ast
import dataclasses

from torchdoctor.check.analysis.values import _TENSOR_KINDS, Env, Kind, Place, ScopeNode, Value
from torchdoctor.check.tree_walk import parameter_defaults, walk


def none_defaults(func: ScopeNode) -> frozenset[str]:
    """Parameters of `func` whose default is None (`h=None`, `*, mask=None`)."""
    if isinstance(func, ast.Module):
        return frozenset()
    return frozenset(
        a.arg
        for a, d in parameter_defaults(func.args)
        if isinstance(d, ast.Constant) and d.value is None
    )


def _self_attr(node: ast.expr) -> str | None:
    """`self.x` -> "self.x" (an attribute of a plain name); None otherwise."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def first_bindings(func: ScopeNode, names: frozenset[str]) -> dict[str, int]:
    """The first line where `func` binds each of `names` (assigns, deletes, declares it
    global or nonlocal; `self.x` for an attribute); then it is no longer the caller's
    (nor what `__init__` left) from that line on."""
    found: dict[str, int] = {}
    for node in walk(func):
        if isinstance(node, ast.Name) and node.id in names and not isinstance(node.ctx, ast.Load):
            bound = [node.id]
        elif (
            isinstance(node, ast.Attribute)
            and not isinstance(node.ctx, ast.Load)
            and (attr := _self_attr(node)) in names
        ):
            bound = [attr]
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound = [n for n in node.names if n in names]
        else:
            continue
        for name in bound:
            found[name] = min(found.get(name, node.lineno), node.lineno)
    return found


def when_omitted(test: ast.expr, params: frozenset[str]) -> tuple[str, bool] | None:
    """(parameter, the test's truth) when a parameter in `params` is None, if that decides
    the test: `h is None` -> ("h", True), `not h == None` -> ("h", False)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = when_omitted(test.operand, params)
        return (inner[0], not inner[1]) if inner else None
    subject = _subject(test)
    if subject is not None and subject in params:
        return subject, False  # None is falsy
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and (subject := _subject(test.left)) is not None
        and subject in params
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        op = test.ops[0]
        if isinstance(op, ast.Is | ast.Eq):
            return subject, True
        if isinstance(op, ast.IsNot | ast.NotEq):
            return subject, False
    return None


def _subject(node: ast.expr) -> str | None:
    """A parameter's name, or `self.x` (an attribute `__init__` leaves None)."""
    return node.id if isinstance(node, ast.Name) else _self_attr(node)


def given_truth(test: ast.expr, param: str, held: Value | None) -> bool | None:
    """The truth of `param is None` / `param is not None` where `param` holds `held`, a
    tensor every call seen passes there (not assumed: a caller's fact): that call never
    runs the branch its default would; None if the test or the value says nothing."""
    if (
        held is None
        or held.kind not in (Kind.TENSOR, Kind.BATCH)
        or held.place is Place.UNKNOWN
        or held.assumed
        or held.is_input
        or held.default_of
        or "." in param
        or param.startswith("$")
    ):
        return None
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Is | ast.IsNot)
        and isinstance(test.left, ast.Name)
        and test.left.id == param
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        return isinstance(test.ops[0], ast.IsNot)
    return None


def default_text(param: str) -> str:
    """How a message says the default path: the caller leaves out a parameter, or an
    attribute keeps the None `__init__` gives it (no method has set it yet)."""
    if param.startswith("$"):
        return f"when the environment leaves `{param[1:]}` unset"
    if "." in param:
        return f"while `{param}` is still the None `__init__` sets"
    return f"when the caller leaves out `{param}`"


def on_cpu(value: Value) -> bool:
    """A tensor made on the CPU (0-dim ones mix with any device), or a tuple of them."""
    if value.kind is Kind.CONTAINER:
        return bool(value.items) and all(on_cpu(item) for item in value.items or ())
    return (
        value.kind in _TENSOR_KINDS
        and value.kind is not Kind.UNKNOWN
        and value.place is Place.CPU
        and not value.scalar
        and not value.assumed
    )


def marked(value: Value, param: str) -> Value:
    """`value`, known to be there only when the caller leaves out `param`."""
    if value.default_of:
        return value  # already a narrower path
    items = value.items
    if items is not None:
        items = tuple(marked(item, param) for item in items)
    return dataclasses.replace(value, default_of=param, items=items)


def keep_default_side(joined: Value, default_side: Value, param: str) -> Value:
    """The join of two branches, or the CPU value of the branch the default runs."""
    if on_cpu(joined) or not on_cpu(default_side):
        return joined
    return marked(default_side, param)


def keep_default_env(joined: Env, default_env: Env, param: str) -> Env:
    """`joined` with each CPU value of the default's branch kept (see keep_default_side),
    and each loader of CPU batches (`if custom: loader = Custom(...) else: DataLoader`)."""
    for key, value in default_env.items():
        if not (on_cpu(value) or _cpu_loader(value)):
            continue
        before = joined.get(key)
        if before is None or not (on_cpu(before) or _cpu_loader(before)):
            joined[key] = marked(value, param)
    return joined


def _cpu_loader(value: Value) -> bool:
    return value.kind is Kind.LOADER and value.place is Place.CPU and not value.assumed
