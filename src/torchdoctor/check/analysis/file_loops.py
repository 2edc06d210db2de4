"""The training-loop facts of one file, and of the sibling files it imports."""

from __future__ import annotations

import ast
import os
import re
from collections import OrderedDict
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.event_collector import _EventCollector, classify_call
from torchdoctor.check.analysis.events import BACKWARD, CALL, SCALER_STEP, STEP, ZERO, Event
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import _MISSING, _MODE_SENSITIVE, post_order_calls
from torchdoctor.check.analysis.loop_index import LoopIndex
from torchdoctor.check.analysis.mode_class import held_models, init_helpers
from torchdoctor.check.analysis.mode_gate import may_run_model
from torchdoctor.check.analysis.mode_state import ModeResult, Origin, Summary
from torchdoctor.check.analysis.modes import ModeInterpreter
from torchdoctor.check.analysis.module_paths import record_dependency, sibling_path
from torchdoctor.check.analysis.overrides import sole_override
from torchdoctor.check.analysis.syntax import last_part
from torchdoctor.check.context import FileContext
from torchdoctor.check.lines import as_lf
from torchdoctor.check.parsed_trees import keep, take
from torchdoctor.check.source_text import decode_source
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    pass


# `target = value` at the start of a line (not `==`, not `+=`): target and value
_LINE_ASSIGNMENT = re.compile(r"(?m)^[ \t]*([^\s=]+)[ \t]*=(?!=)[ \t]*(.*)$")


class FileLoops(LoopIndex):
    """The shared, lazily computed training-loop facts of one file."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._events: dict[int, list[Event]] = {}
        self._modes: dict[int, ModeResult] = {}
        self._summaries: dict[int, Summary | None] = {}
        self._backward_params: dict[int, frozenset[str]] = {}
        self._held: dict[int, dict[str, Origin]] = {}
        self._overrides: dict[tuple[str, str], FunctionInfo | None] = {}
        self._assigned: dict[str, list[str]] | None = None
        self._may_run: dict[int, bool] = {}
        self._construction: dict[int, tuple[FunctionInfo | None, frozenset[str]]] = {}

    def release(self) -> None:
        """Break the cycles (each function refers to this file, callers to callees,
        summaries to their file) so that reference counting frees the syntax tree."""
        for fi in (self.module, *self.functions):
            vars(fi).clear()
        vars(self).clear()
        while _EVICTED:
            sibling = _EVICTED.pop()
            if sibling is not self:
                sibling.ctx.close()
                sibling.release()

    def callers(self, fi: FunctionInfo) -> list[tuple[FunctionInfo, Event]]:
        """The calls of `fi` in this file, with the function each is in."""
        found: list[tuple[FunctionInfo, Event]] = []
        if fi.is_module or fi.file is not self:
            return found
        needle = fi.name + "("
        for other in self.all_functions():
            if needle not in other.text:
                continue
            for event in self.events(other):
                call = event.node
                if event.kind != CALL or not isinstance(call, ast.Call):
                    continue
                func = call.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name != fi.name:
                    continue
                resolved = self.resolve(other, call, other_files=False)
                if resolved is not None and resolved[0] is fi:
                    found.append((other, event))
        return found

    # -- resolution ----------------------------------------------------------------
    # -- does train/eval mode change what a model computes? --------------------------
    def class_mode_sensitive(self, name: str, _depth: int = 0) -> bool | None:
        """True: class `name` has Dropout/BatchNorm/...; False: provably none; None: unknown."""
        found = self._sensitive.get(name, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        self._sensitive[name] = None  # recursion guard
        result = self._class_sensitive(name, _depth)
        self._sensitive[name] = result
        return result

    def _class_sensitive(self, name: str, depth: int) -> bool | None:
        cls = self.classes.get(name)
        owner: FileLoops = self
        if cls is None:
            target = self.ctx.imports.get(name)
            if target and "." in target.lstrip(".") and depth < 2:
                module, _, cname = target.rpartition(".")
                other = sibling_file(self.ctx, module)
                if other is not None and cname in other.classes:
                    return other.class_mode_sensitive(cname, depth + 1)
            return None
        text = owner.ctx.segment(cls)
        if _MODE_SENSITIVE.search(text):
            return True
        verdict: bool | None = False
        for base in cls.bases:
            bname = owner.ctx.qualname(base) or ""
            if bname.startswith("torch.") or bname in ("object", "Module"):
                continue
            sub = owner.class_mode_sensitive(last_part(bname), depth + 1)
            if sub:
                return True
            if sub is None:
                verdict = None
        for node in walk(cls):
            if not isinstance(node, ast.Call):
                continue
            cname = owner.ctx.qualname(node.func) or ""
            last = last_part(cname)
            if cname.startswith("torch.") or not last[:1].isupper() or last == name:
                continue
            sub = owner.class_mode_sensitive(last, depth + 1)
            if sub:
                return True
            if sub is None and (
                last in owner.ctx.project.module_classes or last not in owner.classes
            ):
                verdict = None  # an imported or unseen layer: it may have Dropout
        if _holds_given_modules(owner.ctx, cls):
            verdict = None  # nn.ModuleList(encoders): layers the caller chose
        for node in walk(cls):
            # self.backbone = resnet18(): a module from a factory we cannot see
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and any(isinstance(t, ast.Attribute) for t in node.targets)
            ):
                cname = owner.ctx.qualname(node.value.func) or ""
                if not cname.startswith(("torch.", "self.")) and not last_part(cname)[:1].isupper():
                    verdict = None
        return verdict

    def _line_assignments(self) -> dict[str, list[str]]:
        """`target` -> the text after `=` of each line `target = ...` (a text index, one
        pass for every key asked about)."""
        if self._assigned is None:
            self._assigned = {}
            for m in _LINE_ASSIGNMENT.finditer(as_lf(self.ctx.source)):
                self._assigned.setdefault(m.group(1), []).append(m.group(2))
        return self._assigned

    def key_mode_sensitive(self, key: str) -> bool | None:
        """Same question for a variable, from every `key = Class(...)` in the file."""
        classes = set()
        plain_layers = False
        for value in self._line_assignments().get(key, ()):
            call = re.match(r"([\w.]+)\(", value)
            if call is None:
                return None  # assigned from something we cannot follow
            name = last_part(call.group(1))
            if name in (
                *("DataParallel", "DistributedDataParallel", "DDP", "compile"),
                *("to", "cuda", "cpu", "half", "float"),  # Module methods that return self
            ):
                continue
            head, _, rest = call.group(1).partition(".")
            qual = self.ctx.imports.get(head, head) + ("." + rest if rest else "")
            if qual.startswith("torch.nn.") and name not in (
                "Sequential",
                "ModuleList",
                "ModuleDict",
            ):
                if _MODE_SENSITIVE.search(value):
                    return True  # nn.Dropout(...), nn.LSTM(..., dropout=0.5)
                plain_layers = True
                continue  # nn.Linear, nn.Conv2d, nn.LSTM: the same in both modes
            if not name[:1].isupper() and name not in self.classes:
                return None  # a factory: get_model(...), resnet18(...)
            classes.add(name)
        if not classes:
            return False if plain_layers else None
        verdicts = [self.class_mode_sensitive(c) for c in classes]
        if any(verdicts):
            return True
        return None if None in verdicts else False

    def resolve(
        self,
        fi: FunctionInfo,
        call: ast.Call,
        *,
        other_files: bool = True,
        by_tail: bool = False,
    ) -> tuple[FunctionInfo, bool] | None:
        """The function `call` runs, and whether it is called as a method on `self`.

        With `other_files`, names imported from a sibling module are looked up there
        (which parses that file once); otherwise only this file is searched. With
        `by_tail`, an import the folders beside the file do not resolve is looked up
        in the project by its dotted path's tail (`sibling_file`; may parse one more
        file: asked only where a rule has already found what it needs the callee for).
        """
        func = call.func
        if isinstance(func, ast.Name):
            scope: FunctionInfo | None = fi
            while scope is not None:
                if func.id in scope.nested:
                    return scope.nested[func.id], False
                scope = scope.parent
            if func.id in self.top:
                return self.top[func.id], False
            target = self.ctx.imports.get(func.id)
            # CapWords names are classes: constructing one runs no code we summarise
            if other_files and target and "." in target.lstrip(".") and func.id[:1].islower():
                module, _, name = target.rpartition(".")
                other = sibling_file(self.ctx, module, by_tail)
                if other is not None and name in other.top:
                    return other.top[name], False
            return None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self":
                scope = fi
                while scope is not None and scope.cls is None:
                    scope = scope.parent
                if scope is not None and scope.cls is not None:
                    method = self.methods.get(scope.cls.name, {}).get(func.attr)
                    if method is not None:
                        return method, True
                return None
            target = self.ctx.imports.get(owner)
            if other_files and target is not None and func.attr[:1].islower():
                other = sibling_file(self.ctx, target, by_tail)
                if other is not None and func.attr in other.top:
                    return other.top[func.attr], False
        return None

    def backward_params(self, fi: FunctionInfo) -> frozenset[str]:
        """Parameters `fi` runs backward() on itself (`def _backward(self, loss, opt):
        loss.backward()`) and that it neither steps nor zeroes for: a call of it is that
        backward() in its caller's loop."""
        found = self._backward_params.get(id(fi))
        if found is None:
            found = frozenset()
            if not fi.is_module and _may_call_backward(fi.text, fi.name):
                params = set(fi.params())
                names: set[str] = set()
                for stmt in fi.own_statements():
                    for call in post_order_calls(stmt):
                        kind, info = classify_call(self.ctx, call)
                        if kind in (STEP, SCALER_STEP, ZERO):
                            names = set()
                            break
                        expr = info.get("expr")
                        if kind == BACKWARD and isinstance(expr, ast.Name) and expr.id in params:
                            names.add(expr.id)
                    else:
                        continue
                    break
                found = frozenset(names)
            self._backward_params[id(fi)] = found
        return found

    # -- lazily computed per function -------------------------------------------------
    def events(self, fi: FunctionInfo) -> list[Event]:
        cached = self._events.get(id(fi))
        if cached is None:
            cached = _EventCollector(self, fi).run()
            self._events[id(fi)] = cached
        return cached

    def modes(self, fi: FunctionInfo) -> ModeResult:
        cached = self._modes.get(id(fi))
        if cached is None:
            cached = ModeInterpreter(self, fi, entry=not fi.is_module).run()
            self._modes[id(fi)] = cached
        return cached

    def may_run_model(self, fi: FunctionInfo) -> bool:
        """False only if `modes(fi)` certainly holds no model run and no training step
        (analysis/mode_gate.py): a cheap test read before interpreting `fi`."""
        return may_run_model(self, fi, self._may_run)

    def construction(self, cls: ast.ClassDef) -> tuple[FunctionInfo | None, frozenset[str]]:
        """The class's `__init__` and the methods that run while it is built (its name and
        those `__init__` calls on `self`: `mode_class.init_helpers`)."""
        found = self._construction.get(id(cls))
        if found is None:
            methods = [f for f in self.all_functions() if f.cls is cls]
            init = next((m for m in methods if m.name == "__init__"), None)
            found = self._construction[id(cls)] = (init, init_helpers(methods))
        return found

    def held_models(self, cls: ast.ClassDef) -> dict[str, Origin]:
        """Models a plain class builds in `__init__` and whose mode nothing changes."""
        found = self._held.get(id(cls))
        if found is None:
            self._held[id(cls)] = {}  # recursion guard
            found = held_models(self, cls)
            self._held[id(cls)] = found
        return found

    def summary(self, fi: FunctionInfo) -> Summary | None:
        """What calling `fi` does to its arguments' modes; None while being computed."""
        key = id(fi)
        if key in self._summaries:
            return self._summaries[key]
        self._summaries[key] = None  # recursion guard
        result = self.modes(fi).summary()
        self._summaries[key] = result
        return result

    def sole_override(self, fi: FunctionInfo) -> FunctionInfo | None:
        """For an abstract method `fi`, the one subclass definition of it in the project
        (analysis/overrides.py), read from its file; None otherwise."""
        here = os.path.abspath(self.ctx.path)

        def load(path: str) -> FileLoops | None:
            return self if os.path.abspath(path) == here else project_file(self.ctx, path)

        return sole_override(fi, self.ctx.project, load, self._overrides)


def _may_call_backward(text: str, name: str) -> bool:
    """`backward(` in a function's text, and the word after its name (a `def backward(`
    line alone holds no call; an attribute call has the word whatever spaces follow)."""
    return "backward(" in text and text.find("backward", text.find(name) + len(name)) >= 0


def file_of(fi: FunctionInfo) -> FileLoops:
    """The FileLoops `fi` belongs to (the file's own, or a sibling's)."""
    assert isinstance(fi.file, FileLoops)  # FileLoops makes every FunctionInfo
    return fi.file


_SIBLINGS: OrderedDict[tuple[str, int, int], FileLoops | None] = OrderedDict()


_SIBLING_LIMIT = 64


# Siblings dropped from the cache while a file is checked: the analysis in progress may
# still be using them, so they are released (their cycles broken) with that file.
_EVICTED: list[FileLoops] = []


_MAX_SIBLING_BYTES = 400_000


def sibling_file(ctx: FileContext, module: str, by_tail: bool = False) -> FileLoops | None:
    """The analysed file a dotted import names, looked up beside the checked file (and,
    `by_tail`, the one project file whose path ends like it)."""
    path = sibling_path(ctx, module, by_tail)
    return project_file(ctx, path) if path is not None else None


def project_file(ctx: FileContext, path: str) -> FileLoops | None:
    """Another file of the checked project (a path the project index names), analysed;
    recorded as one the checked file's findings depend on."""
    if os.path.abspath(path) == os.path.abspath(ctx.path):
        return None
    record_dependency(path)
    return _load_sibling(path, ctx)


def _load_sibling(path: str, ctx: FileContext) -> FileLoops | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if _SIBLINGS_OF and _SIBLINGS_OF[0] is not ctx.project:
        _forget_siblings()
    _SIBLINGS_OF[:] = [ctx.project]
    key = (path, st.st_mtime_ns, st.st_size)
    if key in _SIBLINGS:
        _SIBLINGS.move_to_end(key)
        return _SIBLINGS[key]
    result: FileLoops | None = None
    if st.st_size <= _MAX_SIBLING_BYTES:
        try:
            with open(path, "rb") as handle:
                data = handle.read()

            source = decode_source(data)
            tree = take(path, source) or ast.parse(source, filename=path)
            keep(path, source, tree)  # for the check of this file, if the run checks it
            result = FileLoops(FileContext(path, source, tree, ctx.project))
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
            result = None
    _SIBLINGS[key] = result
    if len(_SIBLINGS) > _SIBLING_LIMIT:
        evicted = _SIBLINGS.popitem(last=False)[1]
        if evicted is not None:
            _EVICTED.append(evicted)
    return result


def _forget_siblings() -> None:
    """Drop the siblings read for another project: their facts (call facts, classes of
    other files) are that project's, so a second run in one process (an editor server,
    the tests) must read them again. Released with the next checked file."""
    for sibling in _SIBLINGS.values():
        if sibling is not None:
            _EVICTED.append(sibling)
    _SIBLINGS.clear()


# The project the siblings above were read for (a run checks one project).
_SIBLINGS_OF: list[object] = []


def analysis(ctx: FileContext) -> FileLoops:
    """The shared training-loop facts of the file being checked (computed once, kept
    on the context so they go with it)."""
    return ctx.shared("loops", FileLoops)


_CONTAINERS = frozenset({"torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.nn.Sequential"})


def _holds_given_modules(ctx: FileContext, cls: ast.ClassDef) -> bool:
    """The class keeps modules its caller passes in: a parameter wrapped in
    `nn.ModuleList` / `nn.ModuleDict` / `nn.Sequential`, or one annotated as a module."""
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = method.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        every += [a for a in (args.vararg, args.kwarg) if a is not None]
        params = {a.arg for a in every} - {"self"}
        for a in every:
            if a.annotation is not None and "Module" in ast.unparse(a.annotation):
                return True
        for node in walk(method):
            if (
                isinstance(node, ast.Call)
                and ctx.qualname(node.func) in _CONTAINERS
                and any(_given(arg, params) for arg in node.args)
            ):
                return True
    return False


def _given(arg: ast.expr, params: set[str]) -> bool:
    """`encoders`, `*blocks`, `[encoder, head]`, `[m for m in encoders]`: modules that
    are the parameters themselves (not `[nn.Linear(width, width) for ...]`)."""
    if isinstance(arg, ast.Starred):
        arg = arg.value
    if isinstance(arg, ast.Name):
        return arg.id in params
    if isinstance(arg, ast.List | ast.Tuple):
        return any(_given(e, params) for e in arg.elts)
    if isinstance(arg, ast.ListComp | ast.GeneratorExp) and isinstance(arg.elt, ast.Name):
        return any(_given(g.iter, params) for g in arg.generators)
    return False
