"""The engine walks only the statements that hold a needle of every visiting rule.

A rule whose `visit_needles()` names substrings promises that it reports only on nodes
whose text holds one; when every rule visiting a file makes that promise, statements
holding none are not walked.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest

from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.engine import check_source
from torchdoctor.check.registry import rule_classes
from torchdoctor.check.rule import Rule

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]

SOURCE = textwrap.dedent(
    """
    import torch

    def train(model):
        model(torch.ones(2))
        for step in range(3):
            print(step)

    @saves(torch.zeros(1))
    def decorated():
        helper()

    class Saver:
        def write(self, model, path):
            other(1)
            if path:
                torch.save(model,
                           path)
    """
)


class _SeenCalls(Rule):
    """Records the calls it is shown and where they sit."""

    code = "TD990"
    name = "seen-calls"
    category = "test"
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)
    needles: ClassVar[tuple[str, ...] | None] = ("save",)
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def visit_needles(self) -> tuple[str, ...] | None:
        return self.needles

    def visit(self, node: ast.AST) -> None:
        function = self.ctx.enclosing_function()
        self.seen.append((self.ctx.segment(node).split("(")[0], function and function.name))


class _AllCalls(_SeenCalls):
    code = "TD991"
    needles = None


def _seen(*rules: type[Rule]) -> list[tuple[str, str | None]]:
    _SeenCalls.seen.clear()
    check_source(SOURCE, "x.py", rules, build_project([SOURCE]))
    return sorted(set(_SeenCalls.seen), key=str)


def test_only_statements_holding_a_needle_are_walked() -> None:
    assert _seen(_SeenCalls) == sorted(
        [
            # the decorator line holds the needle: `decorated` is entered (its decorators
            # are its children, as in the whole walk), but not its body's `helper()`
            ("saves", "decorated"),
            ("torch.zeros", "decorated"),
            ("torch.save", "write"),  # inside an `if` inside a method, the stack intact
        ],
        key=str,
    )


class _SeenWords(_SeenCalls):
    """Promises whole words: `save`, not the `saves` of the decorator."""

    code = "TD992"
    needles = None

    def visit_words(self) -> tuple[str, ...] | None:
        return ("save",)


def test_words_walk_only_statements_naming_them() -> None:
    assert _seen(_SeenWords) == [("torch.save", "write")]


def test_a_visiting_rule_without_needles_walks_the_whole_tree() -> None:
    seen = _seen(_SeenCalls, _AllCalls)
    assert ("print", "train") in seen and ("other", "write") in seen
    assert len(seen) == 9


def _all_findings(paths: list[Path]) -> list[tuple[str, str, int, int]]:
    sources = [(str(p), p.read_text(encoding="utf-8")) for p in paths]
    project = build_project(text for _, text in sources)
    rules = list(rule_classes())
    return sorted(
        (path, f.code, f.line, f.column)
        for path, text in sources
        for f in check_source(text, path, rules, project)
    )


def test_every_needle_promise_holds_on_the_fixtures_and_examples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paths = sorted(p for p in FIXTURES.rglob("*.py") if not p.name.endswith(".fixed.py"))
    paths += sorted((ROOT / "examples").rglob("*.py"))
    needled = [r for r in rule_classes() if {"visit_needles", "visit_words"} & vars(r).keys()]
    assert len(needled) >= 8
    with_needles = _all_findings(paths)
    for rule in needled:
        monkeypatch.setattr(rule, "visit_needles", Rule.visit_needles)
        monkeypatch.setattr(rule, "visit_words", Rule.visit_words)
    whole_tree = _all_findings(paths)
    assert with_needles == whole_tree
    assert {code for _, code, _, _ in whole_tree} >= {r.code for r in needled}
