"""Strict precision review: the default rules on the clean corpus, judged finding by finding.

    .venv/bin/python benchmarks/precision.py [run [--corpus DIR] [--write]]
    .venv/bin/python benchmarks/precision.py pending --repo OWNER/NAME [--context 6] [--corpus DIR]
    .venv/bin/python benchmarks/precision.py tidy

run      checks every project of benchmarks/corpus.txt in the corpus folder (default
         /work/corpus, made by `benchmarks/corpus.py rebuild`) with the default rules
         (`torchdoctor check --isolated --no-cache`), gives each finding its verdict from
         benchmarks/verdicts.jsonl (see _verdicts.py) and prints: findings, verdicts per
         class, false alarms per 10k non-blank lines in test code and elsewhere, the share
         worth fixing, and the findings with no verdict yet. `--write` puts the report into
         benchmarks/README.md.
pending  prints one project's findings with no verdict yet, each with the code around it
         and the verdict line to complete, for the people judging.
tidy     checks benchmarks/verdicts.jsonl and rewrites it sorted (judges append lines).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings, run as a script
import _labels
import _verdicts
from _readme import write_section
from _verdicts import Finding

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VERDICT_FILE = HERE / "verdicts.jsonl"
DEFAULT_CORPUS = Path("/work/corpus")
PENDING_FILE = HERE / ".work" / "precision-pending.jsonl"
_NEWLINE = re.compile(r"\r\n|\r|\n")  # how torchdoctor splits a notebook cell


@dataclass
class Project:
    repo: str
    root: Path
    lines: collections.Counter[bool] = field(default_factory=collections.Counter)  # is_test ->
    findings: list[Finding] = field(default_factory=list)


def projects(corpus: Path) -> tuple[list[Project], list[str]]:
    """The corpus.txt projects present in `corpus`, and the repositories missing there."""
    present, missing = [], []
    for line in _labels.CORPUS_LIST.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            repo = line.split()[0]
            folder = corpus / repo.replace("/", "+", 1)
            if folder.is_dir():
                present.append(Project(repo, folder))
            else:
                missing.append(repo)
    return present, missing


def source_lines(path: Path, cell: int | None) -> list[str]:
    """The lines of a file, or of one cell of a notebook (numbered as torchdoctor does)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if cell is None:
        return text.split("\n")
    cells = json.loads(text).get("cells", [])
    source = cells[cell - 1].get("source", "") if 0 < cell <= len(cells) else ""
    return _NEWLINE.split("".join(source) if isinstance(source, list) else str(source))


def non_blank(path: Path) -> int:
    if path.suffix != ".ipynb":
        return sum(1 for ln in path.read_bytes().split(b"\n") if ln.strip())
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return 0
    total = 0
    for cell in cells if isinstance(cells, list) else []:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            source = cell.get("source", "")
            text = "".join(source) if isinstance(source, list) else str(source)
            total += sum(1 for ln in _NEWLINE.split(text) if ln.strip())
    return total


def check(project: Project) -> None:
    """Fill in the project's findings (default rules) and its non-blank line counts."""
    from torchdoctor.check.config import Settings
    from torchdoctor.check.discovery import discover

    for path in discover([project.root], Settings(root=project.root)):
        rel = path.relative_to(project.root).as_posix()
        project.lines[_verdicts.is_test(rel)] += non_blank(path)
    command = [sys.executable, "-m", "torchdoctor", "check", "--isolated", "--no-cache"]
    command += ["--format", "json", "--exit-zero", str(project.root)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=project.root)
    if done.returncode != 0:
        raise RuntimeError(f"torchdoctor check failed on {project.repo}: {done.stderr[-300:]}")
    cache: dict[tuple[str, int | None], list[str]] = {}
    for f in json.loads(done.stdout):
        if f["code"] in ("TD001", "TD900"):  # the engine's codes: not findings of a rule
            continue
        path = Path(f["filename"]).resolve()
        rel = path.relative_to(project.root.resolve()).as_posix()
        cell = f.get("cell")
        if (rel, cell) not in cache:
            cache[(rel, cell)] = source_lines(path, cell)
        lines = cache[(rel, cell)]
        text = lines[f["line"] - 1] if 0 < f["line"] <= len(lines) else ""
        project.findings.append(
            Finding(
                project.repo,
                rel,
                f["line"],
                f["code"],
                _verdicts.line_hash(text),
                cell,
                f["message"],
                f.get("column") or 0,
            )
        )


def read_verdicts(path: Path = VERDICT_FILE) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = _labels.read_jsonl(path)
    bad = [f"{path.name}:{n}: {'; '.join(p)}" for n, r in rows if (p := _verdicts.problems(r))]
    if bad:
        raise ValueError("bad verdict lines (run `precision.py tidy`): " + " | ".join(bad[:5]))
    return [record for _, record in rows]


# --------------------------------------------------------------------------- report


def _per10k(count: int, lines: int) -> str:
    return f"{count / lines * 1e4:.2f}" if lines else "-"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}% ({part}/{whole})" if whole else "-"


def report(done: list[Project], judged: dict[Finding, dict[str, Any]], stale: int) -> str:
    findings = [f for p in done for f in p.findings]
    lines = {flag: sum(p.lines[flag] for p in done) for flag in (True, False)}
    columns = {"test code": [True], "elsewhere": [False], "all": [True, False]}

    def count(kinds: list[bool], verdict: str | None) -> int:
        return sum(
            1
            for f in findings
            if _verdicts.is_test(f.file) in kinds
            and (judged[f]["verdict"] if f in judged else None) == verdict
        )

    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    rows = [
        f"Measured {today} UTC by `benchmarks/precision.py` on the {len(done)} repositories "
        "of `benchmarks/corpus.txt` (rebuilt with their tests by `benchmarks/corpus.py "
        "rebuild`): default rules, `torchdoctor check --isolated --no-cache`, every finding "
        "matched to its hand verdict in `benchmarks/verdicts.jsonl`. Test code: files under a "
        "`tests/` or `test/` folder, `test_*.py`, `*_test.py`, `conftest.py`. While findings "
        "have no verdict yet, the false-alarm rates count judged false alarms only (a lower "
        "bound) and the share worth fixing is of the judged findings.",
        "",
        "| | " + " | ".join(columns) + " |",
        "|---|---:|---:|---:|",
    ]

    def row(name: str, cell: Any) -> None:
        rows.append(f"| {name} | " + " | ".join(str(cell(k)) for k in columns.values()) + " |")

    row("non-blank lines", lambda k: f"{sum(lines[x] for x in k):,}")
    row("findings", lambda k: sum(1 for f in findings if _verdicts.is_test(f.file) in k))
    for verdict in _verdicts.VERDICTS:
        row(verdict, lambda k, v=verdict: count(k, v))
    row("no verdict yet", lambda k: count(k, None))
    row(
        "false alarms per 10k non-blank lines (goal <= 0.3)",
        lambda k: _per10k(count(k, "false-alarm"), sum(lines[x] for x in k)),
    )
    row(
        "share worth fixing (goal >= 80%)",
        lambda k: _share(count(k, "worth-fixing"), sum(count(k, v) for v in _verdicts.VERDICTS)),
    )
    rows += ["", *_breakdown(findings, judged, "code", "rule"), ""]
    rows += [*_breakdown(findings, judged, "repo", "repository", tuple(p.repo for p in done)), ""]
    pending = [f for f in findings if f not in judged]
    if stale:
        rows += [f"{stale} verdicts match no finding any more (the rule changed); kept.", ""]
    if pending:
        rows += [
            f"Findings with no verdict yet ({len(pending)}; `benchmarks/precision.py pending "
            "--repo OWNER/NAME` shows each in its code):",
            "",
        ]
        for f in pending[:40]:
            where = f"{f.file}:{f.line}" if f.cell is None else f"{f.file} cell {f.cell}:{f.line}"
            rows.append(f"- {f.repo} `{where}` {f.code}")
        if len(pending) > 40:
            rows.append(f"- ... and {len(pending) - 40} more")
    return "\n".join(rows)


def _breakdown(
    findings: list[Finding],
    judged: dict[Finding, dict[str, Any]],
    attr: str,
    title: str,
    names: tuple[str, ...] = (),
) -> list[str]:
    table: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in names}
    table = collections.defaultdict(collections.Counter, table)
    for f in findings:
        table[getattr(f, attr)][judged[f]["verdict"] if f in judged else "pending"] += 1
    out = [
        f"| {title} | findings | worth fixing | intended | false alarm | no verdict yet |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, counts in sorted(table.items()):
        out.append(
            f"| {name} | {sum(counts.values())} | {counts['worth-fixing']} "
            f"| {counts['intended']} | {counts['false-alarm']} | {counts['pending']} |"
        )
    return out


# --------------------------------------------------------------------------- commands


def run(corpus: Path, write: bool) -> int:
    done, missing = projects(corpus)
    if missing:
        print(
            f"precision: {len(missing)} projects are not in {corpus}: "
            f"{', '.join(missing)}; run `benchmarks/corpus.py rebuild` first",
            file=sys.stderr,
        )
        return 1
    for project in done:
        check(project)
        print(f"  {project.repo}: {len(project.findings)} findings", flush=True)
    findings = [f for p in done for f in p.findings]
    judged, stale = _verdicts.match(findings, read_verdicts())
    text = report(done, judged, len(stale))
    print(text)
    PENDING_FILE.parent.mkdir(parents=True, exist_ok=True)
    pending = "".join(_verdicts.template(f) + "\n" for f in findings if f not in judged)
    PENDING_FILE.write_text(pending, encoding="utf-8")
    if write:
        write_section("precision-review", text, heading="Strict precision review")
    return 0


def pending(corpus: Path, repo: str, context: int) -> int:
    found = [p for p in projects(corpus)[0] if p.repo.lower() == repo.lower()]
    if not found:
        print(f"precision pending: {repo} is not a corpus project in {corpus}", file=sys.stderr)
        return 2
    project = found[0]
    check(project)
    judged, _ = _verdicts.match(project.findings, read_verdicts())
    todo = [f for f in project.findings if f not in judged]
    for f in sorted(todo, key=lambda f: (f.file, f.cell or 0, f.line, f.code)):
        lines = source_lines(project.root / f.file, f.cell)
        where = f"{f.file}:{f.line}" if f.cell is None else f"{f.file} cell {f.cell} line {f.line}"
        print(f"== {f.repo} {where} {f.code}: {f.message}")
        for number in range(max(1, f.line - context), min(len(lines), f.line + context) + 1):
            mark = ">" if number == f.line else " "
            print(f"{mark}{number:5} | {lines[number - 1]}")
        print(_verdicts.template(f) + "\n")
    print(f"{len(todo)} of {len(project.findings)} findings of {project.repo} have no verdict")
    return 0


def tidy(path: Path = VERDICT_FILE) -> int:
    rows = _labels.read_jsonl(path) if path.exists() else []
    bad = [f"{path.name}:{n}: {'; '.join(p)}" for n, r in rows if (p := _verdicts.problems(r))]
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for _, record in rows:
        if _verdicts.problems(record):
            continue
        key = (*_verdicts.sort_key(record), record["hash"])
        if key in seen and seen[key]["verdict"] != record["verdict"]:
            bad.append(f"two different verdicts for {key}")
        seen[key] = record
    if bad:
        print("precision tidy: nothing rewritten:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    records = sorted(seen.values(), key=_verdicts.sort_key)
    _labels.write_jsonl(path, records)
    counts = collections.Counter(r["verdict"] for r in records)
    print(
        f"{len(records)} verdicts in {path.name}: "
        + ", ".join(f"{k} {n}" for k, n in counts.items())
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="the corpus folder")
    sub = parser.add_subparsers(dest="command")
    run_cmd = sub.add_parser("run", parents=[where], help="the report (the default command)")
    run_cmd.add_argument("--write", action="store_true", help="write benchmarks/README.md")
    pending_cmd = sub.add_parser(
        "pending", parents=[where], help="one project's unjudged findings in context"
    )
    pending_cmd.add_argument("--repo", required=True)
    pending_cmd.add_argument("--context", type=int, default=6)
    sub.add_parser("tidy", help="check and sort benchmarks/verdicts.jsonl")
    args = parser.parse_args(argv)
    try:
        if args.command == "pending":
            return pending(args.corpus, args.repo, args.context)
        if args.command == "tidy":
            return tidy()
        corpus = getattr(args, "corpus", DEFAULT_CORPUS)
        return run(corpus, getattr(args, "write", False))
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"precision: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
