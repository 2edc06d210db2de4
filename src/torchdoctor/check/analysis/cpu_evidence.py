"""Where a scope itself shows that a value can be on a device: it brings it to the CPU.

    error = criterion(output, target)
    score = error.view(-1).data.cpu().numpy()   # the author moves `error` to the CPU...
    if details:
        errors.append(error.data.numpy())        # ...and here forgets: raises on a GPU

Where `error` comes from may be out of sight (a model moved by a base class in another
file), but the `.cpu()` says the author holds it as possibly on a device; if it never
is, that `.cpu()` is pointless, and if it is, the bare conversion raises. A name's
CPU evidence counts for a use only when

- both reach the same binding (no assignment of the name between them, in source
  order), through place-preserving steps only (`.data`, `.view(...)`, the tensor
  methods of library.toml [tensor] preserving_methods and reductions; not subscripts:
  the items of a container are different values), and
- the `.cpu()` is not on a branch the use is not on (`x.cpu().numpy() if cuda else
  x.numpy()`, `if x.is_cuda: return x.cpu()...`: the paths correlate).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from torchdoctor.check.analysis.torch_api import _TENSOR_ATTRS_SAME, PRESERVING_METHODS, REDUCTIONS
from torchdoctor.check.context import FileContext

# steps that keep a tensor where it is
_KEEP_METHODS = (
    PRESERVING_METHODS | REDUCTIONS | {"detach", "view", "reshape", "view_as", "reshape_as"}
)
_KEEP_ATTRS = _TENSOR_ATTRS_SAME | {"data"}
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

# (id of a conditional node, which branch): If body/orelse, IfExp body/orelse, a
# try's body and else / each handler, the right operands of `and`/`or`
_Branch = tuple[int, int]


@dataclass(frozen=True)
class CpuEvidence:
    """A `.cpu()` of a name's value (through place-preserving steps)."""

    call: ast.Call
    position: tuple[int, int]
    branches: frozenset[_Branch]


@dataclass
class _ScopeFacts:
    evidence: dict[str, list[CpuEvidence]]
    stores: dict[str, list[tuple[int, int]]]
    branches: dict[int, frozenset[_Branch]]  # id(node) -> its conditional branches


def root_name(node: ast.expr) -> str | None:
    """The name a value is read from through place-preserving steps (`err.view(-1).data`
    -> "err"; `batch[0]` -> None: a container's items differ); None when a step moves it
    (`.cpu()`, `.to(...)`) or is not known."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute) and node.attr in _KEEP_ATTRS:
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _KEEP_METHODS
        ):
            node = node.func.value
        else:
            return None


def cpu_evidence_for(ctx: FileContext, scope: ast.AST, use: ast.expr) -> CpuEvidence | None:
    """The first `.cpu()` in `scope` of the value `use` reads (see the module doc)."""
    name = root_name(use)
    if name is None:
        return None
    facts = _facts(ctx, scope)
    found = facts.evidence.get(name)
    if not found:
        return None
    at = (use.lineno, use.col_offset)
    mine = facts.branches.get(id(use), frozenset())
    stores = facts.stores.get(name, [])
    for ev in found:
        low, high = min(at, ev.position), max(at, ev.position)
        if any(low < s < high for s in stores):
            continue  # another binding between them: another value
        if ev.branches <= mine:
            return ev
    return None


def _facts(ctx: FileContext, scope: ast.AST) -> _ScopeFacts:
    cache: dict[int, _ScopeFacts] = ctx.shared("cpu_evidence", lambda _: {})
    found = cache.get(id(scope))
    if found is None:
        found = cache[id(scope)] = _collect(scope)
    return found


def _collect(scope: ast.AST) -> _ScopeFacts:
    facts = _ScopeFacts({}, {}, {})
    # (node, its branches, the names comprehensions around it bind)
    todo: list[tuple[ast.AST, frozenset[_Branch], frozenset[str]]] = [
        (child, frozenset(), frozenset()) for child in ast.iter_child_nodes(scope)
    ]
    while todo:
        node, branches, local = todo.pop()
        if isinstance(node, _NESTED):
            continue  # another scope (its defaults are rare enough to ignore)
        if isinstance(node, _COMPREHENSIONS):
            # `[e.cpu() for e in errs]`: that `e` is the comprehension's own
            local = local | {
                n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)
            }
        facts.branches[id(node)] = branches
        _note(node, branches, local, facts)
        for child, branch in _children(node):
            todo.append((child, branches | {branch} if branch is not None else branches, local))
    for positions in facts.stores.values():
        positions.sort()
    for evidence in facts.evidence.values():
        evidence.sort(key=lambda ev: ev.position)
    return facts


def _note(
    node: ast.AST, branches: frozenset[_Branch], local: frozenset[str], facts: _ScopeFacts
) -> None:
    if isinstance(node, ast.Name) and node.id in local:
        return  # a comprehension's own variable
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        facts.stores.setdefault(node.id, []).append((node.lineno, node.col_offset))
    elif isinstance(node, ast.arg):
        facts.stores.setdefault(node.arg, []).append((node.lineno, node.col_offset))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _to_cpu(node):
        name = root_name(node.func.value)
        if name is not None and name not in local:
            where = (node.lineno, node.col_offset)
            facts.evidence.setdefault(name, []).append(CpuEvidence(node, where, branches))


def _to_cpu(call: ast.Call) -> bool:
    """`.cpu()`, `.to("cpu")`, `.to(device="cpu")`."""
    assert isinstance(call.func, ast.Attribute)
    if call.func.attr == "cpu":
        return not call.args
    if call.func.attr != "to":
        return False
    target = call.args[0] if call.args else None
    for kw in call.keywords:
        if kw.arg == "device":
            target = kw.value
    return isinstance(target, ast.Constant) and target.value == "cpu"


def _children(node: ast.AST) -> list[tuple[ast.AST, _Branch | None]]:
    """Child nodes, each with the conditional branch it lies on (None: no new branch)."""
    key = id(node)
    if isinstance(node, ast.If | ast.IfExp):
        body = node.body if isinstance(node.body, list) else [node.body]
        orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
        return [
            (node.test, None),
            *((c, (key, 0)) for c in body),
            *((c, (key, 1)) for c in orelse),
        ]
    if isinstance(node, ast.Try):
        # the body is a branch too: a handler runs because it failed (`try: x.cpu()
        # except AttributeError: x.numpy()` is about what x is, not where)
        out: list[tuple[ast.AST, _Branch | None]] = [(c, (key, 0)) for c in node.body]
        for i, handler in enumerate(node.handlers, start=1):
            out.append((handler, (key, i)))
        out.extend((c, (key, 0)) for c in node.orelse)
        out.extend((c, None) for c in node.finalbody)
        return out
    if isinstance(node, ast.BoolOp):
        return [(v, (key, i) if i else None) for i, v in enumerate(node.values)]
    return [(c, None) for c in ast.iter_child_nodes(node)]
