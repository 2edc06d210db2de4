"""Run the real `torchdoctor` CLI on real files, in this process (`main([...])`) or as a child."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchdoctor.cli import main

# Rule fixtures named like tests (`test_*.py`: the rules treat test files apart) are
# data for the rules, not tests to run.
collect_ignore_glob = ["fixtures/*"]

# A file with exactly one TD402 finding (line 2) whose safe fix adds map_location.
LOAD = 'import torch\nstate = torch.load("model.pt")\n'
FIXED_LOAD = 'import torch\nstate = torch.load("model.pt", map_location="cpu")\n'


@dataclass
class Run:
    code: int
    out: str
    err: str


CLI = Callable[..., Run]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty project folder, made the working folder, with no colour forced on or off."""
    monkeypatch.chdir(tmp_path)
    for name in ("NO_COLOR", "FORCE_COLOR", "TORCHDOCTOR_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path


@pytest.fixture
def td(project: Path) -> CLI:
    """`td("check", "x.py", ...)` runs `torchdoctor` in-process and captures its output."""

    def run(*args: str | Path) -> Run:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:  # argparse errors
                code = int(exc.code or 0)
        return Run(code, out.getvalue(), err.getvalue())

    return run


def run_child(
    *args: str | Path,
    cwd: Path,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m torchdoctor ARGS` in a child process (for stdin, TTYs, tracebacks)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "torchdoctor", *map(str, args)],
        cwd=cwd,
        input=stdin.decode("utf-8", "surrogateescape") if stdin is not None else None,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
