"""The engine's walk (its own recursion over the fields worth entering, leaf nodes no
rule visits skipped, a node put on `ctx.stack` only before its first child) must visit
the nodes a plain walk of `ast.iter_child_nodes` visits, in the same order and with the
same ancestors on `ctx.stack`, with and without needle lines."""

from __future__ import annotations

import ast
import sys
from typing import ClassVar

import pytest

from tests.check._text_samples import fixture_texts
from tests.check.test_walk import _sources
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.engine import check_source
from torchdoctor.check.lines import split_lines
from torchdoctor.check.rule import Rule
from torchdoctor.check.tree_walk import HOLDS_STATEMENTS, spans_a_line

_ALL_NODES = tuple(
    cls for cls in vars(ast).values() if isinstance(cls, type) and issubclass(cls, ast.AST)
)
_Visit = tuple[int, tuple[int, ...]]  # id(node), ids of its ancestors


class _Recorder(Rule):
    code = "TD993"
    name = "records-visits"
    category = "test"
    node_types: ClassVar[tuple[type[ast.AST], ...]] = _ALL_NODES
    needle: ClassVar[str | None] = None
    seen: ClassVar[list[_Visit]] = []

    def visit_needles(self) -> tuple[str, ...] | None:
        return None if self.needle is None else (self.needle,)

    def visit(self, node: ast.AST) -> None:
        self.seen.append((id(node), tuple(id(a) for a in self.ctx.stack)))


class _CallRecorder(_Recorder):
    code = "TD994"
    node_types = (ast.Call, ast.Subscript, ast.keyword)


def _plain(
    tree: ast.AST, types: tuple[type[ast.AST], ...], lines: list[int] | None
) -> list[_Visit]:
    found: list[_Visit] = []

    def enter(node: ast.AST, ancestors: tuple[int, ...]) -> None:
        if isinstance(node, types):
            found.append((id(node), ancestors))
        for child in ast.iter_child_nodes(node):
            if (
                lines is not None
                and node.__class__ in HOLDS_STATEMENTS
                and isinstance(child, ast.stmt)
                and not spans_a_line(child, lines)
            ):
                continue
            enter(child, (*ancestors, id(node)))

    enter(tree, ())
    return found


@pytest.mark.parametrize("rule", [_Recorder, _CallRecorder])
@pytest.mark.parametrize("needle", [None, "self", "(", "import"])
def test_engine_walk_equals_a_plain_walk(rule: type[_Recorder], needle: str | None) -> None:
    texts = _sources() + [text for _, text in fixture_texts()]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        for text in texts:
            tree = ast.parse(text)
            rule.needle = needle
            rule.seen = []
            check_source(text, "x.py", [rule], build_project([text]), tree=tree)
            lines = None
            if needle is not None:
                lines = [i for i, line in enumerate(split_lines(text), 1) if needle in line]
            assert rule.seen == _plain(tree, rule.node_types, lines)
    finally:
        sys.setrecursionlimit(limit)
