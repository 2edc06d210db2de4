"""`torchdoctor run --simulate cuda [--devices N] [--keep-going] [--strict-load] script.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchdoctor.cli import main

SCRIPTS = Path(__file__).resolve().parent.parent / "simulate"


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", "--no-guard", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_device_bug_fails_with_pytorchs_message_and_a_diagnosis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = SCRIPTS / "bugs" / "labels_not_moved.py"
    code, _, err = run(capsys, "--simulate", "cuda", str(script))
    assert code == 1
    assert "but got target is on cpu, different from other tensors on cuda:0" in err
    assert err.startswith("Traceback (most recent call last):")
    assert "\nRuntimeError: Expected all tensors" in err  # PyTorch's type, not ours
    assert "torchdoctor/" not in err.split("RuntimeError:")[0]  # no frame of ours shown
    # one diagnosis (the explanation's), not the simulator's note plus a second opinion
    assert "torchdoctor simulate [" not in err
    assert err.count("torchdoctor: TD112") == 1 and "Where: " in err
    assert "labels_not_moved.py:14" in err and "loss = criterion(outputs, labels)" in err
    assert "local `labels`: cpu" in err


def test_keep_going_finishes_the_program_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    script = SCRIPTS / "bugs" / "eval_batch_on_cpu.py"
    code, out, err = run(capsys, "--simulate", "cuda", "--keep-going", str(script))
    assert code == 1
    assert out.startswith("accuracy")
    assert "1 distinct device error(s) (2 occurrence(s))" in err


def test_devices_and_strict_load(capsys: pytest.CaptureFixture[str]) -> None:
    two = SCRIPTS / "bugs" / "two_gpus.py"
    code, _, err = run(capsys, "--simulate", "cuda", "--devices", "2", str(two))
    assert code == 1 and "different from other tensors on cuda:1" in err
    load = SCRIPTS / "bugs" / "checkpoint_no_map_location.py"
    assert run(capsys, "--simulate", "cuda", str(load))[0] == 0  # a GPU machine loads it
    code, _, err = run(capsys, "--simulate", "cuda", "--strict-load", str(load))
    assert code == 1 and "torch.cuda.is_available() is False" in err and "[TD402]" in err


def test_a_correct_script_prints_what_a_cpu_run_prints(capsys: pytest.CaptureFixture[str]) -> None:
    script = SCRIPTS / "correct" / "optimizer_state.py"
    plain = run(capsys, str(script))
    simulated = run(capsys, "--simulate", "cuda", str(script))
    assert plain[0] == simulated[0] == 0
    assert simulated[1] == plain[1] and "resumed" in plain[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--devices", "2", "x.py"], "--devices needs --simulate"),
        (["--keep-going", "x.py"], "--keep-going needs --simulate"),
        (["--simulate", "cuda", "--devices", "0", "x.py"], "--devices must be at least 1"),
    ],
)
def test_bad_options(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and f"torchdoctor: error: {message}" in err


def test_unknown_backend_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--simulate", "xpu", "x.py"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
