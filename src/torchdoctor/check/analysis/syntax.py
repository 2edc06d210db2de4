"""Questions about syntax alone: dotted names, bound names, decorators, guards, text scans."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.scope_index import calls_on_lines
from torchdoctor.check.analysis.torch_api import _NO_GRAD_CONTEXTS, MODULE_ONLY_METHODS
from torchdoctor.check.analysis.values import AnyFunction, Env
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import DEFINITIONS, child_fields, iter_children, walk

if TYPE_CHECKING:
    pass


def dotted(node: ast.AST) -> str | None:
    """`self.model.fc` -> "self.model.fc"; None unless a Name/Attribute chain."""
    # (asked for hundreds of thousands of nodes: exact classes, the parser makes no
    # subclasses; a bare name, the commonest, needs no join)
    if node.__class__ is ast.Name:
        return node.id  # type: ignore[attr-defined,no-any-return]
    parts: list[str] = []
    while node.__class__ is ast.Attribute:
        parts.append(node.attr)  # type: ignore[attr-defined]
        node = node.value  # type: ignore[attr-defined]
    if node.__class__ is not ast.Name:
        return None
    parts.append(node.id)  # type: ignore[attr-defined]
    return ".".join(reversed(parts))


def base_name(func: ast.expr) -> str | None:
    """The name a callee's dotted chain starts with (`utils` of `utils.io.load`)."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else None


def is_staticmethod(func: AnyFunction) -> bool:
    """Decorated `@staticmethod` (a classmethod takes its class first)."""
    return any((dotted(d) or "").endswith("staticmethod") for d in func.decorator_list)


def last_part(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def encloses(outer: ast.AST, node: ast.AST) -> bool:
    """Whether `node` is `outer` or lies inside it (its lines first: most are not)."""
    start, end = getattr(outer, "lineno", 0), getattr(outer, "end_lineno", 0) or 0
    return start <= getattr(node, "lineno", -1) <= end and any(n is node for n in walk(outer))


_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def words(text: str) -> list[str]:
    """`runValidation_epoch` -> ["run", "validation", "epoch"] (lowercase)."""
    return [w.lower() for w in _WORD.findall(text)]


_COMPOUND_STATEMENTS = frozenset(
    {ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try}
    | {getattr(ast, name) for name in ("TryStar", "Match") if hasattr(ast, name)}
)


_ASSIGNED_ATTR: dict[str, re.Pattern[str]] = {}


# A function that may return a tensor it makes: a factory call and a return. Each part
# is tried where its first word occurs (the whole, at every position of the text, is 10
# times slower; tests/check/test_returns_factory.py: the same answers).
_FACTORY_CALL = (
    r"\btorch\.(?:zeros|ones|empty|full|rand|randn|randint|arange|tensor|eye|linspace)\("
)
_RETURNED_FACTORY = r"\breturn\b[^\r\n]*\btorch\.(?:zeros|ones|empty|full|rand|randn)\("
RETURNS_FACTORY = rf"{_FACTORY_CALL}[\s\S]*\breturn\b|{_RETURNED_FACTORY}"
_FACTORY_CALL_AT = re.compile(_FACTORY_CALL)
_RETURN_AT = re.compile(r"\breturn\b")
_RETURNED_FACTORY_AT = re.compile(_RETURNED_FACTORY)


_SELF_ATTRIBUTE_USE = re.compile(r"(?<![\w.])(\w+)\.(\w+)\b(\s*\()?")


def attribute_uses(text: str, name: str) -> list[re.Match[str]]:
    """The matches of `_SELF_ATTRIBUTE_USE.finditer(text)` whose receiver is `name`,
    tried only where `name.` occurs (the pattern is tried at every position): a match
    starts only after no word character or `.`, so no other match holds it."""
    found = []
    head = f"{name}."
    at = text.find(head)
    while at >= 0:
        match = _SELF_ATTRIBUTE_USE.match(text, at)
        if match is not None and match.group(1) == name:
            found.append(match)
        at = text.find(head, at + 1)
    return found


_DEF_OR_IMPORT = re.compile(r"\s*(?:(?:async\s+)?(?:def|class)\s+|(?:from\s+\S+\s+)?import\s+.*)")


def returns_factory(text: str) -> bool:
    """Whether a function's text may return a tensor it makes with a factory: whether
    `RETURNS_FACTORY` matches in it."""
    if "return" not in text or "torch." not in text:
        return False
    call = _match_at(text, "torch.", _FACTORY_CALL_AT)
    if call is not None and _match_at(text, "return", _RETURN_AT, call.end()) is not None:
        return True  # (after the first call, the first that ends)
    return _match_at(text, "return", _RETURNED_FACTORY_AT) is not None


def findall_at(text: str, word: str, pattern: re.Pattern[str]) -> list[str]:
    """`pattern.findall(text)` for a pattern with one group whose every match starts with
    `word`, tried only where `word` occurs (a pattern that starts with `\\b` or a class
    is tried at every position)."""
    found = []
    at = text.find(word)
    while at >= 0:
        match = pattern.match(text, at)
        if match is not None:
            found.append(match.group(1))
            at = text.find(word, max(match.end(), at + 1))
        else:
            at = text.find(word, at + 1)
    return found


def _match_at(
    text: str, word: str, pattern: re.Pattern[str], start: int = 0
) -> re.Match[str] | None:
    """The first match of `pattern` (which starts with `word`) at or after `start`."""
    at = text.find(word, start)
    while at >= 0:
        match = pattern.match(text, at)
        if match is not None:
            return match
        at = text.find(word, at + 1)
    return None


def _is_static(func: AnyFunction) -> bool:
    for dec in func.decorator_list:
        name = dotted(dec) or ""
        if name.endswith(("staticmethod", "classmethod")):
            return True
    return False


_NON_TENSOR_ANNOTATIONS = frozenset(
    {"int", "float", "bool", "str", "bytes", "dict", "Dict", "tuple", "Tuple", "Callable"}
)


def _looks_like_tensor_arg(func: AnyFunction, arg: ast.arg) -> bool:
    """A `forward` argument that is a tensor in practice (not a flag or a size)."""
    if arg.annotation is not None:
        text = dotted(arg.annotation) or ""
        if isinstance(arg.annotation, ast.Subscript):
            text = dotted(arg.annotation.value) or ""
            if text.endswith("Optional"):
                inner = arg.annotation.slice
                text = dotted(inner) or ""
        return text.rsplit(".", 1)[-1] == "Tensor"
    params = [*func.args.posonlyargs, *func.args.args]
    defaults = func.args.defaults
    with_default = params[len(params) - len(defaults) :]
    if arg in with_default:
        default = defaults[with_default.index(arg)]
        return isinstance(default, ast.Constant) and default.value is None
    return True


def _is_zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def _weaken(head: Env, entry: Env) -> Env:
    """After too many loop passes: keep only what the loop entry already agreed on."""
    return {k: v for k, v in head.items() if entry.get(k) == v}


def _target_names(target: ast.expr) -> Iterator[str]:
    for node in walk(target):
        if isinstance(node, ast.Name):
            yield node.id


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _is_no_grad_context(expr: ast.expr, ctx: FileContext) -> bool:
    if isinstance(expr, ast.Call):
        name = ctx.qualname(expr.func) or ""
        if name in _NO_GRAD_CONTEXTS:
            return True
        if name == "torch.set_grad_enabled" and expr.args:
            arg = expr.args[0]
            return isinstance(arg, ast.Constant) and arg.value is False
        return False
    return (ctx.qualname(expr) or "") in _NO_GRAD_CONTEXTS


def _decorated_no_grad(func: AnyFunction, ctx: FileContext) -> bool:
    return any(_is_no_grad_context(dec, ctx) for dec in func.decorator_list)


_IMPORTS = frozenset({ast.Import, ast.ImportFrom})
_DECLARATIONS = frozenset({ast.Global, ast.Nonlocal})
_NAMED_PATTERNS = frozenset({ast.MatchAs, ast.MatchStar})  # the patterns with a `name`


def _local_names(func: AnyFunction) -> frozenset[str]:
    """Names bound in `func`'s own scope (parameters, assignments, imports, defs)."""
    args = func.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    if args.vararg:
        names.add(args.vararg.arg)
    if args.kwarg:
        names.add(args.kwarg.arg)
    declared_global: set[str] = set()
    # (run for every function the flow analysis enters: exact classes, the parser makes
    # no subclasses; operators and contexts are not entered, a name's context is read)
    table = child_fields(want_operators=False)
    todo: list[ast.AST] = list(func.body)
    while todo:
        node = todo.pop()
        cls = node.__class__
        if cls is ast.Name:
            if node.ctx.__class__ is not ast.Load:  # type: ignore[attr-defined]
                names.add(node.id)  # type: ignore[attr-defined]
            continue
        if cls in DEFINITIONS:
            names.add(node.name)  # type: ignore[attr-defined]
            todo.extend(node.decorator_list)  # type: ignore[attr-defined]
            continue
        if cls is ast.Lambda:
            continue
        if cls in _IMPORTS:
            for alias in node.names:  # type: ignore[attr-defined]
                names.add(alias.asname or alias.name.split(".", 1)[0])
        elif cls in _DECLARATIONS:
            declared_global.update(node.names)  # type: ignore[attr-defined]
            continue
        elif (cls is ast.ExceptHandler or cls in _NAMED_PATTERNS) and node.name:  # type: ignore[attr-defined]
            names.add(node.name)  # type: ignore[attr-defined]
        # `iter_children(node, operators=False)` inlined, as in scope_index.own_nodes: a call
        # per node costs a third more on this hot walk
        fields = table.get(cls)
        if fields is None:
            todo.extend(iter_children(node, operators=False))
            continue
        for name in fields:
            value = getattr(node, name, None)
            if value.__class__ is list:
                todo.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                todo.append(value)
    return frozenset(names - declared_global)


def binding_targets(
    node: ast.AST, *, walrus: bool = False, comprehensions: bool = False
) -> list[ast.expr]:
    """The targets a statement or `with` item binds to: assignment and loop targets, `as`
    names; with `walrus`, `(x := ...)`; with `comprehensions`, `for x in` of one."""
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor):
        return [node.target]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [node.optional_vars]
    if walrus and isinstance(node, ast.NamedExpr):
        return [node.target]
    if comprehensions and isinstance(node, ast.comprehension):
        return [node.target]
    return []


def assigned_values(scope: ast.AST, name: str) -> list[ast.expr] | None:
    """The values plain `name = value` statements of `scope` give `name`; None when the
    scope also binds it another way (unpacked, a loop or `with` target, an annotated or
    augmented assignment, `:=`): then its value is not one of those."""
    values: list[ast.expr] = []
    for node in walk(scope):
        for target in binding_targets(node, walrus=True):
            if isinstance(node, ast.Assign) and isinstance(target, ast.Name):
                if target.id == name:
                    values.append(node.value)
            elif any(isinstance(n, ast.Name) and n.id == name for n in walk(target)):
                return None
    return values


def bound_names(stmt: ast.stmt) -> list[str]:
    """The plain names in the targets `stmt` binds itself (not in nested statements),
    once per occurrence: assignment and loop targets, each `with` item's `as` name."""
    parts = stmt.items if isinstance(stmt, ast.With | ast.AsyncWith) else [stmt]
    targets = [t for part in parts for t in binding_targets(part)]
    return [n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)]


def loop_counter(loop: ast.AST) -> str | None:
    """The name holding a loop's pass number: the target of `for i in range(...)`, or the
    index of `for i, b in enumerate(...)`; None for any other loop."""
    if not isinstance(loop, ast.For | ast.AsyncFor) or not isinstance(loop.iter, ast.Call):
        return None
    func = loop.iter.func
    name = func.id if isinstance(func, ast.Name) else None
    target = loop.target
    if name == "enumerate" and isinstance(target, ast.Tuple) and target.elts:
        target = target.elts[0]
    elif name != "range":
        return None
    return target.id if isinstance(target, ast.Name) else None


def bound_keys(node: ast.AST, *, comprehensions: bool = False) -> list[str]:
    """The dotted names (`x`, `self.h`) a statement or `with` item binds: assignment
    and loop targets, `as` names; with `comprehensions`, also walrus and comprehension
    targets. Every name inside a target counts (`a, b.c = ...` binds `a`, `b.c`, `b`)."""
    keys = []
    for target in binding_targets(node, walrus=comprehensions, comprehensions=comprehensions):
        for t in walk(target):
            key = dotted(t) if isinstance(t, ast.Name | ast.Attribute) else None
            if key is not None:
                keys.append(key)
    return keys


def module_receivers(scope: ast.AST, ctx: FileContext | None = None) -> frozenset[str]:
    """Names (`model`, `self.net`) that the scope calls a method only an nn.Module has
    on (`model.eval()`, `net.parameters()`); nested defs and classes are not looked in.

    With `ctx`, the calls on the lines that name such a method are indexed once for
    every scope of the file: the scopes themselves are never walked."""
    if ctx is not None:
        index: dict[int, frozenset[str]] = ctx.shared("module_receivers_index", _receivers_index)
        return index.get(id(scope), frozenset())
    return frozenset(
        key
        for node in own_code(getattr(scope, "body", ()))
        if (key := _module_method_receiver(node)) is not None
    )


def _receivers_index(ctx: FileContext) -> dict[int, frozenset[str]]:
    found: dict[int, set[str]] = {}
    for scope, call in calls_on_lines(ctx, ctx.lines_holding(MODULE_ONLY_METHODS)):
        key = _module_method_receiver(call)
        if key is not None:
            found.setdefault(id(scope), set()).add(key)
    return {scope: frozenset(keys) for scope, keys in found.items()}


def _module_method_receiver(node: ast.AST) -> str | None:
    """`model` of `model.eval()` (a method only an nn.Module has)."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in MODULE_ONLY_METHODS
    ):
        return dotted(node.func.value)
    return None


def own_code(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """The nodes of `body` that run with it: not those inside the functions, classes
    and lambdas it defines (in no particular order)."""
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        yield node
        todo.extend(iter_children(node))


def lines_matching(ctx: FileContext, needles: Iterable[str], pattern: re.Pattern[str]) -> list[int]:
    """The lines (ascending) that `pattern` matches from their start, among those holding
    a needle.

    The same lines as a MULTILINE `^...` search of the whole text whenever every match
    lies on one line and holds a needle, without trying the pattern at every position.
    """
    source, start = ctx.source, ctx.line_offset
    # (each line once: not every hit widened to its line)
    return [line for line in ctx.lines_holding(needles) if pattern.match(source, start(line))]


def dead_loop_rebinding(scope: ast.AST, call: ast.expr) -> bool:
    """`for v in xs: v = v.to(device)` where `call` is the value and `v` is read neither
    later in the loop body nor after the loop: the loop variable is rebound and the result
    is lost (the next pass binds `v` to the next item before any read)."""
    loop: ast.For | ast.AsyncFor | None = None
    assign: ast.Assign | None = None
    for node in walk(scope):
        if not isinstance(node, ast.For | ast.AsyncFor) or not isinstance(node.target, ast.Name):
            continue
        for stmt in node.body:
            if (
                isinstance(stmt, ast.Assign)
                and stmt.value is call
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == node.target.id
                and isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id == node.target.id  # `v = v.to(...)`, v's own move
            ):
                loop, assign = node, stmt
    if loop is None or assign is None or not isinstance(loop.target, ast.Name):
        return False
    name = loop.target.id
    after = assign.end_lineno or assign.lineno
    for node in walk(scope):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Store):
            if node.lineno > after:
                return False  # read after the rebinding (later in the body or after the loop)
        elif (
            isinstance(node, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef)
            and node is not scope
            and any(isinstance(n, ast.Name) and n.id == name for n in walk(node))
        ):
            return False  # a closure may read it
    return True


def accessed_value(node: ast.expr) -> ast.expr:
    """The value an expression reads through subscripts and method calls:
    `self.pe[:n].float()` -> `self.pe`."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return node
