"""Recall on the real-bug corpus: score each labelled bug against a checker's findings.

An item counts as

- **right**: a finding of one of its `rules` at a labelled line;
- **other**: no such finding, but a finding of another code at a labelled line;
- **missed**: nothing at any labelled line.

"At a labelled line" means the finding starts on the labelled statement: from the labelled
line to the statement's last line (for a compound statement such as `for`/`with`/`if`, its
header only). A finding elsewhere in the file never counts, however close.
"""

from __future__ import annotations

import ast
import collections
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _labels import NO_RULE, family

RIGHT, OTHER, MISSED, NOT_BUILT = "right", "other", "missed", "not rebuilt"


@dataclass(frozen=True)
class Finding:
    path: str  # relative to the item's folder, "/"-separated
    line: int
    code: str


@dataclass
class Outcome:
    id: str
    category: str
    family: str
    rules: list[str]
    status: str
    reason: str = ""
    torchfix: bool | None = None  # None: TorchFix did not run on this item
    torchfix_codes: list[str] = field(default_factory=list)
    doubted: bool = False  # the label review doubts the record (its `review_doubt`)


def statement_span(source: str, line: int) -> tuple[int, int]:
    """(first, last) line of the statement that starts at `line`; (line, line) if unsure."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return line, line
    best: tuple[int, int] | None = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or node.lineno != line:
            continue
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            last = max(line, body[0].lineno - 1)  # a compound statement: its header
        else:
            last = node.end_lineno or line
        if best is None or last < best[1]:
            best = (line, last)
    return best or (line, line)


def labelled_spans(folder: Path, record: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    """path -> the (first, last) lines of each labelled statement in the rebuilt item."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for entry in record["files"]:
        if not entry["lines"]:
            continue
        try:
            source = (folder / entry["path"]).read_text(encoding="utf-8", errors="replace")
        except OSError:
            source = ""
        spans[entry["path"]] = [statement_span(source, item["line"]) for item in entry["lines"]]
    return spans


def at_label(finding: Finding, spans: dict[str, list[tuple[int, int]]]) -> bool:
    return any(first <= finding.line <= last for first, last in spans.get(finding.path, []))


def score(
    record: dict[str, Any],
    findings: Iterable[Finding],
    spans: dict[str, list[tuple[int, int]]],
    static_codes: frozenset[str],
) -> tuple[str, str]:
    """(status, automatic one-line reason) of one item; the reason is empty when right."""
    findings = list(findings)
    wanted = set(record["rules"])
    hits = [f for f in findings if at_label(f, spans)]
    if any(f.code in wanted for f in hits):
        return RIGHT, ""
    if hits:
        codes = ", ".join(sorted({f.code for f in hits}))
        return OTHER, f"only another rule at the labelled line ({codes})"
    if not wanted:
        return MISSED, "no existing or reserved rule covers this bug"
    if not wanted & static_codes:
        return MISSED, f"no rule for this yet ({', '.join(record['rules'])})"
    right_elsewhere = [f for f in findings if f.code in wanted]
    if right_elsewhere:
        single = len(spans) == 1 and len({f.path for f in right_elsewhere}) == 1
        places = ", ".join(
            f"line {f.line}" if single and f.path in spans else f"{f.path}:{f.line}"
            for f in sorted(right_elsewhere, key=lambda f: (f.path, f.line))[:3]
        )
        return MISSED, f"right rule fired elsewhere ({places})"
    in_labelled = sorted({f for f in findings if f.path in spans}, key=lambda f: (f.path, f.line))
    if any(f.code == "TD001" for f in in_labelled):
        return MISSED, "the labelled file does not parse as Python 3 (TD001): nothing checked"
    if not in_labelled:
        return MISSED, "no finding in the file" if len(spans) == 1 else "no finding in the files"
    others = ", ".join(f"{f.code} line {f.line}" for f in in_labelled[:3])
    return MISSED, f"right rule silent; other findings: {others}"


_SOURCE_OPEN = re.compile(r'^\s*"source": \[\s*$')
_SOURCE_ONE = re.compile(r'^\s*"source": "')


def check_json(folder: Path) -> list[dict[str, Any]]:
    """The default rules' findings on one repository folder, checked as one project
    (torchdoctor's JSON report). The folder is inside git-ignored benchmarks/.work:
    walk it anyway, with no excludes."""
    command = [sys.executable, "-m", "torchdoctor", "check", "--isolated", "--no-cache"]
    command += ["--no-respect-gitignore", "--exclude", "", "--format", "json", "--exit-zero"]
    done = subprocess.run([*command, str(folder)], capture_output=True, text=True, cwd=folder)
    if done.returncode != 0:
        raise RuntimeError(f"torchdoctor check failed on {folder.name}: {done.stderr[-300:]}")
    found: list[dict[str, Any]] = json.loads(done.stdout)
    return found


def notebook_lines(raw: str) -> dict[tuple[int, int], int]:
    """(cell number, line in cell) -> line of the .ipynb file's JSON text, both 1-based.

    Labels point at the raw file (what `git show` prints); the checker reports notebook
    findings by cell (numbered in the "cells" list, as torchdoctor does). nbformat writes
    one source line per JSON line, inside each cell's `"source": [` ... `]`.
    """
    mapping: dict[tuple[int, int], int] = {}
    cell = in_cell = 0
    inside = False
    for number, text in enumerate(raw.split("\n"), 1):
        if inside:
            inside = not text.strip().startswith("]")
            if inside:
                in_cell += 1
                mapping[(cell, in_cell)] = number
        elif _SOURCE_OPEN.match(text):
            cell, in_cell, inside = cell + 1, 0, True
        elif _SOURCE_ONE.match(text):
            cell += 1
            mapping[(cell, 1)] = number
    return mapping


def item_family(record: dict[str, Any]) -> str:
    return family(record["rules"][0]) if record["rules"] else NO_RULE


def _percent(part: int, whole: int) -> str:
    return f"{part} ({100 * part / whole:.0f}%)" if whole else "0"


def table(outcomes: list[Outcome], key: str, title: str) -> list[str]:
    """Markdown rows: one per value of `key` ("family" or "category"), then the total."""
    groups: dict[str, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        if outcome.status != NOT_BUILT:
            groups[getattr(outcome, key)].append(outcome)
    torchfix_ran = any(o.torchfix is not None for o in outcomes)
    head = (
        f"| {title} | items | right rule at a labelled line | another rule at a labelled line "
        "| missed |"
    )
    rows = [head + (" TorchFix at a labelled line | TorchFix missed |" if torchfix_ran else "")]
    rows.append("|---|---:|---:|---:|---:|" + ("---:|---:|" if torchfix_ran else ""))
    everything = [o for group in groups.values() for o in group]
    for name, group in [*sorted(groups.items()), ("**all**", everything)]:
        n = len(group)
        counts = collections.Counter(o.status for o in group)
        row = f"| {name} | {n} | {_percent(counts[RIGHT], n)} | {_percent(counts[OTHER], n)} "
        row += f"| {_percent(counts[MISSED], n)} |"
        if torchfix_ran:
            ran = [o for o in group if o.torchfix is not None]
            hit = sum(1 for o in ran if o.torchfix)
            row += f" {_percent(hit, len(ran))} | {_percent(len(ran) - hit, len(ran))} |"
        rows.append(row)
    return rows


def existing_rule_line(outcomes: list[Outcome], static_codes: frozenset[str]) -> str:
    """Recall over the items a rule of today could catch (its label names one)."""
    built = [o for o in outcomes if o.status != NOT_BUILT]
    ruled = [o for o in built if set(o.rules) & static_codes]
    right = sum(1 for o in ruled if o.status == RIGHT)
    sure = [o for o in ruled if not o.doubted]
    sure_right = sum(1 for o in sure if o.status == RIGHT)
    return (
        f"Of the {len(built)} items, {len(ruled)} name a rule that exists today (the others "
        "name a rule reserved for later or none); the right rule flags "
        f"{_percent(right, len(ruled))} of those {len(ruled)}; of the {len(sure)} of them "
        f"the label review does not doubt, {_percent(sure_right, len(sure))}."
    )


def misses(outcomes: list[Outcome], hand: dict[str, str]) -> list[str]:
    """One Markdown list line per item not flagged by its right rule."""
    lines = []
    for o in sorted(outcomes, key=lambda o: (o.family, o.category, o.id)):
        if o.status in (RIGHT, NOT_BUILT):
            continue
        note = f" Analysis: {hand[o.id]}" if o.id in hand else ""
        lines.append(
            f"- `{o.id}` ({o.category}, wants {', '.join(o.rules) or 'no rule'}): "
            f"{o.status}: {o.reason}." + note
        )
    return lines
