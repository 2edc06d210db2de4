"""The state of the scope interpreter: environment, recorded values, meetings of devices."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.default_path import first_bindings, none_defaults, when_omitted
from torchdoctor.check.analysis.env_defaults import EnvDefaults, environment_lines
from torchdoctor.check.analysis.interfaces import FileFacts
from torchdoctor.check.analysis.loop_splits import LoopSplit, UseLog, method_uses
from torchdoctor.check.analysis.syntax import (
    _decorated_no_grad,
    _is_static,
    _local_names,
    module_receivers,
)
from torchdoctor.check.analysis.unbound import unbindable
from torchdoctor.check.analysis.values import (
    _TENSOR_KINDS,
    UNKNOWN,
    CallSite,
    Conversion,
    Env,
    Kind,
    Mismatch,
    Move,
    Place,
    ScopeNode,
    Value,
    join_env,
)

if TYPE_CHECKING:
    pass


class _LoopFrame:
    __slots__ = ("breaks", "continues")

    def __init__(self) -> None:
        self.breaks: list[Env] = []
        self.continues: list[Env] = []


class ScopeCore:
    """The interpreter's state: the environment, what each expression held, where
    devices met. The layers above add expressions, library calls, moves, calls and
    statements; `scope.ScopeFlow` is the whole interpreter."""

    MAX_LOOP_PASSES = 3

    def __init__(self, ff: FileFacts, node: ScopeNode, *, seeds: Env, depth: int = 0) -> None:
        self.ff = ff
        self.depth = depth  # calls followed with their arguments to get here (call_scope)
        self.ctx = ff.ctx
        self.node = node
        self.seeds = seeds
        self._values: dict[ast.AST, Value] = {}
        self._none_defaults: frozenset[str] | None = None
        self._rebound: dict[str, int] | None = None  # first binding of each of those
        self._env_reads: EnvDefaults | bool | None = None  # (env_defaults.py)
        self._mismatches: dict[tuple[int, int], Mismatch] = {}
        # the loops whose first or second pass runs: what moved models' methods get there
        self._use_logs: list[UseLog] = []
        self._splits: dict[tuple[int, int], LoopSplit] = {}
        self.moves: list[Move] = []
        self.conversions: list[Conversion] = []  # tensors NumPy converts implicitly
        self.calls: list[CallSite] = []
        self._method_calls: dict[str, list[ast.Call]] = {}
        self._named_calls: dict[str, list[ast.Call]] = {}
        self.exit_env: Env = {}
        self.returned: Value | None = None
        self.moved_origins: set[tuple[str, int]] = set()  # batches moved here (name, line)
        self._recording = True
        # meetings of devices are also recorded on a loop's first pass, which runs from
        # the state before the loop: `h = torch.zeros(n)` then `h = h + x` in the loop
        # meets on the first iteration, though the loop's fixpoint no longer knows `h`;
        # and on its second, from the state the first leaves (`ScopeFlow._second_pass`)
        self._meeting = True
        self._no_grad = 0
        # inside `with torch.device(...):` (or the file sets a default device): factories
        # without `device=` make tensors on that device
        # (a word test, not a search of the text: a file's every scope asks)
        self._default_device = 1 if ff.ctx.holds("set_default_device") else 0
        self._loops: list[_LoopFrame] = []
        self._statement_call: ast.Call | None = None
        # the last `self.m(...)` followed with the caller's `self` (ScopeSelf._self_call):
        # what it leaves on `self` is known, not to be forgotten as a call of unknown effect
        self._self_followed: ast.Call | None = None
        self.env: Env | None = None
        self.is_function = not isinstance(node, ast.Module)
        self.self_name = ""
        self.cls: ast.ClassDef | None = None
        self._locals: frozenset[str] | None = None  # computed on first need
        self._module_receivers: frozenset[str] | None = None  # computed on first need
        self._globals: Env | None = None
        # when the run first and last bound each key (a tick of each binding; -1: on
        # entry), to tell a key one branch never binds (analysis/unbound.py)
        self._tick = 0
        self._first: dict[str, int] = dict.fromkeys(seeds, -1)
        self._last: dict[str, int] = dict.fromkeys(seeds, -1)
        self._unbindable: Callable[[str], bool] | None = None
        if not isinstance(node, ast.Module):
            self.cls = ff.class_of(node)
            params = [*node.args.posonlyargs, *node.args.args]
            if self.cls is not None and params and not _is_static(node):
                self.self_name = params[0].arg
            if _decorated_no_grad(node, ff.ctx):
                self._no_grad = 1
            args = node.args
            for arg in (*params, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None:
                    self._first[arg.arg] = self._last[arg.arg] = -1

    # -- implemented by the layers above (scope_exprs ... scope) ---------------------------
    def eval(self, node: ast.expr) -> Value:
        """The value of `node` (recorded for `value()` queries); see `ScopeFlow.eval`."""
        raise NotImplementedError

    def _bind(self, target: ast.expr, value: Value) -> None:
        raise NotImplementedError

    def _exec_block(self, body: list[ast.stmt]) -> None:
        raise NotImplementedError

    def _peek(self, node: ast.expr) -> Value:
        raise NotImplementedError

    def device_target(self, target: ast.expr) -> tuple[Place, str] | None:
        raise NotImplementedError

    def branch_taken(self, stmt: ast.If) -> bool | None:
        """Which branch of `stmt` runs on the one path this analysis follows (None: both,
        joined). Every path, here; a question asked on one path overrides it
        (analysis/cache_hit.py)."""
        return None

    def when_omitted(self, test: ast.expr) -> tuple[str, bool] | None:
        """(parameter, the test's truth) where the caller leaves out a None-default
        parameter the scope has not rebound by then (analysis/default_path.py), or
        ("$VARIABLE", truth) where the environment leaves a variable unset
        (analysis/env_defaults.py)."""
        if self._env_reads is None:
            self._env_reads = False
            lines = self.ctx.shared("env_lines", environment_lines)
            if not isinstance(self.node, ast.Module):
                end = self.node.end_lineno or self.node.lineno
                lines = [n for n in lines if self.node.lineno <= n <= end]
            if lines:
                ctx = self.ctx  # (no closure over the scope: no reference cycle)
                self._env_reads = EnvDefaults(self.node, ctx.qualname, ctx.lines_holding, lines)
        if isinstance(self._env_reads, EnvDefaults):
            unset = self._env_reads.when_unset(test)
            if unset is not None:
                return unset
        if self._none_defaults is None:
            self._none_defaults = none_defaults(self.node)
            if self.cls is not None and self.self_name and self.is_function:
                attrs = self.ff.none_attributes(self.cls, self.node)  # type: ignore[arg-type]
                self._none_defaults |= {f"{self.self_name}.{a}" for a in attrs}
        if not self._none_defaults:
            return None
        found = when_omitted(test, self._none_defaults)
        if found is None:
            return None
        if self._rebound is None:
            self._rebound = first_bindings(self.node, self._none_defaults)
        if self._rebound.get(found[0], test.lineno) < test.lineno:
            return None  # rebound before the test: no longer the caller's
        return found

    # -- queries -------------------------------------------------------------------------
    def value(self, node: ast.AST) -> Value:
        return self._values.get(node, UNKNOWN)

    @property
    def mismatches(self) -> list[Mismatch]:
        return list(self._mismatches.values())

    @property
    def loop_splits(self) -> list[LoopSplit]:
        """Variables a loop hands a moved model on the device first, then on the CPU."""
        return list(self._splits.values())

    def method_calls(self, name: str) -> list[ast.Call]:
        """Every `x.name(...)` call evaluated in the scope, in evaluation order."""
        return self._method_calls.get(name, [])

    def calls_named(self, name: str) -> list[ast.Call]:
        """Every `name(...)` or `x.name(...)` call evaluated in the scope."""
        return self._named_calls.get(name, [])

    def shown_module(self, key: str | None) -> bool:
        """Whether the scope calls a method only an nn.Module has on `key` (`model.eval()`)."""
        if key is None:
            return False
        if self._module_receivers is None:
            # one answer per function and file: a followed call builds a scope per call
            cache: dict[int, frozenset[str]] = self.ctx.shared("module_receivers", lambda _: {})
            found = cache.get(id(self.node))
            if found is None:
                found = cache[id(self.node)] = module_receivers(self.node, self.ctx)
            self._module_receivers = found
        if key in self._module_receivers:
            return True
        prefix = self.self_name + "."
        if self.cls is None or not self.self_name or not key.startswith(prefix):
            return False
        # `self.model.eval()` in another method of the class
        return key[len(prefix) :] in self.ff.module_attrs(self.cls)

    # -- environment -------------------------------------------------------------------------
    def lookup(self, name: str) -> Value:
        env = self.env
        if env is not None and name in env:
            return env[name]
        return self.global_value(name, name)

    def _is_local(self, name: str) -> bool:
        """`name` is bound in this function (whatever it holds at this point)."""
        if isinstance(self.node, ast.Module):
            return self.ff.module_assigns(name)
        if self._locals is None:
            self._locals = self._local_names()
        return name in self._locals

    def _local_names(self) -> frozenset[str]:
        """`syntax._local_names` of the function, once per file: a function is run
        many times (callers seeded or not, each call followed with its arguments)."""
        cache: dict[int, frozenset[str]] = self.ctx.shared("scope.locals", lambda _: {})
        found = cache.get(id(self.node))
        if found is None:
            found = cache[id(self.node)] = _local_names(self.node)  # type: ignore[arg-type]
        return found

    def global_value(self, root: str, key: str) -> Value:
        """The module-level value of `key` (a name or `name.attr`), if `root` is not local."""
        if isinstance(self.node, ast.Module):
            return UNKNOWN  # at module level every name is the scope's own
        if not self.ff.module_assigns(root):
            return UNKNOWN
        if self._globals is None:
            self._globals = self.ff.module_exit_env()
        if key not in self._globals:
            return UNKNOWN
        if self._locals is None:
            self._locals = self._local_names()
        return UNKNOWN if root in self._locals else self._globals[key]

    def _touch(self, key: str) -> None:
        """`key` is (or may be) bound here."""
        self._first.setdefault(key, self._tick)
        self._last[key] = self._tick
        self._tick += 1

    def _join_branches(self, a: Env | None, b: Env | None, start: int, middle: int) -> Env | None:
        """`join_env` of an `if`'s two paths (`a` ran from tick `start` to `middle`, `b`
        from `middle` on): a key unbound before the `if` that one path never binds keeps
        the other path's value (analysis/unbound.py)."""
        if a is None or b is None or a.keys() == b.keys():
            return join_env(a, b)
        if self._unbindable is None:
            self._unbindable = unbindable(
                self.node, self.cls, self.self_name, self.ctx.qualname, self.ctx.source
            )
        test, first, last = self._unbindable, self._first, self._last

        def unbound(key: str) -> bool:
            born = first.get(key, -1)
            if born < start:
                return False  # bound before the `if` (or never: then in neither env)
            # absent from `b`: `b` never bound it; absent from `a`: first bound in `b`
            never = last[key] < middle if key in a else born >= middle
            return never and test(key)

        return join_env(a, b, unbound)

    def _set(self, key: str, value: Value) -> None:
        env = self.env
        if env is None:
            return
        self._touch(key)
        if "." in key:
            if self.self_name and key.startswith(self.self_name + ".") and value.fresh:
                value = dataclasses.replace(value, fresh=False)  # registered on self
        else:
            prefix = key + "."
            for other in [k for k in env if k.startswith(prefix)]:
                del env[other]
        if value.kind is Kind.UNKNOWN and value.place is Place.UNKNOWN:
            env.pop(key, None)
        else:
            env[key] = value

    # -- operations ---------------------------------------------------------------------------
    def _binary(
        self,
        site: ast.AST,
        operands: list[tuple[ast.expr, Value]],
        *,
        grad: bool = True,
    ) -> Value:
        """Arithmetic/comparison of tensors: the result, and a mismatch if devices differ."""
        tensors = [(n, v) for n, v in operands if v.kind in _TENSOR_KINDS and v.tensor_like]
        if not tensors:
            return UNKNOWN
        self._meet(site, tensors, "operator")
        return self._combined([v for _, v in tensors], grad=grad)

    def _combined(self, values: list[Value], *, grad: bool = True) -> Value:
        """A tensor computed from `values`: on the device if any is, else on the CPU."""
        devices = [v for v in values if v.place is Place.DEVICE]
        cpus = [v for v in values if v.place is Place.CPU]
        needs_grad = grad and self._no_grad == 0 and any(v.grad for v in values)
        if devices:
            first = next((v for v in devices if not v.maybe), devices[0])
            return Value(
                Kind.TENSOR,
                Place.DEVICE,
                name=first.name,
                device=first.device,
                device_line=first.device_line,
                assumed=first.assumed,
                is_input=first.is_input,
                maybe=first.maybe,
                grad=needs_grad,
                scalar=all(v.scalar for v in values),
                output=first.output,
            )
        if cpus and len(cpus) == len(values):
            first = next((v for v in cpus if not v.scalar), cpus[0])
            return Value(
                Kind.TENSOR,
                Place.CPU,
                name=first.name,
                line=first.line,
                assumed=any(v.assumed for v in cpus),
                grad=needs_grad,
                scalar=all(v.scalar for v in values),
                source=first.source,
                dropped_line=first.dropped_line,
            )
        return Value(Kind.TENSOR, grad=needs_grad) if needs_grad else UNKNOWN

    def _log_uses(
        self,
        node: ast.Call,
        recv: Value,
        args: list[Value],
        keywords: list[tuple[str | None, Value]],
    ) -> None:
        """What a moved model's method gets, for the loops whose passes run (loop_splits)."""
        for given in method_uses(node, recv, args, [v for _, v in keywords]):
            for log in self._use_logs:
                log.add(node, *given, recv)

    def _meet(self, site: ast.AST, operands: list[tuple[ast.expr, Value]], via: str) -> None:
        """Record CPU operands meeting a device operand (0-dim CPU tensors are allowed)."""
        if not self._meeting:
            return
        device = next(
            ((n, v) for n, v in operands if v.place is Place.DEVICE and v.kind is not Kind.DEVICE),
            None,
        )
        if device is None:
            return
        for node, value in operands:
            if value.place is Place.CPU and not value.scalar and value.kind in _TENSOR_KINDS:
                key = (id(site), id(node))
                self._mismatches[key] = Mismatch(site, node, value, device[0], device[1], via)

    def _converted(self, site: ast.AST, node: ast.expr, value: Value, how: str) -> None:
        """Record tensors (also inside a list or tuple) that NumPy converts with `.numpy()`."""
        if not self._recording:
            return
        inside = value.items or ((value.element,) if value.element is not None else ())
        for held in (value, *(inside if value.kind is Kind.CONTAINER else ())):
            if held.kind in _TENSOR_KINDS and held.kind is not Kind.UNKNOWN:
                self.conversions.append(Conversion(site, node, held, how))
                return
        if isinstance(node, ast.ListComp | ast.GeneratorExp) and (
            value.kind is Kind.CONTAINER and value.element in (None, UNKNOWN)
        ):
            # `[w[i][0] for i in ...]`: each item is converted; what it is, unknown here
            node, value = node.elt, UNKNOWN
        if value == UNKNOWN and isinstance(
            node, ast.Name | ast.Attribute | ast.Call | ast.Subscript
        ):
            # not known to be a tensor: the scope may still show it is one, on a device
            # (`err.cpu()` elsewhere: see cpu_evidence)
            self.conversions.append(Conversion(site, node, value, how))

    # -- helpers ------------------------------------------------------------------------------
    def _text(self, node: ast.AST) -> str:
        return self.ctx.segment(node)
