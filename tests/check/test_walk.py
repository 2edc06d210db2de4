"""tree_walk.walk and tree_walk.iter_children must equal ast.walk / ast.iter_child_nodes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torchdoctor.check.tree_walk import (
    block_of,
    child_statements,
    definitions,
    iter_children,
    walk,
    walk_statements,
)

_TRICKY = """
def f(a, *, b, c=1, **kw):  # a keyword-only argument without a default: None in kw_defaults
    global g
    d = {**kw, "x": [i async for i in aiter()]}
    match a:
        case {"k": 1, **rest} | Point(x=0, y=_) if rest: pass
        case None | [1, *_]: pass
    return lambda q=1: f"{q!r:>{b}}" if not a else (yield from c)
"""


def _sources() -> list[str]:
    """Real code: this package's own sources and a slice of the standard library."""
    here = Path(__file__).resolve().parents[2] / "src" / "torchdoctor"
    stdlib = Path(ast.__file__).parent
    files = sorted(here.rglob("*.py")) + sorted(stdlib.glob("*.py"))[:60]
    return [_TRICKY] + [f.read_text(encoding="utf-8") for f in files]


@pytest.mark.parametrize("source", [_TRICKY, "x = 1"], ids=["tricky", "tiny"])
def test_walk_on_tricky_syntax(source: str) -> None:
    tree = ast.parse(source)
    assert [id(n) for n in walk(tree)] == [id(n) for n in ast.walk(tree)]


def test_walk_and_iter_children_equal_the_ast_module_on_real_code() -> None:
    for source in _sources():
        tree = ast.parse(source)
        nodes = list(ast.walk(tree))
        assert [id(n) for n in walk(tree)] == [id(n) for n in nodes]
        for node in nodes:
            assert iter_children(node) == list(ast.iter_child_nodes(node))


_BLOCKS = """
try:
    a = 1
except ValueError:
    b = 2
else:
    c = 3
finally:
    d = 4
match a:
    case 1:
        e = 5
"""


def test_block_of_finds_every_statement_list_that_holds_a_statement() -> None:
    tree = ast.parse(_BLOCKS)
    try_, match = tree.body
    assert isinstance(try_, ast.Try) and isinstance(match, ast.Match)
    handler, case = try_.handlers[0], match.cases[0]
    assert block_of(tree, try_) is tree.body
    assert block_of(try_, try_.body[0]) is try_.body
    assert block_of(try_, try_.orelse[0]) is try_.orelse
    assert block_of(try_, try_.finalbody[0]) is try_.finalbody
    # a handler's or a case's body, asked of the statement around it or of its holder
    assert block_of(try_, handler.body[0]) == handler.body
    assert block_of(handler, handler.body[0]) is handler.body
    assert block_of(match, case.body[0]) == case.body
    # not a statement of `parent`'s own lists: none
    assert block_of(tree, handler.body[0]) == []
    assert block_of(try_, handler) == []


def _plain_definitions(body: list[ast.stmt], owner: ast.AST | None) -> list[tuple[ast.AST, object]]:
    """Every statement list entered, one statement at a time (as the indexes did)."""
    found: list[tuple[ast.AST, object]] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.append((stmt, owner))
            found += _plain_definitions(stmt.body, stmt)
        else:
            found += _plain_definitions(child_statements(stmt), owner)
    return found


def test_definitions_equal_entering_every_statement_list() -> None:
    for source in [_TRICKY, _BLOCKS, *_sources()]:
        body = ast.parse(source).body
        assert definitions(body) == _plain_definitions(body, None)


def test_walk_statements_keeps_the_order_of_the_whole_walk() -> None:
    for source in [_TRICKY, _BLOCKS, *_sources()]:
        tree = ast.parse(source)
        held = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Try, ast.Match)
        for node in [tree, *(n for n in ast.walk(tree) if isinstance(n, held))]:
            expected = [n for n in ast.walk(node) if n is node or isinstance(n, ast.stmt)]
            assert [id(n) for n in walk_statements(node)] == [id(n) for n in expected]
