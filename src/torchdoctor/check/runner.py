"""A whole `torchdoctor check` run: discover, index the project, check, fix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torchdoctor.check.config import Settings
from torchdoctor.check.engine import (
    FileResult,
    RunOptions,
    check_text,
    discover,
    iter_sources,
    rules_for,
)
from torchdoctor.check.fix import atomic_write, encode_like
from torchdoctor.check.project import ProjectIndex


def run_check(paths: Sequence[Path], settings: Settings, options: RunOptions) -> list[FileResult]:
    files = list(discover(paths, settings))
    sources = list(iter_sources(files))
    project = ProjectIndex.build(text for _, text, _ in sources if text is not None)
    results: list[FileResult] = []
    for path, text, error in sources:
        if text is None:
            assert error is not None
            results.append(FileResult(str(path), [error]))
            continue
        rules = rules_for(path, settings, options)
        findings, fixed_text, applied = check_text(text, str(path), rules, project, options)
        result = FileResult(str(path), findings, source=fixed_text, fixed=applied)
        if fixed_text != text:
            result.original = text
            if options.fix and not options.diff:
                original = path.read_bytes()
                atomic_write(path, encode_like(original, fixed_text))
        results.append(result)
    return results
