"""The scope interpreter: statements (loops: scope_loops.py) and the dispatch tables."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.default_path import given_truth, keep_default_env
from torchdoctor.check.analysis.interfaces import FileFacts
from torchdoctor.check.analysis.scope_loops import ScopeLoops
from torchdoctor.check.analysis.syntax import _is_main_guard, _is_no_grad_context, dotted
from torchdoctor.check.analysis.torch_api import _NAMED_KINDS
from torchdoctor.check.analysis.values import (
    NONE,
    UNKNOWN,
    Env,
    Kind,
    ScopeNode,
    Value,
    _container_add,
    join,
    join_env,
)
from torchdoctor.check.tree_walk import iter_children, walk

if TYPE_CHECKING:
    pass


class ScopeFlow(ScopeLoops):
    """The facts of one function body (or of module-level code).

    Query API (all read-only after construction):
    - `value(expr)`: the Value `expr` held when it was evaluated (UNKNOWN if never/unknown);
    - `mismatches`, `moves`, `calls`: see the module docstring;
    - `method_calls(name)`: every `x.name(...)` call evaluated in the scope;
    - `exit_env`: names (and `self.x` attributes) as the scope leaves them;
    - `returned`: the join of the returned values.
    """

    def __init__(self, ff: FileFacts, node: ScopeNode, *, seeds: Env, depth: int = 0) -> None:
        super().__init__(ff, node, seeds=seeds, depth=depth)
        self._run()

    # -- driver ----------------------------------------------------------------------------
    def _run(self) -> None:
        env: Env = {k: v for k, v in self.seeds.items()}
        self.env = env
        body = self.node.body
        if isinstance(self.node, ast.Module):
            self._exec_block(body)
            self.exit_env = self.env or {}
            return
        self._exits: list[Env] = []
        self._exec_block(body)
        if self.env is not None:
            self._exits.append(self.env)
        exit_env: Env | None = None
        for e in self._exits:
            exit_env = e if exit_env is None else join_env(exit_env, e)
        self.exit_env = exit_env or {}

    # -- statements --------------------------------------------------------------------------
    def _exec_block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if self.env is None:
                return
            self._exec(stmt)

    def _exec(self, stmt: ast.stmt) -> None:
        handler = _STATEMENTS.get(type(stmt))
        if handler is not None:
            handler(self, stmt)
        else:
            self._exec_other(stmt)

    def _exec_other(self, stmt: ast.stmt) -> None:
        # statements with no effect on the facts we keep; still evaluate their expressions
        for child in iter_children(stmt):
            if isinstance(child, ast.expr):
                self.eval(child)

    def _exec_assign(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Assign)
        value = self.eval(stmt.value)
        for target in stmt.targets:
            self._bind(target, value)

    def _exec_ann_assign(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.AnnAssign)
        if stmt.value is not None:
            self._bind(stmt.target, self.eval(stmt.value))

    def _exec_aug_assign(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.AugAssign)
        key = dotted(stmt.target)
        current = self.lookup(key) if key and "." not in key else UNKNOWN
        if key and "." in key and self.env is not None:
            current = self.env.get(key, UNKNOWN)
        if isinstance(stmt.target, ast.Subscript):
            self.eval(stmt.target.value)
        right = self.eval(stmt.value)
        if current.kind is Kind.CONTAINER:
            new = _container_add(current, right)
        elif current.kind is Kind.OBJECT or right.kind is Kind.OBJECT:
            new = UNKNOWN  # the class's `__imul__`/`__mul__`/`__rmul__` decides
        else:
            new = self._binary(stmt, [(stmt.target, current), (stmt.value, right)])
        if key:
            self._set(key, new)

    def _exec_expr(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Expr)
        if isinstance(stmt.value, ast.Call):
            self._statement_call = stmt.value
        try:
            self.eval(stmt.value)
        finally:
            self._statement_call = None

    def _exec_return(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Return)
        value = self.eval(stmt.value) if stmt.value is not None else NONE
        self.returned = value if self.returned is None else join(self.returned, value)
        if self.env is not None and self.is_function:
            self._exits.append(self.env)
        self.env = None

    def _exec_raise(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Raise)
        if stmt.exc is not None:
            self.eval(stmt.exc)
        self.env = None

    def _exec_break(self, stmt: ast.stmt) -> None:
        if self._loops and self.env is not None:
            self._loops[-1].breaks.append(self.env)
        self.env = None

    def _exec_continue(self, stmt: ast.stmt) -> None:
        if self._loops and self.env is not None:
            self._loops[-1].continues.append(self.env)
        self.env = None

    def _exec_if(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.If)
        self.eval(stmt.test)
        if not self.is_function and _is_main_guard(stmt.test):
            self._exec_block(stmt.body)  # a script's main block always runs
            return
        taken = self.branch_taken(stmt)
        if taken is not None:
            self._exec_block(stmt.body if taken else stmt.orelse)
            return
        before = self.env
        assert before is not None
        omitted = self.when_omitted(stmt.test)
        if omitted is not None:
            truth = given_truth(stmt.test, omitted[0], before.get(omitted[0]))
            if truth is not None:  # every call seen passes a tensor: one branch runs
                self._exec_block(stmt.body if truth else stmt.orelse)
                return
        start = self._tick
        self.env = dict(before)
        self._exec_block(stmt.body)
        after_body = self.env
        self.env = before
        middle = self._tick
        self._exec_block(stmt.orelse)
        joined = self._join_branches(after_body, self.env, start, middle)
        if omitted is not None and joined is not None:
            default_env = after_body if omitted[1] else self.env
            if default_env is not None:
                joined = keep_default_env(joined, default_env, omitted[0])
        self.env = joined

    def _exec_with(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.With | ast.AsyncWith)
        no_grad = 0
        device = 0
        for item in stmt.items:
            value = self.eval(item.context_expr)
            if _is_no_grad_context(item.context_expr, self.ctx):
                no_grad += 1
            expr = item.context_expr
            if value.kind is Kind.DEVICE or (
                isinstance(expr, ast.Name | ast.Attribute) and "device" in self._text(expr)
            ):
                device = 1  # `with torch.device(d):`, `with device:`
            if item.optional_vars is not None:
                self._bind(item.optional_vars, value if value.kind is Kind.LOADER else UNKNOWN)
        self._no_grad += no_grad
        self._default_device += device
        meeting = self._meeting
        if any(_expects_error(item.context_expr) for item in stmt.items):
            self._meeting = False  # `with pytest.raises(RuntimeError):` wants the crash
        try:
            self._exec_block(stmt.body)
        finally:
            self._no_grad -= no_grad
            self._default_device -= device
            self._meeting = meeting

    def _exec_try(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar"
        before = dict(self.env or {})
        self._exec_block(stmt.body)  # type: ignore[attr-defined]
        after_body = self.env
        outcomes: list[Env | None] = []
        for handler in stmt.handlers:  # type: ignore[attr-defined]
            self.env = join_env(before, after_body)
            if handler.type is not None:
                self.eval(handler.type)
            if handler.name:
                self._set(handler.name, UNKNOWN)
            self._exec_block(handler.body)
            outcomes.append(self.env)
        self.env = after_body
        if self.env is not None:
            self._exec_block(stmt.orelse)  # type: ignore[attr-defined]
        result = self.env
        for outcome in outcomes:
            result = join_env(result, outcome) if result is not None else outcome
        if stmt.finalbody:  # type: ignore[attr-defined]
            self.env = result if result is not None else join_env(before, after_body)
            self._exec_block(stmt.finalbody)  # type: ignore[attr-defined]
            if result is None:
                self.env = None
        else:
            self.env = result

    def _exec_def(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for dec in stmt.decorator_list:
            self.eval(dec)
        self._set(stmt.name, UNKNOWN)

    def _exec_import(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Import | ast.ImportFrom)
        for alias in stmt.names:
            name = alias.asname or alias.name.split(".", 1)[0]
            if name != "*":
                self._set(name, UNKNOWN)

    def _exec_delete(self, stmt: ast.stmt) -> None:
        assert isinstance(stmt, ast.Delete)
        for target in stmt.targets:
            key = dotted(target)
            if key:
                self._set(key, UNKNOWN)
            elif isinstance(target, ast.Subscript):
                self.eval(target.value)

    def _exec_match(self, stmt: ast.stmt) -> None:
        subject: ast.expr = stmt.subject  # type: ignore[attr-defined]
        self.eval(subject)
        before = self.env
        assert before is not None
        result: Env | None = dict(before)  # no case may match
        for case in stmt.cases:  # type: ignore[attr-defined]
            self.env = dict(before)
            for node in walk(case.pattern):
                name = getattr(node, "name", None)
                if isinstance(name, str):
                    self._set(name, UNKNOWN)
            if case.guard is not None:
                self.eval(case.guard)
            self._exec_block(case.body)
            result = join_env(result, self.env) if result is not None else self.env
        self.env = result

    # -- binding --------------------------------------------------------------------------
    def _bind(self, target: ast.expr, value: Value) -> None:
        if isinstance(target, ast.Name):
            if value.kind in _NAMED_KINDS and not value.name:
                value = dataclasses.replace(value, name=target.id)
            if self._recording and value is not UNKNOWN:
                self._values[target] = value  # what the name was bound to, here
            self._set(target.id, value)
        elif isinstance(target, ast.Tuple | ast.List):
            elts = target.elts
            starred = any(isinstance(e, ast.Starred) for e in elts)
            if value.items is not None and len(value.items) == len(elts) and not starred:
                for elt, item in zip(elts, value.items, strict=False):
                    self._bind(elt, item)
                return
            item = self._element(value, None)
            for elt in elts:
                if isinstance(elt, ast.Starred):
                    self._bind(elt.value, Value(Kind.CONTAINER, element=item))
                else:
                    self._bind(elt, item)
        elif isinstance(target, ast.Attribute):
            self.eval(target.value)
            key = dotted(target)
            if key:
                self._set(key, value)
        elif isinstance(target, ast.Subscript):
            self.eval(target.slice)
            key = dotted(target.value)
            base = self.eval(target.value)
            if key is None or self.env is None:
                return
            if base.kind in (Kind.TENSOR, Kind.PARAMETER):
                return  # an in-place write: still the same tensor
            if base.kind is Kind.ARRAY:
                # one element takes a 0-dim tensor through float(); anything wider (a
                # row, a slice, a tensor with dimensions) goes through `__array__`
                index = target.slice
                indices = index.elts if isinstance(index, ast.Tuple) else [index]
                one_element = (
                    value.scalar
                    and base.ndim == len(indices)
                    and not any(isinstance(i, ast.Slice) for i in indices)
                )
                # only a value known to be a tensor: `target` is the array, not the value,
                # so the scope's evidence about an unknown one would be read for the wrong name
                if not one_element and value.kind is not Kind.UNKNOWN:
                    self._converted(target, target, value, "an assignment into a NumPy array")
                return  # still the same array
            if base.kind is Kind.CONTAINER:
                self._set(key, _container_add(base, Value(Kind.CONTAINER, element=value)))
            else:
                self._set(key, UNKNOWN)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, value)

    # -- expressions -------------------------------------------------------------------------
    def eval(self, node: ast.expr) -> Value:
        handler = _EXPRESSIONS.get(type(node))
        if handler is None:
            for child in iter_children(node):
                if isinstance(child, ast.expr):
                    self.eval(child)
            value = UNKNOWN
        else:
            value = handler(self, node)
        if self._recording and value is not UNKNOWN:
            self._values[node] = value
        return value


_RAISES = frozenset({"raises", "assertRaises", "assertRaisesRegex"})


def _expects_error(expr: ast.expr) -> bool:
    """`pytest.raises(...)`, `self.assertRaises(...)`: a block that should fail."""
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in _RAISES


def _skip(self: ScopeFlow, stmt: ast.stmt) -> None:
    return None


_STATEMENTS: dict[type[ast.stmt], Callable[[ScopeFlow, ast.stmt], None]] = {
    ast.Assign: ScopeFlow._exec_assign,
    ast.AnnAssign: ScopeFlow._exec_ann_assign,
    ast.AugAssign: ScopeFlow._exec_aug_assign,
    ast.Expr: ScopeFlow._exec_expr,
    ast.Return: ScopeFlow._exec_return,
    ast.Raise: ScopeFlow._exec_raise,
    ast.Break: ScopeFlow._exec_break,
    ast.Continue: ScopeFlow._exec_continue,
    ast.If: ScopeFlow._exec_if,
    ast.With: ScopeFlow._exec_with,
    ast.AsyncWith: ScopeFlow._exec_with,
    ast.Try: ScopeFlow._exec_try,
    ast.For: ScopeFlow._exec_for,
    ast.AsyncFor: ScopeFlow._exec_for,
    ast.While: ScopeFlow._exec_while,
    ast.FunctionDef: ScopeFlow._exec_def,
    ast.AsyncFunctionDef: ScopeFlow._exec_def,
    ast.ClassDef: ScopeFlow._exec_def,
    ast.Import: ScopeFlow._exec_import,
    ast.ImportFrom: ScopeFlow._exec_import,
    ast.Delete: ScopeFlow._exec_delete,
    ast.Pass: _skip,
    ast.Global: _skip,
    ast.Nonlocal: _skip,
}


if hasattr(ast, "TryStar"):
    _STATEMENTS[ast.TryStar] = ScopeFlow._exec_try


if hasattr(ast, "Match"):
    _STATEMENTS[ast.Match] = ScopeFlow._exec_match


_EXPRESSIONS: dict[type[ast.expr], Callable[[ScopeFlow, ast.expr], Value]] = {
    ast.Name: ScopeFlow._eval_name,
    ast.Constant: ScopeFlow._eval_constant,
    ast.Attribute: ScopeFlow._eval_attribute,
    ast.Subscript: ScopeFlow._eval_subscript,
    ast.Call: ScopeFlow._eval_call,
    ast.Tuple: ScopeFlow._eval_tuple,
    ast.List: ScopeFlow._eval_tuple,
    ast.Set: ScopeFlow._eval_tuple,
    ast.Dict: ScopeFlow._eval_dict,
    ast.ListComp: ScopeFlow._eval_comprehension,
    ast.SetComp: ScopeFlow._eval_comprehension,
    ast.GeneratorExp: ScopeFlow._eval_comprehension,
    ast.DictComp: ScopeFlow._eval_comprehension,
    ast.BinOp: ScopeFlow._eval_binop,
    ast.Compare: ScopeFlow._eval_compare,
    ast.UnaryOp: ScopeFlow._eval_unary,
    ast.IfExp: ScopeFlow._eval_ifexp,
    ast.BoolOp: ScopeFlow._eval_boolop,
    ast.NamedExpr: ScopeFlow._eval_namedexpr,
    ast.Starred: ScopeFlow._eval_starred,
    ast.Lambda: ScopeFlow._eval_lambda,
    ast.Await: ScopeFlow._eval_await,
}
