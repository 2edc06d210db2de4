"""analysis/mode_gate.py: a function it rules out must have no model run and no training
step in the mode interpreter's result (it is a necessary condition, never a guess)."""

from __future__ import annotations

import ast
from pathlib import Path

from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.context import FileContext


def test_gate_never_rules_out_a_function_with_runs_or_steps() -> None:
    paths = sorted((Path(__file__).parent / "fixtures").rglob("*.py"))
    sources = [p.read_text(encoding="utf-8") for p in paths]
    project = build_project(sources)
    ruled_out = with_runs = 0
    for path, source in zip(paths, sources, strict=True):
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        fl = analysis(FileContext(str(path), source, tree, project))
        for fi in fl.all_functions():
            result = fl.modes(fi)
            if result.forwards or result.steps:
                with_runs += 1
                assert fl.may_run_model(fi), (path.name, fi.name)
            elif not fl.may_run_model(fi):
                ruled_out += 1
    # the fixtures hold both kinds: the test sees the gate let runs through and skip others
    assert with_runs > 50 and ruled_out > 50
