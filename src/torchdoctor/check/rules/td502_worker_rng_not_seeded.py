from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import ClassVar

from torchdoctor.check.analysis.file_loops import FileLoops, analysis, sibling_file
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules.td501_workers_without_main_guard import is_dataloader, workers_of
from torchdoctor.check.tree_walk import walk

# Generator objects: their state is copied into every worker process.
_GENERATORS = frozenset(
    {
        "numpy.random.default_rng",
        "numpy.random.RandomState",
        "numpy.random.Generator",
        "random.Random",
        "torch.Generator",
    }
)


@dataclass(frozen=True)
class SharedRng:
    attr: str  # "self.rng" or a module-level name
    line: int
    made_by: str  # "np.random.default_rng(0)"
    cls: str


class WorkerRngNotSeeded(Rule):
    """A Dataset draws from a random generator that every DataLoader worker copies.

    ## What it does
    Finds Datasets whose `__getitem__` / `__iter__` (or a method they call) draw
    from a generator object created once -- `self.rng = np.random.default_rng(...)`,
    `np.random.RandomState(...)`, `random.Random(...)`, `torch.Generator()` in
    `__init__`, or such a generator at module level -- and that are loaded by a
    `DataLoader` with `num_workers > 0` (or a variable) and no `worker_init_fn`.

    The global `random` and `numpy.random` functions are not reported: since
    PyTorch 1.9 each worker reseeds them (and `torch`) from the loader's base seed.

    ## Why is this bad?
    Each worker process receives a copy of the dataset, generator state included,
    so all N workers produce the same "random" sequence: with 4 workers, every
    random crop, flip, noise draw or negative sample repeats 4 times per epoch,
    and the effective amount of augmentation drops by a factor of 4. With
    `persistent_workers=False` the copies are made again every epoch from the same
    state, so every epoch repeats the previous one as well. Nothing fails; the
    model just generalises worse.

    ## Example
    ```python
    class Noisy(Dataset):
        def __init__(self):
            self.rng = np.random.default_rng(0)
        def __getitem__(self, i):
            return self.data[i] + self.rng.normal(size=3)

    loader = DataLoader(Noisy(), num_workers=4)
    ```

    ## Use instead
    ```python
    def seed_worker(worker_id):
        info = torch.utils.data.get_worker_info()
        info.dataset.rng = np.random.default_rng(info.seed % 2**32)

    loader = DataLoader(Noisy(), num_workers=4, worker_init_fn=seed_worker)
    ```
    or draw from `torch` / the global `numpy.random` inside `__getitem__`, which
    the DataLoader seeds per worker.

    ## References
    - https://pytorch.org/docs/stable/data.html#randomness-in-multi-process-data-loading
    - https://pytorch.org/docs/stable/notes/randomness.html#dataloader
    """

    code = "TD502"
    name = "worker-rng-not-seeded"
    category = "data"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("num_workers",)

    def finish(self) -> None:
        ctx = self.ctx
        if "DataLoader" not in ctx.source:
            return
        fl = analysis(ctx)
        for fi in fl.all_functions():
            if "DataLoader" not in fi.text:
                continue
            for stmt in fi.own_statements():
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                for call in _shallow_calls(stmt):
                    if not is_dataloader(ctx.qualname(call.func)):
                        continue
                    workers = workers_of(call)
                    if workers is None or any(
                        kw.arg in ("worker_init_fn", None) for kw in call.keywords
                    ):
                        continue
                    dataset = _dataset_arg(call)
                    cls = _dataset_class(fl, fi, dataset, call.lineno) if dataset else None
                    if cls is None:
                        continue
                    owner, classdef = cls
                    shared = _shared_rng(owner, classdef)
                    if shared is None:
                        continue
                    where = "" if owner is fl else f" ({owner.ctx.path.rsplit('/', 1)[-1]})"
                    self.report(
                        call,
                        f"`DataLoader(..., num_workers={ctx.segment(workers)})` at line "
                        f"{call.lineno} copies `{shared.cls}`'s `{shared.attr}` "
                        f"(`{shared.made_by}`, line {shared.line}{where}) into every worker: "
                        "all workers draw the same random numbers",
                        hint="reseed it per worker in a `worker_init_fn` (from "
                        "`torch.utils.data.get_worker_info().seed`), or draw from torch / "
                        "the global numpy.random, which the DataLoader seeds per worker",
                    )


def _shallow_calls(stmt: ast.stmt) -> list[ast.Call]:
    out: list[ast.Call] = []
    for name, value in ast.iter_fields(stmt):
        if name in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        for node in value if isinstance(value, list) else [value]:
            if isinstance(node, ast.AST):
                out.extend(n for n in walk(node) if isinstance(n, ast.Call))
    return out


def _dataset_arg(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((kw.value for kw in call.keywords if kw.arg == "dataset"), None)


def _dataset_class(
    fl: FileLoops, fi: FunctionInfo, expr: ast.expr, line: int
) -> tuple[FileLoops, ast.ClassDef] | None:
    """The Dataset class `expr` is an instance of: `Noisy(...)`, or a name assigned one."""
    if isinstance(expr, ast.Name):
        value = None
        for scope in (fi, fl.module):
            for stmt in scope.own_statements():
                if (
                    isinstance(stmt, ast.Assign)
                    and stmt.lineno < line
                    and any(dotted(t) == expr.id for t in stmt.targets)
                ):
                    value = stmt.value
            if value is not None:
                break
        if value is None:
            return None
        expr = value
    if not isinstance(expr, ast.Call):
        return None
    name = dotted(expr.func)
    if name is None:
        return None
    if name in fl.classes:
        return fl, fl.classes[name]
    target = fl.ctx.imports.get(name)
    if target and "." in target.lstrip("."):
        module, _, cname = target.rpartition(".")
        other = sibling_file(fl.ctx, module)
        if other is not None and cname in other.classes:
            return other, other.classes[cname]
    return None


def _makes_generator(ctx: FileContext, value: ast.expr) -> bool:
    """`np.random.default_rng(0)`, `torch.Generator().manual_seed(0)`, `random.Random(1)`."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in ("manual_seed", "seed")
        and isinstance(value.func.value, ast.Call)
    ):
        value = value.func.value
    return isinstance(value, ast.Call) and (ctx.qualname(value.func) or "") in _GENERATORS


def _shared_rng(fl: FileLoops, cls: ast.ClassDef) -> SharedRng | None:
    """A generator made once (in `__init__` or at module level) and drawn from per item."""
    ctx = fl.ctx
    made: dict[str, tuple[int, str]] = {}
    methods = fl.methods.get(cls.name, {})
    init = methods.get("__init__")
    if init is not None:
        for stmt in init.own_statements():
            if isinstance(stmt, ast.Assign) and _makes_generator(ctx, stmt.value):
                for target in stmt.targets:
                    key = dotted(target)
                    if key and key.startswith("self."):
                        made[key] = (stmt.lineno, ctx.segment(stmt.value))
    for stmt in fl.module.body:
        if isinstance(stmt, ast.Assign) and _makes_generator(ctx, stmt.value):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    made[target.id] = (stmt.lineno, ctx.segment(stmt.value))
    if not made:
        return None
    per_item = [m for name, m in methods.items() if name not in ("__init__", "__len__")]
    if not any(m.name in ("__getitem__", "__iter__", "__getitems__") for m in per_item):
        return None
    for method in per_item:
        for node in walk(method.node):
            drawn: ast.expr | None = None
            if isinstance(node, ast.Attribute):
                drawn = node.value  # self.rng.normal(...)
            elif isinstance(node, ast.keyword) and node.arg == "generator":
                drawn = node.value  # torch.randint(..., generator=self.gen)
            if drawn is not None:
                key = dotted(drawn)
                if key in made:
                    line, text = made[key]
                    return SharedRng(key, line, text, cls.name)
    return None
