"""A checked file's syntax tree and analyses are freed by reference counting.

Reference cycles (an analysis that points back to its file, a closure that calls itself)
are freed only by the cyclic garbage collector, which walks every object it tracks: with
the whole tree in such a cycle it took a quarter of a whole-tree run. These tests check
that checking leaves nothing for it to find.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchdoctor.check.analysis import file_loops
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.engine import check_source
from torchdoctor.check.registry import rule_classes

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic GC off for the test: only reference counting frees anything."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _check_all(paths: list[Path]) -> int:
    """Check `paths` as one project; the objects the cyclic GC then finds unreachable."""
    sources = [(str(p), p.read_text(encoding="utf-8")) for p in paths]
    project = build_project(text for _, text in sources)
    rules = list(rule_classes())
    findings = 0
    for path, text in sources:
        findings += len(check_source(text, path, rules, project))
    assert findings > 0  # the rules did run their analyses
    return gc.collect()


@pytest.mark.usefixtures("collector_off")
def test_checking_the_example_project_leaves_no_reference_cycles() -> None:
    files = sorted((ROOT / "examples").rglob("*.py"))
    assert files
    assert _check_all(files) == 0


@pytest.mark.usefixtures("collector_off")
def test_checking_every_rule_fixture_leaves_no_reference_cycles() -> None:
    files = sorted(p for p in FIXTURES.rglob("*.py") if not p.name.endswith(".fixed.py"))
    assert len(files) > 40
    assert _check_all(files) == 0


@pytest.mark.usefixtures("collector_off")
def test_siblings_dropped_from_the_cache_are_freed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each script imports an evaluate() from its own module: with a cache of two,
    # checking five scripts drops three sibling analyses from it
    monkeypatch.setattr(file_loops, "_SIBLING_LIMIT", 2)
    monkeypatch.setattr(file_loops, "_SIBLINGS", type(file_loops._SIBLINGS)())
    scripts = []
    for i in range(5):
        (tmp_path / f"engine{i}.py").write_text(
            "def evaluate(model, loader):\n    return [model(x) for x in loader]\n"
        )
        script = tmp_path / f"train{i}.py"
        script.write_text(
            "import torch\n"
            f"from engine{i} import evaluate\n"
            "model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for x in loader:\n"
            "    model(x).sum().backward()\n"
            "    opt.step()\n"
            "evaluate(model, val_loader)\n"
        )
        scripts.append(script)
    assert _check_all(scripts) == 0
    assert len(file_loops._SIBLINGS) == 2


def test_a_run_freezes_what_exists_before_its_checks_and_no_longer() -> None:
    from torchdoctor.check import parallel
    from torchdoctor.check.engine import RunOptions

    source = "import torch\nx = torch.zeros(2).cuda()\n"
    frozen: list[int] = []
    original = parallel.check_task

    def checking(task: parallel.Task, *args: object) -> parallel.Outcome:
        frozen.append(gc.get_freeze_count())
        return original(task, *args)  # type: ignore[arg-type]

    codes = tuple(r.code for r in rule_classes())
    tasks = [parallel.Task("a.py", source, codes)]
    options = RunOptions(enabled=frozenset(codes))
    try:
        parallel.check_task = checking  # type: ignore[assignment]
        outcomes = parallel.run_tasks(tasks, build_project([source]), options, 1)
    finally:
        parallel.check_task = original  # type: ignore[assignment]
    assert outcomes[0].findings
    assert frozen[0] > 0  # the young collection after the file does not scan those
    assert gc.get_freeze_count() == 0  # the collector sees them again
