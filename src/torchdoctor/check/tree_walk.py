"""Fast walks of syntax trees: children, descendants, statements on given lines, a
walk's statements alone, and a file's functions and classes.

`ast.walk` and `ast.iter_child_nodes` look up every field of every node by name; these
read only the fields that can hold nodes (`child_fields`), and skip operators and
contexts (`Load`, `Add`) when no caller wants them. Their results are the ones the
`ast` functions give, in the same order.
"""

from __future__ import annotations

import ast
import bisect
import functools
from collections.abc import Iterator

_SIMPLE_STATEMENTS = frozenset(
    {ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Pass, ast.Raise}
    | {ast.Delete, ast.Assert, ast.Global, ast.Nonlocal, ast.Break, ast.Continue}
    | {ast.Import, ast.ImportFrom}
)


def child_statements(stmt: ast.stmt) -> list[ast.stmt]:
    """The statements directly nested in a compound statement (any kind)."""
    if stmt.__class__ in _SIMPLE_STATEMENTS:
        return []
    children: list[ast.stmt] = []
    for name in ("body", "orelse", "finalbody"):
        value = getattr(stmt, name, None)
        if isinstance(value, list):
            children.extend(value)
    for holder in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
        children.extend(holder.body)
    return children


Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
DEFINITIONS = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef})


def definitions(
    body: list[ast.stmt], owner: Definition | None = None
) -> list[tuple[Definition, Definition | None]]:
    """(def or class, the innermost def or class holding it: None at module level) for
    every function and class under `body`, nested ones too, each before what it holds
    and statement lists in `child_statements` order (source order, but an `except`
    body's after `else` and `finally`): one pass, shared by the file's indexes."""
    found: list[tuple[Definition, Definition | None]] = []
    todo = list(reversed(body))  # a stack: statements come off in source order
    while todo:
        stmt = todo.pop()
        cls = stmt.__class__
        if cls in _SIMPLE_STATEMENTS:
            continue  # most statements: nothing nested (one set lookup)
        if cls in DEFINITIONS:
            found.append((stmt, owner))  # type: ignore[arg-type]
            found += definitions(stmt.body, stmt)  # type: ignore[attr-defined,arg-type]
        else:
            todo.extend(reversed(child_statements(stmt)))
    return found


# Fields that never hold a node: names, numbers, flags.
_SCALAR_FIELDS = frozenset(
    {"id", "attr", "name", "asname", "arg", "module", "level", "kind", "conversion"}
    | {"is_async", "simple", "type_comment", "tag", "n", "s", "rest", "kwd_attrs"}
)
# Every statement class of this Python's ast module
STATEMENTS = frozenset(
    cls for cls in vars(ast).values() if isinstance(cls, type) and issubclass(cls, ast.stmt)
)

# The node classes whose children may be statements (in `body`, `orelse`, `finalbody`;
# a lambda's or conditional expression's are expressions, kept for simplicity)
HOLDS_STATEMENTS = frozenset(
    cls
    for cls in vars(ast).values()
    if isinstance(cls, type)
    and issubclass(cls, ast.AST)
    and {"body", "orelse", "finalbody"}.intersection(cls._fields)
)

OPERATOR_TYPES = tuple(
    cls
    for cls in vars(ast).values()
    if isinstance(cls, type)
    and issubclass(cls, ast.expr_context | ast.operator | ast.unaryop | ast.cmpop | ast.boolop)
)
_OPERATOR_FIELDS = frozenset({"ctx", "op", "ops"})


@functools.cache
def child_fields(*, want_operators: bool) -> dict[type[ast.AST], tuple[str, ...]]:
    """Node class -> the fields that may hold child nodes worth walking into.

    Operators and contexts (`Load`, `Add`, `Eq`) are skipped unless a rule visits them.
    """
    table: dict[type[ast.AST], tuple[str, ...]] = {}
    for cls in vars(ast).values():
        if not (isinstance(cls, type) and issubclass(cls, ast.AST)):
            continue
        fields = tuple(
            f
            for f in cls._fields
            if f not in _SCALAR_FIELDS and (want_operators or f not in _OPERATOR_FIELDS)
        )
        table[cls] = () if issubclass(cls, ast.Constant) else fields
    return table


# (looked up once: `iter_children` runs for hundreds of thousands of nodes)
_ALL_FIELDS = child_fields(want_operators=True)
_NODE_FIELDS = child_fields(want_operators=False)


def iter_children(node: ast.AST, *, operators: bool = True) -> list[ast.AST]:
    """`ast.iter_child_nodes(node)` as a list, same nodes in the same order, faster;
    without operators and contexts (`Add`, `Load`) when `operators` is False."""
    fields = (_ALL_FIELDS if operators else _NODE_FIELDS).get(node.__class__)
    if fields is None:
        return list(ast.iter_child_nodes(node))
    children: list[ast.AST] = []
    for name in fields:
        value = getattr(node, name, None)
        if value.__class__ is list:
            children.extend(item for item in value if isinstance(item, ast.AST))
        elif isinstance(value, ast.AST):
            children.append(value)
    return children


# Walks of statements and of the module (a function or class is walked by several rules
# and analyses): kept until the file's context closes (`forget_walks`).
_WALKS: dict[ast.AST, list[ast.AST]] = {}


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk(node)`: the same nodes in the same (breadth-first) order, faster; a
    statement's or module's walk is made once per file."""
    if not isinstance(node, ast.stmt | ast.Module):
        return iter(_walk(node))
    found = _WALKS.get(node)
    if found is None:
        found = _WALKS[node] = _walk(node)
    return iter(found)


def forget_walks() -> None:
    """Drop the kept walks (FileContext.close: they hold the file's syntax tree)."""
    _WALKS.clear()
    _STATEMENT_WALKS.clear()


# Where statements nest: the statement lists of each statement class, and the `except`
# handlers and `case`s holding lists of their own, in field order (as `ast.walk` reads)
_STATEMENT_LISTS: dict[type[ast.AST], tuple[str, ...]] = {
    cls: tuple(f for f in cls._fields if f in ("body", "orelse", "finalbody", "handlers", "cases"))
    for cls in vars(ast).values()
    if isinstance(cls, type) and issubclass(cls, ast.stmt | ast.Module | ast.excepthandler)
}
_STATEMENT_LISTS[ast.match_case] = ("body",)
_STATEMENT_WALKS: dict[ast.AST, list[ast.AST]] = {}


def walk_statements(node: ast.AST) -> list[ast.AST]:
    """`node` and the statements of `walk(node)`, in the same order, for a caller that
    looks for statements alone (defs, classes, assignments, imports): only statement
    lists are entered. (A statement's place in a breadth-first walk depends only on its
    ancestors, all statements, handlers and cases.) Kept until the file's context closes."""
    found = _STATEMENT_WALKS.get(node)
    if found is None:
        todo = [node]
        for current in todo:  # the list grows while it is read: breadth first
            for name in _STATEMENT_LISTS.get(current.__class__, ()):
                todo.extend(getattr(current, name))
        found = _STATEMENT_WALKS[node] = [n for n in todo if n is node or n.__class__ in STATEMENTS]
    return found


# Node classes with a list field that may hold None or strings (`{**d}` keys, keyword-only
# arguments without a default, `global x`)
_LISTS_WITH_NON_NODES = frozenset({ast.Dict, ast.arguments, ast.Global, ast.Nonlocal})


def _walk(
    node: ast.AST,
    # bound once (most walks are of a small expression: lookups per walk add up)
    table: dict[type[ast.AST], tuple[str, ...]] = _ALL_FIELDS,
    irregular: frozenset[type[ast.AST]] = _LISTS_WITH_NON_NODES,
    node_class: type[ast.AST] = ast.AST,
) -> list[ast.AST]:
    # a list, not a generator: most walks are read to the end, and resuming a generator
    # per node costs more than the few nodes an early stop saves
    todo = [node]
    for current in todo:  # the list grows while it is read: breadth first
        cls = current.__class__
        fields = table.get(cls)
        if fields is None or cls in irregular:
            todo.extend(ast.iter_child_nodes(current))
            continue
        for name in fields:
            value = getattr(current, name, None)
            if value.__class__ is list:
                todo.extend(value)  # these lists hold only nodes
            elif isinstance(value, node_class):
                todo.append(value)
    return todo


def statement_expressions(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes a statement holds itself, not in the statement blocks nested in it (a
    loop's test and target, not its body; a handler's type is in `handlers`, left out)."""
    return [
        v
        for name, v in ast.iter_fields(stmt)
        if name not in ("body", "orelse", "finalbody", "handlers", "cases")
        for v in (v if isinstance(v, list) else [v])
        if isinstance(v, ast.AST)
    ]


def parameter_defaults(args: ast.arguments) -> list[tuple[ast.arg, ast.expr]]:
    """The parameters given a default, each with it: the last positional ones, then
    the keyword-only ones that have one."""
    positional = [*args.posonlyargs, *args.args]
    with_default = positional[len(positional) - len(args.defaults) :]
    pairs = list(zip(with_default, args.defaults, strict=True))
    pairs += [
        (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    ]
    return pairs


def block_of(parent: ast.AST, child: ast.AST) -> list[ast.stmt]:
    """The statement list of `parent` that holds `child` (a body, `else`, `finally`, an
    `except` handler's or a `case`'s body), or [] where `child` is in none of them."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and any(stmt is child for stmt in block):
            return block
    for holder in (*getattr(parent, "handlers", ()), *getattr(parent, "cases", ())):
        if any(stmt is child for stmt in holder.body):
            return list(holder.body)
    return []


def spans_a_line(stmt: ast.stmt, lines: list[int]) -> bool:
    """Whether one of `lines` (ascending) is a line of `stmt`, its decorators included."""
    decorators = getattr(stmt, "decorator_list", None)
    first = decorators[0].lineno if decorators else stmt.lineno
    at = bisect.bisect_left(lines, first)
    return at < len(lines) and lines[at] <= (stmt.end_lineno or stmt.lineno)


def walk_lines(node: ast.AST, lines: list[int]) -> list[ast.AST]:
    """The nodes of `node`'s statements that span one of `lines` (ascending): a compound
    statement's own parts when it spans one, and of its bodies only such statements; the
    rest of the tree is never visited. (A loop, not nested generators: a generator per
    level costs more than the nodes it saves.)"""
    found: list[ast.AST] = []
    todo = [node]
    while todo:
        current = todo.pop()
        is_statement = isinstance(current, ast.stmt)
        for name in current._fields:
            value = getattr(current, name, None)
            if value.__class__ is list:
                if value and isinstance(value[0], ast.stmt):
                    for stmt in value:
                        if spans_a_line(stmt, lines):
                            found.append(stmt)
                            todo.append(stmt)
                elif is_statement:
                    for part in value:
                        if isinstance(part, ast.AST):
                            found.extend(walk(part))
            elif is_statement and isinstance(value, ast.AST):
                found.extend(walk(value))
    return found
