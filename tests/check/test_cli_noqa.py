"""Suppression comments (`# noqa`, `# noqa: CODES`, `# torchdoctor: noqa`) and --statistics."""

from __future__ import annotations

import json
from pathlib import Path

from tests.check.conftest import CLI, write

SOURCE = """\
import torch
a = torch.load("a.pt")
b = torch.load("b.pt")  # noqa
c = torch.load("c.pt")  # noqa: TD402
d = torch.load("d.pt")  # noqa: TD101, TD402
e = torch.load("e.pt")  # noqa: TD101
f = torch.load("f.pt")  # NOQA:TD402
g = torch.load(  # noqa: TD402
    "g.pt",
)
h = torch.load(
    "h.pt",
)  # noqa: TD402
i = torch.load(
    "i.pt",  # noqa: TD402
)
j = dict(
    k=torch.load("k.pt"),
)  # noqa: TD402
"""


def lines_found(td: CLI, *args: str) -> list[int]:
    run = td("check", "--select", "TD402", "--no-cache", "--format", "json", *args)
    assert run.code in (0, 1), run.err
    return sorted(item["line"] for item in json.loads(run.out))


def test_noqa_forms(td: CLI, project: Path) -> None:
    write(project / "a.py", SOURCE)
    # a: no comment; e: noqa for another code; i: a noqa on a middle line of the statement
    # does not count (only its first or last line)
    assert lines_found(td, "a.py") == [2, 6, 14]


def test_file_level_noqa(td: CLI, project: Path) -> None:
    write(project / "all.py", "# torchdoctor: noqa\n" + SOURCE)
    write(
        project / "codes.py",
        SOURCE.replace("import torch", "import torch\n# torchdoctor: noqa: TD402"),
    )
    write(project / "other.py", "# torchdoctor: noqa: TD101\n" + SOURCE)
    assert lines_found(td, "all.py") == []
    assert lines_found(td, "codes.py") == []
    assert lines_found(td, "other.py") == [3, 7, 15]


def test_noqa_does_not_hide_unparsable_files(td: CLI, project: Path) -> None:
    write(project / "bad.py", "def f(:  # noqa\n")
    run = td("check", "--no-cache", "--format", "concise", "bad.py")
    assert run.code == 1
    assert "bad.py:1:7: TD001 SyntaxError" in run.out


def test_statistics_counts_by_code(td: CLI, project: Path) -> None:
    write(project / "a.py", SOURCE)
    write(project / "b.py", "import torch\nx = torch.load('x')\n")
    write(project / "bad.py", "x = (\n")
    run = td("check", "--select", "TD402", "--no-cache", "--statistics", ".")
    assert run.code == 1
    rows = [line.split() for line in run.out.splitlines()]
    assert rows == [
        ["4", "TD402", "[*]", "load-without-map-location"],
        ["1", "TD001", "unparsable-file"],
    ]
