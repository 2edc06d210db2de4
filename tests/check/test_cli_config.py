"""`[tool.torchdoctor]` in pyproject.toml and the command-line flags that override it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.check.conftest import CLI, LOAD, write
from torchdoctor.check.context import FileContext
from torchdoctor.check.engine import check_source
from torchdoctor.check.rule import Rule
from torchdoctor.check.rules.td402_load_without_map_location import LoadWithoutMapLocation


def codes(td: CLI, *args: str) -> list[tuple[str, str]]:
    run = td("check", "--no-cache", "--format", "json", *args)
    assert run.code in (0, 1), run.err
    return sorted((Path(i["filename"]).as_posix(), i["code"]) for i in json.loads(run.out))


def test_config_is_found_walking_up_from_the_checked_path(td: CLI, project: Path) -> None:
    write(project / "pyproject.toml", '[tool.torchdoctor]\nignore = ["TD402"]\n')
    write(project / "src" / "pkg" / "a.py", LOAD)
    assert codes(td, "--select", "TD402", "src/pkg") == [("src/pkg/a.py", "TD402")]
    assert codes(td, "src/pkg") == []  # ignore from the config, found two folders up
    assert codes(td, "--isolated", "--select", "TD402", "src/pkg/a.py") != []


def test_a_pyproject_without_our_table_is_skipped(td: CLI, project: Path) -> None:
    write(project / "pyproject.toml", '[tool.torchdoctor]\nselect = ["TD101"]\n')
    write(project / "sub" / "pyproject.toml", "[project]\nname = 'sub'\n")
    write(project / "sub" / "a.py", LOAD)
    assert codes(td, "sub") == []  # select = TD101 from the outer file


def test_explicit_config_file_and_missing_one(td: CLI, project: Path) -> None:
    write(project / "conf" / "custom.toml", '[tool.torchdoctor]\nselect = ["TD402"]\n')
    write(project / "a.py", LOAD)
    assert codes(td, "--config", "conf/custom.toml", "a.py") == [("a.py", "TD402")]
    run = td("check", "--config", "nope.toml", "a.py")
    assert run.code == 2 and "nope.toml: no such file" in run.err


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('selekt = ["TD4"]', "unknown key(s) in [tool.torchdoctor]: selekt"),
        ('select = ["TD999"]', "unknown rule code, prefix or group 'TD999'"),
        ('ignore = ["XX1"]', "unknown rule code, prefix or group 'XX1'"),
        ('select = "TD402"', "'select' must be a list of rule codes"),
        ('per-file-ignores = {"a.py" = ["TD999"]}', "per-file-ignores 'a.py'"),
        ('target-version = "two"', "is not a torch version"),
        ('force-exclude = "yes"', "'force-exclude' must be true or false"),
        ("select = [", "is not valid TOML"),
    ],
)
def test_bad_config_is_a_one_line_error_with_exit_2(
    td: CLI, project: Path, table: str, message: str
) -> None:
    write(project / "pyproject.toml", f"[tool.torchdoctor]\n{table}\n")
    write(project / "a.py", LOAD)
    run = td("check", "a.py")
    assert run.code == 2
    assert run.out == ""
    first = run.err.splitlines()[0]
    assert first.startswith("torchdoctor: error: ") and message in first, run.err
    assert "Traceback" not in run.err


@pytest.mark.parametrize("flag", ["--select", "--ignore", "--extend-select"])
def test_unknown_code_on_the_command_line_exits_2(td: CLI, project: Path, flag: str) -> None:
    write(project / "a.py", LOAD)
    run = td("check", flag, "TD4O2", "a.py")
    assert run.code == 2
    assert "unknown rule code, prefix or group 'TD4O2'" in run.err


def test_selection_by_prefix_and_cli_overrides_config(td: CLI, project: Path) -> None:
    write(project / "pyproject.toml", '[tool.torchdoctor]\nselect = ["TD1"]\n')
    write(project / "a.py", LOAD)
    assert codes(td, "a.py") == []  # TD402 is not in TD1
    assert codes(td, "--select", "TD4", "a.py") == [("a.py", "TD402")]
    assert codes(td, "--extend-select", "TD40", "a.py") == [("a.py", "TD402")]
    assert codes(td, "--select", "td402", "--ignore", "TD4", "a.py") == []
    assert ("a.py", "TD402") in codes(td, "--select", "ALL", "a.py")


def test_per_file_ignores_from_config_and_command_line(td: CLI, project: Path) -> None:
    write(
        project / "pyproject.toml",
        '[tool.torchdoctor]\nselect = ["TD402"]\n'
        '[tool.torchdoctor.per-file-ignores]\n"tests/*" = ["TD4"]\n"conftest.py" = "TD402"\n',
    )
    for name in ("tests/test_a.py", "src/a.py", "src/conftest.py"):
        write(project / name, LOAD)
    assert codes(td, ".") == [("src/a.py", "TD402")]
    # --per-file-ignores replaces the configured table
    assert codes(td, ".", "--per-file-ignores", "src/*:TD402") == [("tests/test_a.py", "TD402")]
    run = td("check", ".", "--per-file-ignores", "src/*")
    assert run.code == 2 and "expected GLOB:CODES" in run.err


def test_extend_ignore_and_extend_exclude_keys(td: CLI, project: Path) -> None:
    write(
        project / "pyproject.toml",
        '[tool.torchdoctor]\nselect = ["TD4"]\nextend-ignore = ["TD402"]\n',
    )
    write(project / "a.py", LOAD)
    assert codes(td, "a.py") == []


def test_target_version_reaches_rules_through_file_context(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int] | None] = []

    def visit(self: Rule, node: ast.AST) -> None:
        seen.append(self.ctx.target_version)

    monkeypatch.setattr(LoadWithoutMapLocation, "visit", visit)
    write(project / "a.py", LOAD)
    write(project / "pyproject.toml", '[tool.torchdoctor]\ntarget-version = "2.1"\n')
    td("check", "--select", "TD402", "--no-cache", "-j1", "a.py")
    td("check", "--select", "TD402", "--no-cache", "-j1", "--target-version", "2.4.1", "a.py")
    td("check", "--select", "TD402", "--no-cache", "-j1", "--isolated", "a.py")
    assert seen == [(2, 1), (2, 4), None]
    run = td("check", "--target-version", "latest", "a.py")
    assert run.code == 2 and "--target-version: target-version 'latest'" in run.err


def test_targets_torch_at_least() -> None:
    tree = ast.parse("x = 1")
    from torchdoctor.check.project import ProjectIndex

    ctx = FileContext("a.py", "x = 1", tree, ProjectIndex(), target_version=(2, 4))
    assert ctx.targets_torch_at_least(2, 4) and ctx.targets_torch_at_least(1, 13)
    assert not ctx.targets_torch_at_least(2, 5)
    assert not FileContext("a.py", "", tree, ProjectIndex()).targets_torch_at_least(1, 0)
    assert check_source("x = 1", "a.py", [], target_version=(2, 0)) == []


def test_shared_analysis_is_built_once_per_file_and_freed_with_it() -> None:
    import gc
    import weakref

    from torchdoctor.check.project import ProjectIndex

    class Analysis:
        def __init__(self, ctx: FileContext) -> None:
            self.ctx = ctx  # refers back to the context, as real analyses do

    built: list[FileContext] = []

    def build(ctx: FileContext) -> Analysis:
        built.append(ctx)
        return Analysis(ctx)

    ctx = FileContext("a.py", "x = 1", ast.parse("x = 1"), ProjectIndex())
    first = ctx.shared("loops", build)
    assert ctx.shared("loops", build) is first and len(built) == 1
    assert ctx.shared("other", build) is not first and len(built) == 2
    gone = weakref.ref(first)
    built.clear()
    del ctx, first
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("where", [".", "sub"])
def test_a_config_that_is_not_utf8_is_an_error_not_ignored(
    td: CLI, project: Path, where: str
) -> None:
    # a Latin-1 comment: the table is ours, so using the defaults instead would be wrong
    (project / "pyproject.toml").write_bytes(b'# caf\xe9\n[tool.torchdoctor]\nselect = ["TD101"]\n')
    write(project / "sub" / "a.py", LOAD)
    run = td("check", "--no-cache", where)
    assert run.code == 2, run.out
    assert run.out == ""
    [line] = run.err.splitlines()
    assert line.startswith("torchdoctor: error: cannot read "), line
    assert line.endswith(
        "pyproject.toml: not UTF-8 (line 1: byte b'\\xe9'); TOML files must be UTF-8"
    ), line


def test_an_unrelated_config_that_is_not_utf8_is_still_skipped(td: CLI, project: Path) -> None:
    (project / "pyproject.toml").write_bytes(b"# caf\xe9\n[tool.black]\nline-length = 99\n")
    write(project / "a.py", LOAD)
    assert codes(td, "a.py") == [("a.py", "TD402")]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('extend-ignores = ["TD4"]', "extend-ignores (did you mean 'extend-ignore'?)"),
        ('selct = ["TD4"]', "selct (did you mean 'select'?)"),
        ('select = ["TD4O2"]', "'TD4O2' (did you mean 'TD402'?)"),
        (
            'ignore = ["load-without-map-location"]',
            "(did you mean 'TD402', the code of 'load-without-map-location'?)",
        ),
        (
            'ignore = ["load-without-map-locaton"]',
            "(did you mean 'TD402', the code of 'load-without-map-location'?)",
        ),
        ('ignore = ["QQQQQQ"]', "unknown rule code, prefix or group 'QQQQQQ'\n"),
    ],
)
def test_unknown_keys_and_codes_in_config_suggest_the_closest(
    td: CLI, project: Path, table: str, message: str
) -> None:
    write(project / "pyproject.toml", f"[tool.torchdoctor]\n{table}\n")
    write(project / "a.py", LOAD)
    run = td("check", "a.py")
    assert run.code == 2
    assert message in run.err.splitlines()[0] + "\n", run.err


ADVICE_AND_BUG = """\
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model.to(device)
state = torch.load("ckpt.pt")
"""


def test_advice_group_is_off_by_default_and_selected_by_its_name(td: CLI, project: Path) -> None:
    write(project / "a.py", ADVICE_AND_BUG)
    found = {code for _, code in codes(td, "--isolated", "a.py")}
    assert "TD402" in found and "TD108" not in found  # a bug is on, advice is not
    found = {code for _, code in codes(td, "--isolated", "--extend-select", "advice", "a.py")}
    assert {"TD402", "TD108"} <= found
    assert {code for _, code in codes(td, "--isolated", "--select", "advice", "a.py")} == {"TD108"}
    found = {code for _, code in codes(td, "--isolated", "--select", "ALL", "--ignore", "bugs")}
    assert found == {"TD108"}
    write(project / "pyproject.toml", '[tool.torchdoctor]\nextend-select = ["advice"]\n')
    assert "TD108" in {code for _, code in codes(td, "a.py")}


def test_rules_and_rule_show_each_rules_group(td: CLI) -> None:
    listing = td("rules")
    line = next(ln for ln in listing.out.splitlines() if ln.startswith("TD108"))
    assert "advice" in line and "(off by default)" in line
    assert "bugs" in next(ln for ln in listing.out.splitlines() if ln.startswith("TD402"))
    rows = {r["code"]: r for r in json.loads(td("rules", "--format", "json").out)}
    assert rows["TD108"]["group"] == "advice" and not rows["TD108"]["default_enabled"]
    assert rows["TD402"]["group"] == "bugs" and rows["TD402"]["default_enabled"]
    assert "Group: advice." in td("rule", "TD108").out
