"""td.save_checkpoint / td.load_checkpoint: atomic, wrapper-proof, with clear errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor as td
from torchdoctor.errors import CheckpointError, InvalidArgumentError, UnsafeCheckpointError
from torchdoctor.runtime.checkpoint import adapt_prefixes, group_keys

from .fakes import clear_device_env

META = torch.device("meta")
# importing torch.compile's machinery warns about torch.jit internals
compile_warning = pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning")


@pytest.fixture(autouse=True)
def _no_device_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_device_env(monkeypatch)


class Net(nn.Module):
    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(3, hidden), nn.BatchNorm1d(hidden))
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class Wrapper(nn.Module):
    """A user model whose child is literally named `module`."""

    def __init__(self) -> None:
        super().__init__()
        self.module = Net()


def trained(seed: int = 0) -> tuple[Net, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(2):
        loss = model(torch.randn(8, 3)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_round_trip_restores_model_optimizer_scheduler_and_extras(tmp_path: Path) -> None:
    model, optimizer, scheduler = trained()
    path = td.save_checkpoint(
        tmp_path / "last.pt",
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        epoch=7,
        config={"lr": 0.01},
    )
    fresh, _, _ = trained(seed=1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.5)
    fresh_sched = torch.optim.lr_scheduler.StepLR(fresh_opt, step_size=1, gamma=0.5)
    assert not same_weights(model, fresh)

    ckpt = td.load_checkpoint(path, fresh, fresh_opt, scheduler=fresh_sched)
    assert same_weights(model, fresh)
    assert ckpt == {"epoch": 7, "config": {"lr": 0.01}}  # only the extras come back
    assert fresh_opt.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    assert fresh_sched.last_epoch == scheduler.last_epoch == 2
    pairs = zip(fresh.parameters(), model.parameters(), strict=True)
    for param, saved_param in pairs:  # the state is on each parameter's device
        state = fresh_opt.state[param]
        assert state["exp_avg"].device == param.device
        assert torch.equal(state["exp_avg"], optimizer.state[saved_param]["exp_avg"])
    assert "__torchdoctor__" not in ckpt


def test_saved_file_is_plain_torch_and_keeps_module_versions(tmp_path: Path) -> None:
    model, _, _ = trained()
    td.save_checkpoint(tmp_path / "m.pt", model=model)
    raw = torch.load(tmp_path / "m.pt", weights_only=True)  # no map_location needed
    assert raw["__torchdoctor__"]["kinds"] == {"model": "module"}
    assert raw["model"]._metadata["encoder.1"]["version"] == 2  # BatchNorm's version survives
    assert all(t.device.type == "cpu" for t in raw["model"].values())


def test_map_location_is_always_set(tmp_path: Path) -> None:
    model, _, _ = trained()
    td.save_checkpoint(tmp_path / "m.pt", model=model)
    on_meta = td.load_checkpoint(tmp_path / "m.pt", device="meta")
    assert all(t.device == META for t in on_meta["model"].values())
    meta_model = Net().to("meta")  # built without memory: gets the saved tensors themselves
    td.load_checkpoint(tmp_path / "m.pt", meta_model)
    assert meta_model.head.weight.device.type == "cpu"
    assert same_weights(model, meta_model)


@compile_warning
def test_wrappers_are_unwrapped_on_save(tmp_path: Path) -> None:
    model, _, _ = trained()
    td.save_checkpoint(tmp_path / "c.pt", model=torch.compile(model))
    td.save_checkpoint(tmp_path / "d.pt", model=nn.DataParallel(model))
    for name in ("c.pt", "d.pt"):
        keys = torch.load(tmp_path / name, weights_only=True)["model"].keys()
        assert not any(k.startswith(("module.", "_orig_mod.")) for k in keys)
        assert "head.weight" in keys


@compile_warning
def test_prefixes_are_stripped_or_added_to_match_the_model(tmp_path: Path) -> None:
    model, _, _ = trained()
    # other tools' files: a DDP state dict, a compiled one, and a plain one
    torch.save({"state_dict": nn.DataParallel(model).state_dict()}, tmp_path / "ddp.pt")
    torch.save(torch.compile(model).state_dict(), tmp_path / "compiled.pt")
    torch.save(model.state_dict(), tmp_path / "plain.pt")

    for name in ("ddp.pt", "compiled.pt"):
        fresh = Net()
        td.load_checkpoint(tmp_path / name, fresh)
        assert same_weights(model, fresh), name
    wrapped = nn.DataParallel(Net())
    td.load_checkpoint(tmp_path / "plain.pt", wrapped)
    assert same_weights(model, wrapped.module)
    user_wrapper = Wrapper()  # its own keys start with "module.": the prefix is added
    td.load_checkpoint(tmp_path / "plain.pt", user_wrapper)
    assert same_weights(model, user_wrapper.module)


def test_adapt_prefixes_handles_nesting_and_leaves_matching_keys_alone() -> None:
    state = {"_orig_mod.module.a.weight": 1, "_orig_mod.module.b": 2}
    assert list(adapt_prefixes(state, ["a.weight", "b"])) == ["a.weight", "b"]
    same = {"module.x": 1}
    assert adapt_prefixes(same, ["module.x"]) is same


def test_key_mismatch_lists_keys_grouped_by_prefix(tmp_path: Path) -> None:
    model, _, _ = trained()
    td.save_checkpoint(tmp_path / "m.pt", model=model)

    class Bigger(Net):
        def __init__(self) -> None:
            super().__init__()
            self.extra = nn.Linear(2, 2)

    with pytest.raises(CheckpointError) as info:
        td.load_checkpoint(tmp_path / "m.pt", Bigger())
    message = str(info.value)
    assert "the model has keys the checkpoint lacks: extra.* (2 keys)" in message
    assert "strict=False" in message

    class Smaller(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(4, 2)

    with pytest.raises(
        CheckpointError, match=r"the checkpoint has keys the model lacks: encoder\.\* \(7 keys\)"
    ):
        td.load_checkpoint(tmp_path / "m.pt", Smaller())
    smaller = Smaller()
    td.load_checkpoint(tmp_path / "m.pt", smaller, strict=False)
    assert torch.equal(smaller.head.weight, model.head.weight)


def test_group_keys_collapses_only_whole_subtrees() -> None:
    universe = ["a.0.w", "a.0.b", "a.1.w", "a.1.b", "c"]
    assert group_keys(["a.1.w", "a.1.b"], universe) == "a.1.* (2 keys)"
    assert group_keys(["a.0.w", "a.1.w", "c"], universe) == "a.0.w, a.1.w, c"


def test_shape_mismatch_is_one_clear_error(tmp_path: Path) -> None:
    model, _, _ = trained()
    td.save_checkpoint(tmp_path / "m.pt", model=model)
    with pytest.raises(
        CheckpointError, match=r"does not fit Net: size mismatch for encoder\.0\.weight"
    ):
        td.load_checkpoint(tmp_path / "m.pt", Net(hidden=8))


def test_optimizer_mismatch_and_missing_entries(tmp_path: Path) -> None:
    model, optimizer, _ = trained()
    td.save_checkpoint(tmp_path / "m.pt", model=model, optimizer=optimizer)
    other = torch.optim.AdamW([nn.Parameter(torch.ones(1))])
    with pytest.raises(CheckpointError, match="does not fit this optimizer"):
        td.load_checkpoint(tmp_path / "m.pt", optimizer=other)
    td.save_checkpoint(tmp_path / "only_model.pt", model=model)
    with pytest.raises(CheckpointError, match="has no optimizer state"):
        td.load_checkpoint(tmp_path / "only_model.pt", optimizer=optimizer)
    td.save_checkpoint(tmp_path / "gan.pt", generator=Net(), discriminator=Net())
    with pytest.raises(
        CheckpointError, match=r"(?s)several modules.*generator=\.\.\., discriminator=\.\.\."
    ):
        td.load_checkpoint(tmp_path / "gan.pt", Net())
    torch.save({"epoch": 3, "model": "resnet"}, tmp_path / "odd.pt")
    with pytest.raises(
        CheckpointError, match="no model state; its top-level keys are: epoch, model"
    ):
        td.load_checkpoint(tmp_path / "odd.pt", Net())


class Custom:
    pass


def test_untrusted_pickle_is_refused_with_the_way_out(tmp_path: Path) -> None:
    torch.save({"model": Net().state_dict(), "obj": Custom()}, tmp_path / "p.pt")
    with pytest.raises(UnsafeCheckpointError) as info:
        td.load_checkpoint(tmp_path / "p.pt", Net())
    message = str(info.value)
    assert f"{__name__}.Custom" in message
    assert "weights_only=False" in message and "add_safe_globals" in message
    loaded = td.load_checkpoint(tmp_path / "p.pt", Net(), weights_only=False)
    assert isinstance(loaded["obj"], Custom)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "is empty: an interrupted save or an incomplete download"),
        (b"<!DOCTYPE html><html>Sign in</html>", "is an HTML/XML page"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\n", "Git LFS pointer"),
        (b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"a":{}}' + b"\x00" * 8, "safetensors"),
        (b"epoch,loss\n1,0.5\n", "is not a PyTorch checkpoint"),
    ],
)
def test_files_that_are_not_checkpoints(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=expected) as info:
        td.load_checkpoint(path, Net())
    assert str(path) in str(info.value)


def test_truncated_checkpoint(tmp_path: Path) -> None:
    model, _, _ = trained()
    data = td.save_checkpoint(tmp_path / "full.pt", model=model).read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        CheckpointError, match=r"cut.pt is truncated or corrupt \(.*central directory"
    ):
        td.load_checkpoint(tmp_path / "cut.pt", Net())


def test_bad_paths_and_arguments(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        td.load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match="is a directory"):
        td.load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"the folder .* does not exist"):
        td.save_checkpoint(tmp_path / "no" / "such" / "dir.pt", model=Net())
    with pytest.raises(InvalidArgumentError, match=r"must be a str or os\.PathLike, not int"):
        td.load_checkpoint(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="nothing to save"):
        td.save_checkpoint(tmp_path / "x.pt")
    with pytest.raises(InvalidArgumentError, match=r"must be an nn\.Module"):
        td.load_checkpoint(tmp_path / "x.pt", model={"a": 1})  # type: ignore[arg-type]


def test_a_stale_temp_from_a_dead_writer_is_cleaned(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = tmp_path / f".m.pt.{socket.gethostname()}.{dead.stdout.strip()}.abcd.tmp"
    stale.write_bytes(b"partial")
    other_host = tmp_path / ".m.pt.elsewhere.1.abcd.tmp"
    other_host.write_bytes(b"partial")
    td.save_checkpoint(tmp_path / "m.pt", model=Net())
    assert not stale.exists() and other_host.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [other_host.name, "m.pt"]


WRITER = textwrap.dedent(
    """
    import sys, torch, torchdoctor as td
    big = {"w": torch.ones(96, 1024, 1024)}  # 384 MiB: the save takes a while
    print("ready", flush=True)
    td.save_checkpoint(sys.argv[1], weights=big, tag="new")
    print("finished", flush=True)
    """
)


def test_a_killed_writer_leaves_the_previous_checkpoint_intact(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    td.save_checkpoint(path, weights={"w": torch.arange(4.0)}, tag="old")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == b"ready"
        temp: list[Path] = []
        deadline = time.monotonic() + 60
        while not temp and time.monotonic() < deadline:  # wait until the temp file has data
            temp = [p for p in tmp_path.glob(".ckpt.pt.*.tmp") if p.stat().st_size > 1 << 20]
            time.sleep(0.005)
        assert temp, "the writer never started writing"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == -signal.SIGKILL
    ckpt = td.load_checkpoint(path)
    assert ckpt["tag"] == "old" and torch.equal(ckpt["weights"]["w"], torch.arange(4.0))
