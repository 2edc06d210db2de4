"""Checkpoints under attack: killed writers, flipped bytes, truncation, malicious pickles."""

from __future__ import annotations

import io
import os
import pickle
import random
import signal
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torchdoctor as td  # noqa: E402
from torchdoctor.errors import CheckpointError, UnsafeCheckpointError  # noqa: E402

KILLS = 60


def _state(step: int) -> dict[str, Any]:
    # every value says which save it came from, so a mix of two saves is visible
    return {"weights": torch.full((16_384,), float(step)), "step": step}


def _assert_whole(path: Path) -> int:
    """The file at `path` is one complete save: load it and return its step."""
    loaded = td.load_checkpoint(path, device="cpu")
    step = loaded["step"]
    assert torch.equal(loaded["weights"], torch.full((16_384,), float(step)))
    return int(step)


def _writer(path: Path, first_step: int) -> None:
    """Child process: save new checkpoints to `path` as fast as it can until killed."""
    try:
        step = first_step
        while True:
            td.save_checkpoint(path, **_state(step))
            step += 1
    finally:
        os._exit(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_writer_killed_at_random_points_never_leaves_a_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "last.pt"
    rng = random.Random(8)
    # kill within about three saves' time: some kills land before the first save ends,
    # most inside a later one (the temp file, fsync and rename included)
    started = time.perf_counter()
    td.save_checkpoint(tmp_path / "warm-up.pt", **_state(0))
    window = 3 * (time.perf_counter() - started)
    (tmp_path / "warm-up.pt").unlink()
    mid_write = 0
    last_step = -1
    for round_number in range(KILLS):
        pid = os.fork()
        if pid == 0:
            _writer(target, first_step=round_number * 1_000_000)
        time.sleep(rng.uniform(0.0, window))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        # a temp file beside the target means the kill landed inside a save
        mid_write += any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
        if target.exists():
            step = _assert_whole(target)
            assert step >= last_step  # never an older file than one already seen
            last_step = step
        else:
            # a loaded machine saves slower than the warm-up did: widen the window
            # until saves complete, so that kills land inside later saves too
            window *= 1.5
    assert last_step >= 0, "no save ever completed: the kill delays are too short"
    assert mid_write > 0, "no kill landed inside a save: the test proved nothing"
    # the next save cleans the dead writers' temp files
    td.save_checkpoint(target, **_state(-1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    assert _assert_whole(target) == -1


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    path = td.save_checkpoint(folder / "good.pt", model=model, optimizer=optimizer, epoch=3)
    return path.read_bytes(), td.load_checkpoint(path, device="cpu")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _load_or_report(path: Path, data: bytes, original: dict[str, Any]) -> str:
    path.write_bytes(data)
    try:
        loaded = td.load_checkpoint(path, device="cpu")
    except CheckpointError as exc:
        assert str(path) in str(exc)
        return "reported"
    assert _same(loaded, original), "a damaged file loaded as different values"
    return "identical"


def test_a_flipped_byte_is_reported_never_loaded_as_other_values(
    saved: tuple[bytes, dict[str, Any]], tmp_path: Path
) -> None:
    data, original = saved
    outcomes: dict[str, int] = {}
    for position in range(0, len(data), 4):
        damaged = bytearray(data)
        damaged[position] ^= 0x01 if position % 8 else 0x80
        outcome = _load_or_report(tmp_path / "flipped.pt", bytes(damaged), original)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # flips in zip metadata nothing reads (timestamps, ...) load the exact saved values
    assert outcomes["reported"] > outcomes.get("identical", 0)


def test_every_flip_inside_the_weights_is_reported(
    saved: tuple[bytes, dict[str, Any]], tmp_path: Path
) -> None:
    data, _ = saved
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        records = [i for i in archive.infolist() if "/data/" in i.filename]
    assert records
    for info in records:
        # the record's bytes follow its local header: 30 bytes + name + extra field
        header = info.header_offset
        start = header + 30 + int.from_bytes(data[header + 26 : header + 28], "little")
        start += int.from_bytes(data[header + 28 : header + 30], "little")
        for position in range(start, start + info.compress_size, 5):
            damaged = bytearray(data)
            damaged[position] ^= 0x04
            (tmp_path / "w.pt").write_bytes(damaged)
            with pytest.raises(CheckpointError, match="is corrupt"):
                td.load_checkpoint(tmp_path / "w.pt", device="cpu")


def test_a_truncated_file_is_reported(saved: tuple[bytes, dict[str, Any]], tmp_path: Path) -> None:
    data, _ = saved
    for length in range(0, len(data), 5):
        (tmp_path / "cut.pt").write_bytes(data[:length])
        with pytest.raises(CheckpointError):
            td.load_checkpoint(tmp_path / "cut.pt", device="cpu")


class _Payload:
    """Unpickling this opens (creates) a file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_malicious_pickle_is_refused_with_weights_only(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    zipped = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.ones(2)}, "x": _Payload(marker)}, zipped)
    legacy = tmp_path / "evil_legacy.pt"
    torch.save({"x": _Payload(marker)}, legacy, _use_new_zipfile_serialization=False)
    raw = tmp_path / "evil_raw.pt"
    raw.write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    for path in (zipped, legacy, raw):
        with pytest.raises(UnsafeCheckpointError, match="weights_only=False") as info:
            td.load_checkpoint(path, device="cpu")
        assert "arbitrary code" in str(info.value)
        assert not marker.exists(), f"{path.name}: the payload ran"
    # the payload is real: trusting the file runs it
    td.load_checkpoint(zipped, device="cpu", weights_only=False)
    assert marker.exists()
