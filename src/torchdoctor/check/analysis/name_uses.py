"""Where the syntax tree uses one top-level name: its calls, or None where it is also
used as a value. Read name by name on the lines naming it, each statement list entered
by a binary search of its statements' lines (a file asks of a few names; one walk of
every line naming any of its names cost more than all of them)."""

from __future__ import annotations

import ast
import bisect

from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import iter_children, spans_a_line


class NameUses:
    """The uses of the file's top-level names, found on request."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        # id(statement list) -> (first lines, decorators included; last lines)
        self._spans: dict[int, tuple[list[int], list[int]]] = {}

    def uses(self, name: str) -> list[tuple[int, bool]] | None:
        """(line, True) of each call `name(...)`, in the order `walk_lines` gives the
        nodes; None when a `name` is read other than as a call's callee."""
        found: list[tuple[int, bool]] = []
        called: set[int] = set()
        for node in self._walk(self.ctx.lines_naming((name,))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id == name:  # (a call is walked before its callee)
                    found.append((node.lineno, True))
                    called.add(id(node.func))
            elif (
                isinstance(node, ast.Name)
                and node.id == name
                and isinstance(node.ctx, ast.Load)
                and id(node) not in called
            ):
                return None
        return found

    def release(self) -> None:
        self._spans.clear()

    def _walk(self, lines: list[int]) -> list[ast.AST]:
        """`tree_walk.walk_lines(tree, lines)` without the nodes that span none of
        `lines`, the others in the same order: the statements of a list that span a
        line are found by bisection, not tested one by one, and a part of a statement
        (a table of a thousand lines) is entered only where it spans one."""
        found: list[ast.AST] = []
        if not lines:
            return found
        todo: list[ast.AST] = [self.ctx.tree]
        while todo:
            current = todo.pop()
            is_statement = isinstance(current, ast.stmt)
            for field in current._fields:
                value = getattr(current, field, None)
                if value.__class__ is list:
                    if value and isinstance(value[0], ast.stmt):
                        for stmt in self._spanning(value, lines):
                            found.append(stmt)
                            todo.append(stmt)
                    elif is_statement:
                        for part in value:
                            if isinstance(part, ast.AST):
                                found.extend(_walk_spanning(part, lines))
                elif is_statement and isinstance(value, ast.AST):
                    found.extend(_walk_spanning(value, lines))
        return found

    def _spanning(self, body: list[ast.stmt], lines: list[int]) -> list[ast.stmt]:
        """The statements of `body` that span one of `lines`, in order. A list's
        statements follow one another: first and last lines never decrease (statements
        sharing a line, `a = 1; b = 2`, are the only overlap), so those spanning a line
        are a run ending at the last one starting at or before it."""
        spans = self._spans.get(id(body))
        if spans is None:
            starts = [
                (s.decorator_list[0].lineno if getattr(s, "decorator_list", None) else s.lineno)  # type: ignore[attr-defined]
                for s in body
            ]
            ends = [s.end_lineno or s.lineno for s in body]
            spans = self._spans[id(body)] = (starts, ends)
        starts, ends = spans
        picked: set[int] = set()
        for line in lines:
            at = bisect.bisect_right(starts, line) - 1
            while at >= 0 and ends[at] >= line and at not in picked:
                picked.add(at)
                at -= 1
        return [body[i] for i in sorted(picked)]


def _walk_spanning(node: ast.AST, lines: list[int]) -> list[ast.AST]:
    """`walk(node)` (breadth first) without the nodes whose text spans none of `lines`
    and what is under them: the rest come in the same order (a node's place in a
    breadth-first walk depends only on its ancestors'). Nodes without a position
    (`arguments`, operators) are entered."""
    found: list[ast.AST] = []
    todo = [node]
    for current in todo:  # the list grows while it is read: breadth first
        if hasattr(current, "lineno") and not spans_a_line(current, lines):  # type: ignore[arg-type]
            continue
        found.append(current)
        todo.extend(iter_children(current))
    return found
