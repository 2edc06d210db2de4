"""TD202 across files: whether every call of an evaluation function in the project runs
under no_grad (analysis/grad_callers.py) is read from the other files, so the cache must
redo a file when one of them changes, and a caller the analysis cannot read keeps the
report."""

from __future__ import annotations

from pathlib import Path

from tests.check.conftest import CLI, write

FIXTURE = Path(__file__).parent / "fixtures" / "TD202_callers_project"
ARGS = ("check", "--select", "TD202", "-j1", "--format", "concise", ".")
GUARDED = "asr/lm.py:14:"  # LM.evaluate: every call runs under no_grad in run.py


def copy_fixture(project: Path) -> None:
    for path in FIXTURE.rglob("*.py"):
        write(project / path.relative_to(FIXTURE), path.read_text(encoding="utf-8"))


def test_the_cache_is_redone_when_a_caller_in_another_file_changes(td: CLI, project: Path) -> None:
    copy_fixture(project)
    first = td(*ARGS)
    assert first.code == 1 and "asr/lm.py:19:" in first.out and GUARDED not in first.out
    assert td(*ARGS).out == first.out  # from the cache
    run = project / "run.py"
    text = run.read_text(encoding="utf-8")
    moved = text.replace("    best = decoder.decode(", "best = decoder.decode(", 1)
    assert moved != text
    write(run, moved)  # the decoder now runs outside no_grad
    assert GUARDED in td(*ARGS).out


def test_a_caller_file_that_does_not_parse_keeps_the_report(td: CLI, project: Path) -> None:
    copy_fixture(project)
    write(project / "legacy.py", "from asr.decode import Decoder\nprint Decoder(None).decode([])\n")
    assert GUARDED in td(*ARGS).out
