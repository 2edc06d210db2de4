"""A whole `torchdoctor check` run: discover, read, index the project, check, fix, cache.

The parent process reads every file (the project index needs them all before
any rule runs), answers what it can from the cache, hands the rest to
`parallel.run_tasks`, then writes fixed files and the cache.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.cache import ResultCache, file_key
from torchdoctor.check.config import Settings
from torchdoctor.check.engine import (
    FileResult,
    RunOptions,
    decode_source,
    discover,
    finding_order,
    rules_for,
    syntax_error_finding,
)
from torchdoctor.check.fix import atomic_write, encode_like, fixable
from torchdoctor.check.notebook import (
    Notebook,
    NotebookError,
    cite_cells,
    read_notebook,
    write_notebook,
)
from torchdoctor.check.parallel import Outcome, Task, default_jobs, run_tasks
from torchdoctor.check.project import ProjectIndex
from torchdoctor.check.rule import Finding
from torchdoctor.check.torch_pins import PinsFinder

STDIN = Path("-")


@dataclass
class Source:
    """One file as read: its bytes, the text rules check, or why it cannot be checked."""

    path: Path
    data: bytes | None = None
    text: str | None = None  # a notebook's virtual module
    notebook: Notebook | None = None
    error: Finding | None = None


def load_source(path: Path, data: bytes | None = None) -> Source:
    """Read and decode one file (or the given bytes); problems become a TD001 finding."""
    if data is None:
        try:
            # a named pipe with no writer would block the whole run forever on read
            if not stat.S_ISREG(path.stat().st_mode):
                reason = "not a regular file (a named pipe, socket or device)"
                return Source(path, error=syntax_error_finding(f"cannot read file: {reason}"))
            data = path.read_bytes()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            return Source(path, error=syntax_error_finding(f"cannot read file: {reason}"))
    if path.suffix == ".ipynb":
        try:
            notebook = read_notebook(data.decode("utf-8-sig"))
        except UnicodeDecodeError as exc:
            return Source(path, data, error=syntax_error_finding(f"cannot decode notebook: {exc}"))
        except NotebookError as exc:
            return Source(path, data, error=syntax_error_finding(exc.message))
        for warning in notebook.warnings:
            print(f"torchdoctor: warning: {path}: {warning}", file=sys.stderr)
        return Source(path, data, notebook.source, notebook)
    try:
        return Source(path, data, decode_source(data))
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        reason = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        if not reason.startswith("unknown encoding"):
            reason = f"not UTF-8 and no `# coding:` line says otherwise ({reason})"
        return Source(path, data, error=syntax_error_finding(f"cannot decode file: {reason}"))


def judging_root(paths: Sequence[Path], settings: Settings) -> str:
    """The folder that rules judging a file by its path (`tests/`, `benchmarks/`) read
    the path from: the configuration's folder; without one, the working directory, or
    the folder holding every checked path when that lies outside it (`check
    ~/benchmarks/proj` from the home folder judges `proj`'s files, not `benchmarks/`)."""
    root = os.path.abspath(settings.root)
    if settings.config_file is not None or not paths:
        return root
    folders = [os.path.abspath(p if p.is_dir() else p.parent) for p in paths]
    common = os.path.commonpath(folders)
    inside = common == root or common.startswith(root.rstrip(os.sep) + os.sep)
    return root if inside else common


def run_check(
    paths: Sequence[Path],
    settings: Settings,
    options: RunOptions,
    *,
    jobs: int | None = None,
    use_cache: bool = True,
    stdin: bytes | None = None,
    stdin_filename: Path | None = None,
) -> list[FileResult]:
    """Check `paths` (or `stdin` as if it were `stdin_filename`); write fixes if asked."""
    if stdin is not None:
        name = stdin_filename or STDIN
        if stdin_filename is not None and settings.force_exclude and settings.is_excluded(name):
            return []
        sources = [load_source(name, stdin)]
        use_cache = False
    else:
        sources = [load_source(path) for path in discover(paths, settings)]
    project = build_project((str(s.path), s.text) for s in sources if s.text is not None)
    project.root = judging_root(paths, settings)
    cache = ResultCache(settings.root) if use_cache else None
    fingerprint = project.fingerprint()
    # without a configured target version, what each file's project pins (torch_pins.py)
    pins = PinsFinder() if options.target_version is None else None

    results: list[FileResult | None] = []
    tasks: list[Task] = []
    pending: list[tuple[int, Source, str | None]] = []  # result slot, source, cache key
    for source in sources:
        display = str(source.path)
        if source.text is None:
            assert source.error is not None
            results.append(FileResult(display, [source.error]))
            continue
        codes = tuple(rule.code for rule in rules_for(source.path, settings, options))
        ceiling = pins.ceiling_for(display) if pins is not None else None
        versions = (options.target_version, ceiling)
        key = None
        if cache is not None and source.data is not None:
            key = file_key(source.data, display, codes, versions, fingerprint)
            cached = cache.get(display, key)
            if cached is not None and not _would_fix(cached, options):
                results.append(_result(source, Outcome(cached, source.text, 0)))
                continue
        pending.append((len(results), source, key))
        results.append(None)
        tasks.append(Task(display, source.text, codes, ceiling))

    outcomes = run_tasks(tasks, project, options, jobs or default_jobs())
    for (slot, source, key), outcome, task in zip(pending, outcomes, tasks, strict=True):
        result = _result(source, outcome)
        results[slot] = result
        assert source.text is not None
        data = source.data
        if outcome.text != source.text:
            result.original = source.text
            if options.fix and not options.diff and stdin is None:
                data = _write_fixed(source, outcome.text)
                if data is None:  # not written: report the file as it is on disk
                    result.source, result.original, result.fixed = source.text, None, 0
                    result.findings = [
                        f for f in _recheck(task, project, options) if f.code != "TD900"
                    ]
                    continue
            else:
                continue  # the findings belong to text that is not on disk: do not cache
        if cache is not None and key is not None and data is not None:
            if data is not source.data:
                versions = (options.target_version, task.torch_ceiling)
                key = file_key(data, task.path, task.rule_codes, versions, fingerprint)
            cache.put(task.path, key, outcome.findings, outcome.dependencies)
    if cache is not None:
        cache.save()
    return [r for r in results if r is not None]


def _would_fix(findings: Sequence[Finding], options: RunOptions) -> bool:
    if not (options.fix or options.diff):
        return False
    return any(fixable(f, options.unsafe_fixes) for f in findings)


def _result(source: Source, outcome: Outcome) -> FileResult:
    result = FileResult(
        str(source.path), outcome.findings, source=outcome.text, fixed=outcome.fixed
    )
    if source.notebook is not None:
        cells = source.notebook.cell_lines
        result.cell_lines = cells
        result.notebook = source.notebook
        result.findings = [
            replace(
                f, message=cite_cells(f.message, cells), hint=f.hint and cite_cells(f.hint, cells)
            )
            for f in result.findings
        ]
        if source.notebook.broken:
            result.findings = sorted(
                result.findings
                + [
                    syntax_error_finding(
                        f"SyntaxError: {text}; the cell was not checked", line, col
                    )
                    for line, col, text in source.notebook.broken
                ],
                key=finding_order,
            )
    return result


def _recheck(task: Task, project: ProjectIndex, options: RunOptions) -> list[Finding]:
    from torchdoctor.check.parallel import check_task

    plain = RunOptions(enabled=options.enabled, target_version=options.target_version)
    return check_task(task, project, plain).findings


def _write_fixed(source: Source, fixed_text: str) -> bytes | None:
    """Write the fixed file atomically; the new bytes, or None (with a warning) if not."""
    assert source.data is not None
    try:
        if source.notebook is not None:
            data = write_notebook(source.notebook, fixed_text).encode("utf-8")
        else:
            data = encode_like(source.data, fixed_text)
        atomic_write(source.path, data)
    except (OSError, UnicodeEncodeError, NotebookError) as exc:
        print(f"torchdoctor: warning: {source.path}: fixes not written: {exc}", file=sys.stderr)
        return None
    return data
