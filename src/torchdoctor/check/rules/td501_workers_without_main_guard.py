from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.lines import as_lf
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

_DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})


def is_dataloader(ctx_qualname: str | None) -> bool:
    return ctx_qualname in _DATALOADERS or (ctx_qualname or "").endswith("data.DataLoader")


def workers_of(call: ast.Call) -> ast.expr | None:
    """The `num_workers=` value if it may be > 0 (a positive literal or any expression)."""
    for kw in call.keywords:
        if kw.arg == "num_workers":
            value = kw.value
            if isinstance(value, ast.Constant):
                return value if isinstance(value.value, int) and value.value > 0 else None
            return value
    return None


def is_main_guard(test: ast.expr) -> bool:
    text = ast.unparse(test).replace("'", '"')
    return "__name__" in text and '"__main__"' in text


class WorkersWithoutMainGuard(Rule):
    """A DataLoader with worker processes runs at import time, with no `__main__` guard.

    ## What it does
    Finds `DataLoader(..., num_workers=N)` with N > 0 (or a variable) in a script
    that has no `if __name__ == "__main__":` guard, where the loader is built or
    iterated by code that runs when the file is imported: module-level code, or a
    function called from it. Notebooks (and scripts split into `# %%` cells) are
    not checked.

    ## Why is this bad?
    On Windows and macOS (and anywhere `multiprocessing` uses the `spawn` start
    method) every worker process starts by importing the main script. Without the
    guard, that import runs the training code again, which starts workers again,
    and Python stops it with `RuntimeError: An attempt has been made to start a new
    process before the current process has finished its bootstrapping phase.`
    The same script works on Linux (which forks), so it breaks only when a
    colleague or CI runs it on another OS.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, num_workers=4)
    for epoch in range(10):
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    def main():
        loader = DataLoader(dataset, batch_size=32, num_workers=4)
        for epoch in range(10):
            for x, y in loader:
                ...

    if __name__ == "__main__":
        main()
    ```

    ## References
    - https://pytorch.org/docs/stable/data.html#platform-specific-behaviors
    - https://docs.python.org/3/library/multiprocessing.html#the-spawn-and-forkserver-start-methods
    """

    code = "TD501"
    name = "workers-without-main-guard"
    category = "data"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("num_workers",)

    def finish(self) -> None:
        ctx = self.ctx
        if ctx.path.endswith(".ipynb"):
            return
        if re.search(r"(?m)^# %%", as_lf(ctx.source)):
            return  # a notebook kept as a script (Jupytext / VS Code cells)
        if "__main__" in ctx.source and any(
            isinstance(s, ast.If) and is_main_guard(s.test) for s in ctx.tree.body
        ):
            return
        fl = analysis(ctx)
        reached = _reached_from_module(fl)
        module_text = _module_code_text(fl)
        for fi in [fl.module, *fl.functions]:
            if fi is not fl.module and fi not in reached:
                continue
            for stmt in fi.own_statements():
                for call in _calls(stmt):
                    if not is_dataloader(ctx.qualname(call.func)):
                        continue
                    workers = workers_of(call)
                    if workers is None:
                        continue
                    if fi is fl.module and not _runs(fl, stmt, module_text, reached):
                        continue
                    where = "at module level" if fi is fl.module else f"in {fi.label}"
                    self.report(
                        call,
                        f"`DataLoader(..., num_workers={ctx.segment(workers)})` at line "
                        f"{call.lineno} starts worker processes from code that runs on import "
                        f'({where}) and this file has no `if __name__ == "__main__":` guard:'
                        " under the spawn start method (Windows, macOS) every worker "
                        "re-runs the script and fails",
                        hint="move the training code into `main()` and call it under "
                        '`if __name__ == "__main__":`',
                    )


def _calls(stmt: ast.stmt) -> list[ast.Call]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return []
    out: list[ast.Call] = []
    for name, value in ast.iter_fields(stmt):
        if name in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        for node in value if isinstance(value, list) else [value]:
            if isinstance(node, ast.AST):
                out.extend(n for n in walk(node) if isinstance(n, ast.Call))
    return out


def _reached_from_module(fl: FileLoops) -> set[FunctionInfo]:
    """Functions of this file that module-level code calls, directly or through others."""
    reached: set[FunctionInfo] = set()
    todo = [fl.module]
    while todo:
        fi = todo.pop()
        for stmt in fi.own_statements():
            for call in _calls(stmt):
                found = fl.resolve(fi, call)
                if found is not None:
                    callee = found[0]
                    if callee.file is fl and callee not in reached:
                        reached.add(callee)
                        todo.append(callee)
    return reached


def _module_code_text(fl: FileLoops) -> str:
    return "\n".join(
        fl.ctx.segment(s)
        for s in fl.module.body
        if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Import)
        and not isinstance(s, ast.ImportFrom)
    )


def _runs(fl: FileLoops, stmt: ast.stmt, module_text: str, reached: set[FunctionInfo]) -> bool:
    """A module-level loader is iterated at import: by module code or a reached function."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return True  # `for x in DataLoader(...)` and the like
    name = dotted(stmt.targets[0])
    if name is None:
        return False
    rest = module_text.replace(fl.ctx.segment(stmt), "")
    if _iterates(rest, name):
        return True
    return any(_iterates(fi.text, name) for fi in reached)


def _iterates(text: str, name: str) -> bool:
    n = re.escape(name)
    return bool(
        re.search(rf"\bin\s+(?:\w+\()?(?:\w+\()?{n}\b", text)
        or re.search(rf"\biter\(\s*{n}\b", text)
        or re.search(rf"\(\s*(?:[^()]*,\s*)?{n}\s*[,)]", text)
    )
