"""Every rule against its fixture: bad lines (`# expect: TDxxx`) found, good lines quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.check.rule_fixtures import FIXTURES, case_files, expected, fixture_cases, run_rule
from torchdoctor.check.registry import rule_classes, rules_by_code

CASES = fixture_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture_findings_match_markers(case: Path) -> None:
    code = case.name[:5]
    assert code in rules_by_code(), f"fixture {case.name} names no known rule"
    results = run_rule(case, code)
    for file, (found, _) in results.items():
        want = expected(file, code)
        assert found - want == set(), f"unexpected findings (false alarms) in {file.name}"
        assert want - found == set(), f"missed findings in {file.name}"


@pytest.mark.parametrize("rule", rule_classes(), ids=[r.code for r in rule_classes()])
def test_every_rule_has_a_fixture_with_bad_lines(rule: type) -> None:
    cases = [c for c in CASES if c.name.startswith(rule.code)]  # type: ignore[attr-defined]
    assert cases, f"{rule.code} has no fixture in {FIXTURES}"  # type: ignore[attr-defined]
    markers = set().union(*(expected(f, rule.code) for c in cases for f in case_files(c)))  # type: ignore[attr-defined]
    assert markers, f"{rule.code}'s fixtures mark no bad line"  # type: ignore[attr-defined]


FIXED = sorted(FIXTURES.glob("TD*.fixed.py"))


@pytest.mark.parametrize("fixed", FIXED, ids=[f.name for f in FIXED])
def test_fix_produces_expected_file_and_is_idempotent(fixed: Path) -> None:
    case = fixed.with_name(fixed.name.replace(".fixed.py", ".py"))
    code = case.name[:5]
    ((_, text),) = run_rule(case, code, fix=True).values()
    assert text == fixed.read_text(encoding="utf-8")
    ((_, again),) = run_rule(fixed, code, fix=True).values()
    assert again == text, "a second --fix changed the file again"
