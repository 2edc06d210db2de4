"""Models wrapped in `DataParallel` / `DistributedDataParallel` on some path, and where
they go: returned by a function, handed to another function (of this file or, as a
project fact, of another file).

A wrapper's `state_dict()` keys carry a `module.` prefix (TD404), so what matters is
whether a name *may* hold a wrapper where its state dict is taken: the facts here are
path-insensitive on purpose ("wrapped on some path"), unlike the value lattice of the
scope interpreter, whose join forgets a wrapper that only one branch adds.
"""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.syntax import dotted, last_part
from torchdoctor.check.analysis.values import Passed, Wrap
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import child_statements, iter_children, walk_statements

WRAPPERS = frozenset({"DataParallel", "DistributedDataParallel", "DDP"})
# Methods that return the module they are called on (a wrapper stays a wrapper).
_SAME_MODULE = frozenset({"to", "cuda", "cpu", "half", "float", "double", "train", "eval"})
# An `if` that tells wrapped from plain models apart: the code already handles the prefix.
_GUARD_WORDS = re.compile(r"module|DataParallel|DDP|isinstance|hasattr")

Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Module
Parents = tuple[ast.AST, ...]


def own_statements(scope: Scope) -> list[ast.stmt]:
    """The statements of a function (or module) in source order, not those of nested
    defs and classes."""
    found: list[ast.stmt] = []
    todo = list(reversed(scope.body))
    while todo:
        stmt = todo.pop()
        found.append(stmt)
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            todo.extend(reversed(child_statements(stmt)))
    return found


def calls_with_parents(scope: Scope) -> list[tuple[ast.Call, Parents]]:
    """Every call of a scope's own code, with the nodes above it (inside the scope)."""
    out: list[tuple[ast.Call, Parents]] = []
    for stmt in scope.body:
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            _collect_calls(stmt, (), out)
    return out


def _collect_calls(node: ast.AST, parents: Parents, out: list[tuple[ast.Call, Parents]]) -> None:
    # not a closure: one that calls itself is a reference cycle for the cyclic GC
    for child in iter_children(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(child, ast.Call):
            out.append((child, (*parents, node)))
        _collect_calls(child, (*parents, node), out)


def guarded(parents: Parents) -> bool:
    """Inside an `if` that tells wrapped and plain models apart: its test looks at the
    wrapper (`hasattr(model, "module")`), or its other branch unwraps (`model.module`)."""
    for i, node in enumerate(parents):
        if not isinstance(node, ast.If | ast.IfExp):
            continue
        if _GUARD_WORDS.search(ast.unparse(node.test)):
            return True
        inside = parents[i + 1] if i + 1 < len(parents) else None
        body = node.body if isinstance(node.body, list) else [node.body]
        orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
        other = orelse if any(inside is b for b in body) else body
        if any(".module" in ast.unparse(b) for b in other):
            return True
    return False


def parameter_slots(func: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    """The parameters a call's positional arguments bind, in order (`self` left out)."""
    names = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    return names[1:] if method else names


def bound_arguments(call: ast.Call, slots: list[str]) -> list[tuple[str, ast.expr]]:
    """(parameter, argument) pairs a call binds; none after a `*args` (positions unknown)."""
    pairs: list[tuple[str, ast.expr]] = []
    for slot, arg in zip(slots, call.args, strict=False):
        if isinstance(arg, ast.Starred):
            break
        pairs.append((slot, arg))
    pairs.extend((k.arg, k.value) for k in call.keywords if k.arg in slots)
    return pairs


class FileWraps:
    """Where one file's names may hold a wrapped model."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.top: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.scopes: list[Scope] = [ctx.tree]
        self.owner: dict[int, ast.ClassDef] = {}  # id(method) -> its class
        for node in walk_statements(ctx.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.scopes.append(node)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        self.owner[id(item)] = node
        for stmt in ctx.tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self.top[stmt.name] = stmt
        self._wraps: dict[int, list[Wrap]] = {}
        self._returns: dict[int, Wrap | None] = {}
        self._class_wraps: dict[str, list[Wrap]] | None = None

    # -- what builds a wrapper ----------------------------------------------
    def wrapper(self, value: ast.expr) -> str | None:
        """`DataParallel` for `nn.DataParallel(model).cuda()` and the like."""
        while (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in _SAME_MODULE
        ):
            value = value.func.value
        if not isinstance(value, ast.Call):
            return None
        name = self.ctx.qualname(value.func) or ""
        last = last_part(name)
        if last in WRAPPERS and (name.startswith("torch.") or last != "DDP" or "DDP" in name):
            return "DistributedDataParallel" if last == "DDP" else last
        return None

    def wraps(self, scope: Scope) -> list[Wrap]:
        """Names this scope binds to a wrapper: built here (`model = DDP(model)`), or the
        result of a function of this file that returns one (`model = load_model()`)."""
        found = self._wraps.get(id(scope))
        if found is not None:
            return found
        found = self._wraps[id(scope)] = []
        for stmt in own_statements(scope):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            key = dotted(stmt.targets[0])
            if not key or key.startswith("self."):
                continue
            wrapper = self.wrapper(stmt.value)
            if wrapper is not None:
                found.append(Wrap(key, stmt.lineno, wrapper))
                continue
            returned = self._returned_by(stmt.value)
            if returned is not None:
                name = ast.unparse(stmt.value.func)  # type: ignore[attr-defined]
                origin = returned.origin or returned.line
                found.append(Wrap(key, stmt.lineno, returned.wrapper, name, origin))
        return found

    def class_wraps(self) -> dict[str, list[Wrap]]:
        """`self.model = DDP(...)` in a class's methods, by class name."""
        if self._class_wraps is None:
            self._class_wraps = {}
            for scope in self.scopes:
                cls = self.owner.get(id(scope))
                if cls is None or isinstance(scope, ast.Module):
                    continue
                for stmt in own_statements(scope):
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                        key = dotted(stmt.targets[0])
                        wrapper = self.wrapper(stmt.value)
                        if key and wrapper and key.startswith("self."):
                            self._class_wraps.setdefault(cls.name, []).append(
                                Wrap(key, stmt.lineno, wrapper)
                            )
        return self._class_wraps

    def _returned_by(self, value: ast.expr) -> Wrap | None:
        """The wrap a call of this file's function returns (on some path)."""
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
            return None
        func = self.top.get(value.func.id)
        return self.returned_wrap(func) if func is not None else None

    def returned_wrap(self, func: ast.FunctionDef | ast.AsyncFunctionDef) -> Wrap | None:
        if id(func) in self._returns:
            return self._returns[id(func)]
        self._returns[id(func)] = None  # a recursion returns nothing new
        found: Wrap | None = None
        for stmt in own_statements(func):
            if not isinstance(stmt, ast.Return) or stmt.value is None:
                continue
            wrapper = self.wrapper(stmt.value)
            if wrapper is not None:
                found = Wrap("", stmt.lineno, wrapper)
                break
            key = dotted(stmt.value)
            wrap = self.wrapped_at(func, key, stmt.lineno) if key else None
            if wrap is not None:
                found = wrap
                break
        self._returns[id(func)] = found
        return found

    # -- where a name holds one -----------------------------------------------
    def wrapped_at(self, scope: Scope, key: str, line: int) -> Wrap | None:
        """The wrap of `key` in effect at `line`, unless `key` was rebound since to
        something else (a rebinding to its own `.train()`, `.cuda()`, ... or to what a
        function of this file returns of it keeps the wrapper)."""
        wraps = list(self.wraps(scope))
        cls = self.owner.get(id(scope))
        if cls is not None:
            wraps.extend(self.class_wraps().get(cls.name, []))
        candidates = [
            w for w in wraps if w.key == key and (w.line < line or key.startswith("self."))
        ]
        if not candidates:
            return None
        wrap = max(candidates, key=lambda w: w.line)
        if key.startswith("self."):
            return wrap
        for stmt in own_statements(scope):
            if (
                wrap.line < stmt.lineno < line
                and isinstance(stmt, ast.Assign)
                and any(dotted(t) == key for t in stmt.targets)
                and self.wrapper(stmt.value) is None
                and self._returned_by(stmt.value) is None
                and not self._keeps(stmt.value, key)
            ):
                return None
        return wrap

    def _keeps(self, value: ast.expr, key: str) -> bool:
        """`model.train()`, or `warm_start(path, model)` of a function of this file that
        returns the parameter it is given `model` in."""
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        if isinstance(func, ast.Attribute) and func.attr in _SAME_MODULE:
            return dotted(func.value) == key
        if not isinstance(func, ast.Name) or func.id not in self.top:
            return False
        callee = self.top[func.id]
        given = {
            slot
            for slot, arg in bound_arguments(value, parameter_slots(callee, False))
            if dotted(arg) == key
        }
        returns = [s for s in own_statements(callee) if isinstance(s, ast.Return)]
        return (
            bool(given)
            and bool(returns)
            and all(r.value is not None and dotted(r.value) in given for r in returns)
        )

    # -- where it goes ---------------------------------------------------------
    def passed(self) -> list[tuple[ast.Call, str, Passed]]:
        """Calls that hand a wrapped name to a parameter: (call, parameter, fact)."""
        found: list[tuple[ast.Call, str, Passed]] = []
        for scope in self.scopes:
            if not self._may_hold_wraps(scope):
                continue  # wrapped_at would find nothing for any argument here
            caller = getattr(scope, "name", "<module>")
            for call, parents in calls_with_parents(scope):
                if not isinstance(call.func, ast.Name) or guarded(parents):
                    continue
                for slot, arg in self._slots(call):
                    key = dotted(arg)
                    wrap = self.wrapped_at(scope, key, call.lineno) if key else None
                    if wrap is not None:
                        found.append((call, slot, Passed(wrap, caller, call.lineno)))
        return found

    def _may_hold_wraps(self, scope: Scope) -> bool:
        cls = self.owner.get(id(scope))
        return bool(self.wraps(scope)) or (cls is not None and cls.name in self.class_wraps())

    def _slots(self, call: ast.Call) -> list[tuple[str, ast.expr]]:
        """(slot, argument): the parameter name for a function of this file, else the
        position ("0") or keyword of a call of an imported function."""
        assert isinstance(call.func, ast.Name)
        callee = self.top.get(call.func.id)
        if callee is not None:
            return bound_arguments(call, parameter_slots(callee, False))
        if call.func.id not in self.ctx.imports:
            return []
        pairs: list[tuple[str, ast.expr]] = []
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred):
                break
            pairs.append((str(i), arg))
        pairs.extend((k.arg, k.value) for k in call.keywords if k.arg)
        return pairs


def wrapped_arguments(ctx: FileContext) -> dict[str, list[tuple[str, Passed]]]:
    """Imported function name -> (slot, fact) for each call here that hands it a model
    wrapped on some path (a project fact for the file that defines the function)."""
    fw = FileWraps(ctx)
    found: dict[str, list[tuple[str, Passed]]] = {}
    for call, slot, passed in fw.passed():
        name = call.func.id  # type: ignore[attr-defined]
        if name in fw.top:
            continue
        target = ctx.imports.get(name, "")
        if target.startswith(("torch", "numpy", "os", "sys")):
            continue
        fact = Passed(passed.wrap, passed.caller, passed.line, ctx.path)
        found.setdefault(name, []).append((slot, fact))
    return found
