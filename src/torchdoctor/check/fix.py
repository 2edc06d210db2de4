"""Apply fixes as text edits, and write files back atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from torchdoctor.check.rule import Edit, Finding, FixAvailability
from torchdoctor.check.source_text import source_encoding


def fixable(finding: Finding, unsafe: bool) -> bool:
    if finding.fix is None:
        return False
    return finding.fix.applicability is FixAvailability.SAFE or unsafe


def apply_edits(
    source: str, findings: Iterable[Finding], unsafe: bool, *, newline: str = "\n"
) -> tuple[str, int]:
    """Apply the non-overlapping fixes of `findings`; return (new source, fixes applied).

    A fix is all-or-nothing: if any of its edits overlaps an edit already taken, the
    whole fix waits for the next pass (the engine re-checks and re-fixes until stable).
    Line breaks in inserted text take the file's own `newline` (CRLF files stay CRLF).
    """
    taken: list[Edit] = []
    applied = 0
    for finding in sorted(findings, key=lambda f: (f.line, f.column)):
        if not fixable(finding, unsafe):
            continue
        assert finding.fix is not None
        edits = finding.fix.edits
        if any(_overlaps(e, t) for e in edits for t in taken):
            continue
        taken.extend(edits)
        applied += 1
    if not taken:
        return source, 0
    out = source
    for edit in sorted(taken, key=lambda e: (e.start, e.end), reverse=True):
        content = edit.content
        if newline != "\n" and "\n" in content:
            content = content.replace("\r\n", "\n").replace("\n", newline)
        out = out[: edit.start] + content + out[edit.end :]
    return out, applied


def _overlaps(a: Edit, b: Edit) -> bool:
    if a.start == a.end == b.start == b.end:
        return True  # two insertions at one point: order would be ambiguous
    return a.start < b.end and b.start < a.end


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a crash leaves either the old or the new file."""
    folder = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(OSError):
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def encode_like(original: bytes, text: str) -> bytes:
    """Encode `text` with the encoding (and BOM) the original bytes used."""
    encoding = source_encoding(original)
    if encoding == "utf-8-sig":
        return b"\xef\xbb\xbf" + text.encode("utf-8")
    return text.encode(encoding)
