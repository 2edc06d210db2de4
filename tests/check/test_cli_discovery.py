"""Which files `torchdoctor check` looks at: folders, excludes, .gitignore, stdin."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.check.conftest import CLI, LOAD, run_child, write
from torchdoctor.check.config import Settings
from torchdoctor.check.discovery import discover


def checked(td: CLI, *args: str) -> set[str]:
    """The files with a TD402 finding after `torchdoctor check --select TD402 ARGS`."""
    run = td("check", "--select", "TD402", "--no-cache", "--format", "json", *args)
    assert run.code in (0, 1), run.err
    return {Path(item["filename"]).as_posix() for item in json.loads(run.out)}


def test_walks_py_pyi_and_notebooks_and_skips_default_folders(td: CLI, project: Path) -> None:
    write(project / "pkg" / "a.py", LOAD)
    write(project / "pkg" / "b.pyi", LOAD)
    write(project / "pkg" / "notes.txt", LOAD)
    for skipped in (".venv", "venv", "build", "dist", "__pycache__", "node_modules", ".git"):
        write(project / skipped / "c.py", LOAD)
    assert checked(td, ".") == {"pkg/a.py", "pkg/b.pyi"}


def test_exclude_replaces_defaults_and_extend_exclude_adds(td: CLI, project: Path) -> None:
    write(project / "src" / "keep.py", LOAD)
    write(project / "src" / "gen_pb2.py", LOAD)
    write(project / "build" / "out.py", LOAD)
    write(project / "tests" / "data" / "x.py", LOAD)
    assert checked(td, ".") == {"src/keep.py", "src/gen_pb2.py", "tests/data/x.py"}
    assert checked(td, ".", "--extend-exclude", "*_pb2.py,tests/data") == {"src/keep.py"}
    # --exclude replaces the defaults: build/ is checked again
    assert checked(td, ".", "--exclude", "*_pb2.py") == {
        "src/keep.py",
        "build/out.py",
        "tests/data/x.py",
    }


def test_excludes_from_config_are_relative_to_the_config_folder(td: CLI, project: Path) -> None:
    write(project / "pyproject.toml", '[tool.torchdoctor]\nextend-exclude = ["legacy/old"]\n')
    write(project / "legacy" / "old" / "a.py", LOAD)
    write(project / "legacy" / "new.py", LOAD)
    assert checked(td, "legacy") == {"legacy/new.py"}


def test_named_file_is_checked_even_if_excluded_unless_force_exclude(
    td: CLI, project: Path
) -> None:
    write(project / "pyproject.toml", '[tool.torchdoctor]\nextend-exclude = ["vendored"]\n')
    write(project / "vendored" / "lib.py", LOAD)
    write(project / "main.py", LOAD)
    assert checked(td, "vendored/lib.py", "main.py") == {"vendored/lib.py", "main.py"}
    assert checked(td, "--force-exclude", "vendored/lib.py", "main.py") == {"main.py"}


def test_force_exclude_from_config(td: CLI, project: Path) -> None:
    write(
        project / "pyproject.toml",
        '[tool.torchdoctor]\nextend-exclude = ["gen_*.py"]\nforce-exclude = true\n',
    )
    write(project / "gen_a.py", LOAD)
    assert checked(td, "gen_a.py") == set()


def test_named_folder_inside_an_excluded_one_is_walked(td: CLI, project: Path) -> None:
    write(project / ".venv" / "lib" / "site" / "pkg" / "a.py", LOAD)
    assert checked(td, ".") == set()
    assert checked(td, ".venv/lib/site/pkg") == {".venv/lib/site/pkg/a.py"}


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


@needs_git
def test_gitignore_rules_agree_with_git_check_ignore(td: CLI, project: Path) -> None:
    git("init", "-q", cwd=project)
    write(project / ".gitignore", "generated/\n*_tmp.py\n/top_only.py\n!keep_tmp.py\n")
    write(project / "sub" / ".gitignore", "local.py\n!reinclude_tmp.py\n")
    write(project / ".git" / "info" / "exclude", "private.py\n")
    files = [
        "a.py",
        "generated/g.py",
        "x_tmp.py",
        "keep_tmp.py",
        "top_only.py",
        "sub/top_only.py",
        "sub/local.py",
        "sub/reinclude_tmp.py",
        "sub/deeper/local.py",
        "private.py",
    ]
    for name in files:
        write(project / name, LOAD)
    ignored_by_git = set(git("check-ignore", "--no-index", *files, cwd=project).stdout.split())
    assert ignored_by_git == {
        "generated/g.py",
        "x_tmp.py",
        "top_only.py",
        "sub/local.py",
        "sub/deeper/local.py",
        "private.py",
    }
    assert checked(td, ".") == set(files) - ignored_by_git
    # from inside a subfolder, the root .gitignore still applies
    assert checked(td, "sub") == {"sub/top_only.py", "sub/reinclude_tmp.py"}
    assert checked(td, ".", "--no-respect-gitignore") == set(files)


@needs_git
def test_gitignore_from_config_and_named_files(td: CLI, project: Path) -> None:
    git("init", "-q", cwd=project)
    write(project / ".gitignore", "scratch/\n")
    write(project / "scratch" / "s.py", LOAD)
    write(project / "pyproject.toml", "[tool.torchdoctor]\nrespect-gitignore = false\n")
    assert checked(td, ".") == {"scratch/s.py"}
    (project / "pyproject.toml").unlink()
    assert checked(td, ".") == set()
    # a file named on the command line is checked; --force-exclude skips it as git does
    assert checked(td, "scratch/s.py") == {"scratch/s.py"}
    assert checked(td, "--force-exclude", "scratch/s.py") == set()


def test_gitignore_is_not_read_outside_a_git_work_tree(project: Path) -> None:
    write(project / ".gitignore", "*.py\n")
    write(project / "a.py", LOAD)
    assert list(discover([Path(".")], Settings(root=project))) == [Path("a.py")]


def test_stdin_with_and_without_a_filename(project: Path) -> None:
    write(
        project / "pyproject.toml",
        '[tool.torchdoctor]\nper-file-ignores = {"tests/*" = ["TD402"]}\n',
    )
    code = LOAD.encode()
    run = run_child(
        "check", "--select", "TD402", "-", "--format", "concise", cwd=project, stdin=code
    )
    assert run.returncode == 1, run.stderr
    assert run.stdout.startswith("-:2:9: TD402 ")
    named = run_child(
        "check", "--select", "TD402", "-", "--stdin-filename", "src/train.py",
        "--format", "concise", cwd=project, stdin=code,
    )  # fmt: skip
    assert named.stdout.startswith("src/train.py:2:9: TD402 ")
    # the stdin file name decides per-file-ignores, and `-` may be left out
    ignored = run_child(
        "check", "--select", "TD402", "--stdin-filename", "tests/test_x.py",
        cwd=project, stdin=code,
    )  # fmt: skip
    assert ignored.returncode == 0, ignored.stdout
    assert not list(project.glob(".torchdoctor_cache"))  # stdin is never cached


def test_stdin_cannot_be_mixed_with_paths_and_missing_paths_are_errors(
    td: CLI, project: Path
) -> None:
    write(project / "a.py", LOAD)
    run = td("check", "-", "a.py")
    assert run.code == 2 and "standard input" in run.err
    run = td("check", "missing.py")
    assert run.code == 2
    assert run.err.strip() == "torchdoctor: error: missing.py: no such file or folder"


def test_file_names_are_judged_inside_the_project(
    td: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project that lives under a folder named `benchmarks` or `gpu` is not a benchmark
    or GPU-only file (TD101 judges the path inside the project root); a `benchmarks/`
    folder inside the project still is."""
    root = tmp_path / "benchmarks" / "gpu-work" / "proj"
    # (each file also asks for a GPU, so a hard-wired one is a bug there: TD101, not TD115)
    text = "import torch\nx = torch.zeros(2).cuda()\ngpu = torch.cuda.is_available()\n"
    write(root / "train.py", text)
    write(root / "benchmarks" / "speed.py", text)
    monkeypatch.chdir(root)
    run = td("check", "--isolated", "--select", "TD101", "--no-cache", "--format", "json", root)
    found = {Path(item["filename"]).name for item in json.loads(run.out)}
    assert found == {"train.py"}


def test_paths_are_judged_inside_the_checked_folder_not_above_it(
    td: CLI, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a project kept under a folder named "benchmarks": checked from outside, its files
    # are judged by their place in the project (benchmark files may hard-wire CUDA)
    code = (
        "import torch\n\n"
        "def f(x):\n"
        "    if torch.cuda.is_available():\n"
        "        print('gpu')\n"
        "    return x.to('cuda')\n"
    )
    folder = project / "benchmarks" / "proj"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(code, encoding="utf-8")
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    outside = td("check", "--isolated", "--no-cache", "--select", "TD101", str(folder))
    assert "TD101" in outside.out
    monkeypatch.chdir(project)  # from the parent, the file is one of its benchmarks
    inside = td("check", "--isolated", "--no-cache", "--select", "TD101", "benchmarks/proj")
    assert "TD101" not in inside.out
