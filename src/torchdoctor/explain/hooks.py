"""Explain errors where they happen: `td.diagnose()`, `td.install()`, `%load_ext torchdoctor`.

None of these import torch: an error raised by PyTorch means torch is already
loaded, and the timer only uses CUDA events when torch is.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO

from torchdoctor.explain.explainer import Explanation, explain

_TORCH_DIR = os.sep + "torch" + os.sep


def raised_by_torch(exc: BaseException) -> bool:
    """True when a frame of PyTorch itself is in the traceback (or torch named the type)."""
    if type(exc).__module__.startswith("torch"):
        return True
    return any(
        _TORCH_DIR in frame.f_code.co_filename for frame, _ in traceback.walk_tb(exc.__traceback__)
    )


def worth_explaining(exc: BaseException, explanation: Explanation) -> bool:
    """Known PyTorch errors, and unknown ones that PyTorch raised; never a plain NameError."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return False
    return explanation.known or raised_by_torch(exc)


def report(exc: BaseException, *, model: Any = None, file: TextIO | None = None) -> Explanation:
    """Explain `exc` and print the report (to stderr by default) if it is worth it."""
    explanation = explain(exc, model=model)
    if worth_explaining(exc, explanation):
        stream = file if file is not None else sys.stderr
        print(f"\n{explanation}", file=stream)
    return explanation


# --- td.diagnose --------------------------------------------------------------------------


@dataclass
class Diagnosis:
    """What a `with td.diagnose():` block measured and explained."""

    elapsed: float | None = None  # seconds, when timing=True
    clock: str = ""  # "cuda events" or "perf_counter"
    explanation: Explanation | None = None


class _Timer:
    """A block's elapsed time: CUDA events on CUDA (GPU work is asynchronous), else perf_counter."""

    def __init__(self, use_cuda: bool) -> None:
        self.torch: Any = sys.modules.get("torch") if use_cuda else None
        self.start_event: Any = None
        self.started = 0.0

    def start(self) -> None:
        if self.torch is not None:
            cuda = self.torch.cuda
            # Work queued before the block must not be counted in it.
            cuda.synchronize()
            self.start_event = cuda.Event(enable_timing=True)
            self.start_event.record()
        else:
            self.started = time.perf_counter()

    def stop(self) -> float:
        if self.torch is not None:
            end = self.torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()  # wait for the block's GPU work before reading the clock
            return float(self.start_event.elapsed_time(end)) / 1000.0
        return time.perf_counter() - self.started


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


@contextmanager
def diagnose(
    timing: bool = False, *, model: Any = None, file: TextIO | None = None
) -> Iterator[Diagnosis]:
    """Explain any exception raised inside the block, then re-raise it unchanged.

    With `timing=True` the block's elapsed time is measured and printed: with CUDA
    events when CUDA is in use (synchronising before and after), with a monotonic
    clock elsewhere. The yielded `Diagnosis` holds the time and the explanation.
    """
    result = Diagnosis()
    timer = _Timer(use_cuda=_cuda_in_use()) if timing else None
    if timer is not None:
        timer.start()
        result.clock = "cuda events" if timer.torch is not None else "perf_counter"
    try:
        yield result
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            result.explanation = report(exc, model=model, file=file)
        raise
    finally:
        if timer is not None:
            result.elapsed = timer.stop()
            stream = file if file is not None else sys.stderr
            print(
                f"torchdoctor: block took {result.elapsed * 1000:.3f} ms ({result.clock})",
                file=stream,
            )


# --- td.install: sys.excepthook -----------------------------------------------------------

_ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]
_previous_hook: _ExceptHook | None = None


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    (_previous_hook or sys.__excepthook__)(exc_type, exc, tb)
    try:
        report(exc)
    except Exception as error:
        print(f"torchdoctor: could not explain this error ({error})", file=sys.stderr)


def install() -> None:
    """Explain uncaught exceptions: the normal traceback is printed first, then the report."""
    global _previous_hook
    if sys.excepthook is _excepthook:
        return
    _previous_hook = sys.excepthook
    sys.excepthook = _excepthook


def uninstall() -> None:
    """Restore the excepthook that was there before `install()`."""
    global _previous_hook
    if sys.excepthook is _excepthook:
        sys.excepthook = _previous_hook or sys.__excepthook__
    _previous_hook = None


# --- %load_ext torchdoctor ----------------------------------------------------------------


def _ipython_handler(
    shell: Any, etype: type[BaseException], value: BaseException, tb: Any, tb_offset: Any = None
) -> list[str]:
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    explanation = explain(value)
    if worth_explaining(value, explanation):
        print(f"\n{explanation}")
    return []


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext torchdoctor`: after a cell's traceback, print the explanation."""
    ipython.set_custom_exc((Exception,), _ipython_handler)


def unload_ipython_extension(ipython: Any) -> None:
    ipython.set_custom_exc((), None)
