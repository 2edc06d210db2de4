"""Run the real `torchdoctor check` command in a subprocess and read its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class CheckRun:
    returncode: int
    findings: list[dict[str, Any]]
    stdout: str
    stderr: str

    def by_file(self) -> dict[str, list[dict[str, Any]]]:
        """Findings keyed by the file's name (its last path part)."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        for finding in self.findings:
            grouped.setdefault(Path(finding["filename"]).name, []).append(finding)
        return grouped


def run_check(
    args: Sequence[str | os.PathLike[str]],
    cwd: Path,
    *,
    timeout: float = 300,
    json_report: bool = True,
) -> CheckRun:
    """`torchdoctor check --isolated --no-cache ARGS` in `cwd`, never hanging the suite."""
    report = cwd / ".report.json"
    command = [sys.executable, "-m", "torchdoctor", "check", "--isolated", "--no-cache"]
    if json_report:
        command += ["--format", "json", "--output-file", str(report)]
    proc = subprocess.run(
        [*command, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1"},
        stdin=subprocess.DEVNULL,
    )
    findings: list[dict[str, Any]] = []
    if json_report and report.exists():
        findings = json.loads(report.read_text(encoding="utf-8"))
        report.unlink()
    return CheckRun(proc.returncode, findings, proc.stdout, proc.stderr)


def assert_no_crash(run: CheckRun) -> None:
    """Exit 0 (clean) or 1 (findings), no traceback, no internal error anywhere."""
    assert run.returncode in (0, 1), run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert "internal error" not in run.stderr, run.stderr
    crashed = [f for f in run.findings if f["code"] == "TD900"]
    assert not crashed, crashed
