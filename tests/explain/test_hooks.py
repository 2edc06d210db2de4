"""td.diagnose, td.install and the IPython extension."""

from __future__ import annotations

import io
import sys
import time
import types
from typing import Any, ClassVar

import pytest
import torch

import torchdoctor as td
from torchdoctor.explain import hooks


def test_diagnose_explains_and_reraises_unchanged() -> None:
    out = io.StringIO()
    original = None
    with pytest.raises(RuntimeError) as caught, td.diagnose(file=out) as diagnosis:
        try:
            torch.zeros(2, requires_grad=True).add_(1)
        except RuntimeError as exc:
            original = exc
            raise
    assert caught.value is original
    assert diagnosis.explanation is not None and diagnosis.explanation.id == "leaf-inplace"
    assert "TD213" in out.getvalue()


def test_diagnose_is_silent_on_success_and_on_non_torch_errors() -> None:
    out = io.StringIO()
    with td.diagnose(file=out):
        torch.ones(2).sum()
    with pytest.raises(KeyError), td.diagnose(file=out):
        {}["missing"]
    assert out.getvalue() == ""


def test_diagnose_timing_uses_the_monotonic_clock_without_cuda() -> None:
    out = io.StringIO()
    with td.diagnose(timing=True, file=out) as diagnosis:
        time.sleep(0.02)
    assert diagnosis.clock == "perf_counter"
    assert diagnosis.elapsed is not None and 0.015 < diagnosis.elapsed < 2
    assert "block took" in out.getvalue()


class _FakeEvent:
    log: ClassVar[list[str]] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.recorded = False

    def record(self) -> None:
        self.recorded = True
        _FakeEvent.log.append("record")

    def synchronize(self) -> None:
        assert self.recorded
        _FakeEvent.log.append("event.synchronize")

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert end.recorded
        return 250.0  # milliseconds, as CUDA reports them


def test_diagnose_timing_uses_cuda_events_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeEvent.log = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        synchronize=lambda: _FakeEvent.log.append("cuda.synchronize"),
        Event=_FakeEvent,
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    out = io.StringIO()
    with hooks.diagnose(timing=True, file=out) as diagnosis:
        _FakeEvent.log.append("block")
    assert diagnosis.clock == "cuda events"
    assert diagnosis.elapsed == pytest.approx(0.25)
    # queued work is flushed before the start event; the end event is waited for
    assert _FakeEvent.log == [
        "cuda.synchronize",
        "record",
        "block",
        "record",
        "event.synchronize",
    ]


def test_install_prints_traceback_then_explanation(capsys: pytest.CaptureFixture[str]) -> None:
    previous = sys.excepthook
    td.install()
    try:
        assert sys.excepthook is not previous
        td.install()  # idempotent
        try:
            torch.zeros(2, requires_grad=True).numpy()
        except RuntimeError as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        hooks.uninstall()
    assert sys.excepthook is previous
    err = capsys.readouterr().err
    assert err.index("Traceback") < err.index("Can't call numpy()") < err.index("TD106")


def test_ipython_extension_explains_cell_errors(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell: Any = InteractiveShell.instance()
    try:
        shell.extension_manager.load_extension("torchdoctor")
        result = shell.run_cell("import torch\ntorch.zeros(2, requires_grad=True).numpy()")
        assert not result.success
        output = capsys.readouterr().out
        assert "Can't call numpy()" in output
        assert "TD106" in output
        shell.run_cell("1 + 1")
    finally:
        hooks.unload_ipython_extension(shell)
        InteractiveShell.clear_instance()
