"""load_checkpoint decides unsafe / corrupt / not-a-checkpoint from what the file is.

Files made here by torch.save, pickle (protocols 0-5), safetensors, truncation and random
bytes; torch's own messages of several versions (tests/runtime/data) are replayed to show
the verdict never depends on their wording. Nothing in a file is ever run to decide.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
import torch

import torchdoctor as td
from torchdoctor.errors import CheckpointError, UnsafeCheckpointError
from torchdoctor.runtime import checkpoint
from torchdoctor.runtime.checkpoint_inspect import inspect_bytes, inspect_stream

# torch warns about the odd "protocol" byte of random files it is asked to read
pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
MESSAGES = json.loads((Path(__file__).parent / "data" / "torch_load_messages.json").read_text())
_TYPES = {
    "UnpicklingError": pickle.UnpicklingError,
    "RuntimeError": RuntimeError,
    "EOFError": EOFError,
}


class Custom:
    pass


class RunsShell:
    """Unpickling this calls os.system: a malicious checkpoint. It would create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _load_error(path: Path, **kwargs: Any) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        td.load_checkpoint(path, device="cpu", **kwargs)
    return info.value


@pytest.mark.parametrize("protocol", range(6))
def test_a_pickled_class_is_refused_by_name_for_every_protocol(
    tmp_path: Path, protocol: int
) -> None:
    path = tmp_path / "p.pt"
    path.write_bytes(pickle.dumps({"w": [1.0], "config": Custom()}, protocol=protocol))
    error = _load_error(path)
    assert isinstance(error, UnsafeCheckpointError)
    assert f"the type {__name__}.Custom (Custom of module {__name__}, in pickle 1" in str(error)
    assert "corrupt" not in str(error)


@pytest.mark.parametrize("protocol", range(6))
def test_a_plain_pickle_is_named_with_its_protocol(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "p.pkl"
    path.write_bytes(pickle.dumps({"w": [1.0, 2.0], "epoch": 3}, protocol=protocol))
    error = _load_error(path)
    assert type(error) is CheckpointError
    shown = "0 or 1" if protocol < 2 else str(protocol)
    assert f"is a plain pickle (protocol {shown}) written with pickle.dump" in str(error)


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_a_malicious_file_is_refused_as_malicious_and_never_runs(
    tmp_path: Path, zipped: bool
) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save(
        {"model": {"w": torch.ones(2)}, "x": RunsShell(marker)},
        path,
        _use_new_zipfile_serialization=zipped,
    )
    error = _load_error(path)
    message = str(error)
    assert isinstance(error, UnsafeCheckpointError)
    assert f"calls {os.system.__module__}.system" in message  # posix.system / nt.system
    assert "malicious" in message and "corrupt" not in message
    assert "do not load it with weights_only=False" in message
    assert not marker.exists()


def test_a_cut_malicious_file_is_still_refused_as_malicious(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": RunsShell(tmp_path / "m")}, path)
    data = path.read_bytes()
    report = inspect_bytes(data)
    evil = next(g for g in report.globals if g.dangerous)
    record_start = data.index(evil.record.encode()) + len(evil.record)
    after_global = record_start + evil.offset + 40
    for length in (after_global, (after_global + len(data)) // 2, len(data) - 10):
        (tmp_path / "cut.pt").write_bytes(data[:length])
        error = _load_error(tmp_path / "cut.pt")
        assert isinstance(error, UnsafeCheckpointError), length
        assert "malicious" in str(error)


def test_truncated_safe_files_are_corrupt_never_unsafe(tmp_path: Path) -> None:
    for zipped in (True, False):
        path = tmp_path / "ok.pt"
        torch.save({"w": torch.arange(50.0)}, path, _use_new_zipfile_serialization=zipped)
        data = path.read_bytes()
        for length in range(1, len(data), max(1, len(data) // 40)):
            (tmp_path / "cut.pt").write_bytes(data[:length])
            error = _load_error(tmp_path / "cut.pt")
            assert not isinstance(error, UnsafeCheckpointError), (zipped, length, str(error))
            assert "truncated or corrupt" in str(error) or "not a PyTorch" in str(error)


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_are_corrupt_or_not_a_checkpoint_never_unsafe(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5000)))
    for data, expected in ((b"\x80" + body, "truncated or corrupt"), (body, None)):
        (tmp_path / "r.pt").write_bytes(data)
        error = _load_error(tmp_path / "r.pt")
        assert not isinstance(error, UnsafeCheckpointError), str(error)
        if expected:
            assert expected in str(error)


def test_safetensors_file_loads_or_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    saved = torch.nn.Linear(3, 2)
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(saved.state_dict(), str(path))
    fresh = torch.nn.Linear(3, 2)
    assert td.load_checkpoint(path, fresh) == {}  # torch 2.13's torch.load reads safetensors
    assert torch.equal(fresh.weight, saved.weight)

    def older_torch(*args: Any, **kwargs: Any) -> Any:
        raise pickle.UnpicklingError("invalid load key, '\\x10'.")

    monkeypatch.setattr(checkpoint.torch, "load", older_torch)
    assert "is a safetensors file" in str(_load_error(path))


@pytest.mark.parametrize("recorded", MESSAGES["refused"], ids=lambda r: r["torch"])
def test_verdict_on_a_malicious_file_ignores_torchs_wording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: dict[str, str]
) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"x": RunsShell(tmp_path / "m")}, path)

    def load(*args: Any, **kwargs: Any) -> Any:
        raise _TYPES[recorded["type"]](recorded["message"])

    monkeypatch.setattr(checkpoint.torch, "load", load)
    error = _load_error(path)
    assert isinstance(error, UnsafeCheckpointError)
    assert f"{os.system.__module__}.system" in str(error)


@pytest.mark.parametrize("recorded", MESSAGES["damaged"], ids=lambda r: r["torch"])
def test_verdict_on_a_cut_file_ignores_torchs_wording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: dict[str, str]
) -> None:
    path = tmp_path / "ok.pt"
    torch.save({"w": torch.ones(40), "args": argparse.Namespace(lr=1)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 200])  # the Namespace is in data.pkl: still readable

    def load(*args: Any, **kwargs: Any) -> Any:
        raise _TYPES[recorded["type"]](recorded["message"])

    monkeypatch.setattr(checkpoint.torch, "load", load)
    error = _load_error(path)
    # the file names a type weights_only refuses: refused by name whatever torch said
    assert isinstance(error, UnsafeCheckpointError)
    assert "argparse.Namespace" in str(error)
    # without that type, the same cut file is corrupt whatever torch said
    torch.save({"w": torch.ones(40)}, tmp_path / "plain.pt")
    plain = (tmp_path / "plain.pt").read_bytes()
    (tmp_path / "plain.pt").write_bytes(plain[: len(plain) - 200])
    error = _load_error(tmp_path / "plain.pt")
    assert type(error) is CheckpointError
    assert "truncated or corrupt" in str(error)


def test_weights_only_false_is_never_suggested_without_saying_it_runs_code(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.pt"
    torch.save({"obj": Custom()}, path)
    message = str(_load_error(path))
    assert "weights_only=False" in message
    assert "runs any code the file names" in message
    assert f"add_safe_globals([{__name__}.Custom])" in message


class _CountingReader(io.BytesIO):
    """A file that counts the bytes read from it."""

    read_total = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.read_total += len(data)
        return data


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_inspecting_reads_the_structure_not_the_weights(zipped: bool) -> None:
    buffer = io.BytesIO()
    torch.save(
        {"w": torch.zeros(4_000_000), "x": Custom()}, buffer, _use_new_zipfile_serialization=zipped
    )
    stream = _CountingReader(buffer.getvalue())
    report = inspect_stream(stream)
    assert f"{__name__}.Custom" in {g.qualname for g in report.globals}
    assert stream.read_total < 2_000_000 < len(buffer.getvalue()) // 4  # 16 MB of weights
