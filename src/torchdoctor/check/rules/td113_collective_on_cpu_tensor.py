from __future__ import annotations

import ast
from typing import ClassVar

from torchdoctor.check.analysis.scope_index import calls_on_lines
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._unpicklable import Finder
from torchdoctor.check.tree_walk import walk, walk_statements

_DIST = ("torch.distributed.",)
# Collectives and the positions of their input tensor (or tensor list) arguments: the
# input's device picks the backend; output lists are not judged (NCCL may copy into them).
_COLLECTIVES: dict[str, tuple[int, ...]] = {
    "all_reduce": (0,),
    "broadcast": (0,),
    "reduce": (0,),
    "all_gather": (1,),
    "all_gather_into_tensor": (1,),
    "reduce_scatter": (1,),
    "reduce_scatter_tensor": (1,),
    "all_to_all": (1,),
    "all_to_all_single": (1,),
    "gather": (0,),
    "scatter": (0,),
    "send": (0,),
    "recv": (0,),
    "isend": (0,),
    "irecv": (0,),
}
# Factories that make a tensor on the CPU unless given `device=`.
_FACTORIES = frozenset(
    {"tensor", "zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint",
     "as_tensor", "Tensor", "FloatTensor", "LongTensor", "IntTensor", "DoubleTensor",
     "from_numpy", "linspace", "eye"}
)  # fmt: skip


class CollectiveOnCpuTensor(Rule):
    """A `torch.distributed` collective on a CPU tensor under the NCCL backend.

    ## What it does
    In a program that starts the process group with the NCCL backend --
    `init_process_group("nccl")`, `backend="nccl"`, or a backend that is `"nccl"` on
    GPU machines (`"nccl" if torch.cuda.is_available() else "gloo"`, also through a
    name), in the same file or, when this one starts none, in another file of a project
    none of whose files starts a group of another backend -- finds `dist.all_reduce`,
    `broadcast`, `all_gather`, `reduce`, `send`, ...
    given a tensor made on the CPU: by a factory with no `device=` (`torch.tensor(n)`,
    `torch.zeros(3)`), with `device="cpu"`, by `.cpu()` or `torch.from_numpy`, also in a
    list of inputs. Only inputs are judged: the input picks the backend, and NCCL may
    copy results into outputs elsewhere. The tensor's latest binding before the call
    decides; a tensor moved since (`t = t.cuda()`) or made under `with device:` is not
    reported.

    ## Why is this bad?
    NCCL only moves GPU memory. The collective raises `RuntimeError: No backend type
    associated with device type cpu` (older releases: `Tensors must be CUDA and dense`)
    -- often in a metric or logging helper that runs only at the end of an epoch, or
    only on the multi-GPU run. On by default: under NCCL it always fails.

    ## Example
    ```python
    dist.init_process_group("nccl")
    correct = torch.tensor(n_correct)
    dist.all_reduce(correct)
    ```

    ## Use instead
    ```python
    correct = torch.tensor(n_correct, device=device)
    dist.all_reduce(correct)
    ```
    or start the group with `backend="cpu:gloo,cuda:nccl"` when CPU tensors must be
    reduced too.

    ## Fix safety
    No fix is offered: the right device is the rank's own (`torch.cuda.current_device()`).

    ## References
    - https://pytorch.org/docs/stable/distributed.html#backends
    - https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group
    """

    code = "TD113"
    name = "collective-on-cpu-tensor"
    category = "device"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("distributed",)  # `import torch.distributed`

    _device_blocks: list[tuple[int, int]] | None = None

    def finish(self) -> None:
        # a collective's call spells its last name as a whole word (`all_gather` is
        # no `gather`): the lines naming none hold none of its calls
        present = [name for name in _COLLECTIVES if name in self.ctx.words]
        if not present:
            return  # cheap first: most files importing torch.distributed reduce nothing
        init = self._nccl_init()
        if init is None and (self._starts_group() or self.ctx.project.nccl_start is None):
            return  # this file starts a non-NCCL group, or nothing starts an NCCL one
        where = f"line {init.lineno}" if init is not None else f"`{self.ctx.project.nccl_start}`"
        finders: dict[int, Finder] = {}
        for scope, call in calls_on_lines(self.ctx, self.ctx.lines_naming(present)):
            func = call.func
            last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if last not in _COLLECTIVES:
                continue  # cheap first: the qualified name is looked up for few calls
            name = self.ctx.qualname(func) or ""
            if not name.startswith(_DIST):
                continue
            finder = finders.get(id(scope))
            if finder is None:
                finder = finders[id(scope)] = Finder(self.ctx, scope)
            for index in _COLLECTIVES[last]:
                if index < len(call.args):
                    self._check(call, call.args[index], finder, where)

    def _nccl_init(self) -> ast.Call | None:
        if "init_process_group" not in self.ctx.source:
            return None
        lines = self.ctx.lines_holding(["init_process_group"])
        for scope, call in calls_on_lines(self.ctx, lines):
            if getattr(call.func, "attr", getattr(call.func, "id", "")) != "init_process_group":
                continue  # cheap first: the qualified name is looked up for few calls
            if (self.ctx.qualname(call.func) or "") != "torch.distributed.init_process_group":
                continue
            backend = call.args[0] if call.args else None
            backend = next((k.value for k in call.keywords if k.arg == "backend"), backend)
            if isinstance(backend, ast.Name):  # bound in the function, else in the module
                name = backend.id
                backend = Finder(self.ctx, scope).binding(name, call.lineno)
                if backend is None and scope is not self.ctx.tree:
                    backend = Finder(self.ctx, self.ctx.tree).binding(name, 10**9)
            if _may_be_nccl(backend):
                return call
        return None

    def _default_device_may_differ(self, line: int) -> bool:
        """`torch.set_default_device(...)` in the file, or `line` inside `with device:` /
        `with torch.device(...)`: factories there make tensors on that device."""
        if self._device_blocks is None:
            blocks: list[tuple[int, int]] = []
            # (a call's name holds the words its text does: a file without them calls none)
            if "set_default_device" in self.ctx.source and any(
                isinstance(node, ast.Call)
                and (self.ctx.qualname(node.func) or "").endswith("set_default_device")
                for node in walk(self.ctx.tree)
            ):
                blocks.append((0, 10**9))
            for node in walk_statements(self.ctx.tree):
                if isinstance(node, ast.With | ast.AsyncWith) and any(
                    isinstance(item.context_expr, ast.Name | ast.Attribute)
                    or self.ctx.qualname(getattr(item.context_expr, "func", item.context_expr))
                    == "torch.device"
                    for item in node.items
                ):
                    blocks.append((node.lineno, node.end_lineno or node.lineno))
            self._device_blocks = blocks
        return any(start <= line <= end for start, end in self._device_blocks)

    def _starts_group(self) -> bool:
        lines = self.ctx.lines_holding(["init_process_group"])
        return any(
            (self.ctx.qualname(call.func) or "") == "torch.distributed.init_process_group"
            for _, call in calls_on_lines(self.ctx, lines)
        )

    def _check(self, call: ast.Call, arg: ast.expr, finder: Finder, where: str) -> None:
        items = [arg]
        if isinstance(arg, ast.Name):
            bound = finder.binding(arg.id, call.lineno)
            if isinstance(bound, ast.List | ast.ListComp):
                items = [bound]
        for item in items:
            made = self._cpu_made(item, finder, call.lineno)
            if made is None:
                continue
            self.report(
                call,
                f"`{self.ctx.segment(call.func)}` gets `{self.ctx.segment(arg)}`, a CPU tensor "
                f"(`{made}`), but the process group uses NCCL ({where}), which "
                "only handles GPU tensors: RuntimeError: No backend type associated with "
                "device type cpu",
                hint="make the tensor on the rank's GPU (`device=...`) or use a "
                "`cpu:gloo,cuda:nccl` backend",
            )
            return

    def _cpu_made(self, expr: ast.expr, finder: Finder, line: int) -> str | None:
        """The text of the CPU tensor factory `expr` is (or holds), if it is one."""
        if isinstance(expr, ast.Name):
            bound = finder.binding(expr.id, line)
            return self._cpu_made(bound, finder, line) if bound is not None else None
        if isinstance(expr, ast.ListComp):
            return self._cpu_made(expr.elt, finder, line)
        if isinstance(expr, ast.List) and expr.elts:
            return self._cpu_made(expr.elts[0], finder, line)
        if not isinstance(expr, ast.Call):
            return None
        text = self.ctx.segment(expr)
        if isinstance(expr.func, ast.Attribute) and expr.func.attr == "cpu" and not expr.args:
            return text
        name = self.ctx.qualname(expr.func) or ""
        if not name.startswith("torch.") or name.rsplit(".", 1)[-1] not in _FACTORIES:
            return None
        if name.startswith("torch.cuda."):
            return None  # `torch.cuda.LongTensor([n])`: made on the current GPU
        if self._default_device_may_differ(expr.lineno):
            return None
        device = next((k.value for k in expr.keywords if k.arg == "device"), None)
        if device is None or (isinstance(device, ast.Constant) and device.value == "cpu"):
            return text
        return None


def _may_be_nccl(backend: ast.expr | None) -> bool:
    """`"nccl"`, or a conditional one branch of which is `"nccl"`."""
    if isinstance(backend, ast.Constant):
        return backend.value == "nccl"
    if isinstance(backend, ast.IfExp):
        return _may_be_nccl(backend.body) or _may_be_nccl(backend.orelse)
    return False
