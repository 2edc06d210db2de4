"""`env_report()`: the facts a PyTorch bug report needs, and warnings for known traps.

Every probe is guarded: a broken driver or a partial backend shows up as a
field with an error note, never as an exception from env_report itself.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from torchdoctor import __version__
from torchdoctor.errors import TorchDoctorError

__all__ = ["env_report", "format_report"]

T = TypeVar("T")

ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCHDOCTOR_DEVICE",
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NCCL_DEBUG",
    "OMP_NUM_THREADS",
)

# The oldest Linux driver each CUDA major version runs on (NVIDIA's compatibility table).
MIN_DRIVER_FOR_CUDA = {11: (450, 80), 12: (525, 60), 13: (580, 65)}

NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


def _try(probe: Callable[..., T], default: T, *args: Any) -> T:
    try:
        return probe(*args)
    except Exception:  # a missing or broken backend: report the default instead
        return default


def _parse_arch(arch: str) -> tuple[str, int, int] | None:
    """'sm_86' -> ('sm', 8, 6); 'compute_90' -> ('compute', 9, 0); 'sm_90a' -> ('sm', 9, 0)."""
    match = re.fullmatch(r"(sm|compute)_(\d+)[a-z]?", arch)
    if not match:
        return None
    digits = match.group(2)
    return match.group(1), int(digits[:-1]), int(digits[-1])


def capability_supported(capability: tuple[int, int], arch_list: list[str]) -> bool | None:
    """Whether kernels built for `arch_list` run on a GPU of `capability` (None: unknown).

    Binary code (sm_XY) runs on the same major version with an equal or higher
    minor; PTX (compute_XY) is compiled at load time for any newer GPU.
    """
    parsed = [p for p in map(_parse_arch, arch_list) if p]
    if not parsed:
        return None
    major, minor = capability
    for kind, arch_major, arch_minor in parsed:
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False


def _driver_version() -> str | None:
    text = _try(lambda: NVIDIA_DRIVER_FILE.read_text(errors="replace"), "")
    match = re.search(r"Kernel Module\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def _cuda_devices(arch_list: list[str], free_memory: bool) -> list[dict[str, Any]]:
    devices = []
    for index in range(_try(torch.cuda.device_count, 0)):
        props: Any = _try(torch.cuda.get_device_properties, None, index)
        info: dict[str, Any] = {"index": index, "device": f"cuda:{index}"}
        if props is None:
            info["error"] = "get_device_properties failed"
            devices.append(info)
            continue
        major, minor = int(getattr(props, "major", 0)), int(getattr(props, "minor", 0))
        info["name"] = str(getattr(props, "name", "?"))
        info["capability"] = f"{major}.{minor}"
        gcn_arch = getattr(props, "gcnArchName", None)
        if torch.version.hip and gcn_arch:
            info["arch"] = str(gcn_arch)
        else:
            info["arch"] = f"sm_{major}{minor}"
        total = getattr(props, "total_memory", None)
        info["total_memory"] = int(total) if isinstance(total, int) else None
        info["free_memory"] = None
        if free_memory:
            free_and_total = _try(torch.cuda.mem_get_info, None, index)
            info["free_memory"] = int(free_and_total[0]) if free_and_total else None
        if torch.version.hip:
            info["supported"] = None  # ROCm: no sm_ arch list to compare against
        else:
            info["supported"] = capability_supported((major, minor), arch_list)
        devices.append(info)
    return devices


def _xpu_report() -> dict[str, Any]:
    xpu = getattr(torch, "xpu", None)
    available = bool(_try(lambda: xpu is not None and xpu.is_available(), False))
    report: dict[str, Any] = {"available": available, "devices": []}
    if available and xpu is not None:
        for index in range(_try(xpu.device_count, 0)):
            name = str(_try(xpu.get_device_name, "?", index))
            report["devices"].append({"index": index, "device": f"xpu:{index}", "name": name})
    return report


def _pick_device_text() -> str:
    from torchdoctor.runtime.device import pick_device

    try:
        return str(pick_device())
    except TorchDoctorError as exc:
        return f"error: {exc.message}"


def _has_nvidia_driver() -> bool:
    return NVIDIA_DRIVER_FILE.exists() or shutil.which("nvidia-smi") is not None


def _warnings(report: dict[str, Any]) -> list[str]:
    warnings: list[str] = []
    torch_info, cuda = report["torch"], report["cuda"]
    env = report["env"]
    cpu_only = torch_info["cuda"] is None and torch_info["hip"] is None
    if cpu_only and report["nvidia_driver"]:
        warnings.append(
            f"a CPU-only torch build ({torch_info['version']}) is installed on a machine with "
            "an NVIDIA driver: install a CUDA wheel (see pytorch.org 'Get Started')"
        )
    if not cpu_only and not cuda["available"]:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
            warnings.append(f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from this process")
        else:
            warnings.append(
                "torch was built with CUDA/ROCm but no GPU is usable: check the driver "
                "(nvidia-smi / rocm-smi) and CUDA_VISIBLE_DEVICES"
            )
    for device in cuda["devices"]:
        if device.get("supported") is False:
            warnings.append(
                f"{device['device']} ({device['name']}, {device['arch']}) is not supported by "
                f"this torch build, which has kernels for {' '.join(cuda['arch_list'])}: "
                "install a wheel built for a newer CUDA (the 'is not compatible with the "
                "current PyTorch installation' error)"
            )
    driver = report["driver"]
    if driver and torch_info["cuda"]:
        cuda_major = int(str(torch_info["cuda"]).split(".")[0])
        needed = MIN_DRIVER_FOR_CUDA.get(cuda_major)
        have = tuple(int(x) for x in driver.split(".")[:2])
        if needed and have < needed:
            warnings.append(
                f"NVIDIA driver {driver} is older than CUDA {torch_info['cuda']} needs "
                f"(>= {needed[0]}.{needed[1]}): update the driver or install a wheel for an "
                "older CUDA"
            )
    local_rank = env.get("LOCAL_RANK")
    if local_rank is not None:
        if env.get("WORLD_SIZE") is None:
            warnings.append("LOCAL_RANK is set but WORLD_SIZE is not: start with torchrun")
        count = cuda["device_count"]
        if local_rank.isdigit() and cuda["available"] and 1 < count <= int(local_rank):
            warnings.append(f"LOCAL_RANK={local_rank} but only {count} GPUs are visible")
    if str(report["pick_device"]).startswith("error:"):
        warnings.append(f"td.pick_device() fails here: {report['pick_device'][7:]}")
    mps = report["mps"]
    if mps["built"] and not mps["available"] and sys.platform == "darwin":
        warnings.append("this torch build supports MPS but MPS is unavailable (needs macOS 12.3+)")
    return warnings


def env_report(*, free_memory: bool = False) -> dict[str, Any]:
    """Python, torch, CUDA/cuDNN/ROCm versions, devices and known-mismatch warnings.

    `free_memory=True` also asks each GPU for its free memory, which creates a
    CUDA context (hundreds of MB) on every visible GPU: fine for
    `torchdoctor env`, wasteful inside a training process.
    """
    no_archs: list[str] = []
    arch_list = list(_try(torch.cuda.get_arch_list, no_archs))
    cuda_available = bool(_try(torch.cuda.is_available, False))
    cudnn = torch.backends.cudnn
    cudnn_version = _try(cudnn.version, None) if _try(cudnn.is_available, False) else None
    report: dict[str, Any] = {
        "torchdoctor": __version__,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": platform.platform(),
        "torch": {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
            "cudnn": cudnn_version,
            "debug": bool(getattr(torch.version, "debug", False)),
        },
        "cuda": {
            "available": cuda_available,
            "device_count": _try(torch.cuda.device_count, 0) if cuda_available else 0,
            "arch_list": arch_list,
            "devices": _cuda_devices(arch_list, free_memory) if cuda_available else [],
        },
        "driver": _driver_version(),
        "nvidia_driver": _has_nvidia_driver(),
        "mps": {
            "built": bool(_try(torch.backends.mps.is_built, False)),
            "available": bool(_try(torch.backends.mps.is_available, False)),
        },
        "xpu": _xpu_report(),
        "env": {name: os.environ[name] for name in ENV_VARS if name in os.environ},
        "pick_device": _pick_device_text(),
    }
    report["warnings"] = _warnings(report)
    return report


def _bytes(value: object) -> str:
    if not isinstance(value, int):
        return "?"
    return f"{value / 2**30:.1f} GiB"


def format_report(report: dict[str, Any]) -> str:
    """The human-readable form printed by `torchdoctor env`."""
    torch_info, cuda = report["torch"], report["cuda"]
    python = report["python"]
    if torch_info["cuda"]:
        build = f"CUDA {torch_info['cuda']}"
    elif torch_info["hip"]:
        build = f"ROCm/HIP {torch_info['hip']}"
    else:
        build = "CPU-only build"
    lines = [
        f"torchdoctor   {report['torchdoctor']}",
        f"python        {python['version']} ({python['executable']})",
        f"platform      {report['platform']}",
        f"torch         {torch_info['version']} ({build})",
    ]
    if torch_info["cudnn"]:
        lines.append(f"cudnn         {torch_info['cudnn']}")
    if report["driver"]:
        lines.append(f"nvidia driver {report['driver']}")
    if cuda["arch_list"]:
        lines.append(f"kernels for   {' '.join(cuda['arch_list'])}")
    if cuda["available"]:
        lines.append(f"cuda          available, {cuda['device_count']} device(s)")
    else:
        lines.append("cuda          not available")
    for device in cuda["devices"]:
        if "error" in device:
            lines.append(f"  {device['device']}  {device['error']}")
            continue
        memory = f"{_bytes(device['total_memory'])} total"
        if device["free_memory"] is not None:
            memory += f", {_bytes(device['free_memory'])} free"
        status = {True: "supported", False: "NOT SUPPORTED by this build", None: ""}
        lines.append(
            f"  {device['device']}  {device['name']}, {device['arch']} "
            f"(capability {device['capability']}), {memory}  {status[device['supported']]}".rstrip()
        )
    mps = report["mps"]
    lines.append(
        f"mps           {'available' if mps['available'] else 'not available'}"
        f"{'' if mps['built'] else ' (not built)'}"
    )
    xpu = report["xpu"]
    lines.append(f"xpu           {'available' if xpu['available'] else 'not available'}")
    for device in xpu["devices"]:
        lines.append(f"  {device['device']}  {device['name']}")
    lines.append(f"pick_device   {report['pick_device']}")
    if report["env"]:
        lines.append("environment")
        lines.extend(f"  {name}={value}" for name, value in report["env"].items())
    if report["warnings"]:
        lines.append("warnings")
        lines.extend(f"  - {warning}" for warning in report["warnings"])
    else:
        lines.append("warnings      none")
    return "\n".join(lines)


def collect_env_text() -> str:
    """PyTorch's own environment report (`python -m torch.utils.collect_env`), or why not."""
    try:
        from torch.utils.collect_env import get_pretty_env_info

        return str(get_pretty_env_info()).strip()  # type: ignore[no-untyped-call]
    except Exception as exc:  # it shells out to pip, conda, nvidia-smi: any may fail
        return f"(torch.utils.collect_env failed: {type(exc).__name__}: {exc})"


def format_issue(report: dict[str, Any], collect_env: str) -> str:
    """A Markdown block to paste into a bug report: PyTorch's collect_env output, then
    what torchdoctor adds (device choice, distributed variables, MPS/XPU, warnings)."""
    added = [
        f"torchdoctor: {report['torchdoctor']}",
        f"pick_device: {report['pick_device']}",
        f"MPS: built {report['mps']['built']}, available {report['mps']['available']}",
        f"XPU: available {report['xpu']['available']}",
    ]
    added += [f"{name}={value}" for name, value in report["env"].items()]
    warnings = report["warnings"] or ["none"]
    added += ["torchdoctor warnings:", *(f"- {w}" for w in warnings)]
    fence = "```"
    return "\n".join(
        [
            "<details><summary>Environment (torchdoctor env --issue)</summary>",
            "",
            f"{fence}text",
            collect_env,
            "",
            *added,
            fence,
            "",
            "</details>",
        ]
    )
