"""Whether the mode interpreter can find a model run in a function, before it runs.

`modes(fi)` reports a run (`ForwardCall`) only at a call whose target is a model --
`self` in an nn.Module class, a name `is_model_key` accepts, or a key whose state holds
a real mode (train, eval, built, trained) -- or through a callee whose summary holds one;
a training step (`TrainingStep`) only for a model run before it. A real mode enters a
state only from a call in the function (`.eval()` / `.train()`, a module constructor),
from the models its class holds (`held_models`), or from a callee: one it passes a model
to, a method on `self` (or the one override of an abstract one), a global-model helper,
or a small eval/train helper read in place. A function with none of these -- and whose
same-file callees have none either -- ends with no runs and no steps, so the rules that
read only those (TD201, TD202, TD203) skip it without interpreting it. The test is
conservative: anything it cannot rule out counts as a possible run.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.event_collector import _is_try
from torchdoctor.check.analysis.grad_contexts import post_order_calls
from torchdoctor.check.analysis.mode_state import chain_root
from torchdoctor.check.analysis.overrides import is_abstract
from torchdoctor.check.analysis.syntax import dotted

if TYPE_CHECKING:
    from torchdoctor.check.analysis.file_loops import FileLoops
    from torchdoctor.check.analysis.functions import FunctionInfo


def may_run_model(fl: FileLoops, fi: FunctionInfo, cache: dict[int, bool]) -> bool:
    """False only if `fl.modes(fi)` certainly has no forwards and no steps."""
    found = cache.get(id(fi))
    if found is None:
        cache[id(fi)] = True  # recursion guard: a cycle in progress counts as possible
        found = _may_run(fl, fi, cache)
        cache[id(fi)] = found
    return found


def _may_run(fl: FileLoops, fi: FunctionInfo, cache: dict[int, bool]) -> bool:
    ctx = fl.ctx
    self_model = fi.cls is not None and ctx.is_module_class(fi.cls)
    if not fi.is_module and fi.cls is not None:
        # ModeCore.run: models the class built and holds start in BUILT mode. They are
        # the BUILT modes `__init__` ends with, which need a source there as well.
        init, helpers = fl.construction(fi.cls)
        if (
            init is not None
            and fi.name not in helpers
            and may_run_model(fl, init, cache)
            and fl.held_models(fi.cls)
        ):
            return True

    def model(key: str | None) -> bool:
        if key is None:
            return False
        return self_model if key == "self" else fl.is_model_key(key)

    for node in _interpreted(fi):
        for call in post_order_calls(node):
            func = call.func
            if isinstance(func, ast.Attribute) and (
                func.attr in ("eval", "train") or model(chain_root(func.value))
            ):
                return True
            if model(dotted(func)) or fl.is_module_constructor(call):
                return True
            for arg in (*call.args, *(kw.value for kw in call.keywords)):
                if model(dotted(arg.value if isinstance(arg, ast.Starred) else arg)):
                    return True
            resolved = fl.resolve(fi, call, other_files=False)
            if resolved is None or resolved[0] is fi:
                continue
            callee, as_method = resolved
            if as_method and is_abstract(callee.node):
                return True  # the interpreter may follow the one override, in another file
            if not as_method and (".train(" in callee.text or ".eval(" in callee.text):
                return True  # an eval/train helper the interpreter reads in place
            if may_run_model(fl, callee, cache):
                return True
    return False


def _interpreted(fi: FunctionInfo) -> list[ast.AST]:
    """The statements and statement heads whose calls the interpreter evaluates (a
    superset: some it binds without evaluating)."""
    found: list[ast.AST] = []
    for stmt in fi.own_statements():
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(stmt, ast.If | ast.While):
            found.append(stmt.test)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            found.append(stmt.iter)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            found.extend(item.context_expr for item in stmt.items)
        elif isinstance(stmt, ast.Match):
            found.append(stmt.subject)
        elif not _is_try(stmt):
            found.append(stmt)
    return found
