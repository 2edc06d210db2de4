"""Where a program pickles whole `nn.Module`s: `torch.save(model, path)`,
`pickle.dump(net, f)`, `torch.save(self, ...)` in a module's method.

TD405 asks, in the file (`module_pickles`) and across the project
(`ProjectIndex.module_pickles`, filled by `project_pickles` for the files whose text
holds such a call): a lambda stored on a module that is pickled whole cannot be stored.
Each site says which module class it pickles when the code shows it (`Net()`, `self` in
`Net`), or "" when the module comes from where the analysis cannot see (a parameter
named `model`, `registry[name](...)`): then any model of the project may be the one.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

from torchdoctor.check.analysis.scope_index import binding, calls_on_lines
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk_statements

_PICKLES = frozenset({"pickle.dump", "pickle.dumps", "torch.save", "torch.serialization.save"})
_PICKLE_NAMES = frozenset(name.rsplit(".", 1)[-1] for name in _PICKLES)
# Methods that return the module itself (or a converted copy of it).
_MODULE_METHODS = frozenset({"cpu", "to", "cuda", "eval", "train", "half", "float"})
# Names that, in PyTorch code, mean a module when nothing else is known (as TD401).
_MODEL_NAME = re.compile(
    r"(model|net|network|generator|discriminator|encoder|decoder|classifier|backbone)"
    r"|\w*_(model|net)",
    re.IGNORECASE,
)
# A pickle call whose first argument is a name, maybe `.module` or converted
# (`torch.save(model, ...)`, `pickle.dump(net.cpu(), f)`): the files worth parsing for
# the project's facts (a state dict, a dict or a call result is no whole module).
_PICKLE_TEXT = re.compile(
    r"(?:torch\.save|pickle\.dumps?)\(\s*([A-Za-z_]\w*)(?:\.module)?(?:\.(?:cpu|to|cuda|eval|train|half|float)"
    r"\([^()]*\))?\s*[,)]"
)
# First arguments named as plain data (`torch.save(checkpoint, path)`): not worth a parse.
_DATA_NAME = re.compile(r"state|dict|ckpt?|checkpoint|data|optim|embed|feature|tensor|meta", re.I)


@dataclass(frozen=True)
class ModulePickle:
    call: ast.Call
    cls: str  # the module class pickled; "" when the code does not show which


def module_pickles(ctx: FileContext) -> list[ModulePickle]:
    """The calls of this file that pickle a whole module (once per file)."""
    return ctx.shared("module_pickles", _module_pickles)


def _module_pickles(ctx: FileContext) -> list[ModulePickle]:
    if not any(ctx.holds(f"{last}(") for last in _PICKLE_NAMES):
        return []  # cheap first: most files pickle nothing
    found = []
    lines = ctx.lines_holding([f"{last}(" for last in _PICKLE_NAMES])
    for scope, call in calls_on_lines(ctx, lines):
        func = call.func
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if not (call.args and last in _PICKLE_NAMES and (ctx.qualname(func) or "") in _PICKLES):
            continue
        cls = _module_class(ctx, call.args[0], scope, call.lineno, depth=4)
        if cls is not None:
            found.append(ModulePickle(call, cls))
    return found


def may_pickle_modules(source: str) -> bool:
    """Whether the text may pickle a whole module (a cheap gate before parsing)."""
    if "torch.save(" not in source and "pickle.dump" not in source:
        return False
    return any(not _DATA_NAME.search(m.group(1)) for m in _PICKLE_TEXT.finditer(source))


def project_pickles(ctx: FileContext) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(where "path:line", the call's text, the class or "", the dotted names the file
    imports) of this file's module pickles: the pickled model is built from the files of
    its folder and of the packages it imports (`reaches`)."""
    found = module_pickles(ctx)
    if not found:
        return []
    # the dotted names it imports (`kit.models.Net`, `..models.Net`)
    imported = tuple(sorted({t for t in ctx.imports.values() if t}))
    return [
        (f"{ctx.path}:{p.call.lineno}", ctx.segment(p.call)[:60], p.cls, imported) for p in found
    ]


def reaches(site: str, imported: tuple[str, ...], path: str) -> bool:
    """Whether the program of the pickle at file `site` may use the file `path`: one
    in the site's folder (or below), or in a package it imports by name, a folder beside
    one of the site's folders (`tests/test_save.py` importing `zoo` uses `zoo/...`). A
    folder of unrelated examples (`a/train.py`, `b/net.py`) is another program. Inside
    the package the site lies in, only the modules it imports by their dotted name count:
    every module of `torch` imports `torch`, which alone does not make a test helper of
    `torch/testing/` pickle the models of `torch/_dynamo/` (importing `torch._dynamo`
    does)."""
    if not site:
        return False  # a text with no path: where it lies is unknown
    here = os.path.dirname(os.path.abspath(site))
    target = os.path.abspath(path)
    if target.startswith(here + os.sep):
        return True
    parts = target.split(os.sep)
    parts[-1] = os.path.splitext(parts[-1])[0]  # `models.py` is the module `models`
    for dotted in imported:
        if dotted.startswith("."):  # `from ..models import Net`: from the site's folder
            level = len(dotted) - len(dotted.lstrip("."))
            base = here
            for _ in range(level - 1):
                base = os.path.dirname(base)
            first = dotted.lstrip(".").split(".", 1)[0]
            module = os.path.join(base, first)
            if first and (target == module + ".py" or target.startswith(module + os.sep)):
                return True
            continue
        names = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            if part != names[0]:
                continue
            parent = os.sep.join(parts[:i])
            if not (here == parent or here.startswith(parent + os.sep)):
                continue
            package = os.path.join(parent, part)
            if here == package or here.startswith(package + os.sep):
                # its own package: the imported module must lead to the file
                if len(names) > 1 and parts[i + 1 : i + 2] == names[1:2]:
                    return True
                continue
            return True
    return False


def _module_class(
    ctx: FileContext, obj: ast.expr, scope: ast.AST, line: int, depth: int
) -> str | None:
    """The module class `obj` holds ("" if a module of a class not shown), or None when
    it is not shown to be a module."""
    while (
        isinstance(obj, ast.Call)
        and isinstance(obj.func, ast.Attribute)
        and obj.func.attr in _MODULE_METHODS
    ):
        obj = obj.func.value
    if isinstance(obj, ast.Attribute) and obj.attr == "module":
        obj = obj.value
    if isinstance(obj, ast.Call):
        return _built_class(ctx, obj)
    if not isinstance(obj, ast.Name) or depth < 0:
        return None
    if obj.id == "self":
        owner = next(
            (
                c
                for c in walk_statements(ctx.tree)
                if isinstance(c, ast.ClassDef) and any(m is scope for m in c.body)
            ),
            None,
        )
        return owner.name if owner is not None and ctx.is_module_class(owner) else None
    bound = binding(ctx, scope, obj.id, line)
    named = bool(_MODEL_NAME.fullmatch(obj.id))
    if bound is None:
        return "" if named else None  # a parameter or a global: the name decides
    found = _module_class(ctx, bound, scope, line, depth - 1)
    if found is None and named and _looked_up(bound):
        return ""  # `net = models[name](...)`: unknown, as a parameter is
    return found


def _built_class(ctx: FileContext, call: ast.Call) -> str | None:
    name = ctx.qualname(call.func) or ""
    last = name.rsplit(".", 1)[-1]
    if not last[:1].isupper():
        return None
    if name.startswith("torch.nn.") or ctx.project.is_module_class_name(name):
        return last
    return None


def _looked_up(value: ast.expr) -> bool:
    """A call of what a lookup by a computed key returns (`registry[name](...)`,
    `getattr(models, arch)(...)`): which callable it is, the code does not say."""
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Subscript | ast.Call)
