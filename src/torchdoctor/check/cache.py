"""Per-file results cache in `.torchdoctor_cache/` beside the config file.

An entry is reused only when its key matches: the file's bytes, its path, the
rules run on it, the target torch version, the project index fingerprint, the
torchdoctor version and the engine's own source files (so editing a rule
invalidates it); and when none of the other files its findings were computed from
(sibling modules the training-loop rules read) changed size or modification time.
The cache is JSON, never pickle: a cache folder committed to a
repository must not be able to run code.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchdoctor import __version__
from torchdoctor.check.fix import atomic_write
from torchdoctor.check.rule import Edit, Finding, Fix, FixAvailability
from torchdoctor.check.torch_pins import TorchCeiling

CACHE_DIR = ".torchdoctor_cache"
_FORMAT = 1


@functools.cache
def engine_fingerprint() -> str:
    """Changes whenever a file of the check engine or its rules changes (size or mtime)."""
    here = Path(__file__).parent
    parts = [__version__, str(_FORMAT)]
    for folder in (here, here / "rules"):
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.name.endswith(".py"):
                    st = entry.stat()
                    parts.append(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def file_key(
    data: bytes,
    path: str,
    rule_codes: Sequence[str],
    versions: tuple[tuple[int, int] | None, TorchCeiling | None],
    project_fingerprint: str,
) -> str:
    digest = hashlib.sha256(data)
    digest.update(
        "\0".join(
            (
                path,
                ",".join(rule_codes),
                repr(versions),  # the target version, or the project's torch pins
                project_fingerprint,
                engine_fingerprint(),
            )
        ).encode()
    )
    return digest.hexdigest()


class ResultCache:
    """path -> (key, findings) for one config root; loaded once, saved once per run."""

    def __init__(self, root: Path) -> None:
        self.folder = root / CACHE_DIR / __version__
        self.file = self.folder / "results.json"
        self._entries: dict[str, dict[str, Any]] = {}
        self._changed = False
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(self.file.read_text(encoding="utf-8"))
            if isinstance(loaded, dict) and loaded.get("format") == _FORMAT:
                entries = loaded.get("files")
                if isinstance(entries, dict):
                    self._entries = entries

    def get(self, path: str, key: str) -> list[Finding] | None:
        entry = self._entries.get(path)
        if not entry or entry.get("key") != key:
            return None
        try:
            if any(_stamp(dep) != stamp for dep, stamp in entry.get("depends", {}).items()):
                return None  # a file it imports changed since
            return [_finding_from_json(item) for item in entry["findings"]]
        except (AttributeError, KeyError, TypeError, ValueError):
            return None  # a damaged entry is a miss

    def put(
        self, path: str, key: str, findings: Sequence[Finding], depends: Sequence[str] = ()
    ) -> None:
        """Remember `findings`; `depends` are other files they were computed from."""
        entry: dict[str, Any] = {"key": key, "findings": [_finding_to_json(f) for f in findings]}
        if depends:
            entry["depends"] = {dep: _stamp(dep) for dep in depends}
        self._entries[path] = entry
        self._changed = True

    def save(self) -> None:
        """Write the cache atomically; a folder that cannot be written just means no cache."""
        if not self._changed:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            top = self.folder.parent
            if not (top / ".gitignore").exists():
                (top / ".gitignore").write_text("# created by torchdoctor\n*\n")
                (top / "CACHEDIR.TAG").write_text(
                    "Signature: 8a477f597d28d172789f06886806bc55\n"
                    "# This file is a cache directory tag created by torchdoctor.\n"
                )
            data = json.dumps({"format": _FORMAT, "files": self._entries}, separators=(",", ":"))
            atomic_write(self.file, data.encode("utf-8"))
        except OSError:
            return
        self._changed = False


def _stamp(path: str) -> str:
    """Size and modification time of a file ("" if it is gone): cheap change detection."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_size}:{st.st_mtime_ns}"


def _finding_to_json(f: Finding) -> dict[str, Any]:
    out: dict[str, Any] = {
        "code": f.code,
        "message": f.message,
        "span": [f.line, f.column, f.end_line, f.end_column],
    }
    if f.hint is not None:
        out["hint"] = f.hint
    if f.fix is not None:
        out["fix"] = {
            "applicability": f.fix.applicability.value,
            "message": f.fix.message,
            "edits": [[e.start, e.end, e.content] for e in f.fix.edits],
        }
    return out


def _finding_from_json(item: dict[str, Any]) -> Finding:
    line, column, end_line, end_column = (int(v) for v in item["span"])
    fix = None
    if "fix" in item:
        raw = item["fix"]
        fix = Fix(
            edits=tuple(Edit(int(s), int(e), str(c)) for s, e, c in raw["edits"]),
            applicability=FixAvailability(raw["applicability"]),
            message=str(raw["message"]),
        )
    return Finding(
        code=str(item["code"]),
        message=str(item["message"]),
        line=line,
        column=column,
        end_line=end_line,
        end_column=end_column,
        fix=fix,
        hint=item.get("hint"),
    )
