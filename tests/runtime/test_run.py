"""`torchdoctor run`: like python (argv, __main__, exit codes), plus explanations and the guard."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.errors import UsageError
from torchdoctor.runtime.guard import active_guards
from torchdoctor.runtime.run import run_module, run_script


def _script(tmp_path: Path, body: str, name: str = "prog.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_argv_main_and_sys_path_like_python(tmp_path: Path) -> None:
    out = tmp_path / "seen.txt"
    path = _script(
        tmp_path,
        f"""
        import sys
        from torchdoctor.runtime.guard import active_guards
        with open({str(out)!r}, "w") as f:
            f.write(repr((sys.argv, __name__, sys.path[0], len(active_guards()))))
        """,
    )
    argv_before = sys.argv[:]
    assert run_script(str(path), ["--lr", "0.1"]) == 0
    seen = eval(out.read_text())
    assert seen == ([str(path), "--lr", "0.1"], "__main__", str(tmp_path), 1)
    assert sys.argv == argv_before
    assert active_guards() == []


@pytest.mark.parametrize(
    ("statement", "code"),
    [
        ("pass", 0),
        ("raise SystemExit(3)", 3),
        ("raise SystemExit('bye')", 1),
        ("raise SystemExit(None)", 0),
        ("raise KeyboardInterrupt", 130),
    ],
)
def test_exit_codes(tmp_path: Path, statement: str, code: int) -> None:
    err = io.StringIO()
    assert run_script(str(_script(tmp_path, statement)), stderr=err, guard=False) == code
    if code == 1:
        assert "bye" in err.getvalue()


def test_uncaught_error_prints_traceback_then_explanation(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        """
        import torch
        from torch import nn

        model = nn.Linear(3, 2).to("meta")
        model(torch.zeros(4, 3))
        """,
    )
    err = io.StringIO()
    assert run_script(str(path), stderr=err) == 1
    text = err.getvalue()
    assert text.startswith("Traceback (most recent call last):")
    assert f'File "{path}", line 6, in <module>' in text
    assert "torchdoctor/runtime/run.py" not in text
    assert text.index("not on the expected device") < text.index("torchdoctor: TD112")
    assert "input `input`: cpu" in text


def test_nan_finder_traceback_hides_torchdoctor_frames(tmp_path: Path) -> None:
    # The NaN finder raises from its own forward wrapper: like the simulator's errors,
    # the traceback shows the program's frames (and torch's), not torchdoctor's.
    path = _script(
        tmp_path,
        """
        import torch
        from torch import nn

        class Head(nn.Module):
            def forward(self, x):
                return (x - x).log()

        model = nn.Sequential(nn.Linear(3, 2), Head())
        model(torch.ones(4, 3)).sum().backward()
        """,
    )
    err = io.StringIO()
    from torchdoctor.runtime.nonfinite import watching

    assert run_script(str(path), stderr=err, contexts=[watching()]) == 1
    text = err.getvalue()
    traceback_part = text[: text.index("NonFiniteError: TD217")]
    assert f'File "{path}", line 10, in <module>' in traceback_part
    assert "torchdoctor" + "/" not in traceback_part.replace("\\", "/")


def test_guard_checks_models_created_in_the_script(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        """
        import torch
        from torch import nn

        model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5))
        with torch.no_grad():
            model(torch.zeros(2, 3))  # evaluation without model.eval()
        """,
    )
    with pytest.warns(UserWarning, match="TD211 `Dropout`"):
        assert run_script(str(path)) == 0


def test_contexts_wrap_the_program(tmp_path: Path) -> None:
    events: list[str] = []

    @contextmanager
    def recorder(name: str) -> Any:
        events.append(f"enter {name}")
        yield
        events.append(f"exit {name}")

    path = _script(tmp_path, "raise SystemExit(4)")
    code = run_script(str(path), contexts=[recorder("a"), recorder("b")], guard=False)
    assert code == 4
    assert events == ["enter a", "enter b", "exit b", "exit a"]


def test_run_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "seen.txt"
    _script(
        tmp_path,
        f"""
        import sys
        open({str(out)!r}, "w").write(repr((sys.argv[1:], __name__)))
        raise SystemExit(5)
        """,
        name="mymod.py",
    )
    monkeypatch.chdir(tmp_path)
    assert run_module("mymod", ["x"], guard=False) == 5
    assert eval(out.read_text()) == (["x"], "__main__")
    with pytest.raises(UsageError):
        run_module("no_such_module_here", [])


def test_missing_script_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="can't open file"):
        run_script(str(tmp_path / "nope.py"))


def test_cli_end_to_end(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        """
        import sys
        import torch
        print("args", sys.argv[1:])
        torch.zeros(2, requires_grad=True).numpy()
        """,
    )
    done = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "run", str(path), "--flag", "v"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "args ['--flag', 'v']" in done.stdout
    assert "Can't call numpy()" in done.stderr and "TD106" in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "run", str(tmp_path / "nope.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert missing.returncode == 2
    assert missing.stderr.startswith("torchdoctor: error: can't open file")


def test_module_arguments_go_to_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchdoctor.cli import main

    package = tmp_path / "mypackage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", list(sys.argv))
        assert main(["run", "--no-guard", "-m", "mypackage.train", "--epochs", "3"]) == 0
    assert "args ['--epochs', '3']" in capsys.readouterr().out
    assert main(["run", "-m"]) == 2
    assert "-m needs a module name" in capsys.readouterr().err
