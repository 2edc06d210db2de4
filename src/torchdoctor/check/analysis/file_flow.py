"""One file's dataflow: the cache of scope facts (their seeds: flow_seeds.py) and the
calls it follows into other files."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.file_loops import project_file
from torchdoctor.check.analysis.flow_seeds import FlowSeeds
from torchdoctor.check.analysis.interfaces import ForeignMethod
from torchdoctor.check.analysis.made_results import MAKERS, TextDefs, made_here, makes
from torchdoctor.check.analysis.module_paths import sibling_path
from torchdoctor.check.analysis.object_state import method_aliases, registered_buffers
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.syntax import (
    _is_static,
    returns_factory,
)
from torchdoctor.check.analysis.values import (
    UNKNOWN,
    AnyFunction,
    CallFacts,
    Env,
    Kind,
    Place,
    ScopeNode,
    Value,
    built_loaders,
    moved_whatever_given,
    on_proven_self,
    proven_module,
)
from torchdoctor.check.context import (
    FileContext,
)

if TYPE_CHECKING:
    pass


# `self.step = self._step_sub` (a comment may follow; any line end)
_ALIAS_LINE = re.compile(r"\.(\w+)[ \t]*=[ \t]*[A-Za-z_]\w*\.\w+[ \t]*(?:#[^\r\n]*)?(?=[\r\n]|\Z)")


def file_flow(ctx: FileContext) -> FileFlow:
    """The FileFlow of `ctx`, shared by every rule checking that file."""
    return ctx.shared("flow", FileFlow)


class FileFlow(FlowSeeds):
    """The scopes of one file, analysed on request, and their seeds."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._scopes: dict[tuple[ast.AST, bool], ScopeFlow] = {}
        self._deep_scopes: dict[tuple[ast.AST, bool], tuple[int, ScopeFlow]] = {}
        self._cut_off = 0  # scopes the depth limit left unseeded (counted)
        self._call_facts: dict[object, CallFacts | None] = {}
        self._call_budget = self.CALL_BUDGET
        self._calls_in_progress: set[ast.AST] = set()
        self._foreign_functions: dict[tuple[str, bool], tuple[FileFlow, AnyFunction] | None] = {}
        self._made: dict[AnyFunction, Value] = {}
        self._unseeded: dict[AnyFunction, Value | None] = {}
        self._analysed: dict[ScopeNode, list[ScopeFlow]] = {}  # (_analysis)
        self._buffers: dict[ast.ClassDef, frozenset[str]] = {}
        self._aliases: dict[ast.ClassDef, dict[str, tuple[AnyFunction, ...]]] = {}
        self._alias_names: dict[ast.ClassDef, frozenset[str]] = {}
        self._later_assigned: dict[ast.ClassDef, frozenset[str]] = {}

    def release(self) -> None:
        """Drop the cached facts (they reference the syntax tree)."""
        self._scopes.clear()
        self._deep_scopes.clear()
        self._call_facts.clear()
        self._foreign_functions.clear()
        self._made.clear()
        self._unseeded.clear()
        self._analysed.clear()
        self._buffers.clear()
        self._aliases.clear()
        self._alias_names.clear()
        self._later_assigned.clear()
        super().release()

    # -- scopes ------------------------------------------------------------------------
    def module_scope(self) -> ScopeFlow:
        return self.scope(self.ctx.tree)

    def scope(self, node: ScopeNode, *, callers: bool = True, depth: int = 0) -> ScopeFlow:
        """The facts of one function (or of the module-level code), analysed once.

        With `callers=False` the parameters are not seeded from the function's call
        sites (cheaper; enough for rules that look at one function's own code).
        """
        key = (node, callers)
        found = self._scopes.get(key)
        if found is not None:
            return found
        deep = self._deep_scopes.get(key) if depth else None
        if deep is not None and deep[0] <= depth:
            self._cut_off += 1  # (what it was seeded from was cut off)
            return deep[1]
        if node in self._in_progress or depth > self.MAX_SEED_DEPTH:
            # a call cycle, or too deep: analyse without call-site seeds, do not cache
            self._cut_off += depth > self.MAX_SEED_DEPTH
            return ScopeFlow(self, node, seeds=self._seeds(node, depth, callers=False))
        cut_off = self._cut_off
        self._in_progress.add(node)
        try:
            found = self._analysis(node, self._seeds(node, depth, callers))
        finally:
            self._in_progress.discard(node)
        if not depth or self._cut_off == cut_off:
            self._scopes[key] = found
        elif key not in self._deep_scopes or depth < self._deep_scopes[key][0]:
            # asked for a callee's seeds, its callers' callers too deep to seed it: a
            # rule's question (depth 0) analyses it again, so its facts do not depend on
            # which rule asked first
            self._deep_scopes[key] = (depth, found)
        return found

    def fresh_scope(self, node: AnyFunction, seeds: Env) -> ScopeFlow:
        """`node` analysed from `seeds` (not cached: a question about those seeds)."""
        return ScopeFlow(self, node, seeds=seeds)

    MAX_CALL_DEPTH = 2  # calls followed with their arguments, one inside another
    CALL_BUDGET = 200  # such analyses per file: a huge file stays fast

    def call_facts(
        self, func: AnyFunction, arguments: Env, depth: int, attributes: Env | None = None
    ) -> CallFacts | None:
        """What `func` returns, and where devices meet inside it, when its parameters
        hold `arguments` (None: not analysed: too deep, recursive, or over the budget).

        Context-sensitive on purpose: a helper's result and the meetings inside it
        depend on what this call passes (`reduce_mean(out, target)` returns a tensor on
        the device when `out` is there), which the callee's own scope, seeded from the
        join of all its call sites, cannot tell.

        With `attributes` (a method's `self.x` as its caller holds them, keyed `x`), the
        facts also give what the method leaves on `self` (`CallFacts.writes`).
        """
        if depth >= self.MAX_CALL_DEPTH or func in self._calls_in_progress:
            return None
        key: tuple[object, ...] = (func, tuple(sorted(arguments.items(), key=lambda kv: kv[0])))
        if attributes is not None:
            key = (*key, tuple(sorted(attributes.items(), key=lambda kv: kv[0])))
        if key in self._call_facts:
            return self._call_facts[key]
        if self._call_budget <= 0:
            return None
        self._call_budget -= 1
        self._calls_in_progress.add(func)
        try:
            seeds = self._seeds(
                func, depth + 1, callers=False, call_sites=False, attributes=attributes is None
            )
            seeds.update(arguments)
            params = [*func.args.posonlyargs, *func.args.args]
            me = params[0].arg if params else ""
            if me and proven_module(arguments.get(me, UNKNOWN)):
                # the caller proved `self` on the device: so are its registered parts
                seeds.update(on_proven_self(seeds, me, arguments[me]))
            if attributes is not None and me:
                seeds.update({f"{me}.{attr}": v for attr, v in attributes.items()})
            scope = ScopeFlow(self, func, seeds=seeds, depth=depth + 1)
            writes: tuple[tuple[str, Value], ...] = ()
            if attributes is not None and me:
                prefix = f"{me}."
                writes = tuple(
                    (k[len(prefix) :], v) for k, v in scope.exit_env.items() if k.startswith(prefix)
                )
            found = CallFacts(scope.returned or UNKNOWN, tuple(scope.mismatches), writes)
        finally:
            self._calls_in_progress.discard(func)
        self._call_facts[key] = found
        return found

    def foreign_method(self, path: str, cls: str, name: str) -> ForeignMethod | None:
        """Method `name` of class `cls` (or of its bases there) in the project file at
        `path`, with that file's facts: what `agent.get_action(obs)` runs where
        `agent = RNDAgent(...)` of another file (`project_class`)."""
        other = project_file(self.ctx, path)
        if other is None:
            return None
        flow = _asked(file_flow(other.ctx))
        node = flow.classes.get(cls)
        method = flow.inherited_methods(node).get(name) if node is not None else None
        if method is None or _is_static(method):
            return None
        return flow, method

    def sibling_flow(self, path: str) -> FileFlow | None:
        """The facts of the project file at `path` (another one)."""
        other = project_file(self.ctx, path)
        return None if other is None else _asked(file_flow(other.ctx))

    def foreign_function(self, qual: str, makers: bool = False) -> ForeignMethod | None:
        """The top-level function of another project file that the dotted name `qual`
        (a call's callee, imports resolved) means: `iterate_tqdm` after `from
        utils.print_utils import iterate_tqdm`, `utils.get_device` after `import utils`;
        a package `__init__` that re-exports it is followed once. With that file's
        facts; None: not one (a library's function, a class, a name not found).

        `makers`: only a function whose text may make what `made_result` passes back
        (judged on the file's text before it is parsed: a call that passes nothing
        informative costs a text read at most)."""
        key = (qual, makers)
        if key in self._foreign_functions:
            found = self._foreign_functions[key]
        else:
            found = self._foreign_functions[key] = self._find_function(qual, makers)
        return None if found is None else (_asked(found[0]), found[1])

    def _find_function(self, qual: str, makers: bool) -> tuple[FileFlow, AnyFunction] | None:
        found: tuple[FileFlow, AnyFunction] | None = None
        ctx, target = self.ctx, qual
        for _ in range(2):  # the import, then one re-export in a package `__init__`
            module, _, last = target.rpartition(".")
            if not module.strip(".") or not last[:1].islower():
                break  # `from . import f` (a package's own name), or a class
            if module.lstrip(".").rpartition(".")[2] not in _module_stems(ctx):
                break  # no project file or package has that name: a library
            path = sibling_path(ctx, module, by_tail=True)
            if path is None or (makers and not makes(self.ctx.project.disk, path, last)):
                break
            other = project_file(ctx, path)
            if other is None:
                break
            flow = file_flow(other.ctx)
            func = flow.toplevel_functions.get(last)
            if func is not None:
                found = (flow, func)
                break
            ctx, reexport = other.ctx, other.ctx.imports.get(last)
            if reexport is None:
                break
            target = reexport
        return found

    def made_result(self, func: AnyFunction) -> Value:
        """What `func` makes and returns however it is called, for a caller in another
        file (`made_results.made_here`): loaders it builds, a tensor or a module (or a
        tuple, list or dict of modules) it puts on a device its parameters do not
        choose (`return model.to(get_device())`); UNKNOWN otherwise."""
        found = self._made.get(func)
        if found is None:
            found = self._made[func] = UNKNOWN  # a recursive function sees nothing
            if self._may_make(func):
                returned = self._unseeded_return(func)
                if returned is not None:
                    found = made_here(returned, func)
            self._made[func] = found
        return found

    def _unseeded_return(self, func: AnyFunction) -> Value | None:
        """What `func` returns analysed with its parameters unknown (once: both
        `returned_tensor` and `made_result` read it)."""
        if func in self._unseeded:
            return self._unseeded[func]
        found = self._unseeded[func] = None  # a recursive call sees nothing
        found = self._unseeded[func] = self._analysis(func, {}).returned
        return found

    def _analysis(self, node: ScopeNode, seeds: Env) -> ScopeFlow:
        """`node` analysed from `seeds`, or an earlier analysis of it from equal seeds
        (the other `callers` setting when no call site added anything, a callee's facts
        its callers' depth cut short, what `_unseeded_return` read): the same facts, not
        run again. A few per scope at most (one per way of asking)."""
        earlier = self._analysed.setdefault(node, [])
        for scope in earlier:
            if scope.seeds == seeds:
                return scope
        found = ScopeFlow(self, node, seeds=seeds)
        earlier.append(found)
        return found

    def _may_make(self, func: AnyFunction) -> bool:
        """The text gate of `made_result`: a top-level function that makes one or returns
        what such a function of the file makes (`return create_model(cfg)`); a method
        whose text holds a maker."""
        if self.toplevel_functions.get(func.name) is func:
            return self.ctx.shared("making", lambda ctx: TextDefs(ctx.source)).makes(func.name)
        return self.mentions(func, *MAKERS) and self.mentions(func, "return")

    def returned_tensor(self, func: AnyFunction) -> Value:
        """What `func` returns, when that is a tensor it made on the CPU, a tensor it puts
        on the device whatever it is given, or data loaders it built (else UNKNOWN).

        `def init_hidden(self, n): return torch.zeros(1, n, 16)`: a call of it gives a
        CPU tensor; `def embed(x): return encoder(x.to(DEVICE)).detach()` a tensor on
        the device. Only factory-made CPU tensors, device tensors whose device is not a
        parameter, and loaders whose batches' place is known are passed on; anything
        that depends on the arguments stays unknown.
        """
        found = self._returns.get(func)
        if found is None:
            found = UNKNOWN
            if self.mentions(func, "DataLoader(") and self.mentions(func, "return"):
                # `train_loader, test_loader = load_data()`: loaders it builds
                self._returns[func] = UNKNOWN  # a recursive function sees nothing
                returned = self._unseeded_return(func)
                if returned is not None and built_loaders(returned):
                    found = returned
            elif self.may_return_factory(func):
                # no seeds: a factory's result does not depend on them, and seeding
                # would analyse the callers, which are asking for this very summary
                self._returns[func] = UNKNOWN  # a recursive function sees nothing
                returned = self._unseeded_return(func)
                if (
                    returned is not None
                    and returned.kind is Kind.TENSOR
                    and returned.place is Place.CPU
                    and isinstance(returned.source, ast.Call)
                    and not returned.scalar
                    and not returned.assumed
                ):
                    found = returned
            elif self.mentions(func, ".to(", ".cuda(") and self.mentions(func, "return"):
                self._returns[func] = UNKNOWN  # a recursive function sees nothing
                returned = self._unseeded_return(func)
                if returned is not None and moved_whatever_given(returned, func):
                    found = returned
            self._returns[func] = found
        return found

    def may_return_factory(self, func: AnyFunction) -> bool:
        """`returns_factory` of the function's text (cached)."""
        found = self._makes_factory.get(func)
        if found is None:
            found = self._makes_factory[func] = returns_factory(self.text(func))
        return found

    def buffers(self, cls: ast.ClassDef) -> frozenset[str]:
        """Names construction registers as buffers (`self.register_buffer("beta", t)`),
        in `cls` or its bases (of this file, or of the one other project file defining a
        module class of that name): tensors `model.to(device)` moves. A method that
        construction does not run and that assigns one removes it (it may put a tensor
        there after the move)."""
        found = self._buffers.get(cls)
        if found is None:
            self._buffers[cls] = frozenset()  # cyclic bases
            names = set(registered_buffers(cls)) if "register_buffer" in self.text(cls) else set()
            for base in cls.bases:
                names |= self._base_buffers(base)
            if names:
                helpers = self.init_helpers(cls)
                for name, method in self.methods(cls).items():
                    if name != "__init__" and name not in helpers:
                        assigned = self.self_attrs_assigned(method)
                        names = set() if "*" in assigned else names - assigned
            found = self._buffers[cls] = frozenset(names)
        return found

    def _base_buffers(self, base: ast.expr) -> frozenset[str]:
        if isinstance(base, ast.Name) and base.id in self.classes:
            return self.buffers(self.classes[base.id])
        qual = self.ctx.qualname(base) or ""
        last = qual.rpartition(".")[2]
        if not last or qual.startswith("torch.") or last not in self.project.module_classes:
            return frozenset()
        paths = self.project.class_files.get(last, ())
        if len(paths) != 1:
            return frozenset()
        # the one file defining it must be the one the import names (`.neurons` ->
        # `.../neurons.py`; a package re-export `from .models import Net` is not read)
        module = qual.lstrip(".").rpartition(".")[0]
        tail = "/" + module.replace(".", "/")
        path = "/" + paths[0].replace("\\", "/")
        if not module or not path.endswith((tail + ".py", tail + "/__init__.py")):
            return frozenset()
        other = project_file(self.ctx, paths[0])
        if other is None:
            return frozenset()
        flow = file_flow(other.ctx)
        node = flow.classes.get(last)
        return flow.buffers(node) if node is not None else frozenset()

    def method_aliases(self, cls: ast.ClassDef) -> dict[str, tuple[AnyFunction, ...]]:
        """`object_state.method_aliases` of `cls` (cached)."""
        found = self._aliases.get(cls)
        if found is None:
            found = self._aliases[cls] = method_aliases(cls, self.methods(cls))
        return found

    def alias_names(self, cls: ast.ClassDef) -> frozenset[str]:
        """Attributes `x` of a line `obj.x = obj.y` in `cls`'s text (cached): the only
        names `method_aliases` can give, found without walking the class."""
        found = self._alias_names.get(cls)
        if found is None:
            found = self._alias_names[cls] = frozenset(_ALIAS_LINE.findall(self.text(cls)))
        return found

    def module_exit_env(self) -> Env:
        """Module-level names as the module's code leaves them (globals of functions)."""
        return self.module_scope().exit_env

    def none_attributes(self, cls: ast.ClassDef, func: AnyFunction) -> frozenset[str]:
        """The attributes `x` that `__init__` leaves None (`self.feature_map = None`), for
        a method `func` that construction does not run: `if self.x is None:` there is the
        path of an object as built (analysis/default_path.py)."""
        init = self.methods(cls).get("__init__")
        if init is None or init is func or func.name in self.init_helpers(cls):
            return frozenset()
        found = self._none_attrs.get(cls)
        if found is None:
            if init in self._in_progress:
                return frozenset()  # asked while construction runs (a call it follows)
            scope = self.scope(init)
            prefix = scope.self_name + "."
            found = frozenset(
                key[len(prefix) :]
                for key, value in scope.exit_env.items()
                if key.startswith(prefix)
                and "." not in key[len(prefix) :]
                and value.kind is Kind.NONE
            )
            self._none_attrs[cls] = found
        return found


def _asked(flow: FileFlow) -> FileFlow:
    """Another file's facts, asked by this one: they are shared by every file asking,
    and each asks with a full budget, so what it is told does not depend on what was
    asked before."""
    flow._call_budget = flow.CALL_BUDGET
    return flow


def _module_stems(ctx: FileContext) -> frozenset[str]:
    """The names of the project's modules and packages (file stems, folders holding an
    `__init__.py`), once per run: an import naming none of them is a library's."""
    disk = ctx.project.disk
    found = disk.get("module_stems")
    if not isinstance(found, frozenset):
        stems: set[str] = set()
        for path in ctx.project.paths:
            folder, _, name = path.rpartition("/")
            if name == "__init__.py":
                stems.add(folder.rpartition("/")[2])
            elif name.endswith(".py"):
                stems.add(name[:-3])
        found = disk["module_stems"] = frozenset(stems)
    return found


def scopes_with(ff: FileFlow, *needles: str) -> list[ScopeNode]:
    """The scopes (module-level code, functions) whose own code contains a needle."""
    return ff.scopes_at(ff.ctx.lines_holding(needles))
