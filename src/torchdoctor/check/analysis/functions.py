"""A function of the file as the training-loop analysis sees it."""

from __future__ import annotations

import ast
import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.interfaces import FileWords
from torchdoctor.check.analysis.names import FuncNode
from torchdoctor.check.context import words_of
from torchdoctor.check.tree_walk import child_statements, walk

if TYPE_CHECKING:
    pass


@dataclass(eq=False)
class FunctionInfo:
    """A function (or the module's top-level code) of an analysed file."""

    file: FileWords
    node: FuncNode | ast.Module
    name: str
    cls: ast.ClassDef | None
    parent: FunctionInfo | None
    nested: dict[str, FunctionInfo] = field(default_factory=dict)
    _text: str | None = None
    _statements: list[ast.stmt] | None = None
    _locals: set[str] | None = None
    _evaluation: bool | None = None
    _model: bool | None = None
    _identifiers: frozenset[str] | None = None

    @property
    def mentions_evaluation(self) -> bool:
        """Whether an eval-ish name (`validate`, `val_loader`), `no_grad` or
        `inference_mode` occurs in this function: it may hold or call evaluation code."""
        if self._evaluation is None:
            # the lines naming a word as a whole identifier (`val`, not `value`)
            self._evaluation = (
                bool(self.file.evaluation_words())
                if self.is_module
                else _spans_body(self.node, self.file.evaluation_lines())
            )
        return self._evaluation

    @property
    def mentions_model(self) -> bool:
        """Whether the code names something that may be a model (`model`, `self(...)`,
        a name set to eval/train mode or built from a module class in this file)."""
        if self._model is None:
            # the lines naming a model word as a whole identifier, or holding `self(`
            self._model = (
                bool(self.file.model_words()) or "self(" in self.text
                if self.is_module
                else _spans_body(self.node, self.file.model_lines())
            )
        return self._model

    @property
    def is_module(self) -> bool:
        return isinstance(self.node, ast.Module)

    def identifiers(self) -> frozenset[str]:
        """Every identifier in this function's text (`context.words_of`, cached)."""
        if self._identifiers is None:
            self._identifiers = self.file.words() if self.is_module else words_of(self.text)
        return self._identifiers

    @property
    def body(self) -> list[ast.stmt]:
        return self.node.body

    @property
    def label(self) -> str:
        if self.is_module:
            return "module level"
        prefix = f"{self.cls.name}." if self.cls is not None else ""
        return f"`{prefix}{self.name}()`"

    @property
    def text(self) -> str:
        if self._text is None:
            if self.is_module:
                self._text = self.file.ctx.source
            else:
                start, end = self.file.ctx.node_span(self.node)
                self._text = self.file.ctx.source[start:end]
        return self._text

    def params(self) -> list[str]:
        if isinstance(self.node, ast.Module):
            return []
        a = self.node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args)]
        if (
            self.cls is not None
            and names
            and not any(
                isinstance(d, ast.Name) and d.id == "staticmethod" for d in self.node.decorator_list
            )
        ):
            names = names[1:]
        return names

    def keyword_params(self) -> list[str]:
        if isinstance(self.node, ast.Module):
            return []
        return [p.arg for p in self.node.args.kwonlyargs]

    def own_statements(self) -> list[ast.stmt]:
        """Every statement of this function in source order, not descending into nested
        defs/classes (which are listed themselves)."""
        if self._statements is None:
            found: list[ast.stmt] = []
            todo = list(reversed(self.body))
            while todo:
                stmt = todo.pop()
                found.append(stmt)
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                todo.extend(reversed(child_statements(stmt)))
            self._statements = found
        return self._statements

    def local_names(self) -> set[str]:
        """Names bound in this function (parameters, assignments, loop targets)."""
        if self._locals is None:
            found = set(self.params()) | set(self.keyword_params())
            for stmt in self.own_statements():
                for target in _bound_targets(stmt):
                    for n in walk(target):
                        if isinstance(n, ast.Name):
                            found.add(n.id)
            self._locals = found
        return self._locals


def _bound_targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return list(stmt.targets)
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        return [stmt.target]
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return [stmt.target]
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    return []


def _spans_body(node: ast.AST, lines: list[int]) -> bool:
    """Whether one of `lines` (ascending) is a line of the function `node` from its
    `def` on (its decorators are not its text)."""
    first = node.lineno  # type: ignore[attr-defined]
    at = bisect.bisect_left(lines, first)
    return at < len(lines) and lines[at] <= (node.end_lineno or first)  # type: ignore[attr-defined]
