"""What reaches a loss function: softmax, log-softmax and sigmoid outputs (TD301, TD302).

Not a rule (the leading underscore keeps the registry away): shared by the two
rules that check a loss against the activation of its input.
"""

from __future__ import annotations

import ast
import re

from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.file_loops import FileLoops, analysis, sibling_file
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.analysis.values import Kind
from torchdoctor.check.context import FileContext, iter_children, spans_a_line, walk

SOFTMAX = "softmax"
LOG_SOFTMAX = "log_softmax"
SIGMOID = "sigmoid"

_FUNCTIONS = {
    "torch.softmax": SOFTMAX,
    "torch.nn.functional.softmax": SOFTMAX,
    "torch.special.softmax": SOFTMAX,
    "torch.log_softmax": LOG_SOFTMAX,
    "torch.nn.functional.log_softmax": LOG_SOFTMAX,
    "torch.special.log_softmax": LOG_SOFTMAX,
    "torch.sigmoid": SIGMOID,
    "torch.nn.functional.sigmoid": SIGMOID,
    "torch.special.expit": SIGMOID,
}
_MODULES = {
    "torch.nn.Softmax": SOFTMAX,
    "torch.nn.LogSoftmax": LOG_SOFTMAX,
    "torch.nn.Sigmoid": SIGMOID,
}
_METHODS = {"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX, "sigmoid": SIGMOID}

CROSS_ENTROPY = "cross_entropy"
NLL = "nll_loss"
BCE = "binary_cross_entropy"
BCE_LOGITS = "binary_cross_entropy_with_logits"
_LOSS_FUNCTIONS = {
    "torch.nn.functional.cross_entropy": CROSS_ENTROPY,
    "torch.nn.functional.nll_loss": NLL,
    "torch.nn.functional.binary_cross_entropy": BCE,
    "torch.nn.functional.binary_cross_entropy_with_logits": BCE_LOGITS,
}
_LOSS_FUNCTION_NAMES = frozenset(_LOSS_FUNCTIONS)
_LOSS_MODULES = {
    "torch.nn.CrossEntropyLoss": CROSS_ENTROPY,
    "torch.nn.NLLLoss": NLL,
    "torch.nn.BCELoss": BCE,
    "torch.nn.BCEWithLogitsLoss": BCE_LOGITS,
}


def loss_calls(ctx: FileContext, kinds: frozenset[str]) -> list[tuple[FunctionInfo, ast.Call, str]]:
    """Every call of a loss of one of `kinds` in the file: (function, call, kind)."""
    fl = analysis(ctx)
    # names assigned a loss module somewhere (`criterion = nn.CrossEntropyLoss()`)
    instances = (
        {m.group(1) for m in _LOSS_INSTANCE.finditer(ctx.source)}
        if "Loss(" in ctx.source
        else set()
    )
    # a loss call's text names the loss, an instance of it or an import alias of it: only
    # statements on such lines are searched for calls
    lines = ctx.lines_holding((*_LOSS_WORDS, *instances, *ctx.call_needles(_LOSS_FUNCTION_NAMES)))
    found = []
    for fi in fl.all_functions():
        if not any(w in fi.text for w in _LOSS_WORDS) and not any(i in fi.text for i in instances):
            continue
        for stmt in fi.own_statements():
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if not spans_a_line(stmt, lines):
                continue
            for node in _shallow_calls(stmt):
                key = dotted(node.func)
                if key is not None and key.rsplit(".", 1)[-1] not in instances:
                    name = ctx.qualname(node.func) or ""
                    if name not in _LOSS_FUNCTIONS:
                        continue
                kind = loss_kind(fl, fi, node)
                if kind in kinds:
                    found.append((fi, node, kind))
    return found


_LOSS_WORDS = ("cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss", "BCE")
_LOSS_INSTANCE = re.compile(
    r"(\w+)\s*=\s*(?:[\w.]+\.)?(?:CrossEntropyLoss|NLLLoss|BCELoss|BCEWithLogitsLoss)\("
)


def _shallow_calls(stmt: ast.stmt) -> list[ast.Call]:
    """Calls in this statement itself (not in the statements nested in it)."""
    out: list[ast.Call] = []
    todo: list[ast.AST] = [
        v
        for name, v in ast.iter_fields(stmt)
        if name not in ("body", "orelse", "finalbody", "handlers", "cases")
        for v in (v if isinstance(v, list) else [v])
        if isinstance(v, ast.AST)
    ]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        todo.extend(iter_children(node))
    return out


def loss_kind(fl: FileLoops, fi: FunctionInfo, call: ast.Call) -> str | None:
    ctx = fl.ctx
    name = ctx.qualname(call.func) or ""
    if name in _LOSS_FUNCTIONS:
        return _LOSS_FUNCTIONS[name]
    if isinstance(call.func, ast.Call):
        return _LOSS_MODULES.get(ctx.qualname(call.func.func) or "")
    key = dotted(call.func)
    if key is None:
        return None
    kinds = {_LOSS_MODULES.get(ctx.qualname(v.func) or "") for v in _assigned_calls(fl, fi, key)}
    if len(kinds) == 1:
        return kinds.pop()
    return None


def _assigned_calls(fl: FileLoops, fi: FunctionInfo, key: str) -> list[ast.Call]:
    """The calls `key` is assigned from: in `fi`, at module level, or `self.x` in the class."""
    scopes: list[FunctionInfo] = [fi]
    if key.startswith("self.") and fi.cls is not None:
        scopes = list(fl.methods.get(fi.cls.name, {}).values())
    elif key not in fi.local_names():
        scopes = [fl.module]
    found: list[ast.Call] = []
    for scope in scopes:
        for stmt in scope.own_statements():
            if isinstance(stmt, ast.Assign) and any(dotted(t) == key for t in stmt.targets):
                value = stmt.value
                while (
                    isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Attribute)
                    and value.func.attr in ("to", "cuda", "cpu")
                ):
                    value = value.func.value
                if not isinstance(value, ast.Call):
                    return []  # assigned something we do not follow
                found.append(value)
    return found


def activation(
    fl: FileLoops, fi: FunctionInfo, expr: ast.expr, depth: int = 0
) -> tuple[str, str] | None:
    """(kind, proof) if `expr` is the output of a softmax / log-softmax / sigmoid."""
    ctx = fl.ctx
    if depth > 3:
        return None
    if isinstance(expr, ast.Name):
        value = _last_assignment(fi, expr.id, expr.lineno)
        if value is None:
            return None
        found = activation(fl, fi, value, depth + 1)
        if found is None:
            return None
        return found[0], f"`{expr.id}` = {found[1]}"
    if not isinstance(expr, ast.Call):
        return None
    func = expr.func
    name = ctx.qualname(func) or ""
    if name in _FUNCTIONS:
        return _FUNCTIONS[name], f"`{_short(ctx, expr)}` (line {expr.lineno})"
    if name == "torch.log" and expr.args:
        inner = activation(fl, fi, expr.args[0], depth + 1)
        if inner and inner[0] == SOFTMAX:
            return LOG_SOFTMAX, f"`{_short(ctx, expr)}` (line {expr.lineno})"
        return None
    if isinstance(func, ast.Call):
        kind = _MODULES.get(ctx.qualname(func.func) or "")
        if kind:
            return kind, f"`{_short(ctx, expr)}` (line {expr.lineno})"
        return None
    if (
        isinstance(func, ast.Attribute)
        and func.attr in _METHODS
        and not (isinstance(func.value, ast.Name) and func.value.id == "self")
    ):
        value = func.value
        if ctx.qualname(value) not in ("torch", "torch.nn.functional"):
            return _METHODS[func.attr], f"`{_short(ctx, expr)}` (line {expr.lineno})"
    key = dotted(func)
    if key is None:
        return None
    if key.startswith("self.") and fi.cls is not None:
        # self.act = nn.Softmax(dim=1) / nn.Sequential(..., nn.Sigmoid())
        ctors = _assigned_calls(fl, fi, key)
        kinds = {_module_activation(fl, c) for c in ctors}
        if len(kinds) == 1 and None not in kinds:
            kind = kinds.pop()
            assert kind is not None
            return kind, f"`{key}` (an `nn.{_CLASS_OF[kind]}`, line {ctors[0].lineno})"
        return None
    return _model_output(fl, fi, func, expr, depth)


_CLASS_OF = {SOFTMAX: "Softmax", LOG_SOFTMAX: "LogSoftmax", SIGMOID: "Sigmoid"}


def _module_activation(fl: FileLoops, ctor: ast.Call) -> str | None:
    name = fl.ctx.qualname(ctor.func) or ""
    if name in _MODULES:
        return _MODULES[name]
    if name == "torch.nn.Sequential" and ctor.args:
        last = ctor.args[-1]
        if isinstance(last, ast.Call):
            return _module_activation(fl, last)
    return None


def _model_output(
    fl: FileLoops, fi: FunctionInfo, func: ast.expr, call: ast.Call, depth: int
) -> tuple[str, str] | None:
    """`model(x)` where model's class ends its forward with a softmax/sigmoid."""
    ctx = fl.ctx
    held = file_flow(ctx).scope(fi.node).value(func)
    if held.kind is not Kind.MODULE or not held.cls:
        return None
    source = held.source
    if isinstance(source, ast.Call):
        kind = _module_activation(fl, source)
        if kind:
            return kind, f"`{ctx.segment(func)}(...)` (its last layer is `nn.{_CLASS_OF[kind]}`)"
    found = _class_forward(fl, held.cls)
    if found is None:
        return None
    owner, forward = found
    returns = [s.value for s in forward.own_statements() if isinstance(s, ast.Return) and s.value]
    if not returns:
        return None
    results = [activation(owner, forward, r, depth + 1) for r in returns]
    kinds = {r[0] if r else None for r in results}
    if len(kinds) == 1 and None not in kinds:
        kind = kinds.pop()
        assert kind is not None
        where = "" if owner is fl else f" in {owner.ctx.path.rsplit('/', 1)[-1]}"
        return kind, (
            f"`{ctx.segment(func)}(...)`, whose `{held.cls}.forward` returns a {kind} output "
            f"(line {returns[0].lineno}{where})"
        )
    return None


def _class_forward(fl: FileLoops, cls: str) -> tuple[FileLoops, FunctionInfo] | None:
    forward = fl.methods.get(cls, {}).get("forward")
    if forward is not None:
        return fl, forward
    target = fl.ctx.imports.get(cls)
    if target and "." in target.lstrip("."):
        module, _, name = target.rpartition(".")
        other = sibling_file(fl.ctx, module)
        if other is not None:
            forward = other.methods.get(name, {}).get("forward")
            if forward is not None:
                return other, forward
    return None


def _last_assignment(fi: FunctionInfo, name: str, line: int) -> ast.expr | None:
    """The value of the last `name = value` above `line` (None: none, or not followed)."""
    last: ast.stmt | None = None
    for stmt in fi.own_statements():
        if stmt.lineno >= line or isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = list(stmt.targets)
        elif isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For):
            targets = [stmt.target]
        elif isinstance(stmt, ast.With):
            targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
        binds = any(isinstance(n, ast.Name) and n.id == name for t in targets for n in walk(t))
        if binds and (last is None or stmt.lineno >= last.lineno):
            last = stmt
    if (
        isinstance(last, ast.Assign)
        and len(last.targets) == 1
        and isinstance(last.targets[0], ast.Name)
    ):
        return last.value
    return None


def _short(ctx: FileContext, node: ast.AST) -> str:
    text = re.sub(r"\s+", " ", ctx.segment(node))
    return text if len(text) <= 50 else text[:47] + "..."
