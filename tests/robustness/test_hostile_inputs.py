"""Hostile files through the real CLI: each gets a clear per-file message, the run goes on.

Most cases share one folder and one `torchdoctor check` run; `ok.py` (a real finding)
sits beside them, so every run also proves that the good file was still checked.

Unreadable files: the suite runs as root on the development machines, where
`chmod 000` does not stop a read. The cases that make a read fail for root too are
used instead — a named pipe with no writer (which used to hang the run), a UNIX
socket, symlink loops and dangling links — and `chmod 000` is added when not root.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.robustness.cli import CheckRun, assert_no_crash, run_check

LOAD = b"state = torch.load(path)"  # TD402, with a safe fix
OK = b"import torch\n" + LOAD + b"\n"

# file name -> bytes; each of these is valid Python that must be checked normally,
# with the TD402 finding on the line given
READABLE: dict[str, tuple[bytes, int]] = {
    "bom.py": (b"\xef\xbb\xbf" + OK, 2),
    "crlf.py": (b"import torch\r\n\r\n" + LOAD + b"\r\n", 3),
    "old_mac_cr.py": (b"import torch\r" + LOAD + b"\r", 2),
    "tabs.py": (b"import torch\nif True:\n\t" + LOAD + b"\n", 3),
    "latin1_cookie.py": (
        b"# -*- coding: latin-1 -*-\nimport torch\nname = '\xe9t\xe9'\n" + LOAD + b"\n",
        4,
    ),
    "no_final_newline.py": (b"import torch\n" + LOAD, 2),
    # a codec a .pth file registers at start-up (future_fstrings): read as UTF-8
    "unknown_cookie_utf8.py": (b"# coding: future_fstrings\nimport torch\n" + LOAD + b"\n", 3),
    "deep_if.py": (
        b"import torch\n"
        + b"".join(b" " * i + b"if x:\n" for i in range(90))
        + b" " * 90
        + LOAD
        + b"\n",
        92,
    ),
    # a 1000-term sum in forward: parses, and used to crash TD103's analysis (TD900)
    "long_sum.py": (
        b"import torch\nfrom torch import nn\n\n\nclass M(nn.Module):\n"
        b"    def forward(self, x):\n        return x"
        + b" + torch.ones(3, device=x.device)" * 1000
        + b"\n\n\n"
        + OK,
        11,
    ),
}

# file name -> (bytes, words the TD001 message must contain)
BROKEN: dict[str, tuple[bytes, str]] = {
    "not_utf8.py": (b"import torch\nname = '\xff\xfe'\n" + LOAD + b"\n", "decode"),
    # a codec this Python lacks, and text that is not UTF-8 either
    "unknown_cookie.py": (b"# coding: klingon\nimport torch\nname = '\xff'\n", "decode"),
    "bom_and_latin1_cookie.py": (b"\xef\xbb\xbf# coding: latin-1\nimport torch\n", "decode"),
    "nul_byte.py": (b"import torch\x00\n" + LOAD + b"\n", "null bytes"),
    "mixed_tabs.py": (b"if True:\n\tx = 1\n        y = 2\n", "tabs and spaces"),
    "syntax_error.py": (b"import torch\ndef (:\n", "SyntaxError"),
    "deep_parens.py": (b"x = " + b"(" * 1000 + b"1" + b")" * 1000 + b"\n", "nested"),
    # the parser's own limits: the wording differs between Python versions
    "deep_attribute.py": (b"import torch\nx = torch" + b".a" * 100_000 + b"\n", "not checked"),
    "deep_not.py": (b"x = " + b"not " * 100_000 + b"y\n", "not checked"),
    "deep_lambda.py": (b"x = " + b"lambda: " * 50_000 + b"y\n", "not checked"),
}


def _notebook(cells: object, **extra: object) -> bytes:
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, **extra}).encode()


def _code_cell(source: object) -> dict[str, object]:
    return {"cell_type": "code", "source": source, "metadata": {}, "outputs": []}


NOTEBOOKS_BROKEN: dict[str, tuple[bytes, str]] = {
    "truncated.ipynb": (b'{"cells": [', "not valid notebook JSON"),
    "empty.ipynb": (b"", "not valid notebook JSON"),
    "not_json.ipynb": (OK, "not valid notebook JSON"),
    "no_cells.ipynb": (json.dumps({"metadata": {}, "nbformat": 4}).encode(), "no 'cells'"),
    "cells_not_list.ipynb": (_notebook({"0": _code_cell("x")}), "no 'cells'"),
    "top_level_list.ipynb": (b"[1, 2, 3]", "no 'cells'"),
    "nbformat3.ipynb": (json.dumps({"worksheets": [], "nbformat": 3}).encode(), "no 'cells'"),
    "not_utf8.ipynb": (b'{"cells": "\xff"}', "decode"),
    "deep_json.ipynb": (b"[" * 100_000 + b"]" * 100_000, "notebook"),
}

# A cell that is not Python is left out as Jupyter would (it compiles each cell apart):
# one TD001 at that cell, and the notebook's other cells are still checked.
CELL_BROKEN: dict[str, bytes] = {
    "cell_syntax_error.ipynb": _notebook(
        [_code_cell("def (:\n"), _code_cell("import torch\n" + LOAD.decode())]
    ),
}


# file name -> (bytes, the warning on stderr): notebooks with a malformed cell, whose
# other cells are still checked (each has a TD402 finding in a good cell)
NOTEBOOKS_WARNED: dict[str, tuple[bytes, str]] = {
    "source_is_number.ipynb": (
        _notebook([_code_cell(5), _code_cell(OK.decode())]),
        "cell 1 has a 'source' that is neither text nor a list of lines; not checked",
    ),
    "cell_is_string.ipynb": (
        _notebook([_code_cell(OK.decode()), "x = 1"]),
        "cell 2 is a JSON str, not an object; not checked",
    ),
}


def _unreadable(folder: Path) -> Iterator[tuple[str, str]]:
    """Make files a read fails on; yield (name, words the TD001 message must contain)."""
    os.mkfifo(folder / "fifo.py")
    yield "fifo.py", "not a regular file"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "socket.py"))
    yield "socket.py", "not a regular file"
    (folder / "self_loop.py").symlink_to("self_loop.py")
    yield "self_loop.py", "symbolic links"
    (folder / "loop_a.py").symlink_to("loop_b.py")
    (folder / "loop_b.py").symlink_to("loop_a.py")
    yield "loop_a.py", "symbolic links"
    yield "loop_b.py", "symbolic links"
    (folder / "dangling.py").symlink_to("nowhere/at/all.py")
    yield "dangling.py", "No such file"
    if os.geteuid() != 0:  # root reads mode-000 files anyway
        (folder / "mode000.py").write_bytes(OK)
        (folder / "mode000.py").chmod(0)
        yield "mode000.py", "Permission denied"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], CheckRun]:
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "ok.py").write_bytes(OK)
    for name, (data, _) in {**READABLE, **BROKEN, **NOTEBOOKS_BROKEN, **NOTEBOOKS_WARNED}.items():
        (folder / name).write_bytes(data)
    for name, data in CELL_BROKEN.items():
        (folder / name).write_bytes(data)
    unreadable = dict(_unreadable(folder))
    # a folder named like a file is walked, and a link back up does not loop the walk
    (folder / "package.py").mkdir()
    (folder / "package.py" / "inner.py").write_bytes(OK)
    (folder / "package.py" / "up").symlink_to("..")
    run = run_check(["."], folder, timeout=120)
    return folder, unreadable, run


def test_the_run_goes_on(hostile: tuple[Path, dict[str, str], CheckRun]) -> None:
    _, _, run = hostile
    assert_no_crash(run)
    assert run.returncode == 1
    by_file = run.by_file()
    assert [f["code"] for f in by_file["ok.py"]] == ["TD402"]
    assert [f["code"] for f in by_file["inner.py"]] == ["TD402"]


@pytest.mark.parametrize("name", sorted(READABLE))
def test_odd_but_valid_files_are_checked(
    hostile: tuple[Path, dict[str, str], CheckRun], name: str
) -> None:
    _, _, run = hostile
    findings = run.by_file().get(name, [])
    assert [(f["code"], f["line"]) for f in findings] == [("TD402", READABLE[name][1])], findings


@pytest.mark.parametrize("name", sorted(NOTEBOOKS_WARNED))
def test_malformed_notebook_cells_are_warned_about(
    hostile: tuple[Path, dict[str, str], CheckRun], name: str
) -> None:
    _, _, run = hostile
    assert f"torchdoctor: warning: {name}: {NOTEBOOKS_WARNED[name][1]}\n" in run.stderr
    assert [f["code"] for f in run.by_file()[name]] == ["TD402"]


@pytest.mark.parametrize("name", sorted(CELL_BROKEN))
def test_a_broken_cell_is_reported_and_the_others_checked(
    hostile: tuple[Path, dict[str, str], CheckRun], name: str
) -> None:
    _, _, run = hostile
    findings = run.by_file()[name]
    assert [(f["code"], f["cell"]) for f in findings] == [("TD001", 1), ("TD402", 2)], findings
    assert "SyntaxError" in findings[0]["message"]
    assert findings[0]["message"].endswith("; the cell was not checked")


@pytest.mark.parametrize("name", sorted({**BROKEN, **NOTEBOOKS_BROKEN}))
def test_broken_files_get_one_clear_message(
    hostile: tuple[Path, dict[str, str], CheckRun], name: str
) -> None:
    _, _, run = hostile
    words = {**BROKEN, **NOTEBOOKS_BROKEN}[name][1]
    findings = run.by_file().get(name, [])
    assert [f["code"] for f in findings] == ["TD001"], findings
    message = findings[0]["message"]
    assert words in message, message
    assert message.strip() and "\n" not in message


def test_unreadable_files_get_one_clear_message(
    hostile: tuple[Path, dict[str, str], CheckRun],
) -> None:
    _, unreadable, run = hostile
    by_file = run.by_file()
    for name, words in unreadable.items():
        findings = by_file.get(name, [])
        assert [f["code"] for f in findings] == ["TD001"], (name, findings)
        assert words in findings[0]["message"], (name, findings)


def test_unreadable_files_named_on_the_command_line(
    hostile: tuple[Path, dict[str, str], CheckRun],
) -> None:
    folder, unreadable, _ = hostile
    run = run_check([*unreadable, "ok.py"], folder, timeout=60)
    assert_no_crash(run)
    by_file = run.by_file()
    assert sorted(by_file) == sorted([*unreadable, "ok.py"])
    assert all(f["code"] == "TD001" for name in unreadable for f in by_file[name])


def test_text_output_names_each_broken_file(
    hostile: tuple[Path, dict[str, str], CheckRun],
) -> None:
    folder, _, _ = hostile
    run = run_check(
        ["not_utf8.py", "fifo.py", "truncated.ipynb", "ok.py"], folder, json_report=False
    )
    assert run.returncode == 1
    lines = run.stdout.splitlines()
    for name in ("not_utf8.py", "fifo.py", "truncated.ipynb"):
        assert any(line.startswith(f"{name}:1:1: TD001 ") for line in lines), run.stdout


def test_fix_keeps_bom_crlf_and_encoding(tmp_path: Path) -> None:
    files = {
        name: READABLE[name][0]
        for name in ("bom.py", "crlf.py", "old_mac_cr.py", "latin1_cookie.py")
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    run = run_check(["--fix", "."], tmp_path, timeout=60)
    assert_no_crash(run)
    assert run.findings == []  # everything fixed
    fixed_load = b'torch.load(path, map_location="cpu")'
    for name, data in files.items():
        after = (tmp_path / name).read_bytes()
        assert after == data.replace(b"torch.load(path)", fixed_load), name


def test_fifo_does_not_block_a_fix_run(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "ok.py").write_bytes(OK)
    run = run_check(["--fix", "."], tmp_path, timeout=60)
    assert_no_crash(run)
    assert (tmp_path / "ok.py").read_bytes() == OK.replace(
        b"torch.load(path)", b'torch.load(path, map_location="cpu")'
    )


@pytest.mark.skipif(sys.platform == "win32", reason="sparse-free 50 MB write is slow there")
def test_a_50_mb_file(tmp_path: Path) -> None:
    # 50 MB of data in one literal (a generated file), then code with a real finding
    blob = b"BLOB = '" + b"0123456789abcdef" * (50 * 2**20 // 16) + b"'\n"
    (tmp_path / "huge.py").write_bytes(b"import torch\n" + blob + LOAD + b"\n")
    (tmp_path / "ok.py").write_bytes(OK)
    run = run_check(["."], tmp_path, timeout=300)
    assert_no_crash(run)
    by_file = run.by_file()
    assert [(f["code"], f["line"]) for f in by_file["huge.py"]] == [("TD402", 3)]
    assert [f["code"] for f in by_file["ok.py"]] == ["TD402"]
