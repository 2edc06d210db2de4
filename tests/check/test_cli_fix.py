"""--fix, --unsafe-fixes and --diff on real files: atomic, encoding- and line-ending-faithful."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.check.conftest import CLI, FIXED_LOAD, LOAD, run_child, write
from torchdoctor.check.context import FileContext
from torchdoctor.check.fix import atomic_write
from torchdoctor.check.rule import Edit, Fix, FixAvailability

FIX = ("check", "--select", "TD402", "--no-cache", "--fix")


def test_fix_then_a_second_run_finds_nothing(td: CLI, project: Path) -> None:
    path = write(project / "a.py", LOAD)
    run = td(*FIX, "a.py")
    assert run.code == 0 and "Fixed 1 finding." in run.out
    assert path.read_text(encoding="utf-8") == FIXED_LOAD
    again = td(*FIX, "a.py")
    assert again.code == 0 and "Fixed" not in again.out
    assert path.read_text(encoding="utf-8") == FIXED_LOAD


@pytest.mark.parametrize(
    ("name", "before", "after"),
    [
        (
            "crlf.py",
            b'import torch\r\nx = torch.load(\r\n    "a.pt"\r\n)\r\n',
            b'import torch\r\nx = torch.load(\r\n    "a.pt", map_location="cpu"\r\n)\r\n',
        ),
        (
            "bom.py",
            b'\xef\xbb\xbfimport torch\nx = torch.load("\xc3\xa9.pt")\n',
            b'\xef\xbb\xbfimport torch\nx = torch.load("\xc3\xa9.pt", map_location="cpu")\n',
        ),
        (
            "latin1.py",
            b'# -*- coding: latin-1 -*-\nimport torch\nx = torch.load("\xe9.pt")\n',
            b'# -*- coding: latin-1 -*-\nimport torch\nx = torch.load("\xe9.pt", '
            b'map_location="cpu")\n',
        ),
        (
            "future_fstrings.py",  # a codec this Python lacks: read and written as UTF-8
            b'# -*- coding: future_fstrings -*-\nimport torch\nx = torch.load("\xc3\xa9.pt")\n',
            b'# -*- coding: future_fstrings -*-\nimport torch\nx = torch.load("\xc3\xa9.pt", '
            b'map_location="cpu")\n',
        ),
        (
            "no_final_newline.py",
            b'import torch\nx = torch.load("a.pt")',
            b'import torch\nx = torch.load("a.pt", map_location="cpu")',
        ),
        (
            "cr_only.py",
            b'import torch\rx = torch.load("a.pt")\r',
            b'import torch\rx = torch.load("a.pt", map_location="cpu")\r',
        ),
    ],
)
def test_fix_keeps_encoding_bom_line_endings_and_final_newline(
    td: CLI, project: Path, name: str, before: bytes, after: bytes
) -> None:
    path = project / name
    path.write_bytes(before)
    os.chmod(path, 0o640)
    run = td(*FIX, name)
    assert run.code == 0, run.out
    assert path.read_bytes() == after
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in project.iterdir()) == [name]  # no temp files left


def test_inserted_line_breaks_follow_the_file(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fix = FileContext.fix

    def two_line_fix(message: str, *edits: Edit, safe: bool = True) -> Fix:
        edits = tuple(Edit(e.start, e.end, e.content + "  # fixed\n") for e in edits)
        return real_fix(message, *edits, safe=safe)

    monkeypatch.setattr(FileContext, "fix", staticmethod(two_line_fix))
    path = project / "crlf.py"
    path.write_bytes(b'import torch\r\nx = torch.load("a.pt")\r\n')
    td(*FIX, "-j1", "crlf.py")
    assert path.read_bytes() == (
        b'import torch\r\nx = torch.load("a.pt", map_location="cpu"  # fixed\r\n)\r\n'
    )


def test_diff_shows_the_fix_and_writes_nothing(td: CLI, project: Path) -> None:
    path = write(project / "a.py", LOAD)
    run = td("check", "--select", "TD402", "--no-cache", "--diff", "a.py")
    assert run.code == 1
    assert run.out == (
        "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n import torch\n"
        '-state = torch.load("model.pt")\n+state = torch.load("model.pt", map_location="cpu")\n'
    )
    assert path.read_text(encoding="utf-8") == LOAD
    clean = write(project / "b.py", FIXED_LOAD)
    run = td("check", "--select", "TD402", "--no-cache", "--diff", str(clean))
    assert run.code == 0 and run.out == ""


def test_unsafe_fixes_need_the_flag(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fix = FileContext.fix

    def unsafe_fix(message: str, *edits: Edit, safe: bool = True) -> Fix:
        return real_fix(message, *edits, safe=False)

    monkeypatch.setattr(FileContext, "fix", staticmethod(unsafe_fix))
    path = write(project / "a.py", LOAD)
    run = td(*FIX, "-j1", "a.py")
    assert run.code == 1 and path.read_text(encoding="utf-8") == LOAD
    listed = td("check", "--select", "TD402", "--no-cache", "-j1", "a.py")
    assert "= unsafe fix:" in listed.out
    assert "(1 more with `--unsafe-fixes`)" in listed.out
    diff = td("check", "--select", "TD402", "--no-cache", "-j1", "--diff", "--unsafe-fixes", "a.py")
    assert diff.code == 1 and "map_location" in diff.out
    assert path.read_text(encoding="utf-8") == LOAD
    run = td(*FIX, "-j1", "--unsafe-fixes", "a.py")
    assert run.code == 0 and path.read_text(encoding="utf-8") == FIXED_LOAD
    assert Fix((), FixAvailability.UNSAFE, "m").applicability is FixAvailability.UNSAFE


def test_fix_from_stdin_prints_the_fixed_code(project: Path) -> None:
    run = run_child(*FIX, "-", cwd=project, stdin=LOAD.encode())
    assert run.returncode == 0
    assert run.stdout == FIXED_LOAD
    assert "Fixed 1 finding." in run.stderr
    left = run_child(*FIX, "-", cwd=project, stdin=b"import torch\nx = torch.load(p, **kw)\n")
    assert left.stdout == "import torch\nx = torch.load(p, **kw)\n"


def test_a_crash_while_writing_leaves_the_old_file(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(project / "a.py", LOAD)

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, b"new")
    assert path.read_text(encoding="utf-8") == LOAD
    assert [p.name for p in project.iterdir()] == ["a.py"]


def test_a_file_that_cannot_be_written_is_reported_and_kept(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(project / "a.py", LOAD)

    def refuse(target: Path, data: bytes) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("torchdoctor.check.runner.atomic_write", refuse)
    run = td(*FIX, "-j1", "a.py")
    assert run.code == 1
    assert "torchdoctor: warning: a.py: fixes not written" in run.err
    assert "a.py:2:9: TD402" in run.out  # the finding is still reported
    assert path.read_text(encoding="utf-8") == LOAD
