"""The data-table fast path of the scope analysis (`scope_exprs._numbers_only` with exact
classes, `_numbers_row` shared per length): the same answers as the plain tests."""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.scope_exprs import _numbers_only, _numbers_row
from torchdoctor.check.analysis.values import UNKNOWN, Kind, Value

ROWS = [
    "(2, 8, 1, 4)",
    "(192, 192, 256, 32, 32, False, True, True)",
    "[1.5, 2j, -3]",  # `-3` is a unary operation, not a literal
    "[1.5, 2j, 3]",
    "(None, 1)",
    "('cuda', 0)",
    "(b'x', 1)",
    "(..., 1)",
    "(x, 1)",
    "(1,)",
    "()",
    "{1, 2.0}",
    "[True]",
    "(1, (2, 3))",
]


def _plain_numbers_only(elts: list[ast.expr]) -> bool:
    return bool(elts) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, int | float | complex) for e in elts
    )


def test_numbers_only_agrees_with_isinstance_tests() -> None:
    for text in ROWS:
        node = ast.parse(text, mode="eval").body
        assert isinstance(node, ast.Tuple | ast.List | ast.Set)
        assert _numbers_only(node.elts) == _plain_numbers_only(node.elts), text


def test_a_shared_row_equals_a_fresh_one() -> None:
    for length in (1, 2, 4, 8, 100):
        fresh = Value(Kind.CONTAINER, UNKNOWN.place, items=(UNKNOWN,) * length, element=UNKNOWN)
        assert _numbers_row(length) == fresh
        assert _numbers_row(length) is _numbers_row(length)
