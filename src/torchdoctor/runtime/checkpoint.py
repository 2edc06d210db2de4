"""`save_checkpoint` / `load_checkpoint`: atomic, device-independent, wrapper-proof.

Saving writes a temp file in the same folder, fsyncs it and renames it over the
target, so a crash or kill mid-save leaves the previous checkpoint intact.
Loading always sets `map_location`, refuses arbitrary pickles by default, and
reconciles the `module.` / `_orig_mod.` prefixes that DDP and torch.compile add.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchdoctor.errors import CheckpointError, InvalidArgumentError
from torchdoctor.runtime.checkpoint_read import read_checkpoint
from torchdoctor.runtime.checkpoint_restore import (
    adapt_prefixes,
    group_keys,
    load_model_state,
    load_object_state,
    load_optimizer_state,
    looks_like_state_dict,
    pick_entry,
    unwrap_module,
)
from torchdoctor.runtime.device import DeviceLike, device_of, pick_device, to_device

__all__ = ["adapt_prefixes", "group_keys", "load_checkpoint", "save_checkpoint"]

# The key of the metadata entry in a checkpoint written by save_checkpoint.
META_KEY = "__torchdoctor__"
FORMAT_VERSION = 1
# Where other tools' checkpoints usually keep the model and optimizer state.
MODEL_KEYS = ("model", "state_dict", "model_state_dict", "model_state", "net", "network")
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optim", "opt")
_TEMP_SUFFIX = ".tmp"


# --------------------------------------------------------------------------- save


def _state_of(obj: Any) -> tuple[str, Any]:
    if isinstance(obj, nn.Module):
        return "module", unwrap_module(obj).state_dict()
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer", obj.state_dict()
    state_dict = getattr(obj, "state_dict", None)
    if callable(state_dict) and not isinstance(obj, type):
        return "stateful", state_dict()  # LR schedulers, GradScaler, samplers, ...
    return "extra", obj


def save_checkpoint(path: str | os.PathLike[str], **objects: Any) -> Path:
    """Save the state of `objects` to `path` atomically; return the path.

    Modules, optimizers and anything with `state_dict()` (schedulers,
    GradScaler, ...) are saved as state dicts; other values (epoch, config,
    metrics) as they are. Wrappers are unwrapped (keys never carry `module.` or
    `_orig_mod.`) and state tensors are copied to the CPU, so the file loads
    anywhere, even with a plain `torch.load` on a machine without a GPU.

        td.save_checkpoint("last.pt", model=model, optimizer=opt, epoch=epoch)
    """
    if not objects:
        raise InvalidArgumentError(
            "save_checkpoint got nothing to save",
            fix="name what to save: td.save_checkpoint(path, model=model, optimizer=opt, epoch=3)",
        )
    if META_KEY in objects:
        raise InvalidArgumentError(f"{META_KEY!r} is reserved for torchdoctor's metadata")
    target = _as_path(path)
    kinds: dict[str, str] = {}
    payload: dict[str, Any] = {}
    for name, obj in objects.items():
        kind, state = _state_of(obj)
        kinds[name] = kind
        # State dicts are fresh containers: copying their tensors to the CPU touches
        # nothing of the caller's. Extras are saved as given (map_location covers them).
        payload[name] = state if kind == "extra" else to_device(state, "cpu")
    payload[META_KEY] = {"format": FORMAT_VERSION, "torch": str(torch.__version__), "kinds": kinds}
    _atomic_save(payload, target)
    return target


def _as_path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"a checkpoint path must be a str or os.PathLike, not {type(path).__name__}"
        )
    return Path(os.fspath(path))


def _temp_prefix(target: Path) -> str:
    return f".{target.name}."


def _atomic_save(payload: dict[str, Any], target: Path) -> None:
    folder = target.parent
    if not folder.is_dir():
        raise CheckpointError(
            f"cannot save {target}: the folder {folder} does not exist",
            fix="create it first, e.g. os.makedirs(folder, exist_ok=True)",
        )
    if target.is_dir():
        raise CheckpointError(f"cannot save {target}: it is a directory")
    _remove_stale_temps(target)
    # host and pid in the name let a later save recognise leftovers of a killed writer
    temp = folder / (
        f"{_temp_prefix(target)}{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
        f"{_TEMP_SUFFIX}"
    )
    try:
        with open(temp, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        if isinstance(exc, OSError):
            raise CheckpointError(
                f"cannot save {target}: {exc.strerror or exc}; the previous file is unchanged"
            ) from exc
        raise
    _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    # Makes the rename itself durable; not possible on every OS/filesystem.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_stale_temps(target: Path) -> None:
    """Delete temp files left by writers on this host that were killed mid-save."""
    host = socket.gethostname()
    prefix = _temp_prefix(target) + host + "."
    with contextlib.suppress(OSError):
        for entry in target.parent.iterdir():
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(_TEMP_SUFFIX)):
                continue
            pid_text = name[len(prefix) :].split(".", 1)[0]
            if pid_text.isdigit() and not _process_alive(int(pid_text)):
                with contextlib.suppress(OSError):
                    entry.unlink()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


# --------------------------------------------------------------------------- load


def _default_device(model: nn.Module | None) -> torch.device:
    if model is not None:
        with contextlib.suppress(Exception):
            device = device_of(model)  # load straight onto the model's device
            if device.type != "meta":  # meta holds no data: load real tensors instead
                return device
    return pick_device()


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module | None = None,
    optimizer: Any = None,
    *,
    device: DeviceLike | None = None,
    strict: bool = True,
    weights_only: bool = True,
    **objects: Any,
) -> dict[str, Any]:
    """Read a checkpoint, restore every object you pass, and return the extras.

    `model` and `optimizer` are found by kind; any other stateful object (scheduler,
    GradScaler, an EMA model, a second optimizer, anything with `load_state_dict`) is
    passed by the name it was saved under: `scheduler=sched, scaler=scaler`. Returns the
    entries that were not restored into an object you passed: after a full restore, the
    extras (epoch, config, metrics, ...); a state you did not pass stays in it.
    `map_location` is always set: to `device`, else the model's device (a model on the
    meta device gets real tensors from `pick_device()`), else `pick_device()`.
    `weights_only=True` refuses pickles that could run code. `module.` / `_orig_mod.`
    prefixes are stripped or added to match each model. Works with files from
    `save_checkpoint` and with common plain `torch.save` layouts (a bare state dict, or a
    dict with "model"/"state_dict"/"optimizer").

        extras = td.load_checkpoint("last.pt", model, optimizer, scheduler=sched, scaler=scaler)
        start_epoch = extras["epoch"] + 1
    """
    if model is not None and not isinstance(model, nn.Module):
        raise InvalidArgumentError(
            f"load_checkpoint(model=...) must be an nn.Module, not {type(model).__name__}"
        )
    for name, obj in {"optimizer": optimizer, **objects}.items():
        if obj is not None and not callable(getattr(obj, "load_state_dict", None)):
            raise InvalidArgumentError(
                f"load_checkpoint({name}=...) must have load_state_dict(), "
                f"not a {type(obj).__name__}"
            )
    target = _as_path(path)
    map_location = pick_device(device) if device is not None else _default_device(model)
    data = read_checkpoint(target, map_location, weights_only)
    if isinstance(data, nn.Module):
        data = {"model": data}
    if not isinstance(data, Mapping):
        raise CheckpointError(
            f"{target} holds a {type(data).__name__}, not a checkpoint (a dict of states)"
        )
    entries = dict(data)
    meta = entries.pop(META_KEY, None)
    kinds: Mapping[str, str] = meta.get("kinds", {}) if isinstance(meta, Mapping) else {}
    restored = _restore(target, entries, kinds, model, optimizer, objects, strict)
    if model is not None and restored == {"*"}:  # the whole file was the model's state dict
        return {}
    return {k: v for k, v in entries.items() if k not in restored}


def _restore(
    target: Path,
    entries: dict[str, Any],
    kinds: Mapping[str, str],
    model: nn.Module | None,
    optimizer: Any,
    objects: Mapping[str, Any],
    strict: bool,
) -> set[str]:
    """Load every given object from its entry; return the names of the entries used."""
    restored: set[str] = set()
    missing = [name for name in objects if name not in entries]
    if missing:
        states = [k for k in entries if kinds.get(k, "extra") != "extra"] or list(entries)
        raise CheckpointError(
            f"{target} has no entry {', '.join(map(repr, missing))}; its states are: "
            + (", ".join(map(str, states[:20])) or "none"),
            fix="pass each object by the name it was saved under",
        )
    if model is not None:
        if not kinds and looks_like_state_dict(entries):
            load_model_state(model, entries, strict, target)
            return {"*"}
        found = pick_entry(entries, kinds, "module", MODEL_KEYS, taken=objects)
        if found is None:
            raise CheckpointError(
                f"{target} has no model state; its top-level keys are: "
                + ", ".join(map(str, list(entries)[:20])),
                fix="pass the model by the name it was saved under: "
                "td.load_checkpoint(path, NAME=model)",
            )
        load_model_state(model, found[1], strict, target)
        restored.add(found[0])
    if optimizer is not None:
        found = pick_entry(entries, kinds, "optimizer", OPTIMIZER_KEYS, taken=objects)
        if found is None:
            raise CheckpointError(
                f"{target} has no optimizer state; its top-level keys are: "
                + ", ".join(map(str, list(entries)[:20]))
            )
        load_optimizer_state(optimizer, found[1], target)
        restored.add(found[0])
    for name, obj in objects.items():
        load_object_state(obj, name, entries[name], strict, target)
        restored.add(name)
    return restored
