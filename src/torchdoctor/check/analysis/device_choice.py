"""Whether hard-wired CUDA contradicts the code around it.

`x.cuda()` fails on a machine without a GPU, but in a script written for one GPU
machine that is the author's choice, not a mistake (TD115, advice). It is a bug
(TD101) where the code itself shows that it must run elsewhere too:

- model code (a method of an `nn.Module` subclass) runs on whatever device its
  user moves the model to, so a tensor it pins to CUDA breaks CPU, MPS and
  `cuda:1` users alike;
- a function that knows a device (`x.device`, `x.is_cuda`, a `device`
  parameter) or mixes the CUDA tensor it makes with one of its inputs could have
  followed that input instead;
- a file that asks `torch.cuda.is_available()` or `x.is_cuda` elsewhere is meant
  to run without a GPU;
- test code runs on CPU-only CI machines (GPU-gated tests are quiet anyway).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.names import is_test_file
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEVICE_ATTRIBUTES = frozenset({"device", "is_cuda"})


def device_reason(ctx: FileContext, stack: list[ast.AST], node: ast.AST) -> str | None:
    """Why CUDA hard-wired at `node` (`stack`: its ancestors and itself) is a bug, or
    None for a script that simply runs on a GPU."""
    function = next((n for n in reversed(stack) if isinstance(n, _FUNCTIONS)), None)
    cls = next((n for n in reversed(stack) if isinstance(n, ast.ClassDef)), None)
    # judged by the class's own bases: a same-named module elsewhere does not count
    if cls is not None and file_flow(ctx).is_module_class(cls):
        return (
            f"`{cls.name}` is a torch module: its code runs on whatever device its user moves it to"
        )
    if function is not None:
        known = _known_device(function)
        if known is not None:
            return f"`{function.name}` already has a device to follow ({known})"
        met = _meets_input(function, stack, node)
        if met is not None:
            return f"it is combined with the input `{met}`, whose device it could follow"
    if is_test_file(ctx.project_path):
        return "tests run on CPU-only machines too"
    return ctx.shared("device_choice.file", _file_reason)


def _file_reason(ctx: FileContext) -> str | None:
    """The file asks whether CUDA is there (once per file, shared by TD101 and TD115)."""
    if "is_available" not in ctx.source and "is_cuda" not in ctx.source:
        return None
    for sub in walk(ctx.tree):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "is_available"
            and ctx.qualname(sub.func) == "torch.cuda.is_available"
        ):
            return (
                f"the file checks `torch.cuda.is_available()` (line {sub.lineno}), "
                "so it is meant to run without a GPU"
            )
        if isinstance(sub, ast.Attribute) and sub.attr == "is_cuda":
            return (
                f"the file asks `{ctx.segment(sub)}` (line {sub.lineno}), "
                "so its tensors may be on the CPU"
            )
    return None


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = function.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return {a.arg for a in every if a is not None and a.arg not in ("self", "cls")}


def _known_device(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """A `device` parameter, `x.is_cuda`, or a placement that follows a value's device
    (`.to(x.device)`, `device=x.device`): the function knows which device to use."""
    for name in _parameters(function):
        if name == "device" or name.endswith("_device"):
            return f"its parameter `{name}`"
    for sub in walk(function):
        if isinstance(sub, ast.Attribute) and sub.attr == "is_cuda":
            return "`.is_cuda`"
        if not isinstance(sub, ast.Call):
            continue
        targets = [kw.value for kw in sub.keywords if kw.arg == "device"]
        if isinstance(sub.func, ast.Attribute) and sub.func.attr == "to":
            targets += sub.args[:1]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "device":
                return f"`{ast.unparse(target)}`"
    return None


def _meets_input(
    function: ast.FunctionDef | ast.AsyncFunctionDef, stack: list[ast.AST], node: ast.AST
) -> str | None:
    """An input of `function` that a tensor it makes on CUDA at `node` is combined with
    (`ones = torch.eye(n).cuda()` then `ones.index_select(0, batch)`): the input's device
    was there to follow. Moving an existing value (`batch.cuda()`) is a choice of device,
    not a new tensor that ignores one; inputs the function reassigns no longer hold the
    caller's device."""
    if not isinstance(node, ast.Call) or _moved_root(node) not in ("torch", None):
        return None
    params = _parameters(function) - _reassigned(function)
    statement = next((n for n in reversed(stack) if isinstance(n, ast.stmt)), None)
    if not params or statement is None or statement is function:
        return None
    uses: list[ast.AST]
    if isinstance(statement, ast.Assign):
        made = {t.id for t in statement.targets if isinstance(t, ast.Name)}
        uses = [
            sub
            for sub in walk(function)
            if isinstance(sub, ast.BinOp | ast.Compare | ast.Call) and made & _names(sub)
        ]
    else:
        made, uses = set(), [statement]  # `return x + torch.ones(3).cuda()`
    for use in uses:
        hit = params & (_operands(use, made) - _names(node))
        if hit:
            return sorted(hit)[0]
    return None


def _reassigned(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {
        sub.id
        for sub in walk(function)
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)
    }


def _operands(use: ast.AST, made: set[str]) -> set[str]:
    """Names whose values `use` combines with the made tensor: both sides of `a + b`
    and `a < b`, the arguments of a method called on it (`made.index_select(0, x)`),
    the other arguments of a call it is passed to (`torch.cat([made, x])`) but not
    the callee (`model(made)`, `model.decode(made, x)`: a module, not a tensor)."""
    if isinstance(use, ast.Call):
        parts: list[ast.AST] = [*use.args, *(kw.value for kw in use.keywords)]
        return set().union(*(_values(p) for p in parts)) - made
    return _values(use) - made


def _values(node: ast.AST) -> set[str]:
    """Names read as values: not a callee (`f(x)`) and not the owner of a plain
    attribute (`cfg.lr`, `x.shape`), but the receiver of a method (`x.unsqueeze(1)`)."""
    nodes = list(walk(node))
    callees = {id(sub.func) for sub in nodes if isinstance(sub, ast.Call)}
    skip = callees | {
        id(sub.value) for sub in nodes if isinstance(sub, ast.Attribute) and id(sub) not in callees
    }
    return {sub.id for sub in nodes if isinstance(sub, ast.Name) and id(sub) not in skip}


def _moved_root(node: ast.AST) -> str | None:
    """`batch` for `batch.float().cuda()` or `batch[0].to("cuda")`: the variable moved;
    `torch` for a tensor made right there (`torch.eye(n).cuda()`)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    value: ast.AST = node.func.value
    while True:
        if isinstance(value, ast.Call):
            value = value.func
        elif isinstance(value, ast.Attribute | ast.Subscript):
            value = value.value
        else:
            break
    return value.id if isinstance(value, ast.Name) else None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}
