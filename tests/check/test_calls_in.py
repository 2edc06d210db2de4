"""scope_index.calls_in walks one function: its calls on some lines (those starting in
the function) must be the calls of `calls_on_lines` over the whole file that start
there (TD103 asks it, function by function, for the factory calls the CPU gets)."""

from __future__ import annotations

from tests.check.rule_fixtures import fixture_contexts
from torchdoctor.check.analysis.file_flow import FileFlow
from torchdoctor.check.analysis.scope_index import calls_in, calls_on_lines

_ODD = [
    "def f():\n    class C:\n        x = torch.zeros(3)\n"
    "        def m(self): return torch.ones(2)\n    return torch.zeros (range(3))\n",
    "@d(torch.zeros(1))\ndef f(a=torch.ones(2)):\n    g = lambda: torch.empty(3)\n"
    "    def h(): return torch.full(\n        (2,), 1)\n    return [torch.tensor(i) for i in x]\n",
]


def test_calls_in_a_function_are_those_of_the_whole_file_walk() -> None:
    compared = 0
    for ctx in fixture_contexts(_ODD):
        for words in (("zeros(", "ones(", "tensor(", "range(", "full("), ("(",)):
            lines = ctx.lines_holding(words)
            every = [call for _, call in calls_on_lines(ctx, lines, spanning=True)]
            for func in FileFlow(ctx).functions():
                first, last = func.lineno, func.end_lineno or func.lineno
                mine = calls_in(func, [n for n in lines if first <= n <= last])
                expected = {id(c) for c in every if first <= c.lineno <= last}
                assert {id(c) for c in mine if first <= c.lineno <= last} == expected
                compared += 1
    assert compared > 1000
