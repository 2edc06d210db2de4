"""`torchdoctor check` on real code nobody here wrote: every 20th .py file of torch and stdlib.

The full campaign (every file) is `benchmarks/robustness_check.py`; its counts are in
benchmarks/README.md. Every rule is on (`--select ALL`), every file is named explicitly.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from tests.robustness.cli import assert_no_crash, run_check

EVERY = 20


def _sample(root: Path, skip: frozenset[str] = frozenset()) -> list[Path]:
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    return files[::EVERY]


def _torch_root() -> Path:
    torch = pytest.importorskip("torch")
    return Path(torch.__file__).parent


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@pytest.mark.parametrize(
    ("root", "skip"),
    [
        pytest.param(_torch_root, frozenset(), id="torch"),
        pytest.param(_stdlib_root, frozenset({"site-packages", "dist-packages"}), id="stdlib"),
    ],
)
def test_no_internal_error_on_real_code(root: object, skip: frozenset[str], tmp_path: Path) -> None:
    assert callable(root)
    files = _sample(root(), skip)
    assert len(files) > 40, "the sample should cover real code"
    run = run_check(["--select", "ALL", *files], tmp_path, timeout=600)
    assert_no_crash(run)
    # Every finding points into a sampled file, at a real line of it.
    sampled = {str(p) for p in files}
    for finding in run.findings:
        assert finding["filename"] in sampled
        if finding["code"] != "TD001":
            lines = Path(finding["filename"]).read_bytes().splitlines()
            assert 1 <= finding["line"] <= max(len(lines), 1)
