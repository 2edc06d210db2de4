"""Datasets a library hands its users holding what pickle cannot store (TD503).

A library's users put its datasets in their own `DataLoader`s, with workers, in code
the library never sees; under the spawn/forkserver start method each worker gets the
dataset pickled. So in a file of a package the project distributes
(`analysis/library_package.py`), a torch `Dataset` class of the file holding a lambda
or a local function is a dataset that breaks there: one its methods store on `self`,
or one a public function of the file gives the class's constructor for a parameter
`__init__` stores, when that function returns the dataset (`return _Lazy(lambda:
...)`, or a name bound to it) -- the object leaves the library.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from torchdoctor.check.analysis.library_package import LibraryPackage, library_package
from torchdoctor.check.analysis.scope_index import assignments, own_calls, own_nodes
from torchdoctor.check.context import FileContext
from torchdoctor.check.rules._unpicklable import Finder, Unpicklable, statements, stored_on_self

_DATASETS = frozenset(
    {
        "torch.utils.data.Dataset",
        "torch.utils.data.IterableDataset",
        "torch.utils.data.dataset.Dataset",
        "torch.utils.data.dataset.IterableDataset",
    }
)

Report = Callable[[Unpicklable, str], None]


def shipped_datasets(ctx: FileContext, report: Report) -> None:
    """Report (what, where) for each unpicklable callable a shipped dataset holds."""
    classes = _dataset_classes(ctx)
    if not classes:
        return
    library = library_package(ctx)
    if library is None:
        return
    shipped = f"the package `{library.package}` that `{library.metadata}` distributes"
    for cls in classes.values():
        stored = stored_on_self(ctx, cls)
        for u, attr in stored.found:
            report(u, f"stored as `self.{attr}` of the dataset class `{cls.name}` of {shipped}")
        if stored.params:
            _returned_builds(ctx, cls, stored.params, library, report)


def _dataset_classes(ctx: FileContext) -> dict[str, ast.ClassDef]:
    """The file's top-level classes that are torch datasets: a base is torch's
    `Dataset`/`IterableDataset`, or such a class of the file."""
    found: dict[str, ast.ClassDef] = {}
    changed = True
    while changed:
        changed = False
        for cls in ctx.tree.body:
            if not isinstance(cls, ast.ClassDef) or cls.name in found:
                continue
            for base in cls.bases:
                name = ctx.qualname(base) or ""
                if name in _DATASETS or (isinstance(base, ast.Name) and base.id in found):
                    found[cls.name] = cls
                    changed = True
                    break
    return found


def _returned_builds(
    ctx: FileContext,
    cls: ast.ClassDef,
    stored: dict[str, str],
    library: LibraryPackage,
    report: Report,
) -> None:
    """Lambdas given to `cls(...)` for a stored parameter, in a public function of the
    file that returns the dataset it builds."""
    init = next(m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__")
    positional = [a.arg for a in init.args.args[1:]]
    for func in statements(ctx.tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) or not _public(func):
            continue
        builds = [
            c
            for c in own_calls(ctx, func)
            if isinstance(c.func, ast.Name) and c.func.id == cls.name
        ]
        returned = [c for c in builds if _returns(ctx, func, c)]
        if not returned:
            continue
        finder = Finder(ctx, func)
        for call in returned:
            given = dict(zip(positional, call.args, strict=False))
            given.update({k.arg: k.value for k in call.keywords if k.arg})
            for param, attr in stored.items():
                for u in finder.find(given.get(param), call.lineno, depth=1):
                    report(
                        u,
                        f"given to `{cls.name}(...)` (stored as `self.{attr}`), a dataset "
                        f"that `{func.name}` returns to the users of the package "
                        f"`{library.package}` that `{library.metadata}` distributes",
                    )


def _public(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Not a private helper (`_read`); dunder methods are public (`__call__`)."""
    name = func.name
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _returns(ctx: FileContext, func: ast.AST, call: ast.Call) -> bool:
    """Whether `func` returns what `call` builds: the call itself, or a name one of whose
    bindings in `func` is the call (on some path)."""
    bound = {
        name
        for name, nodes in assignments(ctx, func).items()
        if any(node.value is call for node in nodes)
    }
    for node in own_nodes(ctx, func):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            if value is call or (isinstance(value, ast.Name) and value.id in bound):
                return True
    return False
