"""`torchdoctor run --simulate cuda:N -- torchrun ... train.py`: the launcher and the report.

How the ranks get the simulation: the real torchrun is started with its
training script replaced by `-m torchdoctor run --simulate cuda:N <script>`,
so every worker process runs the user's script under its own simulation
(`distributed.py` adds the multi-GPU layer). The environment variable
`TORCHDOCTOR_DDP_REPORT` names a directory where each rank writes what it saw
(`rank-<RANK>.json`) when its simulation stops. The launcher then merges them:
per-rank findings, plus what only a comparison of the ranks shows — every rank
iterating the same first batch (TD704), several ranks saving one path (TD705),
one GPU holding memory placed by other ranks.

"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import IO, Any

from torchdoctor.errors import UsageError
from torchdoctor.runtime.sim.distributed import size

REPORT_ENV = "TORCHDOCTOR_DDP_REPORT"
LAUNCHER_MODULE = "torch.distributed.run"


def worker_command(torchrun_args: Sequence[str], run_options: Sequence[str]) -> list[str]:
    """The torchrun command whose workers run the script under `torchdoctor run`."""
    from torch.distributed.run import get_args_parser

    try:
        parsed = get_args_parser().parse_args(list(torchrun_args))
    except SystemExit as exc:
        raise UsageError(f"torchrun could not parse {' '.join(torchrun_args)!r}") from exc
    if parsed.no_python:
        raise UsageError("torchrun --no-python cannot run under the simulation")
    script_at = len(torchrun_args) - len(parsed.training_script_args) - 1
    options = list(torchrun_args[:script_at])
    user = [parsed.training_script, *parsed.training_script_args]
    if parsed.module:  # torchrun -m pkg: our run gets -m pkg; torchrun's own -m stays
        user = ["-m", *user]
    else:
        options.append("-m")
    return [
        sys.executable,
        "-m",
        LAUNCHER_MODULE,
        *options,
        "torchdoctor",
        "run",
        *run_options,
        *user,
    ]


def launch(
    torchrun_args: Sequence[str], run_options: Sequence[str], stderr: IO[str] | None = None
) -> int:
    """Run torchrun with simulated ranks, then print the merged report; the exit code."""
    err = stderr if stderr is not None else sys.stderr
    command = worker_command(torchrun_args, run_options)
    with tempfile.TemporaryDirectory(prefix="torchdoctor-ddp-") as directory:
        env = {**os.environ, REPORT_ENV: directory}
        try:
            code = subprocess.call(command, env=env)
        except KeyboardInterrupt:
            code = 130
        records = read_records(directory)
    findings = merge(records)
    if records:
        err.write(render(records, findings))
        err.flush()
    if code == 0 and findings:
        return 1
    return code


# -- the rank side ------------------------------------------------------------------


def write_record(record: dict[str, Any], stderr: IO[str] | None = None) -> None:
    """At the end of a rank's simulation: into the launcher's directory, else to stderr."""
    directory = os.environ.get(REPORT_ENV)
    if not directory:
        if record["findings"]:
            err = stderr if stderr is not None else sys.stderr
            err.write(render([record], [dict(f, rank=record["rank"]) for f in record["findings"]]))
        return
    target = os.path.join(directory, f"rank-{record['rank']}.json")
    fd, temp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(temp, target)  # the launcher never reads half a file


def read_records(directory: str) -> list[dict[str, Any]]:
    records = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("rank-") and name.endswith(".json"):
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                records.append(json.load(handle))
    return sorted(records, key=lambda r: r["rank"])


# -- the launcher side ----------------------------------------------------------------


def merge(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's findings, plus the ones only a comparison of the ranks shows."""
    findings = [dict(f, rank=r["rank"]) for r in records for f in r["findings"]]
    world = max((r["world_size"] for r in records), default=1)
    if len(records) < 2 or len(records) != world:
        return findings
    ranks = [r["rank"] for r in records]
    for key in records[0]["batches"]:
        prints = {r["batches"].get(key) for r in records}
        if len(prints) == 1 and None not in prints:
            file, _, line = key.rpartition(":")
            findings.append(
                {
                    "code": "TD704",
                    "message": f"ranks {_span(ranks)} got the same first batch from this "
                    "DataLoader: every rank trains on the same data (no DistributedSampler)",
                    "file": file,
                    "line": int(line),
                    "rank": None,
                }
            )
    savers: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for r in records:
        for save in r["saves"]:
            savers.setdefault(save["path"], []).append((r["rank"], save))
    for path, saves in savers.items():
        who = sorted({rank for rank, _ in saves})
        if len(who) > 1:
            first = saves[0][1]
            findings.append(
                {
                    "code": "TD705",
                    "message": f"ranks {_span(who)} all write {path} (save on rank 0 only)",
                    "file": first["file"],
                    "line": first["line"],
                    "rank": None,
                }
            )
    return findings


def _span(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def render(records: list[dict[str, Any]], findings: list[dict[str, Any]]) -> str:
    world = max((r["world_size"] for r in records), default=1)
    lines = [f"torchdoctor simulate: distributed run report ({len(records)} of {world} rank(s))"]
    if not findings:
        lines.append("  no multi-GPU mistakes found")
    for f in findings:
        who = "all ranks" if f.get("rank") is None else f"rank {f['rank']}"
        lines.append(f"  [{f['code']}] {f['file']}:{f['line']} ({who}): {f['message']}")
    piles: dict[str, dict[int, int]] = {}
    for r in records:
        for device, nbytes in r["foreign_bytes"].items():
            piles.setdefault(device, {})[r["rank"]] = nbytes
    for device, by_rank in sorted(piles.items()):
        total = size(sum(by_rank.values()))
        lines.append(
            f"  memory: {device} also holds {total} placed by rank(s) {_span(sorted(by_rank))}"
        )
    return "\n".join(lines) + "\n"
