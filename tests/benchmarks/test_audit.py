"""The precision audit on code we never tuned on: its committed sample and its counting."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the benchmark helpers import their siblings

_spec = importlib.util.spec_from_file_location("benchmarks_audit", BENCHMARKS / "audit.py")
assert _spec is not None and _spec.loader is not None
audit = importlib.util.module_from_spec(_spec)
sys.modules["benchmarks_audit"] = audit
_spec.loader.exec_module(audit)


def test_the_committed_sample_is_judged_and_comes_from_bug_repositories() -> None:
    sample = audit.read_sample()
    assert len(sample) == 120
    assert set(sample.values()) <= set(audit.VERDICTS)
    repos = {
        json.loads(line)["repo"].replace("/", "+")
        for line in (BENCHMARKS / "bugs.jsonl").read_text(encoding="utf-8").splitlines()
    }
    assert {folder.split("@")[0] for folder, *_ in sample} <= repos


def test_the_second_sample_is_judged_apart_from_the_first() -> None:
    second = BENCHMARKS / "bugs-audit-2.tsv"
    sample = audit.read_sample(second)
    assert len(sample) == 96
    assert set(sample.values()) <= set(audit.VERDICTS)
    first = {(folder.split("@")[0], file, line) for folder, file, _, line, _ in audit.read_sample()}
    assert not {(folder.split("@")[0], file, line) for folder, file, _, line, _ in sample} & first
    assert audit.drawn_from(second).startswith("drawn from main at daec40d")
    text = audit.report({v: (1, 1) for v in audit.VERDICTS}, second, audit.drawn_from(second))
    assert "benchmarks/bugs-audit-2.tsv (drawn from main at daec40d" in text


def test_an_unknown_verdict_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.tsv"
    path.write_text("a+b@1\tx.py\t\t3\tTD402\tmaybe\twhy\tme\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unknown verdict 'maybe'"):
        audit.read_sample(path)


@pytest.mark.parametrize(
    "row", ["a+b@1\tx.py\t\t3\tTD402\tmaybe\twhy\tme\n", "a+b@1\tx.py\t\tthree\tTD402\n"]
)
def test_a_bad_sample_file_is_one_line_and_no_traceback(tmp_path: Path, row: str) -> None:
    path = tmp_path / "audit.tsv"
    path.write_text(row, encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        audit.main(["--sample", str(path)])
    assert str(exited.value).startswith(f"audit: {path}: ")
    assert "\n" not in str(exited.value)
    with pytest.raises(SystemExit, match="No such file"):
        audit.main(["--sample", str(tmp_path / "missing.tsv")])


def test_findings_are_keyed_like_the_sample(tmp_path: Path) -> None:
    folder = tmp_path / "owner+repo@0123456789ab"
    folder.mkdir()
    (folder / "load.py").write_text('import torch\n\nstate = torch.load("w.pt")\n')
    assert (folder.name, "load.py", 0, 3, "TD402") in audit.findings(folder)


def test_the_report_counts_what_is_gone() -> None:
    counts = {"worth-fixing": (4, 4), "intended": (2, 1), "false-alarm": (4, 1), "unsure": (0, 0)}
    text = audit.report(counts)
    assert "| false-alarm | 4 | 1 | 3 |" in text
    assert "| **all** | 10 | 6 | 4 |" in text
    assert "3 of those false alarms are gone now" in text
