"""`torchdoctor check --add-noqa`: silence today's findings in place, catch tomorrow's.

ruff's adoption workflow for a large codebase: every finding gets a `noqa`
comment naming its code on a line where the engine honours it (the finding's
line, or the last line of a statement that spans several), codes join an
existing list on that line, and a file whose new text would not parse is left
as it was. Writes are atomic like `--fix`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from torchdoctor.check.engine import NOQA_COMMENT, FileResult
from torchdoctor.check.fix import atomic_write, encode_like
from torchdoctor.check.notebook import NotebookError, write_notebook
from torchdoctor.check.rule import Finding

# Python's tokenizer ends lines at \r\n, \r and \n, and nothing else.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)?")
_ENGINE_CODES = ("TD001", "TD900")  # cannot be silenced: the file was not (fully) checked


@dataclass
class Added:
    files: int = 0
    comments: int = 0
    skipped: list[str] = field(default_factory=list)  # files left alone, with the reason


def _target_line(finding: Finding, lines: list[str]) -> int:
    """A line where a `noqa` silences the finding and a comment can end the line."""
    for number in finding.noqa_lines:  # a noqa list already there takes the code
        if 0 < number <= len(lines) and NOQA_COMMENT.search(lines[number - 1]):
            return number
    if finding.noqa_lines and finding.noqa_lines[-1] != finding.line:
        # a statement over several lines: its last line ends outside any string
        return finding.noqa_lines[-1]
    return finding.line


def with_noqa(source: str, findings: Iterable[Finding]) -> tuple[str, int]:
    """The source with a noqa comment for every finding; and how many lines changed."""
    lines = _LINE.findall(source)
    if lines and lines[-1] == "":
        lines.pop()
    wanted: dict[int, set[str]] = {}
    for finding in findings:
        if finding.code not in _ENGINE_CODES:
            wanted.setdefault(_target_line(finding, lines), set()).add(finding.code)
    changed = 0
    for number, codes in wanted.items():
        if not 0 < number <= len(lines):
            continue
        line = lines[number - 1]
        body = line.rstrip("\r\n")
        ending = line[len(body) :]
        match = NOQA_COMMENT.search(body)
        if match is not None and not match.group("codes"):
            continue  # a bare noqa comment silences every code already
        if match is not None:
            present = {c.upper() for c in re.findall(r"[A-Z]+[0-9]+", match.group("codes"), re.I)}
            new = sorted(codes - present)
            if not new:
                continue
            at = match.end("codes")
            body = body[:at] + "".join(f", {code}" for code in new) + body[at:]
        else:
            body = f"{body.rstrip()}  # noqa: {', '.join(sorted(codes))}"
        lines[number - 1] = body + ending
        changed += 1
    return "".join(lines), changed


def add_noqa(results: Iterable[FileResult]) -> Added:
    """Write the comments into each file with findings; notebooks keep everything but code."""
    added = Added()
    for result in results:
        if result.source is None or not result.findings or result.path == "-":
            continue
        new_text, count = with_noqa(result.source, result.findings)
        if not count:
            continue
        path = Path(result.path)
        try:
            ast.parse(new_text)
        except (SyntaxError, ValueError):
            added.skipped.append(f"{path}: the comments would not parse here; left as it was")
            continue
        try:
            if result.notebook is not None:
                data = write_notebook(result.notebook, new_text).encode("utf-8")
            else:
                data = encode_like(path.read_bytes(), new_text)
            atomic_write(path, data)
        except (OSError, UnicodeEncodeError, NotebookError) as exc:
            added.skipped.append(f"{path}: not written: {exc}")
            continue
        added.files += 1
        added.comments += count
    return added
