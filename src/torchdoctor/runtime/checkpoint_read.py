"""Reading a checkpoint file, and saying exactly why it cannot be read.

`torch.load` runs with `map_location` always set. When it fails, the file itself is
examined (checkpoint_inspect: zip layout, pickle opcodes, never executed) together with
the exception's type; torch's message text decides nothing, because its wording changes
between versions. Unsafe content is decided first, so a malicious file is never reported
as merely corrupt. torch.save's CRC-32 of every record is checked, which torch.load skips.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from torchdoctor.errors import CheckpointError, UnsafeCheckpointError
from torchdoctor.runtime.checkpoint_inspect import Global, inspect_file


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


def read_checkpoint(path: Path, device: torch.device, weights_only: bool) -> Any:
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
