"""Objects of the project's plain classes: what their construction stores, and their
operators.

`edge = Edge(torch.zeros(n))` keeps the CPU tensor on the object (`self.vec`, as the
class's `__init__` leaves it when followed with what this call passes:
`Value.state`); a method called on it (`edge.combine(x)`) runs with it, so a meeting of
that tensor with a device tensor inside is reported at the call, and a rule can name
the factory here that made it. Only attributes no other method of the class, and no
`obj.attr = ...` of this file, assigns are kept: a tensor's place changes only by
rebinding.

`a * b` where `a` is such an object runs `type(a).__mul__(a, b)` (or `b`'s `__rmul__`
where `a`, a number or a tensor, gives way): the result is what that method returns
(UNKNOWN where it is not followed), never a tensor combined from the operands.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.default_path import on_cpu
from torchdoctor.check.analysis.made_results import carried
from torchdoctor.check.analysis.scope_calls import ScopeCalls
from torchdoctor.check.analysis.scope_self import _carried
from torchdoctor.check.analysis.syntax import _is_static
from torchdoctor.check.analysis.values import (
    UNKNOWN,
    AnyFunction,
    CallFacts,
    Env,
    Kind,
    Mismatch,
    Place,
    Value,
    one_of,
)

if TYPE_CHECKING:
    from torchdoctor.check.analysis.interfaces import FileFacts

_Found = tuple["FileFacts | None", AnyFunction]


class ScopeObjects(ScopeCalls):
    """Constructions of plain classes, and operators on their objects."""

    # `a * b` of an object: the call `a.__mul__(b)` it stands for, one per operator node,
    # and back (made on first need: most scopes have none)
    _operator_calls: dict[int, ast.Call] | None = None
    _operator_sites: dict[int, ast.BinOp] | None = None

    # -- construction -----------------------------------------------------------------
    def _constructed(
        self,
        node: ast.Call,
        built: Value,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> Value:
        """`Edge(torch.zeros(n))`: the object, with the CPU tensors its `__init__` keeps
        of what this call passes (only a call passing one is followed)."""
        if not any(on_cpu(v) for v in (*args, *(v for _, v in keywords))):
            return built
        found = self._class_method(built, "__init__")
        if found is None or any(isinstance(a, ast.Starred) for a in node.args):
            return built
        owner, init = found
        params = [*init.args.posonlyargs, *init.args.args][1:]
        names = {p.arg for p in [*params, *init.args.kwonlyargs]}
        arguments = {p.arg: v for p, v in zip(params, args, strict=False) if v is not UNKNOWN}
        for name, value in keywords:
            if name is None:
                return built  # **kwargs: what binds where is not known
            if name in names and value is not UNKNOWN:
                arguments[name] = value
        facts = (owner or self.ff).call_facts(init, arguments, self.depth, {})
        if facts is None:
            return built
        state = tuple(
            (attr, value)
            for attr, value in facts.writes
            if "." not in attr and on_cpu(value) and self._kept(built, owner, attr)
        )
        return dataclasses.replace(built, state=state) if state else built

    def _kept(self, built: Value, owner: FileFacts | None, attr: str) -> bool:
        """Whether only construction assigns `attr` of the class's objects: no other
        method of the class (bases included), no `obj.attr = ...` in this file."""
        facts = owner or self.ff
        cls = facts.classes.get(built.cls)
        if cls is None:
            return False
        construction = {"__init__", *facts.init_helpers(cls)}  # type: ignore[attr-defined]
        for name, method in facts.inherited_methods(cls).items():  # type: ignore[attr-defined]
            if name not in construction:
                assigned = facts.self_attrs_assigned(method)
                if attr in assigned or "*" in assigned:
                    return False
        source = self.ctx.source
        if "setattr(" in source:
            return False
        # `obj.attr = ...` of this file (a method's own `self.attr = ...` is asked above)
        stored = re.compile(rf"\.{re.escape(attr)}\s*(?:[-+*/@%&|^]|//|\*\*)?=(?!=)")
        return not any(
            not _SELF_END.search(source, max(0, m.start() - 5), m.start())
            for m in stored.finditer(source)
        )

    def _class_method(self, value: Value, name: str) -> _Found | None:
        """The method `name` of the project class of the object `value` (the file's, or
        another file's with that file's facts); None: not an object, or not found."""
        if value.kind is not Kind.OBJECT or not value.cls:
            return None
        if value.where:
            found = self.ff.foreign_method(value.where, value.cls, name)  # type: ignore[attr-defined]
            return None if found is None else (found[0], found[1])
        cls = self.ff.classes.get(value.cls)
        method = self.ff.inherited_methods(cls).get(name) if cls is not None else None  # type: ignore[attr-defined]
        return None if method is None or _is_static(method) else (None, method)

    def _state_meetings(
        self,
        node: ast.Call,
        target: AnyFunction,
        me: str,
        passed: list[tuple[str, ast.expr, Value]],
        kept: Env,
        facts: CallFacts,
        where: str,
    ) -> None:
        """A CPU tensor the object keeps meets a device tensor inside the method: a
        meeting at the call (or the operator it stands for)."""
        func = node.func
        if not isinstance(func, ast.Attribute):
            return
        receiver = func.value
        site: ast.AST = (self._operator_sites or {}).get(id(node), node)
        text = self._text(receiver)
        for m in facts.mismatches:
            hit = next((a for a, v in kept.items() if _carried(m, v, f"{me}.{a}")), None)
            if hit is None or m.other.place is not Place.DEVICE:
                continue
            other = next(
                (n for _, n, v in passed if v == m.other or _same_source(v, m.other)), receiver
            )
            line = getattr(m.innermost().site, "lineno", 0)
            self._mismatches[(id(site), id(receiver))] = Mismatch(
                site,
                receiver,
                kept[hit],
                other,
                m.other,
                "operator" if site is not node else "call",
                path=f"`{target.name}` combines `{text}.{hit}` with a tensor on the device "
                f"({where}line {line})",
                callee=target,
                inner=m,
                attribute=f"{text}.{hit}",
            )
            return

    def _super_call(
        self, node: ast.Call, args: list[Value], keywords: list[tuple[str | None, Value]]
    ) -> Value | None:
        """`super().__init__(vec, ...)` in a method of a plain class whose base is a class
        of this file: the base's method runs on this `self` (followed with `self.*` as
        held here; what it leaves on `self` replaces what it may assign), so a
        subclass's construction keeps what its base's constructor stores. None: not
        such a call (a module's base, a library's or another file's class)."""
        func = node.func
        assert isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
        sup = func.value
        cls, env, me = self.cls, self.env, self.self_name
        if (
            not (isinstance(sup.func, ast.Name) and sup.func.id == "super" and not sup.args)
            or cls is None
            or env is None
            or not me
            or self.ff.is_module_class(cls)
            or any(isinstance(a, ast.Starred) for a in node.args)
        ):
            return None
        target, owner = None, None
        for base in cls.bases:
            owner = self.ff.classes.get(base.id) if isinstance(base, ast.Name) else None
            if owner is None:
                return None  # a base of a library or another file: its method is not here
            target = self.ff.inherited_methods(owner).get(func.attr)  # type: ignore[attr-defined]
            if target is not None:
                break
        if target is None or owner is None or _is_static(target):
            return None
        prefix = me + "."
        carried = {k[len(prefix) :]: v for k, v in env.items() if k.startswith(prefix)}
        facts = self._facts_with_self(target, args, keywords, node, carried)
        if facts is None:
            return None
        self._apply_writes(owner, (target,), [(target, facts)])
        return facts.returned

    # -- operators --------------------------------------------------------------------
    def _operator_call(self, node: ast.BinOp, left: Value, right: Value) -> Value:
        """`a * b` where `a` is an object of a project class defining `__mul__` is
        `a.__mul__(b)`; where only `b`'s class defines `__rmul__` (and `a` is a tensor
        or a number, whose operators give way to it), `b.__rmul__(a)`. Anything less
        certain (both define one, a class not found, an unknown left operand) is
        UNKNOWN: the result is whatever the method makes, not a tensor of the operands."""
        names = _OPERATOR_METHODS.get(type(node.op))
        if names is None:
            return UNKNOWN
        forward = self._class_method(left, names[0])
        reflected = self._class_method(right, names[1])
        if forward is not None and reflected is None:
            return self._follow_operator(node, forward, left, node.left, node.right, right)
        if forward is None and reflected is not None and _gives_way(node.left, left):
            return self._follow_operator(node, reflected, right, node.right, node.left, left)
        return UNKNOWN

    def _follow_operator(
        self,
        node: ast.BinOp,
        found: _Found,
        recv: Value,
        recv_node: ast.expr,
        arg_node: ast.expr,
        arg: Value,
    ) -> Value:
        owner, method = found
        if self._operator_calls is None or self._operator_sites is None:
            self._operator_calls, self._operator_sites = {}, {}
        call = self._operator_calls.get(id(node))
        if call is None:  # one call node per operator, kept while the scope lives
            call = ast.Call(ast.Attribute(recv_node, method.name, ast.Load()), [arg_node], [])
            self._operator_calls[id(node)] = ast.copy_location(call, node)
            self._operator_sites[id(call)] = node
        returned = self._follow_call(call, method, [arg], [], recv, on_object=True, owner=owner)
        if returned is None or returned is UNKNOWN:
            return UNKNOWN
        if owner is not None and not one_of(returned, [arg]):
            return carried(returned, os.path.basename(owner.ctx.path), node)
        return returned


# the methods `a <op> b` runs: `a.__op__(b)`, else `b.__rop__(a)`
_OPERATOR_METHODS: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: ("__add__", "__radd__"),
    ast.Sub: ("__sub__", "__rsub__"),
    ast.Mult: ("__mul__", "__rmul__"),
    ast.MatMult: ("__matmul__", "__rmatmul__"),
    ast.Div: ("__truediv__", "__rtruediv__"),
    ast.FloorDiv: ("__floordiv__", "__rfloordiv__"),
    ast.Mod: ("__mod__", "__rmod__"),
    ast.Pow: ("__pow__", "__rpow__"),
    ast.LShift: ("__lshift__", "__rlshift__"),
    ast.RShift: ("__rshift__", "__rrshift__"),
    ast.BitOr: ("__or__", "__ror__"),
    ast.BitXor: ("__xor__", "__rxor__"),
    ast.BitAnd: ("__and__", "__rand__"),
}


def _gives_way(node: ast.expr, value: Value) -> bool:
    """A left operand whose own operator returns NotImplemented for an object of a
    project class, so that the object's reflected method runs: a number written out,
    or a tensor (torch's operators turn a TypeError into NotImplemented), also one taken
    out of a batch. Not a NumPy array: it applies the object to each element."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | complex):
        return True
    return value.kind in (Kind.TENSOR, Kind.PARAMETER) or (value.kind is Kind.BATCH and value.part)


def _same_source(a: Value, b: Value) -> bool:
    return a.source is not None and a.source is b.source


# a receiver `self` right before the `.attr` looked at
_SELF_END = re.compile(r"(?<![\w.])self$")
