"""analysis/name_uses.py reads a top-level name's uses on the lines naming it, entering
only the statements and parts that span one: it must answer as one walk of every line
naming any top-level name (`walk_lines`, the index it replaced), in the same order."""

from __future__ import annotations

import ast

from tests.check.rule_fixtures import fixture_contexts
from torchdoctor.check.analysis.name_uses import NameUses
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import walk_lines

_ODD = [
    "def f(x): return x\na = f(1); b = f(2)\nc = [f(3),\n  f(4)]\n",
    "def f(x): return x\n@f\ndef g(): pass\n",
    "def f(x): return x\nclass C(f):\n    pass\n",
    "def f(x): return x\nh = {'k': f}\n",
    "def f(x): return x\nx = f(f)\n",
    "def f(x): return x\ntry:\n    f(1)\nexcept E:\n    f(2)\nelse:\n    y = (\n f(3))\n",
    "def f(x): return x\nclass C:\n    def m(self):\n        if a: f(1)\n        else: g(f(2))\n",
    "def f(x): return x\nz = [\n  (1, 2),\n  (f(3), 4),\n  (5, f),\n]\n",
    "def f(x): return x\nw = f'{f(1)}'\nv = lambda: f(2)\n",
    "class K: pass\nk = K(); K.m(); j = [K(i) for i in r]\n",
]


def _reference(tree: ast.Module, ctx: FileContext, names: set[str]) -> dict[str, object]:
    """The index as it was: one walk of the lines naming any of `names`."""
    uses: dict[str, list[tuple[int, bool]] | None] = {}
    called: set[int] = set()
    for node in walk_lines(tree, ctx.lines_naming(names)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in names:
                found = uses.setdefault(node.func.id, [])
                if found is not None:
                    found.append((node.lineno, True))
                called.add(id(node.func))
        elif (
            isinstance(node, ast.Name)
            and node.id in names
            and isinstance(node.ctx, ast.Load)
            and id(node) not in called
        ):
            uses[node.id] = None
    return {name: uses.get(name, []) for name in names}


def test_name_uses_answer_as_one_walk_of_all_their_lines() -> None:
    checked = 0
    for ctx in fixture_contexts(_ODD):
        tree = ctx.tree
        names = {
            s.name
            for s in tree.body
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        expected = _reference(tree, ctx, names)
        index = NameUses(ctx)
        for name in sorted(names):
            assert index.uses(name) == expected[name], (ctx.source[:80], name)
            checked += 1
    assert checked > 500
