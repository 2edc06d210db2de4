"""Where a scope itself shows that a value can be on a device: it brings it to the CPU.

    error = criterion(output, target)
    score = error.view(-1).data.cpu().numpy()   # the author moves `error` to the CPU...
    if details:
        errors.append(error.data.numpy())        # ...and here forgets: raises on a GPU

Where `error` comes from may be out of sight (a model moved by a base class in another
file), but the `.cpu()` says the author holds it as possibly on a device; if it never
is, that `.cpu()` is pointless, and if it is, the bare conversion raises. A value's
CPU evidence counts for a use only when

- both read the same value: the same names (no assignment of one between them, in
  source order), through place-preserving steps only (`.data`, `.view(...)`, the tensor
  methods of library.toml [tensor] preserving_methods and reductions) and the same
  subscripts (`outs[k]`: the items of a container are different values), or the use
  reads a part of the value brought to the CPU (`x[0, 0]` of `x.cpu()`: what has
  `.cpu()` is a tensor, and its parts are where it is; `x[a, b]` is `x[a][b]`).
  A comprehension's own variable stands for the items of what it iterates: two
  comprehensions over the same iterable text read the same items
  (`[w[i].cpu() for i in range(n)]`, `[w[i][0] for i in range(n)]`), and
- the `.cpu()` is not on a branch the use is not on (`x.cpu().numpy() if cuda else
  x.numpy()`, `if x.is_cuda: return x.cpu()...`: the paths correlate), unless that
  branch is chosen by a test of a shape alone (`if len(w.size()) == 1:`, `x.dim() == 2`):
  a shape says nothing of where a tensor is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from torchdoctor.check.analysis.torch_api import (
    _TENSOR_ATTRS_SAME,
    PRESERVING_METHODS,
    REDUCTIONS,
    is_cpu_name,
)
from torchdoctor.check.context import IDENTIFIER, FileContext
from torchdoctor.check.tree_walk import iter_children, walk

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
    """A `.cpu()` of a value (read through place-preserving steps and subscripts)."""

    call: ast.Call
    position: tuple[int, int]
    branches: frozenset[_Branch]
    key: tuple[str, ...] = ()  # what it reads: the name, then each subscript's text
    names: frozenset[str] = frozenset()  # the names that reading depends on


# A comprehension's own names -> the text of what the generator binding each iterates
_Locals = dict[str, str]
_NO_LOCALS: _Locals = {}


@dataclass
class _ScopeFacts:
    evidence: dict[str, list[CpuEvidence]]  # by the name the value is read from
    stores: dict[str, list[tuple[int, int]]]
    branches: dict[int, frozenset[_Branch]]  # id(node) -> its conditional branches
    # id(node) -> the comprehension names in force there (for a use inside one)
    locals: dict[int, _Locals] = field(default_factory=dict)
    shape_tests: set[int] = field(default_factory=set)  # ids of ifs testing a shape alone


def root_name(node: ast.expr) -> str | None:
    """The name a value is read from through place-preserving steps (`err.view(-1).data`
    -> "err"; `batch[0]` -> None: a container's items differ); None when a step moves it
    (`.cpu()`, `.to(...)`) or is not known."""
    node = _kept(node)
    return node.id if isinstance(node, ast.Name) else None


def _kept(node: ast.expr) -> ast.expr:
    """`node` without its trailing place-preserving steps."""
    while True:
        if isinstance(node, ast.Attribute) and node.attr in _KEEP_ATTRS:
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _KEEP_METHODS
        ):
            node = node.func.value
        else:
            return node


def access_key(
    node: ast.expr, local: _Locals = _NO_LOCALS
) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """What `node` reads: (its root name, then each subscript's index text, `x[a, b]`
    read as `x[a][b]`; a comprehension's own name as "@<what it iterates>"), and the
    outer names that depends on; None for anything else."""
    parts: list[str] = []
    names: set[str] = set()
    node = _kept(node)
    while isinstance(node, ast.Subscript):
        index = node.slice
        items = index.elts if isinstance(index, ast.Tuple) else [index]
        texts = []
        for item in items:
            text = _index_text(item, local, names)
            if text is None:
                return None
            texts.append(text)
        parts[:0] = texts
        node = _kept(node.value)
    if not isinstance(node, ast.Name):
        return None
    root = _name_text(node.id, local, names)
    return (root, *parts), frozenset(names)


def _name_text(name: str, local: _Locals, names: set[str]) -> str:
    if name in local:
        iterated = local[name]
        names.update(IDENTIFIER.findall(iterated))
        return f"@{iterated}"
    names.add(name)
    return name


def _index_text(item: ast.expr, local: _Locals, names: set[str]) -> str | None:
    """The text of an index that reads a fixed item: a constant, a name, a slice of
    those; None otherwise (`x[f(i)]`)."""
    if isinstance(item, ast.Constant):
        return repr(item.value)
    if isinstance(item, ast.Name):
        return _name_text(item.id, local, names)
    if isinstance(item, ast.UnaryOp) and isinstance(item.operand, ast.Constant):
        return ast.unparse(item)
    if isinstance(item, ast.Slice):
        ends = [item.lower, item.upper, item.step]
        texts = [None if e is None else _index_text(e, local, names) for e in ends]
        if any(t is None and e is not None for t, e in zip(texts, ends, strict=True)):
            return None
        return ":".join(t or "" for t in texts)
    return None


def cpu_evidence_for(ctx: FileContext, scope: ast.AST, use: ast.expr) -> CpuEvidence | None:
    """The first `.cpu()` in `scope` of the value `use` reads (see the module doc)."""
    facts = _facts(ctx, scope)
    found = access_key(use, facts.locals.get(id(use), _NO_LOCALS))
    if found is None:
        return None
    key, names = found
    candidates = facts.evidence.get(key[0])
    if not candidates:
        return None
    at = (use.lineno, use.col_offset)
    mine = facts.branches.get(id(use), frozenset())
    for ev in candidates:
        # the same value, or a part of the tensor brought to the CPU
        if key[: len(ev.key)] != ev.key:
            continue
        low, high = min(at, ev.position), max(at, ev.position)
        if any(low < s < high for n in names | ev.names for s in facts.stores.get(n, [])):
            continue  # another binding between them: another value
        if {b for b in ev.branches if b[0] not in facts.shape_tests} <= mine:
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
    ifs: list[ast.If] = []
    # (node, its branches, the names comprehensions around it bind)
    todo: list[tuple[ast.AST, frozenset[_Branch], _Locals]] = [
        (child, frozenset(), _NO_LOCALS) for child in iter_children(scope)
    ]
    while todo:
        node, branches, local = todo.pop()
        if isinstance(node, _NESTED):
            continue  # another scope (its defaults are rare enough to ignore)
        if isinstance(node, _COMPREHENSIONS):
            # `[e.cpu() for e in errs]`: that `e` is the comprehension's own, one of
            # the items of `errs` (of no known one when it unpacks them)
            local = dict(local)
            for g in node.generators:
                text = ast.unparse(g.iter) if isinstance(g.target, ast.Name) else "?"
                for n in walk(g.target):
                    if isinstance(n, ast.Name):
                        local[n.id] = text
        if isinstance(node, ast.If) and isinstance(
            node.test, ast.Compare | ast.BoolOp | ast.UnaryOp
        ):
            ifs.append(node)
        facts.branches[id(node)] = branches
        if local:
            facts.locals[id(node)] = local
        _note(node, branches, local, facts)
        for child, branch in _children(node):
            todo.append((child, branches | {branch} if branch is not None else branches, local))
    if ifs and facts.evidence:  # the shape tests matter only where there is evidence
        sizes = _shape_names(scope)
        facts.shape_tests = {id(node) for node in ifs if _tests_shape(node.test, sizes)}
    for positions in facts.stores.values():
        positions.sort()
    for evidence in facts.evidence.values():
        evidence.sort(key=lambda ev: ev.position)
    return facts


def _note(node: ast.AST, branches: frozenset[_Branch], local: _Locals, facts: _ScopeFacts) -> None:
    if isinstance(node, ast.Name) and node.id in local:
        return  # a comprehension's own variable
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        facts.stores.setdefault(node.id, []).append((node.lineno, node.col_offset))
    elif isinstance(node, ast.arg):
        facts.stores.setdefault(node.arg, []).append((node.lineno, node.col_offset))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _to_cpu(node):
        found = access_key(node.func.value, local)
        if found is not None and "@?" not in found[0]:
            key, names = found
            where = (node.lineno, node.col_offset)
            evidence = CpuEvidence(node, where, branches, key, names)
            facts.evidence.setdefault(key[0], []).append(evidence)


# what a shape test reads: `x.dim()`, `x.ndim`, `x.shape`, `x.size()`, `x.numel()`
_SHAPE_METHODS = frozenset({"dim", "ndimension", "size", "numel"})
_SHAPE_ATTRS = frozenset({"ndim", "shape"})


def _shape_names(scope: ast.AST) -> frozenset[str]:
    """Names every assignment in `scope` gives a shape (`size = w.size()`)."""
    shapes: set[str] = set()
    others: set[str] = set()
    for node in walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    (shapes if _is_shape(node.value, frozenset()) else others).add(target.id)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.NamedExpr):
            others |= {n.id for n in walk(node.target) if isinstance(n, ast.Name)}
    return frozenset(shapes - others)


def _is_shape(node: ast.expr, sizes: frozenset[str]) -> bool:
    """A shape, a part of one, or its length."""
    if isinstance(node, ast.Name):
        return node.id in sizes
    if isinstance(node, ast.Attribute):
        return node.attr in _SHAPE_ATTRS
    if isinstance(node, ast.Subscript):
        return _is_shape(node.value, sizes)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr in _SHAPE_METHODS
        if isinstance(func, ast.Name) and func.id == "len" and len(node.args) == 1:
            return _is_shape(node.args[0], sizes)
    return False


def _tests_shape(test: ast.expr, sizes: frozenset[str]) -> bool:
    """`len(size) == 1`, `x.dim() > 2 and x.size(0) == 1`: a test of shapes alone."""
    if isinstance(test, ast.BoolOp):
        return all(_tests_shape(v, sizes) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _tests_shape(test.operand, sizes)
    if not isinstance(test, ast.Compare):
        return False
    operands = [test.left, *test.comparators]
    if not any(_is_shape(o, sizes) for o in operands):
        return False
    return all(isinstance(o, ast.Constant) or _is_shape(o, sizes) for o in operands)


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
    return isinstance(target, ast.Constant) and is_cpu_name(target.value)


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
    return [(c, None) for c in iter_children(node)]
