"""Topic accuracy of `explain` on real error messages collected from public issue threads.

`data/real_messages.jsonl` holds one message a line: the text as the thread shows it, the
thread's URL, the root cause the thread settled on (in our words) and the topic the
explanation must have. `split` was fixed when the records were collected (sha1 of the URL,
one in three held out): the knowledge base is tuned on "tune" only; "heldout" measures
whether it generalises. `make bench` reports both (benchmarks/explain_accuracy.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor.explain import kb
from torchdoctor.explain.explainer import explain

DATA = Path(__file__).parent / "data" / "real_messages.jsonl"
RECORDS = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]
TUNE = [r for r in RECORDS if r["split"] == "tune"]
HELDOUT = [r for r in RECORDS if r["split"] == "heldout"]
# shared/ sits beside the checkout (or beside its worktrees folder) on the team's machines
_CHECKOUT = Path(__file__).resolve().parents[2]
RESERVED = next(
    (
        folder / "shared" / "reserved-repos.txt"
        for folder in (_CHECKOUT.parent, _CHECKOUT.parent.parent)
        if (folder / "shared" / "reserved-repos.txt").exists()
    ),
    _CHECKOUT.parent / "shared" / "reserved-repos.txt",
)


def _repo(url: str) -> str:
    owner, name = url.split("/")[3:5]
    return f"{owner}/{name}".lower()


def test_at_least_150_messages_from_issue_threads() -> None:
    assert len(RECORDS) >= 150
    assert len({r["url"] for r in RECORDS}) >= 150  # distinct threads, not one thread's copies
    for record in RECORDS:
        assert set(record) == {"url", "topic", "split", "cause", "message"}
        assert record["url"].startswith("https://github.com/")
        assert "/issues/" in record["url"] or "/pull/" in record["url"]
        assert record["topic"] in kb.TOPICS
        assert record["split"] in ("tune", "heldout")
        assert record["message"].strip() and record["cause"].strip()


def test_no_message_from_a_reserved_repository() -> None:
    if not RESERVED.exists():
        pytest.skip(f"{RESERVED} is not beside this checkout")
    reserved = {
        line.strip().lower()
        for line in RESERVED.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert not [r["url"] for r in RECORDS if _repo(r["url"]) in reserved]


def test_every_topic_is_represented_in_both_splits() -> None:
    for topic in ("device", "distributed", "checkpoint", "mode", "memory", "dtype"):
        assert any(r["topic"] == topic for r in TUNE), topic
        assert any(r["topic"] == topic for r in HELDOUT), topic


@pytest.mark.parametrize("record", TUNE, ids=lambda r: r["url"].split("github.com/")[1])
def test_tuned_message_gets_its_topic(record: dict[str, str]) -> None:
    assert explain(record["message"]).topic == record["topic"]


def test_heldout_accuracy_at_least_52_of_54() -> None:
    right = sum(explain(r["message"]).topic == r["topic"] for r in HELDOUT)
    assert right / len(HELDOUT) >= 52 / 54, f"{right} of {len(HELDOUT)} held-out messages"
