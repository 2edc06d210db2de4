"""`torchdoctor run --simulate cuda:N -- torchrun ...`: real torchrun, real gloo, virtual GPUs.

Each test starts the real torchrun with 2 (or 4) CPU processes running ddp_script.py,
correct or with one mistake, and reads the merged run report.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gloo_race import run_past_gloo_exit_race
from torchdoctor.errors import UsageError
from torchdoctor.runtime.sim.ranks import worker_command

SCRIPT = Path(__file__).with_name("ddp_script.py")
TORCHDOCTOR = [sys.executable, "-m", "torchdoctor"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHDOCTOR_DEVICE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return run_past_gloo_exit_race(
        lambda: subprocess.run(
            command, capture_output=True, text=True, timeout=600, env=_env(), check=False
        )
    )


def simulated(
    tmp_path: Path, *script_args: str, nproc: int = 2
) -> subprocess.CompletedProcess[str]:
    return _run(
        [
            *TORCHDOCTOR,
            "run",
            "--simulate",
            f"cuda:{nproc}",
            "--",
            "torchrun",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(SCRIPT),
            "--out",
            str(tmp_path),
            *script_args,
        ]
    )


def losses(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if line.startswith("rank "))


def report(stderr: str) -> list[str]:
    """The report's finding lines: `[CODE] file:line (who): message`."""
    return [line.strip() for line in stderr.splitlines() if re.match(r"\s+\[TD\d+\]", line)]


def marker_line(bug: str) -> int:
    for number, text in enumerate(SCRIPT.read_text().splitlines(), 1):
        _, marker, names = text.partition("# bug: ")
        if marker and bug in names.split(", "):
            return number
    raise AssertionError(f"no marker for {bug}")


def test_correct_script_runs_as_the_plain_gloo_run(tmp_path: Path) -> None:
    plain = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(SCRIPT),
            "--backend",
            "gloo",
            "--out",
            str(tmp_path),
        ]
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    result = simulated(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(result.stdout) == losses(plain.stdout)
    assert len(losses(result.stdout)) == 8  # 2 ranks x 4 steps
    assert "no multi-GPU mistakes found" in result.stderr
    assert report(result.stderr) == []


@pytest.mark.parametrize(
    ("bug", "code", "who", "crashes", "at"),
    [
        ("no-set-device", "TD703", "(rank 1)", False, "no-set-device"),
        ("model-on-cuda0", "TD702", "(rank 1)", True, "at-ddp"),  # where DDP gets it
        ("no-sampler", "TD704", "(all ranks)", False, "no-sampler"),
        ("every-rank-saves", "TD705", "(all ranks)", False, "every-rank-saves"),
        ("wrapped-state-dict", "TD404", "(rank 0)", False, "wrapped-state-dict"),
        ("cpu-collective", "TD113", "(rank 0)", True, "cpu-collective"),
    ],
)
def test_each_mistake_is_reported_at_its_line(
    tmp_path: Path, bug: str, code: str, who: str, crashes: bool, at: str
) -> None:
    result = simulated(tmp_path, "--bug", bug)
    assert result.returncode == 1, result.stderr[-3000:]
    expected = f"[{code}] {SCRIPT}:{marker_line(at)} {who}:"
    found = report(result.stderr)
    assert any(line.startswith(expected) for line in found), (expected, found)
    # nothing else is blamed, except what the same mistake causes next
    assert {line.split("]")[0] for line in found} <= {f"[{code}", "[TD706"}
    if crashes:  # NCCL's own error, raised where NCCL would raise it
        nccl_says = {
            "model-on-cuda0": "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device",
            "cpu-collective": "RuntimeError: No backend type associated with device type cpu",
        }
        assert nccl_says[bug] in result.stderr
    else:
        steps = 16 if bug == "no-sampler" else 8  # 2 ranks x 8 or 4 batches
        assert len(losses(result.stdout)) == steps, result.stdout


def test_four_ranks_loading_onto_cuda0_pile_up_there(tmp_path: Path) -> None:
    result = simulated(tmp_path, "--bug", "load-to-cuda0", nproc=4)
    assert result.returncode == 1, result.stderr[-3000:]
    found = report(result.stderr)
    line = f"{SCRIPT}:{marker_line('load-to-cuda0')}"
    assert sorted(f.split(": rank")[0] for f in found) == [
        f"[TD701] {line} (rank {rank})" for rank in (1, 2, 3)
    ]
    assert "memory: cuda:0 also holds" in result.stderr
    assert "placed by rank(s) 1, 2, 3" in result.stderr
    assert len(losses(result.stdout)) == 8  # 4 ranks x 2 steps: it trains on


def test_td_simulate_inside_a_script_under_plain_torchrun(tmp_path: Path) -> None:
    wrapper = tmp_path / "wrapped.py"
    wrapper.write_text(
        "import runpy, sys\n"
        "import torchdoctor as td\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--out', {str(tmp_path)!r}, '--bug', 'no-set-device']\n"
        "with td.simulate('cuda', devices=2):\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    result = _run([*TORCHRUN, "--standalone", "--nproc-per-node=2", str(wrapper)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"[TD703] {SCRIPT}:{marker_line('no-set-device')} (rank 1)" in result.stderr
    assert len(losses(result.stdout)) == 8


def test_worker_command_runs_the_script_under_torchdoctor() -> None:
    command = worker_command(["--nproc-per-node", "2", "train.py", "--lr", "1"], ["--x"])
    assert command[1:] == [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "-m",
        "torchdoctor",
        "run",
        "--x",
        "train.py",
        "--lr",
        "1",
    ]
    module = worker_command(["--nproc-per-node=2", "-m", "pkg.train", "--lr", "1"], [])
    tail = ["-m", "torchdoctor", "run", "-m", "pkg.train", "--lr", "1"]
    assert module[3:] == ["--nproc-per-node=2", *tail]
    with pytest.raises(UsageError):
        worker_command(["--no-python", "train.sh"], [])


def test_bad_simulate_value_is_a_usage_error() -> None:
    result = _run([*TORCHDOCTOR, "run", "--simulate", "cuda:0", "x.py"])
    assert result.returncode == 2
    assert "invalid choice: 'cuda:0'" in result.stderr
    assert "Traceback" not in result.stderr
