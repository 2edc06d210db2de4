"""benchmarks/run_all.py: the report sections it builds from real and missing inputs."""

from __future__ import annotations

import collections
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # run_all imports its siblings _peers and _readme
_spec = importlib.util.spec_from_file_location("benchmarks_run_all", BENCHMARKS / "run_all.py")
assert _spec is not None and _spec.loader is not None
run_all = importlib.util.module_from_spec(_spec)
sys.modules["benchmarks_run_all"] = run_all
_spec.loader.exec_module(run_all)

RULES = [("TD101", "hardcoded-cuda"), ("TD402", "load-without-map-location")]


def _result(name: str, files: int, lines: int, **codes: int) -> object:
    corpus = run_all.Corpus(name, Path("/nowhere") / name, exclude=None, commit="0123456789abcdef")
    return run_all.CorpusResult(corpus, files, lines, 1.0, collections.Counter(codes))


def test_rules_report_says_when_the_projects_are_missing(tmp_path: Path) -> None:
    missing = tmp_path / "corpus"
    results = [_result("torch", 10, 20_000, TD101=2, TD001=1), _result("stdlib", 5, 10_000)]
    text = run_all.rules_report(results, RULES, missing, present=False)
    assert f"not present ({missing} does not exist on this machine)" in text
    assert "| TD101 | hardcoded-cuda | 2 | 0 | 2 |" in text  # torch, stdlib, total
    # TD001 is an engine code: counted in its own column, not as a finding
    assert "| torch | 10 | 20,000 | 2 | 1.00 | 1 | 0 | 1 |" in text
    assert "benchmarks/corpus.py rebuild" in text and "benchmarks/corpus.txt" in text


def test_rules_report_lists_every_project_with_its_commit(tmp_path: Path) -> None:
    results = [
        _result("torch", 10, 20_000),
        _result("stdlib", 5, 10_000),
        _result("karpathy/nanoGPT", 3, 1_000, TD101=2),
        _result("pytorch/examples", 4, 3_000, TD402=5),
    ]
    text = run_all.rules_report(results, RULES, tmp_path, present=True)
    assert "| TD402 | load-without-map-location | 0 | 0 | 5 | 5 |" in text
    assert "| 2 projects | 7 | 4,000 | 7 | 17.50 | 0 | 0 | 2 |" in text
    assert "| karpathy/nanoGPT | 0123456789ab | 3 | 1,000 | 2 | TD101 2 |" in text


def test_check_speed_output_becomes_a_table() -> None:
    output = """tree: /x/torch
files: 2328 (.py/.pyi), 1,280,475 lines, 49.2 MB; 1966 contain 'torch'
one process:
  bare ast.parse                     wall   12.81 s   cpu    6.89 s   (runs: 17.59, 12.81)
  torchdoctor check -j1              wall   68.67 s   cpu   36.14 s   (runs: 63.05, 68.75)
ratios (cpu time; wall time):
  torchdoctor -j1 / bare parse:  5.25x; 5.36x   (goal <= 3x)
"""
    result = run_all.StepResult("check", "bench_check.py --runs 3", "ok", 60.0, output)
    text = run_all.check_speed_section(result)
    assert "| bare ast.parse | 6.89 | 12.81 | 1.00x |" in text
    assert "| torchdoctor check -j1 | 36.14 | 68.67 | 5.25x |" in text
    assert "- torchdoctor -j1 / bare parse:  5.25x; 5.36x   (goal <= 3x)" in text
    assert "- files: 2328 (.py/.pyi)" in text
    raw = run_all.check_speed_section(run_all.StepResult("check", "c", "ok", 1.0, "odd\n"))
    assert "```text\nodd\n```" in raw  # nothing to parse: the output itself is kept


def test_bench_check_interleaves_rounds_and_compares_them_pairwise() -> None:
    spec = importlib.util.spec_from_file_location("bench_check", BENCHMARKS / "bench_check.py")
    assert spec is not None and spec.loader is not None
    bench_check = importlib.util.module_from_spec(spec)
    sys.modules["bench_check"] = bench_check  # its dataclasses look their module up
    spec.loader.exec_module(bench_check)
    calls: list[str] = []

    def fake_run(command: list[str], env: object) -> tuple[float, float]:
        calls.append(command[0])
        return 1.0, {"parse": 2.0, "check": 5.0}[command[0]] * (1 + len(calls) / 100)

    bench_check.run_once = fake_run
    parse, check = bench_check.measure([("p", ["parse"], None), ("c", ["check"], None)], 3)
    assert calls == ["parse", "check"] * 4  # a warm-up each, then three a-b rounds
    assert len(parse.cpu) == len(check.cpu) == 3
    text = bench_check.round_ratios(check, parse)
    assert text == "2.52x (rounds: 2.52, 2.52, 2.52)"
