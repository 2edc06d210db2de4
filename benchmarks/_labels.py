"""The real-bug label records (benchmarks/bugs.jsonl): their schema and its checks.

One JSON object a line; the fields are described in benchmarks/README.md ("Real bugs").
`problems(record, ...)` lists what is wrong with one record, in words; `bugs.py merge`
and tests/benchmarks/test_bugs_labels.py both use it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUGS = HERE / "bugs.jsonl"
SKIPPED = HERE / "bugs-skipped.jsonl"
MISSES = HERE / "bugs-misses.tsv"
CORPUS_LIST = HERE / "corpus.txt"
# beside the checkout (CI), or beside the folder of git worktrees (/work/wt/NAME -> /work/shared)
RESERVED_PLACES = (
    HERE.parent.parent / "shared" / "reserved-repos.txt",
    HERE.parent.parent.parent / "shared" / "reserved-repos.txt",
)

CATEGORIES = (
    "device-mismatch-input",
    "device-mismatch-label",
    "device-mismatch-hidden",
    "device-mismatch-new-tensor",
    "device-mismatch-other",
    "unregistered-tensor",
    "discarded-to",
    "hardcoded-cuda",
    "numpy-on-device",
    "load-map-location",
    "load-weights-only",
    "missing-eval",
    "missing-no-grad",
    "zero-grad",
    "loss-kept-with-graph",
    "softmax-wrong-loss",
    "inplace-autograd",
    "dataloader-workers",
    "batchnorm-batch-one",
    "dataparallel-prefix",
    "save-whole-model",
    "amp-misuse",
    "other",
)
# codes kept for rules that do not exist yet (issue 15); a label may name them
RESERVED_CODES = ("TD113", "TD215", "TD216", "TD405", "TD406", "TD407", "TD503")
FAMILIES = {
    "TD1": "TD1xx device",
    "TD2": "TD2xx training loop",
    "TD3": "TD3xx loss",
    "TD4": "TD4xx checkpoint",
    "TD5": "TD5xx data loading",
    "TD6": "TD6xx API",
}

_HEX40 = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.][A-Za-z0-9_.-]*")
_CODE = re.compile(r"TD\d{3}")
_REQUIRED: dict[str, type] = {
    "id": str,
    "repo": str,
    "fix_commit": str,
    "parent_commit": str,
    "url": str,
    "files": list,
    "category": str,
    "rules": list,
    "fix": str,
    "confirmed_by": str,
    "found_by": str,
    "collector": str,
}
# fields a record may carry; a second, blind review of the labels (issue 16) adds the last two
_OPTIONAL: dict[str, type] = {"notes": str, "reviewed_by": str, "review_doubt": str}
# why a reviewer doubts that a record is a real PyTorch bug: "<kind>: <reason>"
DOUBTS = ("not-a-bug", "not-pytorch", "unconfirmed")
REVIEW_LOG = HERE / "bugs-review.tsv"


NO_RULE = "no rule named"  # the family of a bug no existing or reserved rule covers


def family(code: str) -> str:
    return FAMILIES.get(code[:3], "other")


def reserved_list() -> Path | None:
    """The reserved-repos.txt beside this checkout, if there is one."""
    return next((path for path in RESERVED_PLACES if path.is_file()), None)


def known_codes() -> frozenset[str]:
    """Every code of the catalogue (static, runtime and engine) plus the reserved ones."""
    from torchdoctor.catalog import catalog

    return frozenset(catalog()) | frozenset(RESERVED_CODES)


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line; ValueError names a bad line."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
    return rows


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    from _readme import atomic_write  # sibling module; imported late: tests load this alone

    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def repo_list(path: Path) -> frozenset[str]:
    """Lower-cased `owner/name` of every repository a list file names (first word a line)."""
    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        word = line.split("#", 1)[0].strip().split()
        if word:
            names.add(word[0].lower())
    return frozenset(names)


def safe_path(path: str) -> bool:
    """A relative path that stays inside the folder it is rebuilt into."""
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and "\\" not in path and ".." not in parts


def problems(
    record: Any, known: frozenset[str], reserved: frozenset[str] = frozenset()
) -> list[str]:
    """What is wrong with one bug record (empty: nothing)."""
    if not isinstance(record, dict):
        return ["not a JSON object"]
    found = []
    for name, kind in _REQUIRED.items():
        if name not in record:
            found.append(f"missing field {name!r}")
        elif not isinstance(record[name], kind):
            found.append(f"{name!r} is {type(record[name]).__name__}, not {kind.__name__}")
    for name, kind in _OPTIONAL.items():
        if name in record and not isinstance(record[name], kind):
            found.append(f"{name!r} is {type(record[name]).__name__}, not {kind.__name__}")
    if found:
        return found
    doubt = record.get("review_doubt")
    if doubt is not None and doubt.split(":", 1)[0] not in DOUBTS:
        found.append(f"review_doubt {doubt!r} does not start with one of {', '.join(DOUBTS)}")
    repo = record["repo"]
    if not _REPO.fullmatch(repo):
        found.append(f"repo {repo!r} is not owner/name")
    elif repo.lower() in reserved:
        found.append(f"repo {repo} is reserved for independent evaluation")
    for name in ("fix_commit", "parent_commit"):
        if not _HEX40.fullmatch(record[name]):
            found.append(f"{name} {record[name]!r} is not 40 lower-case hex digits")
    fix = record["fix_commit"]
    if not re.fullmatch(rf"{re.escape(repo.replace('/', '+', 1))}@{fix[:12]}(-\d+)?", record["id"]):
        found.append(f"id {record['id']!r} is not owner+name@<first 12 hex of fix_commit>[-N]")
    if record["category"] not in CATEGORIES:
        found.append(f"category {record['category']!r} is not in the fixed list")
    for code in record["rules"]:
        if not isinstance(code, str) or not _CODE.fullmatch(code):
            found.append(f"rule {code!r} is not a TDnnn code")
        elif code not in known:
            found.append(f"rule {code} is neither in the catalogue nor reserved")
    found += _file_problems(record["files"])
    return found


def _file_problems(files: list[Any]) -> list[str]:
    found = []
    if not files:
        found.append("files is empty")
    labelled = 0
    paths = set()
    for entry in files:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            found.append(f"file entry {entry!r} has no path")
            continue
        path = entry["path"]
        if not safe_path(path):
            found.append(f"path {path!r} is not a plain relative path")
        if path in paths:
            found.append(f"path {path} is listed twice")
        paths.add(path)
        lines = entry.get("lines")
        if not isinstance(lines, list):
            found.append(f"{path}: 'lines' is not a list")
            continue
        for item in lines:
            line = item.get("line") if isinstance(item, dict) else None
            sha1 = item.get("sha1") if isinstance(item, dict) else None
            if not isinstance(line, int) or isinstance(line, bool) or line < 1:
                found.append(f"{path}: line {line!r} is not a positive integer")
            if not isinstance(sha1, str) or not _HEX40.fullmatch(sha1):
                found.append(f"{path}: sha1 {sha1!r} is not 40 lower-case hex digits")
            labelled += 1
    if files and not labelled:
        found.append("no labelled line in any file")
    return found
