from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.scope_index import own_calls
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._shipped_datasets import shipped_datasets
from torchdoctor.check.rules._unpicklable import Finder, Unpicklable, local_functions
from torchdoctor.check.tree_walk import walk, walk_statements

_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
_FORK = frozenset({"fork"})
# Text of a lambda or of a function defined inside a method (two indentation levels).
_UNPICKLABLE_WORDS = ("lambda", "        def ", "\t\tdef ")


class LocalFunctionInWorker(Rule):
    """A lambda or local function in what DataLoader workers must unpickle.

    ## What it does
    Finds a `DataLoader` with `num_workers > 0` (a number, a name or `self` attribute
    bound to one, or the default of the parameter it comes from) -- also the
    `super().__init__(...)` of a `DataLoader` subclass -- whose
    `collate_fn`, `worker_init_fn` or dataset holds a lambda or a function defined inside
    another function: passed straight in, through the dataset's constructor arguments
    (`transform=transforms.Lambda(lambda x: ...)`, `Compose([...])`), through a name
    bound to any of these, or stored on `self` by a Dataset class of the same file.
    Stays quiet when the loader or the program asks for the `fork` start method
    (`multiprocessing_context="fork"`, `set_start_method("fork")`).

    Also, with no loader in sight, the torch `Dataset` classes of a package the project
    distributes (a library: see TD405 for how the package is told) that hold a lambda or
    local function: stored on `self` by their own methods, or given to their constructor
    (for a parameter `__init__` stores) by a public function of the file that returns
    the dataset (`return _Lazy(lambda: self._read(path))`). A library's users put its
    datasets in their own DataLoaders with workers, where the library cannot see.

    ## Why is this bad?
    Under the `spawn` and `forkserver` start methods, each worker receives the dataset,
    the `collate_fn` and the `worker_init_fn` pickled, and pickle cannot store a lambda
    or a local function: iterating the loader fails with `AttributeError: Can't pickle
    local object` / `Can't get local object`. `spawn` is the default on Windows and
    macOS, and `forkserver` on Linux since Python 3.14, so code that worked on an older
    Linux machine breaks elsewhere. On by default: the crash now happens on every
    platform's default.

    ## Example
    ```python
    def make_loader(ds):
        def collate(batch):
            return torch.stack(batch)
        return DataLoader(ds, batch_size=8, num_workers=4, collate_fn=collate)
    ```

    ## Use instead
    ```python
    def collate(batch):  # module level: pickled by name
        return torch.stack(batch)

    def make_loader(ds):
        return DataLoader(ds, batch_size=8, num_workers=4, collate_fn=collate)
    ```
    (`functools.partial(module_function, ...)` also pickles.)

    ## Fix safety
    No fix is offered: moving a function to module level may need the values it
    closes over as arguments.

    ## References
    - https://pytorch.org/docs/stable/data.html#platform-specific-behaviors
    - https://docs.python.org/3/library/multiprocessing.html#contexts-and-start-methods
    """

    code = "TD503"
    name = "local-function-in-worker"
    category = "data"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("num_workers", "Dataset")

    def finish(self) -> None:
        if self._forks_program():
            return
        if self.ctx.holds("num_workers"):
            self._loaders()
        if any(self.ctx.holds(word) for word in _UNPICKLABLE_WORDS):
            shipped_datasets(self.ctx, self._report_shipped)

    def _loaders(self) -> None:
        """The DataLoaders with workers the file builds, and what they are given."""
        for scope in walk_statements(self.ctx.tree):
            if not isinstance(scope, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            finder: Finder | None = None
            for node in own_calls(self.ctx, scope):
                if not self._is_loader(node, scope) or not self._has_workers(node, scope):
                    continue
                finder = finder or Finder(self.ctx, scope)
                for unpicklable, role in self._held(node, finder):
                    self._report(node, unpicklable, role)

    def _forks_program(self) -> bool:
        if "set_start_method" not in self.ctx.source:
            return False  # (a call's name holds the words its text does)
        for node in walk(self.ctx.tree):
            if (
                isinstance(node, ast.Call)
                and (self.ctx.qualname(node.func) or "").endswith("set_start_method")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in _FORK
            ):
                return True
        return False

    def _is_loader(self, call: ast.Call, scope: ast.AST) -> bool:
        name = self.ctx.qualname(call.func) or ""
        if name not in _LOADERS and name != "DataLoader" and not self._builds_base(call, scope):
            return False
        context = _keyword(call, "multiprocessing_context")
        return not (isinstance(context, ast.Constant) and context.value in _FORK)

    def _builds_base(self, call: ast.Call, scope: ast.AST) -> bool:
        """`super().__init__(...)` in the `__init__` of a DataLoader subclass: the
        loader this object is."""
        func = call.func
        if not (
            isinstance(func, ast.Attribute)
            and func.attr == "__init__"
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "super"
            and getattr(scope, "name", "") == "__init__"
        ):
            return False
        cls = next(
            (
                c
                for c in walk_statements(self.ctx.tree)
                if isinstance(c, ast.ClassDef) and any(m is scope for m in c.body)
            ),
            None,
        )
        return cls is not None and any(
            (self.ctx.qualname(base) or "") in _LOADERS for base in cls.bases
        )

    def _has_workers(self, call: ast.Call, scope: ast.AST) -> bool:
        """`num_workers` is a positive number: written there, bound to one (also on
        `self` in this function), or the default of the parameter it comes from (the
        default call has workers)."""
        value = _keyword(call, "num_workers")
        finder = Finder(self.ctx, scope)
        for _ in range(3):
            name = _bound_name(value)
            if name is None:
                break
            bound = finder.binding(name, call.lineno)
            value = bound if bound is not None else finder.default(name)
        return (
            isinstance(value, ast.Constant)
            and isinstance(value.value, int)
            and not isinstance(value.value, bool)
            and value.value > 0
        )

    def _held(self, call: ast.Call, finder: Finder) -> list[tuple[Unpicklable, str]]:
        held: list[tuple[Unpicklable, str]] = []
        for role in ("collate_fn", "worker_init_fn"):
            for u in finder.find(_keyword(call, role), call.lineno):
                held.append((u, f"`{role}`"))
        dataset = call.args[0] if call.args else _keyword(call, "dataset")
        for u in finder.find(dataset, call.lineno):
            held.append((u, "the dataset"))
        for u in self._stored_by_dataset_class(dataset, finder, call.lineno):
            held.append((u, "the dataset"))
        return held

    def _stored_by_dataset_class(
        self, dataset: ast.expr | None, finder: Finder, line: int
    ) -> list[Unpicklable]:
        """`self.f = lambda ...` in the methods of the dataset's class (same file)."""
        if isinstance(dataset, ast.Name):
            dataset = finder.binding(dataset.id, line)
        if not isinstance(dataset, ast.Call) or not isinstance(dataset.func, ast.Name):
            return []
        name = dataset.func.id
        found: list[Unpicklable] = []
        for cls in self.ctx.tree.body:
            if not (isinstance(cls, ast.ClassDef) and cls.name == name):
                continue
            for method in cls.body:
                if not isinstance(method, ast.FunctionDef):
                    continue
                nested = local_functions(method)
                for node in walk_statements(method):
                    if not isinstance(node, ast.Assign) or not any(
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                        for t in node.targets
                    ):
                        continue
                    if isinstance(node.value, ast.Lambda):
                        found.append(Unpicklable(node.value, "a lambda stored on `self`"))
                    elif isinstance(node.value, ast.Name) and node.value.id in nested:
                        found.append(
                            Unpicklable(node.value, f"the local function `{node.value.id}`")
                        )
        return found

    def _report_shipped(self, u: Unpicklable, where: str) -> None:
        self.report(
            u.node,
            f"{u.what} {where}: a DataLoader with workers gets the dataset pickled under the "
            "spawn/forkserver start method (Windows, macOS, Linux from Python 3.14), and "
            "pickle cannot store it (`Can't pickle local object`)",
            hint="use a function defined at module level (or `functools.partial` of one)",
        )

    def _report(self, loader: ast.Call, u: Unpicklable, role: str) -> None:
        self.report(
            u.node,
            f"{u.what} in {role} of the DataLoader at line {loader.lineno}, which has "
            "workers: under the spawn/forkserver start method (Windows, macOS, Linux from "
            "Python 3.14) each worker gets it pickled, and pickle cannot store it "
            "(`Can't pickle local object`)",
            hint="use a function defined at module level (or `functools.partial` of one)",
        )


def _bound_name(value: ast.expr | None) -> str | None:
    """`n` for a name `n`, `self.n` for an attribute of self."""
    if isinstance(value, ast.Name):
        return value.id
    if (
        isinstance(value, ast.Attribute)
        and isinstance(value.value, ast.Name)
        and value.value.id == "self"
    ):
        return f"self.{value.attr}"
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)
