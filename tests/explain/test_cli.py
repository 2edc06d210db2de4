"""`torchdoctor explain`."""

from __future__ import annotations

import io
import json

import pytest

from torchdoctor.cli import main

MESSAGE = (
    "RuntimeError: Expected all tensors to be on the same device, but got mat1 is on cpu, "
    "different from other tensors on cuda:0 (when checking argument in method wrapper_CUDA_addmm)"
)


def test_explain_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", MESSAGE]) == 0
    out = capsys.readouterr().out
    assert out.startswith("torchdoctor: TD112 · device")
    assert "argument: mat1" in out and "op: addmm" in out


def test_explain_unquoted_words_are_joined(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "Torch", "not", "compiled", "with", "CUDA", "enabled"]) == 0
    assert "TD101" in capsys.readouterr().out


def test_explain_traceback_from_stdin_as_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    traceback_text = (
        "Traceback (most recent call last):\n"
        '  File "/work/eval.py", line 9, in <module>\n'
        "    preds = model(x).numpy()\n"
        "TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to "
        "copy the tensor to host memory first.\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(traceback_text))
    assert main(["explain", "-", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["id"] == "numpy-on-device"
    assert data["code"] == "TD106"
    assert data["frame"]["lineno"] == 9
    assert data["causes"][0]["codes"] == ["TD106"]


def test_unknown_message_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "something odd happened"]) == 1
    assert "not in the knowledge base" in capsys.readouterr().out


def test_empty_stdin_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n"))
    assert main(["explain", "-"]) == 2
    assert capsys.readouterr().err.startswith("torchdoctor: error: no error text given")
