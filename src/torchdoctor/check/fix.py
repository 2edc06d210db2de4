"""Apply fixes as text edits, and write files back atomically."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
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


def _temp_name_pattern(path: Path) -> re.Pattern[str]:
    """The names `atomic_write` gives its temp files for `path`: `.NAME.<8 random>.tmp`.

    The 8 characters come from [a-z0-9_], as `tempfile.mkstemp` draws them (the names
    earlier versions made); nothing else matches.
    """
    return re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")


def remove_stale_temp_files(path: Path) -> list[Path]:
    """Delete temp files an earlier, killed `atomic_write` of `path` left beside it.

    Only names `atomic_write` itself makes for this very file are touched; a run
    killed with SIGKILL between creating and renaming its temp file leaves one.
    """
    pattern = _temp_name_pattern(path)
    removed = []
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for entry in entries:
            if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


_TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
# Temp files of `atomic_write` calls under way, for `remove_temp_files_in_progress`.
_in_progress: set[str] = set()


def remove_temp_files_in_progress() -> None:
    """Delete the temp file of a write under way: for a process about to `os._exit`."""
    for tmp in list(_in_progress):
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _create_temp_file(path: Path) -> tuple[int, str]:
    """`tempfile.mkstemp` for `path`, registered in `_in_progress` before it exists.

    Registered first, a signal handler that runs at any point of this function finds
    every temp file there is (mkstemp would leave a window between creating and
    returning the file).
    """
    for _ in range(100):
        name = "".join(secrets.choice(_TEMP_CHARS) for _ in range(8))
        tmp = os.path.join(path.parent, f".{path.name}.{name}.tmp")
        _in_progress.add(tmp)
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), tmp
        except FileExistsError:
            _in_progress.discard(tmp)
        except BaseException:
            _in_progress.discard(tmp)
            raise
    raise FileExistsError(f"no free temp file name beside {path}")


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a crash leaves either the old or the new file."""
    remove_stale_temp_files(path)
    fd, tmp = _create_temp_file(path)
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
    finally:
        _in_progress.discard(tmp)


def encode_like(original: bytes, text: str) -> bytes:
    """Encode `text` with the encoding (and BOM) the original bytes used."""
    encoding = source_encoding(original)
    if encoding == "utf-8-sig":
        return b"\xef\xbb\xbf" + text.encode("utf-8")
    return text.encode(encoding)
