"""Real torch.load refusals, made here with the installed torch, explained as their text says."""

from __future__ import annotations

import argparse
import os
import traceback
from pathlib import Path

import torch
from torch import nn

from torchdoctor.explain.explainer import explain


class _RunsShell:
    """Pickles as a call to os.system: what a malicious checkpoint does."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("true",))


def _traceback_of_load(path: Path) -> str:
    try:
        torch.load(path)
    except Exception:
        return traceback.format_exc()
    raise AssertionError("torch.load accepted the file")


def test_refused_namespace_is_headlined_td403_with_the_user_frame(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(2), "args": argparse.Namespace(lr=0.1)}, path)
    text = _traceback_of_load(path)
    assert "\x1b[" in text  # torch 2.13 colours part of its message
    explanation = explain(text)
    assert explanation.code == "TD403"
    assert explanation.facts["global_name"] == "argparse.Namespace"
    assert "\x1b" not in str(explanation)
    assert explanation.frame is not None
    assert explanation.frame.filename == __file__
    assert "torch.load(path)" in explanation.frame.source


def test_refused_module_class_is_td401(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(nn.Linear(2, 2), path)
    explanation = explain(_traceback_of_load(path))
    assert explanation.code == "TD401"


def test_blocked_os_system_is_called_malicious_and_never_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"x": _RunsShell()}, path)
    explanation = explain(_traceback_of_load(path))
    assert explanation.code == "TD403"
    assert explanation.facts["global_name"] in ("posix.system", "nt.system")
    assert "malicious" in explanation.cause
    assert "corrupt" not in str(explanation).lower()


def test_only_torch_frames_give_no_where() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/home/u/pytorch/torch/serialization.py", line 1609, in load\n'
        "    raise pickle.UnpicklingError(_get_wo_message(str(e))) from None\n"
        "_pickle.UnpicklingError: Weights only load failed. WeightsUnpickler error: "
        "Unsupported global: GLOBAL argparse.Namespace was not an allowed global by default."
    )
    explanation = explain(text)
    assert explanation.code == "TD403"
    assert explanation.frame is None


def test_weights_only_false_is_never_suggested_without_its_risk() -> None:
    from torchdoctor.explain import kb

    for entry in kb.entries():
        for fix in entry.fixes:
            if "weights_only=False" in fix.text + fix.code:
                assert "code" in fix.text.lower() and "trust" in fix.text.lower(), entry.id
