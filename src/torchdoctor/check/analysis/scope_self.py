"""Calls of `self`'s methods followed with `self` as the caller holds it.

A method that keeps a CPU tensor on `self` (`self.mem`, made in `__init__` and never
registered) meets the module's device in another method it runs (`self.beta * self.mem`
in `_base_state_function`); that method's own seeds cannot say what `self.mem` holds
when the caller has reassigned it. So where the caller holds a CPU tensor attribute
that the callee reads, the call is followed with the caller's `self.*`
(`FileFlow.call_facts(..., attributes)`): a meeting of that attribute inside is reported
at the call (`Mismatch.attribute`), and what the callee leaves on `self` replaces what
it may assign. `self.state_function(x)`, an attribute holding one of several bound
methods (`object_state.method_aliases`), runs each of them (with the caller's `self`
where it carries such a tensor, else like any followed call): its result is their
join, a meeting counts only when every one of them meets, and what they may assign on
`self` is forgotten where their writes are not followed.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.default_path import on_cpu
from torchdoctor.check.analysis.scope_methods import ScopeMethods
from torchdoctor.check.analysis.syntax import accessed_value, dotted
from torchdoctor.check.analysis.values import (
    UNKNOWN,
    AnyFunction,
    CallFacts,
    Env,
    Mismatch,
    Place,
    Value,
    join,
)

if TYPE_CHECKING:
    from torchdoctor.check.analysis.interfaces import FileFacts


class ScopeSelf(ScopeMethods):
    """Follows `self.m(...)` with the caller's `self` where it carries a CPU tensor."""

    def _self_call(
        self, node: ast.Call, args: list[Value], keywords: list[tuple[str | None, Value]]
    ) -> tuple[bool, Value] | None:
        """(whether `self.x` is an alias of bound methods, the join of what the methods
        return), after recording the meetings and writes; None: not followed."""
        func = node.func
        if func.__class__ is not ast.Attribute:
            return None
        assert isinstance(func, ast.Attribute)
        me = self.self_name
        if not me or func.value.__class__ is not ast.Name or func.value.id != me:  # type: ignore[attr-defined]
            return None
        env, cls = self.env, self.cls
        if env is None or cls is None:
            return None
        prefix = me + "."
        cpu = [
            k[len(prefix) :]
            for k, v in env.items()
            if v.place is Place.CPU
            and k.startswith(prefix)
            and "." not in k[len(prefix) :]
            and on_cpu(v)
        ]
        if not cpu:
            return None  # the common case: nothing on `self` to carry
        direct = self.ff.methods(cls).get(func.attr)
        if direct is not None:
            targets: tuple[AnyFunction, ...] = (direct,)
            # only where the callee (or a method it runs) reads such an attribute
            reached = self.ff.reached_methods(cls, direct)
            cpu = [a for a in cpu if any(f".{a}" in self.ff.text(m) for m in reached)]
        elif func.attr in self.ff.alias_names(cls):
            targets = self.ff.method_aliases(cls).get(func.attr, ())
        else:
            return None
        if not cpu or not targets or any(isinstance(a, ast.Starred) for a in node.args):
            return None
        carried = {k[len(prefix) :]: v for k, v in env.items() if k.startswith(prefix)}
        all_facts: list[tuple[AnyFunction, CallFacts]] = []
        for target in targets:
            facts = self._facts_with_self(target, args, keywords, node, carried)
            if facts is None:
                return None
            all_facts.append((target, facts))
        self._attribute_meetings(node, func, all_facts, {a: carried[a] for a in cpu})
        self._apply_writes(cls, targets, all_facts)
        self._self_followed = node
        returned = all_facts[0][1].returned
        for _, facts in all_facts[1:]:
            returned = join(returned, facts.returned)
        return direct is None, returned

    def _aliased_methods(self, func: ast.expr) -> tuple[AnyFunction, ...]:
        """The bound methods `self.x` may hold, for a call `self.x(...)` (else ())."""
        cls = self.cls
        if cls is None or func.__class__ is not ast.Attribute:
            return ()
        assert isinstance(func, ast.Attribute)
        value = func.value
        if value.__class__ is not ast.Name or value.id != self.self_name:  # type: ignore[attr-defined]
            return ()
        if func.attr not in self.ff.alias_names(cls) or func.attr in self.ff.methods(cls):
            return ()
        return self.ff.method_aliases(cls).get(func.attr, ())

    def _follow_each(
        self,
        node: ast.Call,
        targets: tuple[AnyFunction, ...],
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        recv: Value | None,
    ) -> Value:
        """A call of one of several methods: the join of what they return; a meeting
        inside counts only where every one of them meets (keyed by the call and the
        argument that meets)."""
        recorded = self._mismatches  # updated in place: loop passes hold it
        before = dict(recorded)
        found: dict[tuple[int, int], Mismatch] | None = None
        returned: Value | None = None
        for target in targets:
            recorded.clear()
            recorded.update(before)
            value = self._follow_call(node, target, args, keywords, recv) or UNKNOWN
            returned = value if returned is None else join(returned, value)
            new = {k: m for k, m in recorded.items() if k not in before}
            found = new if found is None else {k: m for k, m in found.items() if k in new}
        recorded.clear()
        recorded.update({**before, **(found or {})})
        env, cls = self.env, self.cls
        if env is not None and cls is not None:
            # what they may assign on `self` is no longer what this scope knew
            assigned: set[str] = set()
            for target in targets:
                for reached in self.ff.reached_methods(cls, target):
                    assigned |= self.ff.self_attrs_assigned(reached)
            prefix = self.self_name + "."
            for key in [k for k in env if k.startswith(prefix)]:
                attr = key[len(prefix) :].split(".", 1)[0]
                if attr in assigned or "*" in assigned:
                    self._touch(key)
                    del env[key]
        return returned or UNKNOWN

    def _follow_call(
        self,
        node: ast.Call,
        target: AnyFunction,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        recv: Value | None = None,
        *,
        on_object: bool = False,
        owner: FileFacts | None = None,
    ) -> Value | None:
        raise NotImplementedError  # ScopeCalls._follow_call

    def _facts_with_self(
        self,
        target: AnyFunction,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        node: ast.Call,
        carried: Env,
    ) -> CallFacts | None:
        params = [*target.args.posonlyargs, *target.args.args][1:]
        names = {p.arg for p in [*params, *target.args.kwonlyargs]}
        arguments = {p.arg: v for p, v in zip(params, args, strict=False) if v is not UNKNOWN}
        for (name, value), kw in zip(keywords, node.keywords, strict=True):
            if name is None or kw.arg is None:
                return None  # **kwargs: positions unknown
            if name in names and value is not UNKNOWN:
                arguments[name] = value
        return self.ff.call_facts(target, arguments, self.depth, carried)

    def _attribute_meetings(
        self,
        node: ast.Call,
        func: ast.Attribute,
        all_facts: list[tuple[AnyFunction, CallFacts]],
        cpu: Env,
    ) -> None:
        """A meeting of a carried CPU attribute inside every method the call may run."""
        if not self._meeting:
            return
        found: list[tuple[AnyFunction, str, Mismatch]] = []
        for target, facts in all_facts:
            params = [*target.args.posonlyargs, *target.args.args]
            me = params[0].arg if params else ""
            hit = next(
                (
                    (attr, m)
                    for m in facts.mismatches
                    for attr, value in cpu.items()
                    if _carried(m, value, f"{me}.{attr}")
                ),
                None,
            )
            if hit is None:
                return  # one of the methods it may run does not meet it
            found.append((target, *hit))
        target, attr, inner = found[0]
        line = getattr(inner.innermost().site, "lineno", 0)
        self._mismatches[(id(node), id(func))] = Mismatch(
            node,
            func,
            cpu[attr],
            func,
            inner.other,
            "call",
            path=f"`{target.name}` combines `self.{attr}` with a tensor on the device "
            f"(line {line})",
            callee=target,
            inner=inner,
            attribute=f"{self.self_name}.{attr}",
        )

    def _apply_writes(
        self,
        cls: ast.ClassDef,
        targets: tuple[AnyFunction, ...],
        all_facts: list[tuple[AnyFunction, CallFacts]],
    ) -> None:
        """`self.x` as the methods leave it (joined), for what they may assign."""
        env = self.env
        assert env is not None
        assigned: set[str] = set()
        for target in targets:
            for reached in self.ff.reached_methods(cls, target):
                assigned |= self.ff.self_attrs_assigned(reached)
        if not assigned:
            return
        prefix = self.self_name + "."
        left: Env | None = None
        for _, facts in all_facts:
            writes = dict(facts.writes)
            if left is None:
                left = writes
            else:
                left = {k: join(v, writes[k]) for k, v in left.items() if k in writes}
        for key in [k for k in env if k.startswith(prefix)]:
            attr = key[len(prefix) :].split(".", 1)[0]
            if attr in assigned or "*" in assigned:
                del env[key]
        for attr, value in (left or {}).items():
            if attr.split(".", 1)[0] in assigned or "*" in assigned:
                self._touch(prefix + attr)
                if value is not UNKNOWN:
                    env[prefix + attr] = value


def _carried(m: Mismatch, value: Value, key: str) -> bool:
    """Whether the CPU side of a meeting inside the callee is the carried attribute: the
    value passed in, or what `self.x` holds there (computed from it: `self.mem = (1 -
    r) * self.mem`), read as `self.x` or carried into a method it runs."""
    if m.cpu == value or (value.source is not None and m.cpu.source is value.source):
        return True
    if m.attribute:
        return m.attribute == key
    return m.via != "call" and dotted(accessed_value(m.cpu_node)) == key
