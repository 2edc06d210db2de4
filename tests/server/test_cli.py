"""`torchdoctor server` as a command: a clear message when its optional dependency is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_server_command_says_what_is_missing_without_pygls(tmp_path: Path) -> None:
    blocker = tmp_path / "pygls.py"
    blocker.write_text("raise ImportError('blocked for the test', name='pygls')\n")
    result = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "server"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert result.returncode == 2
    assert "pip install 'torchdoctor[server]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
