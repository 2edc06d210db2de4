"""Run a script or module like `python` would, with the explainer and the guard installed.

`run_script(path, argv)` / `run_module(name, argv)` give the program the same
`sys.argv`, `__main__`, `sys.path[0]` and exit code as `python path ...` /
`python -m name ...`. An uncaught exception prints the normal traceback and
then the explanation. Extra behaviour (a simulated device, ...) is passed as
context managers in `contexts`, entered in order around the program.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any, TextIO

from torchdoctor.errors import UsageError
from torchdoctor.explain.frames import hide_own_frames, is_library_file
from torchdoctor.explain.hooks import report

EXIT_INTERRUPTED = 130


def _exit_code(exc: SystemExit, stderr: TextIO) -> int:
    """What `python` exits with for `raise SystemExit(code)`."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stderr)
    return 1


def _print_traceback(exc: BaseException, stderr: TextIO) -> None:
    """The traceback `python` would print: starting at the program's own frames, without
    torchdoctor's, and without the simulator's note (the explanation that follows holds it)."""
    hide_own_frames(exc)
    tb = exc.__traceback__
    while (
        tb is not None
        and tb.tb_next is not None
        and is_library_file(tb.tb_frame.f_code.co_filename)
    ):
        tb = tb.tb_next
    notes = getattr(exc, "__notes__", None)
    diagnosis = getattr(exc, "diagnosis", None)
    if isinstance(notes, list) and diagnosis is not None:
        shown = [note for note in notes if not note.startswith("torchdoctor simulate [")]
        exc.__notes__ = shown  # type: ignore[attr-defined]
        try:
            traceback.print_exception(type(exc), exc, tb, file=stderr)
        finally:
            exc.__notes__ = notes  # type: ignore[attr-defined]
        return
    traceback.print_exception(type(exc), exc, tb, file=stderr)


def _execute(
    target: Callable[[], Any],
    *,
    contexts: Sequence[AbstractContextManager[Any]],
    guard: bool,
    guard_steps: int | None,
    stderr: TextIO | None,
) -> int:
    err = stderr if stderr is not None else sys.stderr
    with ExitStack() as stack:
        if guard:
            try:
                from torchdoctor.runtime.guard import DEFAULT_STEPS
                from torchdoctor.runtime.guard import guard as make_guard
            except ImportError:  # no torch: the explainer still works
                pass
            else:
                handle = make_guard(None, steps=guard_steps or DEFAULT_STEPS)
                stack.callback(handle.remove)
        try:
            for context in contexts:
                stack.enter_context(context)
            target()
        except SystemExit as exc:
            return _exit_code(exc, err)
        except KeyboardInterrupt:
            _print_traceback(KeyboardInterrupt(), err)
            return EXIT_INTERRUPTED
        except BaseException as exc:
            _print_traceback(exc, err)
            try:
                report(exc, file=err)
            except Exception as error:
                print(f"torchdoctor: could not explain this error ({error})", file=err)
            return 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
    return 0


class _ProgramState:
    """Saves and restores sys.argv and sys.path[0] around the program."""

    def __init__(self, argv: list[str], path0: str) -> None:
        self.argv = argv
        self.path0 = path0

    def __enter__(self) -> None:
        self.saved_argv = sys.argv[:]
        self.saved_path = sys.path[:]
        sys.argv[:] = self.argv
        sys.path.insert(0, self.path0)

    def __exit__(self, *exc: object) -> None:
        sys.argv[:] = self.saved_argv
        sys.path[:] = self.saved_path


def run_script(
    path: str,
    argv: Sequence[str] = (),
    *,
    contexts: Sequence[AbstractContextManager[Any]] = (),
    guard: bool = True,
    guard_steps: int | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run `path` as `__main__` with arguments `argv`; return the exit code python would."""
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "__main__.py")):
            raise UsageError(f"can't find '__main__' module in {path!r}")
    elif not os.path.isfile(path):
        raise UsageError(f"can't open file {path!r}: no such file")
    directory = os.path.dirname(os.path.abspath(path)) if not os.path.isdir(path) else path

    def target() -> None:
        with _ProgramState([path, *argv], directory):
            runpy.run_path(path, run_name="__main__")

    return _execute(target, contexts=contexts, guard=guard, guard_steps=guard_steps, stderr=stderr)


def run_module(
    name: str,
    argv: Sequence[str] = (),
    *,
    contexts: Sequence[AbstractContextManager[Any]] = (),
    guard: bool = True,
    guard_steps: int | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run module `name` like `python -m name argv...`; return the exit code python would."""
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"no module named {name!r} ({exc})") from exc
    finally:
        sys.path.pop(0)
    if spec is None:
        raise UsageError(f"no module named {name!r}")

    def target() -> None:
        # python -m puts the current directory first on sys.path; runpy sets argv[0].
        with _ProgramState([name, *argv], os.getcwd()):
            runpy.run_module(name, run_name="__main__", alter_sys=True)

    return _execute(target, contexts=contexts, guard=guard, guard_steps=guard_steps, stderr=stderr)
