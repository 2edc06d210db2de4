"""Code that only runs where a GPU is: under a decorator or marker that skips it otherwise.

`@require_torch_gpu`, `@require_torch_accelerator`, `@unittest.skipIf(not
torch.cuda.is_available(), ...)`, `@pytest.mark.skipif(not HAS_CUDA, ...)`,
`@unittest.skipUnless(torch.cuda.is_available(), ...)`, `@pytest.mark.gpu`: the test
(or every test of the class) never runs on a machine without a GPU, so a claim
about what happens on such a machine cannot come true there. A decorator that says
the opposite (`skipIf(torch.cuda.is_available())`, a CPU-only test) is no gate.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from torchdoctor.check.context import FileContext

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


def runs_only_with_gpu(ctx: FileContext) -> bool:
    """Whether the node being visited sits in a function or class (at any depth of
    `ctx.stack`) gated on a GPU by its decorators."""
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and gates_on_gpu(ctx, node.decorator_list)
        for node in ctx.stack
    )
