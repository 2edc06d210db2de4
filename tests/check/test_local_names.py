"""syntax._local_names (a hand-rolled loop over exact node classes) must give the names
the plain reading of the tree gives, on varied code."""

from __future__ import annotations

import ast

from tests.check._text_samples import fixture_texts
from tests.check.test_walk import _sources
from torchdoctor.check.analysis.syntax import _local_names


def _plain_local_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    args = func.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    declared: set[str] = set()
    todo: list[ast.AST] = list(func.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            todo.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update(a.asname or a.name.split(".", 1)[0] for a in node.names)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            declared.update(node.names)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        todo.extend(ast.iter_child_nodes(node))
    return frozenset(names - declared)


def test_local_names_equal_the_plain_reading() -> None:
    texts = _sources() + [text for _, text in fixture_texts()]
    checked = 0
    for text in texts:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert _local_names(node) == _plain_local_names(node), ast.unparse(node)[:200]
                checked += 1
    assert checked > 1000
