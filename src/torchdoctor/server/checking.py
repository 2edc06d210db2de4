"""An editor's open document (a .py file or a notebook's code cells) -> findings and edits.

The same engine, configuration and rule selection as `torchdoctor check`, with
no protocol in sight: positions here are 0-based lines and 0-based characters
(code points) in one *part* — the file itself, or one code cell of a notebook —
and the language server converts them to what the editor counts in.
"""

from __future__ import annotations

import bisect
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from torchdoctor.catalog import catalog
from torchdoctor.check.config import Settings, find_config, load_settings
from torchdoctor.check.engine import NOQA_COMMENT, FileResult, RunOptions
from torchdoctor.check.lines import line_starts, split_lines
from torchdoctor.check.notebook import cell_codes
from torchdoctor.check.rule import Finding, FixAvailability
from torchdoctor.check.runner import run_check
from torchdoctor.errors import TorchDoctorError


@dataclass(frozen=True)
class Span:
    """A range in one part: `part` 0 for a file, else the index of the notebook code cell."""

    part: int
    line: int
    column: int
    end_line: int
    end_column: int


@dataclass(frozen=True)
class TextEdit:
    span: Span
    new_text: str


@dataclass
class DocFinding:
    finding: Finding
    span: Span
    fix_edits: list[TextEdit] | None  # None: no fix, or one that cannot be shown per part
    noqa_edit: TextEdit  # adds a noqa comment naming the code to the finding's line

    @property
    def unsafe_fix(self) -> bool:
        fix = self.finding.fix
        return fix is not None and fix.applicability is FixAvailability.UNSAFE


@dataclass
class Checked:
    findings: list[DocFinding] = field(default_factory=list)
    config_error: str | None = None  # a configuration that cannot be used: said once, no findings


class DocumentChecker:
    """Checks documents; remembers the last result per path and text, so that hover and
    code actions after a diagnostics run cost nothing."""

    def __init__(self) -> None:
        self._last: dict[Path, tuple[tuple[str, ...], Checked]] = {}

    def check(self, path: Path, parts: list[str], *, notebook: bool = False) -> Checked:
        key = tuple(parts)
        cached = self._last.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        result = check_parts(path, parts, notebook=notebook)
        self._last[path] = (key, result)
        return result

    def forget(self, path: Path) -> None:
        self._last.pop(path, None)


def settings_for(path: Path) -> Settings:
    """The project's `[tool.torchdoctor]` settings for a file, found as `check` finds them."""
    return load_settings(find_config(path), list(catalog()))


def _options(settings: Settings, *, fix: bool = False) -> RunOptions:
    enabled = settings.enabled_codes(
        (code, info.default_enabled) for code, info in catalog().items() if info.kind != "runtime"
    )
    return RunOptions(enabled=enabled, fix=fix, target_version=settings.target_version)


def _run(path: Path, data: bytes, settings: Settings, options: RunOptions) -> FileResult | None:
    """One check of `data` as the file at `path`; the results cache serves a saved file."""
    on_disk = None
    if not options.fix:
        with contextlib.suppress(OSError):
            on_disk = path.read_bytes()
    if on_disk == data:
        results = run_check([path], settings, options, jobs=1)
    else:
        results = run_check([], settings, options, jobs=1, stdin=data, stdin_filename=path)
    return results[0] if results else None


def _notebook_bytes(cells: list[str]) -> bytes:
    cell_json: list[dict[str, object]] = [
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "source": code,
            "execution_count": None,
        }
        for code in cells
    ]
    return json.dumps(
        {"cells": cell_json, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    ).encode()


def check_parts(path: Path, parts: list[str], *, notebook: bool = False) -> Checked:
    """Findings for a file's text (`parts == [text]`) or a notebook's code cells."""
    try:
        settings = settings_for(path)
    except TorchDoctorError as exc:
        return Checked(config_error=str(exc))
    if settings.is_excluded(path):
        return Checked()
    data = _notebook_bytes(parts) if notebook else parts[0].encode("utf-8")
    result = _run(path, data, settings, _options(settings))
    if result is None or result.source is None:
        return Checked(_engine_findings(result))
    mapper = _PartMapper(result)
    findings = []
    for finding in result.findings:
        span = mapper.span(finding.line, finding.column, finding.end_line, finding.end_column)
        if span is None:
            continue
        findings.append(
            DocFinding(finding, span, mapper.fix_edits(finding), mapper.noqa_edit(finding, span))
        )
    return Checked(findings)


def _engine_findings(result: FileResult | None) -> list[DocFinding]:
    """TD001 (unreadable or unparsable) has no checked text: shown at its own line."""
    out = []
    for finding in result.findings if result else []:
        span = Span(0, finding.line - 1, finding.column - 1, finding.line - 1, finding.column)
        out.append(DocFinding(finding, span, None, TextEdit(span, "")))
    return out


def fix_all(path: Path, parts: list[str], *, notebook: bool = False) -> list[str] | None:
    """Each part's text with every safe fix applied, or None when nothing changes."""
    try:
        settings = settings_for(path)
    except TorchDoctorError:
        return None
    data = _notebook_bytes(parts) if notebook else parts[0].encode("utf-8")
    result = _run(path, data, settings, _options(settings, fix=True))
    if result is None or result.original is None or result.source is None:
        return None
    if result.notebook is not None:
        return cell_codes(result.notebook, result.source)
    return [result.source]


class _PartMapper:
    """Character offsets and 1-based lines of the checked text -> spans in parts."""

    def __init__(self, result: FileResult) -> None:
        assert result.source is not None
        self.result = result
        self.lines = split_lines(result.source)
        self.starts = line_starts(result.source, self.lines)

    def _part_line(self, line: int) -> tuple[int, int]:
        """1-based checked line -> (part, 0-based line in the part)."""
        if self.result.cell_lines:
            # the notebook was built from the code cells alone, so cell N is part N - 1
            cell_number, cell_line = self.result.cell_lines[line - 1]
            return cell_number - 1, cell_line - 1
        return 0, line - 1

    def span(self, line: int, column: int, end_line: int, end_column: int) -> Span | None:
        if not 0 < line <= len(self.lines):
            return None
        end_line = min(max(end_line, line), len(self.lines))
        part, first = self._part_line(line)
        end_part, last = self._part_line(end_line)
        if end_part != part:  # a range running past a cell's end stops at that line
            last, end_column = first, len(self.lines[line - 1]) + 1
        return Span(part, first, column - 1, last, end_column - 1)

    def _offset_span(self, start: int, end: int) -> Span | None:
        def place(offset: int) -> tuple[int, int]:
            line = self._line_of(offset)
            return line, offset - self.starts[line - 1] + 1

        (line, col), (end_line, end_col) = place(start), place(end)
        return self.span(line, col, end_line, end_col)

    def fix_edits(self, finding: Finding) -> list[TextEdit] | None:
        if finding.fix is None:
            return None
        edits = []
        for edit in finding.fix.edits:
            span = self._offset_span(edit.start, edit.end)
            if span is None:
                return None
            if self._part_line(self._line_of(edit.end))[0] != span.part:
                return None  # an edit across two cells cannot be shown as one
            edits.append(TextEdit(span, edit.content))
        return edits

    def _line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)

    def noqa_edit(self, finding: Finding, span: Span) -> TextEdit:
        """`  # noqa: CODE` at the end of the line, or CODE added to the line's noqa list."""
        line = finding.line
        if finding.noqa_lines and line not in finding.noqa_lines:
            line = finding.noqa_lines[-1]
        part, part_line = self._part_line(line)
        text = self.lines[line - 1]
        match = NOQA_COMMENT.search(text)
        if match is not None and match.group("codes"):
            at = match.end("codes")
            place = Span(part, part_line, at, part_line, at)
            return TextEdit(place, f", {finding.code}")
        if match is not None:  # a bare noqa comment already silences every code
            return TextEdit(Span(part, part_line, match.end(), part_line, match.end()), "")
        end = len(text.rstrip())
        return TextEdit(
            Span(part, part_line, end, part_line, len(text)), f"  # noqa: {finding.code}"
        )
