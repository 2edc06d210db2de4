"""The real-bug label file benchmarks/bugs.jsonl, and the checks that guard it."""

from __future__ import annotations

import copy
import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the benchmark helpers import their siblings
import _labels  # noqa: E402

RECORDS = [record for _, record in _labels.read_jsonl(_labels.BUGS)]
KNOWN = _labels.known_codes()


def test_every_record_has_the_required_fields_types_and_known_values() -> None:
    bad = {r.get("id", "?"): found for r in RECORDS if (found := _labels.problems(r, KNOWN))}
    assert not bad


def test_commits_are_40_hex_and_ids_are_unique() -> None:
    for record in RECORDS:
        assert re.fullmatch(r"[0-9a-f]{40}", record["fix_commit"]), record["id"]
        assert re.fullmatch(r"[0-9a-f]{40}", record["parent_commit"]), record["id"]
        assert record["fix_commit"] != record["parent_commit"], record["id"]
    ids = [record["id"] for record in RECORDS]
    assert len(ids) == len(set(ids))


def test_categories_and_rule_codes_come_from_the_fixed_lists() -> None:
    for record in RECORDS:
        assert record["category"] in _labels.CATEGORIES, record["id"]
        for code in record["rules"]:
            assert code in KNOWN, f"{record['id']}: {code}"


def test_every_labelled_line_has_a_sha1() -> None:
    for record in RECORDS:
        labels = [item for entry in record["files"] for item in entry["lines"]]
        assert labels, record["id"]
        for item in labels:
            assert re.fullmatch(r"[0-9a-f]{40}", item["sha1"]), record["id"]
            assert isinstance(item["line"], int) and item["line"] >= 1, record["id"]


def test_no_item_comes_from_a_reserved_repository() -> None:
    reserved = _labels.reserved_list()
    if reserved is None:
        pytest.skip("shared/reserved-repos.txt is not beside this checkout: nothing to check")
    names = _labels.repo_list(reserved)
    assert len(names) > 50  # the real list, not an empty file
    taken = sorted({r["repo"] for r in RECORDS if r["repo"].lower() in names})
    assert not taken


def test_no_item_comes_from_the_clean_corpus() -> None:
    clean = _labels.repo_list(_labels.CORPUS_LIST)
    assert not sorted({r["repo"] for r in RECORDS if r["repo"].lower() in clean})


def test_goal_of_issue_16_at_least_100_bugs_from_at_least_50_repositories() -> None:
    repos = {record["repo"].lower() for record in RECORDS}
    assert len(RECORDS) >= 100 and len(repos) >= 50, (
        f"issue 16 goal: >= 100 labelled bugs from >= 50 repositories; "
        f"the label file holds {len(RECORDS)} from {len(repos)}"
    )


def _review_rows() -> list[dict[str, str]]:
    with _labels.REVIEW_LOG.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def test_every_record_was_reviewed_and_the_review_log_accounts_for_it() -> None:
    rows = _review_rows()
    assert rows and list(rows[0]) == ["id", "field", "old", "new", "reason"]
    by_id: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_id.setdefault(row["id"], []).append(row)
    assert sorted(by_id) == sorted(r["id"] for r in RECORDS)
    for record in RECORDS:
        assert record.get("reviewed_by"), record["id"]
        fields = [row["field"] for row in by_id[record["id"]]]
        assert set(fields) <= {"ok", "note", "rules", "category", "files", "review_doubt"}
        # the log grows by review rounds (one row per record examined, appended): a
        # record kept as it was has an "ok" row, a change a row per field; notes alone
        # account for nothing
        assert set(fields) != {"note"}, record["id"]


def test_each_logged_change_is_what_the_record_holds_now() -> None:
    """Changes chain in log order: each starts where the last one left the field,
    and the latest is what the record holds now (a later round may undo an earlier)."""
    records = {r["id"]: r for r in RECORDS}
    latest: dict[tuple[str, str], Any] = {}
    doubts: dict[str, str] = {}
    for row in _review_rows():
        assert row["reason"].strip(), row
        field = row["field"]
        if field in ("rules", "files", "category"):
            decode = json.loads if field != "category" else str
            old, new = decode(row["old"]), decode(row["new"])
            assert old != new, row
            key = (row["id"], field)
            if key in latest:
                assert old == latest[key], row
            latest[key] = new
        elif field == "review_doubt":
            doubts[row["id"]] = f"{row['new']}: {row['reason']}"
    for (record_id, field), value in latest.items():
        assert records[record_id][field] == value, (record_id, field)
    for record_id, doubt in doubts.items():
        assert records[record_id]["review_doubt"] == doubt, record_id


# ---------------------------------------------------------------- the checker itself


GOOD: dict[str, Any] = {
    "id": "octo+demo@0123456789ab",
    "repo": "octo/demo",
    "fix_commit": "0123456789ab" + "c" * 28,
    "parent_commit": "f" * 40,
    "url": "https://github.com/octo/demo/commit/0123456789ab",
    "files": [
        {"path": "src/train.py", "lines": [{"line": 3, "sha1": "a" * 40}]},
        {"path": "src/model.py", "lines": []},
    ],
    "category": "device-mismatch-label",
    "rules": ["TD112"],
    "fix": "move the labels",
    "confirmed_by": "commit message",
    "found_by": "query: x",
    "collector": "tests",
}


def _broken(change: str) -> dict[str, Any]:
    record = copy.deepcopy(GOOD)
    if change == "no repo":
        del record["repo"]
    elif change == "short commit":
        record["parent_commit"] = "abc123"
    elif change == "upper-case commit":
        record["fix_commit"] = record["fix_commit"].upper()
    elif change == "wrong id":
        record["id"] = "octo+demo@ffffffffffff"
    elif change == "unknown category":
        record["category"] = "device-mismatch"
    elif change == "unknown code":
        record["rules"] = ["TD999"]
    elif change == "bad sha1":
        record["files"][0]["lines"][0]["sha1"] = "xyz"
    elif change == "line zero":
        record["files"][0]["lines"][0]["line"] = 0
    elif change == "escaping path":
        record["files"][0]["path"] = "../outside.py"
    elif change == "nothing labelled":
        record["files"][0]["lines"] = []
    elif change == "rules not a list":
        record["rules"] = "TD112"
    elif change == "reviewer not a string":
        record["reviewed_by"] = 5
    elif change == "unknown doubt":
        record["review_doubt"] = "boring: nothing"
    return record


BROKEN = {
    "no repo": "missing field 'repo'",
    "short commit": "parent_commit",
    "upper-case commit": "fix_commit",
    "wrong id": "id ",
    "unknown category": "category",
    "unknown code": "TD999",
    "bad sha1": "sha1",
    "line zero": "line 0",
    "escaping path": "plain relative path",
    "nothing labelled": "no labelled line",
    "rules not a list": "'rules' is str",
    "reviewer not a string": "'reviewed_by' is int",
    "unknown doubt": "review_doubt 'boring: nothing'",
}


def test_a_good_record_has_no_problem_and_reserved_codes_are_allowed() -> None:
    assert _labels.problems(GOOD, KNOWN) == []
    reviewed = {**GOOD, "reviewed_by": "labels", "review_doubt": "not-pytorch: a Python typo"}
    assert _labels.problems(reviewed, KNOWN) == []
    reserved_rule = {**GOOD, "rules": ["TD406"]}
    assert _labels.problems(reserved_rule, KNOWN) == []


@pytest.mark.parametrize("change", sorted(BROKEN))
def test_each_broken_record_is_named_for_what_is_wrong(change: str) -> None:
    found = _labels.problems(_broken(change), KNOWN)
    assert any(BROKEN[change] in problem for problem in found), found


def test_a_reserved_repository_is_a_problem() -> None:
    found = _labels.problems(GOOD, KNOWN, reserved=frozenset({"octo/demo"}))
    assert found == ["repo octo/demo is reserved for independent evaluation"]
