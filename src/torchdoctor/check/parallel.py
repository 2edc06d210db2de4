"""Check many files on several cores: one worker process per core, files in chunks.

`-j 1` (and any run too small to repay starting processes) checks in this
process. Workers receive the project index and run options once, at start-up,
and then (path, text, rule codes) per file; they return findings and the
fixed text. Files are written by the parent only.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from torchdoctor.check.analysis.file_loops import recording_siblings
from torchdoctor.check.engine import RunOptions, check_text, syntax_error_finding
from torchdoctor.check.project import ProjectIndex
from torchdoctor.check.registry import rules_by_code
from torchdoctor.check.rule import Finding

# Fewer files than this per worker are checked in-process: a worker costs ~20-50 ms.
MIN_FILES_PER_WORKER = 8


@dataclass(frozen=True)
class Task:
    path: str
    text: str
    rule_codes: tuple[str, ...]


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
    """Collect garbage less often while checking.

    Parsing allocates millions of small objects (AST nodes, which form no cycles), and
    with the default thresholds the cyclic GC spends about a quarter of a run scanning
    them. Collecting the youngest generation every 100,000 allocations instead of 700
    costs no memory that matters (measured: the same peak RSS on torch/_dynamo).
    """
    gc.set_threshold(100_000, 20, 100)


def _init_worker(project: ProjectIndex, options: RunOptions) -> None:
    global _project, _options
    _project, _options = project, options
    tune_gc()


def check_task(task: Task, project: ProjectIndex, options: RunOptions) -> Outcome:
    """Check one file; an engine bug becomes a TD900 finding for that file only."""
    try:
        by_code = rules_by_code()
        rules = [by_code[code] for code in task.rule_codes if code in by_code]
        with recording_siblings() as siblings:
            findings, text, fixed = check_text(task.text, task.path, rules, project, options)
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
    workers = min(jobs, len(tasks) // MIN_FILES_PER_WORKER)
    if workers <= 1:
        return [check_task(task, project, options) for task in tasks]
    # fork shares the already imported rules with no re-import; spawn works too, slower.
    method = "fork" if sys.platform == "linux" else None
    context = multiprocessing.get_context(method)
    chunksize = max(1, len(tasks) // (workers * 8))
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_init_worker,
        initargs=(project, options),
    ) as pool:
        return list(pool.map(_check_in_worker, tasks, chunksize=chunksize))
