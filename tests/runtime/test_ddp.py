"""A real two-process DDP run (torchrun, gloo, CPU) through torchdoctor's helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def torchrun_command() -> list[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    if torchrun.exists():
        return [str(torchrun)]
    return [sys.executable, "-m", "torch.distributed.run"]


def test_torchrun_two_processes_train_save_and_load(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHDOCTOR_DEVICE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    script = Path(__file__).with_name("ddp_train.py")
    result = subprocess.run(
        [*torchrun_command(), "--standalone", "--nproc_per_node=2", str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # pick_device() under torchrun with no GPU is cpu; each rank saw half of the 16 rows
    assert (tmp_path / "rank0.ok").read_text() == "cpu 8"
    assert (tmp_path / "rank1.ok").read_text() == "cpu 8"
