"""The flake8 plugin and the pre-commit hook, run for real."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.check.conftest import LOAD, write

ROOT = Path(__file__).resolve().parents[2]


def flake8(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flake8", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(shutil.which("flake8") is None and not (ROOT / ".venv/bin/flake8").exists(),
                    reason="flake8 is not installed")  # fmt: skip
def test_flake8_select_td_runs_our_rules(project: Path) -> None:
    write(
        project / "train.py",
        LOAD + 'other = torch.load("b.pt")  # noqa: TD402\nx  =  1\n',
    )
    run = flake8("--select", "TD", "train.py", cwd=project)
    assert run.returncode == 1, run.stderr
    assert run.stdout.splitlines() == [
        "train.py:2:9: TD402 `torch.load` without `map_location` restores tensors onto the "
        "device they were saved from; it fails on a machine without that GPU"
    ]
    # the project's [tool.torchdoctor] config decides which rules run
    write(project / "pyproject.toml", '[tool.torchdoctor]\nignore = ["TD402"]\n')
    assert flake8("--select", "TD", "train.py", cwd=project).stdout == ""
    assert "TD" in flake8("--version", cwd=project).stdout.replace("torchdoctor", "TD")


def test_flake8_plugin_class_directly(project: Path) -> None:
    import ast

    from torchdoctor.check.flake8_plugin import Flake8Plugin

    path = write(project / "a.py", LOAD)
    lines = path.read_text().splitlines(keepends=True)
    found = list(Flake8Plugin(ast.parse(LOAD), str(path), lines).run())
    assert [(line, col, msg.split()[0]) for line, col, msg, _ in found] == [(2, 8, "TD402")]
    assert list(Flake8Plugin(ast.parse("x = 1"), "stdin", ["x = 1\n"]).run()) == []


def test_flake8_plugin_reads_the_torch_pins(project: Path) -> None:
    import ast

    from torchdoctor.check.flake8_plugin import Flake8Plugin

    source = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    path = write(project / "pinned" / "a.py", source)
    write(project / "pinned" / "requirements.txt", "torch>=1.10,<2\n")
    lines = source.splitlines(keepends=True)
    assert list(Flake8Plugin(ast.parse(source), str(path), lines).run()) == []
    unpinned = write(project / "unpinned" / "a.py", source)
    found = list(Flake8Plugin(ast.parse(source), str(unpinned), lines).run())
    assert [msg.split()[0] for _, _, msg, _ in found] == ["TD601"]


def test_pre_commit_hook_definition_runs_and_honours_excludes(project: Path) -> None:
    yaml = pytest.importorskip("yaml")
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "torchdoctor"
    assert hook["language"] == "python"
    assert set(hook["types_or"]) == {"python", "pyi", "jupyter"}
    entry = hook["entry"].split()
    assert entry[:2] == ["torchdoctor", "check"] and "--force-exclude" in entry

    write(project / "pyproject.toml", '[tool.torchdoctor]\nextend-exclude = ["generated"]\n')
    write(project / "generated" / "g.py", LOAD)
    write(project / "src" / "ok.py", "x = 1\n")
    # pre-commit names each staged file; the excluded one must be skipped
    command = [sys.executable, "-m", "torchdoctor", *entry[1:], "--select", "TD402"]
    run = subprocess.run(
        [*command, "generated/g.py", "src/ok.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    write(project / "src" / "bad.py", LOAD)
    run = subprocess.run(
        [*command, "generated/g.py", "src/bad.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "src/bad.py:2:9: TD402" in run.stdout
