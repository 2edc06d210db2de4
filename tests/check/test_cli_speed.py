"""Parallel checking (-j) and the results cache (.torchdoctor_cache/, --no-cache)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.check.conftest import CLI, FIXED_LOAD, LOAD, run_child, write
from torchdoctor.check import parallel
from torchdoctor.check.engine import RunOptions
from torchdoctor.check.project import ProjectIndex


def many_files(root: Path, count: int) -> None:
    for i in range(count):
        body = LOAD if i % 3 else "import torch\nx = torch.zeros(3)\n"
        write(root / f"pkg{i % 4}" / f"m{i:02d}.py", body + f"# file {i}\n")


def test_parallel_run_gives_the_same_report_as_one_process(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many_files(project, 40)
    pools: list[int] = []

    class CountingPool(ProcessPoolExecutor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pools.append(kwargs["max_workers"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", CountingPool)
    args = ("check", "--select", "TD402", "--no-cache", "--format", "json", ".")
    one = td(*args, "-j1")
    two = td(*args, "-j2")
    assert pools == [2]  # -j1 stayed in this process; -j2 started two workers
    assert one.code == two.code == 1
    assert json.loads(one.out) == json.loads(two.out)
    assert len(json.loads(one.out)) == 26


def test_small_runs_stay_in_process(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many_files(project, 5)
    monkeypatch.setattr(parallel, "ProcessPoolExecutor", None)  # would fail if used
    assert td("check", "--select", "TD402", "--no-cache", "-j", "8", ".").code == 1


def test_fix_in_parallel_writes_every_file(td: CLI, project: Path) -> None:
    many_files(project, 40)
    run = td("check", "--select", "TD402", "--no-cache", "--fix", "-j2", ".")
    assert run.code == 0 and "Fixed 26 findings." in run.out
    fixed = [p for p in project.rglob("*.py") if "map_location" in p.read_text(encoding="utf-8")]
    assert len(fixed) == 26
    assert all(p.read_text(encoding="utf-8").startswith(FIXED_LOAD) for p in fixed)


def test_an_engine_failure_on_one_file_is_td900_for_that_file() -> None:
    def explode(*args: Any) -> Any:
        raise ValueError("bad")

    options = RunOptions(enabled=frozenset({"TD402"}))
    tasks = [parallel.Task("a.py", LOAD, ("TD402",))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "check_text", explode)
        (outcome,) = parallel.run_tasks(tasks, ProjectIndex(), options, jobs=1)
    assert [f.code for f in outcome.findings] == ["TD900"]
    assert "internal error while checking this file: ValueError: bad" in outcome.findings[0].message


class Counter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real = parallel.check_task

        def counting(task: parallel.Task, *args: Any) -> parallel.Outcome:
            self.paths.append(task.path)
            return real(task, *args)

        monkeypatch.setattr(parallel, "check_task", counting)

    def take(self) -> list[str]:
        out, self.paths = sorted(self.paths), []
        return out


def test_cache_reuses_results_until_something_relevant_changes(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project / "a.py", LOAD)
    write(project / "b.py", "import torch\n\nclass Net(Base):\n    pass\n")
    write(project / "base.py", "class Base:\n    pass\n")
    checked = Counter(monkeypatch)
    args = ("check", "--select", "TD402", "-j1", "--format", "concise", ".")

    first = td(*args)
    assert checked.take() == ["a.py", "b.py", "base.py"]
    cache = project / ".torchdoctor_cache"
    assert (cache / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (
        (cache / "CACHEDIR.TAG")
        .read_text()
        .startswith("Signature: 8a477f597d28d172789f06886806bc55")
    )

    second = td(*args)
    assert checked.take() == []  # every file answered from the cache
    assert (second.code, second.out) == (first.code, first.out)

    write(project / "b.py", "import torch\n\nclass Net(Base):\n    x = 1\n")
    td(*args)
    assert checked.take() == ["b.py"]  # only the changed file

    td(*args, "--per-file-ignores", "a.py:TD402")
    assert checked.take() == ["a.py"]  # other rules for a.py: another result
    td(*args, "--target-version", "2.3")
    assert checked.take() == ["a.py", "b.py", "base.py"]

    write(project / "base.py", "import torch.nn as nn\nclass Base(nn.Module):\n    pass\n")
    td(*args, "--target-version", "2.3")
    # Net became a module through base.py: the project index changed, every file is redone
    assert checked.take() == ["a.py", "b.py", "base.py"]

    td(*args, "--no-cache")
    assert checked.take() == ["a.py", "b.py", "base.py"]


def test_cached_fixable_findings_are_fixed(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(project / "a.py", LOAD)
    assert td("check", "--select", "TD402", "-j1", "a.py").code == 1
    run = td("check", "--select", "TD402", "-j1", "--fix", "a.py")
    assert run.code == 0 and path.read_text(encoding="utf-8") == FIXED_LOAD
    checked = Counter(monkeypatch)
    assert td("check", "--select", "TD402", "-j1", "a.py").code == 0
    assert checked.take() == []  # the fixed file's result was cached when it was written


def test_no_cache_writes_nothing_and_a_damaged_cache_is_ignored(td: CLI, project: Path) -> None:
    write(project / "a.py", LOAD)
    td("check", "--select", "TD402", "--no-cache", "a.py")
    assert not (project / ".torchdoctor_cache").exists()
    td("check", "--select", "TD402", "a.py")
    (results,) = (project / ".torchdoctor_cache").rglob("results.json")
    results.write_text("{not json")
    run = td("check", "--select", "TD402", "--format", "concise", "a.py")
    assert run.code == 1 and run.out.startswith("a.py:2:9: TD402")
    results.write_text(json.dumps({"format": 1, "files": {"a.py": {"key": 1, "findings": 2}}}))
    assert td("check", "--select", "TD402", "a.py").code == 1


def test_cache_lives_beside_the_config_file(td: CLI, project: Path) -> None:
    write(project / "repo" / "pyproject.toml", "[tool.torchdoctor]\n")
    write(project / "repo" / "src" / "a.py", LOAD)
    td("check", "--select", "TD402", "repo/src")
    assert (project / "repo" / ".torchdoctor_cache").is_dir()
    assert not (project / ".torchdoctor_cache").exists()


def test_cache_is_redone_when_an_imported_sibling_file_changes(td: CLI, project: Path) -> None:
    """TD201 reads engine.py to judge train.py: editing only engine.py must redo train.py."""
    fixtures = Path(__file__).parent / "fixtures" / "TD201_project"
    for name in ("engine.py", "train.py"):
        write(project / name, (fixtures / name).read_text(encoding="utf-8"))
    args = ("check", "--select", "TD201", "-j1", "--format", "concise", "train.py")
    first = td(*args)
    assert first.code == 1 and "train.py:12:" in first.out
    assert td(*args).out == first.out  # from the cache

    engine = project / "engine.py"
    text = engine.read_text(encoding="utf-8")
    fixed = text.replace("    total = 0.0\n", "    model.eval()\n    total = 0.0\n", 1)
    assert fixed != text
    write(engine, fixed)  # evaluate() now sets eval mode itself
    after = td(*args)
    assert after.code == 0, after.out


def test_the_command_ends_fast_with_its_whole_report_and_cache_written(project: Path) -> None:
    """`python -m torchdoctor check` ends without tearing down (os._exit): the report
    (larger than a pipe's buffer), its exit code and the cache must all be complete."""
    many_files(project, 120)
    child = run_child("check", "--select", "TD402", "--format", "json", ".", cwd=project)
    assert child.returncode == 1, child.stderr
    assert child.stderr == ""
    findings = json.loads(child.stdout)
    assert len(findings) == 80  # two of every three files load without map_location
    assert any((project / ".torchdoctor_cache").iterdir())  # the cache was written first
    again = run_child("check", "--select", "TD402", "--format", "json", ".", cwd=project)
    assert json.loads(again.stdout) == findings


def test_a_reader_that_leaves_early_gets_no_traceback(project: Path) -> None:
    many_files(project, 120)
    child = subprocess.Popen(
        [sys.executable, "-m", "torchdoctor", "check", "--select", "TD402", "."],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.readline()
    child.stdout.close()  # like `| head -1`
    errors = child.stderr.read().decode()
    assert child.wait(timeout=120) == 1
    assert "Traceback" not in errors and "Exception ignored" not in errors
