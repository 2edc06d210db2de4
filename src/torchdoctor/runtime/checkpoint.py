"""`save_checkpoint` / `load_checkpoint`: atomic, device-independent, wrapper-proof.

Saving writes a temp file in the same folder, fsyncs it and renames it over the
target, so a crash or kill mid-save leaves the previous checkpoint intact.
Loading always sets `map_location`, refuses arbitrary pickles by default, and
reconciles the `module.` / `_orig_mod.` prefixes that DDP and torch.compile add.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import secrets
import socket
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchdoctor.errors import CheckpointError, InvalidArgumentError, UnsafeCheckpointError
from torchdoctor.runtime.checkpoint_inspect import Global, inspect_file
from torchdoctor.runtime.device import DeviceLike, device_of, pick_device, to_device

__all__ = ["load_checkpoint", "save_checkpoint"]

# The key of the metadata entry in a checkpoint written by save_checkpoint.
META_KEY = "__torchdoctor__"
FORMAT_VERSION = 1
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# Where other tools' checkpoints usually keep the model and optimizer state.
MODEL_KEYS = ("model", "state_dict", "model_state_dict", "model_state", "net", "network")
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optim", "opt")
_TEMP_SUFFIX = ".tmp"


# --------------------------------------------------------------------------- save


def unwrap_module(module: nn.Module) -> nn.Module:
    """The user's model inside DataParallel / DistributedDataParallel / torch.compile."""
    while True:
        if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            inner = module.module
        else:
            inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
        if not isinstance(inner, nn.Module):
            return module
        module = inner


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


def _allowed_globals() -> frozenset[str]:
    """The globals torch.load(weights_only=True) accepts, the user's add_safe_globals included."""
    try:
        from torch import _weights_only_unpickler as unpickler

        names = set(unpickler._get_allowed_globals())
        names |= set(unpickler._get_user_allowed_globals())  # type: ignore[no-untyped-call]
    except (ImportError, AttributeError, TypeError):  # a torch without that (private) API
        return frozenset()
    return frozenset(names)


def _is_refused(item: Global, allowed: frozenset[str]) -> bool:
    if allowed:
        return item.qualname not in allowed
    return not item.module.startswith("torch") and item.qualname != "collections.OrderedDict"


def _describe_unreadable(
    path: Path, exc: BaseException | None, weights_only: bool
) -> CheckpointError:
    """Why `path` cannot be loaded, judged from what the file is and the exception's type.

    Never from torch's message text: its wording changes between versions. Unsafe content
    is decided first, so a malicious file is never reported as merely corrupt.
    """
    try:
        report = inspect_file(path)
    except OSError as os_exc:
        return CheckpointError(f"cannot read {path}: {os_exc.strerror or os_exc}")
    corrupt_fix = "save it again, re-download it, or use an earlier checkpoint"
    allowed = _allowed_globals()
    refused = [g for g in report.refused(allowed) if _is_refused(g, allowed)]
    if refused and (weights_only or any(g.dangerous for g in refused)):
        return _unsafe_error(path, refused)
    simple = {
        "empty": (f"{path} is empty: an interrupted save or an incomplete download", corrupt_fix),
        "git-lfs": (f"{path} is a Git LFS pointer, not the checkpoint itself", "git lfs pull"),
        "html": (
            f"{path} is an HTML/XML page, not a checkpoint: a download that got an error or "
            "login page",
            "download the file again from a direct link",
        ),
        "safetensors": (
            f"{path} is a safetensors file, not a torch.save checkpoint",
            "load it with safetensors.torch.load_file(path)",
        ),
        "zip": (
            f"{path} is a zip archive without a data.pkl record: not a torch.save checkpoint",
            "check the path; torch.save files are zip archives holding archive/data.pkl",
        ),
    }
    if report.kind in simple:
        message, fix = simple[report.kind]
        return CheckpointError(message, fix=fix)
    if report.kind == "unknown":
        with open(path, "rb") as handle:
            head = handle.read(16)
        return CheckpointError(
            f"{path} is not a PyTorch checkpoint (unrecognised contents: {head!r})",
            fix="check the path; torch.save files start with a zip or pickle header",
        )
    if not report.complete:
        return CheckpointError(
            f"{path} is truncated or corrupt ({report.problem}): an interrupted save, an "
            "incomplete download or a damaged copy",
            fix=corrupt_fix,
        )
    if report.kind == "pickle":
        protocol = report.protocol if report.protocol is not None else "0 or 1"
        return CheckpointError(
            f"{path} is a plain pickle (protocol {protocol}) written with pickle.dump, not a "
            "torch.save checkpoint",
            fix="load it with pickle.load only if you trust it: unpickling runs any code it names",
        )
    if isinstance(exc, pickle.UnpicklingError) and weights_only:
        return UnsafeCheckpointError(
            f"refused to load {path}: torch.load(weights_only=True) rejected its pickle "
            "although every global it names is allowed (an opcode or call outside the safe "
            "subset); unpickling it fully could run arbitrary code",
            fix="if you trust the file, load it with weights_only=False, which runs any code "
            "the file names, and re-save plain state dicts",
        )
    text = str(exc).strip()
    detail = type(exc).__name__ + (f": {text.splitlines()[0][:200]}" if text else "")
    kind = {"torch-zip": "zip archive", "torch-legacy": "legacy torch.save format"}.get(
        report.kind, report.kind
    )
    return CheckpointError(
        f"{path} is truncated or corrupt: its {kind} structure reads, but torch.load failed "
        f"on its contents ({detail})",
        fix=corrupt_fix,
    )


def _unsafe_error(path: Path, refused: list[Global]) -> UnsafeCheckpointError:
    first = refused[0]
    others = sorted({g.qualname for g in refused[1:]} - {first.qualname})
    more = f"; also {', '.join(others[:5])}" if others else ""
    origin = f"{first.name} of module {first.module}, in {first.where}"
    if first.dangerous:
        return UnsafeCheckpointError(
            f"refused to load {path}: its pickle calls {first.qualname} ({origin}){more}, a "
            "function that runs arbitrary code or commands the moment the file is unpickled. "
            "Treat the file as malicious",
            fix="do not load it with weights_only=False: that would run the code. Delete it or "
            "get the checkpoint from a source you trust",
        )
    return UnsafeCheckpointError(
        f"refused to load {path}: it contains the type {first.qualname} ({origin}){more}, and "
        "unpickling types outside torch's safe list could run arbitrary code "
        "(weights_only=True allows only tensors, plain containers and numbers)",
        fix=f"if you trust the file, allow just that type: "
        f"torch.serialization.add_safe_globals([{first.qualname}]); weights_only=False would "
        "also load it, but runs any code the file names",
    )


def _read(path: Path, device: torch.device, weights_only: bool) -> Any:
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the file does not exist")
    if path.is_dir():
        raise CheckpointError(
            f"{path} is a directory, not a checkpoint file (a sharded or "
            "torch.distributed.checkpoint save?)",
            fix="pass the path of a file written by torch.save / td.save_checkpoint",
        )
    opened, damage = _check_records(path)
    if opened and damage:  # a record fails its checksum: do not even unpickle it
        raise _corrupt(path, damage, weights_only)
    try:
        data = torch.load(path, map_location=device, weights_only=weights_only)
    except Exception as exc:  # every torch/pickle failure gets a diagnosis from the file
        raise _describe_unreadable(path, exc, weights_only) from exc
    if damage:  # zipfile could not read the archive's directory, torch.load could
        raise _corrupt(path, damage, weights_only)
    return data


def _corrupt(path: Path, reason: str, weights_only: bool) -> CheckpointError:
    unsafe = _describe_unreadable(path, None, weights_only)
    if isinstance(unsafe, UnsafeCheckpointError):  # damaged and unsafe: unsafe is what matters
        return unsafe
    return CheckpointError(
        f"{path} is corrupt ({reason}): it changed after it was written "
        "(a bad disk or copy, an interrupted save or download)",
        fix="save it again, re-download it, or use an earlier checkpoint",
    )


def _check_records(path: Path) -> tuple[bool, str]:
    """Check the CRC-32 torch.save stores for every record of its zip archive.

    torch.load does not: a flipped bit in the weights (or in the pickle that names
    them) would load silently as different numbers. Returns (whether the archive
    could be opened, why it is damaged or "").
    """
    opened = False
    try:
        with open(path, "rb") as handle:
            if handle.read(4) != b"PK\x03\x04":
                return False, ""  # the legacy pickle format has no checksums
            with zipfile.ZipFile(handle) as archive:
                opened = True
                for info in archive.infolist():
                    if info.CRC == 0 and info.file_size:
                        continue  # saved with torch.serialization.config.save.compute_crc32 off
                    with archive.open(info) as record:
                        while record.read(1 << 20):  # a CRC mismatch raises at the end
                            pass
    except Exception as exc:  # BadZipFile, or whatever a damaged header makes zipfile raise
        return opened, str(exc) or type(exc).__name__
    return True, ""


def _pick_entry(
    data: Mapping[str, Any], kinds: Mapping[str, str], kind: str, names: Iterable[str]
) -> tuple[str, Any] | None:
    """The entry holding a model's (or optimizer's) state, or None when there is none."""
    candidates = [name for name, k in kinds.items() if k == kind]
    for name in names:
        value = data.get(name)
        if kinds and name in candidates:
            return name, value
        if not kinds and isinstance(value, (Mapping, nn.Module)):
            return name, value
    if len(candidates) == 1:
        return candidates[0], data[candidates[0]]
    if len(candidates) > 1:
        raise CheckpointError(
            f"the checkpoint holds several {kind}s ({', '.join(candidates)}); "
            "load_checkpoint cannot tell which one you mean",
            fix=f"load it yourself: ckpt = td.load_checkpoint(path); "
            f"{'model' if kind == 'module' else kind}.load_state_dict(ckpt[{candidates[0]!r}])",
        )
    return None


def _looks_like_state_dict(data: Mapping[Any, Any]) -> bool:
    return bool(data) and all(isinstance(v, torch.Tensor) for v in data.values())


def _rename_keys(state: Mapping[str, Any], rename: Any) -> collections.OrderedDict[str, Any]:
    renamed: collections.OrderedDict[str, Any] = collections.OrderedDict(
        (rename(k), v) for k, v in state.items()
    )
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, dict):  # module versions, keyed by module prefix
        renamed._metadata = {  # type: ignore[attr-defined]
            rename(k + ".")[:-1] if k else k: v for k, v in metadata.items()
        }
    return renamed


def adapt_prefixes(state: Mapping[str, Any], model_keys: Iterable[str]) -> Mapping[str, Any]:
    """Strip or add `module.` / `_orig_mod.` so the checkpoint keys match the model's."""
    wanted = set(model_keys)
    for _ in range(4):  # wrappers can nest: _orig_mod.module.layer...
        keys = list(state)
        if not keys or not wanted or set(keys) == wanted:
            return state
        for prefix in WRAPPER_PREFIXES:
            ckpt_has = all(k.startswith(prefix) for k in keys)
            model_has = all(k.startswith(prefix) for k in wanted)
            if ckpt_has and not model_has:
                state = _rename_keys(
                    state, lambda k, p=prefix: k[len(p) :] if k.startswith(p) else k
                )
                break
            if model_has and not ckpt_has:
                state = _rename_keys(state, lambda k, p=prefix: p + k)
                break
        else:
            return state
    return state


def group_keys(subset: Iterable[str], universe: Iterable[str], limit: int = 12) -> str:
    """`encoder.layers.3.* (4 keys), head.weight`: whole subtrees collapsed to one line."""
    chosen = set(subset)
    total: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    for key in set(universe) | chosen:
        parts = key.split(".")
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            total[prefix] += 1
            if key in chosen:
                inside[prefix] += 1
    groups: dict[str, int] = {}
    for key in sorted(chosen):
        parts = key.split(".")
        label, count = key, 1
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            if total[prefix] == inside[prefix] and inside[prefix] > 1:
                label, count = prefix + ".*", inside[prefix]
                break
        groups[label] = count
    shown = [f"{label} ({n} keys)" if n > 1 else label for label, n in groups.items()]
    if len(shown) > limit:
        shown = [*shown[:limit], f"... {len(shown) - limit} more"]
    return ", ".join(shown)


def _load_model_state(model: nn.Module, state: Any, strict: bool, path: Path) -> None:
    target = unwrap_module(model)
    if isinstance(state, nn.Module):  # a whole pickled model (weights_only=False)
        state = unwrap_module(state).state_dict()
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"the model entry of {path} is a {type(state).__name__}, not a state dict"
        )
    model_keys = list(target.state_dict())
    state = adapt_prefixes(state, model_keys)
    try:
        result = target.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # size mismatches are raised even with strict=False
        details = "; ".join(
            line.strip() for line in str(exc).splitlines()[1:] if line.strip()
        ) or str(exc)
        raise CheckpointError(
            f"{path} does not fit {type(target).__name__}: {details}",
            fix="build the model with the same configuration as the one that was saved",
        ) from exc
    if strict and (result.missing_keys or result.unexpected_keys):
        problems = []
        if result.missing_keys:
            problems.append(
                "the model has keys the checkpoint lacks: "
                + group_keys(result.missing_keys, model_keys)
            )
        if result.unexpected_keys:
            problems.append(
                "the checkpoint has keys the model lacks: "
                + group_keys(result.unexpected_keys, list(state))
            )
        raise CheckpointError(
            f"{path} does not match {type(target).__name__}. " + ". ".join(problems),
            fix="build the same architecture that was saved, or pass strict=False to load "
            "the keys that match",
        )


def _load_optimizer_state(optimizer: Any, state: Any, path: Path) -> None:
    try:
        # Optimizer.load_state_dict moves the state to each parameter's device and dtype.
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(
            f"the optimizer state in {path} does not fit this optimizer: {exc}",
            fix="build the optimizer over the same parameters (and groups) as when saving",
        ) from exc


def _default_device(model: nn.Module | None) -> torch.device:
    if model is not None:
        with contextlib.suppress(Exception):
            return device_of(model)  # load straight onto the model's device
    return pick_device()


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module | None = None,
    optimizer: Any = None,
    *,
    device: DeviceLike | None = None,
    strict: bool = True,
    weights_only: bool = True,
) -> dict[str, Any]:
    """Read a checkpoint, load it into `model` / `optimizer`, and return its entries.

    `map_location` is always set: to `device`, else the model's device, else
    `pick_device()`. `weights_only=True` refuses pickles that could run code.
    `module.` / `_orig_mod.` prefixes are stripped or added to match the model.
    Works with files from `save_checkpoint` and with common plain `torch.save`
    layouts (a bare state dict, or a dict with "model"/"state_dict"/"optimizer").

        ckpt = td.load_checkpoint("last.pt", model, optimizer)
        start_epoch = ckpt["epoch"] + 1
    """
    if model is not None and not isinstance(model, nn.Module):
        raise InvalidArgumentError(
            f"load_checkpoint(model=...) must be an nn.Module, not {type(model).__name__}"
        )
    if optimizer is not None and not callable(getattr(optimizer, "load_state_dict", None)):
        raise InvalidArgumentError(
            f"load_checkpoint(optimizer=...) must have load_state_dict(), "
            f"not a {type(optimizer).__name__}"
        )
    target = _as_path(path)
    map_location = pick_device(device) if device is not None else _default_device(model)
    data = _read(target, map_location, weights_only)
    if isinstance(data, nn.Module):
        data = {"model": data}
    if not isinstance(data, Mapping):
        raise CheckpointError(
            f"{target} holds a {type(data).__name__}, not a checkpoint (a dict of states)"
        )
    entries = dict(data)
    meta = entries.pop(META_KEY, None)
    kinds: Mapping[str, str] = meta.get("kinds", {}) if isinstance(meta, Mapping) else {}
    if model is not None:
        if not kinds and _looks_like_state_dict(entries):
            model_state: Any = data
        else:
            found = _pick_entry(entries, kinds, "module", MODEL_KEYS)
            if found is None:
                raise CheckpointError(
                    f"{target} has no model state; its top-level keys are: "
                    + ", ".join(map(str, list(entries)[:20])),
                    fix="load it yourself: ckpt = td.load_checkpoint(path); "
                    "model.load_state_dict(ckpt[KEY])",
                )
            model_state = found[1]
        _load_model_state(model, model_state, strict, target)
    if optimizer is not None:
        found = _pick_entry(entries, kinds, "optimizer", OPTIMIZER_KEYS)
        if found is None:
            raise CheckpointError(
                f"{target} has no optimizer state; its top-level keys are: "
                + ", ".join(map(str, list(entries)[:20]))
            )
        _load_optimizer_state(optimizer, found[1], target)
    return entries
