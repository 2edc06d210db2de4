"""The real-bug corpus (issue 16): merge its labels, rebuild its files, measure recall.

    .venv/bin/python benchmarks/bugs.py merge [--staging DIR]
    .venv/bin/python benchmarks/bugs.py rebuild [--mirrors DIR] [--context]
    .venv/bin/python benchmarks/bugs.py recall [--write] [--no-torchfix] [--context]
    .venv/bin/python benchmarks/bugs.py bench      (what `make bench` runs: rebuild and
                                                   recall --write, without and with --context)

merge    validates the collectors' records (DIR/*.jsonl, default /work/bugs-staging) and
         merges them into benchmarks/bugs.jsonl (one record per id, sorted; a newer record
         of an id replaces the older) and benchmarks/bugs-skipped.jsonl; the collectors'
         procedure files (DIR/*-procedure.md) go into benchmarks/bugs-procedure.md.
rebuild  writes each item's files, taken at its parent commit from the fetched mirror
         (MIRRORS/owner+name/repo), into benchmarks/.work/bugs/<id>/<path>; lists the
         repositories still to fetch; refuses an item whose labelled line no longer matches
         its sha1 (exit 1), so the corpus cannot rot. With --context, each item folder
         (benchmarks/.work/bugs-context/<id>/) holds the whole repository at the parent
         commit instead (its Python files, notebooks and packaging files), as a user checks
         a project: what the analysis follows across files is then there to follow.
recall   runs `torchdoctor check --isolated --no-cache --format json` (default rules) on each
         rebuilt item folder as one project, and TorchFix (`--select ALL`, from
         benchmarks/.venv) on the same files; prints the tables per rule family and per
         category and the misses; `--write` puts them into benchmarks/README.md. With
         --context it checks the repository folders (recall counts labelled lines only).

Third-party files are never committed: benchmarks/.work is ignored by git.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings, run as a script
import _labels
import _mirror
import _recall
from _readme import atomic_write, write_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / ".work" / "bugs"
OUT_CONTEXT = HERE / ".work" / "bugs-context"  # the whole repository per item
STAGING = Path("/work/bugs-staging")
TORCHFIX = HERE / ".venv" / "bin" / "torchfix"
REPORT = HERE / ".work" / "bugs-recall.json"
CACHE = HERE / ".work" / "bugs-recall-cache.json"  # outcomes per item, reused while unchanged
CONTEXT_CODE = (".py", ".pyi", ".ipynb")
CONTEXT_PACKAGING = ("setup.cfg", "pyproject.toml")  # read by the project facts
PROCEDURE = HERE / "bugs-procedure.md"
PROCEDURE_HEAD = (
    "# How the real bugs were collected\n\n"
    "The procedure each collector wrote down before collecting (issue 16), copied by "
    "`benchmarks/bugs.py merge` from the staging folder. Summary: benchmarks/README.md.\n"
)


# --------------------------------------------------------------------------- merge


def merge(staging: Path, bugs: Path = _labels.BUGS, skipped: Path = _labels.SKIPPED) -> int:
    if not staging.is_dir():
        print(f"bugs merge: {staging} is not a folder", file=sys.stderr)
        return 2
    reserved = _reserved()
    clean = _labels.repo_list(_labels.CORPUS_LIST)
    known = _labels.known_codes()
    merged: dict[str, dict[str, Any]] = {}
    if bugs.exists():
        merged = {record["id"]: record for _, record in _labels.read_jsonl(bugs)}
    rejected = 0
    for path in sorted(staging.glob("*.jsonl")):
        if path.name.endswith("-skipped.jsonl"):
            continue
        for number, record in _safe_rows(path):
            found = _labels.problems(record, known, reserved)
            if not found and record["repo"].lower() in clean:
                found = [f"repo {record['repo']} is in the clean corpus (benchmarks/corpus.txt)"]
            if found:
                rejected += 1
                print(f"{path.name}:{number}: rejected: {'; '.join(found)}", file=sys.stderr)
                continue
            merged[record["id"]] = record
    _labels.write_jsonl(bugs, [merged[key] for key in sorted(merged)])

    seen: set[str] = set()
    skips = []
    old = _labels.read_jsonl(skipped) if skipped.exists() else []
    new = [row for p in sorted(staging.glob("*-skipped.jsonl")) for row in _safe_rows(p)]
    for _, row in [*old, *new]:
        key = json.dumps(row, sort_keys=True)
        if key not in seen:
            seen.add(key)
            skips.append(row)
    _labels.write_jsonl(skipped, skips)
    procedures = sorted(staging.glob("*-procedure.md"))
    if procedures:  # the collectors' own words, kept beside the labels they produced
        parts = [p.read_text(encoding="utf-8").strip() + "\n" for p in procedures]
        atomic_write(PROCEDURE, PROCEDURE_HEAD + "\n" + "\n".join(parts))
    repos = {r["repo"].lower() for r in merged.values()}
    print(
        f"{len(merged)} bugs from {len(repos)} repositories in {_rel(bugs)}; "
        f"{len(skips)} skipped candidates in {_rel(skipped)}; {rejected} records rejected"
    )
    return 1 if rejected else 0


def _safe_rows(path: Path) -> list[tuple[int, Any]]:
    """Rows of a staging file; a line being appended right now is skipped with a warning."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append((number, json.loads(line)))
            except ValueError:
                print(f"{path.name}:{number}: not JSON, left out", file=sys.stderr)
    return rows


def _reserved() -> frozenset[str]:
    found = _labels.reserved_list()
    if found is not None:
        return _labels.repo_list(found)
    places = " or ".join(str(p) for p in _labels.RESERVED_PLACES)
    print(f"warning: no {places}: reserved repositories unchecked", file=sys.stderr)
    return frozenset()


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- rebuild


class Refused(Exception):
    """An item that must not be rebuilt: its labels no longer match the mirror's file."""


def context_files(git_dir: Path, commit: str) -> list[tuple[str, str]]:
    """(path, blob) of the repository's code and packaging files at `commit`."""
    everything = _mirror.tree_files(git_dir, commit, (*CONTEXT_CODE, ".cfg", ".toml", ".txt"))

    def wanted(path: str) -> bool:
        name = path.rsplit("/", 1)[-1]
        requirements = name.startswith("requirements") and name.endswith(".txt")
        return path.endswith(CONTEXT_CODE) or name in CONTEXT_PACKAGING or requirements

    return [(path, blob) for path, blob in everything if wanted(path)]


def rebuild_item(record: dict[str, Any], git_dir: Path, out: Path, context: bool = False) -> int:
    """Write one item's files into out/<id>; the number of files. Raises Refused.

    With `context`, the rest of the repository at the parent commit goes beside them.
    """
    target = out / record["id"]
    staged = out / (record["id"] + ".part")
    shutil.rmtree(staged, ignore_errors=True)
    try:
        for entry in record["files"]:
            try:
                data = _mirror.show(git_dir, record["parent_commit"], entry["path"])
            except _mirror.MirrorError as exc:
                raise Refused(str(exc)) from None
            lines = _mirror.lines_of(data)
            for label in entry["lines"]:
                number = label["line"]
                text = lines[number - 1] if number <= len(lines) else None
                if text is None or _mirror.line_sha1(text) != label["sha1"]:
                    shown = "past the end of the file" if text is None else repr(text.strip())
                    raise Refused(
                        f"{entry['path']}:{number} no longer matches its sha1 "
                        f"(the line is {shown[:80]})"
                    )
            destination = staged / entry["path"]
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(data)
        if context:
            labelled = {entry["path"] for entry in record["files"]}
            rest = [
                f for f in context_files(git_dir, record["parent_commit"]) if f[0] not in labelled
            ]
            for (path, _), content in zip(
                rest, _mirror.blobs(git_dir, [b for _, b in rest]), strict=True
            ):
                destination = staged / path
                if content is None or not _labels.safe_path(path):
                    continue  # a blob the snapshot left out, or a path that escapes
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(content)
    except Refused:
        shutil.rmtree(staged, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)  # never score a stale copy
        raise
    _mirror.replace_dir(target, staged)
    return len(record["files"])


def rebuild(
    mirrors: Path, out: Path = OUT, bugs: Path = _labels.BUGS, context: bool = False
) -> int:
    records = [record for _, record in _labels.read_jsonl(bugs)]
    out.mkdir(parents=True, exist_ok=True)
    to_fetch: collections.Counter[str] = collections.Counter()
    built = files = 0
    refused = []
    for record in records:
        if not _labels.safe_path(record["id"]) or "/" in record["id"]:
            refused.append(f"{record['id']}: the id is not a plain folder name")
            continue
        git_dir = _mirror.mirror_of(record["repo"], mirrors)
        if git_dir is None:
            to_fetch[record["repo"]] += 1
            shutil.rmtree(out / record["id"], ignore_errors=True)
            continue
        try:
            files += rebuild_item(record, git_dir, out, context)
            built += 1
        except Refused as exc:
            refused.append(f"{record['id']}: {exc}")
    shown = f"{files} labelled files" + (", with their repositories" if context else "")
    print(f"rebuilt {built} of {len(records)} items ({shown}) into {_rel(out)}")
    if to_fetch:
        print(
            f"{len(to_fetch)} repositories still to fetch ({sum(to_fetch.values())} items); "
            f"fetch them into {mirrors}/owner+name/repo (the search tool's fetch, or "
            "git clone --mirror) and run again:"
        )
        for repo, count in sorted(to_fetch.items()):
            print(f"  {repo} ({count} item{'s' * (count > 1)})")
    for problem in refused:
        print(f"refused: {problem}", file=sys.stderr)
    if refused:
        print(
            f"bugs rebuild: {len(refused)} items refused: their labels no longer match the "
            "files they name (fix the label or the mirror)",
            file=sys.stderr,
        )
        return 1
    return 0


# --------------------------------------------------------------------------- recall


def torchdoctor_findings(folder: Path) -> list[_recall.Finding]:
    """The default rules on one item folder, checked as one project."""
    found = []
    notebooks: dict[str, dict[tuple[int, int], int]] = {}
    for f in _recall.check_json(folder):
        path = Path(f["filename"]).resolve().relative_to(folder.resolve()).as_posix()
        line = f["line"]
        if f.get("cell") is not None:  # a notebook: back to the line of its JSON text
            if path not in notebooks:
                raw = (folder / path).read_text(encoding="utf-8", errors="replace")
                notebooks[path] = _recall.notebook_lines(raw)
            line = notebooks[path].get((f["cell"], line), 0)
        found.append(_recall.Finding(path, line, f["code"]))
    return found


_TORCHFIX_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>TOR\d+)", re.M)


def torchfix_findings(folder: Path, paths: list[str]) -> list[_recall.Finding]:
    done = subprocess.run(
        [str(TORCHFIX), "--select", "ALL", *paths], capture_output=True, text=True, cwd=folder
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"torchfix failed on {folder.name}: {done.stderr[-300:]}")
    return [
        _recall.Finding(Path(m["path"]).as_posix(), int(m["line"]), m["code"])
        for m in _TORCHFIX_LINE.finditer(done.stdout)
    ]


def static_codes() -> frozenset[str]:
    from torchdoctor.catalog import catalog

    return frozenset(code for code, info in catalog().items() if info.kind == "static")


def hand_reasons(path: Path = _labels.MISSES) -> dict[str, str]:
    """id -> the analysis team's reason for a miss (benchmarks/bugs-misses.tsv)."""
    reasons = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split("\t", 1)
            if len(parts) == 2 and parts[0] != "id" and not line.startswith("#"):
                reasons[parts[0].strip()] = parts[1].strip()
    return reasons


def score_item(
    record: dict[str, Any], out: Path, use_torchfix: bool, codes: frozenset[str]
) -> _recall.Outcome:
    folder = out / record["id"]
    outcome = _recall.Outcome(
        record["id"],
        record["category"],
        _recall.item_family(record),
        list(record["rules"]),
        _recall.NOT_BUILT,
    )
    if not folder.is_dir():
        return outcome
    spans = _recall.labelled_spans(folder, record)
    found = torchdoctor_findings(folder)
    outcome.status, outcome.reason = _recall.score(record, found, spans, codes)
    if use_torchfix:
        # TorchFix reads .py files only: on a notebook it finds nothing
        paths = [e["path"] for e in record["files"] if e["path"].endswith(".py")]
        found = torchfix_findings(folder, paths) if paths else []
        theirs = [f for f in found if _recall.at_label(f, spans)]
        outcome.torchfix = bool(theirs)
        outcome.torchfix_codes = sorted({f.code for f in theirs})
    return outcome


def checker_fingerprint() -> str | None:
    """The committed tree of src/ (None when src/ has uncommitted changes: no caching)."""
    clean = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src"], cwd=ROOT)
    tree = subprocess.run(
        ["git", "rev-parse", "HEAD:src"], cwd=ROOT, capture_output=True, text=True
    )
    return tree.stdout.strip() if clean.returncode == 0 and tree.returncode == 0 else None


def score_all(
    records: list[dict[str, Any]],
    out: Path,
    use_torchfix: bool,
    jobs: int = 2,
    cache: Path | None = None,
) -> list[_recall.Outcome]:
    """Every item scored; `jobs` items at a time (each item is its own processes).

    With `cache`, an item whose record, rebuilt files and checker (the committed src/
    tree) are unchanged since the last run keeps its outcome instead of being re-run.
    """
    codes = static_codes()
    fingerprint = checker_fingerprint() if cache is not None else None
    known: dict[str, Any] = {}
    if cache is not None and fingerprint and cache.exists():
        known = json.loads(cache.read_text(encoding="utf-8"))

    def key(record: dict[str, Any]) -> str:
        folder = out / record["id"]
        digest = hashlib.sha1(
            json.dumps([record, fingerprint, use_torchfix], sort_keys=True).encode()
        )
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
        return digest.hexdigest()

    fresh: dict[str, Any] = {}
    lock = threading.Lock()

    def one(record: dict[str, Any]) -> _recall.Outcome:
        if not (out / record["id"]).is_dir():
            return score_item(record, out, use_torchfix, codes)
        item_key = key(record)
        entry = known.get(record["id"])
        if fingerprint and entry and entry["key"] == item_key:
            outcome = _recall.Outcome(**entry["outcome"])
        else:
            outcome = score_item(record, out, use_torchfix, codes)
        outcome.doubted = bool(record.get("review_doubt"))
        if cache is not None and fingerprint:
            with lock:  # saved as it goes: a stopped run keeps what it measured
                fresh[record["id"]] = {"key": item_key, "outcome": outcome.__dict__}
                cache.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(cache, json.dumps({**known, **fresh}))
        return outcome

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, records))


def report(outcomes: list[_recall.Outcome], torchfix_note: str, context: bool = False) -> str:
    built = [o for o in outcomes if o.status != _recall.NOT_BUILT]
    repos = {o.id.split("@", 1)[0] for o in built}
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    missing = len(outcomes) - len(built)
    lines = [
        f"Measured {today} UTC by `benchmarks/bugs.py recall` on {len(built)} of "
        f"{len(outcomes)} labelled bugs from {len(repos)} repositories"
        + (
            f" ({missing} not rebuilt: their repositories are not fetched yet, see "
            "`bugs.py rebuild`). "
            if missing
            else ". "
        )
        + "torchdoctor: default rules, `check --isolated --no-cache`, "
        + (
            "each item's whole repository at the parent commit (`rebuild --context`) checked "
            "as one project, findings counted at the labelled lines only. "
            if context
            else "each item folder (the labelled files alone) checked as one project. "
        )
        + torchfix_note,
        "",
        _recall.existing_rule_line(outcomes, static_codes()),
        "",
        *_recall.table(outcomes, "family", "rule family (of the label's first rule)"),
        "",
        *_recall.table(outcomes, "category", "category"),
        "",
        "Items not flagged by their right rule at a labelled line (automatic reason; "
        "`Analysis:` is the hand-written reason from `benchmarks/bugs-misses.tsv`):",
        "",
        *_recall.misses(outcomes, hand_reasons()),
    ]
    return "\n".join(lines)


def recall(out: Path, write: bool, use_torchfix: bool, context: bool = False) -> int:
    records = [record for _, record in _labels.read_jsonl(_labels.BUGS)]
    note = "TorchFix: `torchfix --select ALL` on the same files, any of its codes counts."
    if context:  # TorchFix reads one file at a time: the file-only run already has it
        use_torchfix = False
        note = "TorchFix: see the run on the labelled files alone (it reads one file at a time)."
    elif use_torchfix and not TORCHFIX.exists():
        use_torchfix = False
        note = f"TorchFix: not run ({_rel(TORCHFIX)} is missing; `make bench` installs it)."
    elif not use_torchfix:
        note = "TorchFix: not run (--no-torchfix)."
    try:
        cache = CACHE.with_name("bugs-context-cache.json") if context else CACHE
        outcomes = score_all(records, out, use_torchfix, cache=cache)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"bugs recall: {exc}", file=sys.stderr)
        return 1
    text = report(outcomes, note, context)
    print(text)
    saved = REPORT.with_name("bugs-context-recall.json") if context else REPORT
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps([o.__dict__ for o in outcomes], indent=1), encoding="utf-8")
    if write and context:
        heading = "Real bugs: recall with the repository as context"
        write_section("bugs-recall-context", text, heading=heading)
    elif write:
        write_section("bugs-recall", text, heading="Real bugs: recall")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    merge_cmd = sub.add_parser("merge", help="validate and merge the collectors' records")
    merge_cmd.add_argument("--staging", type=Path, default=STAGING)
    rebuild_cmd = sub.add_parser("rebuild", help="recreate the buggy files from the mirrors")
    rebuild_cmd.add_argument("--mirrors", type=Path, default=_mirror.MIRRORS)
    rebuild_cmd.add_argument(
        "--context", action="store_true", help="the whole repository per item, beside the labels"
    )
    recall_cmd = sub.add_parser("recall", help="torchdoctor and TorchFix on the rebuilt items")
    recall_cmd.add_argument("--write", action="store_true", help="write benchmarks/README.md")
    recall_cmd.add_argument("--no-torchfix", action="store_true")
    recall_cmd.add_argument(
        "--context", action="store_true", help="check each item's whole repository"
    )
    sub.add_parser("bench", help="`make bench`: rebuild, then recall --write (both settings)")
    args = parser.parse_args(argv)
    try:
        if args.command == "merge":
            return merge(args.staging)
        if args.command == "rebuild":
            out = OUT_CONTEXT if args.context else OUT
            return rebuild(args.mirrors, out, context=args.context)
        if args.command == "bench":  # a refused item fails the step; the others are measured
            rebuilt = rebuild(_mirror.MIRRORS)
            rebuilt = max(rebuilt, rebuild(_mirror.MIRRORS, OUT_CONTEXT, context=True))
            alone = recall(OUT, write=True, use_torchfix=True)
            return max(rebuilt, alone, recall(OUT_CONTEXT, True, False, context=True))
        if args.context:
            return recall(OUT_CONTEXT, args.write, use_torchfix=False, context=True)
        return recall(OUT, args.write, not args.no_torchfix)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bugs {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
