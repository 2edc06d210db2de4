from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import file_flow, scopes_with
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.values import Kind, Place
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk

DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    }
)


class DataParallelNotOnDevice(Rule):
    """`nn.DataParallel` around a module that is never moved to `device_ids[0]`.

    ## What it does
    Finds `nn.DataParallel(model)` where the wrapped model was built in the same
    scope, is moved neither before nor after wrapping, and is then used: called,
    returned or stored. That run crashes on its first forward.

    Preferring `DistributedDataParallel` over `DataParallel` in general is advice,
    not a bug: TD114 says it, when advice is selected.

    ## Why is this bad?
    `DataParallel` requires the module's parameters and buffers on
    `device_ids[0]` (the first visible GPU by default). A module left on the CPU
    fails with `RuntimeError: module must have its parameters and buffers on
    device cuda:0 (device_ids[0]) but found one of them on device: cpu`. Loading
    weights with `map_location=device` does not move it: `load_state_dict`
    copies into the module's existing (CPU) tensors.

    ## Example
    ```python
    net = CRAFT()
    net.load_state_dict(torch.load(path, map_location=device))
    net = torch.nn.DataParallel(net)
    return net
    ```

    ## Use instead
    ```python
    net = torch.nn.DataParallel(net).to(device)
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html
    """

    code = "TD107"
    name = "data-parallel"
    category = "device"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("DataParallel",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        for node in scopes_with(ff, "DataParallel"):
            scope = ff.scope(node, callers=False)
            for call in scope.calls_named("DataParallel"):
                if (self.ctx.call_name(call) or "") in DATA_PARALLEL:
                    self._check(node, scope, call)

    def _check(self, node: ast.AST, scope: ScopeFlow, call: ast.Call) -> None:
        inner = scope.value(call.args[0]) if call.args else None
        if inner is None:
            return
        built = inner.where_line(inner.line) if inner.kind is Kind.MODULE and inner.fresh else None
        if inner.kind is Kind.UNKNOWN:
            line = self._built_here_unmoved(node, call.args[0])
            built = f"line {line}" if line is not None else None
        if built is None:
            return
        if any(m.before.source is call and m.after.place is Place.DEVICE for m in scope.moves):
            return
        if not (self._called(scope, call) or self._handed_on(node, scope, call)):
            return
        name = self.ctx.segment(call.args[0])
        self.report(
            call,
            f"`{name}` (built at {built}) is wrapped in `nn.DataParallel` but "
            "never moved to `device_ids[0]`: the first forward fails with `module must "
            "have its parameters and buffers on device cuda:0`; move it with `.to(device)`",
        )

    def _built_here_unmoved(self, node: ast.AST, arg: ast.expr) -> int | None:
        """`net = CRAFT()` of a class from another file (what DataParallel wraps is a
        module), with no `.to(` / `.cuda(` of `net` anywhere in the scope: the line
        it was built on."""
        if not isinstance(arg, ast.Name):
            return None
        built = None
        for sub in walk(node):
            if (
                isinstance(sub, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == arg.id for t in sub.targets)
                and sub.lineno < arg.lineno
            ):
                func = sub.value.func if isinstance(sub.value, ast.Call) else None
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if not name[:1].isupper():
                    return None  # bound to something else: a factory, a parameter's value
                built = sub.lineno
        text = self.ctx.segment(node) if not isinstance(node, ast.Module) else self.ctx.source
        if built is None or re.search(rf"\b{re.escape(arg.id)}\b[^\n]*\.(to|cuda)\(", text):
            return None
        return built

    @staticmethod
    def _called(scope: ScopeFlow, call: ast.Call) -> bool:
        return any(
            scope.value(site.call.func).source is call
            for site in scope.calls
            if isinstance(site.call.func, ast.Name)
        )

    @staticmethod
    def _handed_on(node: ast.AST, scope: ScopeFlow, call: ast.Call) -> bool:
        """The wrapper leaves the scope unmoved: returned (itself, or the name it was
        bound to) or stored on an object."""
        bound = {
            t.id
            for sub in walk(node)
            if isinstance(sub, ast.Assign) and sub.value is call
            for t in sub.targets
            if isinstance(t, ast.Name)
        }
        for sub in walk(node):
            if isinstance(sub, ast.Return) and sub.value is not None:
                value = sub.value
                if isinstance(value, ast.Name) and value.id in bound:
                    return True
                if value is call or scope.value(value).source is call:
                    return True
            if (
                isinstance(sub, ast.Assign)
                and any(isinstance(t, ast.Attribute) for t in sub.targets)
                and (sub.value is call or scope.value(sub.value).source is call)
            ):
                return True
        return False
