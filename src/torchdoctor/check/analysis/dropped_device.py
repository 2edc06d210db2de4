"""A device the caller was given, dropped at a call whose default is CUDA.

`class Attention(nn.Module): def __init__(self, dim, device="cuda")` is a fine default
on its own (the caller chooses). But `class Block: def __init__(self, dim, device):
self.attn = Attention(dim)` was given a device and builds the attention without it:
whatever its user chooses (`Block(dim, device="cpu")`), the attention takes CUDA, and
fails on a machine without one. The project index keeps the classes with such a
default (`cuda_default_classes`); TD101 asks `dropped_device` at each call of one.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from torchdoctor.check.parsed_trees import parse_kept
from torchdoctor.check.tree_walk import parameter_defaults, walk, walk_statements

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# `device="cuda"`, `device: str = 'cuda:0'` in a signature (a cheap gate before parsing)
_CUDA_DEFAULT = re.compile(r"""device\w*\s*(?::[^=\n]*)?=\s*['"]cuda""")
_CUDA_LITERAL = re.compile(r"cuda(?::\d+)?")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)

CudaDefault = tuple[str, int, str, str, int]  # (parameter, position, literal, file, line)


def cuda_default_classes(path: str, source: str) -> dict[str, CudaDefault]:
    """Classes of `source` whose `__init__` has a device parameter defaulting to a CUDA
    literal that its body uses."""
    found: dict[str, CudaDefault] = {}
    if not _in_an_init_signature(source):
        return found
    try:
        tree = parse_kept(path, source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return found
    for cls in walk_statements(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        init = next(
            (s for s in cls.body if isinstance(s, _FUNCTIONS) and s.name == "__init__"), None
        )
        if init is None:
            continue
        args = init.args
        params = [*args.posonlyargs, *args.args]
        for arg, default in parameter_defaults(args):
            if "device" not in arg.arg.lower() or not _is_cuda(default):
                continue
            if not _uses(init, arg.arg):
                continue
            position = params.index(arg) - 1 if arg in params else -1
            assert isinstance(default, ast.Constant)
            found[cls.name] = (arg.arg, position, str(default.value), path, default.lineno)
            break
    return found


def _in_an_init_signature(source: str) -> bool:
    """A CUDA device default between `def __init__(` and the signature's end (`):` or
    `) ->`): the only files worth parsing (many more give a function such a default)."""
    at = source.find("def __init__(")
    while at >= 0:
        end = min(
            (e for e in (source.find("):", at), source.find(") ->", at)) if e >= 0),
            default=len(source),
        )
        if _CUDA_DEFAULT.search(source, at, end):
            return True
        at = source.find("def __init__(", end)
    return False


def _is_cuda(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _CUDA_LITERAL.fullmatch(node.value) is not None
    )


def _uses(func: ast.AST, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in walk(func)
    )


def dropped_device(ctx: FileContext, stack: list[ast.AST], call: ast.Call) -> str | None:
    """Why `call` (ancestors in `stack`) hard-wires CUDA: it builds a class whose device
    defaults to CUDA without passing the device its function was given; else None."""
    func = call.func
    last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    fact = ctx.project.cuda_defaults.get(last)
    if fact is None:
        return None
    param, position, literal, path, line = fact
    if any(kw.arg is None or kw.arg == param for kw in call.keywords):
        return None  # passed (or maybe, through **kwargs)
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    if 0 <= position < len(call.args):
        return None
    qual = ctx.qualname(func) or ""
    if qual.startswith(("torch.", "numpy.")):
        return None
    function = next((n for n in reversed(stack) if isinstance(n, _FUNCTIONS)), None)
    if function is None:
        return None
    args = function.args
    given = next(
        (
            a.arg
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
            if "device" in a.arg.lower()
        ),
        None,
    )
    if given is None:
        return None  # no device was chosen here to be dropped
    cls = next((n for n in reversed(stack) if isinstance(n, ast.ClassDef)), None)
    owner = f"{cls.name}.{function.name}" if cls is not None else function.name
    where = "" if path == ctx.path else f"{_short_path(path)} "
    return (
        f"`{last}(...)` gets no `{param}=`, so it takes its default `{literal!r}` "
        f"({where}line {line}) whatever `{given}` `{owner}` was given; pass "
        f"`{param}={given}`"
    )


def _short_path(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]
