"""td.simulate on whole programs (tests/simulate/).

correct/: real training scripts print the same output under the simulation as in
a plain CPU run, while running on the virtual GPU. bugs/: each script runs fine
on the CPU, but under the simulation fails at the line marked `# expect: TDxxx`
with PyTorch's message and a diagnosis carrying that code.
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

HERE = Path(__file__).resolve().parent.parent / "simulate"
CORRECT = sorted((HERE / "correct").glob("*.py"))
BUGS = sorted((HERE / "bugs").glob("*.py"))


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """One intra-op thread: on a busy 2-core machine OpenMP threads only wait for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(path: Path, simulate: bool = False, **options: Any) -> tuple[str, dict[str, Any]]:
    """Run a script as __main__ in this process, maybe simulated; return (stdout, globals).

    The globals get `__moves__`: how many tensors the simulated run moved between devices.
    """
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if simulate:
            with td.simulate("cuda", **options) as sim:
                namespace = runpy.run_path(str(path), run_name="__main__")
            namespace["__moves__"] = sim.moves
        else:
            namespace = runpy.run_path(str(path), run_name="__main__")
    return out.getvalue(), namespace


def simulate_options(source: str) -> dict[str, Any]:
    """`# simulate with: devices=2, strict_load=True` at the top of a bug script."""
    match = re.search(r"^# simulate with: (.*)$", source, re.MULTILINE)
    options: dict[str, Any] = {}
    if match:
        for item in match.group(1).split(","):
            key, value = item.strip().split("=")
            options[key] = {"True": True, "False": False}.get(value, value)
            if value.isdigit():
                options[key] = int(value)
    return options


@pytest.mark.parametrize("script", CORRECT, ids=lambda p: p.stem)
def test_correct_script_output_is_identical_to_a_cpu_run(script: Path) -> None:
    plain, _ = run(script)
    simulated, namespace = run(script, simulate=True)
    assert plain.strip(), "the script printed nothing"
    assert simulated == plain
    assert namespace["__moves__"] > 0  # the simulated run really took the GPU branch
    model = namespace.get("model")
    if isinstance(model, torch.nn.Module):
        assert all(p.device.type == "cpu" for p in model.parameters())  # real CPU after exit


@pytest.mark.parametrize("script", BUGS, ids=lambda p: p.stem)
def test_bug_script_fails_at_the_marked_line(script: Path) -> None:
    source = script.read_text()
    lines = source.splitlines()
    line, code = next(
        (i + 1, text.split("# expect:")[1].split()[0])
        for i, text in enumerate(lines)
        if "# expect:" in text
    )
    run(script)  # fine on the CPU: the bug only shows on a GPU machine
    with pytest.raises((RuntimeError, TypeError)) as info:
        run(script, simulate=True, **simulate_options(source))
    diagnosis = info.value.diagnosis  # type: ignore[attr-defined]
    assert (Path(diagnosis.file).name, diagnosis.line) == (script.name, line)
    assert diagnosis.code == code
    assert diagnosis.source == lines[line - 1].strip()
    assert diagnosis.render() in "\n".join(getattr(info.value, "__notes__", []))


def test_keep_going_records_each_distinct_error_once() -> None:
    script = HERE / "bugs" / "eval_batch_on_cpu.py"
    report = io.StringIO()
    out = io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        td.simulate("cuda", keep_going=True, report=report) as sim,
    ):
        runpy.run_path(str(script), run_name="__main__")

    assert out.getvalue().startswith("accuracy")  # the program ran to its end
    assert [d.code for d in sim.errors] == ["TD112"]
    assert sim.records[sim.errors[0].key][1] == 2  # two validation batches, one error
    text = report.getvalue()
    assert text.count("this would fail on a CUDA machine") == 1
    assert "1 distinct device error(s) (2 occurrence(s))" in text
    assert "eval_batch_on_cpu.py:24" in text


def test_fixed_example_project_runs_identically(monkeypatch: pytest.MonkeyPatch) -> None:
    project = HERE.parent.parent / "examples" / "fixed"
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.chdir(project)
    # Its loaders fork 2 workers per epoch: seconds of start-up each. Loading in the main
    # process gives the same batches (workers are covered by dataloader_workers.py).
    real_init = torch.utils.data.DataLoader.__init__

    def in_process(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["num_workers"] = 0
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(torch.utils.data.DataLoader, "__init__", in_process)

    monkeypatch.delitem(sys.modules, "model", raising=False)
    try:
        plain, _ = run(project / "train.py")
        simulated, namespace = run(project / "train.py", simulate=True)
    finally:
        sys.modules.pop("model", None)
    assert "accuracy" in plain and simulated == plain
    assert namespace["__moves__"] > 0
