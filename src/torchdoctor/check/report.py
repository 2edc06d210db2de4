"""Output formats for `torchdoctor check`: text, concise, json (sarif and github in formats.py)."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from torchdoctor.catalog import catalog
from torchdoctor.check.engine import FileResult
from torchdoctor.check.formats import write_github, write_sarif
from torchdoctor.check.lines import NEWLINE, split_lines
from torchdoctor.check.rule import Finding


def use_colour(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


class _Style:
    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on else text


def finding_dict(
    path: str, f: Finding, source: str | None = None, result: FileResult | None = None
) -> dict[str, Any]:
    """The JSON shape of one finding (1-based lines and columns).

    In a notebook, `cell` is the cell number and lines count within that cell.
    """
    info = catalog().get(f.code)

    def line_of(virtual: int) -> int:
        return result.display_line(virtual) if result is not None else virtual

    fix: dict[str, Any] | None = None
    if f.fix is not None:
        fix = {
            "applicability": f.fix.applicability.value,
            "message": f.fix.message,
            "edits": [_edit_dict(e.start, e.end, e.content, source, line_of) for e in f.fix.edits],
        }
    return {
        "code": f.code,
        "name": info.name if info else f.code,
        "severity": (info.severity.value if info else "error"),
        "message": f.message,
        "filename": path,
        "cell": result.cell_of(f.line) if result is not None else None,
        "line": line_of(f.line),
        "column": f.column,
        "end_line": line_of(f.end_line),
        "end_column": f.end_column,
        "fix": fix,
        "hint": f.hint,
        "url": info.url if info else None,
    }


def _edit_dict(
    start: int, end: int, content: str, source: str | None, line_of: Callable[[int], int]
) -> dict[str, Any]:
    out: dict[str, Any] = {"content": content}
    if source is not None:
        for key, offset in (("location", start), ("end_location", end)):
            row, col = _row_col(source, offset)
            out[key] = {"row": line_of(row), "column": col}
    return out


def _row_col(source: str, offset: int) -> tuple[int, int]:
    before = source[:offset]
    breaks = list(NEWLINE.finditer(before))
    row = len(breaks) + 1
    col = offset - (breaks[-1].end() if breaks else 0) + 1
    return row, col


def write_json(results: Sequence[FileResult], out: TextIO) -> None:
    items = [finding_dict(r.display_path, f, r.source, r) for r in results for f in r.findings]
    json.dump(items, out, indent=2)
    out.write("\n")


def write_concise(results: Sequence[FileResult], out: TextIO) -> None:
    for r in results:
        for f in r.findings:
            out.write(f"{r.display_path}:{r.location(f)}: {f.code} {f.message}\n")


def write_text(results: Sequence[FileResult], out: TextIO) -> None:
    style = _Style(use_colour(out))
    entries = catalog()
    for r in results:
        if not r.findings:
            continue  # (most files: their text is not split into lines)
        lines = split_lines(r.source) if r.source is not None else []
        for f in r.findings:
            info = entries.get(f.code)
            fix_mark = " [*]" if f.fix is not None else ""
            out.write(
                f"{style(r.display_path, '1')}:{r.location(f)}: "
                f"{style(f.code, '1;31')} {f.message}{fix_mark}\n"
            )
            if 0 < f.line <= len(lines):
                text = lines[f.line - 1].expandtabs(1)
                number = str(r.display_line(f.line))
                pad = " " * len(number)
                start = f.column - 1
                stop = f.end_column - 1 if f.end_line == f.line else len(text)
                width = max(1, min(stop, len(text)) - start)
                out.write(f"{pad} {style('|', '34')}\n")
                out.write(f"{number} {style('|', '34')} {text}\n")
                out.write(f"{pad} {style('|', '34')} {' ' * start}{style('^' * width, '31')}\n")
                if f.hint:
                    out.write(f"{pad} {style('= hint:', '36')} {f.hint}\n")
                if f.fix is not None:
                    kind = "fix" if f.fix.applicability.value == "safe" else "unsafe fix"
                    out.write(f"{pad} {style('= ' + kind + ':', '32')} {f.fix.message}\n")
                if info is not None and info.kind == "static":
                    out.write(f"{pad} {style('= docs:', '2')} torchdoctor rule {f.code}\n")
                out.write("\n")


def write_statistics(results: Sequence[FileResult], out: TextIO) -> None:
    counts = Counter(f.code for r in results for f in r.findings)
    fixable = Counter(f.code for r in results for f in r.findings if f.fix is not None)
    entries = catalog()
    for code, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        info = entries.get(code)
        mark = "[*]" if fixable[code] else "   "
        out.write(f"{count:>6}  {code}  {mark} {info.name if info else ''}\n")


def write_summary(results: Sequence[FileResult], out: TextIO, *, fix_mode: bool) -> None:
    total = sum(len(r.findings) for r in results)
    fixed = sum(r.fixed for r in results)
    if fixed:
        print(f"Fixed {fixed} finding{'s' if fixed != 1 else ''}.", file=out)
    if total == 0:
        if not fixed:
            print(f"All checks passed ({len(results)} files).", file=out)
        return
    fixable = sum(1 for r in results for f in r.findings if f.fix is not None)
    line = f"Found {total} finding{'s' if total != 1 else ''} in {len(results)} files."
    if fixable and not fix_mode:
        line += f"\n[*] {fixable} fixable with `--fix`"
        unsafe = sum(
            1
            for r in results
            for f in r.findings
            if f.fix is not None and f.fix.applicability.value == "unsafe"
        )
        if unsafe:
            line += f" ({unsafe} more with `--unsafe-fixes`)"
        line += "."
    print(line, file=out)


Writer = Callable[[Sequence[FileResult], TextIO], None]

FORMATS: dict[str, Writer] = {
    "text": write_text,
    "concise": write_concise,
    "json": write_json,
    "sarif": write_sarif,
    "github": write_github,
}


def stream() -> TextIO:
    return sys.stdout
