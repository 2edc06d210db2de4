"""The mode interpreter's statements: train/eval mode of every model along every path."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.event_collector import _is_try, _try_parts
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import (
    _SAME_MODULE_METHODS,
    _WRAPPERS,
    is_no_grad_decorated,
    post_order_calls,
    with_item_context,
)
from torchdoctor.check.analysis.mode_class import init_helpers
from torchdoctor.check.analysis.mode_state import (
    _BUDGET,
    _ENTRY,
    _SELF_ANY,
    _UNKNOWN,
    BUILT,
    EVAL,
    ForwardCall,
    LoopFacts,
    ModeResult,
    Origin,
    Origins,
    State,
    TrainingStep,
    _contains_loop,
    _Frame,
    _join,
    _LoopExit,
    _none_test,
    _smoke_test,
    _train_arg,
)
from torchdoctor.check.analysis.names import LoopNode, is_eval_iterable, is_eval_name
from torchdoctor.check.analysis.syntax import bound_keys, dotted, last_part
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    pass


class ModeCore:
    """Abstract interpretation of one function: the mode of every model on every path."""

    def __init__(self, fl: LoopFacts, fi: FunctionInfo, *, entry: bool) -> None:
        self.fl = fl
        self.ctx = fl.ctx
        self.fi = fi
        self.default: Origins = frozenset({_ENTRY if entry else _UNKNOWN})
        self.forwards: dict[int, ForwardCall] = {}
        self.steps: dict[tuple[int, str], TrainingStep] = {}
        self.returns: list[State] = []
        self.loop_stack: list[tuple[list[State], list[State]]] = []  # (breaks, continues)
        self.budget = _BUDGET
        self.exceeded = False
        self._locals: set[str] | None = None
        self.autocast_names = fl.autocast_names()
        self._calls: dict[int, list[ast.Call]] = {}
        self.is_module_class = fi.cls is not None and self.ctx.is_module_class(fi.cls)
        self.mode_set: set[str] = set()  # keys whose mode this function sets itself
        self._aliases: dict[str, str] | None = None
        # small helpers read at their call (mode_inline): constants, lists of models and
        # the caller's keys their parameters and loop variables stand for
        self._env: list[tuple[dict[str, object], dict[str, list[str]], dict[str, str]]] = []

    def _call(self, call: ast.Call, state: State, frame: _Frame) -> None:
        raise NotImplementedError  # modes.ModeInterpreter

    def locals(self) -> set[str]:
        if self._locals is None:
            self._locals = self.fi.local_names() if not self.fi.is_module else set()
        return self._locals

    # -- driver ----------------------------------------------------------------
    def run(self) -> ModeResult:
        frame = _Frame(False, False, None, None, 0)
        fi = self.fi
        if not fi.is_module:
            node = fi.node
            assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            no_grad = is_no_grad_decorated(self.ctx, node)
            region = None
            region_node: ast.AST | None = None
            if (
                is_eval_name(fi.name)
                and not (fi.name == "eval" and fi.cls is not None)
                and not _smoke_test(fi)
            ):
                region, region_node = "strong", node
            elif no_grad and any(isinstance(s, LoopNode) for s in fi.own_statements()):
                region, region_node = "weak", node
            frame = _Frame(no_grad, False, region, region_node, 0)
        start = State({})
        if self.default == frozenset({_ENTRY}) and fi.cls is not None:
            # a model the class built in `__init__` and never sets: its mode is known here
            held = self.fl.held_models(fi.cls)
            if held and fi.name not in init_helpers(
                [f for f in self.fl.all_functions() if f.cls is fi.cls]
            ):
                start.modes.update((k, frozenset({o})) for k, o in held.items())
        state: State | None = start
        try:
            state = self._block(fi.body, state, frame)
        except _LoopExit:
            self.exceeded = True
        final = state
        for ret in self.returns:
            final = _join(final, ret, self.default)
        return ModeResult(
            fi,
            list(self.forwards.values()),
            list(self.steps.values()),
            final,
            self.exceeded,
            frozenset(self.mode_set),
        )

    def aliases(self) -> dict[str, str]:
        """`model = context.model` at the top of the function, with neither side bound
        again in it: both names are one object, so they share one mode."""
        if self._aliases is None:
            self._aliases = {} if self.fi.is_module else _aliases(self.fi)
        return self._aliases

    def _const_test(self, test: ast.expr) -> bool | None:
        return None  # mode_inline.HelperInliner: a constant the inlined call passed

    def _canonical(self, key: str) -> str:
        head, dot, rest = key.partition(".")
        if self._env and head in self._env[-1][2]:
            # a parameter or loop variable of an inlined helper: the caller's key
            key = self._env[-1][2][head] + dot + rest
            head, dot, rest = key.partition(".")
        target = self.aliases().get(head)
        return key if target is None else target + dot + rest

    def get(self, state: State, key: str) -> Origins:
        key = self._canonical(key)
        found = state.modes.get(key)
        if found is not None:
            return found
        # `model.module` shares the mode set on `model`
        while "." in key:
            key = key.rsplit(".", 1)[0]
            if key in state.modes:
                return state.modes[key]
        if key == "self" and _SELF_ANY in state.modes:
            return state.modes[_SELF_ANY]
        return self.default

    def set(self, state: State, key: str, origins: Origins) -> None:
        key = self._canonical(key)
        if key == _SELF_ANY:
            for other in [k for k in state.modes if k.startswith("self.")]:
                state.modes[other] = origins
        state.modes[key] = origins
        prefix = key + "."
        for other in [k for k in state.modes if k.startswith(prefix)]:
            del state.modes[other]

    # -- statements -------------------------------------------------------------------
    def _block(self, stmts: list[ast.stmt], state: State | None, frame: _Frame) -> State | None:
        for stmt in stmts:
            if state is None:
                return None
            self.budget -= 1
            if self.budget < 0:
                raise _LoopExit
            state = self._stmt(stmt, state, frame)
        return state

    def _stmt(self, stmt: ast.stmt, state: State, frame: _Frame) -> State | None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return state
        if isinstance(stmt, ast.If):
            taken = self._const_test(stmt.test)
            if taken is not None:
                return self._block(stmt.body if taken else stmt.orelse, state, frame)
            self._exprs(stmt.test, state, frame)
            body, orelse = state.copy(), state.copy()
            none_key, none_in_body = _none_test(stmt.test)
            if none_key is not None:
                # `if encoder is not None: encoder.eval()`: where it is None it never runs
                self.set(body if none_in_body else orelse, none_key, frozenset())
            a = self._block(stmt.body, body, frame)
            b = self._block(stmt.orelse, orelse, frame)
            return _join(a, b, self.default)
        if isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
            return self._loop(stmt, state, frame)
        if isinstance(stmt, ast.With | ast.AsyncWith):
            inner = frame
            for item in stmt.items:
                self._exprs(item.context_expr, state, frame)
                gc = with_item_context(self.ctx, item.context_expr, self.autocast_names)
                if gc.no_grad or gc.grad_switch:
                    region, region_node = inner.region, inner.region_node
                    if gc.no_grad and region is None and _contains_loop(stmt.body):
                        region, region_node = "weak", stmt
                    inner = _Frame(
                        gc.no_grad or inner.no_grad,
                        gc.grad_switch or inner.grad_switch,
                        region,
                        region_node,
                        inner.loop_depth,
                        inner.loop_node,
                    )
                if item.optional_vars is not None:
                    self._bind(item.optional_vars, None, state)
            return self._block(stmt.body, state, inner)
        if _is_try(stmt):
            try_body, handlers, try_else, finalbody = _try_parts(stmt)
            body_end = self._block(try_body, state.copy(), frame)
            start = _join(state, body_end, self.default)
            ends: list[State | None] = []
            for handler in handlers:
                ends.append(self._block(handler.body, start.copy() if start else None, frame))
            ends.append(self._block(try_else, body_end, frame) if body_end else None)
            out: State | None = None
            for end in ends:
                out = _join(out, end, self.default)
            if finalbody:
                if out is None and start is not None:
                    out = start.copy()
                out = self._block(finalbody, out, frame)
            return out
        if isinstance(stmt, ast.Match):
            self._exprs(stmt.subject, state, frame)
            out = None
            for case in stmt.cases:
                out = _join(out, self._block(case.body, state.copy(), frame), self.default)
            return _join(out, state, self.default)
        if isinstance(stmt, ast.Return):
            if stmt.value is not None:
                self._exprs(stmt.value, state, frame)
            self.returns.append(state)
            return None
        if isinstance(stmt, ast.Raise):
            return None
        if isinstance(stmt, ast.Break | ast.Continue):
            if self.loop_stack:
                breaks, continues = self.loop_stack[-1]
                (breaks if isinstance(stmt, ast.Break) else continues).append(state)
            return None
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            value = stmt.value
            if value is not None:
                self._exprs(value, state, frame)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                self._bind(target, value, state)
            return state
        self._exprs(stmt, state, frame)
        if isinstance(stmt, ast.AugAssign):
            self._bind(stmt.target, None, state)
        return state

    def _loop(
        self, stmt: ast.For | ast.AsyncFor | ast.While, state: State, frame: _Frame
    ) -> State | None:
        region, region_node = frame.region, frame.region_node
        if isinstance(stmt, ast.For | ast.AsyncFor):
            self._exprs(stmt.iter, state, frame)
            if region is None and is_eval_iterable(self.ctx.segment(stmt.iter)):
                region, region_node = "strong", stmt
        inner = _Frame(
            frame.no_grad, frame.grad_switch, region, region_node, frame.loop_depth + 1, stmt
        )
        head = state
        breaks: list[State] = []
        continues: list[State] = []
        for _ in range(3):
            breaks, continues = [], []
            self.loop_stack.append((breaks, continues))
            start = head.copy()
            if isinstance(stmt, ast.While):
                self._exprs(stmt.test, start, inner)
            else:
                self._bind(stmt.target, None, start)
            end = self._block(stmt.body, start, inner)
            self.loop_stack.pop()
            for c in continues:
                end = _join(end, c, self.default)
            new_head = head.join(end, self.default)
            if new_head.same(head):
                break
            head = new_head
        out: State | None = head
        if stmt.orelse:
            out = self._block(stmt.orelse, head.copy(), frame)
        for b in breaks:
            out = _join(out, b, self.default)
        return out

    def _bind(self, target: ast.expr, value: ast.expr | None, state: State) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self._bind(elt, None, state)
            return
        if isinstance(target, ast.Starred):
            self._bind(target.value, None, state)
            return
        key = dotted(target)
        if key is None:
            return
        origins = self._value_origins(value, state) if value is not None else None
        if origins is None:
            if (
                key in state.modes
                or self.fl.is_model_key(key)
                or any(k.startswith(key + ".") for k in state.modes)
            ):
                self.set(state, key, frozenset({_UNKNOWN}))
            return
        self.set(state, key, origins)

    def _value_origins(self, value: ast.expr, state: State) -> Origins | None:
        """The mode of a model-valued expression: `Net().to(dev)`, `DDP(model)`, `model`."""
        if isinstance(value, ast.Name | ast.Attribute):
            key = dotted(value)
            if key is not None and (key in state.modes or self.fl.is_model_key(key)):
                return self.get(state, key)
            return None
        if not isinstance(value, ast.Call):
            return None
        func = value.func
        if isinstance(func, ast.Attribute):
            if func.attr == "eval" and not value.args:
                return frozenset(
                    {Origin(EVAL, value, f"`{self._short(value)}` at line {value.lineno}")}
                )
            if func.attr == "train":
                mode = _train_arg(value)
                if mode is None:
                    return frozenset({_UNKNOWN})
                return frozenset(
                    {Origin(mode, value, f"`{self._short(value)}` at line {value.lineno}")}
                )
            if func.attr in _SAME_MODULE_METHODS:
                return self._value_origins(func.value, state)
        name = self.ctx.qualname(func) or ""
        if name in _WRAPPERS or last_part(name) in (
            "DataParallel",
            "DistributedDataParallel",
            "DDP",
        ):
            return self._value_origins(value.args[0], state) if value.args else None
        if name == "copy.deepcopy" and value.args:
            return self._value_origins(value.args[0], state)
        if self.fl.is_module_constructor(value):
            return frozenset(
                {Origin(BUILT, value, f"`{self._short(value)}` at line {value.lineno}")}
            )
        return None

    def _short(self, node: ast.AST) -> str:
        text = " ".join(self.ctx.segment(node).split())
        if len(text) > 40 and isinstance(node, ast.Call):
            head = self.ctx.segment(node.func)
            text = f"{head}(...)" if len(head) < 40 else "this call"
        return text

    # -- expressions -------------------------------------------------------------------
    def _exprs(self, node: ast.AST, state: State, frame: _Frame) -> None:
        calls = self._calls.get(id(node))
        if calls is None:
            calls = post_order_calls(node)
            self._calls[id(node)] = calls
        for call in calls:
            self._call(call, state, frame)


def _aliases(fi: FunctionInfo) -> dict[str, str]:
    candidates: dict[str, str] = {}
    for stmt in fi.body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Attribute)
        ):
            target = dotted(stmt.value)
            name = stmt.targets[0].id
            if target is not None and target.split(".", 1)[0] != name:
                candidates[name] = target
    if not candidates:
        return {}
    bound: dict[str, int] = {}
    for node in walk(fi.node):
        for key in bound_keys(node, comprehensions=True):
            bound[key] = bound.get(key, 0) + 1
    params = set(fi.params())
    return {
        name: target
        for name, target in candidates.items()
        if name not in params
        and bound.get(name) == 1
        and not any(k == target or k.startswith(target + ".") for k in bound)
        and target.split(".", 1)[0] not in bound
        and target.split(".", 1)[0] not in candidates
    }
