"""Check many files on several cores: one worker process per core, files in chunks.

`-j 1` (and any run too small to repay starting processes) checks in this
process. Workers receive the project index and run options once, at start-up,
and then (path, text, rule codes) per file; they return findings and the
fixed text. Files are written by the parent only.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from torchdoctor.check.analysis.module_paths import recording_siblings
from torchdoctor.check.engine import RunOptions, check_text, syntax_error_finding
from torchdoctor.check.parsed_trees import checks_first, freeze_kept
from torchdoctor.check.project import ProjectIndex
from torchdoctor.check.registry import rules_by_code
from torchdoctor.check.rule import Finding
from torchdoctor.check.torch_pins import TorchCeiling

# Fewer files than this per worker are checked in-process: a worker costs ~20-50 ms.
MIN_FILES_PER_WORKER = 8


@dataclass(frozen=True)
class Task:
    path: str
    text: str
    rule_codes: tuple[str, ...]
    torch_ceiling: TorchCeiling | None = None  # what the project's pins allow (torch_pins.py)


@dataclass
class Outcome:
    findings: list[Finding]
    text: str  # the text after fixes (== the input when nothing was fixed)
    fixed: int
    # other files the findings depend on (imported siblings the training-loop rules read)
    dependencies: tuple[str, ...] = ()


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


_project: ProjectIndex | None = None
_options: RunOptions | None = None


def tune_gc() -> None:
    """No automatic garbage collection while checking; `collect_young_garbage` after each
    file instead.

    Parsing and analysis allocate millions of objects that form no cycles (syntax trees,
    facts): reference counting frees them when the file's context closes, and the cyclic
    collector, run on its own timetable, only scans them again and again (2.4 s of a 45 s
    run on PyTorch's tree even with a 100,000-allocation threshold; measured: no garbage
    cycles left at the end of that run, the same peak RSS).
    """
    gc.disable()


def collect_young_garbage() -> None:
    """Free the cycles one file's check may have made (an exception's traceback, a
    closure): between files the youngest generation holds little besides them."""
    gc.collect(0)


# prctl(2) option: the signal this process gets when its parent thread dies.
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Make this (worker) process die when the process that started it dies.

    A worker blocked on the task queue never notices a parent killed with SIGKILL (the
    queue's pipe stays open: forked workers hold its write end too), so without this
    the workers of a killed run live on forever. Linux only; elsewhere the pool's
    shutdown on every exit path of `run_tasks` is what stops them.
    """
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _init_worker(project: ProjectIndex, options: RunOptions, parent_pid: int) -> None:
    global _project, _options
    die_with_parent(parent_pid)
    # Ctrl-C reaches the whole process group: the parent alone handles it (and stops us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler (commands.py)
    _project, _options = project, options
    tune_gc()


def check_task(task: Task, project: ProjectIndex, options: RunOptions) -> Outcome:
    """Check one file; an engine bug becomes a TD900 finding for that file only."""
    try:
        by_code = rules_by_code()
        rules = [by_code[code] for code in task.rule_codes if code in by_code]
        with recording_siblings() as siblings:
            findings, text, fixed = check_text(
                task.text, task.path, rules, project, options, task.torch_ceiling
            )
        collect_young_garbage()
        return Outcome(findings, text, fixed, tuple(sorted(siblings)))
    except Exception as exc:  # never lose the whole run to one file
        finding = syntax_error_finding(
            f"internal error while checking this file: {type(exc).__name__}: {exc}; "
            "please report this"
        )
        finding.code = "TD900"
        return Outcome([finding], task.text, 0)


def _check_in_worker(task: Task) -> Outcome:
    assert _project is not None and _options is not None
    return check_task(task, _project, _options)


def run_tasks(
    tasks: Sequence[Task], project: ProjectIndex, options: RunOptions, jobs: int
) -> list[Outcome]:
    """Outcomes in the order of `tasks`."""
    # What exists before the first check (the sources, the project index, the trees it
    # keeps for the checks: half a million objects on torch's tree) is kept out of the
    # young collections after each file, whose first one (in each forked worker too)
    # would scan all of it. Frozen objects are still freed by reference counting, and
    # the collector sees them again once the checks are done.
    gc.freeze()
    order = checks_first([task.path for task in tasks])
    freeze_kept(True)
    try:
        outcomes = _run_tasks([tasks[i] for i in order], project, options, jobs)
    finally:
        freeze_kept(False)
        gc.unfreeze()
    in_order = list(outcomes)
    for i, outcome in zip(order, outcomes, strict=True):
        in_order[i] = outcome
    return in_order


def _run_tasks(
    tasks: Sequence[Task], project: ProjectIndex, options: RunOptions, jobs: int
) -> list[Outcome]:
    workers = min(jobs, len(tasks) // MIN_FILES_PER_WORKER)
    if workers <= 1:
        return [check_task(task, project, options) for task in tasks]
    # fork shares the already imported rules with no re-import; spawn works too, slower.
    method = "fork" if sys.platform == "linux" else None
    context = multiprocessing.get_context(method)
    chunksize = max(1, len(tasks) // (workers * 8))
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_init_worker,
        initargs=(project, options, os.getpid()),
    )
    try:
        results = pool.map(_check_in_worker, tasks, chunksize=chunksize)
        # With fork, every worker exists once map() has queued the tasks.
        _worker_pids.update(getattr(pool, "_processes", None) or {})
        outcomes = list(results)
    except BaseException:
        # A broken pool or an error here: stop now, not after every queued file is
        # checked (which is what leaving a `with` block would wait for).
        _stop_workers(pool)
        raise
    finally:
        _worker_pids.clear()
    pool.shutdown(wait=True)
    return outcomes


# Worker processes of the pool now running, for `kill_workers` (a signal handler).
_worker_pids: set[int] = set()


def kill_workers() -> None:
    """SIGKILL the workers of the running pool: for a parent about to `os._exit`."""
    for pid in list(_worker_pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what is queued and end the worker processes at once."""
    # The executor has no public way to end its workers before Python 3.14.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.kill()
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            process.join(timeout=5)
    pool.shutdown(wait=True)  # the executor's thread sees the dead workers and ends
