"""Where a CUDA device is a choice the author made: under a condition about the device,
in a fallback `try`, after an early exit without a GPU, in a test class that skips
without one, in code feeding NCCL collectives (TD101, TD115)."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.gpu_gates import always_run_calls, calls_cuda_only
from torchdoctor.check.tree_walk import block_of, walk, walk_statements

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# Words in a condition, decorator or name that show the author thought about the device.
_DEVICE_WORDS = re.compile(
    r"cuda|gpu|device|is_available|accelerat|nccl|cudnn|cpu|mps|xpu|hip|rocm|triton|nvidia",
    re.IGNORECASE,
)
# A file, function or class whose name says it is about the GPU is CUDA-only on purpose.
CUDA_NAME = re.compile(r"cuda|gpu|cudnn|nccl|triton|nvfuser", re.IGNORECASE)
# torch.distributed collectives: their tensors must be on the process group's device
# (CUDA for NCCL), so code calling them chooses the device on purpose.
_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "gather",
        "scatter",
        "send",
        "recv",
        "isend",
        "irecv",
        "barrier",
    }
)
_EXPECTS_ERROR = re.compile(r"raises|assertRaises|expectedFailure", re.IGNORECASE)
_SETUP_NAMES = frozenset({"setUp", "setUpClass", "setup_method", "setup_class"})
# Exceptions whose handler is a fallback for a failed `.cuda()`.
_BROAD_EXCEPTIONS = frozenset({"Exception", "BaseException", "RuntimeError", "AssertionError"})
# An early exit or assert on these words stops runs without a GPU.
_GPU_CHECK_WORDS = re.compile(r"cuda|gpu|nccl|is_available|device_count", re.IGNORECASE)
_EXIT_CALLS = re.compile(r"skip|exit|abort", re.IGNORECASE)


class CudaChoice:
    """Per file: which code may hardcode CUDA because it only runs with a GPU."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._cuda_only_blocks: dict[int, bool] = {}
        self._gated: bool | None = None
        self._gated_classes: set[str] | None = None
        self._collective_functions: dict[ast.AST, bool] = {}

    def guarded(self, chain: list[ast.AST]) -> bool:
        """Whether the last node of `chain` (a node and its ancestors, outermost first)
        sits where CUDA is a choice."""
        for depth in range(len(chain) - 2, -1, -1):
            parent, child = chain[depth], chain[depth + 1]
            if self._guards(parent, child):
                return True
        return False

    def _guards(self, parent: ast.AST, child: ast.AST) -> bool:
        if isinstance(parent, ast.IfExp):
            return child is not parent.test
        if isinstance(parent, ast.arguments):
            return True  # a parameter's default: the caller chooses
        if isinstance(parent, ast.If | ast.While | ast.Assert) and child is parent.test:
            return True  # a condition asks about CUDA; it does not move anything there
        if isinstance(parent, ast.Compare):
            return True  # `torch.device("cuda") in devices`, `x.device == ...`
        if isinstance(parent, ast.If | ast.While):
            if self._mentions_device(parent.test):
                return True
        elif isinstance(parent, ast.With | ast.AsyncWith):
            if any(_EXPECTS_ERROR.search(self.ctx.segment(i.context_expr)) for i in parent.items):
                return True  # `with pytest.raises(...)`: the failure is the point
        elif isinstance(parent, ast.BoolOp):
            for operand in parent.values:
                if operand is child:
                    break
                if self._mentions_device(operand):
                    return True
        elif isinstance(parent, ast.Try):
            if any(child is stmt for stmt in parent.body) and any(
                _catches_failure(h) for h in parent.handlers
            ):
                return True
        elif isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if CUDA_NAME.search(parent.name):
                return True
            if any(self._mentions_device(d) for d in parent.decorator_list):
                return True
            if isinstance(parent, ast.ClassDef):
                if self._class_is_gated(parent):
                    return True
            elif self._uses_collectives(parent) or any(
                CUDA_NAME.search(a.arg)
                for a in (*parent.args.posonlyargs, *parent.args.args, *parent.args.kwonlyargs)
            ):
                return True  # a `gpu_ids` / `use_cuda` parameter: the caller decides
        elif isinstance(parent, ast.Module) and self._file_is_gated():
            return True
        block = block_of(parent, child)
        return bool(block) and (
            self._exits_earlier(block, child) or self._block_is_cuda_only(block)
        )

    def _mentions_device(self, expr: ast.AST) -> bool:
        return bool(_DEVICE_WORDS.search(self.ctx.segment(expr)))

    def _checks_gpu(self, expr: ast.AST) -> bool:
        return bool(_GPU_CHECK_WORDS.search(self.ctx.segment(expr)))

    def _exits_earlier(self, block: list[ast.stmt], child: ast.AST) -> bool:
        """An earlier statement of the block stops non-GPU runs (return, skip, assert)."""
        for stmt in block:
            if stmt is child:
                return False
            if isinstance(stmt, ast.Assert) and self._checks_gpu(stmt.test):
                return True
            if (
                isinstance(stmt, ast.If)
                and self._checks_gpu(stmt.test)
                and _ends_with_exit(stmt.body)
            ):
                return True
        return False

    def _file_is_gated(self) -> bool:
        """A test module whose `pytestmark` skips runs without a GPU."""
        if self._gated is None:
            self._gated = any(
                isinstance(stmt, ast.Assign)
                and any(getattr(t, "id", "") == "pytestmark" for t in stmt.targets)
                and self._checks_gpu(stmt.value)
                for stmt in self.ctx.tree.body
            )
        return self._gated

    def _class_is_gated(self, cls: ast.ClassDef) -> bool:
        """A class whose setUp or `skip` check (or a base class's, in this file) asks
        about the GPU: test cases, profiler patterns. Its methods only run where the
        check passed."""
        if self._gated_classes is None:
            classes = {
                c.name: c for c in walk_statements(self.ctx.tree) if isinstance(c, ast.ClassDef)
            }
            gated = {
                name
                for name, c in classes.items()
                if any(
                    isinstance(stmt, ast.FunctionDef)
                    and stmt.name in (*_SETUP_NAMES, "skip")
                    and self._checks_gpu(stmt)
                    for stmt in c.body
                )
            }
            for _ in range(3):  # subclasses of gated classes, a few levels deep
                gated |= {
                    name
                    for name, c in classes.items()
                    if any(getattr(b, "id", getattr(b, "attr", "")) in gated for b in c.bases)
                }
            self._gated_classes = gated
        return cls.name in self._gated_classes

    def _block_is_cuda_only(self, block: list[ast.stmt]) -> bool:
        """The block always calls a torch.cuda API that fails without a GPU (or a function
        of this file that does), so it needs a GPU anyway."""
        key = id(block)
        cached = self._cuda_only_blocks.get(key)
        if cached is None:
            cached = any(calls_cuda_only(self.ctx, sub) for sub in always_run_calls(block))
            self._cuda_only_blocks[key] = cached
        return cached

    def _uses_collectives(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """The function feeds torch.distributed collectives, whose tensors must sit on
        the process group's device (CUDA for NCCL): the device is chosen on purpose."""
        found = self._collective_functions.get(function)
        if found is None:  # asked for each CUDA call the function holds
            found = self._collective_functions[function] = self._feeds_collectives(function)
        return found

    def _feeds_collectives(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        if "dist" not in self.ctx.segment(function).lower():
            return False
        for sub in walk(function):
            if isinstance(sub, ast.Call):
                # torch.distributed.all_reduce, or a project's wrapper such as
                # distributed_utils.all_reduce
                name = self.ctx.qualname(sub.func) or ""
                head, _, last = name.rpartition(".")
                if last in _COLLECTIVES and "dist" in head:
                    return True
                # DistributedDataParallel(model, device_ids=[rank]): one GPU per process
                if last == "DistributedDataParallel" and any(
                    kw.arg == "device_ids" for kw in sub.keywords
                ):
                    return True
        return False


def _catches_failure(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        (t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")) in _BROAD_EXCEPTIONS
        for t in types
    )


def _ends_with_exit(body: list[ast.stmt]) -> bool:
    last = body[-1]
    if isinstance(last, ast.Return | ast.Raise | ast.Continue | ast.Break):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        func = last.value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return bool(_EXIT_CALLS.search(name))
    return False
