"""One diagnosis everywhere: every runtime bug class gets the same code and culprit from the
simulator, `td.explain`, the guard, `td.diagnose` and `torchdoctor run --simulate`.

Each script in tests/simulate/bugs/ marks its failing line with
`# expect: TD112 culprit=y` (`culprit=-`: no tensor to name; a name ending in `.` is a
prefix, for a parameter of a module). The simulator's exception carries the
diagnosis made from the refused op's exact operands; `diagnose_exception` on a copy
without it reads the same from the message and the traceback's frames, as it does
for errors from a real GPU.
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import torchdoctor as td
from torchdoctor.cli import main
from torchdoctor.runtime.diagnosis import diagnose_exception

BUGS = Path(__file__).resolve().parent.parent / "simulate" / "bugs"
SCRIPTS = sorted(BUGS.glob("*.py"))


def expectation(script: Path) -> tuple[str, str | None, dict[str, Any]]:
    source = script.read_text()
    found = re.search(r"# expect: (TD\d+) culprit=(\S+)", source)
    assert found, f"{script.name} has no `# expect: TDxxx culprit=...` marker"
    options: dict[str, Any] = {}
    header = re.search(r"^# simulate with: (.*)$", source, re.MULTILINE)
    if header:
        for item in header.group(1).split(","):
            key, value = item.strip().split("=")
            options[key] = int(value) if value.isdigit() else value == "True"
    culprit = None if found.group(2) == "-" else found.group(2)
    return found.group(1), culprit, options


def matches(names: list[str], expected: str | None) -> bool:
    if expected is None:
        return not names
    if expected.endswith("."):
        return bool(names) and all(name.startswith(expected) for name in names)
    return names == [expected]


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with contextlib.redirect_stdout(io.StringIO()):
        yield
    torch.set_num_threads(before)


def _run(script: Path, options: dict[str, Any], *wrappers: Any) -> BaseException:
    """Run the script simulated inside `wrappers`; return what it raised."""
    argv = sys.argv[:]
    sys.argv[:] = [str(script)]
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(td.simulate("cuda", **options))
            for wrapper in wrappers:
                stack.enter_context(wrapper)
            runpy.run_path(str(script), run_name="__main__")
    except Exception as error:
        return error
    finally:
        sys.argv[:] = argv
    raise AssertionError(f"{script.name} ran without the error it should raise")


def _from_simulator(script: Path, options: dict[str, Any]) -> tuple[str, list[str]]:
    diagnosis = _run(script, options).diagnosis  # type: ignore[attr-defined]
    return diagnosis.code, [c.name for c in diagnosis.culprits]


def _from_frames(script: Path, options: dict[str, Any]) -> tuple[str, list[str]]:
    """The exception without the simulator's diagnosis, as a real GPU would raise it."""
    error = _run(script, options)
    del error.diagnosis  # type: ignore[attr-defined]
    diagnosis = diagnose_exception(error)
    if diagnosis is None:  # not a device message (a checkpoint): only the simulator knows
        return "", []
    return diagnosis.code, [c.name for c in diagnosis.culprits]


def _from_explain(script: Path, options: dict[str, Any]) -> tuple[str, list[str]]:
    explanation = td.explain(_run(script, options))
    return explanation.code or "", [c.name for c in explanation.culprits]


def _from_guard(script: Path, options: dict[str, Any]) -> tuple[str, list[str]]:
    error = _run(script, options, td.guard())
    explanation = error.explanation  # type: ignore[attr-defined]
    return explanation.code or "", [c.name for c in explanation.culprits]


def _from_diagnose(script: Path, options: dict[str, Any]) -> tuple[str, list[str]]:
    report = io.StringIO()
    block = td.diagnose(file=report)
    _run(script, options, block)
    text = report.getvalue()
    return _parse_report(text)


def _from_run(script: Path, options: dict[str, Any]) -> tuple[str, list[str]]:
    argv = ["run", "--no-guard", "--simulate", "cuda"]
    if "devices" in options:
        argv += ["--devices", str(options["devices"])]
    if options.get("strict_load"):
        argv.append("--strict-load")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([*argv, str(script)]) == 1
    text = err.getvalue()
    assert "torchdoctor simulate [" not in text  # one diagnosis, not two
    return _parse_report(text)


def _parse_report(text: str) -> tuple[str, list[str]]:
    headline = re.search(r"^torchdoctor: (TD\d+)", text, re.MULTILINE)
    block = text.split("\nCulprit", 1)[1].split("\n\n", 1)[0] if "\nCulprit" in text else ""
    names = re.findall(r"^  - \w+ `([^`]+)`", block, re.MULTILINE)
    return (headline.group(1) if headline else ""), names


ENTRY_POINTS = {
    "simulator": _from_simulator,
    "frames": _from_frames,
    "explain": _from_explain,
    "guard": _from_guard,
    "diagnose": _from_diagnose,
    "run": _from_run,
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_same_code_and_culprit_in_every_entry_point(script: Path, entry: str) -> None:
    code, culprit, options = expectation(script)
    if entry == "frames" and code == "TD402":
        pytest.skip("a checkpoint's device is in the file, not in any frame")
    got_code, names = ENTRY_POINTS[entry](script, options)
    assert got_code == code, (entry, names)
    assert matches(names, culprit), (entry, names)


def test_labels_left_on_the_cpu_get_one_diagnosis_naming_y_and_the_line_that_made_it() -> None:
    """The issue's script: the explanation names `y` and its torch.randint line, once."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["run", "--simulate", "cuda", str(BUGS / "labels_in_main.py")]) == 1
    text = err.getvalue()
    assert text.count("torchdoctor: TD") == 1 and "torchdoctor: TD112" in text
    assert "TD103" not in text.split("Likely causes")[0]  # y was made in main(), not forward
    culprits = text.split("\nCulprit:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(culprits) == 1
    assert culprits[0].startswith("  - local `y`: cpu, int64")
    assert "created at" in culprits[0] and "labels_in_main.py:12" in culprits[0]


def test_an_unmoved_batch_is_blamed_where_the_loop_binds_it() -> None:
    error = _run(BUGS / "eval_batch_on_cpu.py", {})
    [culprit] = error.diagnosis.culprits  # type: ignore[attr-defined]
    assert culprit.bound_at == "tests/simulate/bugs/eval_batch_on_cpu.py:23" or (
        culprit.bound_at is not None and culprit.bound_at.endswith("eval_batch_on_cpu.py:23")
    )
    assert "where it is bound at" in error.diagnosis.hint  # type: ignore[attr-defined]
