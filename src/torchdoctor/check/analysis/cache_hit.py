"""A method analysed on the path where it reuses what it cached on `self` (TD104).

`if self.cos is None or n > self.cached_len: <refill self.cos>` then `x * self.cos`: the
join of the two paths hides the path where the cache is reused as it was, so this scope
takes every `if` whose branch refills the cache as not taken (its `else`, if any, runs).
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.interfaces import FileFacts
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.analysis.values import AnyFunction, Env
from torchdoctor.check.tree_walk import walk_statements


class CacheHitScope(ScopeFlow):
    """`node` analysed from `seeds` on the path where `self.<attr>` is not refilled."""

    def __init__(self, ff: FileFacts, node: AnyFunction, *, seeds: Env, attr: str) -> None:
        params = [*node.args.posonlyargs, *node.args.args]
        key = f"{params[0].arg}.{attr}" if params else ""
        self._refills = {
            id(stmt)
            for stmt in walk_statements(node)
            if isinstance(stmt, ast.If) and key and _assigns(stmt.body, key)
        }
        super().__init__(ff, node, seeds=seeds)

    def branch_taken(self, stmt: ast.If) -> bool | None:
        return False if id(stmt) in self._refills else None


def _assigns(body: list[ast.stmt], key: str) -> bool:
    """Whether a statement of `body` (nested blocks too) assigns `key` (`self.cos`)."""
    for top in body:
        for stmt in walk_statements(top):
            targets: list[ast.expr] = []
            if isinstance(stmt, ast.Assign):
                targets = stmt.targets
            elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
                targets = [stmt.target]
            if any(dotted(t) == key for t in targets):
                return True
    return False
