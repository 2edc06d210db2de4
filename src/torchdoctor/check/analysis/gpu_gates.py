"""Code that only runs where a GPU is, and code that needs one anyway.

Gates: a decorator or marker that skips the code otherwise.

`@require_torch_gpu`, `@require_torch_accelerator`, `@unittest.skipIf(not
torch.cuda.is_available(), ...)`, `@pytest.mark.skipif(not HAS_CUDA, ...)`,
`@unittest.skipUnless(torch.cuda.is_available(), ...)`, `@pytest.mark.gpu`: the test
(or every test of the class) never runs on a machine without a GPU, so a claim
about what happens on such a machine cannot come true there. A decorator that says
the opposite (`skipIf(torch.cuda.is_available())`, a CPU-only test) is no gate.

Needs a GPU anyway: a file importing a package that only runs on NVIDIA GPUs
(`triton`, `apex`, ...), and a block that always calls a `torch.cuda` API which
fails without one (`torch.cuda.synchronize()`, `torch.cuda.Event()`), directly or
through a function of the file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from itertools import pairwise

from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import block_of, child_statements, iter_children, walk

# torch.cuda APIs that themselves fail without a GPU: code calling them is CUDA-only
# by design, so a `.cuda()` next to them adds nothing. (Seeding, empty_cache and the
# memory statistics are safe on a CPU-only machine and do not count.)
_CUDA_ONLY_APIS = frozenset(
    {
        "synchronize",
        "Event",
        "Stream",
        "ExternalStream",
        "set_device",
        "current_device",
        "get_device_name",
        "get_device_properties",
        "get_device_capability",
        "current_stream",
        "default_stream",
        "stream",
        "set_stream",
        "graph",
        "CUDAGraph",
        "make_graphed_callables",
        "graph_pool_handle",
        "mem_get_info",
        "ipc_collect",
        "set_per_process_memory_fraction",
        "get_rng_state",
        "get_rng_state_all",
        "current_blas_handle",
        "can_device_access_peer",
        "device",
        "init",
        "_sleep",
    }
)
# Packages that only run on NVIDIA GPUs: a file importing one at its top is CUDA-only.
_CUDA_ONLY_PACKAGES = frozenset(
    {
        "apex",
        "triton",
        "pycuda",
        "cupy",
        "nvfuser",
        "transformer_engine",
        "flash_attn",
        "tensorrt",
        "torch_tensorrt",
        "cutlass",
        "nvidia",
        "pynvml",
        "liger_kernel",
        "msamp",
    }
)
_GPU = r"(?:cuda|gpu|accelerator|nccl)"
# a decorator's text that skips the test unless a GPU is there
_GATE = re.compile(
    rf"require\w*{_GPU}"  # require_torch_gpu, requires_cuda, require_torch_accelerator
    rf"|skip\w*(?:if_?)?no_?{_GPU}"  # skip_if_no_cuda, skipIfNoCuda
    rf"|skip_?if\(\s*not\s[^,]*{_GPU}"  # skipIf(not torch.cuda.is_available(), ...)
    rf"|skip_?unless\(\s*[^,]*{_GPU}"  # skipUnless(torch.cuda.is_available(), ...)
    rf"|mark\.{_GPU}\b",  # @pytest.mark.gpu
    re.IGNORECASE,
)


def gates_on_gpu(ctx: FileContext, decorators: Sequence[ast.expr]) -> bool:
    """Whether one of `decorators` skips what it decorates on a machine without a GPU."""
    return any(_GATE.search(ctx.segment(d)) for d in decorators)


def runs_only_with_gpu(ctx: FileContext, node: ast.AST | None = None) -> bool:
    """Whether the node being visited sits in a function or class (at any depth of
    `ctx.stack`) gated on a GPU by its decorators; or, given the `node` visited, in a
    branch that runs only where `torch.cuda.is_available()` held (its `if`, the `else`
    of `if not ...`, the code after `if not ...: return`, an `assert` of it)."""
    if any(
        isinstance(holder, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and gates_on_gpu(ctx, holder.decorator_list)
        for holder in ctx.stack
    ):
        return True
    if node is None or "is_available" not in ctx.source:
        return False
    chain = [*ctx.stack, node]
    return any(_enters_with_cuda(ctx, parent, child) for parent, child in pairwise(chain))


def _enters_with_cuda(ctx: FileContext, parent: ast.AST, child: ast.AST) -> bool:
    """Whether `child`, a part of `parent`, runs only where CUDA was found available."""
    if isinstance(parent, ast.If | ast.IfExp):
        body = parent.body if isinstance(parent.body, list) else [parent.body]
        orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
        if any(part is child for part in body):
            return _needs_cuda(ctx, parent.test, True)
        if any(part is child for part in orelse):
            return _needs_cuda(ctx, parent.test, False)
    for stmt in block_of(parent, child):
        if stmt is child:
            break
        if isinstance(stmt, ast.Assert) and _needs_cuda(ctx, stmt.test, True):
            return True
        if (
            isinstance(stmt, ast.If)
            and not stmt.orelse
            and _leaves(stmt.body)
            and _needs_cuda(ctx, stmt.test, False)
        ):
            return True  # `if not torch.cuda.is_available(): return`
    return False


def _leaves(body: list[ast.stmt]) -> bool:
    """The block ends by leaving the code after it: return, raise, `sys.exit(...)`."""
    last = body[-1] if body else None
    if isinstance(last, ast.Return | ast.Raise | ast.Continue | ast.Break):
        return True
    return (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and _last_name(last.value.func) in ("exit", "skipTest", "skip")
    )


def _last_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _needs_cuda(ctx: FileContext, test: ast.expr, holds: bool) -> bool:
    """Whether `test` evaluating to `holds` means `torch.cuda.is_available()` is true."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _needs_cuda(ctx, test.operand, not holds)
    if isinstance(test, ast.BoolOp):
        # `a and b` true: both hold; `a or b` false: neither holds
        if isinstance(test.op, ast.And) == holds:
            return any(_needs_cuda(ctx, value, holds) for value in test.values)
        return False
    return (
        holds
        and isinstance(test, ast.Call)
        and not test.args
        and ctx.qualname(test.func) == "torch.cuda.is_available"
    )


def imports_cuda_only_package(tree: ast.Module, extensions: frozenset[str] = frozenset()) -> bool:
    """A top-level, unconditional import of a package that only runs on NVIDIA GPUs, or
    of one of the project's own CUDA `extensions` (built by its setup.py)."""
    statements: list[ast.stmt] = []
    for stmt in tree.body:
        statements.extend(stmt.body if isinstance(stmt, ast.Try) and all_reraise(stmt) else [stmt])
    for stmt in statements:
        if extensions and _imports_extension(stmt, extensions):
            return True
        if isinstance(stmt, ast.Import):
            names = [alias.name for alias in stmt.names]
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level:
            names = [stmt.module or ""]
        elif (
            isinstance(stmt, ast.Assign | ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and getattr(stmt.value.func, "attr", "") == "importorskip"
            and stmt.value.args
            and isinstance(stmt.value.args[0], ast.Constant)
        ):
            names = [str(stmt.value.args[0].value)]
        else:
            continue
        if any(name.split(".", 1)[0] in _CUDA_ONLY_PACKAGES for name in names):
            return True
    return _imports_cuda_only_package_lazily(tree)


def _imports_extension(stmt: ast.stmt, extensions: frozenset[str]) -> bool:
    """`import pkg._ext`, `from pkg import _ext`, `from . import _ext`: a module the
    project builds (by its dotted name; a relative import by its last name)."""
    if isinstance(stmt, ast.Import):
        return any(alias.name in extensions for alias in stmt.names)
    if not isinstance(stmt, ast.ImportFrom):
        return False
    base = stmt.module or ""
    modules = [base, *(f"{base}.{alias.name}" if base else alias.name for alias in stmt.names)]
    if stmt.level:  # relative: the package's own name is not written
        return any(m.rsplit(".", 1)[-1] in extensions for m in modules if m)
    return any(m in extensions for m in modules)


def _imports_cuda_only_package_lazily(tree: ast.Module) -> bool:
    """`global transformer_engine` then `import transformer_engine` in a function: a
    module-level name the file needs, imported on first use."""
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        declared = {
            name
            for stmt in function.body
            if isinstance(stmt, ast.Global)
            for name in stmt.names
            if name.split(".", 1)[0] in _CUDA_ONLY_PACKAGES
        }
        if declared and any(
            isinstance(sub, ast.Import)
            and any(a.name.split(".", 1)[0] in declared for a in sub.names)
            for sub in walk(function)
        ):
            return True
    return False


def all_reraise(node: ast.Try) -> bool:
    """Every handler raises again: the `try` body is as unconditional as plain code."""
    return bool(node.handlers) and all(isinstance(h.body[-1], ast.Raise) for h in node.handlers)


def _callee(ctx: FileContext, node: ast.Call | ast.withitem) -> str:
    target = node.func if isinstance(node, ast.Call) else node.context_expr
    return ctx.qualname(target) or ""


def calls_cuda_only(ctx: FileContext, node: ast.Call | ast.withitem) -> bool:
    """A call of a torch.cuda API that fails without a GPU, or of a function of this
    file that always makes one (`helper(...)`, `self.helper(...)`)."""
    name = _callee(ctx, node)
    if is_cuda_only_api(name):
        return True
    cuda_only = ctx.shared("gpu_gates.cuda_only_functions", _cuda_only_function_names)
    return bool(cuda_only) and name.rsplit(".", 1)[-1] in cuda_only


def _cuda_only_function_names(ctx: FileContext) -> frozenset[str]:
    """Names of the file's functions that call CUDA-only APIs, directly or through
    other functions of the file (computed once per file, only when asked)."""
    found: set[str] = set()
    if "torch.cuda" not in ctx.source and "cuda import" not in ctx.source:
        return frozenset()
    # per function: does it call a CUDA-only API itself, and the last names of what it
    # calls (helpers of this file are matched by those)
    summaries: list[tuple[str, bool, set[str]]] = []
    statements = list(ctx.tree.body)  # functions are statements
    while statements:
        f = statements.pop()
        statements.extend(child_statements(f))
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef):
            names = [_callee(ctx, sub) for sub in always_run_calls(f.body)]
            direct = any(is_cuda_only_api(name) for name in names)
            summaries.append((f.name, direct, {n.rsplit(".", 1)[-1] for n in names}))
    for _ in range(3):  # a few levels of helpers is plenty
        grown = {
            name
            for name, direct, callees in summaries
            if name not in found and (direct or not found.isdisjoint(callees))
        }
        if not grown:
            break
        found |= grown
    return frozenset(found)


def is_cuda_only_api(name: str) -> bool:
    return name.startswith("torch.cuda.") and name[11:] in _CUDA_ONLY_APIS


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def always_run_calls(
    block: list[ast.stmt], *, loops_may_skip: bool = False
) -> list[ast.Call | ast.withitem]:
    """The calls and `with` items of a block that always run when it runs: not in
    nested functions or classes, not in the branches of an `if`, not in a `try` body
    whose errors are handled. `loops_may_skip`: not in a loop's body or a
    comprehension's items either (they may run zero times)."""
    found: list[ast.Call | ast.withitem] = []
    todo: list[ast.AST] = list(block)
    while todo:
        node = todo.pop()
        cls = node.__class__
        if cls is ast.Call or cls is ast.withitem:
            found.append(node)  # type: ignore[arg-type]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.If | ast.While | ast.IfExp):
            todo.append(node.test)
        elif loops_may_skip and isinstance(node, ast.For | ast.AsyncFor):
            todo.append(node.iter)
        elif loops_may_skip and isinstance(node, _COMPREHENSIONS):
            todo.append(node.generators[0].iter)
        elif isinstance(node, ast.BoolOp):
            todo.append(node.values[0])
        elif isinstance(node, ast.Try):
            if all_reraise(node):
                todo.extend(node.body)
            todo.extend(node.finalbody)
        elif hasattr(ast, "Match") and isinstance(node, ast.Match):
            todo.append(node.subject)
        else:
            todo.extend(iter_children(node, operators=False))
    return found
