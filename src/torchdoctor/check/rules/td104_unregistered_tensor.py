from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.default_path import default_text
from torchdoctor.check.analysis.file_flow import FileFlow, file_flow
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.values import AnyFunction, Kind, Place, Value
from torchdoctor.check.findings import Fix
from torchdoctor.check.rule import FixAvailability, Rule, Severity
from torchdoctor.check.rules._pinned_attributes import (
    attribute_meeting,
    construction_device,
    pinned_cpu,
    pinned_meeting,
)
from torchdoctor.check.rules._stale_caches import stale_caches
from torchdoctor.check.tree_walk import walk


class UnregisteredTensor(Rule):
    """A tensor kept as a plain attribute of a module: not a buffer, never moved.

    ## What it does
    Finds `self.name = <tensor>` in an `nn.Module`'s `__init__`, where the tensor is
    made there (a factory, `torch.tensor([...])`, arithmetic on those) and is
    neither an `nn.Parameter` nor registered with `register_buffer`, and that one
    of the module's methods (usually `forward`) combines with its inputs,
    parameters, buffers or submodules. A tensor moved where it is used
    (`self.mask.to(x.device)`) is not reported. A state that other methods reset
    where it is (`self.mem = torch.zeros_like(self.mem)`) counts too: the first
    call of `forward` still finds the CPU tensor `__init__` made.

    A tensor `__init__` puts on a device the class chooses for itself counts too: a CUDA
    availability test there (`device = "cuda" if torch.cuda.is_available() else "cpu"`).
    (A device the constructor is given is not: its caller usually moves the module to
    that same device, by design.) It is reported where a
    method meets it with the module's inputs, parameters or a submodule's output, and
    only when every other method that assigns it keeps it derived from such pinned
    tensors (`self.coefs = self.inv_A @ self.b`); one re-homed where it is used
    (`self.cache = self.cache.to(x)`) is not.

    A cache counts too: `self.cache = None` in `__init__`, filled by one method with a
    tensor it makes on its input's device from the input's shape
    (`torch.arange(n, device=x.device)`), and handed back or used again on a later call
    without asking where it is (`if self.cache is not None and self.cache.shape ==
    x.shape: return self.cache`, or `x * self.cos` after `if self.cos is None or n >
    self.length:` refills it). A cache whose test or key reads a `.device`, state
    made of the input's data and carried to the next call (streaming), and one another
    method resets are not reported.

    ## Why is this bad?
    `model.to(device)`, `.cuda()` and `.half()` move and convert parameters and
    buffers only. A plain tensor attribute stays on the CPU, so `forward` fails on
    a GPU with `RuntimeError: Expected all tensors to be on the same device, but
    found at least two devices, cuda:0 and cpu!` (positional encodings, masks,
    normalisation constants, anchor grids). It is also missing from `state_dict()`.
    A tensor pinned to the device chosen at construction stays there the same way:
    `.cpu()` for inference, `.to("cuda:1")`, each `nn.DataParallel` replica (which gets
    the one on `cuda:0`) or an accelerate device map leaves it behind, and CPU inputs on a
    GPU machine meet a CUDA tensor. A cache stays on the device of the input that filled
    it: a module called once on the CPU (a summary, a smoke test, a trace) and then moved
    hands a CPU tensor to GPU code.

    ## Example
    ```python
    class PositionalEncoding(nn.Module):
        def __init__(self, dim, max_len=512):
            super().__init__()
            self.pe = torch.zeros(max_len, dim)

        def forward(self, x):
            return x + self.pe[: x.size(1)]
    ```

    ## Use instead
    ```python
            self.register_buffer("pe", torch.zeros(max_len, dim), persistent=False)
    ```
    (`persistent=True`, the default, also saves it in the `state_dict`.)

    ## Fix safety
    The fix rewrites the assignment as `self.register_buffer("name", ..., persistent=False)`.
    It is unsafe: the buffer now follows `.to()`, `.half()` and `.double()` (its dtype
    may change with the module's), and code that replaces the attribute later with a
    non-tensor would now raise.

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_buffer
    """

    code = "TD104"
    name = "unregistered-tensor"
    category = "device"
    severity = Severity.ERROR
    fix_availability = FixAvailability.UNSAFE
    triggers: ClassVar[tuple[str, ...]] = ("__init__",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        ff = file_flow(self.ctx)
        for func in ff.functions():
            if func.name != "__init__":
                continue
            cls = ff.class_of(func)
            if cls is None or not ff.is_module_class(cls):
                continue
            # `__init__` and the helpers only it runs (`self._init_state()`)
            helpers = ff.init_helpers(cls)
            makers = [func, *(m for n, m in ff.methods(cls).items() if n in helpers)]
            others = [m for m in ff.methods(cls).values() if m not in makers]
            if ff.mentions(cls, "= None"):
                self._check_caches(ff, cls, makers, others)
            if not any(ff.mentions(m, "torch", "tensor", *self._factories(ff)) for m in makers):
                continue
            self._check(ff, cls, makers, others, ff.scope(func, callers=False))

    def _factories(self, ff: FileFlow) -> tuple[str, ...]:
        """`make_grid(` of the file's functions that may return a tensor they make: a
        call of one in `__init__` makes a tensor (`self.doas = sphere()`)."""
        found = getattr(self, "_factory_calls", None)
        if found is None:
            found = tuple(
                f"{name}("
                for name, func in ff.toplevel_functions.items()
                if ff.may_return_factory(func)
            )
            self._factory_calls = found
        return found

    def _check(
        self,
        ff: FileFlow,
        cls: ast.ClassDef,
        makers: list[AnyFunction],
        others: list[AnyFunction],
        init: ScopeFlow,
    ) -> None:
        """`others`: the class's methods that are not `makers` (`__init__` and its helpers)."""
        if not init.self_name:
            return
        class_text = ff.text(cls)
        assigned_elsewhere: set[str] = set()
        for method in others:
            assigned_elsewhere |= ff.self_attrs_assigned(method)
        if "*" in assigned_elsewhere:
            return
        seen: set[str] = set()
        pinned: dict[str, tuple[ast.Assign | ast.AnnAssign, ast.Attribute, Value, str, str]] = {}
        for maker in makers:
            scope = init if maker is makers[0] else ff.scope(maker, callers=False)
            self._check_maker(
                ff, maker, scope, init, others, class_text, assigned_elsewhere, seen, pinned
            )
        if pinned:
            self._check_pinned(ff, cls, makers, others, pinned)

    def _check_caches(
        self,
        ff: FileFlow,
        cls: ast.ClassDef,
        makers: list[AnyFunction],
        others: list[AnyFunction],
    ) -> None:
        """Tensor caches reused on any device (_stale_caches.py)."""
        for cache in stale_caches(ff, cls, makers, others):
            message = (
                f"`self.{cache.attr}` is a plain tensor cache, not a buffer: `{cache.method}` "
                f"fills it with a tensor on its input's device (line {cache.filled}) and reuses "
                f"it without asking where it is ({cache.reuse}), so after `model.to(device)`, "
                "or for an input on another device, it hands back the tensor on the old "
                f'device; register it with `self.register_buffer("{cache.attr}", None, '
                "persistent=False)` or recompute it when `.device` differs"
            )
            self.report(cache.target, message, fix=self._buffer_fix(cache.slot, cache.target))

    def _check_pinned(
        self,
        ff: FileFlow,
        cls: ast.ClassDef,
        makers: list[AnyFunction],
        others: list[AnyFunction],
        pinned: dict[str, tuple[ast.Assign | ast.AnnAssign, ast.Attribute, Value, str, str]],
    ) -> None:
        """Tensors pinned to the device construction chose (_pinned_attributes.py)."""
        as_cpu = pinned_cpu(ff, cls, makers, {a: p[2] for a, p in pinned.items()})
        for attr in as_cpu:
            user = pinned_meeting(ff, others, attr, as_cpu)
            if user is not None:
                stmt, target, value, helper, chosen = pinned[attr]
                self._report(stmt, target, attr, value, helper, user, True, chosen)

    def _check_maker(
        self,
        ff: FileFlow,
        maker: AnyFunction,
        scope: ScopeFlow,
        init: ScopeFlow,
        others: list[AnyFunction],
        class_text: str,
        assigned_elsewhere: set[str],
        seen: set[str],
        pinned: dict[str, tuple[ast.Assign | ast.AnnAssign, ast.Attribute, Value, str, str]],
    ) -> None:
        params = [*maker.args.posonlyargs, *maker.args.args]
        if not params:
            return
        me = params[0].arg
        for stmt in walk(maker):
            if not isinstance(stmt, ast.Assign | ast.AnnAssign) or stmt.value is None:
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if not (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == me
                ):
                    continue
                attr = target.attr
                first = attr not in seen
                seen.add(attr)
                value = scope.value(stmt.value)
                helper = "" if maker.name == "__init__" else maker.name
                final = init.exit_env.get(f"{init.self_name}.{attr}")  # what construction leaves
                if first and value.place is Place.DEVICE:
                    chosen = construction_device(ff, [maker, init.node], value)  # type: ignore[list-item]
                    if chosen and final == value and not _registered(attr, class_text):
                        pinned[attr] = (stmt, target, value, helper, chosen)
                if value.kind is not Kind.TENSOR or value.place is not Place.CPU:
                    continue
                if value.scalar or value.assumed:
                    continue
                if final is None or final.kind is not Kind.TENSOR:
                    continue  # wrapped in a Parameter or replaced later
                if _registered(attr, class_text):
                    continue
                # assigned by other methods too: only where the method's first call is
                # shown to find what construction made (FlowSeeds._first_call_holds)
                user = _first_use(ff, others, attr, value, attr in assigned_elsewhere)
                if user is None:
                    continue
                self._report(stmt, target, attr, value, helper, user, first)

    def _report(
        self,
        stmt: ast.Assign | ast.AnnAssign,
        target: ast.Attribute,
        attr: str,
        value: Value,
        helper: str,
        user: tuple[str, str],
        first: bool,
        chosen: str = "",
    ) -> None:
        method, line = user
        line_made = value.line or (stmt.lineno if chosen else 0)  # `2 * torch.eye(n)` has none
        made = f"made at {value.where_line(line_made)}" + (
            f" by `{value.name}`" if value.name else ""
        )
        if helper:
            made += f" in `{helper}`, which `__init__` runs"
        if value.default_of:  # `w if w is not None else torch.ones(n)`
            made += f" {default_text(value.default_of)}"
        if chosen:  # pinned to the device construction chose (_pinned_attributes.py)
            made += f" on the device chosen by {chosen}"
            where = (
                "`model.to(device)`, `.cpu()` or a DataParallel replica leaves it on that "
                f"device, where `{method}` uses it with the module's inputs or parameters"
            )
        else:
            where = (
                f"`model.to(device)` leaves it on the CPU, where `{method}` uses it with "
                "tensors on the module's device"
            )
        message = (
            f"`self.{attr}` is a plain tensor attribute ({made}), not a buffer: {where} "
            f"({line}); "
            f'register it with `self.register_buffer("{attr}", ..., persistent=False)`'
        )
        fix = self._buffer_fix(stmt, target) if first else None
        self.report(target, message, fix=fix)

    def _buffer_fix(self, stmt: ast.Assign | ast.AnnAssign, target: ast.Attribute) -> Fix | None:
        """`self.x = v` rewritten as `self.register_buffer("x", v, persistent=False)`."""
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            return None
        return self.ctx.fix(
            f"register `{target.attr}` as a buffer (`persistent=False`)",
            self.ctx.replace(
                stmt,
                f'{self.ctx.segment(target.value)}.register_buffer("{target.attr}", '
                f"{self.ctx.segment(stmt.value)}, persistent=False)",
            ),
            safe=False,
        )


def _registered(attr: str, class_text: str) -> bool:
    return bool(re.search(rf"register_buffer\(\s*['\"]{re.escape(attr)}['\"]", class_text))


def _first_use(
    ff: FileFlow, methods: list[AnyFunction], attr: str, value: Value, reassigned: bool
) -> tuple[str, str] | None:
    """(method, "line N") where `self.attr` first meets a tensor on the module's device
    (`reassigned`: other methods assign it too, so only a method seeded with what
    construction made, on its first call, counts)."""
    ordered = sorted(methods, key=lambda m: (m.name != "forward", m.lineno))
    for method in ordered:
        if not ff.mentions(method, f".{attr}"):
            continue
        scope = ff.scope(method, callers=False)
        if reassigned and scope.seeds.get(f"{scope.self_name}.{attr}") != value:
            continue
        where = attribute_meeting(scope, attr, value)
        if where is not None:
            return method.name, where
    return None
