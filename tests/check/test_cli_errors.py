"""Exit codes, and bad input that must never end in a traceback."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from tests.check.conftest import CLI, LOAD, run_child, write
from torchdoctor.check.rule import Rule
from torchdoctor.check.rules.td402_load_without_map_location import LoadWithoutMapLocation


def concise(td: CLI, *args: str) -> tuple[int, list[str]]:
    run = td("check", "--select", "TD402", "--no-cache", "--format", "concise", *args)
    return run.code, run.out.splitlines()


def test_exit_codes_clean_findings_and_usage_error(td: CLI, project: Path) -> None:
    write(project / "clean.py", "x = 1\n")
    write(project / "bad.py", LOAD)
    assert td("check", "--no-cache", "clean.py").code == 0
    assert td("check", "--select", "TD402", "--no-cache", "bad.py").code == 1
    assert td("check", "--format", "xml", "clean.py").code == 2
    assert td("check", "--jobs", "0", "clean.py").code == 2
    assert td("check", "--select", "NOPE", "clean.py").code == 2


def test_unparsable_files_are_td001_and_the_run_goes_on(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project / "a_syntax.py", "import torch\ndef f(:\n")
    (project / "b_latin1.py").write_bytes(b"name = '\xe9t\xe9'\n")  # no coding cookie
    # a codec only a .pth file registers: the text is read as UTF-8; not UTF-8 -> TD001
    (project / "c_cookie.py").write_bytes(b"# coding: klingon\nname = '\xe9'\n")
    write(project / "d_unreadable.py", LOAD)
    write(project / "e_ok.py", LOAD)
    (project / "f_nul.py").write_bytes(b"x = 1\x00\n")
    real_read = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "d_unreadable.py":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    code, lines = concise(td, ".")
    assert code == 1
    assert (
        lines[0] == "a_syntax.py:2:7: TD001 SyntaxError: invalid syntax; the file was not checked"
    )
    assert lines[1].startswith(
        "b_latin1.py:1:1: TD001 cannot decode file: not UTF-8 and no `# coding:` line"
    )
    assert lines[2].startswith("c_cookie.py:1:1: TD001 cannot decode file: not UTF-8")
    assert lines[3] == "d_unreadable.py:1:1: TD001 cannot read file: Permission denied"
    assert lines[4].startswith("e_ok.py:2:9: TD402 ")
    assert lines[5].startswith("f_nul.py:1:1: TD001 ")
    assert len(lines) == 6


def test_an_unknown_coding_pragma_is_read_as_utf8_and_checked(td: CLI, project: Path) -> None:
    # future_fstrings and friends register their codec from a .pth file at start-up
    (project / "a.py").write_bytes(
        b"# -*- coding: future_fstrings -*-\nimport torch\nname = '\xc3\xa9'\n"
        b'x = torch.load(f"{name}.pt")\n'
    )
    code, lines = concise(td, "--select", "TD001,TD402", ".")
    assert code == 1
    assert [line.split(" ", 2)[:2] for line in lines] == [["a.py:4:5:", "TD402"]]


def test_a_rule_that_raises_is_td900_naming_the_rule(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Rule, node: ast.AST) -> None:
        raise KeyError("oops")

    monkeypatch.setattr(LoadWithoutMapLocation, "visit", broken)
    write(project / "a.py", LOAD)
    write(project / "b.py", LOAD)
    run = td("check", "--no-cache", "-j1", "--format", "json", ".")
    assert run.code == 1
    items = json.loads(run.out)
    assert [(i["filename"], i["code"]) for i in items if i["code"] == "TD900"] == [
        ("a.py", "TD900"),
        ("b.py", "TD900"),
    ]
    message = next(i["message"] for i in items if i["code"] == "TD900")
    assert message == (
        "internal error in rule TD402 (load-without-map-location): KeyError: 'oops'; "
        "please report this"
    )


def test_a_rule_failing_in_finish_is_td900_too(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Rule) -> None:
        raise RuntimeError("finish failed")

    monkeypatch.setattr(LoadWithoutMapLocation, "finish", broken)
    write(project / "a.py", LOAD)
    code, lines = concise(td, "-j1", "a.py")
    assert code == 1
    assert any("TD402" in line for line in lines)  # findings made before the crash stay
    assert any("TD900 internal error in rule TD402" in line for line in lines)


def test_no_traceback_from_a_child_process(project: Path) -> None:
    write(project / "pyproject.toml", "[tool.torchdoctor]\nselect = ['TD402'\n")
    write(project / "a.py", LOAD)
    run = run_child("check", "a.py", cwd=project)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.startswith("torchdoctor: error: ")
    assert "is not valid TOML" in run.stderr
    assert "Traceback" not in run.stderr


def test_rules_lists_every_static_rule(td: CLI) -> None:
    from torchdoctor.check.registry import rule_classes

    run = td("rules")
    assert run.code == 0
    lines = run.out.splitlines()
    for rule in rule_classes():
        row = next(line for line in lines if line.startswith(rule.code + " "))
        assert rule.name in row and rule.severity.value in row
    td402 = next(line for line in lines if line.startswith("TD402"))
    assert td402.split()[:5] == ["TD402", "*", "load-without-map-location", "bugs", "warning"]
    items = json.loads(td("rules", "--format", "json").out)
    assert {i["code"] for i in items} == {r.code for r in rule_classes()}
    assert {i["code"] for i in json.loads(td("rules", "--all", "--format", "json").out)} >= {
        "TD001",
        "TD900",
    }


def test_rule_prints_documentation_and_unknown_code_exits_2(td: CLI) -> None:
    run = td("rule", "td402")
    assert run.code == 0
    assert run.out.startswith("# TD402 load-without-map-location\n")
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
        assert section in run.out
    assert td("rule", "load-without-map-location").out == run.out
    missing = td("rule", "TD999")
    assert missing.code == 2
    assert missing.err.startswith("torchdoctor: error: unknown rule 'TD999'")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-j", "0"], "argument -j/--jobs: expected a number of processes >= 1, got '0'"),
        (["--jobs", "two"], "argument -j/--jobs: expected a number of processes >= 1, got 'two'"),
        (["--format", "xml"], "argument --format: invalid choice: 'xml'"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_arguments_are_one_line_not_the_usage(
    td: CLI, project: Path, args: list[str], message: str
) -> None:
    write(project / "a.py", LOAD)
    run = td("check", *args, "a.py")
    assert run.code == 2
    assert run.out == ""
    [line] = run.err.splitlines()
    assert line.startswith("torchdoctor: error: ") and message in line, line
    assert "usage:" not in run.err


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (
            ["--select", "TD4O2"],
            "--select: unknown rule code, prefix or group 'TD4O2' (did you mean 'TD402'?)",
        ),
        (["--ignore", "TD4022"], "(did you mean 'TD402'?)"),
        (
            ["--extend-select", "load-without-map-location"],
            "(did you mean 'TD402', the code of 'load-without-map-location'?)",
        ),
        (["--per-file-ignores", "a.py:TD4O2"], "(did you mean 'TD402'?)"),
    ],
)
def test_unknown_codes_on_the_command_line_suggest_the_closest(
    td: CLI, project: Path, args: list[str], hint: str
) -> None:
    write(project / "a.py", LOAD)
    run = td("check", *args, "a.py")
    assert run.code == 2
    assert hint in run.err.splitlines()[0], run.err


def test_unknown_rule_for_the_rule_command_suggests_the_closest(td: CLI) -> None:
    run = td("rule", "TD4O2")
    assert run.code == 2
    assert run.err.startswith("torchdoctor: error: unknown rule 'TD4O2' (did you mean 'TD402'?)")
    run = td("rule", "load-without-map-locaton")
    assert "(did you mean 'load-without-map-location'?)" in run.err


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 parses PEP 701 f-strings")
def test_newer_f_string_syntax_is_named_not_called_an_error(td: CLI, project: Path) -> None:
    # valid Python 3.12 (quotes reused inside the f-string), which older grammars reject
    write(project / "newer.py", 'import time\nstamp = f"{time.strftime("%Y")}"\n')
    write(project / "broken.py", "x = (1,\n")
    code, lines = concise(td, "newer.py", "broken.py")
    assert code == 1
    newer = next(line for line in lines if line.startswith("newer.py"))
    assert newer.startswith("newer.py:2:")
    assert "valid Python 3.12" in newer and "run torchdoctor under Python 3.12" in newer
    broken = next(line for line in lines if line.startswith("broken.py"))
    assert "3.12" not in broken  # an ordinary syntax error gets no such note
