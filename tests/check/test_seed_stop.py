"""Call-site seeds stop analysing callers once every parameter has been passed an
unknown value (`FlowSeeds._call_site_seeds`): the seeds are what analysing every
caller gives."""

from __future__ import annotations

import ast

import pytest

from torchdoctor.check.analysis import file_flow as file_flow_module
from torchdoctor.check.analysis.file_flow import FileFlow
from torchdoctor.check.analysis.scope import ScopeFlow

from ._text_samples import fixture_texts
from .test_flow import HEADER, file_of


def test_stopping_early_gives_the_seeds_every_caller_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = {True: 0, False: 0}
    stop = [True]

    class Counted(ScopeFlow):
        def _run(self) -> None:
            runs[stop[0]] += 1
            super()._run()

    monkeypatch.setattr(file_flow_module, "ScopeFlow", Counted)
    checked = 0
    for path, text in fixture_texts():
        try:
            fast = file_of(text, path.name)
        except SyntaxError:
            continue
        plain = FileFlow(fast.ctx)  # (the same tree: equal values)
        plain.STOP_EARLY = False
        for func in fast.functions():
            stop[0] = True
            seeds = fast._seeds(func, 0, callers=True)
            stop[0] = False
            assert seeds == plain._seeds(func, 0, callers=True), (path, func.name)
            checked += 1
    assert checked > 500
    assert runs[True] < runs[False]  # (the fixtures do stop early)


def test_a_parameter_one_call_passes_nothing_known_is_not_seeded() -> None:
    ff = file_of(
        HEADER
        + """
def step(model, x):
    return model(x)

def train(batch):
    model = nn.Linear(2, 2).to(device)
    step(model, batch)

def test(model, batch):
    step(model, batch)
"""
    )
    step = ff.toplevel_functions["step"]
    assert "model" not in ff.scope(step).seeds
    assert isinstance(ff.scope(step).node, ast.FunctionDef)
