"""`make bench` step "explain": topic accuracy on real messages, and explain on big logs.

1. Accuracy: every message of tests/explain/data/real_messages.jsonl (real PyTorch errors
   from public issue threads, each with the thread's root cause and the expected topic) is
   explained; the share with the right topic is reported per split. The knowledge base is
   tuned on the "tune" split only; "heldout" (one URL in three, fixed by a hash when the
   messages were collected) is the number that says whether it generalises.
2. Big logs: `torchdoctor explain` is handed a 2 MB and a 10 MB log shaped like the one of
   issue 21 (a training log full of partial "Weights only load failed" lines, which made the
   old backtracking pattern quadratic: 368 s on 2 MB) ending in a real traceback. Timed in
   a new process, end to end, next to `python -c pass` as the floor.

    .venv/bin/python benchmarks/explain_accuracy.py [--no-readme] [--repeat N]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _readme import write_section  # benchmarks/ is on sys.path: run as a script

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "explain" / "data" / "real_messages.jsonl"

_TRACEBACK = """Traceback (most recent call last):
  File "/home/user/project/train.py", line 88, in <module>
    state = torch.load(args.resume)
  File "/opt/conda/lib/python3.11/site-packages/torch/serialization.py", line 1609, in load
    raise pickle.UnpicklingError(_get_wo_message(str(e))) from None
_pickle.UnpicklingError: Weights only load failed. In PyTorch 2.6, we changed the default \
value of the `weights_only` argument in `torch.load` from `False` to `True`.
\tWeightsUnpickler error: Unsupported global: GLOBAL argparse.Namespace was not an allowed \
global by default.
"""


def accuracy() -> tuple[list[str], dict[str, tuple[int, int]]]:
    from torchdoctor.explain.explainer import explain

    records = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    per_topic: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    for record in records:
        right = explain(record["message"]).topic == record["topic"]
        for key in (record["split"], "all"):
            totals[key][0] += right
            totals[key][1] += 1
        per_topic[(record["topic"], record["split"])][0] += right
        per_topic[(record["topic"], record["split"])][1] += 1
    topics = sorted({topic for topic, _ in per_topic})
    rows = []
    for topic in topics:
        cells = []
        for split in ("tune", "heldout"):
            right, total = per_topic.get((topic, split), [0, 0])
            cells.append(f"{right}/{total}" if total else "-")
        rows.append(f"| {topic} | {cells[0]} | {cells[1]} |")
    return rows, {k: (v[0], v[1]) for k, v in totals.items()}


def big_log(size: int, frames: bool = True) -> str:
    """A training log of `size` characters ending in the traceback (with or without frames)."""
    noise = (
        "epoch 3 step 1200 loss 0.4312 lr 3.0e-04\n"
        "warning: Weights only load failed for optional file cache/extra.pt, skipping\n"
    )
    body = noise * (size // len(noise))
    tail = _TRACEBACK if frames else _TRACEBACK.replace('  File "', '  at "')
    return body[: size - len(tail)] + "\n" + tail


def time_command(command: list[str], stdin: str | None, repeat: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - started)
        out = done.stdout
    return statistics.median(times), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-readme", action="store_true", help="print only")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each timed command")
    args = parser.parse_args()

    rows, totals = accuracy()
    floor, _ = time_command([sys.executable, "-c", "pass"], None, args.repeat)
    timings = []
    for megabytes in (2, 10):
        for frames in (True, False):
            log = big_log(megabytes * 1_000_000, frames)
            command = [sys.executable, "-m", "torchdoctor", "explain", "-"]
            seconds, out = time_command(command, log, args.repeat)
            lines = out.splitlines()
            headline = next((ln for ln in lines if ln.startswith("torchdoctor:")), "")
            shape = "traceback at the end" if frames else "no frame lines: one message"
            timings.append((f"{megabytes} MB, {shape}", seconds, headline))

    def share(key: str) -> str:
        right, total = totals[key]
        return f"{right}/{total} ({right / total:.0%})"

    lines = [
        "`benchmarks/explain_accuracy.py`: topic accuracy of `explain` on "
        f"{totals['all'][1]} real PyTorch error messages collected from public GitHub issue "
        "threads (`tests/explain/data/real_messages.jsonl`: message, thread URL, the root "
        "cause the thread settled on, expected topic). The knowledge base is tuned on the "
        "tune split only; the held-out split (one thread in three, fixed by a hash of the URL "
        "when the messages were collected) measures generalisation; misses were only ever "
        "examined on the tune split, but the person who widened the knowledge base also "
        "collected (and so read) every message, so held out here is weaker than a set "
        "nobody on the project has seen. Goal: at least 52 of 54 (96%) held out.",
        "",
        f"- held out: **{share('heldout')}**; tune: {share('tune')}; all: {share('all')}",
        "- before this knowledge base was widened (commit 6ce88a0, the same 270 messages "
        "and split, measured once by hand): held out 63/82 (77%), tune 126/188 (67%)",
        "- messages were collected in batches; the held-out share of each later batch, "
        "measured before the batch was tuned for: 2 of 9 (PyTorch 0.4-1.x device "
        "wordings: held out 70/77 then) and 3 of 5 (`CUDA error: out of memory`, Half vs "
        "Float, `CUDNN_STATUS_NOT_INITIALIZED`: 80/82 then). Wordings the knowledge base "
        "has never seen are where it fails; a fresh held-out set is the honest test",
        "",
        "| topic | tune | held out |",
        "|---|---:|---:|",
        *rows,
        "",
        '`torchdoctor explain -` on big logs (a training log full of partial "Weights only '
        'load failed" lines, the shape that made the old backtracking pattern take 368 s on '
        "2 MB, ending in a real traceback), a new process each time, median of "
        f"{args.repeat}; the floor is `python -c pass` ({floor:.2f} s):",
        "",
        "| log | seconds (wall) | x floor | headline |",
        "|---|---:|---:|---|",
        *(
            f"| {log} | {seconds:.2f} | {seconds / floor:.1f}x | `{headline}` |"
            for log, seconds, headline in timings
        ),
        "",
        "Goal: under 2 s on 2 MB. Every pattern is RE2 (linear time), and one RE2 set "
        "over all of them picks the entries that can match in a single pass; "
        "`tests/explain/test_linear_time.py` guards each on 1 MB adversarial inputs.",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_readme:
        write_section("explain-accuracy", body, heading="Explain: accuracy on real messages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
