"""benchmarks/bugs.py rebuild and recall, on small git repositories made here."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the benchmark helpers import their siblings
import _recall  # noqa: E402

_spec = importlib.util.spec_from_file_location("benchmarks_bugs", BENCHMARKS / "bugs.py")
assert _spec is not None and _spec.loader is not None
bugs = importlib.util.module_from_spec(_spec)
sys.modules["benchmarks_bugs"] = bugs
_spec.loader.exec_module(bugs)

TRAIN = """import torch


def evaluate(model, loader):
    for x, y in loader:
        out = model(x.cuda())
        print(out.detach().numpy())


def build():
    net = torch.nn.Linear(
        2, 2
    )
    return net.cuda()


GPU = torch.cuda.is_available()  # the script is meant to run without a GPU too
"""


def _sha1(text: str) -> str:
    return hashlib.sha1(text.strip().encode()).hexdigest()


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def mirrors(tmp_path: Path) -> Path:
    """A mirror folder holding octo/demo: a buggy commit, then its fix."""
    repo = tmp_path / "mirrors" / "octo+demo" / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "src").mkdir()
    (repo / "src" / "train.py").write_text(TRAIN)
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "bug")
    (repo / "src" / "train.py").write_text(TRAIN.replace("x.cuda()", "x.to(device)"))
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "fix")
    return tmp_path / "mirrors"


def _record(mirrors: Path, line: int, rules: list[str], sha1: str | None = None) -> dict[str, Any]:
    repo = mirrors / "octo+demo" / "repo"
    fix, parent = _git(repo, "rev-parse", "HEAD"), _git(repo, "rev-parse", "HEAD^")
    text = TRAIN.split("\n")[line - 1]
    return {
        "id": f"octo+demo@{fix[:12]}-{line}{''.join(rules)}",
        "repo": "octo/demo",
        "fix_commit": fix,
        "parent_commit": parent,
        "files": [{"path": "src/train.py", "lines": [{"line": line, "sha1": sha1 or _sha1(text)}]}],
        "category": "hardcoded-cuda",
        "rules": rules,
    }


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_rebuild_writes_the_parent_version_of_each_file(mirrors: Path, tmp_path: Path) -> None:
    record = _record(mirrors, 6, ["TD101"])
    out = tmp_path / "out"
    assert bugs.rebuild(mirrors, out, _write(tmp_path / "bugs.jsonl", [record])) == 0
    assert (out / record["id"] / "src" / "train.py").read_text() == TRAIN  # not the fix


def test_rebuild_with_context_writes_the_rest_of_the_repository(
    mirrors: Path, tmp_path: Path
) -> None:
    record = _record(mirrors, 6, ["TD101"])  # its parent: before the files below
    repo = mirrors / "octo+demo" / "repo"
    (repo / "src" / "model.py").write_text("import torch\n")
    (repo / "setup.cfg").write_text("[metadata]\n")
    (repo / "requirements-dev.txt").write_text("torch\n")
    (repo / "notes.txt").write_text("not code\n")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "more")
    out = tmp_path / "out"
    bugs_file = _write(tmp_path / "bugs.jsonl", [record])
    assert bugs.rebuild(mirrors, out, bugs_file, context=True) == 0
    assert sorted(p.name for p in (out / record["id"]).rglob("*") if p.is_file()) == ["train.py"]
    # an item whose parent has them: the labelled line of the fixed file still matches
    later = {**record, "id": "octo+demo@later", "parent_commit": _git(repo, "rev-parse", "HEAD")}
    later["files"] = [{"path": "src/train.py", "lines": [{"line": 3, "sha1": _sha1("")}]}]
    assert bugs.rebuild(mirrors, out, _write(tmp_path / "b2.jsonl", [later]), context=True) == 0
    written = sorted(
        p.relative_to(out / "octo+demo@later").as_posix()
        for p in (out / "octo+demo@later").rglob("*")
        if p.is_file()
    )
    assert written == ["requirements-dev.txt", "setup.cfg", "src/model.py", "src/train.py"]
    assert (out / "octo+demo@later" / "src" / "train.py").read_text() != TRAIN  # the fix


def test_rebuild_refuses_an_item_whose_line_no_longer_matches_its_sha1(
    mirrors: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _record(mirrors, 6, ["TD101"])
    rotten = _record(mirrors, 7, ["TD106"], sha1=_sha1("print(out.numpy())"))
    out = tmp_path / "out"
    (out / rotten["id"]).mkdir(parents=True)  # a copy from an earlier run must not survive
    code = bugs.rebuild(mirrors, out, _write(tmp_path / "bugs.jsonl", [good, rotten]))
    assert code == 1
    err = capsys.readouterr().err
    assert f"refused: {rotten['id']}: src/train.py:7 no longer matches its sha1" in err
    assert (out / good["id"] / "src" / "train.py").exists()
    assert not (out / rotten["id"]).exists()


def test_rebuild_refuses_a_line_past_the_end_and_a_missing_file(
    mirrors: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    past = _record(mirrors, 6, ["TD101"])
    past["files"][0]["lines"][0]["line"] = 400
    gone = _record(mirrors, 6, ["TD101"])
    gone["id"] += "-gone"
    gone["files"][0]["path"] = "src/absent.py"
    code = bugs.rebuild(mirrors, tmp_path / "out", _write(tmp_path / "b.jsonl", [past, gone]))
    err = capsys.readouterr().err
    assert code == 1
    assert "src/train.py:400 no longer matches its sha1 (the line is past the end" in err
    assert "src/absent.py does not exist at commit" in err


def test_rebuild_lists_repositories_still_to_fetch(
    mirrors: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = _record(mirrors, 6, ["TD101"])
    other = {**record, "id": "someone+else@0123456789ab", "repo": "someone/else"}
    code = bugs.rebuild(mirrors, tmp_path / "out", _write(tmp_path / "b.jsonl", [record, other]))
    out = capsys.readouterr().out
    assert code == 0
    assert "rebuilt 1 of 2 items" in out
    assert "1 repositories still to fetch" in out and "  someone/else (1 item)" in out


def test_recall_scores_a_real_check_run(mirrors: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    right = _record(mirrors, 6, ["TD101"])  # `.cuda()` in the loop: TD101 fires there
    other = _record(mirrors, 6, ["TD112"])  # same line, but another rule is wanted
    multi = _record(mirrors, 11, ["TD101"])  # `net = ...(` spans 11-13: TD101 fires at 14
    not_yet = _record(mirrors, 7, ["TD210"])  # a runtime-only code: no static rule checks it
    records = [right, other, multi, not_yet]
    assert bugs.rebuild(mirrors, out, _write(tmp_path / "b.jsonl", records)) == 0
    outcomes = {o.id: o for o in bugs.score_all(records, out, use_torchfix=False)}
    assert outcomes[right["id"]].status == _recall.RIGHT
    assert outcomes[other["id"]].status == _recall.OTHER
    assert outcomes[other["id"]].reason == "only another rule at the labelled line (TD101)"
    assert outcomes[multi["id"]].status == _recall.MISSED
    assert outcomes[multi["id"]].reason == "right rule fired elsewhere (line 6, line 14)"
    assert outcomes[not_yet["id"]].reason == "no rule for this yet (TD210)"
    assert outcomes[right["id"]].family == "TD1xx device"


def test_score_counts_a_finding_inside_the_labelled_statement_only() -> None:
    source = "x = f(\n    a,\n    b)\nfor i in y:\n    g(i)\n"
    assert _recall.statement_span(source, 1) == (1, 3)
    assert _recall.statement_span(source, 4) == (4, 4)  # a loop: its header only
    spans = {"a.py": [(1, 3)]}
    record = {"rules": ["TD101"], "files": [{"path": "a.py", "lines": [{"line": 1}]}]}
    codes = frozenset({"TD101", "TD402"})
    inside = [_recall.Finding("a.py", 2, "TD101")]
    after = [_recall.Finding("a.py", 4, "TD101"), _recall.Finding("a.py", 5, "TD402")]
    assert _recall.score(record, inside, spans, codes) == (_recall.RIGHT, "")
    assert _recall.score(record, after, spans, codes) == (
        _recall.MISSED,
        "right rule fired elsewhere (line 4)",
    )
    assert _recall.score(record, [], spans, codes) == (_recall.MISSED, "no finding in the file")
    quiet = [_recall.Finding("a.py", 5, "TD402")]
    assert _recall.score(record, quiet, spans, codes)[1] == (
        "right rule silent; other findings: TD402 line 5"
    )
    unruled = {**record, "rules": []}
    assert _recall.score(unruled, [], spans, codes)[1] == (
        "no existing or reserved rule covers this bug"
    )


def test_notebook_cells_map_back_to_the_lines_of_the_json_text() -> None:
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# title\n", "text"]},
            {"cell_type": "code", "metadata": {}, "outputs": [], "source": ["a = 1\n", "b = 2"]},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    raw = json.dumps(notebook, indent=1)
    mapping = _recall.notebook_lines(raw)
    lines = raw.split("\n")
    assert lines[mapping[(2, 2)] - 1].strip() == '"b = 2"'
    assert lines[mapping[(1, 1)] - 1].strip() == '"# title\\n",'


def test_the_tables_count_each_outcome_once_per_group() -> None:
    outcomes = [
        _recall.Outcome("a", "hardcoded-cuda", "TD1xx device", ["TD101"], _recall.RIGHT, "", True),
        _recall.Outcome(
            "b", "hardcoded-cuda", "TD1xx device", ["TD101"], _recall.MISSED, "", False
        ),
        _recall.Outcome(
            "e", "hardcoded-cuda", "TD1xx device", ["TD101"], _recall.MISSED, doubted=True
        ),
        _recall.Outcome(
            "c", "zero-grad", "TD2xx training loop", ["TD204"], _recall.OTHER, "", False
        ),
        _recall.Outcome("d", "zero-grad", "TD2xx training loop", ["TD204"], _recall.NOT_BUILT),
    ]
    rows = _recall.table(outcomes, "family", "family")
    assert "| TD1xx device | 3 | 1 (33%) | 0 (0%) | 2 (67%) | 1 (50%) | 1 (50%) |" in rows
    assert "| TD2xx training loop | 1 | 0 (0%) | 1 (100%) | 0 (0%) | 0 (0%) | 1 (100%) |" in rows
    assert "| **all** | 4 | 1 (25%) | 1 (25%) | 2 (50%) | 1 (33%) | 2 (67%) |" in rows
    line = _recall.existing_rule_line(outcomes, frozenset({"TD101"}))
    assert "4 items, 3 name a rule that exists today" in line
    assert (
        "flags 1 (33%) of those 3; of the 2 of them the label review does not doubt, 1 (50%)"
        in line
    )
    listed = _recall.misses(outcomes, {"b": "the loop is in another file"})
    assert len(listed) == 3 and listed[0].startswith("- `b` (hardcoded-cuda, wants TD101): missed")
    assert listed[0].endswith("Analysis: the loop is in another file")


def test_recall_reuses_an_unchanged_item_and_rescores_a_changed_one(
    mirrors: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache.json"
    record = _record(mirrors, 6, ["TD101"])
    assert bugs.rebuild(mirrors, out, _write(tmp_path / "b.jsonl", [record])) == 0
    monkeypatch.setattr(bugs, "checker_fingerprint", lambda: "tree-of-src")
    first = bugs.score_all([record], out, use_torchfix=False, cache=cache)
    assert first[0].status == _recall.RIGHT

    def no_check(folder: Path) -> list[_recall.Finding]:
        raise AssertionError("an unchanged item was checked again")

    monkeypatch.setattr(bugs, "torchdoctor_findings", no_check)
    again = bugs.score_all([record], out, use_torchfix=False, cache=cache)
    assert again[0] == first[0]
    source = out / record["id"] / "src" / "train.py"
    source.write_text(source.read_text() + "\n# changed\n")
    monkeypatch.setattr(bugs, "torchdoctor_findings", lambda folder: [])
    changed = bugs.score_all([record], out, use_torchfix=False, cache=cache)
    assert changed[0].status == _recall.MISSED  # checked again: the stub finds nothing
