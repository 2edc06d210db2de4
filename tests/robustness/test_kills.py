"""A killed `torchdoctor check` leaves nothing behind: no worker process, no temp file.

Each test starts the real command on a generated project big enough that `-j 2`
really starts its two workers, waits until they exist, then kills the parent the way
a user or a CI runner does (SIGKILL, SIGTERM, Ctrl-C) and looks for survivors.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchdoctor.check.fix import atomic_write

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

# One file: a TD402 finding with a safe fix, and enough code that checking takes a while.
BODY = "".join(
    f"def step_{i}(model, batch):\n    out = model(batch)\n    return out.sum() * {i}\n\n\n"
    for i in range(60)
)
FIXABLE = 'import torch\n\nstate = torch.load("model.pt")\n\n\n' + BODY


def _project(folder: Path, files: int) -> Path:
    folder.mkdir()
    for i in range(files):
        (folder / f"m{i:04}.py").write_text(FIXABLE, encoding="utf-8")
    return folder


def _start(folder: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "torchdoctor", "check", "--isolated", "--no-cache", *args, "."],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: Ctrl-C is sent to the group
    )


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its exit status is left


def _wait_for_workers(proc: subprocess.Popen[bytes], count: int) -> set[int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        workers = _children(proc.pid)
        if len(workers) >= count:
            return workers
        assert proc.poll() is None, "the run ended before its workers started"
        time.sleep(0.02)
    raise AssertionError("no workers started")


def _assert_all_end(pids: set[int], within: float = 10) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return
        time.sleep(0.05)
    survivors = [pid for pid in pids if _alive(pid)]
    raise AssertionError(f"worker processes {survivors} outlived their parent")


def _kill_survivors(pids: set[int]) -> None:
    """Never leave a worker running on the test machine, whatever the test found."""
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("how", "exit_code"),
    [
        pytest.param(lambda p: os.kill(p.pid, signal.SIGKILL), -signal.SIGKILL, id="kill-9"),
        pytest.param(lambda p: os.kill(p.pid, signal.SIGTERM), 143, id="sigterm"),
        pytest.param(lambda p: os.killpg(p.pid, signal.SIGINT), 130, id="ctrl-c"),
    ],
)
def test_killed_check_leaves_no_worker(how: object, exit_code: int, tmp_path: Path) -> None:
    folder = _project(tmp_path / "project", 400)
    proc = _start(folder, "-j", "2", "--select", "ALL")
    workers = _wait_for_workers(proc, 2)
    try:
        assert callable(how)
        how(proc)
        # not communicate(): a surviving worker would hold the stderr pipe open
        assert proc.wait(timeout=60) == exit_code
        _assert_all_end(workers)
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert b"Traceback" not in err, err.decode()
    finally:
        _kill_survivors(workers)


def test_fix_killed_at_random_points_leaves_no_temp_file(tmp_path: Path) -> None:
    folder = _project(tmp_path / "project", 120)
    # kill while files are being written: after the workers, during the writes
    for delay, how in [
        (0.0, signal.SIGKILL),
        (0.0, signal.SIGTERM),
        (0.05, signal.SIGKILL),
        (0.05, signal.SIGTERM),
        (0.1, signal.SIGKILL),
        (0.2, signal.SIGINT),
        (0.3, signal.SIGKILL),
    ]:
        debris = _temp_files(folder)  # left by an earlier SIGKILL
        proc = _start(folder, "-j", "2", "--fix")
        workers = _wait_for_workers(proc, 2)
        try:
            while any(_alive(pid) for pid in workers) and proc.poll() is None:
                time.sleep(0.005)  # the workers end when checking ends and writing starts
            time.sleep(delay)
            os.kill(proc.pid, how)
            proc.wait()
            _assert_all_end(workers)
        finally:
            _kill_survivors(workers)
        if how != signal.SIGKILL:  # the handler deletes the temp file of its write
            assert _temp_files(folder) <= debris
    # a run after the kills writes what is left and removes the debris of the killed ones
    proc = _start(folder, "-j", "2", "--fix")
    proc.communicate(timeout=300)
    assert proc.returncode in (0, 1)
    assert _temp_files(folder) == set()
    for path in folder.iterdir():
        text = path.read_text(encoding="utf-8")
        ast.parse(text)
        assert "map_location" in text, path


def _temp_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.suffix == ".tmp"}


def test_atomic_write_removes_only_its_own_stale_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    target.write_bytes(b"old\n")
    stale = [tmp_path / ".train.py.ab_3x9qz.tmp", tmp_path / ".train.py.00000000.tmp"]
    kept = [
        tmp_path / ".train.py.tmp",  # not the random part mkstemp makes
        tmp_path / ".train.py.ABCDEFGH.tmp",  # mkstemp never uses capitals
        tmp_path / ".other.py.ab_3x9qz.tmp",  # another file's temp file
        tmp_path / ".train.py.ab_3x9qz.tmp.bak",
        tmp_path / "train.py.ab_3x9qz.tmp",  # no leading dot
    ]
    for path in stale + kept:
        path.write_bytes(b"debris\n")
    atomic_write(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert [p for p in stale if p.exists()] == []
    assert [p for p in kept if not p.exists()] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in [target, *kept])
