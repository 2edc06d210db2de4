"""The seeds of a scope's parameters: what its file's call sites (and the project's calls
from other files) pass, what `__init__` leaves on `self`, what annotations say. A layer
of FileFlow, below its scope cache (which it asks for the callers' scopes)."""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.default_path import on_cpu
from torchdoctor.check.analysis.file_index import FileIndex
from torchdoctor.check.analysis.method_facts import method_seeds, on_receiver
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.syntax import (
    _ASSIGNED_ATTR,
    _is_static,
    _looks_like_tensor_arg,
    is_staticmethod,
)
from torchdoctor.check.analysis.values import (
    UNKNOWN,
    AnyFunction,
    CallSite,
    Env,
    Kind,
    Place,
    ScopeNode,
    Value,
    _as_parameter,
    _join_seeds,
)
from torchdoctor.check.analysis.wrapped import aliases, call_lines


class FlowSeeds(FileIndex):
    """Seeds of parameters from call sites; FileFlow supplies the scopes."""

    _cut_off: int  # seedings the depth limit cut short (FileFlow.scope keeps those apart)
    _later_assigned: dict[ast.ClassDef, frozenset[str]]  # _assigned_after_init
    _scopes: dict[tuple[ast.AST, bool], ScopeFlow]  # FileFlow's cache
    STOP_EARLY = True  # (False: every caller analysed; the tests compare both)

    def scope(self, node: ScopeNode, *, callers: bool = True, depth: int = 0) -> ScopeFlow:
        raise NotImplementedError  # FileFlow.scope

    def buffers(self, cls: ast.ClassDef) -> frozenset[str]:
        raise NotImplementedError  # FileFlow.buffers

    def fresh_scope(self, node: AnyFunction, seeds: Env) -> ScopeFlow:
        raise NotImplementedError  # FileFlow.fresh_scope

    def _seeds(
        self,
        func: ScopeNode,
        depth: int,
        callers: bool,
        *,
        call_sites: bool = True,
        attributes: bool = True,
    ) -> Env:
        """Initial values of a function's parameters and of `self.x` attributes."""
        if isinstance(func, ast.Module):
            return {}
        seeds: Env = {}
        args = func.args
        params = [*args.posonlyargs, *args.args]
        cls = self.class_of(func)
        is_method = cls is not None and bool(params) and not _is_static(func)
        self_name = params[0].arg if is_method else None
        for arg in [*params, *args.kwonlyargs]:
            value = self._annotation_value(arg)
            if value is not UNKNOWN:
                seeds[arg.arg] = value
        defaults = args.defaults
        for arg, default in zip(params[len(params) - len(defaults) :], defaults, strict=False):
            if isinstance(default, ast.List | ast.Tuple) and arg.arg not in seeds:
                seeds[arg.arg] = Value(Kind.CONTAINER)
        # seeds from call sites in this file (and other files, through the project index);
        # calls between methods of one class are cheap to find and always followed
        call_seeds: Env = {}
        if call_sites and (callers or (cls is not None and func.name != "__init__")):
            call_seeds = self._call_site_seeds(func, params, cls, depth)
        seeds.update(call_seeds)
        if cls is not None and self_name is not None:
            module_class = self.is_module_class(cls)
            if func.name != "__init__" and attributes:
                seeds.update(self._self_attribute_seeds(cls, func, self_name, module_class))
                if module_class and call_sites and cls.name in self.project.method_classes:
                    seeds = self._receiver_seeds(cls, func, self_name, seeds)
            if module_class and func.name == "forward":
                for arg in params[1:]:
                    if arg.arg not in call_seeds and _looks_like_tensor_arg(func, arg):
                        seeds[arg.arg] = Value(
                            Kind.TENSOR,
                            Place.DEVICE,
                            name=arg.arg,
                            device=f"{arg.arg}.device",
                            assumed=True,
                            is_input=True,
                        )
        return seeds

    def _receiver_seeds(
        self, cls: ast.ClassDef, func: AnyFunction, self_name: str, seeds: Env
    ) -> Env:
        """`seeds` with the registered attributes where the module is that other files
        call `func` on, when the class never calls it itself (method_facts.py)."""
        if self._method_uses(cls).get(func.name, (0, 0, []))[0]:
            return seeds  # `self.read(...)` too: on an object the facts do not place
        return on_receiver(
            seeds, self_name, method_seeds(self.project, self.ctx.path, cls.name, func)[1]
        )

    def _annotation_value(self, arg: ast.arg) -> Value:
        if arg.annotation is None:
            return UNKNOWN
        text = self.ctx.qualname(arg.annotation) or ""
        last = text.rsplit(".", 1)[-1]
        if last == "Tensor":
            return Value(Kind.TENSOR)
        if text in ("torch.device",):
            return Value(Kind.DEVICE, Place.DEVICE, name=arg.arg)
        if last == "Module" and text.startswith("torch.nn"):
            return Value(Kind.MODULE)
        return UNKNOWN

    def _self_attribute_seeds(
        self, cls: ast.ClassDef, func: AnyFunction, self_name: str, module_class: bool
    ) -> Env:
        """`self.x` as `__init__` leaves it, when no other method assigns `self.x`
        (the helpers only `__init__` runs are part of it: `self._build_masks()`)."""
        init = self.methods(cls).get("__init__")
        helpers = self.init_helpers(cls)
        if init is None or init is func or func.name in helpers:
            return {}
        init_scope = self.scope(init)
        others = self._assigned_after_init(cls, helpers)
        seeds: Env = {}
        for key, value in init_scope.exit_env.items():
            if not key.startswith(init_scope.self_name + "."):
                continue
            attr = key[len(init_scope.self_name) + 1 :]
            if "." in attr:
                continue
            if attr in others and not self._first_call_holds(cls, func, attr, value):
                continue
            if module_class and value.kind in (Kind.MODULE, Kind.PARAMETER):
                # registered: moves with the module, wherever it goes
                grad = value.kind is Kind.PARAMETER and value.grad
                value = _registered(attr, value.kind, grad=grad, cls=value.cls)
            seeds[f"{self_name}.{attr}"] = value
        if module_class:
            # registered buffers move with the module too (whatever `__init__` put there)
            for attr in self.buffers(cls) - others:
                seeds[f"{self_name}.{attr}"] = _registered(attr, Kind.TENSOR)
        return seeds

    def _assigned_after_init(self, cls: ast.ClassDef, helpers: frozenset[str]) -> frozenset[str]:
        """The attributes a method construction does not run assigns (once per class)."""
        found = self._later_assigned.get(cls)
        if found is None:
            others: set[str] = set()
            for name, method in self.methods(cls).items():
                if name != "__init__" and name not in helpers:
                    others |= self.self_attrs_assigned(method)
            found = self._later_assigned[cls] = frozenset(others)
        return found

    def _first_call_holds(
        self, cls: ast.ClassDef, func: AnyFunction, attr: str, value: Value
    ) -> bool:
        """Whether `self.attr` still holds `value` (a CPU tensor `__init__` made) when
        `func` first runs, although methods assign it: every other method that does
        leaves a CPU tensor there when it finds one (`self.mem = torch.zeros_like(self.mem)`,
        `self.mem = (1 - r) * self.mem`), so whatever runs before `func`'s first call keeps
        it on the CPU. `func`'s own writes are its own flow's; a meeting on its first
        call is a crash all the same."""
        if not on_cpu(value) or value.default_of:
            return False
        key = (cls, attr)
        found = self._first_call.get(key)
        if found is None:
            if key in self._first_call_busy:
                return False  # asked while checking the writers of the same attribute
            self._first_call_busy.add(key)
            try:
                found = self._writers_keep(cls, attr, value)
            finally:
                self._first_call_busy.discard(key)
            self._first_call[key] = found
        if found is True:
            return True
        return found is not False and found == (func,)

    def _writers_keep(
        self, cls: ast.ClassDef, attr: str, value: Value
    ) -> bool | tuple[AnyFunction, ...]:
        """True: every method but construction keeps `self.attr` a CPU tensor; False: two
        or more do not (or one cannot be read); else the one method that does not (its
        own first call still sees `value`)."""
        helpers = self.init_helpers(cls)
        breaking: list[AnyFunction] = []
        for name, method in self.methods(cls).items():
            if name == "__init__" or name in helpers:
                continue
            assigned = self.self_attrs_assigned(method)
            if "*" in assigned:
                return False
            if attr not in assigned:
                continue
            if not self._keeps_cpu(method, attr, value):
                breaking.append(method)
                if len(breaking) > 1:
                    return False
        return tuple(breaking) if breaking else True

    def _keeps_cpu(self, method: AnyFunction, attr: str, value: Value) -> bool:
        """Whether `method`, run with `self.attr` holding the CPU tensor `value`, leaves a
        CPU tensor there on every path that returns."""
        params = [*method.args.posonlyargs, *method.args.args]
        if not params or _is_static(method) or method.decorator_list:
            return False  # a classmethod, property setter, ...: not read as one
        text = self.text(method)
        if "lambda" in text or text.count("def ") > 1:
            return False  # a nested function may assign it: not run here
        me = params[0].arg
        seeds = self._seeds(method, 1, callers=False, call_sites=False)
        seeds[f"{me}.{attr}"] = value
        left = self.fresh_scope(method, seeds).exit_env.get(f"{me}.{attr}")
        return left is not None and on_cpu(left)

    def self_attrs_assigned(self, func: AnyFunction) -> frozenset[str]:
        """Names `x` with `self.x = ...` (augmented, in a tuple, ...) anywhere in `func`.

        Read from the text (an over-approximation is safe: it only removes facts).
        """
        found = self._self_attrs_assigned.get(func)
        if found is None:
            params = [*func.args.posonlyargs, *func.args.args]
            me = params[0].arg if params else "self"
            text = self.text(func)
            names: set[str] = set()
            if f"{me}." in text:
                pattern = _ASSIGNED_ATTR.get(me)
                if pattern is None:
                    pattern = re.compile(
                        rf"\b{re.escape(me)}\.(\w+)\s*(?:\[[^\]\n]*\]\s*)?"
                        r"(?:,[^\r\n=()\[\]]*=(?!=)|=(?!=)|[-+*/%@&|^]=|//=|\*\*=|>>=|<<=)"
                    )
                    _ASSIGNED_ATTR[me] = pattern
                names.update(pattern.findall(text))
                if "setattr(" in text:
                    names.add("*")
            found = frozenset(names)
            self._self_attrs_assigned[func] = found
        return found

    def _call_site_seeds(
        self,
        func: AnyFunction,
        params: list[ast.arg],
        cls: ast.ClassDef | None,
        depth: int,
    ) -> Env:
        """Join, over every call of `func`, the value passed to each parameter."""
        if depth > self.MAX_SEED_DEPTH:
            return {}  # callers of callers of callers: too far to follow
        sites: list[tuple[CallSite, int]] = []  # (call, offset of the first parameter)
        scopes: list[ScopeNode] | None
        called: list[str] = []  # names bound to the function wrapped (`fast = cache(func)`)
        if cls is None:
            if self.toplevel_functions.get(func.name) is not func:
                return {}
            callee, offset = func.name, 0
            called = aliases(self.ctx, func.name)
            scopes = self._wrapped_callers(func.name, called) if called else None
            if not called:
                scopes = self._caller_scopes(func.name)
        elif func.name == "__init__" and self.classes.get(cls.name) is cls:
            callee, offset, scopes = cls.name, 1, self._caller_scopes(cls.name)
        elif params and not _is_static(func) and func.name != "__init__":
            callee, offset = f"self.{func.name}", 1
            uses, calls, callers = self._method_uses(cls).get(func.name, (0, 0, []))
            if uses != calls:
                return {}  # `self.m` passed around as a value: not all calls are seen
            scopes = [m for m in callers if m is not func]
            if len(params) <= offset and not func.args.kwonlyargs:
                return {}  # a call binds nothing but `self`: its callers are not analysed
            instance_sites = self._instance_sites(func, cls, depth)
            if instance_sites is None:
                return {}  # `obj.m` on an object not known to be one of this class
            sites.extend((site, 1) for site in instance_sites)
        elif is_staticmethod(func) and f"{cls.name}.{func.name}" not in self.ctx.source:
            # `self._mask(n, m)` of a staticmethod: every argument is a parameter (calls
            # through the class name may come from elsewhere: then its callers are unseen)
            callee, offset = f"self.{func.name}", 0
            uses, calls, callers = self._method_uses(cls).get(func.name, (0, 0, []))
            if uses != calls:
                return {}
            scopes = [m for m in callers if m is not func]
        else:
            return {}
        if scopes is None or (len(params) <= offset and not func.args.kwonlyargs):
            return {}  # (no parameter a call binds: every site would give nothing)
        # submodules handed to a module's constructor are facts without any device word
        module_init = cls is not None and func.name == "__init__" and self.is_module_class(cls)
        for scope_node in scopes:
            forward = isinstance(scope_node, ast.FunctionDef) and self.is_forward(scope_node)
            # a function may pass on what its own callers gave it (`train(model, ...)`
            # hands the moved model to `accuracy(model(x), y)`), within the depth
            passes_on = not isinstance(scope_node, ast.Module) and bool(
                scope_node.args.args or scope_node.args.posonlyargs
            )
            relay = passes_on and depth + 1 < self.MAX_SEED_DEPTH
            informative = forward or module_init or relay
            if not (informative or self.mentions(scope_node, *self.FACT_WORDS)):
                if passes_on and not relay:
                    # the depth limit, not the caller, made it uninformative: a rule's
                    # own question (depth 0) must seed it again (file_flow.scope)
                    self._cut_off += 1
                return {}  # an uninformative caller: the join would be unknown anyway
        # a parameter some call passes nothing known is not seeded: once every one is,
        # the callers not analysed yet cannot change the answer
        names = [p.arg for p in params]
        keys = {*names[offset:], *(a.arg for a in func.args.kwonlyargs)}
        bound = [self._bind_site(site, names, off, func) for site, off in sites]
        unknown = {k for values in bound for k, v in values.items() if v is UNKNOWN}
        callees = {callee, *called}
        if self.STOP_EARLY:  # callers analysed already cost nothing: they may settle it
            for scope_node in scopes:
                known = self._scopes.get((scope_node, True))
                for values in self._bound_at(known, callees, names, offset, func):
                    unknown.update(k for k, v in values.items() if v is UNKNOWN)
        for scope_node in scopes:
            if unknown >= keys and self.STOP_EARLY:
                return {}
            caller = self.scope(scope_node, depth=depth + 1)
            for values in self._bound_at(caller, callees, names, offset, func):
                bound.append(values)
                unknown.update(k for k, v in values.items() if v is UNKNOWN)
        if unknown >= keys:
            return {}
        if cls is None or func.name == "__init__":
            remote = self.project_call_facts(callee)
            for name in called if cls is None else ():
                remote += self.project_call_facts(name)
        else:  # `model.read(x)` in another file, of a module class's method
            remote = method_seeds(self.project, self.ctx.path, cls.name, func)[0]
        if not bound and not remote:
            return {}
        seeds: dict[str, Value] = {}
        first = True
        for values in [*bound, *remote]:
            unknown.update(k for k in keys if values.get(k, UNKNOWN) is UNKNOWN)
            seeds = values if first else _join_seeds(seeds, values)
            first = False
        return {k: v for k, v in seeds.items() if v is not UNKNOWN and k not in unknown}

    # A caller that makes tensors can pass CPU ones (an object's method is called from
    # code that need not name a device at all)
    _INSTANCE_CALLER_WORDS = (*FileIndex.FACT_WORDS, "Tensor(", "tensor(")

    def _instance_sites(
        self, func: AnyFunction, cls: ast.ClassDef, depth: int
    ) -> list[CallSite] | None:
        """The calls `obj.m(...)` of method `func` on instances of the file's plain class
        `cls` (`self.ranker = Ranker(...)` ... `self.ranker.rank(x)`); None when some
        `.m` of the file outside the class is not one (another receiver, `obj.m` passed
        as a value): then not every call of it is seen. Methods of modules are left to
        `self.m` calls (they are called on parameters of every kind)."""
        if self.is_module_class(cls) or self.classes.get(cls.name) is not cls:
            return []
        if f".{func.name}" not in self.ctx.source:
            return []
        use = re.compile(rf"\.{re.escape(func.name)}\b")
        line_of = self.ctx.line_of_offset
        lines = [
            line
            for line in (line_of(m.start()) for m in use.finditer(self.ctx.source))
            if not self._inside(cls, line)
        ]
        outside = len(lines)
        if not outside:
            return []  # used inside the class only
        scopes = self.scopes_at(lines)
        if any(not self.mentions(s, *self._INSTANCE_CALLER_WORDS) for s in scopes):
            return []  # an uninformative caller: the join would be unknown anyway
        found: dict[ast.Call, CallSite] = {}
        callee = f"{cls.name}.{func.name}"
        for scope_node in scopes:
            caller = self.scope(scope_node, depth=depth + 1)
            for site in caller.calls:
                if site.callee == callee:
                    found.setdefault(site.call, site)
        return list(found.values()) if len(found) == outside else None

    @staticmethod
    def _inside(node: ast.ClassDef, line: int) -> bool:
        return node.lineno <= line <= (node.end_lineno or node.lineno)

    def project_call_facts(self, callee: str) -> list[Env]:
        """Parameter values of `callee` at call sites in other files (project index)."""
        getter = getattr(self.project, "call_facts_for", None)
        if getter is None:
            return []
        func = self.toplevel_functions.get(callee)
        if func is None:
            cls = self.classes.get(callee)
            init = self.methods(cls).get("__init__") if cls is not None else None
            if init is None:
                return []
            names = [p.arg for p in [*init.args.posonlyargs, *init.args.args]][1:]
            kwonly = [p.arg for p in init.args.kwonlyargs]
        else:
            names = [p.arg for p in [*func.args.posonlyargs, *func.args.args]]
            kwonly = [p.arg for p in func.args.kwonlyargs]
        out: list[Env] = []
        for fact in getter(callee, self.ctx.path):
            env: Env = {}
            if fact.opaque:
                out.append(env)  # positions unknown: nothing can be said
                continue
            for i, value in enumerate(fact.args):
                if i < len(names):
                    env[names[i]] = _as_parameter(names[i], value)
            for key, value in fact.keywords:
                if key in names or key in kwonly:
                    env[key] = _as_parameter(key, value)
            out.append(env)
        return out

    def called_in_file(self, func: AnyFunction) -> bool:
        """Whether this file calls the top-level function `func` (so may seed it)."""
        if self.toplevel_functions.get(func.name) is not func:
            return False
        called = aliases(self.ctx, func.name)
        if called:
            return bool(self._wrapped_callers(func.name, called))
        return bool(self._caller_scopes(func.name))

    def _wrapped_callers(self, name: str, called: list[str]) -> list[ScopeNode] | None:
        """The scopes calling the function `name` by that name or one `called` binds to it
        (`wrapped.py`); None if one of them escapes."""
        lines = call_lines(self.ctx, name)
        if lines is None:
            return None
        found = dict.fromkeys(self.innermost_scope(line) for line in lines)
        for alias in called:
            scopes = self._caller_scopes(alias)
            if scopes is None:
                return None
            found.update(dict.fromkeys(scopes))
        return list(found)

    def _caller_scopes(self, name: str) -> list[ScopeNode] | None:
        """The scopes that call `name`; None if `name` escapes (passed as a value)."""
        uses = self._occurrences(name)
        if uses is None:
            return None
        found: dict[ScopeNode, None] = {}
        for line, is_call in uses:
            if is_call:
                found[self.innermost_scope(line)] = None
        return list(found)

    def _bound_at(
        self,
        caller: ScopeFlow | None,
        callees: set[str],
        names: list[str],
        offset: int,
        func: AnyFunction,
    ) -> list[dict[str, Value]]:
        """What each call of one of `callees` in `caller` passes `func`'s parameters."""
        sites = caller.calls if caller is not None else ()
        return [
            self._bind_site(site, names, offset, func) for site in sites if site.callee in callees
        ]

    def _bind_site(
        self, site: CallSite, names: list[str], offset: int, func: AnyFunction
    ) -> dict[str, Value]:
        """Parameter name -> argument value at one call (UNKNOWN where not passed)."""
        values: dict[str, Value] = {n: UNKNOWN for n in names[offset:]}
        values.update({a.arg: UNKNOWN for a in func.args.kwonlyargs})
        if site.opaque:
            return {n: UNKNOWN for n in values}
        for i, value in enumerate(site.args):
            if offset + i < len(names):
                values[names[offset + i]] = value
        for key, value in site.keywords:
            if key in values:
                values[key] = value
        # parameters not passed take their defaults: unknown
        return {k: _as_parameter(k, v) for k, v in values.items()}


def _registered(attr: str, kind: Kind, *, grad: bool = False, cls: str = "") -> Value:
    """`self.attr` registered with the module (a submodule, parameter or buffer): on the
    module's device, wherever it goes."""
    return Value(
        kind,
        Place.DEVICE,
        name=f"self.{attr}",
        device=f"self.{attr}",
        assumed=True,
        is_input=True,
        grad=grad,
        cls=cls,
    )
