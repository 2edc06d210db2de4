"""The strict precision review: the committed verdict file and how findings find verdicts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the benchmark helpers import their siblings
import _labels  # noqa: E402
import _verdicts  # noqa: E402
from _verdicts import Finding  # noqa: E402

_spec = importlib.util.spec_from_file_location("benchmarks_precision", BENCHMARKS / "precision.py")
assert _spec is not None and _spec.loader is not None
precision = importlib.util.module_from_spec(_spec)
sys.modules["benchmarks_precision"] = precision
_spec.loader.exec_module(precision)

VERDICT_ROWS = _labels.read_jsonl(BENCHMARKS / "verdicts.jsonl")


def test_every_committed_verdict_is_complete() -> None:
    bad = {n: found for n, record in VERDICT_ROWS if (found := _verdicts.problems(record))}
    assert not bad


def test_the_committed_verdict_file_is_sorted_and_names_corpus_repositories() -> None:
    records = [record for _, record in VERDICT_ROWS]
    assert records == sorted(records, key=_verdicts.sort_key), "run `precision.py tidy`"
    corpus = _labels.repo_list(_labels.CORPUS_LIST)
    assert {r["repo"].lower() for r in records} <= corpus


@pytest.mark.parametrize(
    ("path", "test"),
    [
        ("tests/test_trainer.py", True),
        ("pkg/tests/helpers.py", True),
        ("test/models/resnet.py", True),
        ("src/test_utils.py", True),
        ("src/trainer_test.py", True),
        ("conftest.py", True),
        ("src/testing.py", False),
        ("contest/train.py", False),
        ("latest/train.py", False),
        ("src/attest.py", False),
    ],
)
def test_what_counts_as_test_code(path: str, test: bool) -> None:
    assert _verdicts.is_test(path) is test


def _finding(line: int, text: str, code: str = "TD402") -> Finding:
    return Finding("octo/demo", "train.py", line, code, _verdicts.line_hash(text))


def _verdict(line: int, text: str, verdict: str, code: str = "TD402") -> dict[str, object]:
    return {
        "repo": "octo/demo",
        "file": "train.py",
        "line": line,
        "code": code,
        "hash": _verdicts.line_hash(text),
        "verdict": verdict,
        "reason": "read in its code",
    }


def test_a_verdict_survives_its_line_moving_but_not_its_text_changing() -> None:
    load = "    state = torch.load(path)"
    verdicts = [_verdict(10, load, "worth-fixing")]
    judged, stale = _verdicts.match([_finding(17, "state = torch.load(path)")], verdicts)
    assert [v["verdict"] for v in judged.values()] == ["worth-fixing"] and not stale
    judged, stale = _verdicts.match([_finding(10, "state = torch.load(p)")], verdicts)
    assert not judged and stale == verdicts
    judged, _ = _verdicts.match([_finding(10, load, code="TD401")], verdicts)
    assert not judged  # another rule on the same line needs its own verdict


def test_findings_on_the_same_text_take_their_verdicts_in_line_order() -> None:
    text = "x = x.cuda()"
    verdicts = [_verdict(40, text, "false-alarm"), _verdict(5, text, "intended")]
    first, second, third = _finding(7, text), _finding(42, text), _finding(90, text)
    judged, stale = _verdicts.match([third, second, first], verdicts)
    assert judged[first]["verdict"] == "intended"
    assert judged[second]["verdict"] == "false-alarm"
    assert third not in judged and not stale


def test_two_findings_of_one_rule_on_one_line_need_two_verdicts() -> None:
    text = "a, b = Variable(a), Variable(b)"
    left = Finding("octo/demo", "train.py", 4, "TD602", _verdicts.line_hash(text), column=8)
    right = Finding("octo/demo", "train.py", 4, "TD602", _verdicts.line_hash(text), column=21)
    one = {**_verdict(4, text, "worth-fixing", code="TD602"), "column": 8}
    judged, _ = _verdicts.match([right, left], [one])
    assert list(judged) == [left]  # the second finding is still to judge
    two = {**one, "column": 21}
    judged, stale = _verdicts.match([right, left], [two, one])
    assert set(judged) == {left, right} and not stale
    assert json.loads(_verdicts.template(right))["column"] == 21


def test_a_template_is_not_a_verdict_until_it_is_filled_in() -> None:
    template = json.loads(_verdicts.template(_finding(3, "torch.load(p)")))
    assert "verdict '?' is not one of" in " ".join(_verdicts.problems(template))
    template |= {"verdict": "false-alarm", "reason": "the file holds floats"}
    assert _verdicts.problems(template) == []


def test_tidy_sorts_and_refuses_two_verdicts_for_one_finding(tmp_path: Path) -> None:
    path = tmp_path / "verdicts.jsonl"
    late, early = _verdict(30, "b()", "intended"), _verdict(3, "a()", "worth-fixing")
    path.write_text(json.dumps(late) + "\n" + json.dumps(early) + "\n" + json.dumps(late) + "\n")
    assert precision.tidy(path) == 0
    assert [json.loads(line)["line"] for line in path.read_text().splitlines()] == [3, 30]
    before = path.read_text() + json.dumps({**early, "verdict": "false-alarm"}) + "\n"
    path.write_text(before)
    assert precision.tidy(path) == 1
    assert path.read_text() == before  # nothing rewritten


def test_the_report_counts_false_alarms_per_10k_lines_apart_for_tests(tmp_path: Path) -> None:
    project = precision.Project("octo/demo", tmp_path)
    project.lines.update({True: 10_000, False: 40_000})
    in_test = Finding("octo/demo", "tests/test_a.py", 3, "TD101", "0" * 12)
    fine = Finding("octo/demo", "train.py", 9, "TD402", "1" * 12)
    wrong = Finding("octo/demo", "train.py", 12, "TD402", "2" * 12)
    unjudged = Finding("octo/demo", "train.py", 20, "TD209", "3" * 12)
    project.findings = [in_test, fine, wrong, unjudged]
    judged = {
        in_test: {"verdict": "false-alarm"},
        fine: {"verdict": "worth-fixing"},
        wrong: {"verdict": "false-alarm"},
    }
    text = precision.report([project], judged, stale=0)
    assert "| non-blank lines | 10,000 | 40,000 | 50,000 |" in text
    assert "| false alarms per 10k non-blank lines (goal <= 0.3) | 1.00 | 0.25 | 0.40 |" in text
    assert "| share worth fixing (goal >= 80%) | 0% (0/1) | 50% (1/2) | 33% (1/3) |" in text
    assert "| no verdict yet | 0 | 1 | 1 |" in text
    assert "- octo/demo `train.py:20` TD209" in text
