"""Hand verdicts on findings (benchmarks/verdicts.jsonl) and how findings find theirs.

One JSON object a line, sorted by repo, file, line, code:

    {"repo": "owner/name", "file": "path/in/repo.py", "line": 42, "code": "TD402",
     "hash": "<first 12 hex of sha1 of the flagged line's stripped text>",
     "verdict": "worth-fixing" | "intended" | "false-alarm", "reason": "one line",
     "judge": "who judged (optional)"}

A finding takes the verdict with the same repo, file, code and line hash, so a verdict
survives lines moving up or down; when several findings share that key (the same text
flagged twice), they are paired with the verdicts in line order. `cell` (the notebook
cell, 1-based) is added for findings in notebooks, whose `line` is the line in the cell;
`column` (1-based) tells apart two findings of one rule on one line.
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

VERDICTS = ("worth-fixing", "intended", "false-alarm")
_FIELDS = {"repo": str, "file": str, "line": int, "code": str, "hash": str, "verdict": str}
TEST_DIRS = frozenset({"tests", "test"})


@dataclass(frozen=True)
class Finding:
    repo: str
    file: str  # relative to the project folder, "/"-separated
    line: int  # in the file, or in the cell for a notebook
    code: str
    hash: str
    cell: int | None = None
    message: str = ""
    column: int = 0  # tells apart two findings of one rule on one line

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.repo, self.file, self.code, self.hash)


def line_hash(text: str) -> str:
    return hashlib.sha1(text.strip().encode("utf-8", "surrogateescape")).hexdigest()[:12]


def is_test(path: str) -> bool:
    """Test code: under a tests/ or test/ folder, test_*.py, *_test.py, conftest.py."""
    parts = PurePosixPath(path).parts
    name = parts[-1]
    stem = name.rsplit(".", 1)[0]
    return (
        any(part in TEST_DIRS for part in parts[:-1])
        or stem.startswith("test_")
        or stem.endswith("_test")
        or name == "conftest.py"
    )


def problems(record: Any) -> list[str]:
    """What is wrong with one verdict record (empty: nothing)."""
    if not isinstance(record, dict):
        return ["not a JSON object"]
    found = [
        f"field {name!r} missing or not {kind.__name__}"
        for name, kind in _FIELDS.items()
        if not isinstance(record.get(name), kind)
    ]
    if found:
        return found
    if record["verdict"] not in VERDICTS:
        found.append(f"verdict {record['verdict']!r} is not one of {', '.join(VERDICTS)}")
    if not isinstance(record.get("reason"), str) or not record["reason"].strip():
        found.append("no reason")
    if len(record["hash"]) != 12 or any(c not in "0123456789abcdef" for c in record["hash"]):
        found.append(f"hash {record['hash']!r} is not 12 hex digits")
    return found


def sort_key(record: dict[str, Any]) -> tuple[str, str, int, int, int, str]:
    where = (record.get("cell") or 0, record["line"], record.get("column") or 0)
    return (record["repo"], record["file"], *where, record["code"])


def match(
    findings: Iterable[Finding], verdicts: Iterable[dict[str, Any]]
) -> tuple[dict[Finding, dict[str, Any]], list[dict[str, Any]]]:
    """(finding -> its verdict, verdicts that match no finding any more)."""
    by_key: dict[tuple[str, str, str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for verdict in verdicts:
        by_key[(verdict["repo"], verdict["file"], verdict["code"], verdict["hash"])].append(verdict)
    groups: dict[tuple[str, str, str, str], list[Finding]] = collections.defaultdict(list)
    for finding in findings:
        groups[finding.key].append(finding)
    judged: dict[Finding, dict[str, Any]] = {}
    for key, group in groups.items():
        candidates = sorted(by_key.pop(key, []), key=lambda v: sort_key(v)[2:5])
        ordered = sorted(group, key=lambda f: (f.cell or 0, f.line, f.column))
        for finding, verdict in zip(ordered, candidates, strict=False):
            judged[finding] = verdict
        by_key[key] = candidates[len(ordered) :]
    stale = [v for rest in by_key.values() for v in rest]
    return judged, stale


def template(finding: Finding) -> str:
    """The verdict line a judge completes for one finding."""
    record: dict[str, Any] = {"repo": finding.repo, "file": finding.file, "line": finding.line}
    if finding.cell is not None:
        record["cell"] = finding.cell
    if finding.column:
        record["column"] = finding.column
    record |= {"code": finding.code, "hash": finding.hash, "verdict": "?", "reason": ""}
    return json.dumps(record)
