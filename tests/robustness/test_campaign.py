"""A few seconds of the `make fuzz` campaign (tests/robustness/campaign.py) in every test run.

Each part runs one round at least (one hypothesis batch, one batch of mutated files
through the real CLI, explain inputs, checkpoint byte flips), so the campaign itself
cannot rot between the long runs.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.robustness import campaign


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # fuzz-failures/ would be written here


@pytest.mark.parametrize("part", campaign.PARTS)
def test_a_short_round_of_each_part_finds_nothing(part: str) -> None:
    if part == "checkpoints":
        pytest.importorskip("torch")
    tally = campaign.Tally(part)
    runner = campaign.RUNNERS[part]
    deadline = time.monotonic() + 1
    if part == "files":
        campaign.files(tally, deadline, random.Random(21), batch=8)
    elif part == "programs":  # the property tests themselves run in full elsewhere
        campaign.programs(tally, deadline, random.Random(21), examples=3)
    else:
        runner(tally, deadline, random.Random(21))
    assert tally.cases > 0
    assert tally.failures == [], [Path(f + ".txt").read_text() for f in tally.failures]
    assert not Path("fuzz-failures").exists()


def test_a_failure_is_saved_and_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchdoctor

    def broken(subject: object) -> object:
        raise RuntimeError("explain broke")

    monkeypatch.setattr(torchdoctor, "explain", broken)
    assert campaign.main(["--seconds", "0", "--only", "explain", "--seed", "5"]) == 1
    saved = sorted(p.name for p in Path("fuzz-failures").iterdir())
    assert saved == ["explain-1.input", "explain-1.txt"]
    assert "explain raised RuntimeError: explain broke" in Path(
        "fuzz-failures/explain-1.txt"
    ).read_text(encoding="utf-8")


def test_mutations_change_files_and_stay_bytes() -> None:
    rng = random.Random(3)
    original = Path(campaign.__file__).read_bytes()
    mutated = [campaign.mutate(original, rng) for _ in range(20)]
    assert all(isinstance(m, bytes) for m in mutated)
    # (a swap of a line with itself changes nothing: most draws still differ)
    assert sum(m != original for m in mutated) >= 15
    assert len(set(mutated)) >= 15
