"""A scope's analysis reused for equal seeds (`FileFlow._analysis`): what every way of
asking gets is what analysing the scope again from its seeds gives."""

from __future__ import annotations

import ast

import pytest

from torchdoctor.check.analysis import file_flow as file_flow_module
from torchdoctor.check.analysis.scope import ScopeFlow

from ._text_samples import fixture_texts
from .test_flow import HEADER, file_of


def _facts(scope: ScopeFlow) -> tuple[object, ...]:
    values = [(id(n), scope.value(n)) for n in ast.walk(scope.node) if isinstance(n, ast.expr)]
    calls = [(c.callee, id(c.call), c.args, c.keywords, c.opaque) for c in scope.calls]
    return (scope.returned, scope.exit_env, scope.mismatches, calls, scope.moves, values)


def test_reused_analyses_give_what_a_plain_analysis_gives() -> None:
    checked = 0
    for path, text in fixture_texts():
        try:
            ff = file_of(text, path.name)
        except SyntaxError:
            continue
        for func in ff.functions():
            # every way of asking, in an order that reuses: callers=False first, then with
            # the callers' seeds (often equal), then the unseeded return
            asked = [ff.scope(func, callers=False), ff.scope(func)]
            unseeded = ff._unseeded_return(func)
            for scope in asked:
                plain = ScopeFlow(ff, func, seeds=dict(scope.seeds))
                assert _facts(scope) == _facts(plain), (path, func.name)
            assert unseeded == ScopeFlow(ff, func, seeds={}).returned, (path, func.name)
            checked += 1
    assert checked > 500


def test_equal_seeds_are_analysed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ff = file_of(
        HEADER
        + """
def make(n):
    return torch.zeros(n)

def other(x):
    return make(3)
"""
    )
    runs: list[ast.AST] = []

    class Counted(ScopeFlow):
        def _run(self) -> None:
            runs.append(self.node)
            super()._run()

    monkeypatch.setattr(file_flow_module, "ScopeFlow", Counted)
    make = ff.toplevel_functions["make"]
    assert ff.returned_tensor(make).place.value == "cpu"  # (unseeded: seeds {})
    assert ff.scope(make, callers=False) is ff.scope(make)  # the same seeds {}: reused
    assert runs.count(make) == 1
