from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterator
from typing import ClassVar

from torchdoctor.check.analysis.file_loops import project_file
from torchdoctor.check.analysis.library_package import library_package
from torchdoctor.check.analysis.module_pickles import module_pickles, reaches
from torchdoctor.check.analysis.scope_index import calls_on_lines
from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._unpicklable import Finder, Unpicklable, stored_on_self
from torchdoctor.check.tree_walk import child_statements, spans_a_line

# Methods by which a class controls how pickle stores its objects.
_PICKLE_HOOKS = frozenset({"__getstate__", "__setstate__", "__reduce__", "__reduce_ex__"})


class UnpicklableModuleAttribute(Rule):
    """A lambda or local function stored on an `nn.Module` that is pickled whole.

    ## What it does
    In a file that pickles whole modules -- `torch.save(model, ...)`, `torch.save(self,
    ...)` in a module, `pickle.dump(model, ...)` -- finds, in the file's `nn.Module`
    classes, attributes set to a lambda or a function defined inside a method
    (`self.act = lambda x: x * 2`), and lambdas or local functions given to such a class's
    constructor when the class stores that argument on `self`
    (`Lambda(lambda x: x.view(-1))` with `self.fn = fn`).

    The same in a file that writes pickling hooks (`__getstate__`, `__setstate__`,
    `__reduce__`) for one class of a family: its other classes that share a base of the
    project (and define no hook of their own) are pickled too.

    The same, with no pickling in sight, for the module classes of a package the project
    distributes -- a library: the project has packaging metadata (`setup.py`, a
    `pyproject.toml` with a `[project]` or `[tool.poetry]` table, a `setup.cfg` with
    `[metadata]`/`[options]`) beside the top package, and the file lies in that package
    (every folder up to it holds an `__init__.py`; not under `tests/`, `examples/`,
    `scripts/`, `benchmarks/`, `docs/`). A library's users pickle its models whole in
    code the library never sees: `torch.save(model)`, a `multiprocessing` spawn that
    sends the model to its processes, Lightning's `ddp_spawn`, frameworks that save
    whole models; the library cannot know they will not. A class that writes its own
    pickling hooks is left alone (they may drop what pickle cannot store).
    There, a module-level lambda of the library (`sparsemoid = lambda x: ...`) is
    found too when a module class of a file beside it stores it as the default of a
    constructor parameter (`def __init__(self, fn=sparsemoid): self.fn = fn`).

    Other files that pickle no whole module are left alone: a lambda on an
    application's module whose `state_dict()` is saved is harmless.

    ## Why is this bad?
    Pickling a module pickles its `__dict__`, attributes included, and pickle cannot
    store a lambda or a local function: `torch.save(model, path)` fails with
    `AttributeError: Can't pickle local object 'Net.__init__.<locals>.<lambda>'`
    (or `PicklingError: Can't pickle <function <lambda>>`) -- typically at the end of
    the first epoch, when the first checkpoint is written -- or, for a library's model,
    in its users' programs, where the fix is not theirs to make. On by default: with
    the whole-model save in the program, or a library shipping the module, it fails as
    soon as the module is pickled.

    ## Example
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.act = lambda x: x.clamp(min=0)

    torch.save(Net(), "net.pt")
    ```

    ## Use instead
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.act = nn.ReLU()        # or a method, or a module-level function

    torch.save(Net().state_dict(), "net.pt")
    ```

    ## Fix safety
    No fix is offered.

    ## References
    - https://docs.python.org/3/library/pickle.html#what-can-be-pickled-and-unpickled
    - https://pytorch.org/tutorials/beginner/saving_loading_models.html
    """

    code = "TD405"
    name = "unpicklable-module-attribute"
    category = "checkpoint"
    severity = Severity.ERROR
    # a lambda, or a function defined inside a method (two indentation levels deep)
    triggers: ClassVar[tuple[str, ...]] = ("lambda", "        def ", "\t\tdef ")

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._reported: set[int] = set()  # the nodes reported (ids)
        self._elsewhere: dict[str, str] | None = None  # _project_pickles, once asked

    def finish(self) -> None:
        saved = next(iter(module_pickles(self.ctx)), None)
        families = self._pickled_families()
        if saved is None and not families:
            self._lambdas_stored_beside()
        if not self.ctx.holds("class"):
            return
        for cls in _classes(self.ctx.tree, self.ctx.lines_holding(["class"])):
            module_class = self.ctx.is_module_class(cls)
            if not (module_class or cls.name in families):
                continue
            stored = stored_on_self(self.ctx, cls)
            if not (stored.found or stored.params):
                continue  # nothing to report: why it is pickled is not asked
            if saved is not None and module_class:
                why = (
                    f"`{self.ctx.segment(saved.call.func)}` at line {saved.call.lineno} "
                    "pickles the whole module"
                )
            elif cls.name in families:
                why = families[cls.name]
            else:
                elsewhere = self._project_pickles()
                why = elsewhere.get(cls.name) or elsewhere.get("", "") or self._shipped(cls)
                if not why:
                    continue
            for u, attr in stored.found:
                self._report(u, f"`self.{attr}` of `{cls.name}`", why)
            if stored.params:
                self._constructor_arguments(cls, stored.params, why)

    def _project_pickles(self) -> dict[str, str]:
        if self._elsewhere is None:
            self._elsewhere = self._read_project_pickles()
        return self._elsewhere

    def _read_project_pickles(self) -> dict[str, str]:
        """Module class ("" for any) -> why, from the whole-module pickles of the project's
        other files: a pickled `Net()` is a `Net`; a pickled module of a class the code
        does not show (a `model` parameter, `registry[name](...)`) may be any model the
        saving program uses, so a lambda stored on any of them breaks that save. Only
        pickles whose program reaches this file count (`reaches`: the saving file's
        folder and the packages it imports; not a sibling example's folder)."""
        found: dict[str, str] = {}
        for where, text, cls, imported in self.ctx.project.module_pickles:
            path, _, line = where.rpartition(":")
            if path == self.ctx.path or not reaches(path, imported, self.ctx.path):
                continue
            place = f"`{text}` ({self._relative(path)} line {line})"
            found.setdefault(
                cls,
                f"{place} pickles `{cls}` modules whole"
                if cls
                else f"{place} pickles whole models of this project",
            )
        return found

    def _lambdas_stored_beside(self) -> None:
        """This library file's module-level lambdas (`sparsemoid = lambda x: ...`) that a
        module class of a file beside it (same folder) takes as the default of a
        constructor parameter it stores (`def __init__(self, fn=sparsemoid): self.fn =
        fn`, `sparsemoid` imported from here): every default-built module holds it."""
        lambdas: dict[str, ast.expr] = {
            target.id: stmt.value
            for stmt in self.ctx.tree.body
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Lambda)
            for target in stmt.targets
            if isinstance(target, ast.Name)
        }
        if not lambdas or not self.ctx.path or library_package(self.ctx) is None:
            return
        if self._project_pickles():
            return  # the project's own pickles are reported as such
        here = os.path.abspath(self.ctx.path)
        stem = os.path.splitext(os.path.basename(here))[0]
        for path in sorted(self.ctx.project.paths):
            other = os.path.abspath(path)
            if other == here or os.path.dirname(other) != os.path.dirname(here):
                continue
            if not _mentions(path, stem, lambdas):
                continue
            loaded = project_file(self.ctx, path)
            if loaded is None or library_package(loaded.ctx) is None:
                continue
            for name, cls, param, attr, line in _stored_defaults(loaded.ctx, stem, lambdas):
                where = f"`{cls}` ({self._relative(path)} line {line})"
                self._report(
                    Unpicklable(lambdas[name], f"`{name}`, a lambda,"),
                    f"`self.{attr}` by {where}, the default of its `{param}`",
                    self._shipped_why(cls, loaded.ctx),
                )

    def _shipped(self, cls: ast.ClassDef) -> str:
        """Why `cls` is pickled when the project shows no pickling: it is a module of a
        package the project distributes (a library), whose users pickle models whole in
        code the library never sees; "" otherwise, or when the class writes its own
        pickling hooks (they may drop what pickle cannot store)."""
        if any(isinstance(m, ast.FunctionDef) and m.name in _PICKLE_HOOKS for m in cls.body):
            return ""
        return self._shipped_why(cls.name, self.ctx)

    def _shipped_why(self, cls: str, ctx: FileContext) -> str:
        library = library_package(ctx)
        if library is None:
            return ""
        return (
            f"`{cls}` is a module of the package `{library.package}` that "
            f"`{library.metadata}` distributes: the library's users pickle its modules "
            "whole (`torch.save(model)`, multiprocessing spawn, checkpoints) in code the "
            "library does not see"
        )

    def _relative(self, path: str) -> str:
        root = self.ctx.project.root
        if root and os.path.abspath(path).startswith(os.path.abspath(root) + os.sep):
            return os.path.relpath(os.path.abspath(path), os.path.abspath(root))
        return path

    def _pickled_families(self) -> dict[str, str]:
        """Classes of this file whose objects the file shows are pickled: a class that
        shares a base of the project with one defining `__getstate__`/`__setstate__`
        (the file writes pickling hooks for that family), but defines none itself
        (its own hook may drop what pickle cannot store). Class name -> why."""
        if "state__" not in self.ctx.source and "__reduce" not in self.ctx.source:
            return {}
        classes = [c for c in self.ctx.tree.body if isinstance(c, ast.ClassDef)]
        hooked: dict[str, tuple[str, int]] = {}  # class -> (hook, line)
        for cls in classes:
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name in _PICKLE_HOOKS:
                    hooked.setdefault(cls.name, (item.name, item.lineno))
        found: dict[str, str] = {}
        for hook_cls in classes:
            if hook_cls.name not in hooked:
                continue
            bases = _project_bases(hook_cls, self.ctx.qualname)
            hook, line = hooked[hook_cls.name]
            for cls in classes:
                if cls.name in hooked or cls.name in found:
                    continue
                shared = bases & _project_bases(cls, self.ctx.qualname)
                if shared:
                    found[cls.name] = (
                        f"`{hook_cls.name}.{hook}` at line {line} shows that this file's "
                        f"`{sorted(shared)[0]}` objects are pickled"
                    )
        return found

    def _constructor_arguments(self, cls: ast.ClassDef, stored: dict[str, str], why: str) -> None:
        """Lambdas given to `cls(...)` for a parameter that `__init__` stores on self, or
        to the constructor of a subclass of the file that inherits that `__init__`."""
        init = next(m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__")
        positional = [a.arg for a in init.args.args[1:]]
        names = _inheriting(self.ctx.tree, cls)
        for scope, call in calls_on_lines(self.ctx, self.ctx.lines_holding(sorted(names))):
            if not (isinstance(call.func, ast.Name) and call.func.id in names):
                continue
            finder = Finder(self.ctx, scope)
            given = dict(zip(positional, call.args, strict=False))
            given.update({k.arg: k.value for k in call.keywords if k.arg})
            for param, attr in stored.items():
                for u in finder.find(given.get(param), call.lineno, depth=1):
                    self._report(u, f"`self.{attr}` of `{call.func.id}`", why)

    def _report(self, u: Unpicklable, where: str, why: str) -> None:
        # `self.tail = Wrap(fn)` stores `fn` twice (as `tail`'s and as `Wrap`'s): once
        if id(u.node) in self._reported:
            return
        self._reported.add(id(u.node))
        self.report(
            u.node,
            f"{u.what} stored as {where}, and {why}: pickle cannot store it "
            "(`Can't pickle local object`)",
            hint="use a module (`nn.ReLU()`), a method or a module-level function; or save "
            "`state_dict()`",
        )


def _classes(tree: ast.Module, lines: list[int]) -> Iterator[ast.ClassDef]:
    """The classes of `statements(tree)`, in its order, found by entering only the
    statements that span one of `lines`, the lines holding `class`: a class statement
    spans its `class` line, and so does every statement around it."""
    todo = [stmt for stmt in tree.body if spans_a_line(stmt, lines)]
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, ast.ClassDef):
            yield stmt
        todo.extend(s for s in child_statements(stmt) if spans_a_line(s, lines))


def _project_bases(cls: ast.ClassDef, qualname: Callable[[ast.expr], str | None]) -> set[str]:
    """The bases of `cls` that are classes of the project (not torch's, not `object`)."""
    found: set[str] = set()
    for base in cls.bases:
        name = qualname(base) or ""
        if name and name != "object" and not name.startswith(("torch.", "typing.", "abc.")):
            found.add(name)
    return found


def _inheriting(tree: ast.Module, cls: ast.ClassDef) -> set[str]:
    """`cls` and the classes of the file that subclass it without their own `__init__`
    (`class LambdaMap(LambdaBase)`): building one runs `cls.__init__`."""
    names = {cls.name}
    classes = [c for c in tree.body if isinstance(c, ast.ClassDef)]
    changed = True
    while changed:
        changed = False
        for sub in classes:
            if sub.name in names or any(
                isinstance(m, ast.FunctionDef) and m.name == "__init__" for m in sub.body
            ):
                continue
            if any(isinstance(b, ast.Name) and b.id in names for b in sub.bases):
                names.add(sub.name)
                changed = True
    return names


def _mentions(path: str, stem: str, names: dict[str, ast.expr]) -> bool:
    """Whether the file's text names the module `stem` and one of `names` (a cheap
    gate before parsing it)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return False
    return stem in text and any(name in text for name in names)


def _stored_defaults(
    ctx: FileContext, stem: str, names: dict[str, ast.expr]
) -> Iterator[tuple[str, str, str, str, int]]:
    """(name, class, parameter, attribute, line) for each module class of `ctx` whose
    `__init__` stores a parameter whose default is one of `names`, imported from the
    module `stem`."""
    for cls in ctx.tree.body:
        if not isinstance(cls, ast.ClassDef) or not ctx.is_module_class(cls):
            continue
        init = next(
            (m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None
        )
        if init is None:
            continue
        finder = Finder(ctx, init)
        for param, attr in stored_on_self(ctx, cls).params.items():
            default = finder.default(param)
            if not (isinstance(default, ast.Name) and default.id in names):
                continue
            target = ctx.imports.get(default.id, "")
            if target.rsplit(".", 2)[-2:] == [stem, default.id]:
                yield default.id, cls.name, param, attr, default.lineno
