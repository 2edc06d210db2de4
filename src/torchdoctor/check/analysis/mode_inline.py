"""Small mode-setting helpers read at their call: `set_mode('eval', [encoder, decoder])`.

A helper that loops over the models it is given and picks `train()` or `eval()` from a
constant argument has no useful summary (its loop variable is no key of the caller, and
both branches join). Called with constants and a list of the caller's models, its body is
interpreted right there: the constant picks the branch, the loop runs once per model
named in the list, and the modes land on the caller's keys.
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.mode_core import ModeCore
from torchdoctor.check.analysis.mode_state import Origin, State, _Frame, _join
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.tree_walk import walk

_MAX_STATEMENTS = 12


class HelperInliner(ModeCore):
    def _inline_helper(
        self, call: ast.Call, callee: FunctionInfo, state: State, frame: _Frame
    ) -> State | None:
        """The state after `call`, read with `callee`'s body in place; None when the call
        is not such a helper call (then its summary applies as usual)."""
        if callee.is_module or callee.file is not self.fl or callee is self.fi or self._env:
            return None
        text = callee.text
        if ".train(" not in text and ".eval(" not in text:
            return None
        node = callee.node
        statements = [n for n in walk(node) if isinstance(n, ast.stmt)]
        if len(statements) > _MAX_STATEMENTS or any(
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Return)
            for n in statements[1:]
        ):
            return None
        env = _bindings(callee, call)
        if env is None:
            return None
        consts, lists, names = env
        if not consts or not lists:
            return None
        before = {id(o) for origins in state.modes.values() for o in origins}
        self._env.append((consts, lists, names))
        try:
            after = self._inline_block(callee.body, state.copy(), frame)
        finally:
            self._env.pop()
        if after is None:
            return state
        what = f"`{self._short(call)}` at line {call.lineno}"
        for key, origins in list(after.modes.items()):
            if any(id(o) not in before and o.node is not None for o in origins):
                after.modes[key] = frozenset(
                    o if id(o) in before or o.node is None else Origin(o.mode, call, what, o.stored)
                    for o in origins
                )
        return after

    def _inline_block(self, stmts: list[ast.stmt], state: State, frame: _Frame) -> State | None:
        current: State | None = state
        for stmt in stmts:
            if current is None:
                return None
            if isinstance(stmt, ast.Assert | ast.Pass | ast.Expr) and not isinstance(
                getattr(stmt, "value", None), ast.Call
            ):
                continue
            if isinstance(stmt, ast.For) and isinstance(stmt.iter, ast.Name):
                models = self._env[-1][1].get(stmt.iter.id)
                if models is not None and isinstance(stmt.target, ast.Name) and not stmt.orelse:
                    current = self._unrolled(stmt, models, current, frame)
                    continue
            current = self._stmt(stmt, current, frame)
        return current

    def _unrolled(
        self, stmt: ast.For, models: list[str], state: State, frame: _Frame
    ) -> State | None:
        """`for m in models:` once per model of the caller's list, `m` standing for it."""
        assert isinstance(stmt.target, ast.Name)
        current: State | None = state
        for key in models:
            if current is None:
                return None
            names = self._env[-1][2]
            names[stmt.target.id] = key
            breaks: list[State] = []
            continues: list[State] = []
            self.loop_stack.append((breaks, continues))
            try:
                end = self._inline_block(stmt.body, current, frame)
            finally:
                self.loop_stack.pop()
                del names[stmt.target.id]
            for c in continues:
                end = _join(end, c, self.default)
            if breaks:
                return None  # leaves early: not worth following
            current = end
        return current

    def _const_test(self, test: ast.expr) -> bool | None:
        """`mode == 'train'` with `mode` a constant the inlined call passed."""
        if not self._env or not isinstance(test, ast.Compare) or len(test.ops) != 1:
            return None
        consts = self._env[-1][0]
        left, right = test.left, test.comparators[0]
        if isinstance(right, ast.Name) and isinstance(left, ast.Constant):
            left, right = right, left
        if not (isinstance(left, ast.Name) and isinstance(right, ast.Constant)):
            return None
        if left.id not in consts:
            return None
        value = consts[left.id]
        if isinstance(test.ops[0], ast.Eq):
            return bool(value == right.value)
        if isinstance(test.ops[0], ast.NotEq):
            return bool(value != right.value)
        return None


def _bindings(
    callee: FunctionInfo, call: ast.Call
) -> tuple[dict[str, object], dict[str, list[str]], dict[str, str]] | None:
    """Constants, lists of the caller's models, and single models the call passes, by
    parameter name; None if an argument is anything else."""
    params = callee.params()
    consts: dict[str, object] = {}
    lists: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    pairs: list[tuple[str, ast.expr]] = []
    for name, arg in zip(params, call.args, strict=False):
        if isinstance(arg, ast.Starred):
            return None
        pairs.append((name, arg))
    if len(call.args) > len(params):
        return None
    for kw in call.keywords:
        if kw.arg is None:
            return None
        pairs.append((kw.arg, kw.value))
    for name, arg in pairs:
        if isinstance(arg, ast.Constant):
            consts[name] = arg.value
        elif isinstance(arg, ast.List | ast.Tuple):
            keys = [dotted(e) for e in arg.elts]
            if any(k is None for k in keys):
                return None
            lists[name] = [k for k in keys if k is not None]
        else:
            key = dotted(arg)
            if key is None:
                return None
            names[name] = key
    return consts, lists, names
