"""Calls: resolution to this file's functions, module calls, methods, call sites."""

from __future__ import annotations

import ast
import dataclasses
import os
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.made_results import carried
from torchdoctor.check.analysis.scope_self import ScopeSelf
from torchdoctor.check.analysis.syntax import _is_static, base_name, dotted, is_staticmethod
from torchdoctor.check.analysis.values import (
    _TENSOR_KINDS,
    UNKNOWN,
    AnyFunction,
    CallFacts,
    CallSite,
    Env,
    Kind,
    Mismatch,
    Place,
    Value,
    informative,
    one_of,
    proven_module,
    renamed,
)
from torchdoctor.check.analysis.wrapped import shared_result, through_cache

if TYPE_CHECKING:
    from torchdoctor.check.analysis.interfaces import FileFacts


class ScopeCalls(ScopeSelf):
    """Evaluates calls."""

    # -- calls --------------------------------------------------------------------------------
    def _eval_call(self, node: ast.expr) -> Value:
        assert isinstance(node, ast.Call)
        statement = self._statement_call is node
        self._statement_call = None
        func = node.func
        recv: Value | None = None
        if isinstance(func, ast.Attribute):
            recv = self.eval(func.value)
            if self._recording:
                self._method_calls.setdefault(func.attr, []).append(node)
                self._named_calls.setdefault(func.attr, []).append(node)
            callee = UNKNOWN
            key = dotted(func)
            if key is not None and self.env is not None and key in self.env:
                callee = self.env[key]
            elif key is not None:
                callee = self.global_value(key.split(".", 1)[0], key)
        else:
            callee = self.eval(func)
            if self._recording and isinstance(func, ast.Name):
                self._named_calls.setdefault(func.id, []).append(node)
        args: list[Value] = []
        opaque = False
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                opaque = True
                args.append(self.eval(arg.value))
            else:
                args.append(self.eval(arg))
        keywords: list[tuple[str | None, Value]] = []
        for kw in node.keywords:
            value = self.eval(kw.value)
            keywords.append((kw.arg, value))
            if kw.arg is None:
                opaque = True
        qual = self.ctx.qualname(func) or ""
        result = self._call(node, qual, recv, callee, args, keywords, statement)
        self._record_call_site(node, args, keywords, opaque, recv)
        if self._use_logs and recv is not None:  # a loop's first or second pass runs
            self._log_uses(node, recv, args, keywords)
        effect = self._init_helper_effect(node, args, keywords, opaque)
        if statement and result is UNKNOWN and self.env is not None:
            self._forget_mutated(node, recv)
        if effect is not None and self.env is not None:
            assigned, writes = effect
            prefix = self.self_name + "."
            for attr in assigned:
                self._touch(prefix + attr)  # set by the helper, whatever it set it to
            for key in [k for k in self.env if k.startswith(prefix)]:
                if key[len(prefix) :].split(".", 1)[0] in assigned:
                    del self.env[key]
            for attr, value in writes:
                if attr.split(".", 1)[0] in assigned:
                    self._touch(prefix + attr)
                    self.env[prefix + attr] = value
        return result

    def _init_helper_effect(
        self,
        node: ast.Call,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        opaque: bool,
    ) -> tuple[frozenset[str], tuple[tuple[str, Value], ...]] | None:
        """`self._build_masks(n)` of a method only construction runs: the attributes it
        (or a helper it runs) may assign, and what it leaves in them, followed with the
        arguments and `self` as they are here (None: not such a call)."""
        func = node.func
        env = self.env
        if (
            env is None
            or opaque
            or self.cls is None
            or not self.self_name
            or not isinstance(func, ast.Attribute)
            or not isinstance(func.value, ast.Name)
            or func.value.id != self.self_name
            or func.attr not in self.ff.init_helpers(self.cls)
        ):
            return None
        method = self.ff.methods(self.cls).get(func.attr)
        if method is None:
            return None
        params = [p.arg for p in [*method.args.posonlyargs, *method.args.args]][1:]
        by_name = set(params) | {p.arg for p in method.args.kwonlyargs}
        arguments = {p: v for p, v in zip(params, args, strict=False) if v is not UNKNOWN}
        arguments.update(
            {k: v for k, v in keywords if k is not None and k in by_name and v is not UNKNOWN}
        )
        prefix = self.self_name + "."
        attributes = {k[len(prefix) :]: v for k, v in env.items() if k.startswith(prefix)}
        assigned: frozenset[str] = frozenset()
        for reached in self.ff.reached_methods(self.cls, method):
            assigned |= self.ff.self_attrs_assigned(reached)
        if "*" in assigned:  # setattr(self, name, ...): any attribute
            assigned |= {k[len(prefix) :].split(".", 1)[0] for k in env if k.startswith(prefix)}
            return assigned, ()
        facts = self.ff.call_facts(method, arguments, self.depth, attributes)
        # not followed (too deep, over the budget): what it may assign is not known
        return assigned, facts.writes if facts is not None else ()

    def _record_call_site(
        self,
        node: ast.Call,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        opaque: bool,
        recv: Value | None = None,
    ) -> None:
        if not self._recording:
            return
        func = node.func
        module: Value | None = None
        if isinstance(func, ast.Name):
            name = func.id
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and self.self_name
            and func.value.id == self.self_name
        ):
            name = f"self.{func.attr}"
        elif isinstance(func, ast.Attribute) and recv is not None and recv.kind is Kind.OBJECT:
            name = f"{recv.cls}.{func.attr}"  # a method of the file's class, on an instance
        elif (
            isinstance(func, ast.Attribute)
            and recv is not None
            and recv.kind is Kind.MODULE
            and recv.cls in self.ff.project.module_classes
        ):
            # a method of a project module class (`model.read(images=x)`): its definition
            # in another file is seeded from it (project_facts.collect, method_facts.py)
            name, module = f"{recv.cls}.{func.attr}", recv
        else:
            return
        kept = tuple((k, v) for k, v in keywords if k is not None)
        self.calls.append(CallSite(name, node, tuple(args), kept, opaque, module))

    def _forget_mutated(self, node: ast.Call, recv: Value | None) -> None:
        """A dropped call of unknown effect may move or change its arguments in place."""
        env = self.env
        assert env is not None
        for arg in [*node.args, *(kw.value for kw in node.keywords)]:
            if isinstance(arg, ast.Starred):
                arg = arg.value
            key = dotted(arg)
            if key is None:
                continue
            held = env.get(key)
            if held is None:
                continue
            if held.kind is Kind.MODULE:
                if held.place is not Place.DEVICE:  # helpers rarely move a module back
                    self._set(key, dataclasses.replace(held, place=Place.UNKNOWN, fresh=False))
            elif held.kind in (Kind.BATCH, Kind.CONTAINER):
                self._set(key, UNKNOWN)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and self.self_name
            and func.value.id == self.self_name
            and self.cls is not None
        ):
            method = self.ff.methods(self.cls).get(func.attr)
            if method is not None and self._self_followed is not node:
                assigned = self.ff.self_attrs_assigned(method)
                prefix = self.self_name + "."
                for attr in assigned:
                    self._touch(prefix + attr)  # the method may set it
                for key in [k for k in env if k.startswith(prefix)]:
                    attr = key[len(prefix) :].split(".", 1)[0]
                    if attr in assigned or "*" in assigned:
                        del env[key]

    def _call(
        self,
        node: ast.Call,
        qual: str,
        recv: Value | None,
        callee: Value,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        statement: bool,
    ) -> Value:
        func = node.func
        encoded = self._encoded(node) if node.keywords else None
        if encoded is not None and self._same_file_callee(func, recv) is None:
            return encoded
        if recv is not None and isinstance(func, ast.Attribute):
            method = func.attr
            if method == "generate" and recv.kind is Kind.MODULE:
                # `model.generate(input_ids)` runs the model on its tensors; the ids it
                # returns are not followed
                self._module_call(node, recv, args, keywords, func.value)
                return UNKNOWN
            if recv.kind is not Kind.UNKNOWN or recv.place is not Place.UNKNOWN:
                result = self._method(node, func, method, recv, args, statement)
                if result is not None:
                    return result
            elif method in ("to", "cuda", "cpu"):
                result = self._move(node, func.value, recv, statement)
                if result is not None:
                    return result
        if callee.kind is Kind.TENSOR_TYPE:
            # `Tensor(...)` of a legacy type held in a name: where the type puts it
            maybe = callee.place is Place.UNKNOWN
            return Value(
                Kind.TENSOR,
                Place.DEVICE if maybe else callee.place,
                name=self._text(func),
                line=node.lineno,
                device=self._text(func) if maybe else callee.device,
                maybe=maybe,
                source=node,
            )
        if qual:
            result = self._known_function(node, qual, args, keywords)
            if result is not None:
                return result
        if callee.kind is Kind.CLASS:
            # an instance of another file's class (no dataset, module, ... the library
            # knows by name): its methods are read there
            built = Value(Kind.OBJECT, cls=callee.cls, where=callee.where, line=node.lineno)
            return self._constructed(node, built, args, keywords)
        if callee.kind is Kind.MODULE or (
            callee.kind is Kind.UNKNOWN and callee.place is Place.DEVICE
        ):
            return self._module_call(node, callee, args, keywords)
        if callee is UNKNOWN and self.shown_module(dotted(func)):
            # a module of unknown place (a parameter `model` with `model.eval()`): what it
            # gives is where the inputs it ran on are; where it is, is not known, so its
            # inputs meet nothing here
            return self._module_call(node, callee, args, keywords, meet=False)
        if isinstance(func, ast.Name) and (self.env is None or func.id not in self.env):
            cls = self.ff.classes.get(func.id)
            if cls is not None and not self.ff.is_module_class(cls):
                built = Value(Kind.OBJECT, cls=func.id, line=node.lineno, source=node)
                return self._constructed(node, built, args, keywords)
        if recv is not None and recv.kind is Kind.OBJECT and recv.where:
            foreign = self.ff.foreign_method(recv.where, recv.cls, func.attr)  # type: ignore[attr-defined]
            if foreign is None:
                return UNKNOWN
            owner, defined = foreign
            returned = self._follow_call(
                node, defined, args, keywords, recv, on_object=True, owner=owner
            )
            if returned is None or one_of(returned, [*args, *(v for _, v in keywords)]):
                return returned or UNKNOWN
            # made there (`self.net(obs.to(self.device))`): that file's lines and nodes
            return carried(returned, os.path.basename(owner.ctx.path), node)
        base = base_name(func)
        if (
            qual
            and base is not None
            and base in self.ctx.imports
            and (self.env is None or base not in self.env)
            and base not in self.ff.toplevel_functions
        ):
            found = self._foreign_call(node, qual, args, keywords, statement)
            if found is not None:
                return found
        if func.__class__ is ast.Attribute and func.value.__class__ is ast.Call:  # type: ignore[attr-defined]
            inherited = self._super_call(node, args, keywords)  # `super().__init__(v)`
            if inherited is not None:
                return inherited
        on_self = self._self_call(node, args, keywords)
        if on_self is not None and on_self[0]:
            return on_self[1]  # `self.state_function(x)`: one of the bound methods it holds
        aliased = self._aliased_methods(func) if on_self is None else ()
        if aliased:
            return self._follow_each(node, aliased, args, keywords, recv)
        target = self._same_file_callee(func, recv)
        if target is not None:
            on_object = recv is not None and recv.kind is Kind.OBJECT
            returned = self._follow_call(node, target, args, keywords, recv, on_object=on_object)
            if returned is None or returned is UNKNOWN:
                returned = self.ff.returned_tensor(target)
            if returned is UNKNOWN:
                returned = self.ff.made_result(target)  # `return net.to(DEVICE)`
            if isinstance(func, ast.Name) and through_cache(self.ff, func.id, target):
                returned = shared_result(returned)
            if self._no_grad and returned.grad and returned.kind is not Kind.PARAMETER:
                # the callee computes under the caller's no_grad: nothing it makes needs grad
                returned = dataclasses.replace(returned, grad=False)
            return returned
        return UNKNOWN

    def _constructed(
        self,
        node: ast.Call,
        built: Value,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> Value:
        return built  # ScopeObjects: with the CPU tensors its constructor stores

    def _super_call(
        self, node: ast.Call, args: list[Value], keywords: list[tuple[str | None, Value]]
    ) -> Value | None:
        return None  # ScopeObjects: a base's method run on this `self`

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
        return None  # ScopeObjects: where a stored CPU tensor meets the device inside

    def _foreign_call(
        self,
        node: ast.Call,
        qual: str,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
        statement: bool,
    ) -> Value | None:
        """A call of another project file's function: followed there with what this
        passes; it hands back one of those values (`tqdm(it)` or `it`), or what it makes
        (`model.to(get_device())`), named with that file's lines (made_results.py).
        None: no such function."""
        passed = [*args, *(v for _, v in keywords)]
        informed = any(informative(v) for v in passed)
        if not informed and statement:
            return None  # what it makes is dropped here: nothing to look up
        foreign_fn = self.ff.foreign_function(qual, makers=not informed)
        if foreign_fn is None:
            return None
        owner, defined = foreign_fn
        returned = self._follow_call(node, defined, args, keywords, owner=owner)
        if returned is not None and one_of(returned, passed):
            return returned
        if returned is None or not informative(returned):
            returned = owner.made_result(defined)
        if through_cache(owner, qual.rpartition(".")[2], defined):
            returned = shared_result(returned)
        if not informative(returned):
            return UNKNOWN
        if self._no_grad and returned.grad and returned.kind is not Kind.PARAMETER:
            returned = dataclasses.replace(returned, grad=False)
        return carried(returned, os.path.basename(owner.ctx.path), node)

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
        """Follow a call of this file's function with what it passes (when a tensor or
        module with a known place is passed): its result, and a mismatch at the call
        when a CPU tensor and a device tensor passed to it meet inside. A method of a
        module this scope proved on the device (`policy.to(device)`, then
        `policy.act(obs, h, masks)`) runs with that `self`: its submodules are there.
        A method of an object built here (`on_object`: `agent.act(obs)`) runs with what
        `__init__` left on it, whatever it is passed; `owner`: the facts of the file
        `target` is in, when that is another (a class of another project file)."""
        if any(isinstance(a, ast.Starred) for a in node.args):
            return None
        params = [*target.args.posonlyargs, *target.args.args]
        me: ast.arg | None = None
        facts_of = owner or self.ff
        if params and facts_of.class_of(target) is not None and not _is_static(target):
            if isinstance(node.func, ast.Name):
                return None  # a method called by its bare name: not this function
            me, params = params[0], params[1:]
        by_name = {a.arg: a for a in [*params, *target.args.kwonlyargs]}
        passed: list[tuple[str, ast.expr, Value]] = []
        for param, arg_node, value in zip(params, node.args, args, strict=False):
            passed.append((param.arg, arg_node, value))
        for kw, (name, value) in zip(node.keywords, keywords, strict=True):
            if name is not None and name in by_name:
                passed.append((name, kw.value, value))
        if not any(informative(v) for _, _, v in passed) and not (on_object and me):
            return None
        arguments = {p: v for p, _, v in passed if v is not UNKNOWN}
        if me is not None and recv is not None and proven_module(recv):
            arguments[me.arg] = recv
        # an object whose construction here stored CPU tensors on it: its method runs
        # with them (scope_objects.py)
        kept = dict(recv.state) if on_object and me is not None and recv and recv.state else None
        facts = facts_of.call_facts(target, arguments, self.depth, kept)
        if facts is None:
            return None
        if self._meeting:
            where = os.path.basename(owner.ctx.path) + " " if owner is not None else ""
            self._meetings_inside(node, target, passed, facts.mismatches, where)
            if kept and me is not None:
                self._state_meetings(node, target, me.arg, passed, kept, facts, where)
        if on_object and me is not None and isinstance(node.func, ast.Attribute):
            # `self.device` inside the method is `agent.device` here
            return renamed(facts.returned, me.arg, self._text(node.func.value))
        return facts.returned

    def _meetings_inside(
        self,
        node: ast.Call,
        target: AnyFunction,
        passed: list[tuple[str, ast.expr, Value]],
        inside: tuple[Mismatch, ...],
        where: str = "",
    ) -> None:
        cpu = [
            (p, n, v)
            for p, n, v in passed
            if v.place is Place.CPU and not v.scalar and v.kind in _TENSOR_KINDS
        ]
        device = [
            (p, n, v)
            for p, n, v in passed
            if v.place is Place.DEVICE and v.kind in _TENSOR_KINDS and not v.maybe
        ]
        if not cpu or not device:
            return
        for m in inside:
            for name, arg_node, value in cpu:
                if m.cpu == value or (m.cpu.source is not None and m.cpu.source is value.source):
                    line = getattr(m.site, "lineno", 0)
                    # the argument it meets inside, when that is one passed here
                    met = next((d for d in device if d[2] == m.other), device[0])
                    self._mismatches[(id(node), id(arg_node))] = Mismatch(
                        node,
                        arg_node,
                        value,
                        met[1],
                        met[2],
                        "call",
                        path=f"`{target.name}` combines its `{name}` with a tensor on the "
                        f"device ({where}line {line})",
                        callee=target,
                        inner=m,
                    )
                    break

    def _same_file_callee(self, func: ast.expr, recv: Value | None) -> AnyFunction | None:
        """The function of this file a call runs: `helper(...)`, `self.m(...)`,
        `model.init_hidden(...)` on a module of a class defined here."""
        ff = self.ff
        if isinstance(func, ast.Name):
            if self.env is not None and func.id in self.env:
                return None  # a local variable, not the function
            return ff.toplevel_functions.get(func.id)
        if not isinstance(func, ast.Attribute):
            return None
        cls: ast.ClassDef | None = None
        if isinstance(func.value, ast.Name) and self.self_name and func.value.id == self.self_name:
            cls = self.cls
        elif (
            isinstance(func.value, ast.Name)
            and func.value.id in ff.classes
            and (self.env is None or func.value.id not in self.env)
        ):
            # `Localizer._score(a, b)`: a staticmethod called through its class's name
            method = ff.methods(ff.classes[func.value.id]).get(func.attr)
            return method if method is not None and is_staticmethod(method) else None
        elif recv is not None and recv.kind is Kind.OBJECT and recv.cls:
            # an object's method may be its base's (`class Edge(Labelled)`)
            cls = ff.classes.get(recv.cls)
            return ff.inherited_methods(cls).get(func.attr) if cls is not None else None  # type: ignore[attr-defined]
        elif recv is not None and recv.kind is Kind.MODULE and recv.cls:
            cls = ff.classes.get(recv.cls)
        return ff.methods(cls).get(func.attr) if cls is not None else None
